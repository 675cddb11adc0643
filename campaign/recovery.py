"""What a driver that died leaves behind, and how the next one cleans it up.

A driver killed with `kill -9` (or a lost login session) leaves three things: attempts the
ledger still calls open, their trainer processes or scheduler jobs, and its Parsl
interchange and local worker pool. The next `submit`/`resume` of the campaign, holding the
lease, calls `reap_dead_driver` (the Parsl processes) and `recover_orphans` (the attempts:
each is stopped through `stop_orphan` and recorded `orphaned`, a resumable class).

Every kill here is guarded: only on the dead driver's host, only processes that are
provably its own (the interchange's pid and title, workers naming its Parsl directory,
trainer processes whose environment names the attempt's run directory).
"""

from __future__ import annotations

import contextlib

import json
import os
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from campaign import report
from campaign.rundir import DRIVER_FILE, PIDS_FILE, STOP_FILE, TRAINER_CONFIG, launched_nodes
from campaign.lease import process_alive
from campaign.ledger import reads, writes
from campaign.ledger.models import Attempt, Campaign

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from campaign.executors.base import Site
    from campaign.ledger import Ledger



def reap_dead_driver(campaign_dir: Path) -> int:
    """Stop the Parsl interchange and local block processes of a driver that died (kill -9):
    they outlive it. Returns how many processes were killed."""
    try:
        info = json.loads((campaign_dir / DRIVER_FILE).read_text())
    except (OSError, ValueError):
        return 0
    if info.get("host") != socket.gethostname() or info.get("pid") == os.getpid() or process_alive(int(info["pid"])):
        return 0
    victims = set()
    ipid = info.get("interchange_pid")
    if ipid and b"interchange" in _cmdline(int(ipid)):
        victims.add(int(ipid))
    marker = str(info.get("parsl_dir", "")).encode()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and marker and marker in _cmdline(int(proc.name)) and int(proc.name) != os.getpid():
            victims.add(int(proc.name))
    victims |= _group_members(victims, spare={os.getpgid(0), int(info["pid"])})
    for pid in victims:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    _wait_gone(sorted(victims), GONE_WAIT_S)
    return len(victims)


def _group_members(pids: set[int], spare: set[int]) -> set[int]:
    """Every process in the process groups of `pids` (but groups in `spare`): what the block's
    worker pool started without its directory in their command line (multiprocessing's
    resource tracker and Manager, spawned workers) shares its group, which Parsl's local
    provider makes apart from the driver's."""
    groups = set()
    for pid in pids:
        try:
            groups.add(os.getpgid(pid))
        except ProcessLookupError:
            continue
    groups -= spare
    found = set()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if os.getpgid(int(proc.name)) in groups:
                    found.add(int(proc.name))
            except ProcessLookupError:
                continue
    found.discard(os.getpid())
    return found


def recover_orphans(ledger: Ledger, campaign_id: int, site: Site, say: Callable[[str], None]) -> int:
    """Attempts a crashed driver left open: stop their jobs, record them `orphaned` (their
    stage goes back to pending). Returns how many were recovered."""
    count = 0
    for unit in ledger.retrying("recovering orphaned attempts", warn=say):
        with unit as s:
            count = _recover(s, campaign_id, site, say)
    return count


def _recover(s: Session, campaign_id: int, site: Site, say: Callable[[str], None]) -> int:
    c = s.get(Campaign, campaign_id)
    assert c is not None
    count = 0
    for a in reads.list_open_attempts(s, c):
        stopped = stop_orphan(Path(a.run_dir), site)
        adopted = adopt_orphan(s, a)
        writes.finish_attempt(s, a, state="orphaned", exit_code=None, suspects=[],
                              summary={**(a.summary or {}), "recovery": stopped, "adopted": adopted})
        writes.add_event(s, c, "attempt_orphaned", f"stage {a.stage_run.name} attempt {a.number} was left running "
                         f"by a driver that died; {stopped}", stage_run=a.stage_run, attempt=a)
        if a.stage_run.state == "running":
            a.stage_run.state = "pending"
        say(f"recovered stage {a.stage_run.name} attempt {a.number}: {stopped}; adopted {adopted['steps']} "
            f"step(s) to step {a.last_step} and {adopted['checkpoints']} checkpoint(s) it wrote")
        count += 1
    return count


