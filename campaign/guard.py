"""The launch guard: an attempt's STOP file stops its launch even when no supervisor reads it.

    python -m campaign.guard RUN_DIR PGID [PGID ...]

The supervisor starts one guard per launch, right after the launch's process groups, in a
session of its own: a Parsl block's scale-in (a displaced driver unloading Parsl), a lost
worker or a dead driver end the supervisor, not the guard, and the ranks train on. Every
`POLL_S` the guard looks at `RUN_DIR/STOP` (written by `campaign cancel`, by a driver that
took the campaign's lease over, by one that recovers a dead driver's attempts). Once it is
there, the guard SIGTERMs every process group of the launch, SIGKILLs what is left after
`TERM_GRACE_S`, waits until the launch's processes are gone (a warm-start child, which its
fork server runs in a session of its own, is found by its working directory, the run
directory) and writes `RUN_DIR/launch-gone.json` (`rundir.LAUNCH_GONE`). It writes that
file too, and exits, when the launch ended by itself (the trainer finished, or the
supervisor stopped it). A driver that cannot reach the launch's host reads that file as the
proof that the old launch no longer trains (`campaign.recovery.stop_orphan`); until it
appears that driver relaunches nothing.

A group the guard once found empty is never signalled again (its number may be reused).
Stdlib only: it starts in a few tens of milliseconds and holds no lock, no device, no ledger.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from campaign.rundir import LAUNCH_GONE, LOGS_DIR, STOP_FILE

POLL_S = 0.25
"""How often the guard looks for the STOP file and for the launch's groups."""
TERM_GRACE_S = 5.0
"""Between SIGTERM and SIGKILL (the supervisor's own grace: a trainer may checkpoint on SIGTERM)."""
GONE_WAIT_S = 30.0
"""After SIGKILL, how long the guard waits for the launch's processes to be gone before it
gives up (and writes no proof: the new driver then refuses to relaunch)."""


def start(run_dir: Path, pgids: list[int]) -> subprocess.Popen[bytes] | None:
    """Start the guard of a launch whose process groups are `pgids` (the supervisor calls it).
    None when it cannot start (no process left, a full disk for its log): the supervisor still
    honours STOP while it lives, and a driver that finds no proof waits, then says so."""
    try:
        log: Any = open(run_dir / LOGS_DIR / "guard.log", "ab")
    except OSError:
        log = subprocess.DEVNULL
    try:
        return subprocess.Popen([sys.executable, "-m", "campaign.guard", str(run_dir), *map(str, pgids)],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd="/",
                                start_new_session=True)
    except OSError as e:
        print(f"campaign.guard: cannot start the guard of {run_dir}: {e}", file=sys.stderr)
        return None
    finally:
        if log is not subprocess.DEVNULL:
            log.close()


def group_alive(pgid: int) -> bool:
    """Whether process group `pgid` has a member (a zombie counts until it is reaped)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def working_in(run_dir: Path) -> list[int]:
    """Live processes (zombies excluded) whose working directory is `run_dir`: every rank of
    a launch works there, a warm-start child too (its environment is its server's)."""
    wanted = {str(run_dir), f"{run_dir} (deleted)"}
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if os.readlink(proc / "cwd") not in wanted:
                continue
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in ("Z", "X"):
            found.append(int(proc.name))
    return found


def _signal(groups: set[int], sig: int) -> None:
    for pgid in list(groups):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            groups.discard(pgid)


def _prune(groups: set[int], *, zombies_gone: bool = False) -> None:
    """Drop the groups that have no member left (`zombies_gone`: none but zombies, which run no
    code; their parent, maybe a dead supervisor's, reaps them when it can)."""
    for pgid in list(groups):
        if not group_alive(pgid) or (zombies_gone and not _live_members(pgid)):
            groups.discard(pgid)


def _live_members(pgid: int) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            found.append(int(proc.name))
    return found


def _write_gone(run_dir: Path, how: str, pgids: list[int], started: float) -> None:
    doc = {"host": socket.gethostname(), "pgids": pgids, "how": how, "time": time.time(),
           "guarded_s": round(time.time() - started, 3)}
    tmp = run_dir / f".{LAUNCH_GONE}.{os.getpid()}"
    try:
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, run_dir / LAUNCH_GONE)
    except OSError as e:  # the run directory deleted or full: the new driver waits, then says so
        print(f"campaign.guard: cannot write {run_dir / LAUNCH_GONE}: {e}", file=sys.stderr)


def guard(run_dir: Path, pgids: list[int]) -> str:
    """Watch the launch until it ends or STOP stops it; returns how it ended ("stopped" or "exited")."""
    started = time.time()
    groups = set(pgids)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a group signal meant for the launch is not for the guard
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    while True:
        _prune(groups)
        if (run_dir / STOP_FILE).exists():
            how = "stopped"
            break
        if not groups:
            how = "exited"
            break
        time.sleep(POLL_S)
    if groups:
        _signal(groups, signal.SIGTERM)
        end = time.monotonic() + TERM_GRACE_S
        while groups and time.monotonic() < end:
            time.sleep(0.05)
            _prune(groups, zombies_gone=True)
        _signal(groups, signal.SIGKILL)
    end = time.monotonic() + GONE_WAIT_S
    while (groups or working_in(run_dir)) and time.monotonic() < end:
        time.sleep(0.05)
        _prune(groups, zombies_gone=True)
    left = sorted(groups) + working_in(run_dir)
    if left:
        print(f"campaign.guard: processes of the launch still run after SIGKILL: {left}", file=sys.stderr)
        return "left"
    _write_gone(run_dir, how, pgids, started)
    return how


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 2:
        print("usage: python -m campaign.guard RUN_DIR PGID [PGID ...]", file=sys.stderr)
        return 2
    return 0 if guard(Path(args[0]), [int(a) for a in args[1:]]) != "left" else 1


if __name__ == "__main__":
    sys.exit(main())
