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

from campaign import report, rundir, runfiles
from campaign.errors import CampaignConflict
from campaign.exits import ExitClass
from campaign.guard import working_in
from campaign.lease import process_alive
from campaign.stagebase import Targets
from campaign.rundir import (DRIVER_FILE, EVENTS_FILE, HEARTBEAT_DIR, LAUNCH_GONE, LOGS_DIR, METRICS_FILE, PIDS_FILE,
                             STOP_FILE, SUPERVISOR_REPORT, TRAINER_CONFIG, launched_nodes)
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


def recover_orphans(ledger: Ledger, campaign_id: int, site: Site, say: Callable[[str], None], *,
                    state: str = ExitClass.ORPHANED, why: str = "was left running by a driver that died") -> int:
    """Attempts a dead or displaced driver left open: stop their launches (`stop_orphan`, which
    returns only once each is gone), take in what they wrote (`adopt_orphan`), record them
    `state` (`orphaned`, a resumable class: their stage goes back to pending; `campaign cancel`
    records `cancelled`). Returns how many were recovered. An attempt whose launch may still
    train elsewhere raises LaunchStillRunning and stays open: the next `resume` looks again."""
    for unit in ledger.retrying("listing open attempts", warn=say):
        with unit as s:
            c = s.get(Campaign, campaign_id)
            assert c is not None
            open_ = [(a.id, a.run_dir) for a in reads.list_open_attempts(s, c)]
    for attempt_id, run_dir in open_:
        stopped = stop_orphan(Path(run_dir), site)  # outside a transaction: it may wait for the launch's guard
        for unit in ledger.retrying("recovering an open attempt", warn=say):
            with unit as s:
                line = _record_recovered(s, attempt_id, stopped, state, why)
        say(line)
    return len(open_)


def _record_recovered(s: Session, attempt_id: int, stopped: str, state: str, why: str) -> str:
    a = s.get(Attempt, attempt_id)
    assert a is not None
    c = a.stage_run.campaign
    adopted = adopt_orphan(s, a)
    writes.finish_attempt(s, a, state=state, exit_code=None, suspects=[],
                          summary={**(a.summary or {}), "recovery": stopped, "adopted": adopted})
    writes.add_event(s, c, f"attempt_{state}", f"stage {a.stage_run.name} attempt {a.number} {why}; {stopped}",
                     stage_run=a.stage_run, attempt=a)
    if a.stage_run.state == "running":
        a.stage_run.state = "pending"
    return (f"recovered stage {a.stage_run.name} attempt {a.number}: {stopped}; adopted {adopted['steps']} "
            f"step(s) to step {a.last_step} and {adopted['checkpoints']} checkpoint(s) it wrote")


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
    max_step = max_step if isinstance(max_step, int) and 0 <= max_step < runfiles.STEP_MAX else runfiles.STEP_MAX
    checked = runfiles.read_metrics_checked(run_dir, max_step=max_step)  # the whole file: the bad-row count is exact
    steps = writes.ingest_steps(s, a, checked.rows)
    bad = runfiles.bad_rows_summary(checked, run_dir)
    if bad is not None:
        writes.record_bad_metric_rows(s, a, bad, first=not (a.summary or {}).get("bad_metric_rows"))
    try:
        ckpt_dir = Path(run_cfg["checkpoint_dir"])
    except (KeyError, TypeError):  # trainer.json went with a deleted run directory: the stage's default folder
        ckpt_dir = run_dir.parent / Targets.checkpoints
    checkpoints = report.list_checkpoints(ckpt_dir) if ckpt_dir.is_dir() else []
    for ck in checkpoints:
        writes.record_checkpoint(s, a.stage_run, a, step=ck["step"], tokens=ck.get("tokens") or 0, path=str(ck["path"]),
                                 complete=bool(ck["complete"]))
    return {"steps": steps, "checkpoints": len(checkpoints)}


CONFIRM_S = 30.0
"""How long a driver waits for proof that a launch it cannot kill itself (on another host) is
gone: its guard's `launch-gone.json` or its supervisor's report. The guard stops a launch within
`guard.TERM_GRACE_S` (5 s) of the STOP file, plus a poll."""
SILENT_S = 30.0
"""Without that proof: a launch whose files (heartbeats, metrics, events, logs) did not change
for this long (every rank of the contract beats each second) is taken for gone, and said so."""


STARTING_S = 2.0
"""A pids.json of this host still `starting` this long after the STOP file: its supervisor,
which records the launch's groups right after starting it, is gone."""


class LaunchStillRunning(CampaignConflict):
    """An earlier launch of the stage may still train, on a host this driver cannot reach, and
    nothing says it stopped: relaunching would put two launches in one checkpoint folder."""


