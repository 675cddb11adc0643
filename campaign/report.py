"""The trainer contract, in one dependency-free module (stdlib only; no torch).

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
`complete_checkpoint` (meta.json, then `.complete`), `latest_complete_checkpoint()`.

Readers, for the driver: `read_metrics` (`read_metrics_checked` also counts the rows it had
to skip), `read_events` (`read_events_from` with a byte offset, for a poll loop),
`read_heartbeats`, `read_startup`, `list_checkpoints`.

Files in the attempt's run directory (`CAMPAIGN_RUN_DIR`):

- `metrics.jsonl`  rank 0, one JSON object per logged optimizer step.
- `events.jsonl`   rank 0, {"event", "step", "time", ...}.
- `startup.json`   rank 0, once after init (world size, every rank, all-reduce check).
- `heartbeats/group-GGGGG.slots`  the node heartbeats, HEARTBEAT_GROUP nodes per file: node i
  of the hostfile owns the SLOT_BYTES-byte slot (i % HEARTBEAT_GROUP) of group i // HEARTBEAT_GROUP
  and its local rank 0 overwrites that slot in place every heartbeat interval (one pwrite to a
  file it keeps open: no create, rename or close per beat, so no metadata-server operation on
  a shared filesystem; docs/performance.md, "Supervisor and heartbeats at Aurora size").
  A node missing from the hostfile (or a trainer run without one) falls back to
  `heartbeats/<node>.json`, rewritten atomically (tmp + rename) every interval.
  `read_heartbeats` reads both layouts into the same {node: document}. Every rank's own daemon thread
  writes its state to a small file on node-local storage (/dev/shm, else the temp dir);
  local rank 0's thread folds them into the node's file. A rank's `time` is refreshed by
  its thread while the process lives, so a SIGSTOPped process goes stale; `phase`, `step`
  and `since` change only when the training loop says so, so a rank hung outside a
  collective stays in "compute" at step S while its peers wait in "collective" at S.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import socket
import sys
import tempfile
import threading
import time
import zlib
from pathlib import Path
from typing import Any, NamedTuple

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
HEARTBEAT_GROUP = 256
"""Nodes per heartbeat group file: 42 files at 10,624 nodes, so a reader opens 42 files, not 10,624."""
SLOT_BYTES = 4096
"""One node's slot in a group file: one page, so two nodes never write the same page (Lustre
extent locks are page-granular). 12 ranks' states take ~1.5 KB; a node whose document does not
fit falls back to its own `<node>.json`."""


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


def heartbeat_group_file(slot: int) -> str:
    """Name (under heartbeats/) of the group file that holds hostfile slot `slot`."""
    return f"group-{slot // HEARTBEAT_GROUP:05d}.slots"


def heartbeat_slot_offset(slot: int) -> int:
    """Byte offset of slot `slot` in its group file."""
    return (slot % HEARTBEAT_GROUP) * SLOT_BYTES


def encode_heartbeat_slot(doc: dict[str, Any]) -> bytes | None:
    """One slot: `<crc32 hex> <json>\\n`, space-padded to SLOT_BYTES; None if it does not fit.

    The CRC lets a reader reject a slot torn by a concurrent rewrite (a single write is atomic
    against reads on Lustre, not on every local filesystem)."""
    body = json.dumps(doc, separators=(",", ":")).encode()
    rec = b"%08x %s\n" % (zlib.crc32(body), body)
    if len(rec) > SLOT_BYTES:
        return None
    return rec.ljust(SLOT_BYTES, b" ")


def decode_heartbeat_slot(rec: bytes) -> dict[str, Any] | None:
    """The document of one slot; None if never written (zeros) or torn (CRC mismatch)."""
    end = rec.find(b"\n")
    if end < 10 or rec[8:9] != b" ":
        return None
    body = rec[9:end]
    try:
        if int(rec[:8], 16) != zlib.crc32(body):
            return None
        doc = json.loads(body)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


class _SlotCache:
    """Decoded slots of the last heartbeat folder read, keyed by (file, offset) and checked
    against the slot's exact bytes. Nodes rewrite their slot once per interval (1 s) while the
    supervisor reads every poll (0.25 s), and twice on a stall poll (phases, then culprits):
    most reads find the same bytes and skip the JSON decode, the bulk of a read at 10,624 nodes.
    Documents are shared between calls: callers must not mutate them."""

    def __init__(self) -> None:
        self.folder: str | None = None
        self.slots: dict[tuple[str, int], tuple[bytes, dict[str, Any]]] = {}
        self.lock = threading.Lock()

    def decode(self, folder: str, name: str, start: int, rec: bytes) -> dict[str, Any] | None:
        rec = rec[:rec.find(b"\n") + 1]  # what decoding reads (the padding after it is not kept)
        with self.lock:
            if folder != self.folder:  # another run directory: forget the last one's slots
                self.folder, self.slots = folder, {}
            hit = self.slots.get((name, start))
        if hit is not None and hit[0] == rec:
            return hit[1]
        doc = decode_heartbeat_slot(rec)
        if doc is not None:
            with self.lock:
                if folder == self.folder:
                    self.slots[(name, start)] = (rec, doc)
        return doc


_SLOT_CACHE = _SlotCache()


def _open_append(path: str | os.PathLike[str]) -> int:
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)


def _write_whole(fd: int, data: bytes) -> None:
    """Append `data` (whole lines) to `fd` (opened O_APPEND) in one os.write, so a process
    killed between rows leaves only whole lines, and concurrent writers (the checkpoint
    thread's events) never interleave within a line. Readers take only complete lines
    (`_complete_lines`). A short write (a full disk) is finished in further writes."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


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
        self._state: dict[str, Any] = {"step": 0, "phase": "init", "since": now, "time": now}
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
            if phase != self._state["phase"] or step != self._state["step"]:
                now = time.time()
                if self._state["phase"] == "compute" and phase == "collective" and timed:
                    # Time this rank computed before joining the collective: a straggler's
                    # is k times its peers' (EMA, so one slow step does not make a straggler).
                    took = now - self._state["since"]
                    ema = self._state.get("compute_s")
                    self._state["compute_s"] = took if ema is None else 0.7 * ema + 0.3 * took
                self._state.update(phase=phase, step=step, since=now)

    def step(self, *, step: int, tokens: int, loss: float, step_time_s: float,
             **extra: Any) -> None:
        """Record a finished optimizer step: rank 0 appends to metrics.jsonl."""
        with self._lock:  # with steps overlapped the phase is the next step's already
            self._state["step"] = max(step, self._state["step"])
        if self.rank == 0:
            row = {"step": step, "tokens": tokens, "loss": loss, "step_time_s": step_time_s}
            row.update(extra)
            row.setdefault("time", time.time())
            self._append(METRICS_FILE, row)

    def event(self, name: str, step: int, **extra: Any) -> None:
        """Append an event (rank 0 only; other ranks ignore the call)."""
        if self.rank == 0:
            self._append(EVENTS_FILE, {"event": name, "step": step, "time": time.time(), **extra})

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
        self.phase("done", self._state["step"])
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
                if json.loads(f.read_text()).get("phase") != "done":
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
            self._state["time"] = time.time()
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
            doc = {"node": name, "time": time.time(), "ranks": dict(sorted(ranks.items()))}
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


# --- readers (for the driver) ---------------------------------------------------
STEP_MAX = 2**31 - 1
"""Largest step a metrics row may carry (the ledger stores steps as 32-bit integers)."""
TOKENS_MAX = 10**18
"""Largest cumulative token count a metrics row may carry: far beyond any run, below a
64-bit integer (the ledger's column)."""
_NUMBER_FIELDS = ("step_time_s",)
"""Optional fields the watchdog computes with: when present and not null, finite numbers >= 0
(a NaN step time would make every stall budget NaN and switch the watchdog off)."""
_OTHER_FIELDS = ("tokens_per_s", "mfu", "comm_time_s", "mem_peak_gib", "lr", "grad_norm", "time")
"""Optional fields the ledger stores as floats: a number there must be one a float can hold (a
401-digit integer cannot); non-finite numbers and non-numbers are stored as null."""


class MetricsRead(NamedTuple):
    """What `read_metrics_checked` (or `read_events_checked`) read: the valid rows, the offset
    to read on from, how many complete lines it skipped as invalid, why (the first few, as
    "line N: reason: text"), the line number to read on from and the last valid step."""

    rows: list[dict]
    offset: int
    bad: int
    problems: list[str]
    line: int = 1
    last_step: int = -1


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _short(v: Any) -> str:
    """`v` for a message: a huge number or string is cut (a 401-digit number is 401 characters)."""
    if _is_int(v) and abs(v) >= 10**20:
        return f"an integer of {len(str(abs(v)))} digits"
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _number(v: Any) -> float | None:
    """`v` as a float, or None when it is no number (a bool, a string) or too large for one."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        return float(v)
    except OverflowError:
        return None


def check_metrics_row(row: Any, *, max_step: int = STEP_MAX) -> str | None:
    """Why `row` (a parsed line of metrics.jsonl) is not a valid metrics row, or None if it is.

    Valid: a JSON object; `step` an integer 0 <= step <= `max_step` (not a bool, not a float,
    not a string; `max_step` is the attempt's last step, at most STEP_MAX); `loss` present and
    a number (not a bool): NaN and +-inf are kept (a non-finite loss is evidence), null is
    read as NaN; `tokens`, when present, an integer 0 <= tokens <= TOKENS_MAX; `step_time_s`,
    when present and not null, a finite number >= 0; every other ledger column (`tokens_per_s`,
    `mfu`, `lr`, ...), when a number, one a float can hold (other values are stored as null). A valid row is
    normalised in place: an integer or null loss becomes a float."""
    if not isinstance(row, dict):
        return f"not a JSON object but {type(row).__name__}"
    step = row.get("step")
    if "step" not in row:
        return "no step"
    if not _is_int(step) or not 0 <= step <= STEP_MAX:
        return f"step {_short(step)} is not an integer in [0, {STEP_MAX}]"
    if step > max_step:
        return f"step {step} is beyond the attempt's last step {max_step}"
    if "tokens" in row:
        tokens = row["tokens"]
        if not _is_int(tokens) or not 0 <= tokens <= TOKENS_MAX:
            return f"tokens {_short(tokens)} is not an integer in [0, {TOKENS_MAX:.0e}]"
    if "loss" not in row:
        return "no loss"
    loss = math.nan if row["loss"] is None else _number(row["loss"])
    if loss is None:
        return f"loss {_short(row['loss'])} is not a number"
    row["loss"] = loss
    for key in _NUMBER_FIELDS:
        v = row.get(key)
        if v is not None and ((x := _number(v)) is None or not math.isfinite(x) or x < 0):
            return f"{key} {_short(v)} is not a finite number >= 0"
    for key in _OTHER_FIELDS:
        v = row.get(key)
        if _is_int(v) and _number(v) is None:
            return f"{key} {_short(v)} is out of a float's range"
    return None


def check_event_row(row: Any) -> str | None:
    """Why `row` (a parsed line of events.jsonl) is not a valid event, or None if it is: a JSON
    object whose `event` is a string; `step`, when present and not null, an integer in
    [0, STEP_MAX]; `seconds`, when present and not null, a finite number >= 0 (the readers of
    events, the watchdog and goodput, compute with these three)."""
    if not isinstance(row, dict):
        return f"not a JSON object but {type(row).__name__}"
    if not isinstance(row.get("event"), str):
        return f"event {_short(row.get('event'))} is not a string"
    step = row.get("step")
    if step is not None and (not _is_int(step) or not 0 <= step <= STEP_MAX):
        return f"step {_short(step)} is not an integer in [0, {STEP_MAX}]"
    v = row.get("seconds")
    if v is not None and ((x := _number(v)) is None or not math.isfinite(x) or x < 0):
        return f"seconds {_short(v)} is not a finite number >= 0"
    return None


def _complete_lines(path: str | os.PathLike[str], offset: int) -> bytes:
    """The bytes of `path` from `offset` up to and including its last newline (b"" when the
    file does not exist): a partial last line, still being written, is left for the next read."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return b""
    return data[:data.rfind(b"\n") + 1]


class StepChain:
    """Which rows of one attempt's metrics.jsonl its trainer can have written, judged by their
    place in the file. The trainer appends one row per logged step, in order, so:

    - steps go up from the attempt's start (`start`: the step of the checkpoint it resumes
      from, 0 for a fresh one) and stay within its last step (`max_step`);
    - cumulative `tokens` never go back, and `time` stamps neither go back (beyond
      TIME_SLACK_S, a clock step) nor go missing where the rows before carry them;
    - a row that jumps further ahead than the attempt's rows have stepped so far (`stride`,
      the widest gap between two accepted rows; 1 at first) is *held* until the next row
      says which of the two the trainer wrote: a row that follows the held one confirms it;
      one that follows the row before it refutes it (a forged or corrupted row: rejected and
      counted, and the real rows after it kept). `end()` (the attempt is over) takes a held row.

    So one forged row anywhere (`{"step": 999, "loss": 1.0, "tokens": 1}` appended mid-run) is
    rejected, never the real rows after it. A row that follows neither is rejected itself.
    One chain per attempt, fed every well-formed row in file order; where the reads cut the
    file does not change what it decides. Rows of a trainer that logs every step are taken
    at once (no row waits for the next)."""

    TIME_SLACK_S = 2.0
    """A row's time stamp may be this much earlier than the row's before it (a wall clock stepped back)."""

    def __init__(self, *, max_step: int = STEP_MAX, start: int = 0) -> None:
        self.max_step, self.start = max_step, max(start, 0)
        self.last: dict | None = None
        """The last accepted row."""
        self.stride = 1
        self.held: tuple[dict, int, bytes] | None = None
        """(row, line number, text) of the row waiting for the next one."""

    @property
    def last_step(self) -> int:
        """The last accepted step (-1: none yet)."""
        return -1 if self.last is None else int(self.last["step"])

    @property
    def tip(self) -> int:
        """The furthest step written that is not refuted (a held row's, else the last accepted)."""
        return int(self.held[0]["step"]) if self.held is not None else self.last_step

    def follows(self, row: dict, prev: dict | None) -> str | None:
        """Why `row` cannot come right after `prev` in the trainer's file, or None if it can."""
        if prev is None:
            return None
        step, before = row["step"], prev["step"]
        if step <= before:
            return f"step {step} does not follow step {before}"
        tokens, had = row.get("tokens"), prev.get("tokens")
        if _is_int(tokens) and _is_int(had) and tokens < had:
            return f"tokens {tokens} go back from the {had} of step {before} (tokens are cumulative)"
        t, was = _number(row.get("time")), _number(prev.get("time"))
        if was is not None and math.isfinite(was):
            if t is None:
                return f"no time stamp, where step {before}'s row has one"
            if t < was - self.TIME_SLACK_S:
                return f"time stamp {t:.3f} is before step {before}'s ({was:.3f})"
        return None

    def _expected(self, row: dict) -> bool:
        if self.last is None:
            return row["step"] <= self.start + 1
        return row["step"] - self.last["step"] <= self.stride

    def _accept(self, row: dict, out: list[dict]) -> None:
        if self.last is not None:
            self.stride = max(self.stride, row["step"] - self.last["step"])
        self.last = row
        out.append(row)

    def add(self, row: dict, n: int, text: bytes) -> tuple[list[dict], list[tuple[int, str, bytes]]]:
        """Feed the next well-formed row (line `n`, its `text`): the rows it lets the chain
        accept (a held row confirmed, this one) and those it rejects ((line, why, text))."""
        accepted: list[dict] = []
        rejected: list[tuple[int, str, bytes]] = []
        if self.held is not None:
            held, hn, htext = self.held
            if self.follows(row, held) is None:
                self.held = None
                self._accept(held, accepted)
            elif self.follows(row, self.last) is None:
                self.held = None
                rejected.append((hn, f"step {held['step']} is not the trainer's: the row after it (step {row['step']}) "
                                     f"follows step {self.last_step} instead", htext))
            else:
                why = self.follows(row, self.last) or ""
                rejected.append((n, why, text))
                return accepted, rejected
        why = self.follows(row, self.last)
        if why is not None:
            rejected.append((n, why, text))
        elif self._expected(row):
            self._accept(row, accepted)
        else:
            self.held = (row, n, text)
        return accepted, rejected

    def end(self) -> list[dict]:
        """The attempt is over: a held row no later row refuted is taken."""
        out: list[dict] = []
        if self.held is not None:
            self._accept(self.held[0], out)
            self.held = None
        return out


def _read_checked(path: Path, offset: int, line: int, check: Any, keep_problems: int,
                  chain: StepChain | None = None, final: bool = False) -> MetricsRead:
    """The complete lines of `path` from byte `offset` (line number `line`), each parsed and
    checked by `check`; with `chain` (metrics rows), each well-formed row is judged by its
    place among the attempt's rows too (`StepChain`), and `final` ends the chain (the file
    is complete: a held row is taken)."""
    data = _complete_lines(path, offset)
    rows: list[dict] = []
    bad = 0
    problems: list[str] = []

    def skip(n: int, why: str, text: bytes) -> None:
        nonlocal bad
        bad += 1
        if len(problems) < keep_problems:
            shown = text[:80].decode("utf-8", errors="replace")
            problems.append(f"line {n}: {why}: {shown}{'...' if len(text) > 80 else ''}")

    for n, text in enumerate(data.split(b"\n")[:-1], start=line):
        if not text.strip():
            continue
        try:
            row = json.loads(text)
            why = check(row)
        except (ValueError, RecursionError) as e:  # not JSON (UnicodeDecodeError is a ValueError)
            why = f"not JSON ({type(e).__name__})"
        if why is not None:
            skip(n, why, text)
        elif chain is None:
            rows.append(row)
        else:
            taken, refused = chain.add(row, n, text)
            rows += taken
            for args in refused:
                skip(*args)
    if chain is not None and final:
        rows += chain.end()
    return MetricsRead(rows, offset + len(data), bad, problems, line + data.count(b"\n"),
                       -1 if chain is None else chain.last_step)


def read_metrics_checked(run_dir: str | os.PathLike[str], offset: int = 0, *, keep_problems: int = 5,
                         line: int = 1, chain: StepChain | None = None, final: bool = False,
                         max_step: int = STEP_MAX) -> MetricsRead:
    """Valid rows of metrics.jsonl from byte `offset` (line number `line`; see
    `check_metrics_row`), the new offset, the number of complete lines skipped (not JSON, not a
    valid row, a step beyond the attempt's last, or a row its trainer cannot have written:
    `StepChain`), and the reasons for the first `keep_problems` of them ("line N: reason: text").

    `chain`: the attempt's chain, carried from one read to the next (a poll loop); its
    `max_step` is the attempt's last step. Without one, the read is of the whole file as it is
    now (a fresh chain with `max_step`, ended: `final`).
    A partial last line (being written) is left for the next call: the offset stops before it.
    Blank lines are skipped without counting."""
    if chain is None:
        chain, final = StepChain(max_step=max_step), True
    limit = chain.max_step
    return _read_checked(Path(run_dir) / METRICS_FILE, offset, line,
                         lambda row: check_metrics_row(row, max_step=limit), keep_problems, chain, final)


def read_events_checked(run_dir: str | os.PathLike[str], offset: int = 0, *, keep_problems: int = 5,
                        line: int = 1) -> MetricsRead:
    """Valid events of events.jsonl from byte `offset` (see `check_event_row`), as
    `read_metrics_checked` reads metrics rows (steps of events need not go up)."""
    return _read_checked(Path(run_dir) / EVENTS_FILE, offset, line, check_event_row, keep_problems)


BAD_ROW_EXAMPLES = 5
"""How many skipped metrics rows an attempt's summary quotes (with their reasons)."""


def bad_rows_summary(got: MetricsRead, run_dir: str | os.PathLike[str],
                     earlier: dict | None = None, *, name: str = METRICS_FILE) -> dict | None:
    """What the driver keeps of the rows a read of file `name` skipped (an attempt's
    summary["bad_metric_rows"] or ["bad_event_rows"]): {"count", "examples" ("line N: reason:
    text"), "file"}, added to `earlier`; `earlier` itself when the read skipped none."""
    if not got.bad:
        return earlier
    earlier = earlier or {"count": 0, "examples": [], "file": str(Path(run_dir) / name)}
    return {**earlier, "count": earlier["count"] + got.bad,
            "examples": (earlier["examples"] + got.problems)[:BAD_ROW_EXAMPLES]}


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


def latest_complete_checkpoint(checkpoint_dir: str | os.PathLike[str] | None = None) -> Path | None:
    """The newest complete `step-NNNNNNNN/` folder in `checkpoint_dir` (default: this attempt's,
    CAMPAIGN_CHECKPOINT_DIR), or None."""
    root = checkpoint_dir or os.environ.get("CAMPAIGN_CHECKPOINT_DIR")
    done = [c for c in list_checkpoints(root) if c["complete"]] if root else []
    return Path(done[-1]["path"]) if done else None


def read_progress_lines(log: str | os.PathLike[str], pattern: re.Pattern[str], offset: int = 0) -> tuple[list[dict], int]:
    """Step rows from a trainer's own output (`trainer.progress: stdout`): every complete line
    of `log` from byte `offset` that `pattern` matches, as {step, loss[, tokens][, step_time_s]}
    (`step_time` in seconds, or `step_time_ms` in milliseconds, as nanoGPT prints it;
    `tokens_per_s`, as build-nanogpt's `tok/sec`);
    returns (rows, new_offset). A partial last line is left for the next call, as `read_metrics`
    does; a match whose numbers do not parse is skipped."""
    data = _complete_lines(log, offset)
    rows = []
    for line in data.decode("utf-8", errors="replace").splitlines():
        m = pattern.search(line)
        if m is None:
            continue
        got = {k: v for k, v in m.groupdict().items() if v is not None}
        try:
            row: dict[str, Any] = {"step": int(got["step"]), "loss": float(got["loss"])}
            if "tokens" in got:
                row["tokens"] = int(float(got["tokens"]))
            if "step_time" in got:
                row["step_time_s"] = float(got["step_time"])
            elif "step_time_ms" in got:
                row["step_time_s"] = float(got["step_time_ms"]) / 1000
            if "tokens_per_s" in got:
                row["tokens_per_s"] = float(got["tokens_per_s"])
        except (KeyError, ValueError):
            continue
        rows.append(row)
    return rows, offset + len(data)


def append_metrics(run_dir: str | os.PathLike[str], rows: list[dict[str, Any]]) -> None:
    """Append step rows to metrics.jsonl (the stdout adapter writes the rows a trainer did not)."""
    fd = _open_append(Path(run_dir) / METRICS_FILE)
    try:  # all rows in one write, as the Reporter writes each of its own
        _write_whole(fd, "".join(json.dumps(r) + "\n" for r in rows).encode())
    finally:
        os.close(fd)


def read_metrics(run_dir: str | os.PathLike[str], offset: int = 0, *, chain: StepChain | None = None,
                 final: bool = False, max_step: int = STEP_MAX) -> tuple[list[dict], int]:
    """Valid rows of metrics.jsonl from byte `offset`; returns (rows, new_offset).

    A partial last line (being written) is left for the next call: new_offset stops
    before it. Invalid lines (not JSON, not a valid row: see `check_metrics_row`, a step
    beyond `max_step`, or one the trainer cannot have written: `StepChain`) are skipped;
    `read_metrics_checked` (same arguments) also counts them so callers can warn."""
    got = read_metrics_checked(run_dir, offset, chain=chain, final=final, max_step=max_step)
    return got.rows, got.offset


def read_events(run_dir: str | os.PathLike[str]) -> list[dict]:
    """All valid complete lines of events.jsonl (see `check_event_row`; others are skipped)."""
    return read_events_checked(run_dir).rows


def read_events_from(run_dir: str | os.PathLike[str], offset: int = 0) -> tuple[list[dict], int]:
    """Valid complete lines of events.jsonl from byte `offset`; returns (events, new_offset).

    For a poll loop: reads only what was appended since the last call (`read_events` reads
    the whole file every time). A partial last line is left for the next call."""
    got = read_events_checked(run_dir, offset)
    return got.rows, got.offset


def read_heartbeats(run_dir: str | os.PathLike[str]) -> dict[str, dict]:
    """{node: heartbeat document} for every written slot of heartbeats/group-*.slots and
    every readable heartbeats/<node>.json (the newer one where a node has both).

    Cost: one directory listing and one open per file, i.e. about nodes / HEARTBEAT_GROUP
    opens when the trainers write slots."""
    out: dict[str, dict] = {}
    folder = Path(run_dir) / HEARTBEAT_DIR
    try:
        entries = sorted(e.name for e in os.scandir(folder) if not e.name.startswith("."))
    except OSError:
        return out

    def keep(name: str, doc: dict) -> None:
        old = out.get(name)
        if old is None or float(doc.get("time", 0)) >= float(old.get("time", 0)):
            out[name] = doc

    for name in entries:
        path = folder / name
        if name.endswith(".slots"):
            try:
                with open(path, "rb") as f:
                    data = f.read()
                    for start in range(0, len(data) - SLOT_BYTES + 1, SLOT_BYTES):
                        rec = data[start:start + SLOT_BYTES]
                        if rec[:1] in (b"\0", b""):
                            continue  # never written: the node has not beaten (yet)
                        doc = _SLOT_CACHE.decode(str(folder), name, start, rec)
                        for _ in range(3):  # torn by a concurrent rewrite: read the slot again
                            if doc is not None:
                                break
                            time.sleep(0.001)
                            f.seek(start)
                            doc = decode_heartbeat_slot(f.read(SLOT_BYTES))
                        if doc is not None and "node" in doc:
                            keep(doc["node"], doc)
            except OSError:
                continue
        elif name.endswith(".json"):
            try:
                doc = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            keep(doc.get("node", path.stem), doc)
    return out


def read_startup(run_dir: str | os.PathLike[str]) -> dict | None:
    """startup.json, or None if not written (yet)."""
    try:
        return json.loads((Path(run_dir) / STARTUP_FILE).read_text())
    except (OSError, ValueError):
        return None


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
