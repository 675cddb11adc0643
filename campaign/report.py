"""The trainer contract's writers, in one dependency-free module (stdlib only; no torch): what
a trainer imports to write its part of an attempt's run directory.

Writers, for a trainer (the built-in one, or your own script in three lines)::

    from campaign import report
    rep = report.Reporter.from_env(rank=rank, local_rank=local_rank, world_size=world)
    for step in ...:
        rep.phase("compute", step)          # before forward/backward
        rep.phase("collective", step)       # before the gradient all-reduce
        rep.step(step=step, tokens=tokens, loss=loss, step_time_s=dt)
    rep.close()                             # phase "done"

Helpers, for your own script (stdlib only): `run_config()` (what this attempt must do),
`startup_check(...)` from your own all-gather / all-reduce, `begin_checkpoint` /
`complete_checkpoint` (meta.json, then `.complete`), `latest_complete_checkpoint()` and
`list_checkpoints` (what to resume from), `check_checkpoint_files` (before a load).

The driver reads these files with `campaign.runfiles` (`read_metrics`, `read_events`,
`read_heartbeats`, `read_startup`, ...); the keys of their rows are named once in
`campaign.fields`, their file names in `campaign.rundir`.

Files in the attempt's run directory (`CAMPAIGN_RUN_DIR`):

- `metrics.jsonl`  rank 0, one JSON object per logged optimizer step.
- `events.jsonl`   rank 0, {"event", "step", "time", ...}.
- `startup.json`   rank 0, once after init (world size, every rank, all-reduce check).
- `heartbeats/group-GGGGG.slots`  the node heartbeats, HEARTBEAT_GROUP nodes per file: node i
  of the hostfile owns the SLOT_BYTES-byte slot (i % HEARTBEAT_GROUP) of group i // HEARTBEAT_GROUP
  and its local rank 0 overwrites that slot in place every heartbeat interval (one pwrite to a
  file it keeps open: no create, rename or close per beat, so no metadata-server operation on
  a shared filesystem; docs/performance.md, "Supervisor and heartbeats at Aurora size";
  the slot's format: `campaign.heartbeatslot`).
  A node missing from the hostfile (or a trainer run without one) falls back to
  `heartbeats/<node>.json`, rewritten atomically (tmp + rename) every interval.
  `runfiles.read_heartbeats` reads both layouts into the same {node: document}. Every rank's own daemon thread
  writes its state to a small file on node-local storage (/dev/shm, else the temp dir);
  local rank 0's thread folds them into the node's file. A rank's `time` is refreshed by
  its thread while the process lives, so a SIGSTOPped process goes stale; `phase`, `step`
  and `since` change only when the training loop says so, so a rank hung outside a
  collective stays in "compute" at step S while its peers wait in "collective" at S.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
import zlib
from pathlib import Path
from typing import Any

from campaign.fields import COMPUTE_S, EVENT, LOSS, NODE, PHASE, RANKS, SINCE, STEP, STEP_TIME_S, TIME, TOKENS
from campaign.heartbeatslot import encode_heartbeat_slot, heartbeat_group_file, heartbeat_slot_offset
from campaign.heartbeatslot import HEARTBEAT_GROUP, SLOT_BYTES, decode_heartbeat_slot  # noqa: F401 (report.X, as before)
from campaign.rundir import EVENTS_FILE, HEARTBEAT_DIR, METRICS_FILE, STARTUP_FILE  # the contract's files, named in rundir

# Exit codes of the trainer contract (docs/trainer-contract.md).
EXIT_OK = 0
"""Done: the attempt reached its target."""
EXIT_BAD_CONFIG = 93
"""Bad configuration: do not retry."""
EXIT_NONFINITE = 94
"""The loss became NaN/inf: stopped instead of training on."""
EXIT_WATCHDOG = 124
"""Killed by the supervisor's watchdog (a stall)."""
EXIT_BROKEN_ENV = 127
"""Broken environment (e.g. torch fails to import): systemic, never blame a node."""
EXIT_SIGKILL = 137
"""SIGKILL or out of memory."""
EXIT_SIGTERM = 143
"""SIGTERM (walltime, cancel) or the deadline: resumable from the last checkpoint."""

