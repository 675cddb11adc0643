"""Claim (issue 44 item 2): `precision: float8` (torchao's float8 training, rowwise scaling of
the blocks' linear layers) trains the built-in trainer faster than bf16 at 1b on one Hopper GPU,
and its loss after 200 steps is within the loss check's tolerance (0.10) of the bf16 run's.

Both runs are the trainer as a campaign launches it (`python -m campaign.train --config C`, one
rank, compiled, the same seed, shape, batch and data), one after the other on one device. Per
run: the median step time of the steps after the first SKIP (tokens/s from it), the peak
memory, MFU (against the dense bf16 peak; float8 also against the float8 peak) and the mean
loss of the last 10 steps. Targets: float8 / bf16 tokens/s > 1; |loss float8 - loss bf16| <=
0.10.

    python benchmarks/float8_vs_bf16.py --size 1b --steps 200
    python benchmarks/float8_vs_bf16.py --rehearsal   # CPU: the float8 run must be refused (exit 93)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _target import Targets, skip  # noqa: E402
from gpu_relaunch import metrics_rows  # noqa: E402

SKIP = 5
TOLERANCE = 0.10
"""The loss check's default tolerance (stages/loss_check.py)."""
LAST = 10


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="1b")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--compile-scope", default="auto", choices=["auto", "model", "blocks"])
    p.add_argument("--rehearsal", action="store_true", help="tiny, CPU: checks that float8 is refused there")
    return p.parse_args(argv)


def run(a: argparse.Namespace, work: Path, precision: str) -> dict[str, Any]:
    from campaign.train.config import TrainerConfig

    d = work / precision
    d.mkdir()
    cfg = TrainerConfig.model_validate({
        "model": {"size": "tiny" if a.rehearsal else a.size},
        "train": {"compile": not a.rehearsal, "compile_scope": a.compile_scope, "precision": precision, "device": "cpu" if a.rehearsal else "cuda",
                  "micro_batch_size": a.micro_batch, "checkpoint_every": 0, "seed": 0, "lr": 6e-4,
                  "warmup_steps": 20, "schedule_steps": max(a.steps, 100)},
        "run": {"max_steps": a.steps, "checkpoint_dir": str(d / "checkpoints"), "checkpoint_final": False,
                "resume": False}})
    (d / "trainer.json").write_text(cfg.model_dump_json())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CAMPAIGN_", "MASTER_"))}
    env.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", CAMPAIGN_RUN_DIR=str(d))
    with open(d / "trainer.log", "w") as log:
        code = subprocess.run([sys.executable, "-m", "campaign.train", "--config", str(d / "trainer.json")], env=env,
                              cwd=d, stdout=log, stderr=subprocess.STDOUT, timeout=1200).returncode
    rows = metrics_rows(d)
    steady = rows[SKIP:]
    step_s = statistics.median(r["step_time_s"] for r in steady) if steady else float("nan")
    out = {"precision": precision, "exit_code": code, "steps": len(rows), "step_s": step_s,
           "tokens_per_s": statistics.median(r["tokens_per_s"] for r in steady) if steady else float("nan"),
           "loss": statistics.mean(r["loss"] for r in rows[-LAST:]) if rows else float("nan"),
           "mem_gib": max((r.get("mem_peak_gib") or 0.0) for r in rows) if rows else float("nan"),
           "mfu": statistics.median(r["mfu"] for r in steady if r.get("mfu")) if any(r.get("mfu") for r in steady)
           else None,
           "mfu_float8": statistics.median(r["mfu_float8"] for r in steady if r.get("mfu_float8"))
           if any(r.get("mfu_float8") for r in steady) else None,
           "log_tail": (d / "trainer.log").read_text()[-600:]}
    print(f"{precision}: exit {code}, {len(rows)} steps, {step_s * 1000:.2f} ms/step, loss {out['loss']:.4f}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    if not a.rehearsal:
        import torch

        if not torch.cuda.is_available():
            skip("no CUDA device (use --rehearsal on CPU)")
        if torch.cuda.get_device_capability() < (8, 9):
            skip("float8 needs compute capability 8.9 or newer")
    work = Path(tempfile.mkdtemp(prefix="float8-"))
    try:
        return _measure(a, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _measure(a: argparse.Namespace, work: Path) -> int:
    if a.rehearsal:
        a.steps = 4
        f8 = run(a, work, "float8")
        print(f"float8 on CPU: exit {f8['exit_code']}: {f8['log_tail'].strip().splitlines()[-1]}")
        return 0 if f8["exit_code"] == 93 else 1
    bf16, f8 = run(a, work, "bf16"), run(a, work, "float8")
    print(f"{'precision':9s} {'exit':>4s} {'steps':>5s} {'step ms':>8s} {'tokens/s':>10s} {'mem GiB':>8s} "
          f"{'MFU bf16':>8s} {'MFU fp8':>8s} {'loss(last 10)':>13s}")
    for r in (bf16, f8):
        print(f"{r['precision']:9s} {r['exit_code']:4d} {r['steps']:5d} {r['step_s'] * 1000:8.2f} "
              f"{r['tokens_per_s']:10,.0f} {r['mem_gib']:8.1f} {r['mfu'] or 0:8.3f} {r['mfu_float8'] or 0:8.3f} "
              f"{r['loss']:13.4f}")
        if r["exit_code"] != 0:
            print(r["log_tail"], file=sys.stderr)
    ratio = f8["tokens_per_s"] / bf16["tokens_per_s"]
    print(f"ratio float8/bf16 tokens/s at {a.size}: {ratio:.3f}x; loss difference {f8['loss'] - bf16['loss']:+.4f}")
    t = Targets("benchmarks/float8_vs_bf16.py")
    t.check(f"float8/bf16 tokens/s ({a.size})", ratio, ">", 1.0)
    t.check(f"|loss float8 - bf16| after {a.steps} steps", abs(f8["loss"] - bf16["loss"]), "<=", TOLERANCE)
    t.exit()
    return 0


if __name__ == "__main__":
    sys.exit(main())
