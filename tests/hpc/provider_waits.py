"""Waiting helpers shared by the provider tests (Slurm cluster and PBS emulator)."""

from __future__ import annotations

import time


def wait_status(provider, job_id, want, timeout=60.0, poll=0.2):
    """Poll `provider.status` until the job reaches one of `want`; return the states seen."""
    deadline = time.monotonic() + timeout
    seen = []
    while True:
        state = provider.status([job_id])[0].state
        if not seen or seen[-1] != state:
            seen.append(state)
        if state in want:
            return seen
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id}: states {seen}, wanted one of {want} within {timeout}s")
        time.sleep(poll)


def pid_gone(pid: int, timeout: float = 20.0) -> bool:
    """Whether process `pid` is gone (or a zombie) within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/status") as f:
                if any(line.startswith("State:") and line.split()[1] in ("Z", "X") for line in f):
                    return True
        except (FileNotFoundError, ProcessLookupError):  # gone before the open, or during the read (ESRCH)
            return True
        time.sleep(0.2)
    return False
