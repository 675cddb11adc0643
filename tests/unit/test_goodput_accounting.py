"""Goodput accounting from made-up ledger rows: each bucket on its own, the sum equal to the
wall time, and the Young/Daly interval (campaign.goodput)."""

from __future__ import annotations

import math

import pytest

from campaign import goodput
from campaign.goodput import AttemptTimes, Step


def _timeline(start: float, startup: float, pieces: list[tuple[str, float]], first: int = 1) -> tuple[list[Step], float]:
    """Steps from a list of ("step", seconds) and ("gap", seconds); returns (steps, end)."""
    t, n, steps = start + startup, first, []
    for what, seconds in pieces:
        t += seconds
        if what == "step":
            steps.append(Step(n, t, seconds))
            n += 1
    return steps, t


def _lost(g: dict, **nonzero: float) -> None:
    expected = {k: 0.0 for k in goodput.LOST} | {f"{k}_s": v for k, v in nonzero.items()}
    assert g["lost"] == pytest.approx(expected, abs=1e-6)
    assert g["productive_s"] + sum(g["lost"].values()) == pytest.approx(g["wall_s"], abs=1e-3)


def test_clean_attempt_startup_checkpoint_stall_and_exit() -> None:
    steps, end = _timeline(100.0, 4.0, [("step", 1)] * 3 + [("gap", 2.0)] + [("step", 1), ("gap", 0.1)]
                           + [("step", 1)] * 2)
    g = goodput.account_attempt(AttemptTimes(100.0, end + 1.5 + 0.5, "succeeded", steps, saves={3: 0.0, 6: 1.5}))
    assert g["wall_s"] == pytest.approx(14.1) and g["productive_s"] == pytest.approx(6.0)
    _lost(g, startup=4.0, checkpoint_stall=3.5, other=0.6)
    assert g["ettr"] == pytest.approx(6.0 / 14.1, abs=1e-4)


def test_a_hang_is_detection_from_the_last_step_to_the_kill() -> None:
    steps, end = _timeline(0.0, 2.0, [("step", 1)] * 3)
    g = goodput.account_attempt(AttemptTimes(0.0, end + 12.0, "stalled", steps))
    assert g["productive_s"] == pytest.approx(3.0)
    _lost(g, startup=2.0, detection=12.0)


def test_the_tail_of_a_clean_attempt_is_not_detection() -> None:
    steps, end = _timeline(0.0, 2.0, [("step", 1)] * 3)
    _lost(goodput.account_attempt(AttemptTimes(0.0, end + 12.0, "succeeded", steps)), startup=2.0, other=12.0)


def test_steps_the_chain_trained_before_are_recomputed() -> None:
    steps, end = _timeline(0.0, 3.0, [("step", 2)] * 5, first=4)  # resumed at 3; the failed attempt reached 5
    g = goodput.account_attempt(AttemptTimes(0.0, end, "succeeded", steps, done_before=5))
    assert g["productive_s"] == pytest.approx(6.0)  # steps 6, 7, 8
    _lost(g, startup=3.0, recomputed=4.0)  # steps 4, 5


def test_unlogged_steps_count_as_work() -> None:
    """log_every 2: the step between two rows computed inside their gap."""
    steps = [Step(2, 12.0, 1.0), Step(4, 14.0, 1.0)]
    g = goodput.account_attempt(AttemptTimes(10.0, 14.0, "succeeded", steps))
    assert g["productive_s"] == pytest.approx(3.0)
    _lost(g, startup=1.0)


def test_an_attempt_without_a_step_is_all_startup() -> None:
    _lost(goodput.account_attempt(AttemptTimes(0.0, 30.0, "stalled", [])), startup=30.0)


def test_stage_adds_restart_after_a_fault_and_idle_as_other() -> None:
    a1 = goodput.account_attempt(AttemptTimes(2.0, 20.0, "crashed_node", _timeline(2.0, 1.0, [("step", 1)] * 10)[0]))
    a2 = goodput.account_attempt(AttemptTimes(25.0, 40.0, "succeeded", _timeline(25.0, 1.0, [("step", 1)] * 14)[0]))
    g = goodput.combine([(2.0, 20.0, a1, True), (25.0, 40.0, a2, False)], 0.0, 41.0)
    assert g["wall_s"] == pytest.approx(41.0) and g["productive_s"] == pytest.approx(24.0)
    # other: 2 s before the first launch + 1 s after the last; detection: a1's 7 s tail.
    _lost(g, startup=2.0, detection=7.0, restart=5.0, other=3.0)


