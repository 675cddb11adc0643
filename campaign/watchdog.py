"""The stall watchdog: a pure decision over what the launch reports, plus culprit finding.

Progress-based, not stdout-silence: a launch is stalled when no new step has been reported
for longer than the budget of the phase it is in:

    startup      launch until the first step (imports, rendezvous, checkpoint load)
    warmup       the first `warmup_steps` steps: max(steady budget, warmup_s); in a relaunch
                 (`Watch.prior_step_times`: the step times the stage already measured at
                 this size), a stall pattern the heartbeats show is called on the steady
                 budget of those times, not after warmup_s (issue 39)
    steady       step_factor x p99 step time + floor_s; or, once the heartbeats show a
                 stall pattern, confirmed_floor_s in place of floor_s, on
                 - step_factor x the slowest rank's compute time per step (the phase the
                   rank is stuck in), when one rank still computes step S while its peers
                   wait in step S's collective (`stall_pattern`);
                 - step_factor x the median step time, when every rank has waited in the
                   same collective, of a step not yet reported, for longer than the p99
                   step takes whole (`collective_hang`): a hang inside the collective. The
                   median, not the p99: the heartbeats already rule out a slow step, and
                   on a noisy machine the p99 runs to 1.5 x the median (issue 28: within
                   3 step times + 2 s)
    exiting      every rank said "done" (or the deadline passed): exit_s to leave
    checkpoint   checkpoint_factor x the slowest save measured so far (or checkpoint_s)

`decide()` is a pure function of the observations and the time, so tests drive it with
made-up clocks; `Watch` keeps the observations of one attempt. `culprits()` reads the
per-node heartbeats and names the nodes to blame, each with its evidence:

- a rank whose heartbeat stopped (process frozen, SIGSTOPped, dead without exiting);
- a rank still computing step S while its peers wait in the collective of step S;
- a node whose heartbeat file never appeared or went stale (its local rank 0 is gone).
When no pattern singles a node out, the result is empty: the caller may run a drill.
"""

from __future__ import annotations

import bisect
import statistics
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field

from campaign.evidence import Suspect
from campaign.stagebase import StrictModel


class WatchdogPolicy(StrictModel):
    """Budgets of the stall watchdog (all seconds)."""

    startup_s: float = Field(default=300.0, gt=0)
    """From launch to the first reported step."""
    step_factor: float = Field(default=3.0, gt=0)
    """A steady-state stall is this many times the p99 step time without a new step..."""
    floor_s: float = Field(default=9.0, gt=0)
    """...plus this floor (absorbs logging intervals and noise; with the supervisor's poll it
    keeps detection within 3 step times + 10 s)."""
    confirmed_floor_s: float = Field(default=1.5, gt=0)
    """The floor when the heartbeats already show a stall pattern (a rank still computing
    step S, for step_factor x the slowest rank's compute time per step, while its peers wait
    in that step's collective; or every rank waiting in one collective for longer than the
    p99 step, for step_factor x the median step time): the wider floor waits for evidence
    that is then already there. By default one
    heartbeat interval (1 s: the evidence may be that old) and two of the supervisor's polls
    (0.25 s each), so that with the poll's own delay a hang is called within 3 step times +
    2 s (issue 28). Set it to floor_s to wait the full budget regardless."""
    checkpoint_s: float = Field(default=300.0, gt=0)
    """Budget of a checkpoint save before one has been measured."""
    checkpoint_factor: float = Field(default=3.0, gt=0)
    """Once saves were measured: this many times the slowest one (plus the floor)."""
    heartbeat_stale_s: float = Field(default=10.0, gt=0)
    """A rank whose heartbeat is older than this is considered frozen."""
    warmup_steps: int = Field(default=3, ge=0)
    """Steps after (re)start whose times are irregular (allocator, first collectives)."""
    warmup_s: float = Field(default=30.0, gt=0)
    """Budget per step during those warm-up steps. In a relaunch (the stage measured the step
    at this size before), a stall pattern the heartbeats show there is called on the measured
    step's budget instead; silence alone still waits this."""
    exit_s: float = Field(default=60.0, gt=0)
    """Once every rank is done, how long the launch may take to exit."""
    drill_s: float = Field(default=90.0, ge=0)
    """When a stall names no node: per bisection drill (a short collective test on half of the
    nodes), how long it may take before its half counts as hanging (0: no drill)."""
    straggler_ratio: float = Field(default=3.0, gt=1)
    """A node whose ranks compute this many times longer than the others' median is a straggler."""


