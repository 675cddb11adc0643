"""executors/queues.py and the PBS sites' `site.queue` check: ALCF's queue tables as data."""

from __future__ import annotations

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
    # Aurora (https://docs.alcf.anl.gov/aurora/running-jobs-aurora/)
    ("aurora", "debug", 2, 1, True),
    ("aurora", "debug", 3, 1, False),            # debug: 1-2 nodes
    ("aurora", "debug", 1, 2, False),            # debug: 1 h at most
    ("aurora", "debug-scaling", 31, 1, True),
    ("aurora", "debug-scaling", 1, 1, False),    # debug-scaling: 2-31 nodes
    ("aurora", "prod", 2, 6, True),              # routed to tiny (1-512, 6 h)
    ("aurora", "prod", 512, 8, False),           # tiny: 6 h at most
    ("aurora", "prod", 528, 12, True),           # small (513-1024, 12 h)
    ("aurora", "prod", 2000, 24, True),          # large (1920-7500, 24 h)
    ("aurora", "prod", 8000, 1, False),
    # Polaris (https://docs.alcf.anl.gov/polaris/running-jobs/)
    ("polaris", "prod", 2, 1, False),            # prod: 10 nodes at least
    ("polaris", "prod", 10, 3, True),            # small (10-24, 3 h)
    ("polaris", "prod", 24, 4, False),
    ("polaris", "prod", 34, 2, True),            # medium (25-99, 6 h)
    ("polaris", "debug-scaling", 10, 1, True),
    ("polaris", "preemptable", 10, 72, True),
    ("polaris", "demand", 57, 1, False),
])
def test_queue_ranges(kind: str, queue: str, nodes: int, hours: float, ok: bool) -> None:
    problems, _ = queues.check(queues.TABLES[kind], queue, nodes, int(hours * H))
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
    assert "https://docs.alcf.anl.gov/polaris/running-jobs/" in text and "read 2026-12-01" in text
    assert "queues that take it: debug, debug-scaling" in text and "(q.yaml, line 5)" in text


def test_spares_count_towards_the_block() -> None:
    _load("  kind: aurora\n  account: p\n  nodes: 2\n")
    with pytest.raises(SpecError, match="3 nodes"):
        _load("  kind: aurora\n  account: p\n  nodes: 2\n  spares: 1\n")


def test_routing_names_the_execution_queue() -> None:
    with pytest.raises(SpecError, match="routes 512 nodes to 'tiny', which takes 1-512 nodes for 00:05:00 to 06:00:00"):
        _load("  kind: aurora\n  account: p\n  queue: prod\n  nodes: 512\n  walltime: '08:00:00'\n")


def test_defaults_validate_on_both_machines() -> None:
    for kind in ("aurora", "polaris"):
        site = _load(f"  kind: {kind}\n  account: p\n").site
        assert site.queue == "debug" and site.queue_warnings() == []


@pytest.mark.parametrize("site, warning", [
    ("  kind: polaris\n  account: p\n  queue: preemptable\n", "killed without warning"),
    ("  kind: polaris\n  account: p\n  queue: prod\n  nodes: 480\n  walltime: '12:00:00'\n", "476-496"),
    ("  kind: aurora\n  account: p\n  queue: prod\n  nodes: 7400\n", "7300-7500"),
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
        assert table.source.startswith("https://docs.alcf.anl.gov/") and table.checked == queues.CHECKED
        for q in table.queues + tuple(r for q in table.queues for r in q.routes):
            assert 1 <= q.min_nodes <= (q.soft_max_nodes or q.max_nodes) <= q.max_nodes
            assert 0 < q.min_walltime_s < q.max_walltime_s
        for q in table.queues:  # a routing queue's execution queues cover its node range
            if q.routes:
                assert q.routes[0].min_nodes == q.min_nodes and q.routes[-1].max_nodes == q.max_nodes
                assert all(a.max_nodes + 1 == b.min_nodes for a, b in zip(q.routes, q.routes[1:]))
