"""Which rank is asked for the rescue checkpoint when the launcher places ranks itself.

srun sorts `--nodelist` ("The order of the node names in the list is not important; the
node names will be sorted by Slurm": man srun, -w/--nodelist), so after an exclusion or a
rotation the attempt's `active` order ([n3, n1]) is not where the ranks run (rank 0 on n1,
rank 1 on n3). The ranks' heartbeats say where each runs. Faked boundary: the launch's
process table (one srun process, rank -1) and the heartbeats' rank -> node map."""

from __future__ import annotations

from types import SimpleNamespace

from campaign.supervisor import _rescuer


def srun_launch(node: str) -> SimpleNamespace:
    return SimpleNamespace(procs=[(-1, node, None)], exits={})


def test_the_rescuer_is_found_where_the_heartbeats_place_the_ranks() -> None:
    request = SimpleNamespace(ranks_per_node=1)
    active = ["n3", "n1"]
    # rank 1 hangs on n3 (its heartbeat says so): n3 and rank 1 are avoided.
    placed = {0: "n1", 1: "n3"}
    assert _rescuer(srun_launch("n3"), request, active, {"n3"}, {1}, placed) == 0
    # Without the heartbeats the launch order is all there is: rank 0 taken for n3's.
    assert _rescuer(srun_launch("n3"), request, active, {"n3"}, {1}) == -1


def test_the_launch_order_still_serves_ranks_without_a_heartbeat() -> None:
    request = SimpleNamespace(ranks_per_node=2)
    active = ["n1", "n2"]
    assert _rescuer(srun_launch("n1"), request, active, {"n1"}, set(), {0: "n1"}) == 2
    assert _rescuer(srun_launch("n1"), request, active, {"n1", "n2"}, set(), {}) == -1
