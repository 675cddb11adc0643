"""Start Parsl's interchange for the driver: `python -m campaign.executors.parsl_interchange
PATH/interchange.py` (the executor's `interchange_launch_cmd`, see `base.interchange_command`).

Three things Parsl does not do by itself:
- a process group of its own, so a Ctrl-C or SIGHUP sent to the terminal's process group
  reaches the driver (which stops the attempt and records it), not the interchange;
- it exits when the driver that started it is gone (kill -9, a lost session): otherwise it
  and the block's worker pool, which exits once its interchange stops answering, would hold
  the allocation until the block's walltime. A trainer keeps running (its supervisor dies
  with the worker); the next `campaign resume` adopts what it wrote;
- its log lives in the campaign's folder and its stderr is the driver's terminal: on a full
  disk every log line would print logging's "--- Logging error ---" traceback there, in the
  middle of the driver's one-line explanation. Lines that cannot be written are dropped, as
  the driver drops its own (block.Block._load); a child process does not inherit that.
"""

from __future__ import annotations

import logging
import os
import runpy
import sys
import threading
import time

PARENT_CHECK_S = 2.0
"""How often the interchange checks that its driver still lives."""


def _exit_when_orphaned(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(PARENT_CHECK_S)
    os._exit(0)  # the driver is gone: nobody will read our results


def main() -> None:
    os.setpgrp()
    logging.raiseExceptions = False  # a full disk drops log lines instead of printing tracebacks
    threading.Thread(target=_exit_when_orphaned, args=(os.getppid(),), name="driver-watch", daemon=True).start()
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