@dataclass
class Decision:
    """What the watchdog concluded at one moment."""

    stalled: bool
    phase: str
    idle_s: float
    budget_s: float
    confirmed: str | None = None
    """The stall pattern the heartbeats showed ("compute" or "collective"), so the budget had
    the confirmed floor; None when they showed none."""

    @property
    def reason(self) -> str:
        how = {"compute": ", the heartbeats show who hangs",
               "collective": ", the heartbeats show every rank stuck in one collective"}.get(self.confirmed or "", "")
        return f"no new step for {self.idle_s:.1f} s in phase {self.phase} (budget {self.budget_s:.1f} s{how})"


@dataclass
class Watch:
    """Observations of one attempt, fed by the supervisor's loop."""

    started: float
    step_times: list[float] = field(default_factory=list)
    last_step: int = 0
    last_progress: float = 0.0
    checkpoint_saves: list[float] = field(default_factory=list)
    in_checkpoint_since: float | None = None
    exiting_since: float | None = None
    final_event: str | None = None
    steps_seen: int = 0
    rescue: bool = False
    """The trainer's `start` event said it answers a rescue request (campaign.train.rescue)."""
    compute_s: float | None = None
    """The slowest rank's compute time per step (the EMA its heartbeat carries: from the
    step's start until it joins the gradient collective), once the heartbeats have one."""
    prior_step_times: list[float] = field(default_factory=list)
    """Step times of earlier attempts of this stage at this size (the ledger's,
    `reads.measured_step_times`): until this attempt has steady steps of its own, its
    budgets start from them, so a hang in a relaunch's first steps is called as fast as
    one later on."""

    def __post_init__(self) -> None:
        self.last_progress = self.started

    def saw_steps(self, rows: list[dict[str, Any]], now: float) -> None:
        for r in rows:
            if int(r["step"]) > self.last_step:
                self.last_step = int(r["step"])
                self.last_progress = now
                self.steps_seen += 1
                if r.get("step_time_s") is not None:
                    self.step_times.append(float(r["step_time_s"]))

    def saw_events(self, events: list[dict[str, Any]], now: float) -> None:
        for e in events:
            if e.get("event") == "checkpoint_saved" and e.get("seconds") is not None:
                self.checkpoint_saves.append(float(e["seconds"]))
                self.last_progress = max(self.last_progress, now)
            if e.get("event") == "start":
                self.rescue = bool(e.get("rescue"))
            if e.get("event") == "checkpoint_loaded":
                self.last_progress = max(self.last_progress, now)
            if e.get("event") in ("done", "deadline", "nonfinite_loss"):
                self.exiting_since = self.exiting_since or now
                self.final_event = e["event"]

    def saw_compute(self, beats: dict[str, dict[str, Any]]) -> None:
        times = compute_times(beats)
        if times:
            self.compute_s = max(times.values())

    def saw_phases(self, phases: set[str], now: float) -> None:
        if phases == {"done"}:
            self.exiting_since = self.exiting_since or now
        if "checkpoint" in phases:
            self.in_checkpoint_since = self.in_checkpoint_since or now
        elif self.in_checkpoint_since is not None:
            self.in_checkpoint_since = None
            self.last_progress = max(self.last_progress, now)


def p99(values: list[float]) -> float:
    if len(values) < 2:
        return values[0] if values else 0.0
    return statistics.quantiles(values, n=100, method="inclusive")[98]


def _steady(w: Watch, policy: WatchdogPolicy) -> list[float]:
    """The last 200 step times after warm-up: the current regime (the first steps of an
    attempt, with allocator and collective warm-up, would inflate its statistics). Before
    this attempt has any past its warm-up, the earlier attempts' steady ones
    (`prior_step_times`), where there are any; else its warm-up steps."""
    own = w.step_times[policy.warmup_steps:]
    return (own or w.prior_step_times or w.step_times)[-200:]


def measured(w: Watch, policy: WatchdogPolicy) -> bool:
    """Whether the steady budgets have step times to stand on in this phase: this attempt is
    past its warm-up, or earlier attempts measured the step (a relaunch)."""
    return w.steps_seen > policy.warmup_steps or bool(w.prior_step_times)


def steady_p99(w: Watch, policy: WatchdogPolicy) -> float:
    """p99 of the current regime's step times (`_steady`)."""
    return p99(_steady(w, policy))


