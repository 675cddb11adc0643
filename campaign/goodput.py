"""Goodput: where a campaign's wall time went, from what the ledger already records.

An attempt's wall time (launch to end) is cut into consecutive pieces, each in one bucket:

    launch ─ startup ─ step 1 ... step k ─ [checkpoint stall] ─ step k+1 ... last step ─ tail ─ end

- **productive**: the steps' own time (`step_time_s`) the first time the stage trains them;
- **recomputed**: the same for steps an earlier attempt of the chain had already trained
  (the work a relaunch lost since the last complete checkpoint);
- **startup**: launch to the start of the first step (or the whole attempt if none came);
- **checkpoint_stall**: the gap between a checkpointed step and the next step (the last
  step's save, when the trainer reported its seconds);
- **detection**: a faulted attempt's tail, last progress to the kill (a hang's silence, or
  a crash's grace and evidence);
- **other**: gaps between steps (logging, heartbeats) and a clean attempt's exit.

A stage adds **restart** (a faulted attempt's end to the next launch) and other (stage start
to the first launch: idle, queue; gaps after clean attempts); a campaign adds the gaps
between stages to other. `productive + sum(lost) == wall` at each level, up to rounding.
ETTR (effective training time ratio) is productive / wall.

The totals are stored (attempt, stage_run, campaign `goodput` columns) when an attempt ends
and when a stage ends, so `campaign status` reads them without scanning step rows.

The checkpoint interval (Young/Daly) comes from the same records: the observed save stall,
the site's failure rate per node-second less the faults a rescue checkpoint covered, and the
step time (`suggest_interval`).
"""

from __future__ import annotations

import datetime as dt
import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import sqlalchemy as sa
from sqlalchemy.orm import Session

from campaign.exits import ExitClass
from campaign.fields import EVENT, SECONDS, STEP
from campaign.ledger.models import Attempt, Campaign, StageRun

LOST = ("startup_s", "checkpoint_stall_s", "recomputed_s", "detection_s", "restart_s", "other_s")
FAULTS = frozenset({ExitClass.STALLED, ExitClass.TIMED_OUT, ExitClass.CRASHED_NODE, ExitClass.CRASHED_UNKNOWN,
                    ExitClass.CRASHED_SYSTEMIC, ExitClass.BLOCK_LOST})
"""Exit classes that are a fault: their tail is detection, the gap after them restart."""


@dataclass
class Step:
    """One step row: its number, when it ended (epoch s) and how long it computed."""

    step: int
    end: float
    seconds: float


@dataclass
class AttemptTimes:
    """What the accounting of one attempt needs (all times epoch seconds)."""

    started: float
    finished: float
    exit_class: str
    steps: list[Step]
    saves: dict[int, float] = field(default_factory=dict)
    """Steps checkpointed in this attempt -> the trainer's save seconds (0.0 if unknown)."""
    done_before: int = 0
    """The highest step the chain's earlier attempts trained (redoing up to it is recomputed)."""


def empty() -> dict[str, Any]:
    return {"wall_s": 0.0, "productive_s": 0.0, "ettr": None, "lost": {k: 0.0 for k in LOST}}


def _add(acc: dict[str, Any], bucket: str, seconds: float) -> None:
    seconds = max(seconds, 0.0)
    if bucket == "productive_s":
        acc["productive_s"] += seconds
    else:
        acc["lost"][bucket] += seconds


def finish(acc: dict[str, Any], wall_s: float) -> dict[str, Any]:
    """Rounded, with ETTR."""
    acc["wall_s"] = round(wall_s, 3)
    acc["productive_s"] = round(acc["productive_s"], 3)
    acc["lost"] = {k: round(v, 3) for k, v in acc["lost"].items()}
    acc["ettr"] = round(acc["productive_s"] / wall_s, 4) if wall_s > 0 else None
    return acc


def account_attempt(a: AttemptTimes) -> dict[str, Any]:
    """The goodput of one attempt: its wall time cut into buckets (see the module docstring)."""
    acc = empty()
    rows = sorted(a.steps, key=lambda r: r.step)
    wall = max(a.finished - a.started, 0.0)
    if not rows:
        _add(acc, "startup_s", wall)
        return finish(acc, wall)
    cursor = a.started
    prev: Step | None = None
    for r in rows:
        begin = max(r.end - r.seconds, cursor)
        gap = begin - cursor
        if prev is None:
            _add(acc, "startup_s", gap)
        elif prev.step in a.saves:
            _add(acc, "checkpoint_stall_s", gap)
        elif r.step - prev.step > 1:  # steps not logged (log_every > 1): their compute is in the gap
            _add(acc, _work(r.step, a.done_before), gap)
        else:
            _add(acc, "other_s", gap)
        _add(acc, _work(r.step, a.done_before), r.end - begin)
        cursor, prev = max(r.end, cursor), r
    tail = max(a.finished - cursor, 0.0)
    save = min(a.saves.get(rows[-1].step, 0.0), tail)
    _add(acc, "checkpoint_stall_s", save)
    _add(acc, "detection_s" if a.exit_class in FAULTS else "other_s", tail - save)
    acc["step_s"] = round(statistics.median(r.seconds for r in rows), 6)
    return finish(acc, max(wall, cursor - a.started))


