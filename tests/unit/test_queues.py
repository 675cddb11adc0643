"""executors/queues.py and the PBS sites' `site.queue` check: ALCF's queue tables as data."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from campaign import spec, walltime
from campaign.errors import SpecError
from campaign.executors import queues

REPO = Path(__file__).resolve().parents[2]
H = 3600


def _load(site: str) -> spec.CampaignSpec:
    return spec.loads(f"name: q\nsite:\n{site}stages:\n  - kind: smoke\n", "q.yaml")


@pytest.mark.parametrize("kind, queue, nodes, hours, ok", [
    # Aurora, from ALCF's rules as docs/sites.md quotes them (running-jobs-aurora.md @ 512a0056),
    # not from executors/queues.py: debug 1-2 nodes / 1 h; debug-scaling 2-256 / 1 h; prod from
    # 256 nodes, routing to small 256-1024 / 12 h, medium 1025-1999 / 18 h, large 2000-10,624 /
    # 24 h; capacity 1-16 / 7 days.
    ("aurora", "debug", 2, 1, True),
    ("aurora", "debug", 3, 1, False),            # debug: 1-2 nodes
    ("aurora", "debug", 1, 2, False),            # debug: 1 h at most
    ("aurora", "debug-scaling", 64, 1, True),    # debug-scaling: 2-256 (was 2-31)
    ("aurora", "debug-scaling", 256, 1, True),
    ("aurora", "debug-scaling", 257, 1, False),
    ("aurora", "debug-scaling", 1, 1, False),
    ("aurora", "prod", 8, 1, False),             # prod starts at 256 nodes (tiny is gone)
    ("aurora", "prod", 255, 6, False),
    ("aurora", "prod", 256, 12, True),           # small: 256-1024, 12 h
    ("aurora", "prod", 528, 13, False),
    ("aurora", "prod", 1950, 18, True),          # medium: 1025-1999, 18 h
    ("aurora", "prod", 1950, 20, False),
    ("aurora", "prod", 2000, 24, True),          # large: 2000-10,624, 24 h
    ("aurora", "prod", 10624, 24, True),
    ("aurora", "prod", 10625, 1, False),
    ("aurora", "prod-large", 2000, 24, None),    # gone: no longer in the table (warned, not checked)
    ("aurora", "capacity", 16, 168, True),       # capacity: 1-16 nodes, 7 days
    ("aurora", "capacity", 17, 1, False),
    ("aurora", "capacity", 1, 169, False),
    # Polaris (https://docs.alcf.anl.gov/polaris/running-jobs/)
    ("polaris", "prod", 2, 1, False),            # prod: 10 nodes at least
    ("polaris", "prod", 10, 3, True),            # small (10-24, 3 h)
    ("polaris", "prod", 24, 4, False),
    ("polaris", "prod", 34, 2, True),            # medium (25-99, 6 h)
    ("polaris", "debug-scaling", 10, 1, True),
    ("polaris", "preemptable", 10, 72, True),
    ("polaris", "demand", 57, 1, False),
])
def test_queue_ranges(kind: str, queue: str, nodes: int, hours: float, ok: bool | None) -> None:
    problems, warnings = queues.check(queues.TABLES[kind], queue, nodes, int(hours * H))
    if ok is None:  # not in the table: a warning says its limits are not checked
        assert problems == [] and any("not in the" in w for w in warnings), warnings
        return
    assert (problems == []) is ok, problems


def test_walltime_under_five_minutes_is_refused() -> None:
    problems, _ = queues.check(queues.AURORA, "debug", 1, 60)
    assert problems and "00:05:00 to 01:00:00" in problems[0]


def test_the_error_names_field_range_source_and_the_queues_that_fit() -> None:
    with pytest.raises(SpecError) as err:
        _load("  kind: polaris\n  account: p\n  queue: prod\n  nodes: 2\n")
    text = str(err.value)
    assert "site.queue: the block asks for 2 nodes (nodes + spares) for 01:00:00" in text
    assert "polaris queue 'prod' takes 10-476/496 nodes" in text
    assert "https://docs.alcf.anl.gov/polaris/running-jobs/" in text and "user-guides e30db64c of 2026-02-17" in text
    assert "queues that take it: debug, debug-scaling" in text and "(q.yaml, line 5)" in text


def test_spares_count_towards_the_block() -> None:
    _load("  kind: aurora\n  account: p\n  nodes: 2\n")
    with pytest.raises(SpecError, match="3 nodes"):
        _load("  kind: aurora\n  account: p\n  nodes: 2\n  spares: 1\n")


def test_routing_names_the_execution_queue() -> None:
    with pytest.raises(SpecError, match="routes 1950 nodes to 'medium', which takes 1025-1999 nodes for 00:05:00 "
                                       "to 18:00:00"):
        _load("  kind: aurora\n  account: p\n  queue: prod\n  nodes: 1950\n  walltime: '20:00:00'\n")


def test_a_small_prod_block_is_refused_with_the_queues_that_take_it() -> None:
    with pytest.raises(SpecError) as err:
        _load("  kind: aurora\n  account: p\n  queue: prod\n  nodes: 8\n  walltime: '01:00:00'\n")
    assert "aurora queue 'prod' takes 256-10624 nodes" in str(err.value)
    assert "queues that take it: debug-scaling, capacity" in str(err.value)


def test_defaults_validate_on_both_machines() -> None:
    for kind in ("aurora", "polaris"):
        site = _load(f"  kind: {kind}\n  account: p\n").site
        assert site.queue == "debug" and site.queue_warnings() == []


@pytest.mark.parametrize("site, warning", [
    ("  kind: polaris\n  account: p\n  queue: preemptable\n", "killed without warning"),
    ("  kind: polaris\n  account: p\n  queue: prod\n  nodes: 480\n  walltime: '12:00:00'\n", "476-496"),
    ("  kind: aurora\n  account: p\n  queue: R1234567\n", "not in the aurora queue table"),
])
def test_fuzzy_rules_warn_instead_of_refusing(site: str, warning: str) -> None:
    s = _load(site)
    assert any(warning in w and w.startswith("site.queue: ") for w in walltime.warnings(s)), walltime.warnings(s)


@pytest.mark.parametrize("example", sorted((REPO / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_fits_its_queue(example: Path) -> None:
    s = spec.load(example)
    assert [w for w in walltime.warnings(s) if w.startswith("site.queue")] == []


def test_every_queue_has_sane_numbers() -> None:
    for table in queues.TABLES.values():
        assert table.source.startswith("https://docs.alcf.anl.gov/") and table.checked == queues.CHECKED[table.machine]
        for q in table.queues + tuple(r for q in table.queues for r in q.routes):
            assert 1 <= q.min_nodes <= (q.soft_max_nodes or q.max_nodes) <= q.max_nodes
            assert 0 < q.min_walltime_s < q.max_walltime_s
        for q in table.queues:  # a routing queue's execution queues cover its node range
            if q.routes:
                assert q.routes[0].min_nodes == q.min_nodes and q.routes[-1].max_nodes == q.max_nodes
                assert all(a.max_nodes + 1 == b.min_nodes for a, b in zip(q.routes, q.routes[1:]))


# The pages' own rows, verbatim (the Notes column cut after the time limits), each page at the
# argonne-lcf/user-guides commit in queues.CHECKED. Aurora: docs/aurora/running-jobs-aurora.md @ 512a0056.
AURORA_ROWS = """\
| debug          | 1        | 2          | 5 min    | 1 hr             |
| debug-scaling  | 2        | 256        | 5 min    | 1 hr             |
| prod           | 256      | 10,624[^1] | 5 min    | 24 hrs           |
| capacity       | 1        | 16         | 5 min    | 7 days (168 hrs) |
| visualization  | 1        | 32         | 5 min    | 8 hrs            |
| small           | 256      | 1024       | 5 min    | 12 hrs   |
| medium          | 1025     | 1999       | 5 min    | 18 hrs   |
| large           | 2000     | 10,624[^1] | 5 min    | 24 hrs   |
"""
# Polaris: docs/polaris/running-jobs/index.md @ e30db64c.
POLARIS_ROWS = """\
| debug         | 1        | 2        | 5 min    | 1 hr     |
| debug-scaling | 1        | 10       | 5 min    | 1 hr     |
| prod          | 10       | 496      | 5 min    | 24 hrs   |
| *preemptable*   | 1        | 10       | 5 min    | 72 hrs   |
| *demand*        | 1        | 56       | 5 min    | 1 hr     |
| *capacity*        | 1        | 4       | 5 min    | 168 hrs     |
| small           | 10       | 24       | 5 min    | 3 hrs    ||
| medium          | 25       | 99       | 5 min    | 6 hrs    ||
| large           | 100      | 496      | 5 min    | 24 hrs   ||
"""


def _page_rows(text: str) -> dict[str, tuple[int, int, int, int]]:
    """name: (min nodes, max nodes, min walltime s, max walltime s) from the page's table rows."""
    def seconds(cell: str) -> int:
        m = re.search(r"(\d+) (min|hrs?)\)?$", cell.strip())
        assert m, cell
        return int(m.group(1)) * (60 if m.group(2) == "min" else 3600)

    rows = {}
    for line in text.splitlines():
        name, lo, hi, tmin, tmax = (c.strip() for c in line.strip("|").split("|")[:5])
        rows[name.strip("*")] = (int(lo), int(re.sub(r"\[.*\]|,", "", hi)), seconds(tmin), seconds(tmax))
    return rows


@pytest.mark.parametrize("machine, rows", [("aurora", AURORA_ROWS), ("polaris", POLARIS_ROWS)])
def test_every_queue_row_is_the_pages_row(machine: str, rows: str) -> None:
    table = queues.TABLES[machine]
    ours = {q.name: (q.min_nodes, q.max_nodes, q.min_walltime_s, q.max_walltime_s)
            for q in table.queues + tuple(r for q in table.queues for r in q.routes)}
    assert ours == _page_rows(rows)
