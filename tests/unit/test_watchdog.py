"""The stall watchdog's pure decision with an injected clock, and culprit finding from heartbeats."""

from __future__ import annotations

from campaign.watchdog import (Watch, WatchdogPolicy, collective_hang, culprits, decide, early_budget,
                               stall_pattern, stragglers)

POLICY = WatchdogPolicy(startup_s=100, step_factor=3, floor_s=10, warmup_steps=0, checkpoint_s=50)


def steady(now: float = 0.0, step_s: float = 1.0, n: int = 20) -> Watch:
    w = Watch(started=now)
    w.saw_steps([{"step": i, "step_time_s": step_s} for i in range(1, n + 1)], now)
    return w


def test_startup_budget_until_the_first_step() -> None:
    w = Watch(started=0.0)
    assert not decide(w, POLICY, 99.0).stalled
    d = decide(w, POLICY, 101.0)
    assert d.stalled and d.phase == "startup" and "budget 100.0 s" in d.reason


def test_steady_budget_is_k_times_p99_plus_floor() -> None:
    w = steady(step_s=2.0)
    assert not decide(w, POLICY, 15.9).stalled  # 3 x 2 + 10 = 16
    d = decide(w, POLICY, 16.1)
    assert d.stalled and d.phase == "steady" and d.budget_s == 16.0


def test_new_steps_reset_the_clock() -> None:
    w = steady()
    w.saw_steps([{"step": 21, "step_time_s": 1.0}], 12.0)
    assert not decide(w, POLICY, 24.0).stalled
    assert decide(w, POLICY, 25.1).stalled


def test_checkpoint_phase_uses_measured_saves() -> None:
    w = steady()
    w.saw_events([{"event": "checkpoint_saved", "seconds": 4.0}], 0.0)
    w.saw_phases({"checkpoint"}, 1.0)
    assert not decide(w, POLICY, 22.9).stalled  # 3 x 4 + 10 = 22 after 1.0
    assert decide(w, POLICY, 23.1).phase == "checkpoint" and decide(w, POLICY, 23.1).stalled


def test_a_job_that_is_exiting_gets_the_exit_budget() -> None:
    w = steady()
    w.saw_phases({"done"}, 5.0)
    assert not decide(w, POLICY, 60.0).stalled
    assert decide(w, POLICY, 66.0).phase == "exiting"


def test_warmup_steps_get_the_warmup_budget() -> None:
    policy = POLICY.model_copy(update={"warmup_steps": 3, "warmup_s": 30})
    w = steady(n=2, step_s=0.1)
    assert not decide(w, policy, 29.0).stalled
    assert decide(w, policy, 31.0).phase == "warmup"


def beat(node: str, now: float, ranks: dict[int, tuple[int, str, float]]) -> dict[str, object]:
    return {"node": node, "time": now, "ranks": {str(r): {"step": s, "phase": p, "since": since, "time": now}
                                                 for r, (s, p, since) in ranks.items()}}


def test_culprit_is_the_rank_computing_while_peers_wait() -> None:
    now = 100.0
    beats = {"n0": beat("n0", now, {0: (25, "collective", 80.0)}), "n1": beat("n1", now, {1: (25, "compute", 79.0)}),
             "n2": beat("n2", now, {2: (25, "collective", 80.0)})}
    found = culprits(beats, ["n0", "n1", "n2"], now, POLICY)
    assert [c.node for c in found] == ["n1"]
    assert "rank 1 still computing step 25 for 21 s" in found[0].reason


def test_culprit_is_a_node_whose_heartbeat_stopped() -> None:
    now = 100.0
    beats = {"n0": beat("n0", now, {0: (7, "collective", 90.0)}), "n1": beat("n1", 60.0, {1: (7, "compute", 50.0)})}
    found = culprits(beats, ["n0", "n1"], now, POLICY)
    assert [c.node for c in found] == ["n1"] and "stale for 40 s" in found[0].reason


def test_missing_heartbeat_names_the_node() -> None:
    found = culprits({"n0": beat("n0", 10.0, {0: (0, "init", 0.0)})}, ["n0", "n1"], 10.0, POLICY)
    assert [c.node for c in found] == ["n1"]


def test_no_culprit_when_everyone_looks_alike() -> None:
    now = 100.0
    beats = {n: beat(n, now, {i: (25, "collective", 80.0)}) for i, n in enumerate(["n0", "n1", "n2"])}
    assert culprits(beats, ["n0", "n1", "n2"], now, POLICY) == []


