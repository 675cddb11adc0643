"""Claim: a hung GPU job, whether stuck in compute or inside a collective, is detected within
the watchdog's budget, killed cleanly (no process of it holds GPU memory afterwards) and
relaunched from its last complete checkpoint, through the real `campaign submit`.

Runs campaign `gpu-drill` (`--size`, default gpt2-124m: a 1b checkpoint takes 31-35 s to save
on an H200; FSDP2, NCCL, deterministic) on the `local` site, one virtual node per GPU: a long
run of --steps steps checkpointing every --checkpoint-every, in which rank 0 hangs at
--hang-step (`hang`, attempt 1) and inside a collective at --collective-hang-step
(`hang_in_collective`, the next attempt); 0 leaves either fault out. Watchdog budget: 3 x p99
step time + 5 s. With 4+ GPUs two nodes are spares and each stall excludes the hung rank's
node (lifted again with `campaign nodes include` afterwards); with fewer, nothing is excluded.
A thread polls `nvidia-smi --query-compute-apps=pid,used_memory` all along.

Read back from the ledger: detection is the attempt's `summary.detected_after_s` (time
without a new step when the watchdog fired); hang is the time of the last step before the
fault; killed is when the supervisor had stopped and reaped the job (`supervisor.json`
written); recovery runs to the relaunch's first step.

Baseline: the median steady step time of the same long run (each latency is also shown in
step times), and the watchdog budget the supervisor reported. Prints (and writes to --out,
default $OUT, as summary.md) one row per fault: budget, detection, hang -> killed, whether a
job pid was seen on the GPU after the kill, GPU-free samples before the relaunch, the
checkpoint resumed from and kill -> first new step; then detection / budget per fault.

    python benchmarks/gpu_hang_drill.py                          # all GPUs of this machine
    python benchmarks/gpu_hang_drill.py --gpus 8 --budget-s 560  # 6 active nodes + 2 spares
    python benchmarks/gpu_hang_drill.py --hang-step 0            # only the hang in a collective
    python benchmarks/gpu_hang_drill.py --rehearsal              # tiny model on CPU (gloo)
    python benchmarks/gpu_hang_drill.py --write-specs DIR        # only write gpu-drill.yaml

Needs the `campaign` package installed. Its section: docs/performance.md, "Multi-GPU (NCCL)" (the earlier figures are history there: no commit was recorded).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import _gpu_harness as h
from _gpu_harness import fmt

NAME = "gpu-drill"


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = h.parser(__doc__, size="gpt2-124m", micro_batch=8, budget_s=400.0, drill_names=True)
    p.add_argument("--steps", "--drill-steps", type=int, default=240)
    p.add_argument("--checkpoint-every", type=int, default=40)
    p.add_argument("--hang-step", type=int, default=100, help="rank 0 hangs here in attempt 1 (0: no such fault)")
    p.add_argument("--collective-hang-step", type=int, default=190,
                   help="rank 0 hangs in a collective here in the next attempt (0: no such fault)")
    return h.finish_args(p.parse_args(argv))


def spec(args: argparse.Namespace) -> dict[str, Any]:
    # With 4+ GPUs two spares take over from the two nodes the faults blame; with fewer there
    # is nothing to swap to.
    active, exclude = (args.gpus - 2, True) if args.gpus >= 4 else (args.gpus, False)
    kinds = [("hang", args.hang_step), ("hang_in_collective", args.collective_hang_step)]
    faults = [{"kind": k, "step": s, "rank": 0, "attempt": i + 1}
              for i, (k, s) in enumerate((k, s) for k, s in kinds if s)]
    long_run = {
        "name": "long-run", "kind": "long_run", "nodes": active, "steps": args.steps,
        "checkpoint_every": args.checkpoint_every, "max_attempts": len(faults) + 1, "exclude_suspects": exclude,
        "exclusion_hours": 1.0, "timeout_s": 600, "continue_on_failure": True, "faults": faults,
        # Steady budget: 3 x p99 step time + 5 s; the start-up budget covers imports, NCCL
        # init and the checkpoint load (a 1b model with compile would need minutes here).
        "watchdog": {"startup_s": 180, "step_factor": 3.0, "floor_s": 5.0, "warmup_steps": 3,
                     "warmup_s": 30, "checkpoint_s": 120, "heartbeat_stale_s": 10}}
    return h.campaign_spec(args, NAME, f"fault drill, {args.size} model, FSDP2, deterministic kernels",
                           h.trainer(args, keep_last=3), [long_run])


# --- nvidia-smi ------------------------------------------------------------------------------

class GpuMonitor:
    """Polls `nvidia-smi --query-compute-apps=pid,used_memory` in a thread."""

    def __init__(self, period_s: float = 0.2) -> None:
        self.period_s = period_s
        self.samples: list[dict[str, Any]] = []
        self.available = shutil.which("nvidia-smi") is not None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> GpuMonitor:
        if self.available:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self.available:
            self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.is_set():
            t0 = time.time()
            apps = compute_apps()
            self.samples.append({"t0": t0, "t1": time.time(), "apps": apps})
            self._stop.wait(self.period_s)


def compute_apps() -> list[tuple[int, int]] | None:
    """(pid, used MiB) of every process holding GPU memory; None if nvidia-smi failed."""
    try:
        r = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if r.returncode != 0:
        return None
    apps = []
    for line in r.stdout.splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit():
            apps.append((int(parts[0]), int(parts[1]) if parts[1].isdigit() else -1))
    return apps


def write_samples(samples: list[dict[str, Any]], path: Path) -> None:
    with open(path, "w") as f:
        f.write("t0,t1,pid,used_mib\n")
        f.writelines(f"{smp['t0']:.3f},{smp['t1']:.3f},{'' if pid is None else pid},{'' if mem is None else mem}\n"
                     for smp in samples for pid, mem in (smp["apps"] or [(None, None)]))


# --- reading the ledger -----------------------------------------------------------------------

def epoch(t: dt.datetime | None) -> float | None:
    """Ledger datetimes are naive UTC."""
    return None if t is None else t.replace(tzinfo=dt.timezone.utc).timestamp()


def ledger_attempts(campaigns: Path, name: str) -> list[dict[str, Any]]:
    """Every attempt of campaign NAME with its watchdog summary, exact times and step times
    (through the ledger's own queries: the summary is not part of `status --json`)."""
    import sqlalchemy as sa

    from campaign.ledger import default_url, open_ledger
    from campaign.ledger import reads
    from campaign.ledger.models import Event, StepMetric

    led = open_ledger(default_url(campaigns), create=False)
    out = []
    try:
        with led.session() as s:
            c = reads.get_campaign(s, name)
            if c is None:
                return []
            relaunches = {e.attempt_id: e.data for e in s.scalars(
                sa.select(Event).where(Event.campaign_id == c.id, Event.kind == "relaunch"))}
            for run, a in reads.list_attempts(s, c):
                steps = s.execute(sa.select(StepMetric.step, StepMetric.time, StepMetric.step_time_s)
                                  .where(StepMetric.attempt_id == a.id).order_by(StepMetric.step)).all()
                out.append({"stage": run.name, "number": a.number, "label": a.label, "state": a.state,
                            "exit_code": a.exit_code, "summary": dict(a.summary or {}), "run_dir": a.run_dir,
                            "nodes": list(a.nodes or []), "suspects": list(a.suspects or []),
                            "started": epoch(a.started), "finished": epoch(a.finished),
                            "first_step": a.first_step, "last_step": a.last_step,
                            "steps": [(int(st), t, st_s) for st, t, st_s in steps],
                            "relaunch": relaunches.get(a.id)})
    finally:
        led.close()
    return out


def killed_at(a: dict[str, Any]) -> float:
    """When the supervisor had the job stopped and reaped: it writes supervisor.json right
    after; the ledger's `finished` (a little later, after Parsl returned) is the fallback."""
    path = Path(a["run_dir"]) / "supervisor.json"
    return path.stat().st_mtime if path.exists() else a["finished"]


def job_pids(a: dict[str, Any]) -> list[int]:
    try:
        return [int(p) for p in json.loads((Path(a["run_dir"]) / "pids.json").read_text())["pgids"]]
    except (OSError, ValueError, KeyError):
        return []


_BUDGET = re.compile(r"budget ([\d.]+) s")


def stall_row(a: dict[str, Any], nxt: dict[str, Any] | None, samples: list[dict[str, Any]],
              monitored: bool) -> dict[str, Any]:
    """Detection latency, kill cleanliness and recovery time of one stalled attempt."""
    summ = a["summary"]
    t_hang = a["steps"][-1][1] if a["steps"] else None  # the last step done; the next one hung
    t_kill = killed_at(a)
    first_new = nxt["steps"][0] if nxt and nxt["steps"] else None
    budget = _BUDGET.search(summ.get("stall") or "")
    pids = set(job_pids(a))
    seen_before = any(p in pids for smp in samples if smp["t1"] < t_kill for p, _ in smp["apps"] or [])
    after = [smp for smp in samples if smp["t0"] > t_kill]
    leftover = sorted({p for smp in after for p, _ in smp["apps"] or [] if p in pids})
    # Between the kill and the relaunch's first step (its trainer takes the GPU a few
    # seconds after it starts): samples in which no process at all held GPU memory.
    gap = [smp for smp in after if first_new is None or first_new[1] is None or smp["t1"] < first_new[1]]
    free_in_gap = [smp for smp in gap if smp["apps"] == []]
    return {
        "attempt": a["number"], "fault_step": (a["last_step"] or 0) + 1, "stall": summ.get("stall"),
        "budget_s": float(budget.group(1)) if budget else None,
        "detected_after_s": summ.get("detected_after_s"),
        "hang_to_kill_s": round(t_kill - t_hang, 2) if t_hang else None,
        "suspects": [s.get("node") for s in a["suspects"]],
        "resume_step": (a.get("relaunch") or {}).get("resume_step"),
        "relaunch_first_step": first_new[0] if first_new else None,
        "recovery_s": round(first_new[1] - t_kill, 2) if first_new and first_new[1] else None,
        "relaunch_gap_s": round(nxt["started"] - t_kill, 2) if nxt and nxt["started"] else None,
        "job_pids": sorted(pids),
        "nvidia_smi": {"monitored": monitored, "job_seen_on_gpu_before_kill": seen_before,
                       "samples_after_kill": len(after), "job_pids_after_kill": leftover,
                       "samples_kill_to_relaunch": len(gap), "gpu_free_samples_kill_to_relaunch": len(free_in_gap),
                       "first_gpu_free_after_kill_s": round(free_in_gap[0]["t1"] - t_kill, 2) if free_in_gap else None},
    }


def drill_report(attempts: list[dict[str, Any]], samples: list[dict[str, Any]], monitored: bool) -> dict[str, Any]:
    runs = [a for a in attempts if a["stage"] == "long-run"]
    steady = [st_s for a in runs for (_, _, st_s) in a["steps"][3:] if st_s is not None]
    median_step = statistics.median(steady) if steady else None
    rows = [stall_row(a, runs[i + 1] if i + 1 < len(runs) else None, samples, monitored)
            for i, a in enumerate(runs) if a["state"] == "stalled"]
    for row in rows:
        for key in ("detected_after_s", "hang_to_kill_s", "recovery_s"):
            if median_step and row[key] is not None:
                row[key.replace("_s", "_steps")] = round(row[key] / median_step, 1)
    final = runs[-1] if runs else None
    return {"median_step_s": median_step,
            "attempts": [{k: a[k] for k in ("number", "label", "state", "exit_code", "first_step", "last_step")}
                         for a in runs],
            "stalls": rows, "finished": bool(final and final["state"] == "succeeded"),
            "final_step": final["last_step"] if final else None}


# --- table ------------------------------------------------------------------------------------

def drill_table(drill: dict[str, Any]) -> str:
    rows = []
    for r in drill["stalls"]:
        smi = r["nvidia_smi"]
        clean = ("n/a" if not smi["monitored"] else
                 ("yes" if not smi["job_pids_after_kill"] else f"NO: {smi['job_pids_after_kill']}"))
        rows.append([fmt(r["attempt"]), fmt(r["fault_step"]), fmt(r["budget_s"], ".1f"),
                     f"{fmt(r['detected_after_s'], '.2f')} ({fmt(r.get('detected_after_steps'))}x)",
                     f"{fmt(r['hang_to_kill_s'], '.2f')} ({fmt(r.get('hang_to_kill_steps'))}x)",
                     clean, f"{smi['gpu_free_samples_kill_to_relaunch']}/{smi['samples_kill_to_relaunch']}",
                     fmt(r["resume_step"]), fmt(r["relaunch_first_step"]),
                     f"{fmt(r['recovery_s'], '.2f')} ({fmt(r.get('recovery_steps'))}x)"])
    return h.md_table(["attempt", "hung at step", "budget (s)", "detected after (s, x step)",
                       "hang->killed (s, x step)", "no job pid on GPU after kill", "GPU-free samples kill->relaunch",
                       "resumed from ckpt", "relaunch 1st step", "kill->1st new step (s, x step)"], rows)


def budget_ratios(drill: dict[str, Any]) -> str:
    parts = [f"attempt {r['attempt']}: {r['detected_after_s'] / r['budget_s']:.2f}x"
             for r in drill["stalls"] if r["detected_after_s"] is not None and r["budget_s"]]
    return "; ".join(parts) or "no stall detected"


# --- main ---------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    run = h.start(args, "Hang drill", [spec(args)])
    with GpuMonitor() as mon:
        res = run.campaign(spec(args), reserve_s=45)
    after = h.nvidia_smi_text()
    h.say("nvidia-smi --query-compute-apps=pid,used_memory --format=csv after the drill:\n" + after)
    drill = drill_report(ledger_attempts(run.campaigns, NAME), mon.samples, mon.available)
    run.result[NAME].update(drill=drill, nvidia_smi_after=after, nvidia_smi_samples=len(mon.samples))
    write_samples(mon.samples, run.out / "nvidia-smi.csv")
    # Lift what the drill excluded (only with 4+ GPUs), so later campaigns in this workdir may use every node.
    for ex in (res["status"] or {}).get("exclusions", []):
        run.cli("nodes", "include", ex["node"], "--site", "local", "--workdir", str(run.campaigns))
    lines = h.stage_lines(run, NAME) + [
        "", f"### Fault drill ({args.size}); median step {fmt(drill['median_step_s'], '.4f')} s; "
        f"finished: {drill['finished']} at step {drill['final_step']}", "", drill_table(drill), "",
        "attempts: " + "; ".join(f"{a['number']} {a['state']} (exit {a['exit_code']}) steps "
                                 f"{a['first_step']}-{a['last_step']}" for a in drill["attempts"]), "",
        f"Ratio vs baseline: latencies in median step times ({fmt(drill['median_step_s'], '.4f')} s, this run) "
        f"in the table; detection / watchdog budget: {budget_ratios(drill)}"]
    targets = h.Targets("gpu_hang_drill")
    targets.require("campaign passed (relaunched from the last checkpoint, finished)", res["submit"]["exit_code"] == 0,
                    f"campaign submit exit {res['submit']['exit_code']}")
    for r in drill["stalls"]:
        if r["detected_after_s"] is None or not r["budget_s"]:
            targets.require(f"attempt {r['attempt']}: stall detected", False, "no detection latency recorded")
        else:
            targets.check(f"attempt {r['attempt']}: detection / watchdog budget", r["detected_after_s"] / r["budget_s"],
                          "<=", 1.0, "x")
    if not drill["stalls"]:
        targets.require("both injected hangs detected", False, "no stall in the ledger")
    h.finish(run, lines, targets)


if __name__ == "__main__":
    sys.exit(main())
