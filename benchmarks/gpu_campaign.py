"""Claim: a whole campaign runs on NVIDIA GPUs through the real CLI, and a hung job is caught,
killed cleanly and relaunched from its last checkpoint within the watchdog's budget.

One command, on a machine with N GPUs (the `local` site, one virtual node per GPU, each bound
to its own GPU with `bind_gpus: true`), runs `campaign submit` (Parsl HTEX, SQLite ledger) on:

1. campaign `gpu-1b` (the ~1.3B `1b` shape, bf16, FSDP2, NCCL):
   smoke (every GPU, all-reduce exact), a 50-step loss check on 1 GPU that records the
   reference, and a weak-scaling stage over node counts [1, 2, 4, 8] up to N: tokens/s, step
   time, memory, MFU, efficiency;
2. campaign `gpu-drill` (`--drill-size`, default gpt2-124m, FSDP2, deterministic): a long run
   with checkpoints in which rank 0 hangs at step S1 (`hang`, attempt 1) and in a collective
   at step S2 (`hang_in_collective`, attempt 2); the watchdog must detect each stall, stop the
   job and relaunch from the last complete checkpoint; `nvidia-smi` is polled all along to
   show that no process of a killed job holds GPU memory afterwards. Then the resume test
   (SIGKILL and SIGTERM mid-step, resume, compare losses with an uninterrupted run); if the
   losses are not bit-exact, the largest difference sets the tolerance of a second run
   (campaign `gpu-resume-tol`);
3. campaign `gpu-1b-ddp`: the scaling stage again under DDP, whose comm hook times the
   gradient all-reduce (FSDP2 does not expose its collective time);
4. (`--phases strict`) the resume test with the same trainer run with
   `torch.use_deterministic_algorithms(True, warn_only=False)` (deterministic attention
   backward), falling back to the math attention backend if some op has no deterministic
   variant; then, with --resume-tolerance, the built-in trainer's resume test at that tolerance.

Results are read back through the campaign's own CLI and ledger (`campaign status NAME --json`,
`campaign ledger export`, the ledger's ORM for the attempts' watchdog summaries). Tables and
logs go to --out (default $OUT); a summary is printed last.

    python benchmarks/gpu_campaign.py                      # all GPUs of this machine
    python benchmarks/gpu_campaign.py --gpus 8 --phases 1b --budget-s 560           # node counts 1, 2, 4, 8
    python benchmarks/gpu_campaign.py --gpus 8 --phases drill,ddp --budget-s 560    # (two device calls)
    python benchmarks/gpu_campaign.py --rehearsal          # tiny models on CPU (gloo): checks the harness
    python benchmarks/gpu_campaign.py --write-specs DIR    # only write the campaign files

Keep NVLink multicast off (the script sets NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1,
NVSHMEM_DISABLE_NVLS=1 for everything it starts). Needs the `campaign` package installed
(not run from the source tree's root: `campaign.stages` is mapped from `stages/` at install).
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import io
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path
from typing import Any

NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
NODE_COUNTS = (1, 2, 4, 8)


# --- arguments and campaign files --------------------------------------------------------

def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpus", type=int, default=None, help="GPUs to use (default: all that nvidia-smi lists)")
    p.add_argument("--out", type=Path, default=None, help="tables and logs (default: $OUT or ./gpu-campaign-out)")
    p.add_argument("--workdir", type=Path, default=None, help="ledger and run directories (default: a new /tmp dir)")
    p.add_argument("--size", default="1b", help="model of the smoke / loss-check / scaling campaign")
    p.add_argument("--micro-batch", type=int, default=8, help="sequences per GPU per step (scaling campaign)")
    p.add_argument("--drill-size", default="gpt2-124m", help="model of the fault drill and the resume test")
    p.add_argument("--drill-micro-batch", type=int, default=8)
    p.add_argument("--drill-steps", type=int, default=240)
    p.add_argument("--checkpoint-every", type=int, default=40)
    p.add_argument("--hang-step", type=int, default=100, help="rank 0 hangs here in attempt 1")
    p.add_argument("--collective-hang-step", type=int, default=190,
                   help="rank 0 hangs in a collective here in attempt 2 (0: no second fault)")
    p.add_argument("--resume-tolerance", type=float, default=None,
                   help="tolerance of the follow-up resume test (default: 2x the largest difference seen, rounded up)")
    p.add_argument("--phases", default="1b,drill,ddp",
                   help="comma list of 1b (smoke, loss check, scaling), drill (fault drill + resume test, then "
                        "the resume test again at a tolerance if not bit-exact), ddp (DDP scaling), strict "
                        "(resume test with deterministic kernels forced, then at --resume-tolerance)")
    p.add_argument("--compile", action="store_true", help="torch.compile in the scaling campaign")
    p.add_argument("--no-ddp", action="store_true", help="skip the DDP scaling campaign")
    p.add_argument("--budget-s", type=float, default=540.0,
                   help="wall-clock budget: later phases are skipped when too little is left")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--rehearsal", action="store_true", help="tiny models on CPU: checks the harness anywhere")
    p.add_argument("--write-specs", type=Path, default=None, metavar="DIR", help="write the campaign files and exit")
    args = p.parse_args(argv)
    if args.rehearsal:
        args.device, args.size, args.drill_size, args.micro_batch = "cpu", "tiny", "tiny", 4
    if args.gpus is None:
        args.gpus = max(1, gpu_count()) if args.device == "cuda" else 1
    return args


def gpu_count() -> int:
    """GPUs nvidia-smi lists (no CUDA context is created in this process)."""
    if not shutil.which("nvidia-smi"):
        return 0
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False)
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def node_counts(gpus: int) -> list[int]:
    counts = [n for n in NODE_COUNTS if n <= gpus]
    return counts + [gpus] if gpus not in counts else counts


def site(args: argparse.Namespace) -> dict[str, Any]:
    return {"kind": "local", "nodes": args.gpus, "ranks_per_node": 1, "bind_gpus": args.device == "cuda"}


def trainer(args: argparse.Namespace, **over: Any) -> dict[str, Any]:
    gpu = args.device == "cuda"
    t = {"parallelism": "fsdp", "precision": "bf16" if gpu else "auto", "device": args.device,
         "backend": "nccl" if gpu else "gloo", "compile": False, "deterministic": True,
         "micro_batch_size": args.micro_batch, "lr": 6e-4, "warmup_steps": 10, "schedule_steps": 1000}
    t.update(over)
    return t


def spec_1b(args: argparse.Namespace) -> dict[str, Any]:
    name = "gpu-1b"
    return {
        "name": name,
        "description": f"{args.size} model, bf16, FSDP2 over NCCL, one virtual node per GPU ({args.gpus} GPU(s))",
        "site": site(args),
        "model": {"size": args.size},
        "data": {"source": "synthetic"},
        # Not deterministic: throughput as a production run would see it.
        "trainer": trainer(args, compile=args.compile, deterministic=False),
        "stages": [
            {"name": "smoke", "kind": "smoke", "steps": 5, "timeout_s": 300},
            {"name": "loss-check", "kind": "loss_check", "nodes": 1, "steps": 50, "window": 5, "tolerance": 0.10,
             "reference": {"record": True}, "timeout_s": 600},
            {"name": "scaling", "kind": "scaling", "node_counts": node_counts(args.gpus), "batch": "weak",
             "steps": 20, "warmup_steps": 5, "min_efficiency": 0.8, "loss_tolerance": 0.15,
             "reference": {"stage_run": f"{name}/loss-check"}, "timeout_s": 600, "continue_on_failure": True},
        ],
    }


def spec_ddp(args: argparse.Namespace) -> dict[str, Any]:
    s = spec_1b(args)
    return {**s, "name": "gpu-1b-ddp",
            "description": f"{args.size} model, bf16 autocast, DDP over NCCL (its comm hook times the all-reduce)",
            "trainer": trainer(args, parallelism="ddp", compile=args.compile, deterministic=False),
            "stages": [{**s["stages"][2], "steps": 15, "reference": None}]}


def drill_nodes(gpus: int) -> tuple[int, bool]:
    """Active nodes of the drill and whether suspects are excluded: with 4+ GPUs two spares take
    over from the two nodes the faults blame; with fewer there is nothing to swap to."""
    return (gpus - 2, True) if gpus >= 4 else (gpus, False)


def spec_drill(args: argparse.Namespace) -> dict[str, Any]:
    active, exclude = drill_nodes(args.gpus)
    faults = [{"kind": "hang", "step": args.hang_step, "rank": 0, "attempt": 1}]
    if args.collective_hang_step:
        faults.append({"kind": "hang_in_collective", "step": args.collective_hang_step, "rank": 0, "attempt": 2})
    return {
        "name": "gpu-drill",
        "description": f"fault drill and resume test, {args.drill_size} model, FSDP2, deterministic kernels",
        "site": site(args),
        "model": {"size": args.drill_size},
        "data": {"source": "synthetic"},
        "trainer": trainer(args, micro_batch_size=args.drill_micro_batch, keep_last=3),
        "stages": [
            {"name": "long-run", "kind": "long_run", "nodes": active, "steps": args.drill_steps,
             "checkpoint_every": args.checkpoint_every, "max_attempts": len(faults) + 1, "exclude_suspects": exclude,
             "exclusion_hours": 1.0, "timeout_s": 600, "continue_on_failure": True, "faults": faults,
             # Steady budget: 3 x p99 step time + 5 s; the start-up budget covers imports, NCCL
             # init and the checkpoint load (a 1b model with compile would need minutes here).
             "watchdog": {"startup_s": 180, "step_factor": 3.0, "floor_s": 5.0, "warmup_steps": 3,
                          "warmup_s": 30, "checkpoint_s": 120, "heartbeat_stale_s": 10}},
            resume_stage(0.0),
        ],
    }


def resume_stage(tolerance: float) -> dict[str, Any]:
    return {"name": "resume-test", "kind": "resume_test", "nodes": 1, "checkpoint_step": 10, "interrupt_step": 12,
            "steps": 16, "signals": ["SIGKILL", "SIGTERM"], "tolerance": tolerance, "timeout_s": 300,
            "continue_on_failure": True}


def spec_resume_tol(args: argparse.Namespace, tolerance: float) -> dict[str, Any]:
    s = spec_drill(args)
    return {**s, "name": "gpu-resume-tol", "description": f"resume test at tolerance {tolerance:g}",
            "stages": [resume_stage(tolerance)]}


# The built-in trainer asks for deterministic algorithms with warn_only=True on accelerators,
# under which cuDNN and flash attention keep their non-deterministic backward. This trainer
# command (the trainer contract allows any) runs the same trainer with warn_only=False, so
# those kernels take their deterministic variants (or an op without one fails loudly).
STRICT_TRAINER = ("import runpy, torch; f = torch.use_deterministic_algorithms; "
                  "torch.use_deterministic_algorithms = lambda mode, **kw: f(mode, warn_only=False); "
                  "runpy.run_module('campaign.train', run_name='__main__', alter_sys=True)")
# Fallback when some op has no deterministic variant: only attention is made deterministic,
# by restricting scaled_dot_product_attention to its math backend.
MATH_SDPA_TRAINER = ("import runpy, torch; b = torch.backends.cuda; b.enable_cudnn_sdp(False); "
                     "b.enable_flash_sdp(False); b.enable_mem_efficient_sdp(False); b.enable_math_sdp(True); "
                     "runpy.run_module('campaign.train', run_name='__main__', alter_sys=True)")


def spec_resume_strict(args: argparse.Namespace, code: str, name: str) -> dict[str, Any]:
    s = spec_drill(args)
    return {**s, "name": name, "description": "resume test with deterministic kernels forced (own trainer command)",
            "trainer": {**s["trainer"], "command": ["{python}", "-c", code]}, "stages": [resume_stage(0.0)]}


def write_spec(spec: dict[str, Any], path: Path) -> Path:
    import yaml

    path.parent.mkdir(parents=True, exist_ok=True)
    spec = json.loads(json.dumps(spec))  # plain types
    for st in spec["stages"]:
        if st.get("reference") is None:
            st.pop("reference", None)
    path.write_text(f"# written by benchmarks/gpu_campaign.py\n{yaml.safe_dump(spec, sort_keys=False)}")
    return path


# --- running the CLI ---------------------------------------------------------------------

class Run:
    """The CLI, the clock and the log of one benchmark run."""

    def __init__(self, args: argparse.Namespace, workdir: Path, out: Path) -> None:
        self.args, self.workdir, self.out = args, workdir, out
        self.campaigns = workdir / "campaigns"
        self.deadline = time.time() + args.budget_s
        self.env = {**os.environ, **NO_MULTICAST, "PYTHONUNBUFFERED": "1", "CAMPAIGN_ALLOW_FAULTS": "1"}
        self.env.pop("CAMPAIGN_DB_URL", None)
        self.env.pop("CAMPAIGN_WORKDIR", None)

    def left(self) -> float:
        return self.deadline - time.time()

    def cli(self, *argv: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "campaign.cli", *argv]
        return subprocess.run(cmd, cwd=self.workdir, env=self.env, capture_output=True, text=True, timeout=timeout, check=False)

    def submit(self, spec_path: Path, timeout: float) -> dict[str, Any]:
        """`campaign submit FILE`, streamed to stdout; SIGINT (cancel) at the timeout."""
        cmd = [sys.executable, "-m", "campaign.cli", "submit", str(spec_path), "--workdir", str(self.campaigns)]
        say(f"$ {' '.join(cmd)}   (timeout {timeout:.0f} s)")
        t0 = time.time()
        proc = subprocess.Popen(cmd, cwd=self.workdir, env=self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        reader = threading.Thread(target=_pump, args=(proc.stdout, spec_path.stem), daemon=True)
        reader.start()
        cancelled = False
        try:
            code = proc.wait(timeout=max(5.0, timeout))
        except subprocess.TimeoutExpired:
            cancelled = True
            say(f"{spec_path.stem}: out of time; cancelling (SIGINT)")
            proc.send_signal(signal.SIGINT)
            try:
                code = proc.wait(timeout=45)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                code = proc.wait()
        reader.join(timeout=5)
        return {"exit_code": code, "wall_s": round(time.time() - t0, 1), "cancelled_for_time": cancelled}

    def status(self, name: str) -> dict[str, Any] | None:
        r = self.cli("status", name, "--json", "--workdir", str(self.campaigns))
        if r.returncode != 0:
            say(f"campaign status {name} failed: {r.stderr.strip()}")
            return None
        return json.loads(r.stdout)

    def export(self, name: str, what: str) -> list[dict[str, Any]]:
        path = self.workdir / f"{name}-{what}.json"
        r = self.cli("ledger", "export", name, "--what", what, "--format", "json", "--out", str(path),
                     "--workdir", str(self.campaigns))
        if r.returncode != 0:
            say(f"campaign ledger export {name} failed: {r.stderr.strip()}")
            return []
        return json.loads(path.read_text())


def _pump(stream: Any, tag: str) -> None:
    for line in stream:
        print(f"[{tag}] {line}", end="", flush=True)


def say(msg: str) -> None:
    print(f"== {time.strftime('%H:%M:%S')} {msg}", flush=True)


# --- nvidia-smi ----------------------------------------------------------------------------

class GpuMonitor:
    """Polls `nvidia-smi --query-compute-apps=pid,used_memory` (and the memory in use) in a thread."""

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


def nvidia_smi_text() -> str:
    if not shutil.which("nvidia-smi"):
        return "(no nvidia-smi)"
    r = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv"],
                       capture_output=True, text=True, check=False)
    return (r.stdout + r.stderr).strip()


# --- reading results ------------------------------------------------------------------------

def epoch(t: dt.datetime | None) -> float | None:
    """Ledger datetimes are naive UTC."""
    return None if t is None else t.replace(tzinfo=dt.timezone.utc).timestamp()


def ledger_attempts(campaigns: Path, name: str) -> list[dict[str, Any]]:
    """Every attempt of campaign NAME with its watchdog summary, exact times and step times
    (through the ledger's own queries: the summary is not part of `status --json`)."""
    import sqlalchemy as sa

    from campaign.ledger import default_url, open_ledger
    from campaign.ledger import queries as q
    from campaign.ledger.models import Event, StepMetric

    led = open_ledger(default_url(campaigns), create=False)
    out = []
    try:
        with led.session() as s:
            c = q.get_campaign(s, name)
            if c is None:
                return []
            relaunches = {e.attempt_id: e.data for e in s.scalars(
                sa.select(Event).where(Event.campaign_id == c.id, Event.kind == "relaunch"))}
            for run, a in q.list_attempts(s, c):
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


def drill_report(attempts: list[dict[str, Any]], samples: list[dict[str, Any]], monitored: bool) -> dict[str, Any]:
    """Detection latency, kill cleanliness and recovery time of every stalled attempt."""
    runs = [a for a in attempts if a["stage"] == "long-run"]
    steady = [st_s for a in runs for (step, _, st_s) in a["steps"][3:] if st_s is not None]
    median_step = statistics.median(steady) if steady else None
    rows = []
    for i, a in enumerate(runs):
        if a["state"] != "stalled":
            continue
        nxt = runs[i + 1] if i + 1 < len(runs) else None
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
        row = {
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
        if median_step:
            for key in ("detected_after_s", "hang_to_kill_s", "recovery_s"):
                if row[key] is not None:
                    row[key.replace("_s", "_steps")] = round(row[key] / median_step, 1)
        rows.append(row)
    final = runs[-1] if runs else None
    return {"median_step_s": median_step, "attempts": [{k: a[k] for k in ("number", "label", "state", "exit_code",
                                                                              "first_step", "last_step")} for a in runs],
            "stalls": rows, "finished": bool(final and final["state"] == "succeeded"),
            "final_step": final["last_step"] if final else None}


def resume_report(status: dict[str, Any] | None) -> dict[str, Any] | None:
    if not status:
        return None
    st = next((x for x in status["stages"] if x["name"] == "resume-test"), None)
    if st is None:
        return None
    numbers = status["stage_numbers"].get("resume-test") or {}
    checks = numbers.get("checks") or []
    diffs = [c.get("max_abs_diff") for c in checks if c.get("max_abs_diff") is not None]
    ran = bool(checks) and all(c.get("resume_exit_code") == 0 and c.get("resumed_from_step") is not None for c in checks)
    return {"state": st["state"], "verdict": st["verdict"], "checks": checks,
            "max_abs_diff": max(diffs) if diffs else None, "comparisons_ran": ran}


def resume_pairs(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per signal, from the exported steps of a resume test: is the resumed run's first step
    the interrupted run's own step, bit for bit (the checkpoint restored model, optimizer,
    data position and RNG exactly, whatever the kernels), and how far two fresh runs (the
    reference and the interrupted one, before the cut) drift apart (the kernels' noise)."""
    by: dict[str, dict[int, float]] = {}
    for m in steps:
        if m.get("stage") == "resume-test" and m.get("loss") is not None:
            by.setdefault(m.get("label") or "", {})[int(m["step"])] = float(m["loss"])
    ref = by.get("reference", {})
    out = []
    for sig in ("SIGKILL", "SIGTERM"):
        cut = next((v for k, v in by.items() if k.startswith(f"{sig} at")), None)
        res = by.get(f"resume after {sig}")
        if not cut or not res:
            continue
        first = min(res)
        noise = [abs(cut[k] - ref[k]) for k in cut if k in ref]
        out.append({"signal": sig, "resumed_first_step": first, "resumed_loss": res[first],
                    "interrupted_loss_same_step": cut.get(first),
                    "first_step_exact": cut.get(first) == res[first],
                    "fresh_run_max_abs_diff": max(noise) if noise else None,
                    "fresh_run_first_diff_step": next((k for k in sorted(cut) if k in ref and cut[k] != ref[k]), None)})
    return out


def nice_ceil(x: float) -> float:
    """Round up to one significant digit: 3.2e-4 -> 4e-4."""
    e = 10 ** math.floor(math.log10(x))
    return math.ceil(x / e - 1e-9) * e


def median(vals: list[float]) -> float | None:
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None


def scaling_rows(status: dict[str, Any] | None, steps: list[dict[str, Any]], warmup: int) -> list[dict[str, Any]]:
    """The scaling stage's table (from the ledger) plus the median MFU per attempt (from the steps)."""
    if not status or not status.get("scaling"):
        return []
    rows = [dict(r) for r in status["scaling"][0]["rows"]]
    for r in rows:
        mine = [m for m in steps if m.get("stage") == "scaling" and m.get("attempt") == r.get("attempt")
                and m["step"] > warmup]
        r["mfu"] = median([m.get("mfu") for m in mine])
    return rows


# --- tables ---------------------------------------------------------------------------------

def fmt(v: Any, spec: str = "") -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and spec:
        return format(v, spec)
    return str(v)


def md_table(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def scaling_table(rows: list[dict[str, Any]]) -> str:
    return md_table(
        ["GPUs", "step (s)", "tokens/s", "tokens/s/GPU", "MFU", "collective (s)", "coll. share", "peak mem (GiB)",
         "loss @20", "efficiency"],
        [[fmt(r["nodes"]), fmt(r.get("step_time_s"), ".4f"), fmt(r.get("tokens_per_s"), ",.0f"),
          fmt(r["tokens_per_s"] / r["nodes"] if r.get("tokens_per_s") else None, ",.0f"),
          fmt(100 * r["mfu"] if r.get("mfu") is not None else None, ".1f") + ("%" if r.get("mfu") is not None else ""),
          fmt(r.get("comm_time_s"), ".4f"), fmt(100 * r["comm_share"] if r.get("comm_share") is not None else None, ".2f")
          + ("%" if r.get("comm_share") is not None else ""),
          fmt(r.get("mem_peak_gib"), ".1f"), fmt(r.get("last_loss"), ".4f"), fmt(r.get("efficiency"), ".3f")]
         for r in rows])


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
    return md_table(["attempt", "hung at step", "budget (s)", "detected after (s, x step)", "hang->killed (s, x step)",
                     "no job pid on GPU after kill", "GPU-free samples kill->relaunch", "resumed from ckpt",
                     "relaunch 1st step", "kill->1st new step (s, x step)"], rows)


# --- main -------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.write_specs:
        for spec in (spec_1b(args), spec_drill(args), spec_ddp(args)):
            print(write_spec(spec, args.write_specs / f"{spec['name']}.yaml"))
        return 0
    out = (args.out or Path(os.environ.get("OUT") or "gpu-campaign-out")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    workdir = (args.workdir or Path(f"/tmp/gpu-campaign-{time.strftime('%Y%m%d-%H%M%S')}")).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    run = Run(args, workdir, out)
    result: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "workdir": str(workdir)}
    have = gpu_count()
    say(f"GPUs listed by nvidia-smi: {have}; using {args.gpus} on {args.device}; workdir {workdir}; out {out}")
    if args.device == "cuda" and have < args.gpus:
        say(f"error: --gpus {args.gpus} but this machine has {have}")
        return 2
    result["environment"] = environment()
    monitor_samples: list[dict[str, Any]] = []

    phases = {x.strip() for x in args.phases.split(",") if x.strip()}

    # 1. smoke, loss check, scaling (FSDP2)
    if "1b" in phases:
        spec = write_spec(spec_1b(args), workdir / "specs" / "gpu-1b.yaml")
        reserve = 60 if args.rehearsal else 240 if "drill" in phases else 30
        result["gpu-1b"] = {"submit": run.submit(spec, timeout=run.left() - reserve)}
        st = run.status("gpu-1b")
        result["gpu-1b"].update(status=st, scaling=scaling_rows(st, run.export("gpu-1b", "steps"), warmup=5))
        run.export("gpu-1b", "attempts")

    # 2. fault drill + resume test, with nvidia-smi watching
    drill_res: dict[str, Any] = {}
    if "drill" in phases and run.left() > 120:
        spec = write_spec(spec_drill(args), workdir / "specs" / "gpu-drill.yaml")
        with GpuMonitor() as mon:
            drill_res["submit"] = run.submit(spec, timeout=run.left() - 45)
            time.sleep(1.0)
        monitor_samples = mon.samples
        drill_res["nvidia_smi_after"] = nvidia_smi_text()
        say("nvidia-smi --query-compute-apps=pid,used_memory --format=csv after the drill:\n" + drill_res["nvidia_smi_after"])
        drill_st = run.status("gpu-drill")
        drill_res["status"] = drill_st
        drill_res["drill"] = drill_report(ledger_attempts(run.campaigns, "gpu-drill"), monitor_samples, mon.available)
        drill_res["resume"] = resume_report(drill_st)
        drill_res["resume_pairs"] = resume_pairs(run.export("gpu-drill", "steps"))
        run.export("gpu-drill", "attempts")
        # Lift what the drill excluded (only with 4+ GPUs), so later campaigns may use every node.
        for ex in (drill_st or {}).get("exclusions", []):
            run.cli("nodes", "include", ex["node"], "--site", "local", "--workdir", str(run.campaigns))
        res = drill_res["resume"]
        if res and res["state"] != "passed" and res["comparisons_ran"] and res["max_abs_diff"] and run.left() > 75:
            tol = args.resume_tolerance or nice_ceil(2 * res["max_abs_diff"])
            say(f"resume test not bit-exact (max |diff| {res['max_abs_diff']:.3g}); again at tolerance {tol:g}")
            drill_res["resume_tolerance"] = resume_at_tolerance(run, args, tol)
    elif "drill" in phases:
        say("skipped the drill: out of time")
    result["gpu-drill"] = drill_res

    # Resume test with deterministic kernels forced (own trainer command), then at a tolerance.
    if "strict" in phases and run.left() > 60:
        strict: dict[str, Any] = {}
        for name, code in (("gpu-resume-strict", STRICT_TRAINER), ("gpu-resume-math-sdpa", MATH_SDPA_TRAINER)):
            spec = write_spec(spec_resume_strict(args, code, name), workdir / "specs" / f"{name}.yaml")
            sub = run.submit(spec, timeout=run.left() - 25)
            st = run.status(name)
            strict[name] = {"submit": sub, "result": resume_report(st),
                            "resume_pairs": resume_pairs(run.export(name, "steps"))}
            run.export(name, "attempts")
            r = strict[name]["result"]
            if (r and r["comparisons_ran"]) or run.left() < 90:
                break  # it ran (exact or not): no fallback needed
            say(f"{name} did not run its comparisons (an op without a deterministic variant?); trying the next")
        result["strict"] = strict
    elif "strict" in phases:
        say("skipped the strict resume test: out of time")

    # 3. DDP scaling: the gradient all-reduce timed by the comm hook
    if "ddp" in phases and run.left() > 90:
        spec = write_spec(spec_ddp(args), workdir / "specs" / "gpu-1b-ddp.yaml")
        sub = run.submit(spec, timeout=run.left() - 25)
        st = run.status("gpu-1b-ddp")
        result["gpu-1b-ddp"] = {"submit": sub, "status": st,
                                "scaling": scaling_rows(st, run.export("gpu-1b-ddp", "steps"), warmup=5)}
        run.export("gpu-1b-ddp", "attempts")
    elif "ddp" in phases:
        say("skipped the DDP scaling campaign: out of time")

    if "strict" in phases and args.resume_tolerance and "drill" not in phases and run.left() > 75:
        result["gpu-drill"]["resume_tolerance"] = resume_at_tolerance(run, args, args.resume_tolerance)

    result["nvidia_smi_final"] = nvidia_smi_text()
    summary = write_outputs(run, result, monitor_samples)
    print(summary, flush=True)
    ok = all(result[n]["submit"]["exit_code"] == 0 for n in ("gpu-1b", "gpu-drill") if "submit" in (result.get(n) or {}))
    return 0 if ok else 1


def resume_at_tolerance(run: Run, args: argparse.Namespace, tol: float) -> dict[str, Any]:
    spec = write_spec(spec_resume_tol(args, tol), run.workdir / "specs" / "gpu-resume-tol.yaml")
    sub = run.submit(spec, timeout=run.left() - 20)
    out = {"tolerance": tol, "submit": sub, "result": resume_report(run.status("gpu-resume-tol")),
           "resume_pairs": resume_pairs(run.export("gpu-resume-tol", "steps"))}
    run.export("gpu-resume-tol", "attempts")
    return out


def environment() -> dict[str, Any]:
    env: dict[str, Any] = {"python": sys.version.split()[0]}
    r = subprocess.run([sys.executable, "-c", "import torch, parsl, pydantic, sqlalchemy; "
                        "print(torch.__version__, torch.version.cuda, parsl.__version__, pydantic.VERSION, "
                        "sqlalchemy.__version__)"], capture_output=True, text=True, check=False)
    env["versions"] = r.stdout.strip() or r.stderr.strip()[-300:]
    if shutil.which("nvidia-smi"):
        q = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, check=False)
        env["gpus"] = q.stdout.strip().splitlines()
    say(f"environment: {env}")
    return env


def write_outputs(run: Run, result: dict[str, Any], samples: list[dict[str, Any]]) -> str:
    out, workdir = run.out, run.workdir
    lines = [f"# GPU campaign ({run.args.gpus} GPU(s), {run.args.device})", ""]
    lines.append(f"environment: {json.dumps(result.get('environment'))}")
    for name in ("gpu-1b", "gpu-drill", "gpu-1b-ddp"):  # (resume-test campaigns: their own section)
        st = (result.get(name) or {}).get("status")
        if not st:
            continue
        sub = (result.get(name) or {}).get("submit") or {}
        lines += ["", f"## {name}: {st['state']} (campaign submit exit {sub.get('exit_code')}, {sub.get('wall_s')} s)", ""]
        lines += [f"- {s['name']} ({s['kind']}): **{s['state']}**: {s['verdict']}" for s in st["stages"]]
    sc = (result.get("gpu-1b") or {}).get("scaling") or []
    if sc:
        lines += ["", f"### Scaling ({run.args.size}, {'bf16' if run.args.device == 'cuda' else 'fp32'}, FSDP2, weak, {run.args.micro_batch} seq/GPU)", "",
                  scaling_table(sc)]
    ddp = (result.get("gpu-1b-ddp") or {}).get("scaling") or []
    if ddp:
        lines += ["", f"### Scaling under DDP ({run.args.size}, bf16 autocast)", "", scaling_table(ddp)]
    drill = (result.get("gpu-drill") or {}).get("drill")
    if drill:
        lines += ["", f"### Fault drill ({run.args.drill_size}); median step {fmt(drill['median_step_s'], '.4f')} s; "
                  f"finished: {drill['finished']} at step {drill['final_step']}", "", drill_table(drill), "",
                  "attempts: " + "; ".join(f"{a['number']} {a['state']} (exit {a['exit_code']}) steps "
                                           f"{a['first_step']}-{a['last_step']}" for a in drill["attempts"])]
    drill_res = result.get("gpu-drill") or {}
    entries = [("gpu-drill, built-in trainer, tolerance 0", drill_res.get("resume"), drill_res.get("resume_pairs"))]
    tol = drill_res.get("resume_tolerance")
    if tol:
        entries.append((f"gpu-resume-tol, built-in trainer, tolerance {tol['tolerance']:g}", tol.get("result"),
                        tol.get("resume_pairs")))
    for name, r in (result.get("strict") or {}).items():
        entries.append((f"{name}, deterministic kernels forced, tolerance 0", r.get("result"), r.get("resume_pairs")))
    entries = [e for e in entries if e[1] or e[2]]
    if entries:
        lines += ["", "### Resume test", ""]
        for name, r, pairs in entries:
            if r:
                lines.append(f"- {name}: **{r['state']}**: {r['verdict']}; largest |loss diff| vs the "
                             f"uninterrupted run: {r['max_abs_diff']!r}")
            for pr in pairs or []:
                lines.append(f"  - {pr['signal']}: resumed step {pr['resumed_first_step']} loss {pr['resumed_loss']!r} vs "
                             f"the interrupted run's own {pr['interrupted_loss_same_step']!r}: "
                             f"{'exact' if pr['first_step_exact'] else 'DIFFERENT'}; two fresh runs differ by up to "
                             f"{fmt(pr['fresh_run_max_abs_diff'], '.3g')} (first at step {pr['fresh_run_first_diff_step']})")
    lines += ["", "nvidia-smi at the end:", "```", result.get("nvidia_smi_final", ""), "```"]
    text = "\n".join(lines) + "\n"
    (out / "summary.md").write_text(text)
    result["nvidia_smi_samples"] = len(samples)
    (out / "summary.json").write_text(json.dumps(result, indent=1, default=str))
    _merge_exports(run, out)
    with open(out / "nvidia-smi.csv", "w") as f:
        f.write("t0,t1,pid,used_mib\n")
        f.writelines(f"{smp['t0']:.3f},{smp['t1']:.3f},{'' if pid is None else pid},{'' if mem is None else mem}\n"
                     for smp in samples for pid, mem in (smp["apps"] or [(None, None)]))
    _tar_runs(workdir, out / "runs.tar.gz")
    return text


def _merge_exports(run: Run, out: Path) -> None:
    for what in ("steps", "attempts"):
        rows = []
        for f in sorted(run.workdir.glob(f"*-{what}.json")):
            name = f.name[: -len(f"-{what}.json")]
            rows += [{"campaign": name, **r} for r in json.loads(f.read_text())]
        if not rows:
            continue
        cols = list(dict.fromkeys(k for r in rows for k in r))
        with open(out / f"{what}.csv", "w", newline="") as fh:
            w = csv.DictWriter(fh, cols)
            w.writeheader()
            for r in rows:
                w.writerow({k: (" ".join(map(str, v)) if isinstance(v, list) else v) for k, v in r.items()})


def _tar_runs(workdir: Path, dest: Path) -> None:
    """Run directories without checkpoints (rank logs, supervisor reports, metrics, events,
    heartbeats, Parsl logs) and the ledger, under 15 MB."""
    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        parts = Path(info.name).parts
        return None if any(p.startswith("checkpoints") for p in parts) else info

    for skip_parsl in (False, True):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            for p in sorted(workdir.iterdir()):
                if skip_parsl and p.name == "campaigns":
                    for q in sorted(p.rglob("*")):
                        if q.is_file() and "parsl" not in q.relative_to(p).parts[:2] \
                                and not any(x.startswith("checkpoints") for x in q.parts):
                            tar.add(q, arcname=str(q.relative_to(workdir)), recursive=False)
                else:
                    tar.add(p, arcname=p.name, filter=keep)
        if buf.tell() < 15 * 2**20:
            dest.write_bytes(buf.getvalue())
            return
    dest.write_bytes(buf.getvalue()[: 15 * 2**20])


if __name__ == "__main__":
    sys.exit(main())