def test_straggler_ratio_against_the_other_nodes() -> None:
    beats = {n: {"ranks": {"0": {"compute_s": t}}} for n, t in {"a": 0.1, "b": 0.11, "c": 0.5}.items()}
    found = stragglers(beats, 3.0)
    assert [s["node"] for s in found] == ["c"] and found[0]["ratio"] >= 4.5


def test_straggler_median_of_the_others_matches_the_plain_definition() -> None:
    import random
    import statistics

    rng = random.Random(7)
    for _ in range(500):
        times = {f"n{i}": rng.choice([0.0, 0.1, 0.1, 0.3, 1.0, rng.random()]) for i in range(rng.randint(0, 8))}
        beats = {n: {"ranks": {"0": {"compute_s": t}}} for n, t in times.items()}
        want = [n for n, t in sorted(times.items()) if len(times) > 1
                and (m := statistics.median([v for k, v in times.items() if k != n])) > 0 and t >= 3.0 * m]
        assert [s["node"] for s in stragglers(beats, 3.0)] == want


def test_the_stall_pattern_shortens_the_steady_floor_and_only_then() -> None:
    policy = POLICY.model_copy(update={"confirmed_floor_s": 2.0})
    w = steady(step_s=1.0)  # budget 3 x 1 + 10 = 13 s; confirmed 3 x 1 + 2 = 5 s
    assert early_budget(w, policy) == 5.0
    assert not decide(w, policy, 5.5).stalled
    d = decide(w, policy, 5.5, confirmed="compute")
    assert d.stalled and d.budget_s == 5.0 and "heartbeats show who hangs" in d.reason
    # The evidence: rank 1 of n1 computes step 21 while n0's rank waits in step 21's collective.
    beats = {"n0": beat("n0", 5.5, {0: (21, "collective", 0.4)}), "n1": beat("n1", 5.5, {1: (21, "compute", 0.0)})}
    found = culprits(beats, ["n0", "n1"], 5.5, policy)
    assert [s.node for s in found] == ["n1"] and stall_pattern(found, w, policy)
    # Not yet 3 step times in that step (a slow step, not a hang): no pattern.
    young = {"n0": beat("n0", 5.5, {0: (21, "collective", 4.0)}), "n1": beat("n1", 5.5, {1: (21, "compute", 4.0)})}
    assert not stall_pattern(culprits(young, ["n0", "n1"], 5.5, policy), w, policy)
    # Everyone in the collective (a hang inside it): nobody stands out, the full floor applies.
    inside = {"n0": beat("n0", 5.5, {0: (21, "collective", 0.4)}), "n1": beat("n1", 5.5, {1: (21, "collective", 0.5)})}
    assert not stall_pattern(culprits(inside, ["n0", "n1"], 5.5, policy), w, policy)
    # Outside the steady phase (warm-up, checkpoint, startup) there is no early budget.
    w.saw_phases({"checkpoint"}, 5.0)
    assert early_budget(w, policy) is None
    assert early_budget(Watch(started=0.0), policy) is None
    assert early_budget(steady(), policy.model_copy(update={"confirmed_floor_s": 10.0})) is None


def test_the_stall_pattern_budget_follows_the_slowest_ranks_compute_time() -> None:
    """A 2 s step of which the slowest rank computes 0.5 s (the rest is the gradient
    collective): a rank still computing after 3 x 0.5 s while its peers wait is stalled,
    without waiting 3 x 2 s."""
    policy = POLICY.model_copy(update={"confirmed_floor_s": 2.0})
    w = steady(step_s=2.0)
    assert early_budget(w, policy) == 8.0  # no compute times yet: 3 x 2 + 2
    w.saw_compute({"n0": beat("n0", 0.0, {0: (20, "compute", 0.0)}),
                   "n1": {"ranks": {"1": {"compute_s": 0.5}, "2": {"compute_s": 0.3}}}})
    assert w.compute_s == 0.5
    assert early_budget(w, policy) == 3.5
    d = decide(w, policy, 3.6, confirmed="compute")
    assert d.stalled and d.budget_s == 3.5 and "heartbeats show who hangs" in d.reason
    assert not decide(w, policy, 3.6).stalled, "without the pattern the full budget applies"
    waiting = beat("n0", 3.6, {0: (21, "collective", 2.0)})
    stuck = {"n0": waiting, "n1": beat("n1", 3.6, {1: (21, "compute", 2.0)})}  # computing for 1.6 s
    assert stall_pattern(culprits(stuck, ["n0", "n1"], 3.6, policy), w, policy)
    slow = {"n0": waiting, "n1": beat("n1", 3.6, {1: (21, "compute", 2.2)})}  # 1.4 s: a slow step
    assert not stall_pattern(culprits(slow, ["n0", "n1"], 3.6, policy), w, policy)
    # A node that always computes longer (a straggler) raises the bar for everyone.
    w.saw_compute({"n1": {"ranks": {"1": {"compute_s": 1.5}}}})
    assert early_budget(w, policy) == 6.5
    assert not stall_pattern(culprits(stuck, ["n0", "n1"], 3.6, policy), w, policy)


