"""Start-up marks: when each phase of a rank's start finished, on the wall clock and the
monotonic clock, so a relaunch's cost can be broken down (benchmarks/gpu_relaunch.py).

Stdlib only (it is imported before torch, to time torch's import). Rank 0 writes them once,
after its first step, as the event `startup` in events.jsonl::

    {"event": "startup", "step": S, "time": ..., "marks": {"process": wall, "main": wall, ...},
     "mono": {"main": mono, ...}, "warm": bool, "compile_cache": "..."}

Phases, in order (each mark is when that phase ENDED; `process` is when the process began):
  process         the process was created (a cold start: exec of the interpreter; a warm
                  start: the fork server's fork), from /proc/self/stat; absent where unreadable
  main            `campaign.train.__main__` began (interpreter and stdlib start, or the fork's
                  adoption of the client's streams and environment)
  imports         torch and the trainer's modules imported (a warm start finds them imported)
  process_group   `init_process_group` returned (device set; NCCL's communicator on CUDA)
  startup_check   the all-gather and all-reduce of startup.json (the first collectives)
  model_built     the model built on the device, wrapped (compile is lazy: not yet compiled),
                  the optimizer made
  checkpoint_loaded  the newest complete checkpoint loaded (= model_built for a fresh start)
  first_step      the attempt's first step finished (its results read): torch.compile's
                  first compilation happens inside it
"""

from __future__ import annotations

import os
import time
from typing import Any

PHASES = ("process", "main", "imports", "process_group", "startup_check", "model_built", "checkpoint_loaded",
          "first_step")
EVENT = "startup"


def process_start_wall(pid: int | str = "self") -> float | None:
    """When process `pid` was created, as a unix time (10 ms resolution: clock ticks), from
    /proc/PID/stat's start time (ticks since boot) and CLOCK_BOOTTIME; None off Linux."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
        fields = stat[stat.rindex(")") + 2:].split()
        start_ticks = int(fields[19])  # field 22 of stat(5), the 20th after the name
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return time.time() - age


class Marks:
    """The marks of one rank's start, in the order they were made."""

    def __init__(self) -> None:
        self.wall: dict[str, float] = {}
        self.mono: dict[str, float] = {}
        start = process_start_wall()
        if start is not None:
            self.wall["process"] = start

    def mark(self, phase: str) -> None:
        """Phase `phase` ends now (the first mark of a phase counts)."""
        if phase not in PHASES:
            raise ValueError(f"unknown start-up phase {phase!r}; known: {', '.join(PHASES)}")
        if phase not in self.wall:
            self.wall[phase] = time.time()
            self.mono[phase] = time.monotonic()

    def document(self, **extra: Any) -> dict[str, Any]:
        """The `startup` event's fields (without event, step and time)."""
        return {"marks": dict(self.wall), "mono": dict(self.mono), **extra}


def durations(marks: dict[str, float]) -> dict[str, float]:
    """Seconds spent in each phase: from the previous mark present to this one (phases whose
    mark is missing are skipped, their time falls into the next present one)."""
    out: dict[str, float] = {}
    prev: float | None = None
    for phase in PHASES:
        t = marks.get(phase)
        if t is None:
            continue
        if prev is not None:
            out[phase] = t - prev
        prev = t
    return out