PHASES = ("init", "compute", "collective", "checkpoint", "done")
EVENTS = ("start", "checkpoint_loaded", "checkpoint_saved", "done", "nonfinite_loss", "deadline")

COMPLETE_MARKER = ".complete"
META_FILE = "meta.json"


def checkpoint_name(step: int) -> str:
    """Directory name of the checkpoint of `step`: `step-NNNNNNNN`."""
    return f"step-{step:08d}"


def write_json_atomic(path: str | os.PathLike[str], obj: Any) -> None:
    """Write `obj` as JSON to `path` through a temporary file and os.replace."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps(obj))
    os.replace(tmp, path)


def heartbeat_slot(hostfile: str | os.PathLike[str] | None, node: str) -> tuple[int, str] | None:
    """(index, name as the hostfile spells it) of `node` in the hostfile, or None.

    Matches the exact name, else the short name (PBS_NODEFILE lists FQDNs, the host name is
    short), so the heartbeat carries the name the supervisor knows the node by."""
    if not hostfile:
        return None
    try:
        hosts = Path(hostfile).read_text().split()
    except OSError:
        return None
    short = node.split(".", 1)[0]
    found = None
    for i, h in enumerate(hosts):
        if h == node:
            return i, h
        if found is None and h.split(".", 1)[0] == short:
            found = (i, h)
    return found


def _open_append(path: str | os.PathLike[str]) -> int:
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)


def _write_whole(fd: int, data: bytes) -> None:
    """Append `data` (whole lines) to `fd` (opened O_APPEND) in one os.write, so a process
    killed between rows leaves only whole lines, and concurrent writers (the checkpoint
    thread's events) never interleave within a line. Readers take only complete lines
    (`campaign.runfiles`). A short write (a full disk) is finished in further writes."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def append_metrics(run_dir: str | os.PathLike[str], rows: list[dict[str, Any]]) -> None:
    """Append step rows to metrics.jsonl (the stdout adapter writes the rows a trainer did not)."""
    fd = _open_append(Path(run_dir) / METRICS_FILE)
    try:  # all rows in one write, as the Reporter writes each of its own
        _write_whole(fd, "".join(json.dumps(r) + "\n" for r in rows).encode())
    finally:
        os.close(fd)


def remove_node_local(run_dir: str | os.PathLike[str], node: str, attempt: str) -> None:
    """Remove what a killed launch left on this node's local storage (a clean exit removes it)."""
    shutil.rmtree(_node_local_dir(str(run_dir), node, attempt), ignore_errors=True)


def _node_local_dir(run_dir: str, node: str, attempt: str) -> Path:
    """A per-(attempt, node) folder on node-local storage, shared by the node's ranks."""
    key = hashlib.sha1(f"{os.path.abspath(run_dir)}|{node}|{attempt}".encode()).hexdigest()[:16]
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()
    return Path(base) / f"campaign-{key}"


class Reporter:
    """Writes this rank's part of the contract. Create it once per rank with `from_env`."""

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        *,
        rank: int,
        local_rank: int,
        world_size: int,
        node: str,
        attempt: str = "0",
        interval: float = 1.0,
        slot: tuple[int, str] | None = None,
    ) -> None:
        """`slot`: (index in the hostfile, name there) of this node (`heartbeat_slot`); local
        rank 0 then writes the node's heartbeat into that slot of a group file, else into
        `heartbeats/<node>.json`."""
        self.run_dir = Path(run_dir)
        self.rank, self.local_rank, self.world_size = rank, local_rank, world_size
        self.node, self.interval = node, interval
        self.slot = slot
        self._slot_fd: int | None = None
        self._fds: dict[str, int] = {}
        """metrics.jsonl and events.jsonl (rank 0), opened O_APPEND at their first line and
        kept open until `close()`: no open and close per step (on a shared filesystem each is a
        metadata-server operation)."""
        self._fds_lock = threading.Lock()
        self.local_dir = _node_local_dir(str(run_dir), node, attempt)
        self.local_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / HEARTBEAT_DIR).mkdir(parents=True, exist_ok=True)
        now = time.time()
        self._state: dict[str, Any] = {STEP: 0, PHASE: "init", SINCE: now, TIME: now}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat_forever, name="campaign-heartbeat",
                                        daemon=True)
        self._publish()
        self._thread.start()

    @classmethod
    def from_env(cls, *, rank: int, local_rank: int, world_size: int) -> Reporter:
        """Read CAMPAIGN_RUN_DIR (default: current dir), CAMPAIGN_NODE, CAMPAIGN_ATTEMPT,
        CAMPAIGN_HEARTBEAT_INTERVAL and CAMPAIGN_HOSTFILE (local rank 0: this node's
        heartbeat slot) from the environment."""
        node = node_name()
        return cls(
            os.environ.get("CAMPAIGN_RUN_DIR", "."),
            rank=rank,
            local_rank=local_rank,
            world_size=world_size,
            node=node,
            attempt=os.environ.get("CAMPAIGN_ATTEMPT", "0"),
            interval=float(os.environ.get("CAMPAIGN_HEARTBEAT_INTERVAL", "1.0")),
            slot=heartbeat_slot(os.environ.get("CAMPAIGN_HOSTFILE"), node) if local_rank == 0 else None,
        )

    # --- the training loop's calls ---------------------------------------------------
    def phase(self, phase: str, step: int, *, timed: bool = True) -> None:
        """Say what this rank does now (one of PHASES) and at which step. Cheap: memory only.
        `timed=False`: this move from compute to a collective is not the step's gradient
        collective, so it does not count towards the compute time per step."""
        with self._lock:
            if phase != self._state[PHASE] or step != self._state[STEP]:
                now = time.time()
                if self._state[PHASE] == "compute" and phase == "collective" and timed:
                    # Time this rank computed before joining the collective: a straggler's
                    # is k times its peers' (EMA, so one slow step does not make a straggler).
                    took = now - self._state[SINCE]
                    ema = self._state.get(COMPUTE_S)
                    self._state[COMPUTE_S] = took if ema is None else 0.7 * ema + 0.3 * took
                self._state.update({PHASE: phase, STEP: step, SINCE: now})

    def step(self, *, step: int, tokens: int, loss: float, step_time_s: float,
             **extra: Any) -> None:
        """Record a finished optimizer step: rank 0 appends to metrics.jsonl."""
        with self._lock:  # with steps overlapped the phase is the next step's already
            self._state[STEP] = max(step, self._state[STEP])
        if self.rank == 0:
            row = {STEP: step, TOKENS: tokens, LOSS: loss, STEP_TIME_S: step_time_s}
            row.update(extra)
            row.setdefault(TIME, time.time())
            self._append(METRICS_FILE, row)

    def event(self, name: str, step: int, **extra: Any) -> None:
        """Append an event (rank 0 only; other ranks ignore the call)."""
        if self.rank == 0:
            self._append(EVENTS_FILE, {EVENT: name, STEP: step, TIME: time.time(), **extra})

    def _append(self, name: str, obj: dict[str, Any]) -> None:
        """One line, one os.write on the file's kept descriptor: in the file (readable by
        any other process) when this returns."""
        data = (json.dumps(obj) + "\n").encode()
        with self._fds_lock:  # events may come from the checkpoint writer's thread too
            fd = self._fds.get(name)
            if fd is None:
                fd = self._fds[name] = _open_append(self.run_dir / name)
            _write_whole(fd, data)

    def startup(self, info: dict[str, Any]) -> None:
        """Write startup.json (rank 0 only)."""
        if self.rank == 0:
            write_json_atomic(self.run_dir / STARTUP_FILE, info)

    def close(self) -> None:
        """Phase "done", a last heartbeat, and stop the thread."""
        self.phase("done", self._state[STEP])
        self._stop.set()
        self._thread.join(timeout=5)
        self._publish()
        if self.local_rank == 0:
            # Give the node's other ranks a moment to say "done" before the last fold.
            end = time.monotonic() + min(2.0, 2 * self.interval)
            while time.monotonic() < end and not self._all_local_done():
                time.sleep(0.02)
            self._publish()
            shutil.rmtree(self.local_dir, ignore_errors=True)
        if self._slot_fd is not None:
            os.close(self._slot_fd)
            self._slot_fd = None
        with self._fds_lock:  # a line written after this opens its file again
            fds, self._fds = self._fds, {}
        for fd in fds.values():
            os.close(fd)

    def _all_local_done(self) -> bool:
        for f in self.local_dir.glob("rank-*.json"):
            try:
                if json.loads(f.read_text()).get(PHASE) != "done":
                    return False
            except (OSError, ValueError):
                return False
        return True

    # --- heartbeat machinery ---------------------------------------------------------
    def _beat_forever(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._publish()
            except OSError as exc:  # a full /dev/shm or a flaky FS must not kill training
                print(f"campaign.report: heartbeat failed: {exc}", file=sys.stderr)

    def _publish(self) -> None:
        with self._lock:
            self._state[TIME] = time.time()
            mine = dict(self._state)
        self.local_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.local_dir / f"rank-{self.rank}.json", mine)
        if self.local_rank == 0:
            ranks: dict[str, Any] = {}
            for f in self.local_dir.glob("rank-*.json"):
                try:
                    ranks[f.stem.split("-", 1)[1]] = json.loads(f.read_text())
                except (OSError, ValueError):
                    continue  # being replaced right now; next beat picks it up
            ranks[str(self.rank)] = mine
            name = self.slot[1] if self.slot is not None else self.node
            doc = {NODE: name, TIME: time.time(), RANKS: dict(sorted(ranks.items()))}
            rec = encode_heartbeat_slot(doc) if self.slot is not None else None
            if rec is None:
                write_json_atomic(self.run_dir / HEARTBEAT_DIR / f"{name}.json", doc)
                return
            assert self.slot is not None
            if self._slot_fd is None:  # opened once, kept open: later beats are one pwrite each
                path = self.run_dir / HEARTBEAT_DIR / heartbeat_group_file(self.slot[0])
                self._slot_fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            os.pwrite(self._slot_fd, rec, heartbeat_slot_offset(self.slot[0]))