def test_every_rank_stuck_in_one_collective_is_a_hang_at_three_step_times_plus_the_confirmed_floor() -> None:
    """A hang inside the collective: every rank waits in step 21's all-reduce (the last row
    was step 20 at t=0). Detection within 3 step times + 2 s (issue 28), not + the 10 s floor;
    nobody is named (they all look alike: the drill's job)."""
    policy = POLICY.model_copy(update={"confirmed_floor_s": 2.0})
    w = steady(step_s=1.0)  # last step 20, reported at t=0
    inside = {"n0": beat("n0", 5.1, {0: (21, "collective", 0.3)}), "n1": beat("n1", 5.1, {1: (21, "collective", 0.4)})}
    assert collective_hang(inside, ["n0", "n1"], w, policy)
    assert culprits(inside, ["n0", "n1"], 5.1, policy) == []
    assert not decide(w, policy, 4.9, confirmed="collective").stalled
    d = decide(w, policy, 5.1, confirmed="collective")
    assert d.stalled and d.budget_s == 5.0 and "every rank stuck in one collective" in d.reason
    assert not decide(w, policy, 5.1).stalled, "without the heartbeats the full floor applies (3 + 10 s)"
    # Not a hang (yet): one rank entered the collective only 0.5 s ago by its own heartbeat.
    late = {**inside, "n1": beat("n1", 5.1, {1: (21, "collective", 4.6)})}
    assert not collective_hang(late, ["n0", "n1"], w, policy)
    # One rank still computes: that is the compute pattern, not this one.
    computing = {**inside, "n1": beat("n1", 5.1, {1: (21, "compute", 0.4)})}
    assert not collective_hang(computing, ["n0", "n1"], w, policy)
    # Ranks in the collectives of different steps, or of the step already reported: no.
    apart = {**inside, "n1": beat("n1", 5.1, {1: (22, "collective", 0.4)})}
    assert not collective_hang(apart, ["n0", "n1"], w, policy)
    old = {n: beat(n, 5.1, {i: (20, "collective", 0.3)}) for i, n in enumerate(["n0", "n1"])}
    assert not collective_hang(old, ["n0", "n1"], w, policy)
    # An active node without a heartbeat: not every rank is seen waiting.
    assert not collective_hang({"n0": inside["n0"]}, ["n0", "n1"], w, policy)
    # Before the first step nothing is steady.
    assert not collective_hang(inside, ["n0", "n1"], Watch(started=0.0), policy)


def test_a_confirmed_collective_hang_is_priced_at_the_median_step_not_the_p99() -> None:
    """On a noisy machine (the Slurm test cluster's p99 step was 1.5 x its median) the p99
    would stretch the budget past 3 step times + 2 s; once every rank has waited in the
    collective longer than the p99 step, the budget follows the typical (median) step.
    Without that evidence the p99 still sets it."""
    policy = POLICY.model_copy(update={"confirmed_floor_s": 1.5})
    w = Watch(started=0.0)
    w.saw_steps([{"step": i, "step_time_s": 1.6 if i % 10 == 0 else 1.0} for i in range(1, 41)], 0.0)
    inside = {"n0": beat("n0", 4.6, {0: (41, "collective", 0.3)}), "n1": beat("n1", 4.6, {1: (41, "collective", 0.4)})}
    assert collective_hang(inside, ["n0", "n1"], w, policy)
    d = decide(w, policy, 4.6, confirmed="collective")
    assert d.stalled and d.budget_s == 4.5, d.reason  # 3 x 1.0 + 1.5, not 3 x 1.6 + 1.5 = 6.3
    assert not decide(w, policy, 4.4, confirmed="collective").stalled
    assert decide(w, policy, 4.6).budget_s == 3 * 1.6 + 10
    # A confirmed floor as wide as the floor means "wait the full budget": the p99 again.
    full = policy.model_copy(update={"confirmed_floor_s": 10.0})
    assert decide(w, full, 4.6, confirmed="collective").budget_s == 3 * 1.6 + 10