def _work(step: int, done_before: int) -> str:
    return "recomputed_s" if step <= done_before else "productive_s"


def combine(parts: Sequence[tuple[float, float, dict[str, Any], bool]], start: float, end: float) -> dict[str, Any]:
    """Sum timed parts (start, end, goodput, faulted) laid end to end in [start, end]: gaps
    after a faulted part are restart, the others (idle, queue, between stages) other."""
    acc = empty()
    start = min([start, *(p[0] for p in parts)])  # a part recorded before its container's start
    cursor, faulted = start, False
    for p_start, p_end, g, fault in sorted(parts, key=lambda p: p[0]):
        _add(acc, "restart_s" if faulted else "other_s", p_start - cursor)
        acc["productive_s"] += g.get("productive_s") or 0.0
        for k in LOST:
            acc["lost"][k] += (g.get("lost") or {}).get(k) or 0.0
        cursor, faulted = max(cursor, p_end), fault
    _add(acc, "other_s", end - cursor)
    return finish(acc, max(end, cursor) - start)


# --- the ledger: record at an attempt's and a stage's end, read for status ------------

def epoch(t: dt.datetime | None) -> float | None:
    """A ledger time (naive UTC) as epoch seconds."""
    return None if t is None else t.replace(tzinfo=dt.timezone.utc).timestamp()


