"""`make bench-smoke`: every benchmark at its smallest setting, one after the other, then a
table of what each said. Exit 1 if one broke (an exit status other than its target's 0/1)
or its verdict was not the expected one.

    python benchmarks/_smoke.py                 # all (about 4 min on 2 idle cores)
    python benchmarks/_smoke.py overhead scale  # only these (by script name)

The expected verdict is `met` (exit 0: every target met, or SKIPPED where the benchmark
cannot run here, e.g. without a GPU), except where a line below names the targets expected to
miss (`misses`, each a piece of the target's printed name) and why: a target stated for a
scale the smallest setting does not reach, or one the product misses today. Such a benchmark
must still run through and exit 1 with exactly those targets missed (any other target missed
fails the smoke): that checks, in CI, that a missed target fails its benchmark. If one of them
starts being met here, the smoke fails too, so the expectation gets updated.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

BENCH = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Smoke:
    script: str
    args: tuple[str, ...] = ()
    misses: tuple[str, ...] = ()
    """Pieces of the names of the targets expected to be MISSED (each must match one); empty: all met."""
    may_miss: tuple[str, ...] = ()
    """Targets that may go either way at this size (noise larger than the margin): not judged."""
    why: str = ""

    @property
    def expect(self) -> str:
        return "missed" if self.misses else "met/any" if self.may_miss else "met"


SMOKES = (
    Smoke("ledger_scale.py", ("--rows", "1000", "10000", "--repeat", "1", "--no-postgres"),
          misses=("sqlite ingestion",),
          why="the ingestion target (>= 100,000 rows/s) is stated at 1,000,000 rows; 10,000 rows (two transactions) "
          "measure per-transaction costs: 19,600-57,200 rows/s on the shared 2-core VM"),
    Smoke("scale.py", ("--nodes", "64", "512", "--repeat", "1", "--no-postgres")),
    Smoke("train_throughput.py", ("--size", "tiny", "--steps", "5", "--warmup", "2")),
    Smoke("deterministic_cost.py", ("--steps", "8", "--warmup", "3"), may_miss=("deterministic/default",),
          why="on CPU the switch changes no kernel the tiny model uses: the ratio of 5 steps of ~6 ms is the "
              "machine's noise (0.83x-3.7x measured here)"),
    Smoke("checkpoint_stall.py", (), misses=("async/sync stall",),
          why="the target (async stall <= 10% of sync) is stated for saves of seconds (1b on an H200: 2.17 s against "
          "25.6 s); the tiny CPU model's ~0.05 s save is dominated by the async path's fixed costs (0.19 here)"),
    Smoke("checkpoint_checksum.py", ("--mb", "64", "--repeat", "1")),
    Smoke("teardown_abort.py", ("--launches", "1")),
    Smoke("fault_recovery.py", ("--repeats", "1")),
    Smoke("overhead.py", ("--steps", "20", "--repeats", "1", "--n-layer", "2", "--d-model", "128", "--seq-len", "64"),
          may_miss=("fixed overhead", "per step"),
          why="one 20-step run judges neither: its fixed overhead sits near the 5 s line (4.4 s on CI's idle 2 "
              "cores, 6.6 s median of 3 at 100 steps on a loaded one, docs/performance.md) and the per-step "
              "ratio of ~15 ms steps is noise; the 100-step run with repeats is the measurement"),
    Smoke("goodput.py", ("--steps", "30", "--mean-steps", "25", "--seed", "7", "--repeats", "1", "--d-model", "128",
                         "--seq-len", "64"), misses=("mean ETTR",),
          why="30 steps and one collective hang: start-up and the hang dominate so short a run (the target is "
              "stated for 300)"),
    Smoke("rotary.py", ("--reps", "3")),
    Smoke("vs_nanogpt.py", ("--rehearsal", "--steps", "3", "--warmup", "1")),
    Smoke("float8_vs_bf16.py", ("--rehearsal",)),
    Smoke("gpu_startup.py", ("--rehearsal",)),
    Smoke("gpu_throughput_in_campaign.py", ("--budget-s", "120",)),
    Smoke("gpu_ddp_allreduce.py", ("--budget-s", "120",)),
    Smoke("gpu_hang_drill.py", ("--budget-s", "120",)),
    Smoke("gpu_resume_exact.py", ("--budget-s", "120",)),
    Smoke("gpu_relaunch.py", ("--rehearsal", "--cuts", "none", "--stages-at", "none", "--budget-s", "400"),
          may_miss=("per step", "fixed overhead", "with caches / without", "seconds lost"),
          why="the rehearsal trains the tiny model uncompiled on CPU: nothing to cache (the start-up ratio is the "
              "warm start's alone), step times of a loaded machine, and a hang's detection floor (9 s) against a "
              "15 s target stated for 1b on a GPU; it checks the harness, the faults and the breakdown end to end"),
)


def run(s: Smoke) -> tuple[str, bool, float, str]:
    """(verdict, as expected, seconds, the target lines) of one benchmark."""
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, str(BENCH / s.script), *s.args], capture_output=True, text=True)
    took = time.perf_counter() - t0
    out = p.stdout + p.stderr
    lines = [line for line in p.stdout.splitlines() if line.startswith("target ") or "SKIPPED:" in line]
    missed = [line for line in lines if line.startswith("target ") and line.endswith("MISSED")
              or line.startswith("target ") and ": MISSED (" in line]
    if p.returncode == 0:
        verdict = "skipped" if any("SKIPPED:" in line for line in lines) else "met"
    elif p.returncode == 1 and missed:
        verdict = "missed"
    else:
        return f"broke (exit {p.returncode})", False, took, "\n".join(f"    {x}" for x in out.splitlines()[-15:])
    allowed = s.misses + s.may_miss
    ok = (verdict != "missed" and not s.misses) or (
        verdict == "missed" and all(any(m in line for m in allowed) for line in missed)
        and all(any(m in line for line in missed) for m in s.misses))
    return verdict, ok, took, "\n".join(f"    {line}" for line in lines)


def main(names: list[str]) -> int:
    known = {s.script.removesuffix(".py") for s in SMOKES}
    if set(names) - known:
        sys.exit(f"unknown benchmark(s) {sorted(set(names) - known)}; known: {', '.join(sorted(known))}")
    chosen = [s for s in SMOKES if not names or s.script.removesuffix(".py") in names]
    rows, bad, t0 = [], 0, time.perf_counter()
    for s in chosen:
        print(f"$ python benchmarks/{s.script} {' '.join(s.args)}", flush=True)
        verdict, ok, took, detail = run(s)
        bad += not ok
        rows.append((s.script, verdict, s.expect, took, ok))
        print(f"  {verdict} in {took:.1f} s{'' if ok else ' (NOT as expected)'}"
              + (f"; expected to miss {', '.join(s.misses)}: {s.why}" if s.misses else "") + f"\n{detail}", flush=True)
    print(f"\n{'benchmark':<32} {'verdict':<16} {'expected':<8} {'s':>6}")
    for script, verdict, expect, took, ok in rows:
        print(f"{script:<32} {verdict:<16} {expect:<8} {took:>6.1f}{'' if ok else '  <- FAIL'}")
    print(f"bench-smoke: {len(rows) - bad}/{len(rows)} as expected in {time.perf_counter() - t0:.0f} s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