def test_the_watch_follows_the_real_steps_after_a_forged_row(tmp_path) -> None:
    """Issue 39, item 2: the supervisor's watch reads metrics.jsonl as the driver does (one
    `report.StepChain` per attempt): a forged step 999 appended mid-run neither becomes the
    watch's last step nor hides the real steps after it (which would look like a stall)."""
    import json

    from campaign import report, supervisor
    from campaign.watchdog import Watch

    path = tmp_path / report.METRICS_FILE
    watch, offsets, chain = Watch(started=0.0), {"metrics": 0, "events": 0}, report.StepChain(max_step=1000)
    row = lambda s: json.dumps({"step": s, "tokens": 8 * s, "loss": 2.0, "step_time_s": 0.1, "time": 100 + s})  # noqa: E731
    seen = []
    for lines in ([row(s) for s in range(1, 6)], ['{"step": 999, "loss": 1.0, "tokens": 1000000, "time": 105.5}'],
                  [row(6)], [row(7), row(8)]):
        with open(path, "a") as f:
            f.write("\n".join(lines) + "\n")
        supervisor._observe(tmp_path, watch, offsets, 10.0, chain)
        seen.append(watch.last_step)
    assert seen == [5, 5, 6, 8]


def test_a_relaunch_starts_from_the_step_times_earlier_attempts_measured() -> None:
    """Issue 39: a relaunch's first steps are its warm-up, whose budget (warmup_s, 30 s) once
    applied even when the heartbeats showed a rank computing the step its peers wait in and
    the earlier attempt had measured the step (a compute hang right after a relaunch on the
    Slurm goodput benchmark: 30.1 s against 3 step times + 2 s = 3.9 s). With the measured
    step times the stall pattern is called on their budget; silence alone still waits."""
    policy = POLICY.model_copy(update={"warmup_steps": 3, "warmup_s": 30.0, "confirmed_floor_s": 1.5})
    w = Watch(started=0.0, prior_step_times=[1.0] * 50)
    w.saw_steps([{"step": 25, "step_time_s": 1.8}], 0.0)  # the relaunch's first step (slower: warm-up)
    assert w.steps_seen == 1 <= policy.warmup_steps
    assert early_budget(w, policy) == 3 * 1.0 + 1.5, "the heartbeats are read as in the steady phase"
    stuck = {"n0": beat("n0", 4.6, {0: (26, "collective", 0.2)}), "n2": beat("n2", 4.6, {1: (26, "compute", 0.0)})}
    found = culprits(stuck, ["n0", "n2"], 4.6, policy)
    assert [s.node for s in found] == ["n2"] and stall_pattern(found, w, policy)
    d = decide(w, policy, 4.6, confirmed="compute")
    assert d.stalled and d.phase == "warmup" and d.budget_s == 4.5, d.reason
    assert d.budget_s <= 3 * 1.0 + 2.0
    assert not decide(w, policy, 4.6).stalled, "unconfirmed silence in the warm-up still gets warmup_s"
    assert decide(w, policy, 4.6).budget_s == 30.0
    # Every rank stuck in step 26's collective: the median of the measured steps prices it.
    inside = {"n0": beat("n0", 4.6, {0: (26, "collective", 0.2)}), "n2": beat("n2", 4.6, {1: (26, "collective", 0.3)})}
    assert collective_hang(inside, ["n0", "n2"], w, policy)
    d = decide(w, policy, 4.6, confirmed="collective")
    assert d.stalled and d.budget_s == 4.5, d.reason
    # A first attempt (nothing measured) keeps the warm-up budget, as before.
    first = Watch(started=0.0)
    first.saw_steps([{"step": 1, "step_time_s": 1.8}], 0.0)
    assert early_budget(first, policy) is None
    assert decide(first, policy, 4.6, confirmed="compute").budget_s == 30.0
    # Once the attempt has steady steps of its own, they alone set the budget.
    w.saw_steps([{"step": s, "step_time_s": 2.0} for s in range(26, 30)], 10.0)
    assert w.steps_seen > policy.warmup_steps
    assert decide(w, policy, 10.0).budget_s == 3 * 2.0 + 10
