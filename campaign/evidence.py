"""Blame a node only with evidence: pure decisions over what a failed attempt left.

The supervisor collects, for one attempt, the exit of every rank (or what the launcher
printed about them), the tail of each failed rank's log, and whether a training step was
ever reported; `assess()` turns that into a `Finding`:

    node       evidence points at specific nodes: exclude them (within `exclusion_budget`)
               and relaunch elsewhere;
    systemic   no node swap can fix it (a typo'd flag, a full file system, a checkpoint
               that does not fit the model, the same failure on several nodes): exclude nobody;
    unknown    not enough evidence either way: exclude nobody, allow one confirming retry
               (`confirm()` compares it with the retry's finding).

Evidence for a node, strongest first:
- a hardware/driver signature (`HARDWARE`, scope "local") in a failed rank's log: an Xid
  that NVIDIA documents as hardware, an uncorrectable ECC error, a lost Level Zero device,
  a bus error, a machine check, a NIC link down. When *every* node of a multi-node launch shows
  it, no node stands out (like `watchdog.culprits`) and it is not node evidence;
- death by a signal that points at a node (`NODE_SIGNALS`) of ranks on exactly one node of a
  launch of two or more nodes, while no rank elsewhere died the same way;
- the stall pattern: the suspects `watchdog.culprits` (or the bisection drill) named.
Network errors (`HARDWARE`, scope "fabric": NCCL's "remote process exited or there was a
network error", IB completion errors, libfabric/CXI/oneCCL ATL errors) are printed by the
*victims* of a failure as often as by its cause, so alone they blame nobody; they only stop a
failure from being read as a software bug.

Every function here is pure (no processes, no ledger, no clock) except `read_tail`, the one
small file read the supervisor needs to feed `assess`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Any, Literal

from campaign import exits
from campaign.signatures import HARDWARE, SOFTWARE, Signature, match

__all__ = ["HARDWARE", "NODE_SIGNALS", "SOFTWARE", "SYSTEMIC_CODES", "Budget", "Finding", "RankExit", "Signature",
           "Primary", "Retry", "Suspect", "TAIL_LINES", "assess", "confirm", "exclusion_budget", "last_error_line", "match", "normalise",
           "read_tail", "signal_name",
           "split_by_rank"]

Kind = Literal["node", "systemic", "unknown"]


class Retry(exits.StrEnum):
    """What a finding says of retrying (stored in the finding's JSON as these strings); the
    long run maps it onto its `exits.NextAction` (stages/long_run.py)."""

    RELAUNCH_ELSEWHERE = "relaunch_elsewhere"
    """A node is blamed: relaunch without it."""
    CONFIRM_ONCE = "confirm_once"
    """The evidence cannot tell a node from the software: one confirming relaunch, ranks moved."""
    STOP = "stop"
    """Retrying cannot help (systemic), or a confirming retry could not tell: stop."""

TAIL_LINES = 50
"""How many of the last lines of a failed rank's log are kept as evidence."""

# --- signals ----------------------------------------------------------------------------
NODE_SIGNALS: dict[int, str] = {
    135: "SIGBUS",   # a mapped page that cannot be read: bad memory, a node-local disk or /dev/shm gone or full
    137: "SIGKILL",  # the kernel OOM killer or a node-health daemon on that node (the supervisor's own kills are
                     # marked `stopped` and never count); on one node alone, that node's memory or state
    139: "SIGSEGV",  # software bugs crash every rank alike; one node alone segfaulting points at its memory/driver
    132: "SIGILL",   # on a homogeneous machine one node alone hitting an illegal instruction has other hardware
                     # or a corrupted node-local copy of the binary
}
"""Signals that count as node evidence when ranks of exactly one node die by them (code 128+N).

Not node evidence: SIGABRT (134) is raised deliberately by libraries: C++ `terminate`,
assertions, and NCCL/oneCCL aborting a communicator because a *peer* failed, so the aborting
rank is usually a victim; SIGTERM (143) and SIGINT (130) come from the scheduler, a user, a
launcher tearing the launch down or the supervisor."""
SYSTEMIC_CODES: dict[int, str] = {
    exits.BROKEN_ENV: "broken environment (127): a command or library is missing; no node swap fixes it",
    exits.NO_RETRY: "bad configuration (93): the trainer refused its configuration",
    exits.NONFINITE: "non-finite loss (94): the run diverged",
    2: "exit 2: the command line was refused (argparse, or the script was not found)",
}
"""Exit codes that mean the failure is the trainer's or the configuration's, never a node's."""


def signal_name(code: int) -> str | None:
    """'SIGKILL' for 137, ... (None for codes that are not 128+N)."""
    if code <= 128 or code > 128 + 64:
        return None
    import signal as _signal

    try:
        return _signal.Signals(code - 128).name
    except ValueError:
        return f"signal {code - 128}"


_ERRORISH = re.compile(r"\b(?:\w*error|\w*exception|fatal|abort(?:ed)?|killed|segmentation fault|failed|failure|"
                       r"crash(?:ed)?|terminate called|broken|cannot|can't|unable|not found|no such|denied|"
                       r"out of memory)\b", re.I)
"""A line that looks like an error (an exception's name, ImportError(...) inside a line included):
quoted when no known signature matches; a log with none quotes nothing."""


# --- log lines --------------------------------------------------------------------------
_RANK_PREFIX = re.compile(r"^\s*(?:\[rank(?P<a>\d+)\]:?\s?|\[(?P<b>\d+)\]\s|(?P<c>\d+):\s)")


def split_by_rank(lines: Iterable[str]) -> dict[int | None, list[str]]:
    """Lines of a launcher's combined log by rank, from the prefixes launchers and PyTorch put
    on them: `[rank3]: ` (PyTorch), `3: ` (srun --label, PALS mpiexec --label), `[3] `
    (MPICH -l). Lines without a prefix go under None. The prefix is removed."""
    out: dict[int | None, list[str]] = {}
    for line in lines:
        m = _RANK_PREFIX.match(line)
        if m:
            rank = int(m.group("a") or m.group("b") or m.group("c"))
            out.setdefault(rank, []).append(line[m.end():])
        else:
            out.setdefault(None, []).append(line)
    return out


_WARNING = re.compile(r"^\S.*?:\d+: \w*Warning: |^\[W\d{4} |^(?:\[rank\d+\]: )?(?:WARNING|Warning)\b|UserWarning|"
                      r"FutureWarning|DeprecationWarning")
"""A warning (Python's `file:line: XWarning: ...`, c10's `[W1205 ...]`, a `WARNING` log line):
never the line to quote for a crash; Python's source line under it is skipped too."""


def without_warnings(lines: Sequence[str]) -> list[str]:
    """`lines` less warnings and the indented source line Python prints under each."""
    out, skip_source = [], False
    for ln in lines:
        if _WARNING.search(ln):
            skip_source = True
            continue
        if skip_source and ln.startswith((" ", "\t")):
            skip_source = False
            continue
        skip_source = False
        out.append(ln)
    return out


def last_error_line(lines: Sequence[str]) -> str | None:
    """The line a human should read first: the last one matching a known signature, else the
    last that looks like an error; None when no line does (the last line printed, "using
    device: cpu", is no cause: a finding then says the log shows no error line). Warnings are
    never quoted (`without_warnings`)."""
    clean = [ln.strip() for ln in without_warnings(lines) if ln.strip()]
    for pick in (lambda ln: match(ln) is not None, lambda ln: _ERRORISH.search(ln) is not None):
        for ln in reversed(clean):
            if pick(ln):
                return ln
    return None


def last_line(lines: Sequence[str]) -> str | None:
    """The last non-blank line that is no warning (None: none): what two failures are compared
    on when neither printed an error line."""
    clean = [ln.strip() for ln in without_warnings(lines) if ln.strip()]
    return clean[-1] if clean else None


def normalise(line: str | None, nodes: Iterable[str] = ()) -> str:
    """A last error line with what differs between ranks of the same failure removed (rank
    prefixes, node names, addresses, numbers), so equal failures compare equal."""
    if not line:
        return ""
    m = _RANK_PREFIX.match(line)
    text = line[m.end():] if m else line
    for node in sorted((n for n in nodes if n), key=len, reverse=True):
        text = text.replace(node, "<node>")
    text = re.sub(r"0x[0-9a-fA-F]+", "<hex>", text)
    text = re.sub(r"\d+", "#", text)
    return re.sub(r"\s+", " ", text).strip()


def read_tail(path: str | os.PathLike[str], lines: int = TAIL_LINES, max_bytes: int = 65536) -> tuple[str, ...]:
    """The last `lines` lines of a log (at most `max_bytes` read from its end); () if unreadable.
    The only function here that touches a file."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except OSError:
        return ()
    text = data.decode("utf-8", errors="replace").replace("\r", "\n")
    out = text.split("\n")
    if size > max_bytes:
        out = out[1:]  # the first line is cut
    return tuple(ln for ln in out if ln.strip())[-lines:]


# --- inputs and outputs -----------------------------------------------------------------
@dataclass(frozen=True)
class RankExit:
    """How one rank ended, as the supervisor saw it."""

    rank: int
    """-1 when only a launcher process was seen and its log did not name the rank."""
    node: str
    code: int
    """Exit code, normalised: killed by signal N is 128 + N (Popen's -N must be converted)."""
    seen_at: float
    """When the supervisor saw it exit (its poll time: exits seen in one poll share it)."""
    log_path: str | None = None
    log_tail: tuple[str, ...] = ()
    """The last ~50 lines of this rank's log (its own, or its lines of the launcher's log)."""
    stopped: bool = False
    """The supervisor (or the launcher tearing the launch down) stopped it: not evidence."""

    @staticmethod
    def from_popen(rank: int, node: str, returncode: int, seen_at: float, **kw: Any) -> RankExit:
        """From a Popen return code (-N for signal N)."""
        return RankExit(rank, node, 128 - returncode if returncode < 0 else returncode, seen_at, **kw)


@dataclass(frozen=True)
class Suspect:
    """A node to blame, why, and the evidence (JSON-able)."""

    node: str
    reason: str
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The shape the supervisor's report and the ledger's exclusions use."""
        return {"node": self.node, "reason": self.reason, "evidence": dict(self.evidence)}


@dataclass(frozen=True)
class Primary:
    """The failed rank a finding starts from (rank -1: the launcher named none)."""

    rank: int
    node: str
    exit_code: int


@dataclass(frozen=True)
class Finding:
    """What the evidence says about one failed attempt."""

    kind: Kind
    suspects: tuple[Suspect, ...]
    retry: Retry
    message: str
    """For a human: what failed, the last error line quoted, the log to read, what to do."""
    rule: str
    """Which rule decided (stall, contract_exit, hardware_signature, signal, same_failure,
    software_signature, fabric_error, insufficient, no_failure; confirm_* after `confirm`)."""
    last_error_line: str | None = None
    log_path: str | None = None
    primary: Primary | None = None
    """The failure the finding starts from."""
    signature: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-able (the report and the ledger): the same keys and strings as the fields."""
        out = asdict(self)
        out["suspects"] = [s.to_dict() for s in self.suspects]
        out["retry"] = str(self.retry)
        return out

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Finding:
        primary = d.get("primary")
        return Finding(**{**d, "suspects": tuple(Suspect(**s) for s in d.get("suspects") or ()),
                          "retry": Retry(d["retry"]), "primary": Primary(**primary) if primary else None})


# --- the decision -----------------------------------------------------------------------
@dataclass(frozen=True)
class _Facts:
    exit: RankExit
    local: tuple[Signature, str] | None  # first local hardware signature and its line
    fabric: tuple[Signature, str] | None
    software: tuple[Signature, str] | None  # the software signature of the last error line (else any, last)
    last: str | None
    printed: str | None = None  # the last line printed (no warning), whatever it says

    @property
    def signal(self) -> str | None:
        return NODE_SIGNALS.get(self.exit.code)


def _facts(e: RankExit) -> _Facts:
    local = fabric = software = None
    for ln in e.log_tail:
        for sig in HARDWARE:
            if sig.pattern.search(ln):
                if sig.scope == "local" and local is None:
                    local = (sig, ln.strip())
                elif sig.scope == "fabric" and fabric is None:
                    fabric = (sig, ln.strip())
                break
        else:
            if (sw := match(ln, SOFTWARE)) is not None:
                software = (sw, ln.strip())  # the last one wins
    last = last_error_line(e.log_tail)
    if last is not None and (sw := match(last, SOFTWARE)) is not None and match(last, HARDWARE) is None:
        software = (sw, last)
    return _Facts(e, local, fabric, software, last, last_line(e.log_tail))


def _how(e: RankExit) -> str:
    sig = signal_name(e.code)
    who = f"rank {e.rank}" if e.rank >= 0 else "the launch"
    return f"{who} on {e.node or 'an unknown node'} " + (f"was killed by {sig} ({e.code})" if sig else
                                                          f"exited with {e.code}")


def _quote(f: _Facts) -> str:
    if f.last:
        return f": \"{f.last}\"" + (f" (log: {f.exit.log_path})" if f.exit.log_path else "")
    return f"; its log ({f.exit.log_path}) shows no error line" if f.exit.log_path else "; no log"


def _evidence(f: _Facts, sig: tuple[Signature, str] | None = None) -> dict[str, Any]:
    ev: dict[str, Any] = {"rank": f.exit.rank, "exit_code": f.exit.code, "log_path": f.exit.log_path,
                          "last_error_line": f.last}
    if sig is not None:
        ev.update(signature=sig[0].name, matched_line=sig[1])
    return ev


def _finding(kind: Kind, retry: Retry, rule: str, primary: _Facts, message: str, suspects: Sequence[Suspect] = (),
             sig: str | None = None) -> Finding:
    return Finding(kind=kind, suspects=tuple(suspects), retry=retry, message=message, rule=rule,
                   last_error_line=primary.last, log_path=primary.exit.log_path, signature=sig,
                   primary=Primary(primary.exit.rank, primary.exit.node, primary.exit.code))


def _failure_key(f: _Facts, nodes: Sequence[str]) -> tuple[int, str]:
    """What makes two failures "the same": the exit code and the last error line's specific
    signature (ENOSPC on two different files is one failure), else the normalised line."""
    sig = match(f.last) if f.last else None
    if sig is not None and sig.name != "python_exception":
        return f.exit.code, sig.name
    return f.exit.code, normalise(f.last or f.printed, nodes)


def assess(exits_seen: Sequence[RankExit], *, first_step: bool, nodes: Sequence[str] = (),
           stall_suspects: Sequence[Suspect | dict[str, Any]] = (), same_poll_s: float = 0.0) -> Finding:
    """Node, systemic or unknown, from the exits of one attempt's ranks.

    exits_seen      every rank exit the supervisor saw (those it stopped marked `stopped`); in
                    launcher mode, the rank(s) the launcher reported failing, with their log lines
    first_step      whether any training step was reported (metrics.jsonl had a row)
    nodes           the attempt's active nodes (default: the nodes of `exits_seen`)
    stall_suspects  `watchdog.culprits(...)` (or the bisection drill's) suspects of a stall
    same_poll_s     exits seen within this many seconds of the first failure count as
                    simultaneous (0: the supervisor stamps exits of one poll with one time)

    Rules, in order (`ASSESS_RULES`; the first that decides wins, its name is the finding's
    `rule`): a stall's suspects; no failure at all; the trainer contract's systemic exit
    codes; local hardware signatures; death by a node signal on one node alone; the same
    failure (exit code and the last error line's signature, else the normalised line) on two
    or more nodes; a known software signature; a network error; otherwise unknown. The
    failures considered first are those seen within `same_poll_s` of the first one, less
    those that only report a network error (victims of a lost peer) when any does not; if
    all of them do, those within `same_poll_s` of the first failure without one. Among them
    the primary one is the rank killed by a node signal, then one with a hardware signature,
    then the earliest, then the lowest rank.
    """
    case = _Case(exits_seen, first_step, list(dict.fromkeys([*nodes, *(e.node for e in exits_seen if e.node)])),
                 tuple(_suspect(s) for s in stall_suspects), same_poll_s)
    for rule in ASSESS_RULES:
        if (found := rule(case)) is not None:
            return found
    raise AssertionError("the last rule (insufficient) always decides")


def _suspect(s: Suspect | dict[str, Any], reason: str = "stalled") -> Suspect:
    """A suspect as the report or the ledger hold it (a dict) as a `Suspect`."""
    if isinstance(s, Suspect):
        return s
    return Suspect(str(s["node"]), str(s.get("reason", reason)), dict(s.get("evidence") or {}))


@dataclass
class _Case:
    """One failed attempt as the rules of `assess` read it."""

    exits_seen: Sequence[RankExit]
    first_step: bool
    job_nodes: list[str]
    stall_suspects: tuple[Suspect, ...]
    same_poll_s: float

    @cached_property
    def failed(self) -> list[_Facts]:
        """The ranks that failed by themselves (not stopped, not 0)."""
        return [_facts(e) for e in self.exits_seen if e.code != 0 and not e.stopped]

    @cached_property
    def primary(self) -> _Facts:
        """The failure the finding starts from (see `assess`)."""
        failed, same_poll_s = self.failed, self.same_poll_s
        t0 = min(f.exit.seen_at for f in failed)
        wave = [f for f in failed if f.exit.seen_at - t0 <= same_poll_s]
        causes = [f for f in failed if f.fabric is None]
        if any(f.fabric is None for f in wave):
            # Victims of a lost peer seen together with a rank without a network error do not lead,
            # even when their abort (SIGABRT on gloo's exception) reads as death by a signal.
            wave = [f for f in wave if f.fabric is None]
        elif causes:
            # The first to fail only report a lost peer: victims, who can die before the rank that
            # failed (its exit may take a while). The failure is the first one without a network error.
            t1 = min(f.exit.seen_at for f in causes)
            wave = [f for f in causes if f.exit.seen_at - t1 <= same_poll_s]
        return min(wave, key=lambda f: (f.signal is None, f.local is None, f.exit.seen_at, f.exit.rank))

    @property
    def code(self) -> int:
        return self.primary.exit.code

    @property
    def head(self) -> str:
        """How the primary failure ended, with its last error line quoted."""
        return _how(self.primary.exit) + _quote(self.primary)


def stall(case: _Case) -> Finding | None:
    """The suspects the stall watchdog (or the bisection drill) named."""
    if not case.stall_suspects:
        return None
    sus = case.stall_suspects
    names = ", ".join(s.node for s in sus)
    return Finding("node", sus, Retry.RELAUNCH_ELSEWHERE, f"the launch stalled; the heartbeats single out "
                   f"{names}: {sus[0].reason}", "stall", primary=None)


def no_failure(case: _Case) -> Finding | None:
    if case.failed:
        return None
    return Finding("unknown", (), Retry.CONFIRM_ONCE, "no rank failed by itself (every exit was 0 or caused by "
                   "stopping the launch); nothing to blame", "no_failure")


def contract_exit(case: _Case) -> Finding | None:
    """Exit codes of the trainer contract that are never a node's fault."""
    if case.code not in SYSTEMIC_CODES or case.primary.local is not None:
        return None
    return _finding("systemic", Retry.STOP, "contract_exit", case.primary,
                    f"{case.head}. {SYSTEMIC_CODES[case.code]}; no node is blamed.")


def hardware_signature(case: _Case) -> Finding | None:
    """A hardware/driver signature in the log of a failed rank (unless every node shows it:
    `hardware_everywhere`)."""
    primary, failed, head = case.primary, case.failed, case.head
    local = list(dict.fromkeys(f.exit.node for f in sorted(failed, key=lambda f: f is not primary)
                               if f.local is not None and f.exit.node))  # the primary's node first
    if not local:
        return None
    if len(case.job_nodes) >= 2 and set(local) >= set(case.job_nodes):
        what = primary.local[0].name if primary.local else "a hardware error"
        return _finding("unknown", Retry.CONFIRM_ONCE, "hardware_everywhere", primary,
                        f"{head}. Every node reports {what}, so no node stands out (a driver or firmware "
                        "problem?); no node is blamed, one confirming retry.")
    sus = []
    for node in local:
        f = next(f for f in failed if f.exit.node == node and f.local is not None)
        assert f.local is not None
        sus.append(Suspect(node, f"{f.local[0].name} in the log of rank {f.exit.rank}: \"{f.local[1]}\"",
                           _evidence(f, f.local)))
    first = next(f for f in failed if f.exit.node == local[0] and f.local is not None)
    assert first.local is not None
    return _finding("node", Retry.RELAUNCH_ELSEWHERE, "hardware_signature", primary,
                    f"{head}. Hardware evidence against {', '.join(local)}: {first.local[0].name} "
                    f"\"{first.local[1]}\" (log: {first.exit.log_path}).", sus, first.local[0].name)


def signal(case: _Case) -> Finding | None:
    """Death by a node signal on exactly one node, no rank elsewhere dying the same way (or on
    several nodes: `signal_everywhere`)."""
    primary, code, first_step = case.primary, case.code, case.first_step
    if primary.signal is None:
        return None
    same = {f.exit.node for f in case.failed if f.exit.code == code}
    if len(same) == 1 and len(case.job_nodes) >= 2:
        ranks = sorted(f.exit.rank for f in case.failed if f.exit.code == code)
        sus = Suspect(primary.exit.node, f"rank(s) {', '.join(map(str, ranks))} killed by {primary.signal} "
                      f"({code}) on this node alone", {**_evidence(primary), "signal": primary.signal, "ranks": ranks})
        return _finding("node", Retry.RELAUNCH_ELSEWHERE, "signal", primary,
                        f"{case.head}; no rank on another node died by {primary.signal}: {primary.exit.node} is "
                        f"suspect.", [sus], primary.signal)
    if len(same) > 1:
        kind: Kind = "systemic" if not first_step else "unknown"
        return _finding(kind, Retry.STOP if not first_step else Retry.CONFIRM_ONCE, "signal_everywhere", primary,
                        f"{case.head}. Ranks on {len(same)} nodes ({', '.join(sorted(same))}) died by "
                        f"{primary.signal}{' before the first step' if not first_step else ''}: the cause is "
                        f"shared (e.g. the configuration does not fit the memory); no node is blamed.")
    return None


def same_failure(case: _Case) -> Finding | None:
    """The same failure (exit code and last error line) on two or more nodes."""
    primary, first_step = case.primary, case.first_step
    key = _failure_key(primary, case.job_nodes)
    same_nodes = sorted({f.exit.node for f in case.failed if _failure_key(f, case.job_nodes) == key})
    if len(same_nodes) < 2 or primary.fabric is not None:
        return None
    sig = primary.software[0].name if primary.software else None
    where = f"{case.head}. The same failure on {len(same_nodes)} nodes ({', '.join(same_nodes)})"
    if not first_step or primary.software is not None:  # it will fail the same way again
        return _finding("systemic", Retry.STOP, "same_failure", primary,
                        f"{where}{' before the first step' if not first_step else ''}: it is not a node's "
                        "fault; no node is blamed.", sig=sig)
    # After training started and matching no known error (e.g. every rank aborting in
    # torch's gloo teardown after the last step): one confirming retry tells a one-off apart.
    return _finding("unknown", Retry.CONFIRM_ONCE, "same_failure", primary,
                    f"{where}, after training started and matching no known error: it is not a node's "
                    "fault; no node is blamed, one confirming retry.", sig=sig)


def software_signature(case: _Case) -> Finding | None:
    """A known software signature (and no network error behind it)."""
    primary = case.primary
    if primary.software is None or primary.fabric is not None:
        return None
    name, what = primary.software[0].name, primary.software[0].source
    return _finding("systemic", Retry.STOP, "software_signature", primary,
                    f"{case.head}. A software or configuration error ({name}: {what}): relaunching elsewhere would "
                    "fail the same way; no node is blamed.", sig=name)


def fabric_error(case: _Case) -> Finding | None:
    """Network errors alone: the failing node and its victims print the same."""
    primary = case.primary
    if primary.fabric is None:
        return None
    return _finding("unknown", Retry.CONFIRM_ONCE, "fabric_error", primary,
                    f"{case.head}. A network error ({primary.fabric[0].name}) that the cause and its peers both "
                    "report: no node is singled out; none blamed, one confirming retry.", sig=primary.fabric[0].name)


def insufficient(case: _Case) -> Finding:
    """Not enough evidence."""
    why = ("a single node with no other node to compare" if len(case.job_nodes) < 2
           else "no hardware signature, no node signal, no known error")
    return _finding("unknown", Retry.CONFIRM_ONCE, "insufficient", case.primary,
                    f"{case.head}. Not enough evidence to blame a node ({why}); none blamed, one confirming retry.")


ASSESS_RULES: tuple[Callable[[_Case], Finding | None], ...] = (
    stall, no_failure, contract_exit, hardware_signature, signal, same_failure, software_signature, fabric_error,
    insufficient)
"""The rules of `assess`, in order; each is named as the finding records it (`Finding.rule`;
`hardware_signature` may record `hardware_everywhere`, `signal` `signal_everywhere`)."""


def _ranks_moved(node: str, placements: tuple[Sequence[str], Sequence[str]] | None) -> bool:
    """Whether `node` held other ranks in the retry than in the first launch: its place in the
    active nodes (rank order) changed between the two."""
    if not placements:
        return False
    before, now = placements
    return node in before and node in now and list(before).index(node) != list(now).index(node)


def confirm(previous: Finding, current: Finding,
            placements: tuple[Sequence[str], Sequence[str]] | None = None) -> Finding:
    """The verdict after the confirming retry of an `unknown` finding (both for the same stage).

    If the retry found evidence, that stands. If the failure followed the node (same node,
    another rank: the retry should rotate the host order so ranks move), the node is suspect;
    if it followed the rank or moved to another node, it is systemic; if it repeated on the
    same rank and node, evidence is still insufficient: stop, and probe the node (drill).
    `placements` (the two launches' active nodes, in rank order) tells, where the launcher
    named the node but no rank (MPICH's "BAD TERMINATION ... RUNNING AT node"), whether other
    ranks ran on that node the second time: then the failure followed the node too."""
    if previous.kind != "unknown" or current.kind != "unknown" or not previous.primary or not current.primary:
        return current
    p, c = previous.primary, current.primary
    same_line = normalise(previous.last_error_line) == normalise(current.last_error_line)
    where = f" (log: {current.log_path})" if current.log_path else ""
    quote = f" \"{current.last_error_line}\"{where}" if current.last_error_line else where
    unnamed = p.rank < 0 and c.rank < 0
    if p.node and p.node == c.node and (p.rank != c.rank or (unnamed and _ranks_moved(c.node, placements))):
        ranks = ("other ranks on it the second time (the launcher named no rank; the ranks rotated" if unnamed
                 else f"different ranks (ranks {p.rank} and {c.rank}")
        sus = Suspect(c.node, f"failed twice on this node with {ranks}, exits {p.exit_code} and "
                      f"{c.exit_code})",
                      {"ranks": [p.rank, c.rank], "exit_codes": [p.exit_code, c.exit_code],
                       "last_error_line": current.last_error_line, "log_path": current.log_path})
        return Finding("node", (sus,), Retry.RELAUNCH_ELSEWHERE, f"the failure followed node {c.node} across ranks:"
                       f"{quote}", "confirm_node", current.last_error_line, current.log_path, current.primary,
                       current.signature)
    if p.node == c.node:
        return Finding("unknown", (), Retry.STOP, f"rank {c.rank} on {c.node} failed again{quote}; the rank and "
                       "the node did not move, so it cannot tell them apart: probe the node (drill) before "
                       "blaming it", "confirm_same_place", current.last_error_line, current.log_path,
                       current.primary, current.signature)
    moved = "the same rank failed on another node" if p.rank == c.rank else "it failed on another node"
    return Finding("systemic", (), Retry.STOP, f"{moved} ({p.node} then {c.node}"
                   f"{', same error' if same_line else ''}){quote}: not a node's fault; no node is blamed",
                   "confirm_moved", current.last_error_line, current.log_path, current.primary, current.signature)


# --- how many to exclude ----------------------------------------------------------------
@dataclass(frozen=True)
class Budget:
    """Which suspects to exclude now and which to probe (drill/bisection) first."""

    exclude: tuple[Suspect, ...]
    probe: tuple[Suspect, ...]
    reason: str


def exclusion_budget(suspects: Sequence[Suspect | dict[str, Any]], *, already_excluded: int,
                     per_attempt: int = 1, per_chain: int = 3) -> Budget:
    """Exclude at most `per_attempt` suspects of this attempt (in the order given: strongest
    evidence first) and at most `per_chain` over the stage's chain of attempts; the rest need
    a probe (a drill on them, or bisection) before they are excluded.

    Why 1 per attempt: independent node failures are rare events (a few a day on 10,000
    nodes), so two in the same attempt are far likelier to share a cause (a switch, a file
    system, a bad software roll-out) or to be victims of the first; excluding them all would
    spend spares and hide that cause. Why 3 per chain: a systemic fault misread as node
    faults would otherwise exclude a node per relaunch until the allocation is gone; after
    three, further exclusions need a probe."""
    sus = [_suspect(s, reason="") for s in suspects]
    first: dict[str, Suspect] = {}
    for s in sus:
        first.setdefault(s.node, s)  # the first mention of a node (strongest evidence) wins
    uniq = list(first.values())
    room = max(0, min(per_attempt, per_chain - already_excluded))
    exclude, probe = tuple(uniq[:room]), tuple(uniq[room:])
    if not uniq:
        reason = "no suspect"
    elif not probe:
        reason = f"excluding {', '.join(s.node for s in exclude)}"
    elif room == 0:
        reason = (f"{already_excluded} node(s) already excluded in this stage (limit {per_chain}): probe "
                  f"{', '.join(s.node for s in probe)} before excluding more")
    else:
        reason = (f"excluding {', '.join(s.node for s in exclude)} (at most {per_attempt} per attempt); probe "
                  f"{', '.join(s.node for s in probe)} first")
    return Budget(exclude, probe, reason)
