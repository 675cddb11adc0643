"""benchmarks/goodput.py's machinery, without running a campaign: the mixed schedule, the
check that a run met exactly its faults, the seconds lost per fault, Llama 3's rate."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def gp():  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(BENCH))
    try:
        import goodput

        yield goodput
    finally:
        sys.path.remove(str(BENCH))


def test_schedule_draws_the_whole_mix_one_fault_per_attempt(gp) -> None:  # type: ignore[no-untyped-def]
    faults = gp.schedule(seed=1, steps=5000, mean=20, every=10, ranks=2)
    kinds = {(f["kind"], f.get("exit_code")) for f in faults}
    assert kinds == {(f["kind"], f.get("exit_code")) for _, f in gp.FAULT_MIX}
    assert [f["attempt"] for f in faults] == list(range(1, len(faults) + 1))
    assert all(b["step"] > a["step"] for a, b in zip(faults, faults[1:]))


def test_met_all_needs_one_failed_attempt_per_fault_then_success(gp) -> None:  # type: ignore[no-untyped-def]
    faults = [{"kind": "hang", "step": 5, "attempt": 1}, {"kind": "crash", "step": 9, "attempt": 2}]
    ok = {"passed": True, "classes": ["stalled", "crashed", "succeeded"]}
    assert gp.met_all(ok, faults)
    assert not gp.met_all({**ok, "classes": ["stalled", "succeeded"]}, faults)  # one fault never fired
    assert not gp.met_all({**ok, "classes": ["stalled", "crashed", "crashed", "succeeded"]}, faults)
    assert not gp.met_all({**ok, "passed": False}, faults)


def test_lost_per_fault_spans_last_good_step_to_the_same_step_again(gp, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    def run_dir(name: str, rows: dict[int, float]) -> str:
        d = tmp_path / name
        d.mkdir()
        (d / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "time": t}) + "\n" for s, t in rows.items()))
        return str(d)

    det = [{"run_dir": run_dir("a1", {3: 100.0, 4: 101.0}), "started": "2026-01-01T00:00:00"},
           {"run_dir": run_dir("a2", {5: 130.0, 6: 131.0}), "started": "2026-01-01T00:00:20"}]
    lost = gp.lost_per_fault({"detail": det}, [{"kind": "hang", "step": 5, "attempt": 1}], step_s=1.0)
    assert lost == [pytest.approx(130.0 - 101.0 - 1.0)]


def test_llama3_rate_scales_with_the_nodes(gp) -> None:  # type: ignore[no-untyped-def]
    per_job_2048 = 54 * 86400 / 466  # the whole 16,384-GPU job: one interruption every ~2.8 h
    assert gp.llama3_mtbf_s(2048) == pytest.approx(per_job_2048)
    assert gp.llama3_mtbf_s(2) == pytest.approx(per_job_2048 * 1024)


def test_a_seed_that_draws_no_fault_is_redrawn_not_averaged_in(gp) -> None:  # type: ignore[no-untyped-def]
    """Issue 39: the docs' mean ETTR averaged a fault-free draw (seed 2 of 1-3) with two that
    had faults. The repeats take the next seeds whose schedule draws a fault."""
    free = [seed for seed in range(1, 40) if not gp.schedule(seed, 300, 100.0, 7, ranks=2)]
    assert 2 in free, "seed 2 draws no fault in 300 steps (the docs' fault-free repeat)"
    seeds, skipped = gp.seeds_with_faults(1, 3, 300, 100.0, 7, ranks=2)
    assert seeds == [1, 3, 4] and skipped == [2]
    assert all(gp.schedule(seed, 300, 100.0, 7, ranks=2) for seed in seeds)


def test_hang_detection_target_leaves_out_only_the_first_attempts_warm_up(gp) -> None:  # type: ignore[no-untyped-def]
    faults = [{"kind": "hang", "step": 3}, {"kind": "hang", "step": 15}, {"kind": "crash", "step": 40}]
    out = {"detected_by_kind": [("compute hang", 30.1), ("compute hang", 2.1), ("crash, no evidence", None)]}
    assert gp.measured_hangs(out, faults, 3) == ([("compute hang", 2.1)], 1)
    late = [{"kind": "hang", "step": 9}, *faults[1:]]
    assert gp.measured_hangs(out, late, 3) == ([("compute hang", 30.1), ("compute hang", 2.1)], 0)
