"""PBS queue limits of the ALCF machines, as data, with where and when they were read.

    problems, warnings = check(TABLES["aurora"], "prod", nodes=528, walltime_s=6 * 3600)

A block (`nodes + spares` nodes for `walltime`) outside its queue's node or time range is
refused by `qsub` (or sits in the queue forever); spec validation refuses it first, naming
the range and the page. A routing queue (`prod`) is checked against the execution queue
its size routes to (small/medium/large). Where ALCF's own numbers are a range or a
recommendation (Polaris' "476-486 nodes" advice) or a queue
is by request or preemptable, it is a warning, not a refusal. A queue not in the table (a
reservation `R123456`, a new queue) is not checked (a warning says so).

The tables change: re-read a page (argonne-lcf/user-guides, `git log -- <page>`) and update its
`CHECKED` commit and its numbers together.
Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Queue", "QueueTable", "TABLES", "check", "fitting"]

CHECKED = {"aurora": "user-guides 512a0056 of 2026-07-27", "polaris": "user-guides e30db64c of 2026-02-17"}
"""The argonne-lcf/user-guides commit (and its date) of each page the tables follow: the page's
newest commit in the copy read on 2026-12-07 (its newest commit overall is of 2026-08-19)."""


@dataclass(frozen=True)
class Queue:
    """One queue's limits: nodes min..max, walltime min..max (seconds)."""

    name: str
    min_nodes: int
    max_nodes: int
    max_walltime_s: int
    min_walltime_s: int = 300  # "Time Min 5 min" for every ALCF queue
    soft_max_nodes: int | None = None
    """Above this (and up to max_nodes) ALCF's own number is a range or advice: warn."""
    routes: tuple[Queue, ...] = ()
    """Execution queues a routing queue sends a job to, by node count (backfill twins omitted)."""
    note: str = ""
    """A warning for every block in this queue (by request only, preemptable, ...)."""


@dataclass(frozen=True)
class QueueTable:
    machine: str
    source: str
    checked: str
    queues: tuple[Queue, ...]

    def get(self, name: str) -> Queue | None:
        return next((q for q in self.queues if q.name == name), None)

    def cite(self) -> str:
        return f"ALCF, {self.source}, {self.checked}"


_H = 3600

# https://docs.alcf.anl.gov/aurora/running-jobs-aurora/ "Queues" (docs/aurora/running-jobs-aurora.md
# @ 512a0056, 2026-07-27; rows quoted in tests/unit/test_queues.py and docs/sites.md): debug 1-2
# nodes / 1 h and debug-scaling 2-256 / 1 h (both rows as of ad0fb920, 2026-02-18); prod, a routing
# queue from 256 nodes to small 256-1024 / 12 h (e30db64c, 2026-02-17), medium 1025-1999 / 18 h and
# large 2000-10,624 / 24 h (9cf0711a, 2026-06-19); capacity 1-16 nodes / 168 h ("Max of 512 nodes
# across all jobs": ccc0c97b, 2026-06-29); visualization 1-32 / 8 h by request. tiny went in
# e30db64c, prod-large in bdf65a90 (2026-04-28). backfill-* (negative balance) are left out.
AURORA = QueueTable("aurora", "https://docs.alcf.anl.gov/aurora/running-jobs-aurora/", CHECKED["aurora"], (
    Queue("debug", 1, 2, 1 * _H),
    Queue("debug-scaling", 2, 256, 1 * _H),
    Queue("prod", 256, 10624, 24 * _H, routes=(
        Queue("small", 256, 1024, 12 * _H),
        Queue("medium", 1025, 1999, 18 * _H),
        Queue("large", 2000, 10624, 24 * _H),
    )),
    Queue("capacity", 1, 16, 168 * _H),
    Queue("visualization", 1, 32, 8 * _H, note="visualization is by request only, on non-exclusive nodes"),
))

