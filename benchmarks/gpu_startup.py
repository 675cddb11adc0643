"""Claim (issue 41 item 3): each cut of a relaunch's start-up, measured on and off in one run.
With the compile cache and the warm start, the built-in trainer's start-up (its process
created -> its first step finished) is <= 1/3 of a cold one: an empty cache and a cold
interpreter, which is what a blind retry's relaunch pays (its segments are the relaunch
breakdown's in gpu_relaunch.py).

One rank (`python -m campaign.train --config C`, as a launcher starts it, with the rank
variables of a one-rank launch), the shape `--size` (bf16, compiled, no checkpoint), `--steps`
steps per start, one after the other on one device, for each compile scope (`trainer.
compile_scope`: `model`, one graph; `blocks`, one graph per block shared by all of them):

  cold    a cold interpreter, an empty compile cache (the baseline)
  cached  a cold interpreter, the cache the cold start filled
  warm    forked from the fork server (`python -m campaign.executors.warm -- ...`, the local
          site's warm start), the same cache; the server is started (and its import paid) by
          one warm start before it, not counted

Per start: the segments of its `startup` event (interpreter, imports, process group, model
built, compiled = the first step less one steady step) and its steady step (median of the
steps after the first SKIP). Target: warm / cold <= 1/3 for the scope `auto` takes on one rank
at this shape (blocks from 1e9 parameters: parallelize.BLOCKS_FROM_PARAMS); per step of
`blocks` against `model` is printed, not judged.

    python benchmarks/gpu_startup.py --size 1b --steps 12
    python benchmarks/gpu_startup.py --rehearsal        # tiny, CPU, not compiled: checks the harness

Writes startup.csv and summary.json to --out (default $OUT; neither: only the table is printed).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _target import Targets, skip  # noqa: E402
from gpu_relaunch import metrics_rows, startup_event, startup_segments  # noqa: E402

SKIP = 3
"""Steps left out of the steady step (the compile, allocation)."""
RATIO_MAX = 1 / 3
SEGMENTS = ("interpreter", "imports", "process group", "model built", "compiled", "first step")
SIZES = {"tiny": 4, "gpt2-124m": 8, "1b": 4}
"""Micro-batch per shape (gpu_relaunch.py's SHAPES)."""


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="1b", choices=sorted(SIZES))
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--scopes", default="model,blocks", help="compile scopes, comma-separated")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--rehearsal", action="store_true", help="tiny model on CPU, not compiled")
    a = p.parse_args(argv)
    if a.rehearsal:
        a.size, a.steps = "tiny", max(a.steps, SKIP + 3) if a.steps != 12 else 6
    a.out = a.out or (Path(os.environ["OUT"]) if os.environ.get("OUT") else None)
    return a


def config(a: argparse.Namespace, work: Path, scope: str, cache: Path) -> Path:
    from campaign.train.config import TrainerConfig

    cfg = TrainerConfig.model_validate({
        "model": {"size": a.size},
        "train": {"compile": not a.rehearsal, "compile_scope": scope, "precision": "fp32" if a.rehearsal else "bf16",
                  "device": "cpu" if a.rehearsal else "cuda", "micro_batch_size": SIZES[a.size],
                  "overlap_steps": False, "checkpoint_every": 0},
        "run": {"max_steps": a.steps, "checkpoint_dir": str(work / "checkpoints"), "checkpoint_final": False,
                "resume": False, "compile_cache_dir": str(cache)}})
    path = work / f"trainer-{scope}.json"
    path.write_text(cfg.model_dump_json())
    return path


def default_scope(size: str) -> str:
    """What `compile_scope: auto` takes on one rank for this shape (parallelize.BLOCKS_FROM_PARAMS)."""
    import torch

    from campaign.train.model import GPT, SHAPES
    from campaign.train.parallelize import compiles_whole

    with torch.device("meta"):
        return "model" if compiles_whole(GPT(SHAPES[size]).num_params(), 1, "auto") else "blocks"