def steady_median(w: Watch, policy: WatchdogPolicy) -> float:
    """Median of the current regime's step times (`_steady`): its typical step."""
    steady = _steady(w, policy)
    return statistics.median(steady) if steady else 0.0


def decide(w: Watch, policy: WatchdogPolicy, now: float, confirmed: str | None = None) -> Decision:
    """Is the attempt stalled now? Pure: depends only on its arguments. `confirmed`: the
    stall pattern the heartbeats show, so the steady floor is `confirmed_floor_s`: "compute"
    (`stall_pattern`: the budget follows the stuck rank's compute time) or "collective"
    (`collective_hang`: step_factor x the median step time, the heartbeats having shown
    every rank in the collective for longer than the p99 step)."""
    idle = now - w.last_progress
    if w.exiting_since is not None:
        return Decision(now - w.exiting_since > policy.exit_s, "exiting", now - w.exiting_since, policy.exit_s)
    if w.in_checkpoint_since is not None:
        budget = checkpoint_budget(w, policy)
        since = max(w.in_checkpoint_since, w.last_progress)
        return Decision(now - since > budget, "checkpoint", now - since, budget)
    if w.last_step == 0:
        return Decision(idle > policy.startup_s, "startup", idle, policy.startup_s)
    floor = min(policy.confirmed_floor_s, policy.floor_s) if confirmed else policy.floor_s
    if confirmed == "compute":
        budget = pattern_s(w, policy) + floor
    elif confirmed == "collective" and floor < policy.floor_s:
        budget = policy.step_factor * steady_median(w, policy) + floor
    else:
        budget = policy.step_factor * steady_p99(w, policy) + floor
    if w.steps_seen <= policy.warmup_steps:
        if confirmed and floor < policy.floor_s and w.prior_step_times:
            # A relaunch: the heartbeats show the stall and earlier attempts measured the step.
            return Decision(idle > budget, "warmup", idle, budget, confirmed)
        return Decision(idle > max(budget, policy.warmup_s), "warmup", idle, max(budget, policy.warmup_s))
    return Decision(idle > budget, "steady", idle, budget, confirmed if floor < policy.floor_s else None)


def checkpoint_budget(w: Watch, policy: WatchdogPolicy, unmeasured: float | None = None) -> float:
    """How long a save may take: from the measured saves once there are any; before that
    `unmeasured` (default: the configured checkpoint_s)."""
    if w.checkpoint_saves:
        return max(w.checkpoint_saves) * policy.checkpoint_factor + policy.floor_s
    return policy.checkpoint_s if unmeasured is None else unmeasured


def early_budget(w: Watch, policy: WatchdogPolicy) -> float | None:
    """The steady budget with the confirmed floor: how long without a step before the
    heartbeats are worth reading for the stall pattern; None outside the steady phase."""
    if w.exiting_since is not None or w.in_checkpoint_since is not None or w.last_step == 0:
        return None
    if not measured(w, policy) or policy.confirmed_floor_s >= policy.floor_s:
        return None
    return pattern_s(w, policy) + policy.confirmed_floor_s


def pattern_s(w: Watch, policy: WatchdogPolicy) -> float:
    """How long a rank must go on computing a step its peers already wait in to count as
    stalled: step_factor x the slowest rank's compute time per step (the phase it is stuck
    in; on a 2.2 s step of which 0.6 s computes, 1.8 s rather than 6.6 s), or x the p99 step
    time until the heartbeats carry compute times."""
    p99 = steady_p99(w, policy)
    return policy.step_factor * (min(w.compute_s, p99) if w.compute_s else p99)


def stall_pattern(suspects: list[Suspect], w: Watch, policy: WatchdogPolicy) -> bool:
    """Whether `culprits()` found a rank computing the step its peers wait in, for at least
    `pattern_s`: a stall shown by the heartbeats, not just inferred from silence."""
    least = pattern_s(w, policy)
    return any(s.evidence.get("phase") == "compute" and s.evidence.get("stuck_s", 0) >= least
               for s in suspects)