def adopt_orphan(s: Session, a: Attempt) -> dict[str, int]:
    """Take into the ledger what an orphaned attempt's trainer wrote after its driver died:
    every step of its metrics.jsonl (ingestion is idempotent) and its checkpoints, so the
    stage's totals and the relaunch's resume point agree with the disk."""
    run_dir = Path(a.run_dir)
    try:
        run_cfg = json.loads((run_dir / TRAINER_CONFIG).read_text())["run"]
    except (OSError, ValueError, KeyError, TypeError):
        run_cfg = {}
    max_step = run_cfg.get("max_steps") if isinstance(run_cfg, dict) else None
    max_step = max_step if isinstance(max_step, int) and 0 <= max_step < report.STEP_MAX else report.STEP_MAX
    checked = report.read_metrics_checked(run_dir, max_step=max_step)  # the whole file: the bad-row count is exact
    steps = writes.ingest_steps(s, a, checked.rows)
    bad = report.bad_rows_summary(checked, run_dir)
    if bad is not None:
        writes.record_bad_metric_rows(s, a, bad, first=not (a.summary or {}).get("bad_metric_rows"))
    try:
        ckpt_dir = Path(run_cfg["checkpoint_dir"])
    except (KeyError, TypeError):
        return {"steps": steps, "checkpoints": 0}
    checkpoints = report.list_checkpoints(ckpt_dir) if ckpt_dir.is_dir() else []
    for ck in checkpoints:
        writes.record_checkpoint(s, a.stage_run, a, step=ck["step"], tokens=ck.get("tokens") or 0, path=str(ck["path"]),
                                 complete=bool(ck["complete"]))
    return {"steps": steps, "checkpoints": len(checkpoints)}


def stop_orphan(run_dir: Path, site: Site) -> str:
    """Stop the launch of an attempt whose driver died. Returns what was done, for the record."""
    with contextlib.suppress(OSError):  # a full disk: the process groups below are killed all the same
        (run_dir / STOP_FILE).touch()  # a supervisor that still lives stops its launch
    try:
        pids = json.loads((run_dir / PIDS_FILE).read_text())
    except (OSError, ValueError):
        return "no launch had started"
    if pids.get("block_job_id"):
        site.cancel_jobs([pids["block_job_id"]])
        return f"cancelled scheduler job {pids['block_job_id']} through the provider"
    if pids.get("host") != socket.gethostname():
        return f"the launch ran on {pids.get('host')}; STOP file written for its supervisor"
    killed = [pgid for pgid in pids.get("pgids", []) if _kill_group(pgid, run_dir)]
    _remove_node_local(run_dir, str(pids.get("attempt", "")))
    return f"killed {len(killed)} process group(s)" if killed else "its processes had already exited"


def _remove_node_local(run_dir: Path, attempt: str) -> None:
    """What the killed ranks left on this host's node-local storage (/dev/shm/campaign-*):
    a clean exit or the supervisor removes it, a killed supervisor cannot."""
    for node in launched_nodes(run_dir):
        report.remove_node_local(run_dir, node, attempt)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _kill_group(pgid: int, run_dir: Path) -> bool:
    """SIGKILL process group `pgid` if its members are this attempt's (checked by environment)."""
    members = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if os.getpgid(int(proc.name)) != pgid:
                continue
            env = (proc / "environ").read_bytes()
        except (OSError, ProcessLookupError):
            continue
        if f"CAMPAIGN_RUN_DIR={run_dir}".encode() in env:
            members.append(int(proc.name))
    if not members:
        return False
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    _wait_gone(members, GONE_WAIT_S)
    return True


GONE_WAIT_S = 10.0
"""How long `_kill_group` waits for SIGKILLed processes to be gone (a relaunch must not start
while one still writes into the checkpoint folder)."""


def _wait_gone(pids: list[int], timeout: float) -> None:
    """Wait until none of `pids` runs (a zombie counts as gone: it writes nothing)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        alive = []
        for pid in pids:
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if state not in ("Z", "X"):
                alive.append(pid)
        if not alive:
            return
        time.sleep(0.05)
