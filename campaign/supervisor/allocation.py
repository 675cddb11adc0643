"""The nodes an attempt runs on: the block's node list less the ledger's exclusions, the
active nodes (rotated for a confirming retry) and the spares; the hostfile and the trainer's
deadline written before the launch."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from campaign import exits, names, report
from campaign.attempt import AttemptReport
from campaign.exits import ExitClass

if TYPE_CHECKING:
    from campaign.attempt import AttemptRequest


class Nodes(NamedTuple):
    """Where an attempt runs: the block's nodes, the active ones (rank order) and the spares."""

    allocation: list[str]
    active: list[str]
    spares: list[str]


def choose(request: AttemptRequest) -> Nodes | AttemptReport:
    """The attempt's nodes, or the report of an attempt that cannot start (a node list no
    launcher can take, too few usable nodes: `config_error`)."""
    try:
        allocation = list(request.allocation or block_nodes())
    except ValueError as e:  # the scheduler named a node no launcher can take
        return AttemptReport(exit_code=exits.NO_RETRY, exit_class=ExitClass.CONFIG_ERROR, duration_s=0.0, nodes=[], error=str(e))
    excluded = set(request.exclude)
    usable = [h for h in allocation if h not in excluded]
    n = request.nodes
    if len(usable) < n:
        msg = (f"the stage asks for {n} active node(s), but the block has {len(usable)} usable of {len(allocation)} "
               f"({len(allocation) - len(usable)} excluded); ask for fewer nodes, more spares, or lift exclusions "
               "with `campaign nodes include`")
        return AttemptReport(exit_code=exits.NO_RETRY, exit_class=ExitClass.CONFIG_ERROR, duration_s=0.0, nodes=[],
                             allocation=allocation, error=msg, short_of_nodes=True)
    active, spares = usable[:n], usable[n:]
    if request.rotate:
        active = active[request.rotate % n:] + active[:request.rotate % n]
    return Nodes(allocation, active, spares)


def block_nodes() -> list[str]:
    """The nodes of the block this worker runs in, in the scheduler's order, one per line of
    its node file. A line that is not a node name (`names.node_problem`: a control
    character, a space) is a ValueError naming the file and the line."""
    nodefile = os.environ.get("PBS_NODEFILE")
    if nodefile and Path(nodefile).exists():
        return _node_lines(Path(nodefile).read_text(errors="replace"), f"PBS_NODEFILE {nodefile}")
    nodelist = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST")
    if nodelist:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True)
        return _node_lines(out.stdout, f"`scontrol show hostnames {nodelist!r}`")
    return [socket.gethostname()]


def _node_lines(text: str, source: str) -> list[str]:
    seen: dict[str, None] = {}
    for number, line in enumerate(text.split("\n"), 1):  # not splitlines(): it splits at \x1c, \x85 too
        node = line.strip()
        if not node:
            continue
        why = names.node_problem(node)
        if why is not None:
            raise ValueError(f"{source}, line {number}: {node!r} {why}; the scheduler's node list is not usable")
        seen.setdefault(node, None)
    return list(seen)


def prepare(request: AttemptRequest, active: list[str]) -> None:
    """Hostfile of the active nodes; the block's deadline into the trainer's config."""
    request.hostfile.write_text("".join(f"{h}\n" for h in active))
    walltime = request.block_walltime_s
    if walltime:
        config_path = request.config_path
        cfg = json.loads(config_path.read_text())
        started = time.time() if request.deadline_from == "attempt" else _block_started()
        cfg["run"]["deadline_unix"] = started + float(walltime)
        report.write_json_atomic(config_path, cfg)


def _block_started() -> float:
    """When this block's job started: the Parsl worker pool is the block's first process."""
    try:
        import psutil

        return float(psutil.Process(os.getppid()).create_time())
    except Exception:  # no psutil or no parent: the attempt's start is a safe lower bound
        return time.time()