def test_young_daly_interval() -> None:
    young = math.sqrt(2 * 10 * 3600)
    assert goodput.daly_interval(10, 3600) == pytest.approx(young * (1 + math.sqrt(10 / 7200) / 3 + 10 / 7200 / 9) - 10)
    assert goodput.daly_interval(10, 3600) == pytest.approx(261.7, abs=0.1)
    assert goodput.daly_interval(500, 200) == 200  # a save longer than 2 MTBF: checkpoint every MTBF


def test_job_mtbf_scales_the_site_rate_to_the_node_count() -> None:
    history = [{"wall_s": 100.0, "nodes": 2, "fault": f} for f in (True, False, True, False)]
    assert goodput.job_mtbf(history, nodes=4) == pytest.approx(800 / 2 / 4)
    assert goodput.job_mtbf([{"wall_s": 100.0, "nodes": 2, "fault": False}], nodes=1) is None


def test_status_shows_one_line_per_stage_and_the_campaign() -> None:
    from io import StringIO

    from rich.console import Console

    from campaign.views import goodput_table

    g = {"wall_s": 100.0, "productive_s": 82.0, "ettr": 0.82,
         "lost": {"startup_s": 10.0, "checkpoint_stall_s": 0.0, "recomputed_s": 5.0, "detection_s": 3.0,
                  "restart_s": 0.0, "other_s": 0.01}}
    interval = {"steps": 120, "interval_s": 60.0, "save_s": 1.5, "mtbf_s": 1200.0, "step_s": 0.5, "source": "site history"}
    summary = {"stages": [{"name": "long", "goodput": g, "checkpoint_interval": interval},
                          {"name": "later", "goodput": goodput.empty()}], "goodput": g}
    out = StringIO()
    Console(file=out, width=200, color_system=None).print(goodput_table(summary))
    lines = [ln for ln in out.getvalue().splitlines() if "ETTR" in ln]
    assert len(lines) == 2  # the stage that ran, and the campaign; none for a stage not run
    assert ("ETTR 0.82: 1m22s of 1m40s trained; lost startup 10.0 s, recomputed 5.0 s, detection 3.0 s; "
            "checkpoint every 120 steps suggested (Young/Daly: save 1.5 s, MTBF 20m00s from site history)") in lines[0]


def test_checkpoint_every_is_steps_or_auto() -> None:
    from pydantic import ValidationError

    from campaign.stages.long_run import LongRunStage

    assert LongRunStage(steps=10, checkpoint_every="auto").checkpoint_every == "auto"
    assert LongRunStage(steps=10, checkpoint_every=7).checkpoint_every == 7
    for bad in (0, "sometimes", True):
        with pytest.raises(ValidationError, match="must be a number of steps >= 1, or auto") as info:
            LongRunStage(steps=10, checkpoint_every=bad)
        assert info.value.error_count() == 1


def test_status_says_how_many_faults_a_rescue_covered_when_it_suggests_an_interval() -> None:
    from io import StringIO

    from rich.console import Console

    from campaign.views import goodput_table

    g = {"wall_s": 100.0, "productive_s": 90.0, "ettr": 0.9,
         "lost": {"startup_s": 10.0, "checkpoint_stall_s": 0.0, "recomputed_s": 0.0, "detection_s": 0.0,
                  "restart_s": 0.0, "other_s": 0.0}}
    interval = {"steps": 200, "interval_s": 100.0, "save_s": 1.5, "mtbf_s": 400.0, "step_s": 0.5,
                "source": "site history", "rescued": [2, 3], "unrescued_mtbf_s": 1200.0}
    out = StringIO()
    Console(file=out, width=240, color_system=None).print(
        goodput_table({"stages": [{"name": "long", "goodput": g, "checkpoint_interval": interval}], "goodput": g}))
    assert ("checkpoint every 200 steps suggested (Young/Daly: save 1.5 s, MTBF 6m40s from site history, "
            "2 of 3 faults rescued: without a rescue 20m00s)") in out.getvalue()
    # a stated MTBF and no fault yet, where the launch can rescue: the prior is said, not hidden
    first = {**interval, "source": "stated mtbf_s", "rescued": [0, 0], "unrescued_mtbf_s": 800.0}
    out = StringIO()
    Console(file=out, width=240, color_system=None).print(
        goodput_table({"stages": [{"name": "long", "goodput": g, "checkpoint_interval": first}], "goodput": g}))
    assert "from stated mtbf_s, no fault seen yet, half taken as rescued: without a rescue 13m20s)" in out.getvalue()
