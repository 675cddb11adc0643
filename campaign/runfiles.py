"""The driver's readers of what a trainer wrote into an attempt's run directory (stdlib only).

The trainer writes (`campaign.report`); the driver, the supervisor and the CLI read here:

- `read_metrics` / `read_metrics_checked` (metrics.jsonl from a byte offset, each row checked:
  `check_metrics_row`, and by its place among the attempt's rows: `StepChain`), and
  `bad_rows_summary`, what the driver keeps of the rows a read skipped;
- `read_events` / `read_events_from` / `read_events_checked` (events.jsonl; `check_event_row`);
- `read_heartbeats` (every node's heartbeat: group files of slots, `campaign.heartbeatslot`, and
  `<node>.json`), `read_startup` (startup.json);
- `read_progress_lines`: step rows from a trainer's own output (`trainer.progress: stdout`).

A partial last line (still being written) is never read: each read stops before it and the
next read, from the offset returned, takes it whole. File names come from `campaign.rundir`,
the keys of rows from `campaign.fields`. The names are also reachable as `campaign.report.X`,
where they lived before (older scripts).
"""

from __future__ import annotations

import json
import math
import os
import re
import threading
import time
from pathlib import Path
from typing import Any, NamedTuple

from campaign.fields import (EVENT, LOSS, METRIC_FIELDS, NODE, SECONDS, STEP, STEP_TIME_S, TIME, TOKENS,
                             TOKENS_PER_S)
from campaign.heartbeatslot import SLOT_BYTES, decode_heartbeat_slot
from campaign.rundir import EVENTS_FILE, HEARTBEAT_DIR, METRICS_FILE, STARTUP_FILE

