"""Claim: an asynchronous checkpoint stalls training for a small fraction of a synchronous one.

Runs the built-in trainer (`python -m campaign.train`, one rank, FSDP2 by default) twice,
checkpointing every `--every` steps: first with `checkpoint_async: false`, then `true`.
Without `--every`, the sync run saves every 6 steps and the async run every
max(6, 1.5 x the sync save time / step time) steps, so that a background write can finish
before the next save (else the wait for it shows up as blocked time). `--steps` (default:
4 intervals) is raised to 3 intervals where it is shorter. Per checkpoint it reports, from
the trainer's own `checkpoint_saved` events and step times:

- blocked_s: the training thread waited for the save (`stall_s`: sync: the whole save;
  async: the copy into CPU memory, plus any wait for the write to finish);
- slowdown_s: the extra step time of the steps run while the background write went on
  (sum over the interval of step time minus the run's median step time);
- stall_s = blocked_s + slowdown_s, and save_s: from the start of the save to `.complete`.

Only checkpoints with a whole interval after them count (the last one is waited for at the
end and says nothing about the stall during training), and the first is shown apart
(`first_stall_s`: it also allocates, and on CUDA pins, the staging buffers). The last line
is the ratio async/sync of the mean stall per checkpoint.

    python benchmarks/checkpoint_stall.py                  # CPU, tiny model: about 1 min
    python benchmarks/checkpoint_stall.py --size 1b        # one H200: about 6 min at 1b

Prints the versions first; no prompts; exit 1 with the trainer's last log lines if a run
fails.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _target import Targets  # noqa: E402
from campaign import runfiles  # noqa: E402

TARGET_RATIO = 0.10
"""An asynchronous checkpoint stalls training at most 10% of what a synchronous one does."""


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--size", default="tiny", help="model size (campaign.train.shapes): tiny, small, gpt2-124m, 1b, ...")
    p.add_argument("--steps", type=int, default=None, help="training steps per mode (default: 4 intervals)")
    p.add_argument("--every", type=int, default=None,
                   help="steps between checkpoints (default: 6 for sync; async: long enough for a write)")
    p.add_argument("--micro-batch", type=int, default=4, help="sequences per step")
    p.add_argument("--parallelism", default="fsdp", choices=["ddp", "fsdp"])
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda", "xpu"])
    p.add_argument("--dir", default=None, help="where checkpoints go (default: a temporary folder, removed)")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per mode before giving up")
    p.add_argument("--json", default=None, help="also write the results to this file")
    args = p.parse_args(argv)
    if (args.every is not None and args.every < 1) or (args.steps is not None and args.steps < 1):
        p.error("--steps and --every must be >= 1")
    return args


def plan(args: argparse.Namespace, every: int) -> tuple[int, int]:
    """(steps, every) of one mode: at least 3 intervals, so 2 checkpoints count."""
    steps = args.steps or 4 * every
    if steps < 3 * every:
        say(f"--steps {steps} is shorter than 3 intervals of {every}: running {3 * every}")
        steps = 3 * every
    return steps, every


def versions() -> str:
    """One line of versions; exits 2 first if the trainer could not run here."""
    try:
        import pydantic  # noqa: F401  (the trainer reads its config with it)
        import torch
    except ImportError as exc:
        say(f"cannot run the built-in trainer with {sys.executable}: {exc}")
        raise SystemExit(2) from None

    cuda = torch.version.cuda or "none"
    dev = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device"
    return (f"python {platform.python_version()}, torch {torch.__version__}, CUDA {cuda}, {dev}, "
            f"host {socket.gethostname()}, {os.cpu_count()} CPUs")


def trainer_config(args: argparse.Namespace, ckpt: Path, asynchronous: bool, steps: int, every: int) -> dict:
    train = {"parallelism": args.parallelism, "micro_batch_size": args.micro_batch, "compile": args.compile,
             "device": args.device, "deterministic": False, "checkpoint_every": every,
             "checkpoint_async": asynchronous, "keep_last": 1, "warmup_steps": 2}
    run = {"max_steps": steps, "checkpoint_dir": str(ckpt), "resume": False, "checkpoint_final": False}
    return {"model": {"size": args.size}, "data": {}, "train": train, "run": run, "faults": []}


def run_mode(args: argparse.Namespace, base: Path, asynchronous: bool, steps: int,
             every: int) -> tuple[list[dict], list[dict]]:
    """One trainer run; returns (metrics rows, checkpoint_saved events)."""
    name = "async" if asynchronous else "sync"
    ckpt = base / f"{name}-checkpoints"
    say(f"{name}: training {steps} steps, a checkpoint every {every}")
    metrics, events = run_trainer(trainer_config(args, ckpt, asynchronous, steps, every), base / name, name,
                                  args.timeout)
    shutil.rmtree(ckpt, ignore_errors=True)  # room for the next mode (1b: 16 GB a checkpoint)
    return metrics, [e for e in events if e["event"] == "checkpoint_saved"]


def run_trainer(cfg: dict, run_dir: Path, name: str, timeout: float) -> tuple[list[dict], list[dict]]:
    """`python -m campaign.train` as one rank in `run_dir`; (metrics rows, events). Exits 1
    with the last lines of the trainer's log if it fails."""
    run_dir.mkdir(parents=True)
    path = run_dir / "trainer.json"
    path.write_text(json.dumps(cfg))
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
    env.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", CAMPAIGN_RUN_DIR=str(run_dir),
               CAMPAIGN_NODE="bench", CAMPAIGN_ATTEMPT="1",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    log = run_dir / "trainer.log"
    t0 = time.perf_counter()
    with open(log, "w") as out:
        try:
            code = subprocess.run([sys.executable, "-m", "campaign.train", "--config", str(path)], env=env,
                                  stdout=out, stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
    if code != 0:
        say(f"{name}: the trainer exited {code}; last lines of {log}:")
        print("\n".join(log.read_text().splitlines()[-40:]), flush=True)
        raise SystemExit(1)
    say(f"{name}: done in {time.perf_counter() - t0:.1f} s")
    return runfiles.read_metrics(run_dir)[0], runfiles.read_events(run_dir)


def summarize(metrics: list[dict], events: list[dict], every: int, steps: int) -> dict:
    """Mean per checkpoint over those with a whole interval after them, the first apart."""
    times = {m["step"]: m["step_time_s"] for m in metrics}
    base = statistics.median(times[s] for s in times if s > 2)  # warm-up steps left out
    rows = []
    for e in (e for e in events if e["step"] + every <= steps):
        after = [times[s] - base for s in range(e["step"] + 1, e["step"] + every + 1) if s in times]
        blocked = e.get("stall_s", e["seconds"])
        rows.append({"blocked_s": blocked, "slowdown_s": max(0.0, sum(after)), "save_s": e["seconds"]})
    if len(rows) < 2:
        raise SystemExit("fewer than 2 checkpoints had a whole interval after them: raise --steps")
    first, rest = rows[0], rows[1:]
    out = {k: statistics.mean(r[k] for r in rest) for k in ("blocked_s", "slowdown_s", "save_s")}
    out.update(stall_s=out["blocked_s"] + out["slowdown_s"], checkpoints=len(rest), step_s=base,
               every=every, first_stall_s=first["blocked_s"] + first["slowdown_s"])
    return out


def say(msg: str) -> None:
    print(f"[{Path(sys.argv[0]).stem}] {msg}", flush=True)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    say(versions())
    say(f"size {args.size}, {args.parallelism}, micro-batch {args.micro_batch}, compile {args.compile}, "
        f"device {args.device}, steps {args.steps or 'auto'}, checkpoint every {args.every or 'auto'}")
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="checkpoint-stall-"))
    base.mkdir(parents=True, exist_ok=True)
    results = {}
    try:
        steps, every = plan(args, args.every or 6)
        results["sync"] = summarize(*run_mode(args, base, False, steps, every), every, steps)
        say(f"sync: {json.dumps(results['sync'])}")  # kept even if the async run fails
        if args.every is None:
            sync = results["sync"]
            every = max(6, math.ceil(1.5 * sync["save_s"] / max(sync["step_s"], 1e-6)))
        steps, every = plan(args, every)
        results["async"] = summarize(*run_mode(args, base, True, steps, every), every, steps)
        say(f"async: {json.dumps(results['async'])}")
    finally:
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)
    print()
    print(f"{'mode':<6} {'every':>5} {'ckpts':>5} {'step_s':>8} {'blocked_s':>10} {'slowdown_s':>10} "
          f"{'stall_s':>9} {'save_s':>8} {'first_stall_s':>13}")
    for mode, r in results.items():
        print(f"{mode:<6} {r['every']:>5} {r['checkpoints']:>5} {r['step_s']:>8.4f} {r['blocked_s']:>10.4f} "
              f"{r['slowdown_s']:>10.4f} {r['stall_s']:>9.4f} {r['save_s']:>8.4f} {r['first_stall_s']:>13.4f}")
    ratio = results["async"]["stall_s"] / results["sync"]["stall_s"] if results["sync"]["stall_s"] else float("nan")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results, "ratio": ratio}, indent=2))
    print(f"async/sync stall per checkpoint: {ratio:.3f}", flush=True)
    targets = Targets("checkpoint_stall")
    targets.check("async/sync stall per checkpoint", ratio, "<=", TARGET_RATIO)
    targets.exit()


if __name__ == "__main__":
    sys.exit(main())