# https://docs.alcf.anl.gov/polaris/running-jobs/ "Queues" (argonne-lcf/user-guides
# docs/polaris/running-jobs/index.md @ e30db64c, 2026-02-17). prod routes to small/medium/large;
# Note 4: "it is recommended to submit jobs with a maximum node count of 476-486 nodes
# given current rates of downed nodes (larger jobs may sit in the queue indefinitely)".
POLARIS = QueueTable("polaris", "https://docs.alcf.anl.gov/polaris/running-jobs/", CHECKED["polaris"], (
    Queue("debug", 1, 2, 1 * _H),
    Queue("debug-scaling", 1, 10, 1 * _H),
    Queue("prod", 10, 496, 24 * _H, soft_max_nodes=476, routes=(
        Queue("small", 10, 24, 3 * _H),
        Queue("medium", 25, 99, 6 * _H),
        Queue("large", 100, 496, 24 * _H, soft_max_nodes=476),
    )),
    Queue("preemptable", 1, 10, 72 * _H,
          note="preemptable jobs can be killed without warning when demand jobs arrive; add "
               "`#PBS -r y` to scheduler_options so PBS reruns the block"),
    Queue("demand", 1, 56, 1 * _H, note="demand is by request only"),
    Queue("capacity", 1, 4, 168 * _H, note="capacity allows 1 running job per user, 32 nodes across all jobs"),
))

TABLES: dict[str, QueueTable] = {"aurora": AURORA, "polaris": POLARIS}
"""Queue tables by site kind."""


def _hms(seconds: int) -> str:
    return f"{seconds // 3600:02d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def _range(q: Queue) -> str:
    nodes = f"{q.min_nodes}-{q.soft_max_nodes}/{q.max_nodes}" if q.soft_max_nodes else f"{q.min_nodes}-{q.max_nodes}"
    return f"{nodes} nodes for {_hms(q.min_walltime_s)} to {_hms(q.max_walltime_s)}"


def _fits(q: Queue, nodes: int, walltime_s: int) -> bool:
    if not (q.min_nodes <= nodes <= q.max_nodes and q.min_walltime_s <= walltime_s <= q.max_walltime_s):
        return False
    return not q.routes or any(_fits(r, nodes, walltime_s) for r in q.routes)


def fitting(table: QueueTable, nodes: int, walltime_s: int) -> list[str]:
    """The queues (no notes attached: open to everyone, not preemptable) that take the block."""
    return [q.name for q in table.queues if not q.note and _fits(q, nodes, walltime_s)]


def check(table: QueueTable, queue: str, nodes: int, walltime_s: int) -> tuple[list[str], list[str]]:
    """(problems, warnings) for a block of `nodes` nodes and `walltime_s` seconds in `queue`."""
    q = table.get(queue)
    if q is None:
        known = ", ".join(x.name for x in table.queues)
        return [], [f"queue {queue!r} is not in the {table.machine} queue table ({known}; {table.cite()}): "
                    "its node and walltime limits are not checked"]
    where = f"{nodes} nodes (nodes + spares) for {_hms(walltime_s)}"
    alternatives = [n for n in fitting(table, nodes, walltime_s) if n != queue]
    hint = f"; queues that take it: {', '.join(alternatives)}" if alternatives else ""
    problems: list[str] = []
    warnings = [q.note] if q.note else []
    if not (q.min_nodes <= nodes <= q.max_nodes and q.min_walltime_s <= walltime_s <= q.max_walltime_s):
        problems.append(f"the block asks for {where}, but {table.machine} queue {queue!r} takes "
                        f"{_range(q)} ({table.cite()}){hint}")
    elif q.routes:
        sub = [r for r in q.routes if r.min_nodes <= nodes <= r.max_nodes]
        if sub and not any(_fits(r, nodes, walltime_s) for r in sub):
            r = sub[0]
            problems.append(f"the block asks for {where}, but {queue!r} routes {nodes} nodes to {r.name!r}, which "
                            f"takes {_range(r)} ({table.cite()}){hint}")
    if not problems and q.soft_max_nodes and nodes > q.soft_max_nodes:
        warnings.append(f"{nodes} nodes in {queue!r}: ALCF gives the largest size as a range or advice "
                        f"({q.soft_max_nodes}-{q.max_nodes}; {table.cite()}); a block this large may wait in the "
                        "queue indefinitely")
    return problems, warnings
