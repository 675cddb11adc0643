"""Deliberate faults for tests and drills (`TrainerConfig.faults`; needs CAMPAIGN_ALLOW_FAULTS=1).

- hang               block forever at the start of step S, outside collectives
                     (heartbeat: phase "compute" at S while the peers wait in "collective")
- hang_in_collective mark phase "collective" at S and never return
- crash              exit with `exit_code` at the start of step S
- slow               from step S on, sleep (factor - 1) x the previous step's time at the
                     start of every step: a straggler (or `delay_s` seconds, when given)
- sigkill            SIGKILL itself at the start of step S
- data_off_by_one    after a resume from a checkpoint of step >= S, shift the data by one
                     sample (so a resume test can be shown to catch it)
- nonfinite          the rank's loss at step S becomes NaN (exercises exit 94)
- sigkill_in_checkpoint  SIGKILL itself when its shards of the checkpoint of step S start
                     being written (with async checkpoints: in the background, after
                     training went on), so that checkpoint never becomes complete
- sigkill_in_rescue  SIGKILL itself when, as the rescuer, it starts writing a rescue
                     checkpoint of step S or later (a rescuer dying mid-save)

Hangs poll the SIGTERM flag and exit 143 when it is set; SIGKILL always works.
"""

from __future__ import annotations

import collections
import os
import signal
import statistics
import sys
import time
from collections.abc import Callable

from campaign import report


def check_allowed(faults: list, env: dict[str, str] | None = None) -> None:
    """Exit 93 when faults are configured but CAMPAIGN_ALLOW_FAULTS is not 1."""
    env = os.environ if env is None else env
    if faults and env.get("CAMPAIGN_ALLOW_FAULTS") != "1":
        print("campaign.train: faults configured but CAMPAIGN_ALLOW_FAULTS is not set",
              file=sys.stderr, flush=True)
        sys.exit(report.EXIT_BAD_CONFIG)


class Faults:
    """The faults that target this rank in this attempt."""

    def __init__(self, faults: list, *, rank: int, node: str, attempt: int,
                 should_stop: Callable[[], bool]) -> None:
        self.mine = [f for f in faults
                     if (f.rank == rank or (f.rank is None and f.node == node)
                         or (f.rank is None and f.node is None))
                     and (f.attempt is None or f.attempt == attempt)]
        self.should_stop = should_stop
        self._slow_base: float | None = None
        self._before: collections.deque[float] | None = (
            collections.deque(maxlen=16) if any(f.kind == "slow" for f in self.mine) else None)
        """Step times before a `slow` fault: its factor applies to their median."""

    def _at(self, kind: str, step: int):
        return next((f for f in self.mine if f.kind == kind and f.step == step), None)

    def _block_forever(self) -> None:
        while True:
            time.sleep(0.05)
            if self.should_stop():
                os._exit(report.EXIT_SIGTERM)

    def step_start(self, step: int, rep: report.Reporter) -> None:
        """Called in phase "compute" at the start of a step."""
        if (f := self._at("crash", step)) is not None:
            print(f"campaign.train: fault crash at step {step}", file=sys.stderr, flush=True)
            os._exit(f.exit_code)
        if self._at("sigkill", step) is not None:
            os.kill(os.getpid(), signal.SIGKILL)
        if self._at("hang", step) is not None:
            rep.phase("compute", step)
            self._block_forever()

    def before_collective(self, step: int, rep: report.Reporter) -> None:
        if self._at("hang_in_collective", step) is not None:
            rep.phase("collective", step)
            self._block_forever()

    def slow(self, step: int, last_step_s: float) -> None:
        f = next((f for f in self.mine if f.kind == "slow" and step >= f.step), None)
        if f is None:
            if self._before is not None and last_step_s > 0:
                self._before.append(last_step_s)
        elif f.delay_s is not None:
            time.sleep(f.delay_s)
        else:
            # The normal step time, taken once (later steps include the slow-down itself), as
            # the median of the steps before: one step of a few ms is too noisy a base.
            if self._slow_base is None:
                self._slow_base = statistics.median(self._before) if self._before else last_step_s
            time.sleep((f.factor - 1.0) * self._slow_base)

    def in_checkpoint(self, step: int) -> None:
        """Called by the thread that writes this rank's shards of the checkpoint of `step`."""
        if self._at("sigkill_in_checkpoint", step) is not None:
            print(f"campaign.train: fault sigkill_in_checkpoint at step {step}", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    def in_rescue(self, step: int) -> None:
        """Called by the rescuer as it starts writing its rescue checkpoint of `step`."""
        if any(f.kind == "sigkill_in_rescue" and step >= f.step for f in self.mine):
            print(f"campaign.train: fault sigkill_in_rescue at step {step}", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    def nonfinite(self, step: int) -> bool:
        return self._at("nonfinite", step) is not None

    def data_shift(self, loaded_step: int) -> int:
        """Samples to shift the data position by after resuming from `loaded_step`."""
        return int(any(f.kind == "data_off_by_one" and loaded_step >= f.step for f in self.mine))