def collective_hang(beats: dict[str, dict[str, Any]], active: list[str], w: Watch, policy: WatchdogPolicy) -> bool:
    """Whether every rank of every active node waits in the same collective, of a step after
    the last one reported, and has waited there, by its own latest heartbeat, for longer than
    the p99 step takes whole: the launch hangs inside that collective. The heartbeats cannot
    say which rank caused it (all look alike); the supervisor's drill may."""
    if w.last_step == 0 or not active:
        return False
    least = steady_p99(w, policy)
    steps = set()
    for node in active:
        ranks = (beats.get(node) or {}).get("ranks") or {}
        if not ranks:
            return False
        for r in ranks.values():
            if r.get("phase") != "collective" or r.get("step") is None or r.get("since") is None:
                return False
            if float(r.get("time", 0)) - float(r["since"]) < least:
                return False
            steps.add(int(r["step"]))
    return len(steps) == 1 and steps.pop() > w.last_step


def culprits(beats: dict[str, dict[str, Any]], active: list[str], now: float,
             policy: WatchdogPolicy) -> list[Suspect]:
    """Nodes to blame for a stall, each with why and its evidence; [] if none stands out."""
    out: list[Suspect] = []
    ranks = {node: b.get("ranks", {}) for node, b in beats.items()}
    waiting = {(r.get("step")) for rs in ranks.values() for r in rs.values() if r.get("phase") == "collective"}
    for node in active:
        b = beats.get(node)
        if b is None:
            out.append(Suspect(node, "no heartbeat from this node"))
            continue
        if now - float(b.get("time", 0)) > policy.heartbeat_stale_s:
            out.append(Suspect(node, f"node heartbeat stale for {now - float(b['time']):.0f} s",
                               {"heartbeat_age_s": round(now - float(b["time"]), 1)}))
            continue
        for rank, r in sorted(ranks[node].items(), key=lambda kv: int(kv[0])):
            age = now - float(r.get("time", 0))
            if age > policy.heartbeat_stale_s:
                out.append(Suspect(node, f"rank {rank} heartbeat stopped {age:.0f} s ago at step {r.get('step')}",
                                   {"rank": int(rank), "step": r.get("step"), "phase": r.get("phase"),
                                    "age_s": round(age, 1)}))
                break
            if r.get("phase") == "compute" and r.get("step") in waiting:
                stuck = now - float(r.get("since", now))
                out.append(Suspect(node, f"rank {rank} still computing step {r.get('step')} for {stuck:.0f} s "
                                   "while peers wait in its collective",
                                   {"rank": int(rank), "step": r.get("step"), "phase": "compute",
                                    "stuck_s": round(stuck, 1)}))
                break
    if len(out) == len(active) and len(active) > 1:
        return []  # everyone looks the same: no node stands out
    return out


def rank_nodes(beats: dict[str, dict[str, Any]]) -> dict[int, str]:
    """Where each rank runs, by the node its heartbeat comes from. Not always the launch
    order: srun sorts `--nodelist` ("the node names will be sorted by Slurm", man srun)."""
    return {int(r): node for node, b in beats.items() for r in (b.get("ranks") or {})}


def compute_times(beats: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Each node's compute time per step: its slowest rank's, before joining the gradient
    collective (an EMA the trainer keeps in its heartbeat); nodes without one are left out."""
    per_node = {}
    for node, b in beats.items():
        times = [float(r["compute_s"]) for r in b.get("ranks", {}).values() if r.get("compute_s") is not None]
        if times:
            per_node[node] = max(times)
    return per_node


def stragglers(beats: dict[str, dict[str, Any]], ratio: float) -> list[dict[str, Any]]:
    """Nodes whose compute time per step (`compute_times`) is `ratio` times the median of the
    other nodes'."""
    per_node = compute_times(beats)
    out = []
    if len(per_node) < 2:
        return out
    # The median of the others without building the others' list per node (that was
    # O(nodes^2): 10 s at 10,624 nodes): dropping one value from the sorted list moves the
    # median by at most one place, so it is read off the sorted list around the middle.
    ordered = sorted(per_node.values())
    m = len(ordered) - 1  # how many "others" each node has
    for node, t in sorted(per_node.items()):
        i = bisect.bisect_left(ordered, t)  # a position holding t; which copy does not matter

        def other(k: int) -> float:  # k-th smallest of `ordered` without position i
            return ordered[k if k < i else k + 1]

        median = other(m // 2) if m % 2 else (other(m // 2 - 1) + other(m // 2)) / 2
        if median > 0 and t >= ratio * median:
            out.append({"node": node, "ratio": round(t / median, 2), "compute_s": round(t, 4),
                        "others_median_s": round(median, 4)})
    return out
