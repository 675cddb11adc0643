"""Each fault kind gives the promised exit code and heartbeat pattern (CPU, gloo)."""

from __future__ import annotations

import signal
import statistics
import sys
import time

import pytest

from campaign import report
from train_helpers import complete_steps, tiny_config


def _wait_for_heartbeats(run_dir, want, timeout: float = 60) -> dict:
    """Poll heartbeats until want(ranks) is true; ranks = {rank: state} over all nodes."""
    end = time.monotonic() + timeout
    ranks: dict = {}
    while time.monotonic() < end:
        ranks = {int(r): s for doc in report.read_heartbeats(run_dir).values()
                 for r, s in doc["ranks"].items()}
        if want(ranks):
            return ranks
        time.sleep(0.1)
    pytest.fail(f"heartbeat pattern not seen; last: {ranks}")


def _long(tmp_path, faults, **run):
    return tiny_config(tmp_path / "ck", run={"max_steps": 10_000, **run}, faults=faults)


@pytest.mark.slow
def test_hang_outside_collective(launch, tmp_path):
    run = launch(_long(tmp_path, [{"kind": "hang", "step": 3, "rank": 1}]))
    seen = _wait_for_heartbeats(run.run_dir, lambda r: len(r) == 2
                                and r[1]["phase"] == "compute" and r[1]["step"] == 3
                                and r[0]["phase"] == "collective" and r[0]["step"] == 3)
    # Both stay alive (their daemon threads refresh `time`), and both stay stuck at step 3.
    time.sleep(0.6)
    later = _wait_for_heartbeats(run.run_dir, lambda r: all(r[i]["time"] > seen[i]["time"]
                                                            for i in (0, 1)))
    assert later[1]["since"] == seen[1]["since"] and later[1]["step"] == 3
    # The node's file is one per node: both ranks are in local-n0.json.
    assert list(report.read_heartbeats(run.run_dir)) == ["local-n0"]
    run.send(0)
    run.send(1)
    t0 = time.monotonic()
    assert run.wait(timeout=20) == [report.EXIT_SIGTERM] * 2
    assert time.monotonic() - t0 < 10  # the rank blocked in gloo ends after the grace (3 s)


@pytest.mark.slow
def test_a_hang_in_a_launchs_second_step_shows_its_peer_waiting_in_a_collective(launch, tmp_path):
    """Issue 39: DDP rebuilds its gradient buckets at the start of the second forward of a
    process, with a broadcast from rank 0. Inside DDP's forward, rank 0 waited there for a
    peer hung in the second step while saying "compute": both ranks looked alike and the
    watchdog saw no stall pattern (the second step of every relaunch). The trainer now does
    that rebuild between steps, in phase "collective"."""
    run = launch(_long(tmp_path, [{"kind": "hang", "step": 2, "rank": 1}]))
    _wait_for_heartbeats(run.run_dir, lambda r: len(r) == 2
                         and r[1]["phase"] == "compute" and r[1]["step"] == 2
                         and r[0]["phase"] == "collective" and r[0]["step"] == 2, timeout=90)
    run.kill()


@pytest.mark.slow
def test_hang_in_collective_on_two_nodes(launch, tmp_path):
    run = launch(_long(tmp_path, [{"kind": "hang_in_collective", "step": 2, "node": "local-n1"}]),
                 nodes=["local-n0", "local-n1"])
    _wait_for_heartbeats(run.run_dir, lambda r: len(r) == 2 and all(
        s["phase"] == "collective" and s["step"] == 2 for s in r.values()))
    assert sorted(report.read_heartbeats(run.run_dir)) == ["local-n0", "local-n1"]
    run.send(0, signal.SIGKILL)
    run.send(1, signal.SIGKILL)
    assert run.wait(timeout=20) == [-9, -9]


@pytest.mark.slow
def test_crash_exit_code(launch, tmp_path):
    run = launch(_long(tmp_path, [{"kind": "crash", "step": 3, "rank": 1, "exit_code": 7}]))
    codes = run.wait(timeout=60)
    assert codes[1] == 7, run.logs()
    assert codes[0] != 0


