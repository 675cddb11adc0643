"""The rescue checkpoint: before the supervisor stops a launch after a crash or a stall, one
replica on a healthy node is asked to save (`campaign.train.rescue`), so the relaunch loses
no step."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Set
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from campaign import exits, report, watchdog
from campaign.train import rescue as rescue_files

if TYPE_CHECKING:
    from campaign.attempt import AttemptRequest
    from campaign.supervisor.launch import _Launch

RESCUE_WAIT_S = 60.0
"""How long a rescue save may take before any checkpoint's time was measured."""
NOT_FAULTS = frozenset({exits.SIGTERM, exits.NONFINITE, exits.NO_RETRY, exits.BROKEN_ENV})
"""Exits after which no rescue is asked for: the deadline (the trainer checkpointed), a
diverged or misconfigured run, an environment that cannot train."""


@dataclass(frozen=True)
class RescueResult:
    """What came of a rescue request: the rescuer's answer (`rescue.json`: saved, step, ... or
    why not), which rank was asked, when, and how long the supervisor waited."""

    answer: dict[str, Any]
    rank: int = -1
    asked_at: float | None = None
    """None: no rank could be asked (every one is on a suspect node)."""
    waited_s: float = 0.0

    def stopped_rescuer(self, rank: int, seen: float) -> bool:
        """Whether the exit of `rank` seen at `seen` is the rescuer's, after it was asked: no
        evidence against its node (it worked on after its peer failed)."""
        return self.asked_at is not None and rank == self.rank and seen >= self.asked_at

    def to_dict(self) -> dict[str, Any]:
        """The report's `rescue` (JSON-able)."""
        if self.asked_at is None:
            return dict(self.answer)
        return {**self.answer, "rank": self.rank, "asked_at": self.asked_at, "waited_s": self.waited_s}


def _rescue(launch: _Launch, request: AttemptRequest, active: list[str], watch: watchdog.Watch,
            beats: dict[str, dict[str, Any]], *,
            avoid_nodes: Set[str], avoid_ranks: Set[Any]) -> RescueResult:
    """Ask one replica on a healthy node to save a rescue checkpoint (campaign.train.rescue):
    write the request, SIGUSR1 the launch, wait for `rescue.json` (bounded by the checkpoint
    budget). Every rank reads the request; the others, lingering after a lost peer, exit.
    `beats`: the heartbeats as just read (they say where each rank runs)."""
    run_dir = Path(request.run_dir)
    rank = _rescuer(launch, request, active, avoid_nodes, avoid_ranks, watchdog.rank_nodes(beats))
    t0 = time.time()
    report.write_json_atomic(run_dir / rescue_files.REQUEST_FILE, {"rank": rank})
    launch.notify(signal.SIGUSR1)
    if rank < 0:
        return RescueResult({"saved": False, "why": "no surviving rank outside the suspect nodes"})
    budget = watchdog.checkpoint_budget(watch, request.watchdog, unmeasured=RESCUE_WAIT_S)
    result = run_dir / rescue_files.RESULT_FILE
    while time.time() - t0 < budget and not result.exists():
        time.sleep(0.05)
        launch.poll(time.time())
        if launch.done:
            break
    try:
        out = json.loads(result.read_text())
    except (OSError, ValueError):
        out = {"rank": rank, "saved": False, "why": f"rank {rank} did not answer within {budget:.0f} s"}
    return RescueResult(out, rank, t0, round(time.time() - t0, 3))


def _rescuer(launch: _Launch, request: AttemptRequest, active: list[str], avoid_nodes: Set[str],
             avoid_ranks: Set[Any], placed: dict[int, str] | None = None) -> int:
    """The lowest rank still running on a node not under suspicion, or -1. Where a rank runs:
    its own process (local launcher), else the node its heartbeat comes from (`placed`:
    `watchdog.rank_nodes`), else the launch order, which srun does not keep: seen in the
    goodput benchmark, a hang on n3 (active [n3, n1]) left no rescuer, both ranks taken for n3's."""
    local = {rank: (node, i) for i, (rank, node, _) in enumerate(launch.procs) if rank >= 0}
    placed = placed or {}
    for rank in range(len(active) * request.ranks_per_node):
        node, i = local.get(rank, (placed.get(rank, active[rank // request.ranks_per_node]), None))
        if node in avoid_nodes or rank in avoid_ranks or (i is not None and i in launch.exits):
            continue
        return rank
    return -1
