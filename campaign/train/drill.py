"""A quick collective drill: `python -m campaign.train.drill --config FILE [--rounds N]`.

Run by the supervisor on subsets of an allocation when a stall left no node standing out
(every rank waiting in a collective): initialise the process group on the given nodes,
all-reduce a 4 MiB tensor `rounds` times, check the sum, exit 0. A node whose network
hangs makes its subset's drill hang, and the supervisor bisects towards it.

Deliberate `hang_in_collective` faults that name a node (tests and drills, behind
CAMPAIGN_ALLOW_FAULTS) apply here too: they emulate a node whose collectives hang,
whatever program runs on it.
"""

from __future__ import annotations

import argparse
import sys
import time

from campaign import report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m campaign.train.drill", description=__doc__)
    parser.add_argument("--config", required=True, help="the attempt's TrainerConfig JSON (device, backend, faults)")
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args(argv)
    try:
        import torch
        import torch.distributed as dist

        from campaign.train import dist as cdist
        from campaign.train.config import TrainerConfig
    except ImportError as exc:
        print(f"campaign.train.drill: broken environment: {exc!r}", file=sys.stderr, flush=True)
        return report.EXIT_BROKEN_ENV
    with open(args.config) as f:
        cfg = TrainerConfig.model_validate_json(f.read())
    env = cdist.init(cfg.train.device, cfg.train.backend, timeout_s=120)
    node = report.node_name()
    bad_network = [f for f in cfg.faults if f.kind == "hang_in_collective" and f.node == node]
    if bad_network:
        while True:  # the emulated bad node: its collectives never complete
            time.sleep(1)
    x = torch.ones(1 << 20, device=env.device)
    for _ in range(args.rounds):
        y = x.clone()
        dist.all_reduce(y)
        if float(y[0]) != env.world_size:
            print(f"campaign.train.drill: all-reduce gave {float(y[0])}, expected {env.world_size}", file=sys.stderr)
            return 1
    cdist.teardown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
