"""Entry: `python -m campaign.train --config FILE` (or under torchrun / mpiexec / srun).

Parse the config, initialise the process group, train, tear down. Each phase of the start is
marked (campaign.train.marks): rank 0 writes the marks as the `startup` event after its first step. Exit codes follow the
trainer contract (campaign.report): 127 if torch or the trainer cannot be imported, 93 for
a bad config or a rank that cannot be placed on a device, 0 / 143 / 94 from the loop.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback

from campaign import report
from campaign.errors import DataError
from campaign.train import compile_cache
from campaign.train.marks import Marks


def _load_config(path: str):
    from pydantic import ValidationError

    from campaign.train import tokenfile
    from campaign.train.config import TrainerConfig

    try:
        with open(path) as f:
            cfg = TrainerConfig.model_validate_json(f.read())
        return tokenfile.resolve(cfg)  # the token file and its sidecar agree with the config, before any rank waits
    except (OSError, ValidationError) as exc:
        print(f"campaign.train: bad config {path}: {exc}", file=sys.stderr, flush=True)
    except DataError as exc:
        print(f"campaign.train: bad data: {exc}", file=sys.stderr, flush=True)
    sys.exit(report.EXIT_BAD_CONFIG)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m campaign.train", description=__doc__)
    parser.add_argument("--config", required=True, help="TrainerConfig JSON file")
    args = parser.parse_args(argv)
    marks = Marks()  # when each start-up phase ended (the `startup` event, after the first step)
    marks.mark("main")
    warm = "torch" in sys.modules  # started from the fork server, which imported it
    try:
        import pydantic  # noqa: F401

        from campaign.train import dist, faults, loop, signals
    except ImportError as exc:  # torch missing or broken: systemic, not this node's fault
        print(f"campaign.train: broken environment: {exc!r}", file=sys.stderr, flush=True)
        return report.EXIT_BROKEN_ENV
    marks.mark("imports")
    cfg = _load_config(args.config)
    faults.check_allowed(cfg.faults)
    stop = signals.StopFlag().install()
    from campaign.train.placement import PlacementError

    try:
        env = dist.init(cfg.train.device, cfg.train.backend)
    except PlacementError as exc:  # the launch itself is wrong (binding, rank variables): do not retry
        print(f"campaign.train: cannot place this rank: {exc}", file=sys.stderr, flush=True)
        return report.EXIT_BAD_CONFIG
    marks.mark("process_group")
    if cfg.train.precision == "float8":
        from campaign.train import float8

        reason = float8.unsupported(env.device)
        if reason is not None:  # the same on every relaunch: a configuration error
            print(f"campaign.train: {reason}", file=sys.stderr, flush=True)
            return report.EXIT_BAD_CONFIG
    cache = compile_cache.configure(cfg.run.compile_cache_dir, env.rank) if cfg.train.compile else None
    rep = report.Reporter.from_env(rank=env.rank, local_rank=env.local_rank,
                                   world_size=env.world_size)
    os.makedirs(cfg.run.checkpoint_dir, exist_ok=True)
    rep.startup(dist.startup_check(env))
    marks.mark("startup_check")
    try:
        code = loop.train(cfg, env, rep, stop, marks=marks, start={"warm": warm, "compile_cache": cache})
    except DataError as exc:  # a token id past the model's vocabulary: the same on every relaunch
        print(f"campaign.train: bad data: {exc}", file=sys.stderr, flush=True)
        return report.EXIT_BAD_CONFIG
    except Exception:
        if not stop.requested:
            raise
        # SIGTERM arrived and a peer went away first (its collective failed): still 143.
        traceback.print_exc()
        os._exit(report.EXIT_SIGTERM)
    rep.close()
    dist.teardown()
    return code


if __name__ == "__main__":
    sys.exit(main())