@pytest.mark.slow
def test_nonfinite_loss_exits_94_on_every_rank(launch, tmp_path):
    run = launch(_long(tmp_path, [{"kind": "nonfinite", "step": 3, "rank": 1}]))
    assert run.wait() == [report.EXIT_NONFINITE] * 2, run.logs()
    assert [(e["event"], e["step"]) for e in run.events()][-1] == ("nonfinite_loss", 3)
    assert max(run.losses()) == 2


@pytest.mark.slow
def test_sigterm_to_one_rank_stops_all_at_a_step_boundary(launch, tmp_path):
    run = launch(_long(tmp_path, []))
    end = time.monotonic() + 60
    while not run.metrics() and time.monotonic() < end:
        time.sleep(0.05)
    run.send(1)
    assert run.wait(timeout=30) == [report.EXIT_SIGTERM] * 2, run.logs()
    hb = report.read_heartbeats(run.run_dir)["local-n0"]["ranks"]
    assert {s["phase"] for s in hb.values()} == {"done"}, hb


def test_sigkill_fault(launch, tmp_path):
    run = launch(_long(tmp_path, [{"kind": "sigkill", "step": 2}]), world=1)
    assert run.wait() == [-signal.SIGKILL]
    assert max(run.losses()) == 1


def test_slow_fault_stretches_the_step(launch, tmp_path):
    run = launch(tiny_config(tmp_path / "ck", run={"max_steps": 8},
                             faults=[{"kind": "slow", "step": 6, "factor": 6.0}]), world=1)
    assert run.wait() == [0], run.logs()
    times = {r["step"]: r["step_time_s"] for r in run.metrics()}
    usual = statistics.median(times[s] for s in (2, 3, 4, 5, 7, 8))
    assert times[6] > 3 * usual


def test_slow_fault_with_a_delay_sleeps_that_long_at_every_step(launch, tmp_path):
    run = launch(tiny_config(tmp_path / "ck", run={"max_steps": 6},
                             faults=[{"kind": "slow", "step": 4, "delay_s": 0.4}]), world=1)
    assert run.wait() == [0], run.logs()
    times = {r["step"]: r["step_time_s"] for r in run.metrics()}
    assert all(times[s] >= 0.4 for s in (4, 5, 6)), times
    assert max(times[s] for s in (2, 3)) < 0.4, times


def test_faults_need_permission(launch, tmp_path):
    run = launch(_long(tmp_path, [{"kind": "crash", "step": 1}]), world=1,
                 env={"CAMPAIGN_ALLOW_FAULTS": None})
    assert run.wait() == [report.EXIT_BAD_CONFIG]
    assert "faults configured but CAMPAIGN_ALLOW_FAULTS is not set" in run.logs()


def test_bad_config_exits_93(launch, tmp_path):
    run = launch({"run": {"max_steps": 0, "checkpoint_dir": str(tmp_path)}}, world=1)
    assert run.wait() == [report.EXIT_BAD_CONFIG]


def test_broken_torch_exits_127(launch, tmp_path):
    fake = tmp_path / "fake"
    (fake / "torch").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text("raise ImportError('simulated broken torch')\n")
    from train_helpers import REPO

    run = launch(tiny_config(tmp_path / "ck"), world=1,
                 env={"PYTHONPATH": f"{fake}:{REPO}"})
    assert run.wait() == [report.EXIT_BROKEN_ENV], run.logs()


def test_deadline_checkpoints_and_exits_143(launch, tmp_path):
    run = launch(_long(tmp_path, [], deadline_unix=time.time() + 15), world=1)
    assert run.wait(timeout=60) == [report.EXIT_SIGTERM], run.logs()
    events = run.events()
    last_step = max(run.losses())
    assert (events[-1]["event"], events[-1]["step"]) == ("deadline", last_step)
    assert complete_steps(tmp_path / "ck") == [last_step]
    assert events[-1]["time"] < events[-1]["deadline_unix"]


if sys.platform != "linux":  # pragma: no cover
    pytestmark = pytest.mark.skip("POSIX signals and /dev/shm")