def record_attempt(s: Session, a: Attempt, events: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """Compute and store the goodput of finished attempt `a` (its step rows, its checkpoint
    events from events.jsonl), then its stage's and campaign's totals."""
    from campaign.ledger.models import StepMetric

    rows = s.execute(sa.select(StepMetric.step, StepMetric.time, StepMetric.step_time_s)
                     .where(StepMetric.attempt_id == a.id)).all()
    steps = [Step(r.step, r.time, r.step_time_s or 0.0) for r in rows if r.time is not None]
    saves = {int(e[STEP]): float(e.get(SECONDS) or 0.0) for e in events if e.get(EVENT) == "checkpoint_saved"}
    times = AttemptTimes(started=epoch(a.started) or 0.0, finished=epoch(a.finished or a.updated) or 0.0,
                         exit_class=a.state, steps=steps, saves=saves, done_before=_done_before(a))
    g = account_attempt(times)
    stalls = _save_stalls(times)
    g.update(saves=len(stalls), save_s=round(statistics.median(stalls), 4) if stalls else None,
             fault=a.state in FAULTS, nodes=max(len(a.nodes or []), 1),
             rescued=_rescued((a.summary or {}).get("rescue")))
    a.goodput = g
    record_stage(s, a.stage_run)
    return g


def _rescued(r: dict[str, Any] | None) -> bool:
    """Whether a fault lost no work: a rescue checkpoint was saved, or the replica's step was
    already checkpointed (a rescue would have held, none was needed)."""
    return bool(r and (r.get("saved") or r.get("covered")))


def _save_stalls(a: AttemptTimes) -> list[float]:
    """Seconds each checkpoint stopped training: the gap to the next step, else the trainer's figure."""
    by_step = {r.step: r for r in a.steps}
    out = []
    for step, seconds in a.saves.items():
        nxt = by_step.get(step + 1)
        out.append(nxt.end - nxt.seconds - by_step[step].end if nxt and step in by_step else seconds)
    return [max(x, 0.0) for x in out if x is not None]


def _done_before(a: Attempt) -> int:
    """Highest step of earlier attempts of the same chain (a resumed attempt keeps its chain's
    `tokens_base`; a fresh one, e.g. a scaling run's next node count, starts a new chain)."""
    earlier = [b.last_step or 0 for b in a.stage_run.attempts
               if b.number < a.number and b.tokens_base == a.tokens_base]
    return max(earlier, default=0)


def record_stage(s: Session, run: StageRun) -> None:
    """Recompute and store `run`'s goodput from its attempts' stored goodput, then the campaign's."""
    parts = [(epoch(b.started), epoch(b.finished), b.goodput, bool(b.goodput.get("fault")))
             for b in run.attempts if b.goodput and b.finished]
    if run.started is not None and parts:
        end = max([p[1] for p in parts] + ([epoch(run.finished)] if run.finished else []))
        run.goodput = combine(parts, epoch(run.started) or 0.0, end or 0.0)
    c = run.campaign
    stages = [(epoch(r.started), epoch(r.started) + r.goodput["wall_s"], r.goodput, False)
              for r in c.stage_runs if r.version == c.version and r.goodput and r.started]
    if stages:
        c.goodput = combine(stages, min(p[0] for p in stages), max(p[1] for p in stages))


def public(g: dict[str, Any] | None) -> dict[str, Any]:
    """The `status --json` shape: {"wall_s", "productive_s", "ettr", "lost": {...}}."""
    g = g or empty()
    return {"wall_s": g["wall_s"], "productive_s": g["productive_s"], "ettr": g["ettr"], "lost": dict(g["lost"])}


def add_to_summary(s: Session, c: Campaign, out: dict[str, Any], *,
                   rescue_covers: Callable[[int], bool]) -> dict[str, Any]:
    """Add "goodput" to a `status --json` summary: the campaign's, each stage's, and the
    checkpoint interval Young/Daly suggests for each long run (`rescue_covers(nodes)`: whether
    its launch on that many nodes can rescue, `contract.rescue_covers`)."""
    out["goodput"] = public(c.goodput)
    runs = {r.name: r for r in c.stage_runs if r.version == c.version}
    spec_stages = {st.get("name"): st for st in (c.spec_json or {}).get("stages", [])}
    for st in out["stages"]:
        r = runs.get(st["name"])
        st["goodput"] = public(r.goodput if r else None)
        st["checkpoint_interval"] = None
        if _periodic_checkpoints(st["kind"]):
            sp = spec_stages.get(st["name"]) or {}
            nodes = sp.get("nodes") or (c.spec_json.get("site") or {}).get("nodes") or 1
            sug = suggest_interval(s, c, nodes=nodes, rescue=rescue_covers(nodes),
                                   mtbf_s=sp.get("mtbf_s"))
            st["checkpoint_interval"] = sug.as_dict() if sug else None
    return out


def _periodic_checkpoints(kind: str) -> bool:
    """Whether stage runs of `kind` checkpoint periodically to a target (its spec class says;
    an imported run's kinds are none of ours)."""
    from campaign import stages

    return kind in stages.KINDS and bool(stages.spec_class(kind).periodic_checkpoints)


# --- the checkpoint interval (Young/Daly) ---------------------------------------------

def daly_interval(save_s: float, mtbf_s: float) -> float:
    """Seconds of work between checkpoints that minimise expected lost time (Daly 2006, the
    higher-order form of Young's sqrt(2 δ M)); M when the save costs more than 2M."""
    if save_s <= 0:
        return 0.0
    if save_s >= 2 * mtbf_s:
        return mtbf_s
    r = save_s / (2 * mtbf_s)
    return math.sqrt(2 * save_s * mtbf_s) * (1 + math.sqrt(r) / 3 + r / 9) - save_s


@dataclass
class Suggestion:
    """A checkpoint interval and where its inputs came from."""

    steps: int
    interval_s: float
    save_s: float
    mtbf_s: float
    step_s: float
    source: str
    rescued: tuple[int, int] = (0, 0)
    """(faults a rescue checkpoint covered, faults) in the site's history."""
    rescue: bool = False
    """Whether the stage's launch can save a rescue checkpoint (`contract.rescue_covers`)."""

    @property
    def unrescued_mtbf_s(self) -> float:
        """The MTBF the interval was computed for (`unrescued_mtbf`)."""
        return unrescued_mtbf(self.mtbf_s, *self.rescued, rescue=self.rescue)

    def as_dict(self) -> dict[str, Any]:
        out = {"steps": self.steps, "interval_s": round(self.interval_s, 2), "save_s": round(self.save_s, 3),
               "mtbf_s": round(self.mtbf_s, 1), "step_s": round(self.step_s, 4), "source": self.source}
        if self.rescue:
            out.update(rescued=list(self.rescued), unrescued_mtbf_s=round(self.unrescued_mtbf_s, 1))
        return out


def suggest_interval(s: Session, c: Campaign, *, nodes: int, rescue: bool,
                     mtbf_s: float | None = None) -> Suggestion | None:
    """Young/Daly from the ledger: the save stall and step time of this campaign's attempts
    (else this site's), and `mtbf_s` if stated, else the site's failure rate scaled to
    `nodes`; `rescue`: whether the stage's launch can save a rescue checkpoint
    (`contract.rescue_covers`), so that only the faults no rescue covers count. None while the
    save cost, the step time or the failure rate is unknown."""
    hist = site_history(s, c.site)
    own = [g for cid, g in hist if cid == c.id]
    save = _median(g.get("save_s") for g in own) or _median(g.get("save_s") for _, g in hist)
    step = _median(g.get("step_s") for g in own) or _median(g.get("step_s") for _, g in hist)
    mtbf, source = (mtbf_s, "stated mtbf_s") if mtbf_s else (job_mtbf([g for _, g in hist], nodes), "site history")
    if not save or not step or not mtbf:
        return None
    faults, rescued = rescue_cover([g for _, g in hist]) if rescue else (0, 0)
    interval = daly_interval(save, unrescued_mtbf(mtbf, rescued, faults, rescue=rescue))
    return Suggestion(max(1, round(interval / step)), interval, save, mtbf, step, source, (rescued, faults), rescue)


def rescued_words(rescued: int, faults: int) -> str:
    """The rescue history an interval was computed from, in words (status, the long run's event)."""
    return f"{rescued} of {faults} faults rescued" if faults else "no fault seen yet, half taken as rescued"


def unrescued_mtbf(mtbf_s: float, rescued: int, faults: int, *, rescue: bool = True) -> float:
    """The MTBF of the faults no rescue covers: what Young/Daly trades a save against (a
    checkpoint saves the work a fault would cost, and after a rescued fault that is none).
    The share of faults left uncovered is estimated by Laplace's rule of succession,
    (faults - rescued + 1) / (faults + 2): one half before any fault is seen, and never 0
    however many were rescued, so a history of rescued faults only is no proof that every
    fault will be. A launch that cannot rescue (`rescue` False) has every fault uncovered."""
    if not rescue:
        return mtbf_s
    return mtbf_s * (faults + 2) / (faults - rescued + 1)


def rescue_cover(history: Sequence[dict[str, Any]]) -> tuple[int, int]:
    """(faults, faults after which a rescue checkpoint was saved) in stored attempt goodput."""
    faults = [g for g in history if g.get("fault")]
    return len(faults), sum(1 for g in faults if g.get("rescued"))


def site_history(s: Session, site: str) -> list[tuple[int, dict[str, Any]]]:
    """(campaign id, stored attempt goodput) of every finished attempt on `site`."""
    q = (sa.select(StageRun.campaign_id, Attempt.goodput).join(Attempt, Attempt.stage_run_id == StageRun.id)
         .join(Campaign, Campaign.id == StageRun.campaign_id)
         .where(Campaign.site == site, Attempt.goodput.is_not(None)))
    return [(cid, g) for cid, g in s.execute(q).all() if g]


def job_mtbf(history: Sequence[dict[str, Any]], nodes: int) -> float | None:
    """Mean time between faults of a job on `nodes` nodes: node-seconds trained per fault on
    the site, divided by `nodes`. None before the first fault."""
    faults = sum(1 for g in history if g.get("fault"))
    node_s = sum((g.get("wall_s") or 0.0) * (g.get("nodes") or 1) for g in history)
    return node_s / faults / max(nodes, 1) if faults else None


def check_auto(open_ledger: Callable[[], Any], spec: Any, path: str) -> None:
    """Refuse (SpecError, exit 2) a long run with `checkpoint_every: auto` that has neither
    `mtbf_s` nor a fault in the site's ledger history to take a failure rate from. The ledger
    is opened (`open_ledger()`, never creating one) only when such a stage exists."""
    from campaign.errors import SpecError

    auto = [i for i, st in enumerate(spec.stages) if st.needs_failure_rate()]
    if not auto or _site_has_faults(open_ledger, spec.site.kind):
        return
    raise SpecError(path, [f"stages[{i}].checkpoint_every: auto needs a failure rate and the ledger has no fault "
                           f"on site {spec.site.kind} yet: set stages[{i}].mtbf_s (seconds between faults of the "
                           "job) or a number of steps" for i in auto])


def _site_has_faults(open_ledger: Callable[[], Any], site: str) -> bool:
    from campaign.errors import CampaignError

    try:
        ledger = open_ledger()
    except CampaignError:  # no ledger yet, or one at an older schema: no usable history
        return False
    try:
        with ledger.session() as s:
            return any(g.get("fault") for _, g in site_history(s, site))
    finally:
        ledger.close()


def _median(xs: Iterable[Any]) -> float | None:
    vals = [float(x) for x in xs if x]
    return statistics.median(vals) if vals else None
