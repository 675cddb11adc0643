"""Claim: under DDP a campaign's scaling stage measures what the NCCL gradient all-reduce
costs: its time per step and its share of the step at each GPU count, next to tokens/s.

Runs campaign `gpu-1b-ddp` (`--size`, default the `1b` shape, bf16 autocast, DDP over NCCL,
not deterministic, `--micro-batch` x 2048 tokens per GPU) through `campaign submit` on the
`local` site, one virtual node per GPU: a single weak-scaling stage over node counts
[1, 2, 4, 8] up to --gpus, 15 steps each (median of steps 6-15). The trainer's DDP comm hook
times every gradient bucket's all-reduce from CUDA events on the NCCL work
(TORCH_NCCL_ENABLE_TIMING). FSDP2 issues its collectives internally, so
gpu_throughput_in_campaign.py cannot show this column.

Baseline: the 1-GPU row of the same stage, where NCCL's all-reduce is a local copy. Prints
(and writes to --out, default $OUT, as summary.md) the stage's verdict, the table (step time,
tokens/s, MFU, collective time and share, peak memory, efficiency) and the ratios of
per-GPU tokens/s and of collective time at each N to that baseline. With one GPU there is only
the baseline: the ratio line says so.

    python benchmarks/gpu_ddp_allreduce.py                        # all GPUs of this machine
    python benchmarks/gpu_ddp_allreduce.py --gpus 8 --budget-s 560
    python benchmarks/gpu_ddp_allreduce.py --rehearsal            # tiny model on CPU (gloo)
    python benchmarks/gpu_ddp_allreduce.py --write-specs DIR      # only write gpu-1b-ddp.yaml

Needs the `campaign` package installed. Its section: docs/performance.md, "Multi-GPU (NCCL)" (the earlier figures are history there: no commit was recorded).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import _gpu_harness as h

NAME = "gpu-1b-ddp"


def spec(args: argparse.Namespace) -> dict[str, Any]:
    return h.campaign_spec(
        args, NAME, f"{args.size} model, bf16 autocast, DDP over NCCL (its comm hook times the all-reduce)",
        h.trainer(args, parallelism="ddp", compile=args.compile, deterministic=False),
        [h.scaling_stage(args, steps=15, reference=None)])


def main(argv: list[str] | None = None) -> None:
    args = h.parse_scaling(__doc__, 300.0, argv)
    run = h.start(args, "Gradient all-reduce under DDP", [spec(args)])
    res = run.campaign(spec(args), reserve_s=25)
    heading = f"### Scaling under DDP ({args.size}, bf16 autocast, weak, {args.micro_batch} seq/GPU)"
    lines = h.scaling_report(run, NAME, res, heading, [("tokens_per_s", "tokens/s per GPU", True),
                                                         ("comm_time_s", "all-reduce time", False)])
    targets = h.Targets("gpu_ddp_allreduce")
    targets.require("campaign passed (weak scaling >= 0.8x one GPU, the all-reduce measured)", res["submit"]["exit_code"] == 0, f"campaign submit exit {res['submit']['exit_code']}")
    h.finish(run, lines, targets)


if __name__ == "__main__":
    sys.exit(main())
