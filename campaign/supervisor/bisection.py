"""The bisection drill: after a stall the heartbeats cannot pin on a node, a short collective
drill (`campaign.train.drill`) on halves of the active nodes finds the nodes that hang it."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from campaign import rundir
from campaign.evidence import Suspect
from campaign.supervisor.launch import free_port, start

if TYPE_CHECKING:
    from campaign.attempt import AttemptRequest
    from campaign.watchdog import WatchdogPolicy

DRILL_REASON = "hung in a collective drill when bisecting the allocation"


def drill_suspects(request: AttemptRequest, active: list[str], policy: WatchdogPolicy,
                   stall: str | None) -> tuple[list[Suspect], str]:
    """The nodes the drill blames, and `stall` with the drill's result in words added."""
    drill_log: list[dict[str, Any]] = []
    suspects = [Suspect(n, DRILL_REASON, {"drills": drills}) for n, drills in _bisect(request, active, policy, drill_log)]
    return suspects, f"{stall}; {drill_summary(drill_log, suspects, policy.drill_s)}"


def drill_summary(log: list[dict[str, Any]], suspects: list[Suspect], drill_s: float) -> str:
    """The bisection drill's result in words: which subsets passed, and what it blamed."""
    runs = ", ".join(f"{'+'.join(d['nodes'])} {'passed' if d['ok'] else 'hung'}" for d in log)
    if suspects:
        return f"collective drill ({drill_s:g} s each): {runs}; suspects: {', '.join(s.node for s in suspects)}"
    return (f"collective drill ({drill_s:g} s each): {runs}; no node hangs it: the hang is the trainer's, not a "
            "node's or the network's")


def _bisect(request: AttemptRequest, active: list[str], policy: WatchdogPolicy,
            log: list[dict[str, Any]] | None = None) -> list[tuple[str, list[dict[str, Any]]]]:
    """Nodes whose subset hangs a short collective drill, found by halving (instead of blind
    rotation). The two halves are disjoint node sets, so their drills run at once: a round
    costs one drill's time, not two. A single-rank subset tests the node's own stack, not its
    network."""
    log = [] if log is None else log
    if len(active) < 2:
        return []
    half = len(active) // 2
    parts = [active[:half], active[half:]]
    results = _drills(request, parts, policy)
    log.extend({"nodes": part, "ok": ok} for part, ok in zip(parts, results))
    bad: list[tuple[str, list[dict[str, Any]]]] = []
    for part, ok in zip(parts, results):
        if not ok:
            bad += [(part[0], list(log))] if len(part) == 1 else _bisect(request, part, policy, log)
    return bad


def _drills(request: AttemptRequest, parts: list[list[str]], policy: WatchdogPolicy) -> list[bool]:
    """Run `campaign.train.drill` on each node set of `parts` at the same time, each with the
    attempt's launch plan on its own port; True for each that passed within drill_s."""
    launches = []
    for part in parts:
        drill_dir = rundir.drill_dir(Path(request.run_dir), part)
        (drill_dir / rundir.LOGS_DIR).mkdir(parents=True, exist_ok=True)
        sub = request.for_drill(drill_dir, free_port())
        sub.hostfile.write_text("".join(f"{h}\n" for h in part))
        launches.append(start(sub, sub.launch_plan(part))[0])
    end = time.time() + policy.drill_s
    while not all(launch.done for launch in launches) and time.time() < end:
        time.sleep(0.2)
        for launch in launches:
            launch.poll(time.time())
    passed = [launch.done and all(code == 0 for code, _ in launch.exits.values()) for launch in launches]
    for launch in launches:
        if not launch.done:
            launch.stop(time.time)
    return passed
