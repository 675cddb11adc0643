"""Claim: a ~1.3B model trains through the real `campaign submit` at full speed on every GPU:
the campaign's smoke, loss check and FSDP2 weak-scaling stages pass, and per-GPU throughput at
N GPUs stays within 0.8x of one GPU's.

Runs campaign `gpu-1b` (`--size`, default the `1b` shape: 1.34B parameters, bf16, FSDP2 over
NCCL, not deterministic, `--micro-batch` x 2048 tokens per GPU) on the `local` site with one
virtual node per GPU, through `campaign submit` (Parsl HTEX, SQLite ledger):

1. smoke: every GPU, NCCL all-reduce exact, finite losses;
2. loss-check: 50 steps on 1 GPU, recording the reference loss;
3. scaling: weak scaling over node counts [1, 2, 4, 8] up to --gpus, 20 steps each
   (median of steps 6-20), efficiency floor 0.8, loss at the last step within 0.15 of the
   reference.

Baseline: the 1-GPU row of the same scaling stage. Prints (and writes to --out, default $OUT,
as summary.md) each stage's verdict, the table (step time, tokens/s, tokens/s per GPU, MFU,
peak memory, last loss, efficiency) and the ratio of per-GPU tokens/s at each N to that
baseline. With one GPU there is only the baseline: the ratio line says so.

    python benchmarks/gpu_throughput_in_campaign.py                     # all GPUs of this machine
    python benchmarks/gpu_throughput_in_campaign.py --gpus 8 --budget-s 560
    python benchmarks/gpu_throughput_in_campaign.py --rehearsal         # tiny model on CPU (gloo)
    python benchmarks/gpu_throughput_in_campaign.py --write-specs DIR   # only write gpu-1b.yaml

Needs the `campaign` package installed (`campaign.stages` is mapped from `stages/` at install).
Its section: docs/performance.md, "Multi-GPU (NCCL)" (the earlier figures are history there: no commit was recorded).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import _gpu_harness as h

NAME = "gpu-1b"


def spec(args: argparse.Namespace) -> dict[str, Any]:
    return h.campaign_spec(
        args, NAME, f"{args.size} model, bf16, FSDP2 over NCCL, one virtual node per GPU ({args.gpus} GPU(s))",
        # Not deterministic: throughput as a production run would see it.
        h.trainer(args, compile=args.compile, deterministic=False),
        [{"name": "smoke", "kind": "smoke", "steps": 5, "timeout_s": 300},
         {"name": "loss-check", "kind": "loss_check", "nodes": 1, "steps": 50, "window": 5, "tolerance": 0.10,
          "reference": {"record": True}, "timeout_s": 600},
         h.scaling_stage(args, steps=20, reference=f"{NAME}/loss-check")])


def main(argv: list[str] | None = None) -> None:
    args = h.parse_scaling(__doc__, 540.0, argv)
    run = h.start(args, "In-campaign throughput (FSDP2)", [spec(args)])
    res = run.campaign(spec(args), reserve_s=30)
    heading = (f"### Scaling ({args.size}, {'bf16' if args.device == 'cuda' else 'fp32'}, FSDP2, weak, "
               f"{args.micro_batch} seq/GPU)")
    lines = h.scaling_report(run, NAME, res, heading, [("tokens_per_s", "tokens/s per GPU", True)])
    targets = h.Targets("gpu_throughput_in_campaign")
    targets.require("campaign passed (smoke all-reduce exact, loss check, weak scaling >= 0.8x one GPU)", res["submit"]["exit_code"] == 0, f"campaign submit exit {res['submit']['exit_code']}")
    h.finish(run, lines, targets)


if __name__ == "__main__":
    sys.exit(main())