# --- metrics.jsonl and events.jsonl, each line checked ----------------------------------
STEP_MAX = 2**31 - 1
"""Largest step a metrics row may carry (the ledger stores steps as 32-bit integers)."""
TOKENS_MAX = 10**18
"""Largest cumulative token count a metrics row may carry: far beyond any run, below a
64-bit integer (the ledger's column)."""
_NUMBER_FIELDS = (STEP_TIME_S,)
"""Optional fields the watchdog computes with: when present and not null, finite numbers >= 0
(a NaN step time would make every stall budget NaN and switch the watchdog off)."""
_OTHER_FIELDS = tuple(f for f in METRIC_FIELDS if f not in (LOSS, *_NUMBER_FIELDS))
"""The ledger's other float columns: a number there must be one a float can hold (a
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
    step = row.get(STEP)
    if STEP not in row:
        return "no step"
    if not _is_int(step) or not 0 <= step <= STEP_MAX:
        return f"step {_short(step)} is not an integer in [0, {STEP_MAX}]"
    if step > max_step:
        return f"step {step} is beyond the attempt's last step {max_step}"
    if TOKENS in row:
        tokens = row[TOKENS]
        if not _is_int(tokens) or not 0 <= tokens <= TOKENS_MAX:
            return f"tokens {_short(tokens)} is not an integer in [0, {TOKENS_MAX:.0e}]"
    if LOSS not in row:
        return "no loss"
    loss = math.nan if row[LOSS] is None else _number(row[LOSS])
    if loss is None:
        return f"loss {_short(row[LOSS])} is not a number"
    row[LOSS] = loss
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
    if not isinstance(row.get(EVENT), str):
        return f"event {_short(row.get(EVENT))} is not a string"
    step = row.get(STEP)
    if step is not None and (not _is_int(step) or not 0 <= step <= STEP_MAX):
        return f"step {_short(step)} is not an integer in [0, {STEP_MAX}]"
    v = row.get(SECONDS)
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
        return -1 if self.last is None else int(self.last[STEP])

    @property
    def tip(self) -> int:
        """The furthest step written that is not refuted (a held row's, else the last accepted)."""
        return int(self.held[0][STEP]) if self.held is not None else self.last_step

    def follows(self, row: dict, prev: dict | None) -> str | None:
        """Why `row` cannot come right after `prev` in the trainer's file, or None if it can."""
        if prev is None:
            return None
        step, before = row[STEP], prev[STEP]
        if step <= before:
            return f"step {step} does not follow step {before}"
        tokens, had = row.get(TOKENS), prev.get(TOKENS)
        if _is_int(tokens) and _is_int(had) and tokens < had:
            return f"tokens {tokens} go back from the {had} of step {before} (tokens are cumulative)"
        t, was = _number(row.get(TIME)), _number(prev.get(TIME))
        if was is not None and math.isfinite(was):
            if t is None:
                return f"no time stamp, where step {before}'s row has one"
            if t < was - self.TIME_SLACK_S:
                return f"time stamp {t:.3f} is before step {before}'s ({was:.3f})"
        return None

    def _expected(self, row: dict) -> bool:
        if self.last is None:
            return row[STEP] <= self.start + 1
        return row[STEP] - self.last[STEP] <= self.stride

    def _accept(self, row: dict, out: list[dict]) -> None:
        if self.last is not None:
            self.stride = max(self.stride, row[STEP] - self.last[STEP])
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
                rejected.append((hn, f"step {held[STEP]} is not the trainer's: the row after it (step {row[STEP]}) "
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


def read_metrics(run_dir: str | os.PathLike[str], offset: int = 0, *, chain: StepChain | None = None,
                 final: bool = False, max_step: int = STEP_MAX) -> tuple[list[dict], int]:
    """Valid rows of metrics.jsonl from byte `offset`; returns (rows, new_offset).

    A partial last line (being written) is left for the next call: new_offset stops
    before it. Invalid lines (not JSON, not a valid row: see `check_metrics_row`, a step
    beyond `max_step`, or one the trainer cannot have written: `StepChain`) are skipped;
    `read_metrics_checked` (same arguments) also counts them so callers can warn."""
    got = read_metrics_checked(run_dir, offset, chain=chain, final=final, max_step=max_step)
    return got.rows, got.offset


def read_events_checked(run_dir: str | os.PathLike[str], offset: int = 0, *, keep_problems: int = 5,
                        line: int = 1) -> MetricsRead:
    """Valid events of events.jsonl from byte `offset` (see `check_event_row`), as
    `read_metrics_checked` reads metrics rows (steps of events need not go up)."""
    return _read_checked(Path(run_dir) / EVENTS_FILE, offset, line, check_event_row, keep_problems)


def read_events(run_dir: str | os.PathLike[str]) -> list[dict]:
    """All valid complete lines of events.jsonl (see `check_event_row`; others are skipped)."""
    return read_events_checked(run_dir).rows


def read_events_from(run_dir: str | os.PathLike[str], offset: int = 0) -> tuple[list[dict], int]:
    """Valid complete lines of events.jsonl from byte `offset`; returns (events, new_offset).

    For a poll loop: reads only what was appended since the last call (`read_events` reads
    the whole file every time). A partial last line is left for the next call."""
    got = read_events_checked(run_dir, offset)
    return got.rows, got.offset


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


# --- a trainer's own output (trainer.progress: stdout) -----------------------------------
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
        try:  # the pattern's groups are named after the row's keys, but for the step time's two units
            row: dict[str, Any] = {STEP: int(got[STEP]), LOSS: float(got[LOSS])}
            if TOKENS in got:
                row[TOKENS] = int(float(got[TOKENS]))
            if "step_time" in got:
                row[STEP_TIME_S] = float(got["step_time"])
            elif "step_time_ms" in got:
                row[STEP_TIME_S] = float(got["step_time_ms"]) / 1000
            if TOKENS_PER_S in got:
                row[TOKENS_PER_S] = float(got[TOKENS_PER_S])
        except (KeyError, ValueError):
            continue
        rows.append(row)
    return rows, offset + len(data)


# --- heartbeats and startup.json ---------------------------------------------------
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
    for name in entries:
        if name.endswith(".slots"):
            docs = _read_group_file(folder, name)
        elif name.endswith(".json"):
            docs = _read_node_file(folder / name)
        else:
            continue
        for node, doc in docs:
            old = out.get(node)
            if old is None or float(doc.get(TIME, 0)) >= float(old.get(TIME, 0)):
                out[node] = doc
    return out


def _read_group_file(folder: Path, name: str) -> list[tuple[str, dict]]:
    """(node, document) of every written slot of group file `name` (those read before an
    OSError, if one comes); a slot torn by a concurrent rewrite is read again, up to 3 times."""
    found: list[tuple[str, dict]] = []
    try:
        with open(folder / name, "rb") as f:
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
                if doc is not None and NODE in doc:
                    found.append((doc[NODE], doc))
    except OSError:
        pass
    return found


def _read_node_file(path: Path) -> list[tuple[str, dict]]:
    """[(node, document)] of a node's own `<node>.json`; [] when it cannot be read."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    return [(doc.get(NODE, path.stem), doc)]


def read_startup(run_dir: str | os.PathLike[str]) -> dict | None:
    """startup.json, or None if not written (yet)."""
    try:
        return json.loads((Path(run_dir) / STARTUP_FILE).read_text())
    except (OSError, ValueError):
        return None