def node_name() -> str:
    """The node this rank runs on: CAMPAIGN_NODE (local site), else SLURMD_NODENAME (srun:
    Slurm's name, right even where virtual nodes share a host), else
    MPIR_CVAR_CH3_INTERFACE_HOSTNAME (MPICH Hydra's host for this rank, e.g. under
    `-launcher fork`), else the host name."""
    for var in ("CAMPAIGN_NODE", "SLURMD_NODENAME", "MPIR_CVAR_CH3_INTERFACE_HOSTNAME"):
        if os.environ.get(var):
            return os.environ[var]
    return socket.gethostname()


# --- helpers for a trainer of your own (docs/trainer-contract.md, "Helpers") -----------------
def run_config(path: str | os.PathLike[str] | None = None) -> dict[str, Any] | None:
    """What this attempt must do: trainer.json's `run` section (max_steps, max_tokens,
    checkpoint_dir, checkpoint_at, resume, deadline_unix, attempt) plus `checkpoint_every`.
    None when not started by campaign (no CAMPAIGN_TRAINER_CONFIG): use your own defaults."""
    path = path or os.environ.get("CAMPAIGN_TRAINER_CONFIG")
    if not path:
        return None
    cfg = json.loads(Path(path).read_text())
    return {**cfg["run"], "checkpoint_every": cfg.get("train", {}).get("checkpoint_every", 0)}


