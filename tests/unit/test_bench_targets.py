"""The benchmarks' target machinery: a missed target exits 1, a met one 0, a skip 0 with its
reason, and every benchmark script states and judges its targets through it (fast: no
benchmark is run; the scripts are read and the helper is run in a subprocess)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _run(body: str) -> subprocess.CompletedProcess[str]:
    code = f"import sys; sys.path.insert(0, {str(BENCH)!r})\nfrom _target import Targets, skip\n{body}"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(("body", "rc", "says"), [
    ("t = Targets('b'); t.check('x', 1.5, '<=', 1.02); t.exit()", 1, "target x: 1.5 <= 1.02: MISSED"),
    ("t = Targets('b'); t.check('x', 1.01, '<=', 1.02); t.exit()", 0, "target x: 1.01 <= 1.02: met"),
    ("t = Targets('b'); t.check('x', 1.0, '<=', 2); t.check('y', 3.0, '>=', 4); t.exit()", 1, "1/2 targets met"),
    ("t = Targets('b'); t.check('x', float('nan'), '<=', 2); t.exit()", 1, "MISSED"),
    ("t = Targets('b'); t.require('same faults', False, 'ours 6, baseline 7'); t.exit()", 1,
     "target same faults: MISSED (ours 6, baseline 7)"),
    ("t = Targets('b'); t.exit()", 1, "no target was checked"),
    ("skip('b', 'no GPU')", 0, "b: SKIPPED: no GPU"),
])
def test_exit_status_follows_the_verdict(body: str, rc: int, says: str) -> None:
    p = _run(body)
    assert p.returncode == rc, p.stdout + p.stderr
    assert says in p.stdout


SCRIPTS = sorted(p for p in BENCH.glob("*.py") if not p.name.startswith("_"))


def test_there_are_benchmarks() -> None:
    assert len(SCRIPTS) >= 10


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_every_benchmark_judges_a_target(path: Path) -> None:
    """Each script imports the shared helper (or the GPU harness, which does) and checks a
    target or requires a condition; none prints its own met/MISSED verdict."""
    tree = ast.parse(path.read_text())
    imports = {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module == "_target"
               for a in n.names}
    harness = any(isinstance(n, ast.Import) and any(a.name == "_gpu_harness" for a in n.names)
                  for n in ast.walk(tree))
    assert "Targets" in imports or harness, f"{path.name}: does not use benchmarks/_target.py"
    calls = {n.func.attr for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}
    assert calls & {"check", "require"}, f"{path.name}: judges no target"
    assert "exit" in calls or "finish" in calls, f"{path.name}: never exits through its targets"
    assert "'met' if" not in path.read_text(), f"{path.name}: a verdict of its own, not the helper's"
def test_bench_smoke_runs_every_benchmark() -> None:
    sys.path.insert(0, str(BENCH))
    try:
        import _smoke
    finally:
        sys.path.remove(str(BENCH))
    listed = {s.script for s in _smoke.SMOKES}
    assert listed == {p.name for p in SCRIPTS}, "benchmarks/_smoke.py must list every benchmark, and only those"
    assert all(not s.misses or s.why for s in _smoke.SMOKES), "an expected miss needs its reason"
    assert "_smoke.py" in (BENCH.parent / "Makefile").read_text()
    assert "make bench-smoke" in (BENCH.parent / ".ci" / "run").read_text()


@pytest.mark.parametrize(("prints", "rc", "misses", "may_miss", "ok"), [
    (["target a: 1 <= 2: met"], 0, (), (), True),
    (["target a: 3 <= 2: MISSED"], 1, (), (), False),                      # a miss nobody expected
    (["target a: 3 <= 2: MISSED"], 1, ("a:",), (), True),                  # the expected miss
    (["target a: 1 <= 2: met"], 0, ("a:",), (), False),                    # expected to miss, now met
    (["target a: 3 <= 2: MISSED", "target b: 3 <= 2: MISSED"], 1, ("a:",), (), False),  # b broke too
    (["target a: 3 <= 2: MISSED", "target b: 3 <= 2: MISSED"], 1, ("a:",), ("b:",), True),
    (["target a: 3 <= 2: MISSED"], 1, ("a:",), ("b:",), True),             # b may go either way
    (["x: SKIPPED: no GPU"], 0, (), (), True),
    ([], 3, (), (), False),                                                # crashed
])
def test_bench_smoke_judges_each_benchmark(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, prints: list[str],
                                           rc: int, misses: tuple[str, ...], may_miss: tuple[str, ...],
                                           ok: bool) -> None:
    sys.path.insert(0, str(BENCH))
    try:
        import _smoke
    finally:
        sys.path.remove(str(BENCH))
    (tmp_path / "fake.py").write_text(f"import sys\nprint({chr(10).join(prints)!r})\nsys.exit({rc})\n")
    monkeypatch.setattr(_smoke, "BENCH", tmp_path)
    _, judged, _, _ = _smoke.run(_smoke.Smoke("fake.py", misses=misses, may_miss=may_miss, why="test"))
    assert judged is ok
