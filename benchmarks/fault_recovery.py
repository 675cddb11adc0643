"""Fault recovery on the local site: how fast a hang is detected and how fast the run recovers.

    python benchmarks/fault_recovery.py [--repeats 3] [--kind hang|hang_in_collective|crash]

Runs a real long run (tiny model, 3 virtual nodes x 1 gloo rank: 2 active + 1 spare) through
`campaign submit`, with a fault on node local-n1 at step 25 of the first attempt, and reads
the ledger: detection latency (last progress to kill, as the supervisor measured it),
recovery time (kill to the relaunch's first new step), both in seconds and in median step
times, next to the 1800 s idle timeout that stdout-silence watchdogs default to. Target:
detection within 3 step-times + 10 s; recovery dominated by process start and checkpoint load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _target import Targets  # noqa: E402

STDOUT_SILENCE_TIMEOUT_S = 1800.0
"""What a stdout-silence watchdog waits by default (the seed's "watchdog at 30 min")."""


def spec(kind: str) -> dict:
    return {
        "name": "fault-recovery",
        "site": {"kind": "local", "nodes": 3, "ranks_per_node": 1},
        "model": {"size": "tiny"},
        "trainer": {"micro_batch_size": 2, "warmup_steps": 2},
        "stages": [{"name": "long", "kind": "long_run", "nodes": 2, "steps": 60, "checkpoint_every": 10,
                    "max_attempts": 3, "backoff_s": 0,
                    "watchdog": {"startup_s": 120},  # the default steady budget: 3 x p99 + 9 s
                    "faults": [{"kind": kind, "step": 25, "node": "local-n1", "attempt": 1}]}],
    }


def one_run(kind: str) -> dict:
    from campaign.ledger import open_ledger
    from campaign.ledger import reads

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "c.yaml"
        path.write_text(yaml.safe_dump(spec(kind)))
        env = {**os.environ, "CAMPAIGN_ALLOW_FAULTS": "1", "CAMPAIGN_WORKDIR": f"{tmp}/w"}
        p = subprocess.run([sys.executable, "-m", "campaign.cli", "submit", str(path), "-q"], env=env,
                           capture_output=True, text=True)
        if p.returncode != 0:
            raise SystemExit(f"the campaign failed:\n{p.stdout}\n{p.stderr}")
        ledger = open_ledger(f"sqlite:///{tmp}/w/ledger.db", create=False)
        with ledger.session() as s:
            c = reads.get_campaign(s, "fault-recovery")
            run = reads.current_stage_runs(s, c)[0]
            first, second = run.attempts[0], run.attempts[1]
            steps = [m.step_time_s for m in reads.list_steps(s, first.id) if m.step_time_s][3:]
            relaunch = reads.list_steps(s, second.id)
            out = {
                "class": first.state,
                "culprit": ",".join(x["node"] for x in first.suspects) or "-",
                "median_step_s": statistics.median(steps),
                "detect_s": first.summary.get("detected_after_s"),
                "recover_s": relaunch[0].time - first.finished.replace(tzinfo=__import__("datetime").timezone.utc).timestamp(),
                "resumed_from": relaunch[0].step - 1,
            }
        ledger.close()
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--kind", default="hang", choices=["hang", "hang_in_collective", "crash", "sigkill"])
    args = ap.parse_args()
    rows = [one_run(args.kind) for _ in range(args.repeats)]
    print(f"\nfault: {args.kind} on local-n1 at step 25 (tiny model, 2 active nodes + 1 spare, gloo)\n")
    print(f"{'run':>3} {'class':>13} {'culprit':>9} {'step s':>7} {'detect s':>9} {'x step':>7} {'recover s':>10} "
          f"{'x step':>7} {'resumed':>8}")
    for i, r in enumerate(rows, 1):
        d = r["detect_s"]
        print(f"{i:>3} {r['class']:>13} {r['culprit']:>9} {r['median_step_s']:>7.3f} "
              f"{d if d is not None else float('nan'):>9.2f} {(d or 0) / r['median_step_s']:>7.0f} "
              f"{r['recover_s']:>10.2f} {r['recover_s'] / r['median_step_s']:>7.0f} {r['resumed_from']:>8}")
    detect = statistics.median([r["detect_s"] for r in rows if r["detect_s"] is not None] or [float("nan")])
    step = statistics.median(r["median_step_s"] for r in rows)
    print(f"\nmedian detection {detect:.2f} s = {detect / step:.0f} step times; "
          f"median recovery {statistics.median(r['recover_s'] for r in rows):.2f} s")
    print(f"ratio vs a {STDOUT_SILENCE_TIMEOUT_S:.0f} s stdout-silence timeout: {STDOUT_SILENCE_TIMEOUT_S / detect:.0f}x "
          "sooner")
    targets = Targets("fault_recovery")
    targets.check(f"median detection (3 x {step:.3f} s step + 10 s)", detect, "<=", 3 * step + 10, " s")
    targets.exit()


if __name__ == "__main__":
    main()