def start(a: argparse.Namespace, cfg: Path, run_dir: Path, warm: bool) -> dict[str, Any]:
    run_dir.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CAMPAIGN_", "MASTER_"))}
    env.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", CAMPAIGN_RUN_DIR=str(run_dir),
               CAMPAIGN_WARM_SCOPE=f"gpu-startup-{os.getpid()}", PYTHONUNBUFFERED="1")
    train = [sys.executable, "-m", "campaign.train", "--config", str(cfg)]
    argv = [sys.executable, "-m", "campaign.executors.warm", "--", *train] if warm else train
    t0 = time.time()
    with open(run_dir / "trainer.log", "w") as log:
        code = subprocess.run(argv, env=env, cwd=run_dir, stdout=log, stderr=subprocess.STDOUT, timeout=900).returncode
    rows = metrics_rows(run_dir)
    times = [r["step_time_s"] for r in rows[SKIP:] if r.get("step_time_s")]
    step_s = statistics.median(times) if times else float("nan")
    event = startup_event(run_dir) or {}
    seg = startup_segments(event.get("marks") or {}, 0.0 if step_s != step_s else step_s)
    if code != 0 or not event:
        print((run_dir / "trainer.log").read_text()[-3000:], file=sys.stderr)
    return {"exit_code": code, "wall_s": round(time.time() - t0, 2), "step_s": step_s, "warm": event.get("warm"),
            "segments": seg, "startup_s": round(sum(seg.get(k, 0.0) for k in SEGMENTS), 2)}


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    if not a.rehearsal:
        import torch

        if not torch.cuda.is_available():
            skip("no CUDA device (use --rehearsal on CPU)")
    work = Path(tempfile.mkdtemp(prefix="gpu-startup-"))
    try:
        return _measure(a, work)
    finally:  # two compile caches and the run folders: gigabytes at 1b
        shutil.rmtree(work, ignore_errors=True)


def _measure(a: argparse.Namespace, work: Path) -> int:
    rows: list[dict[str, Any]] = []
    for scope in a.scopes.split(","):
        cache = work / f"cache-{scope}"
        cfg = config(a, work, scope, cache)
        for label, warm in (("cold", False), ("cached", False), ("warm (server start)", True), ("warm", True)):
            r = start(a, cfg, work / f"{scope}-{label.split()[0]}-{len(rows)}", warm)
            r.update(scope=scope, start=label)
            rows.append(r)
            print(f"{scope:7s} {label:20s} exit {r['exit_code']} start-up {r['startup_s']:7.2f} s  "
                  f"step {r['step_s'] * 1000:8.2f} ms  " + "  ".join(f"{k} {v:.2f}" for k, v in r["segments"].items()),
                  flush=True)
    if a.out is not None:
        a.out.mkdir(parents=True, exist_ok=True)
        with open(a.out / "startup.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["scope", "start", "exit_code", "warm", "startup_s", "step_ms", *SEGMENTS])
            for r in rows:
                w.writerow([r["scope"], r["start"], r["exit_code"], r["warm"], r["startup_s"],
                            round(r["step_s"] * 1000, 3), *(round(r["segments"].get(k, 0.0), 3) for k in SEGMENTS)])
        (a.out / "summary.json").write_text(json.dumps(rows, indent=1))
    print(f"\n{'scope':7s} {'start':20s} {'start-up s':>10s} {'step ms':>9s} " + " ".join(f"{s[:9]:>9s}" for s in SEGMENTS))
    for r in rows:
        print(f"{r['scope']:7s} {r['start']:20s} {r['startup_s']:10.2f} {r['step_s'] * 1000:9.2f} "
              + " ".join(f"{r['segments'].get(s, 0.0):9.2f}" for s in SEGMENTS))
    by = {(r["scope"], r["start"]): r for r in rows}
    t = Targets("benchmarks/gpu_startup.py")
    if any(r["exit_code"] != 0 for r in rows):
        print("a start failed (its log is above)", file=sys.stderr)
        return 2
    for scope in a.scopes.split(","):
        cold, warm = by[(scope, "cold")]["startup_s"], by[(scope, "warm")]["startup_s"]
        print(f"ratio warm+cached / cold ({scope}): {warm / cold:.3f} ({warm:.2f} / {cold:.2f} s)")
    if "model" in a.scopes and "blocks" in a.scopes:
        m, b = by[("model", "warm")]["step_s"], by[("blocks", "warm")]["step_s"]
        print(f"per step blocks / model: {b / m:.3f} ({b * 1000:.2f} / {m * 1000:.2f} ms)")
        print(f"start-up blocks / model, cold: {by[('blocks', 'cold')]['startup_s'] / by[('model', 'cold')]['startup_s']:.3f}")
    default = default_scope(a.size)
    if default not in a.scopes.split(","):
        default = a.scopes.split(",")[0]
    cold, warm = by[(default, "cold")]["startup_s"], by[(default, "warm")]["startup_s"]
    if a.rehearsal:
        print("rehearsal (tiny, CPU, not compiled): no target judged")
        return 0
    t.check(f"start-up warm+cached / cold ({default}, {a.size})", warm / cold, "<=", RATIO_MAX)
    t.exit()
    return 0


if __name__ == "__main__":
    sys.exit(main())