def stop_orphan(run_dir: Path, site: Site, *, confirm_s: float | None = None) -> str:
    """Stop the launch of an attempt whose supervisor no longer answers for it (its driver died
    or was displaced, its worker was lost) and return, what was done in words, only once that
    launch is gone: killed here (process groups checked by their environment), stopped by its
    guard (`campaign.guard`, which honours the STOP file written first), ended by itself, or
    cancelled with its scheduler job. Raises LaunchStillRunning, naming the host and process
    groups, when the launch ran on a host this driver cannot reach and neither its guard nor
    its supervisor says it stopped within `confirm_s` while its files still change."""
    confirm_s = CONFIRM_S if confirm_s is None else confirm_s
    existed = run_dir.is_dir()
    if existed or run_dir.parent.parent.is_dir():  # deleted under the attempt: ours to make again, in its campaign's folder
        with contextlib.suppress(OSError):  # a full disk: the process groups below are killed all the same
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / STOP_FILE).touch()  # a supervisor or guard that still lives stops the launch
    here = socket.gethostname()
    start = last_change = time.monotonic()
    seen = _activity(run_dir)
    if not existed:
        return _stop_unrecorded(run_dir, site, confirm_s)
    while True:
        pids = rundir.read_json(run_dir / PIDS_FILE)
        if pids is None:  # the supervisor writes it before it looks for STOP: no launch will start
            return "no launch had started"
        if pids.get("block_job_id"):
            site.cancel_jobs([pids["block_job_id"]])
            return f"cancelled scheduler job {pids['block_job_id']} through the provider"
        pgids = [int(p) for p in pids.get("pgids") or []]
        gone = _gone_proof(run_dir, pgids)
        if gone is not None:
            _remove_node_local(run_dir, str(pids.get("attempt", "")))
            return gone
        now = time.monotonic()
        if pids.get("host") == here and pgids:
            killed = [pgid for pgid in pgids if _kill_group(pgid, run_dir)]
            _wait_gone(working_in(run_dir), GONE_WAIT_S)  # warm-start children: their server ends them
            _remove_node_local(run_dir, str(pids.get("attempt", "")))
            return f"killed {len(killed)} process group(s)" if killed else "its processes had already exited"
        if pids.get("host") == here and now - start > STARTING_S:  # its supervisor died as it launched
            found = _kill_by_run_dir(run_dir)
            _remove_node_local(run_dir, str(pids.get("attempt", "")))
            return f"its supervisor died as it launched; killed {len(found)} process(es) of the launch"
        if (current := _activity(run_dir)) != seen:
            seen, last_change = current, now
        if now - last_change >= min(SILENT_S, confirm_s) and now - start >= confirm_s:
            return (f"the launch on {pids.get('host')} (process groups {pgids}) did not confirm it stopped, but "
                    f"wrote nothing for {now - last_change:.0f} s after the STOP file: taken for gone")
        if now - start >= confirm_s:
            where = pids.get("host") or "an unknown host"
            raise LaunchStillRunning(
                f"the launch of {run_dir} may still train on {where} (process groups "
                f"{', '.join(map(str, pgids)) or 'not recorded yet'}): its files still change {confirm_s:.0f} s after "
                f"the STOP file and nothing there confirmed it stopped; stop them on {where} (`kill -9 -- "
                f"{' '.join(f'-{g}' for g in pgids) or '-PGID'}`), then run the same command again: nothing was "
                "relaunched")
        time.sleep(0.25)


def _stop_unrecorded(run_dir: Path, site: Site, confirm_s: float) -> str:
    """The run directory was deleted, pids.json with it: stop the launch's processes on this
    host, found by their run directory (environment or working directory); on a batch site,
    whose launch may run on another node, wait for its guard's word (it reads STOP at the
    same path, made again here)."""
    found = _kill_by_run_dir(run_dir)
    what = f"its run directory was gone (made again); killed {len(found)} process(es) of its launch here" if found \
        else "its run directory was gone (made again); no process of its launch runs on this host"
    if found or site.node_names() is not None:  # the local site: every node is this host
        return what
    end = time.monotonic() + confirm_s
    while time.monotonic() < end:
        gone = rundir.read_json(run_dir / LAUNCH_GONE)
        if gone is not None:
            return f"{what}; its guard on {gone.get('host')} stopped it"
        time.sleep(0.25)
    return f"{what}; none answered from another node within {confirm_s:.0f} s"


def _kill_by_run_dir(run_dir: Path) -> list[int]:
    """SIGKILL the process groups of this host's processes of `run_dir`'s launch and wait until
    they are gone; the processes found."""
    found = _processes_of(run_dir)
    groups = set()
    for pid in found:
        try:
            groups.add(os.getpgid(pid))
        except ProcessLookupError:
            continue
    groups.discard(os.getpgid(0))
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    _wait_gone(found, GONE_WAIT_S)
    return found


def _processes_of(run_dir: Path) -> list[int]:
    """Live processes of this host whose environment names `run_dir` or that work in it."""
    tag = f"CAMPAIGN_RUN_DIR={run_dir}\0".encode()
    found = set(working_in(run_dir))
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:
                if tag in (proc / "environ").read_bytes() + b"\0":
                    found.add(int(proc.name))
            except OSError:
                continue
    return sorted(found)



def _gone_proof(run_dir: Path, pgids: list[int]) -> str | None:
    """Why this launch (the process groups `pgids` of pids.json) is known to be gone, or None:
    its guard said so, or its supervisor wrote its report after the launch started (the
    report of an earlier supervisor of the same run directory does not count)."""
    gone = rundir.read_json(run_dir / LAUNCH_GONE)
    if gone is not None and pgids and sorted(gone.get("pgids") or []) == sorted(pgids):
        how = "stopped by its guard after the STOP file" if gone.get("how") == "stopped" else "it had ended"
        return f"{how} on {gone.get('host')}"
    try:
        if (run_dir / SUPERVISOR_REPORT).stat().st_mtime_ns >= (run_dir / PIDS_FILE).stat().st_mtime_ns:
            return "its supervisor had stopped it"
    except OSError:
        pass
    return None


def _activity(run_dir: Path) -> tuple[tuple[str, int, int], ...]:
    """What a live launch changes: the size and time of its metrics, events, heartbeats and logs."""
    files = [run_dir / METRICS_FILE, run_dir / EVENTS_FILE, *(run_dir / HEARTBEAT_DIR).glob("*"),
             *(run_dir / LOGS_DIR).glob("*.log")]
    out = []
    for f in files:
        try:
            st = f.stat()
        except OSError:
            continue
        out.append((f.name, st.st_size, st.st_mtime_ns))
    return tuple(sorted(out))


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