def allreduce_input(rank: int) -> float:
    """What each rank contributes to the start-up all-reduce (SUM): rank + 1."""
    return float(rank + 1)


def rank_identity(rank: int, local_rank: int, device: Any = "cpu") -> dict[str, Any]:
    """This rank's entry of startup.json; all-gather it (e.g. `dist.all_gather_object`)."""
    return {"rank": rank, "local_rank": local_rank, "node": node_name(), "host": socket.gethostname(),
            "device": str(device)}


def startup_check(ranks: list[dict[str, Any]], allreduce_got: float, *, rank: int,
                  run_dir: str | os.PathLike[str] | None = None) -> bool:
    """The start-up check from your own collectives: `ranks`, every rank's `rank_identity`
    (all-gathered) and `allreduce_got`, the all-reduce (SUM) of `allreduce_input(rank)`. Rank 0
    writes startup.json; every rank gets whether the sum is exact (W(W+1)/2)."""
    w = len(ranks)
    doc = {"world_size": w, "ranks": ranks,
           "allreduce": {"got": float(allreduce_got), "expected": float(w * (w + 1) // 2)}}
    if rank == 0:
        write_json_atomic(Path(run_dir or os.environ.get("CAMPAIGN_RUN_DIR", ".")) / STARTUP_FILE, doc)
    return doc["allreduce"]["got"] == doc["allreduce"]["expected"]


def begin_checkpoint(checkpoint_dir: str | os.PathLike[str], step: int, *, rank: int) -> Path:
    """The folder of the checkpoint of `step` (`step-NNNNNNNN/`), made ready by rank 0 (a stale
    one of the same step stops looking complete). Barrier, then every rank saves its files there."""
    path = Path(checkpoint_dir) / checkpoint_name(step)
    if rank == 0:
        (path / COMPLETE_MARKER).unlink(missing_ok=True)
        (path / META_FILE).unlink(missing_ok=True)
    path.mkdir(parents=True, exist_ok=True)
    return path


def complete_checkpoint(path: str | os.PathLike[str], *, step: int, tokens: int, rank: int, **extra: Any) -> None:
    """Call after a barrier that follows every rank's save: rank 0 writes meta.json (step,
    tokens, time, every file's size and checksum, `extra`) and then `.complete`, the marker
    resumes trust. `check_checkpoint_files` verifies both before a load."""
    if rank != 0:
        return
    path = Path(path)
    names = [f for f in sorted(path.iterdir()) if f.is_file() and f.name not in (META_FILE, COMPLETE_MARKER)
             and not f.name.startswith(RANK_CHECKSUMS)]
    files = {f.name: f.stat().st_size for f in names}
    known = _rank_checksums(path)
    checksums = {f.name: known.get(f.name) or file_checksum(f) for f in names}
    meta = {"step": step, "tokens": tokens, "time": time.time(), **extra, "files": files, "checksums": checksums}
    write_durable(path / META_FILE, json.dumps(meta).encode())
    write_durable(path / COMPLETE_MARKER, b"")  # after meta.json is on disk: the marker is trusted


CHECKSUM_CHUNK = 4 << 20
"""Bytes read at a time when checksumming a checkpoint file."""


def file_checksum(path: str | os.PathLike[str]) -> str:
    """"crc32:XXXXXXXX" of the file's bytes (zlib's CRC-32: ~1.4 GB/s here, stdlib; it is for
    corruption on disk, not for tampering)."""
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(CHECKSUM_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return f"crc32:{crc:08x}"


RANK_CHECKSUMS = "checksums-rank-"
"""Prefix of the files in which each rank of the built-in trainer leaves the checksums of the
shards it wrote (`write_rank_checksums`); `complete_checkpoint` folds them into meta.json."""


def write_rank_checksums(path: str | os.PathLike[str], rank: int, names: list[str]) -> None:
    """Checksum the files `names` of checkpoint folder `path` (this rank's own shards) into
    `checksums-rank-RRRRR.json`, durable before the save's barrier."""
    sums = {name: file_checksum(Path(path) / name) for name in names}
    write_durable(Path(path) / f"{RANK_CHECKSUMS}{rank:05d}.json", json.dumps(sums).encode())


def _rank_checksums(path: Path) -> dict[str, str]:
    """The checksums the ranks left in `path` (a file that cannot be read is computed again)."""
    out: dict[str, str] = {}
    for f in path.glob(f"{RANK_CHECKSUMS}*.json"):
        try:
            got = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(got, dict):
            out.update({k: v for k, v in got.items() if isinstance(k, str) and isinstance(v, str)})
    return out


def check_checkpoint_files(path: str | os.PathLike[str]) -> str | None:
    """None if the checkpoint folder's files match its meta.json (each file present, of the
    recorded size and, where meta.json has one, checksum); else what is wrong, naming the file."""
    p = Path(path)
    try:
        meta = json.loads((p / META_FILE).read_text())
        files, sums = dict(meta.get("files") or {}), dict(meta.get("checksums") or {})
    except (OSError, ValueError, TypeError, AttributeError) as exc:
        return f"unreadable {META_FILE}: {exc}"
    for name, size in files.items():
        f = p / name
        if not f.is_file():
            return f"missing file {name}"
        if f.stat().st_size != size:
            return f"{name} has {f.stat().st_size} bytes, expected {size} (truncated?)"
        if name in sums and (got := file_checksum(f)) != sums[name]:
            return f"{name} has checksum {got}, expected {sums[name]} (corrupted)"
    return None


def write_durable(path: str | os.PathLike[str], data: bytes) -> None:
    """Write through a temporary file, fsync it, rename, fsync the folder: after a crash the
    file is either absent or whole (what a checkpoint's `.complete` must be able to promise)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def list_checkpoints(checkpoint_dir: str | os.PathLike[str]) -> list[dict]:
    """Every `step-NNNNNNNN/` folder, oldest first: {step, tokens, path, complete, time}."""
    out = []
    root = Path(checkpoint_dir)
    if not root.is_dir():
        return out
    for d in sorted(root.glob("step-*")):
        try:
            step = int(d.name.split("-", 1)[1])
        except ValueError:
            continue
        meta: dict[str, Any] = {}
        try:
            meta = json.loads((d / META_FILE).read_text())
        except (OSError, ValueError):
            pass
        out.append({"step": step, "tokens": meta.get("tokens"), "path": str(d),
                    "complete": (d / COMPLETE_MARKER).exists(), "time": meta.get("time")})
    return out


def latest_complete_checkpoint(checkpoint_dir: str | os.PathLike[str] | None = None) -> Path | None:
    """The newest complete `step-NNNNNNNN/` folder in `checkpoint_dir` (default: this attempt's,
    CAMPAIGN_CHECKPOINT_DIR), or None."""
    root = checkpoint_dir or os.environ.get("CAMPAIGN_CHECKPOINT_DIR")
    done = [c for c in list_checkpoints(root) if c["complete"]] if root else []
    return Path(done[-1]["path"]) if done else None


# --- the driver's readers, moved to campaign.runfiles ------------------------------------
_READERS = frozenset({
    "BAD_ROW_EXAMPLES", "MetricsRead", "STEP_MAX", "StepChain", "TOKENS_MAX", "bad_rows_summary", "check_event_row",
    "check_metrics_row", "read_events", "read_events_checked", "read_events_from", "read_heartbeats", "read_metrics",
    "read_metrics_checked", "read_progress_lines", "read_startup",
})
"""Names this module held before the driver's readers moved to `campaign.runfiles`."""


def __getattr__(name: str) -> Any:
    """`report.read_metrics` and the other readers that moved to `campaign.runfiles`: these
    forwarders keep older scripts (and `from campaign.report import read_metrics`) working.
    New code imports them from `campaign.runfiles`, which never imports this module."""
    if name in _READERS:
        from campaign import runfiles
        return getattr(runfiles, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
