"""The fault matrix on the local site: each fault injected into a real long run (Parsl, three
virtual nodes of one gloo rank each, two active plus a spare) and the recovery checked in
the ledger as a user would read it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from campaign import report
from e2e_helpers import Workspace, ledger_view, tiny_spec

pytestmark = pytest.mark.slow

FAST_WATCHDOG = {"startup_s": 120, "step_factor": 3, "floor_s": 4, "heartbeat_stale_s": 5}


def long_run(faults: list[dict[str, Any]], **over: Any) -> dict[str, Any]:
    stage = {"name": "long", "kind": "long_run", "nodes": 2, "steps": 30, "checkpoint_every": 10, "max_attempts": 3,
             "backoff_s": 0, "timeout_s": 300, "watchdog": FAST_WATCHDOG, "faults": faults}
    stage.update(over)
    return stage


def check_recovered(view: dict[str, Any], bad: str, first_class: str) -> None:
    a1, a2 = view["attempts"][0], view["attempts"][1]
    assert a1["state"] == first_class
    assert bad in a1["nodes"] and [s["node"] for s in a1["suspects"]] == [bad]
    assert [e["node"] for e in view["exclusions"]] == [bad]
    assert view["exclusions"][0]["evidence"]["attempt"] == 1 and view["exclusions"][0]["expires"] is not None
    assert bad not in a2["nodes"] and "local-n2" in a2["nodes"], "the spare replaces the bad node"
    # The rank on the healthy node saved step 24 (a rescue checkpoint) before the launch was
    # stopped: the relaunch goes on from there, not from the periodic checkpoint of step 20.
    rescue = a1["summary"]["rescue"]
    assert rescue["saved"] and rescue["step"] == 24, rescue
    assert a2["first_step"] == 25, "relaunch resumes from the rescue checkpoint (step 24)"
    assert a2["state"] == "succeeded" and a2["last_step"] == 30
    assert view["stage"] == "passed"
    kinds = [k for k, _ in view["events"]]
    assert "node_excluded" in kinds and "relaunch" in kinds


def test_hang_on_a_node_is_detected_excluded_and_relaunched(ws: Workspace) -> None:
    spec = ws.write_spec(tiny_spec("hang", [long_run([{"kind": "hang", "step": 25, "node": "local-n1", "attempt": 1}])]))
    r = ws.cli("submit", str(spec), CAMPAIGN_ALLOW_FAULTS="1")
    assert r.code == 0, r.out + r.err
    view = ledger_view(ws, "hang")
    check_recovered(view, "local-n1", "stalled")
    a1 = view["attempts"][0]
    assert a1["exit_code"] == 124
    assert "still computing step 25" in a1["suspects"][0]["reason"]
    assert a1["summary"]["detected_after_s"] < 3 * 1.0 + 10, "detected within 3 step-times + 10 s"
    # The heartbeats showed rank 1 computing while rank 0 waited: the short floor applied.
    assert "the heartbeats show who hangs" in a1["summary"]["stall"], a1["summary"]["stall"]
    said = " ".join(r.out.split())  # the log wraps at 120 columns
    assert "excluded local-n1" in said and "after hang (a drill): from the rescue checkpoint" in said


def test_a_one_off_crash_without_evidence_excludes_nobody(ws: Workspace) -> None:
    """Exit 1 once, nothing in the log against the node: a confirming retry with the ranks
    moved passes, and no node is excluded (before: rank 0's node was excluded for 24 h)."""
    spec = ws.write_spec(tiny_spec("crash", [long_run([{"kind": "crash", "step": 25, "node": "local-n1", "attempt": 1,
                                                         "exit_code": 1}])]))
    r = ws.cli("submit", str(spec), CAMPAIGN_ALLOW_FAULTS="1")
    assert r.code == 0, r.out + r.err
    view = ledger_view(ws, "crash")
    a1, a2 = view["attempts"]
    assert (a1["state"], a1["suspects"], a2["state"]) == ("crashed_unknown", [], "succeeded")
    assert view["exclusions"] == [] and "excluded" not in (view["verdict"] or "")
    assert a1["nodes"] == ["local-n0", "local-n1"] and a2["nodes"] == ["local-n1", "local-n0"], "ranks moved"
    assert "rank-1.log" in a1["summary"]["error"], "the failure names the log to read"


def test_a_crash_that_follows_its_node_is_confirmed_and_excluded(ws: Workspace) -> None:
    spec = ws.write_spec(tiny_spec("recur", [long_run([{"kind": "crash", "step": 25, "node": "local-n1",
                                                         "exit_code": 1}], max_attempts=3)]))
    r = ws.cli("submit", str(spec), CAMPAIGN_ALLOW_FAULTS="1")
    assert r.code == 0, r.out + r.err
    view = ledger_view(ws, "recur")
    states = [a["state"] for a in view["attempts"]]
    assert states == ["crashed_unknown", "crashed_node", "succeeded"], states
    assert [e["node"] for e in view["exclusions"]] == ["local-n1"]
    assert "followed node local-n1 across ranks" in view["attempts"][1]["summary"]["error"]
    assert "local-n1" not in view["attempts"][2]["nodes"] and "local-n2" in view["attempts"][2]["nodes"]
    assert any(k == "confirmed" for k, _ in view["events"])


def test_sigkilled_rank_is_blamed_and_recovered(ws: Workspace) -> None:
    spec = ws.write_spec(tiny_spec("sigkill", [long_run([{"kind": "sigkill", "step": 25, "node": "local-n0",
                                                           "attempt": 1}])]))
    r = ws.cli("submit", str(spec), CAMPAIGN_ALLOW_FAULTS="1")
    assert r.code == 0, r.out + r.err
    view = ledger_view(ws, "sigkill")
    check_recovered(view, "local-n0", "crashed_node")
    assert view["attempts"][0]["exit_code"] == 137


def test_import_failure_is_systemic_and_blames_no_node(ws: Workspace, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    (broken / "torch").mkdir(parents=True)
    (broken / "torch" / "__init__.py").write_text("raise ImportError('libtorch_cpu.so: cannot open shared object file')\n")
    spec = ws.write_spec(tiny_spec("systemic", [long_run([], max_attempts=2)]))
    r = ws.cli("submit", str(spec), PYTHONPATH=f"{broken}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    assert r.code == 1, r.out + r.err
    view = ledger_view(ws, "systemic")
    # A broken environment on every node: retrying cannot help, so no second attempt burns the allocation.
    assert [a["state"] for a in view["attempts"]] == ["crashed_systemic"]
    assert all(a["exit_code"] == 127 and a["suspects"] == [] for a in view["attempts"])
    assert view["exclusions"] == []
    assert "systemic: retrying cannot help (no node blamed, none excluded)" in view["verdict"]
    assert "libtorch_cpu.so" in view["verdict"] and "rank-" in view["verdict"], "quotes the error, names the log"


def test_corrupted_newest_checkpoint_falls_back_to_the_previous(ws: Workspace) -> None:
    stage = long_run([{"kind": "crash", "step": 35, "rank": 0, "attempt": 1}], steps=40, max_attempts=1)
    spec = ws.write_spec(tiny_spec("corrupt", [stage]))
    r = ws.cli("submit", str(spec), CAMPAIGN_ALLOW_FAULTS="1")
    assert r.code == 1, "one attempt only: the crash fails the stage"
    ckpts = ws.workdir / "corrupt" / "long" / "checkpoints"
    # The newest is the rescue checkpoint rank 1 saved of step 34 after rank 0 crashed.
    assert sorted(p.name for p in ckpts.glob("step-*"))[-2:] == ["step-00000030", "step-00000034"]
    for step in (34, 30):  # truncate the two newest checkpoints' data
        for f in (ckpts / f"step-{step:08d}").rglob("*.distcp"):
            f.write_bytes(f.read_bytes()[: len(f.read_bytes()) // 2])
    r = ws.cli("submit", str(spec), CAMPAIGN_ALLOW_FAULTS="1")
    assert r.code == 0, r.out + r.err
    view = ledger_view(ws, "corrupt")
    assert view["attempts"][1]["first_step"] == 21, "resumed from step 20, not the corrupted 34 or 30"
    assert view["stage"] == "passed"


def test_walltime_shorter_than_the_run_checkpoints_and_continues(ws: Workspace) -> None:
    # 300 steps of at least 60 ms (a fixed sleep each step, whatever the machine's speed) are
    # more than 18 s of training: more than one 15 s "block" on a fast machine too (3000 plain
    # steps once finished inside one block on an idle, fast one)
    slow = {"kind": "slow", "step": 1, "delay_s": 0.06}
    stage = long_run([slow], steps=300, checkpoint_every=20, max_attempts=20, timeout_s=600)
    spec = ws.write_spec(tiny_spec("walltime", [stage], walltime_s=15))
    r = ws.cli("submit", str(spec), CAMPAIGN_ALLOW_FAULTS="1")
    assert r.code == 0, r.out + r.err
    view = ledger_view(ws, "walltime")
    states = [a["state"] for a in view["attempts"]]
    assert states[-1] == "succeeded" and "walltime" in states
    assert view["exclusions"] == [], "a walltime is not a node's fault"
    steps = [s for a in view["attempts"] for s, _ in a["steps"]]
    assert max(steps) == 300
    walltimed = [a for a in view["attempts"] if a["state"] == "walltime"]
    assert all(a["exit_code"] == 143 for a in walltimed)


def test_kill_9_of_the_driver_then_resume_completes(ws: Workspace) -> None:
    spec = ws.write_spec(tiny_spec("crashme", [long_run([], steps=400, checkpoint_every=20)]))
    p = ws.popen("submit", str(spec))
    metrics = ws.workdir / "crashme" / "long" / "attempt-001" / "metrics.jsonl"
    deadline = time.time() + 180
    while time.time() < deadline and (not metrics.exists() or len(metrics.read_text().splitlines()) < 45):
        time.sleep(0.2)
    assert metrics.exists(), "the long run never started"
    second = ws.cli("submit", str(spec), timeout=60)
    assert second.code == 2 and "is being driven by pid" in second.err, "one driver per campaign"
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    r = ws.cli("resume", "crashme")
    assert r.code == 0, r.out + r.err
    view = ledger_view(ws, "crashme")
    assert view["stage"] == "passed"
    states = [a["state"] for a in view["attempts"]]
    assert states == ["orphaned", "succeeded"]
    orphan, resumed = view["attempts"]
    assert "killed" in orphan["summary"]["recovery"] or "exited" in orphan["summary"]["recovery"]
    for a in view["attempts"]:
        steps = [s for s, _ in a["steps"]]
        assert steps == sorted(set(steps)), "step rows unique per attempt"
        tokens = [t for _, t in a["steps"]]
        assert tokens == sorted(tokens), "tokens monotonic"
    assert (resumed["first_step"] - 1) % 20 == 0, "resumed from a complete checkpoint"
    assert resumed["steps"][-1][0] == 400
    assert view["tokens"] == resumed["steps"][-1][1], "stage tokens continue, not double-counted"
    assert any(k == "attempt_orphaned" for k, _ in view["events"])
    assert any(k == "lease_taken_over" for k, _ in view["events"])
    import subprocess

    parsl_dir = str(ws.workdir / "crashme" / "parsl")
    left = subprocess.run(["pgrep", "-f", parsl_dir], capture_output=True, text=True).stdout.split()
    assert left == [], "the dead driver's Parsl interchange and workers were stopped"
    assert "Parsl process(es) a dead driver left running" in r.out
    from campaign.report import _node_local_dir

    first = ws.workdir / "crashme" / "long" / "attempt-001"
    left_shm = [n for n in orphan["nodes"] or ["local-n0", "local-n1"] if _node_local_dir(str(first), n, "1").exists()]
    assert left_shm == [], "the killed ranks' node-local heartbeat folders were removed"


def test_straggler_is_reported_with_its_ratio_and_not_excluded_by_default(ws: Workspace) -> None:
    spec = ws.write_spec(tiny_spec("straggler", [long_run([{"kind": "slow", "step": 5, "node": "local-n1",
                                                             "factor": 5.0}], steps=40)]))
    r = ws.cli("submit", str(spec), CAMPAIGN_ALLOW_FAULTS="1")
    assert r.code == 0, r.out + r.err
    view = ledger_view(ws, "straggler")
    found = view["attempts"][0]["summary"]["stragglers"]
    assert [s["node"] for s in found] == ["local-n1"]
    assert found[0]["ratio"] >= 3.0
    assert view["exclusions"] == [], "reported, not excluded, unless the spec says so"
    assert "straggler local-n1" in r.out
    assert any(k == "straggler" for k, _ in view["events"])


def test_hang_inside_a_collective_is_found_by_bisection(ws: Workspace) -> None:
    fault = [{"kind": "hang_in_collective", "step": 25, "node": "local-n1", "attempt": 1}]
    watchdog = {**FAST_WATCHDOG, "drill_s": 15}  # a passing one-node drill takes ~3-5 s here; the hung one all of it
    spec = ws.write_spec(tiny_spec("bisect", [long_run(fault, watchdog=watchdog)]))
    r = ws.cli("submit", str(spec), CAMPAIGN_ALLOW_FAULTS="1")
    assert r.code == 0, r.out + r.err
    view = ledger_view(ws, "bisect")
    check_recovered(view, "local-n1", "stalled")
    sus = view["attempts"][0]["suspects"][0]
    assert "collective drill" in sus["reason"]
    drills = sus["evidence"]["drills"]
    assert {"nodes": ["local-n0"], "ok": True} in drills and {"nodes": ["local-n1"], "ok": False} in drills
    # Detected from the heartbeats (every rank waits in step 25's collective), within 3 step
    # times + 2 s (issue 28; the 1.5 s confirmed floor and a poll), not after the 4 s floor of silence alone.
    summary = view["attempts"][0]["summary"]
    assert "every rank stuck in one collective" in summary["stall"], summary["stall"]
    rows, _ = report.read_metrics(view["attempts"][0]["run_dir"])
    steady = sorted(r["step_time_s"] for r in rows[3:])  # after the watchdog's 3 warm-up steps
    step_s = steady[min(len(steady) - 1, round(0.99 * (len(steady) - 1)))]  # p99, as the watchdog reads it
    assert summary["detected_after_s"] <= 3 * step_s + 2.0, (summary["detected_after_s"], step_s)
    st = ws.cli("status", "bisect", "--json")  # where a user reads it
    assert json.loads(st.out)["attempts_detail"][0]["detected_after_s"] == summary["detected_after_s"]


def test_a_full_checkpoint_file_system_is_systemic_and_blames_no_node(ws: Workspace) -> None:
    """The checkpoint folder on a real, full tmpfs (mounted by the test: root only): every
    rank's save fails with ENOSPC. No node is blamed or excluded, one confirming retry at most,
    and the verdict quotes the error and names the rank's log."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    full = ws.workdir / "full" / "long" / "checkpoints"
    full.mkdir(parents=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(full)], capture_output=True, text=True)
    assert mounted.returncode == 0, f"cannot mount a tmpfs for the test: {mounted.stderr}"
    try:
        spec = ws.write_spec(tiny_spec("full", [long_run([], steps=20, max_attempts=3)]))
        r = ws.cli("submit", str(spec))
    finally:
        subprocess.run(["umount", "-l", str(full)], check=False)
    assert r.code == 1, r.out + r.err
    view = ledger_view(ws, "full")
    assert len(view["attempts"]) <= 2 and all(a["state"] == "crashed_systemic" for a in view["attempts"]), view["attempts"]
    assert all(a["suspects"] == [] for a in view["attempts"]) and view["exclusions"] == []
    # the writer's own words (DCP's torch.save says 'unexpected pos', not ENOSPC) and what they mean
    assert "unexpected pos" in view["verdict"] or "No space left on device" in view["verdict"], view["verdict"]
    assert "no node is blamed" in view["verdict"], view["verdict"]
    assert "rank-" in view["verdict"], "names the rank's log"


def test_a_hang_in_a_relaunchs_first_steps_is_called_on_the_step_time_already_measured(ws: Workspace) -> None:
    """Issue 39: after a relaunch the new attempt's first steps are its warm-up, whose budget
    (warmup_s, 30 s) applied although the stage had measured the step on these nodes' size:
    a compute hang in the relaunch's second step took ~30 s. The relaunch's watchdog starts
    from the step times in the ledger, so the hang is called within 3 step times + 2 s."""
    faults = [{"kind": "hang", "step": 25, "node": "local-n1", "attempt": 1},
              {"kind": "hang", "step": 26, "rank": 1, "attempt": 2}]  # the relaunch resumes at 25: its 2nd step
    spec = ws.write_spec(tiny_spec("relaunch-hang", [long_run(faults)], nodes=4))
    r = ws.cli("submit", str(spec), CAMPAIGN_ALLOW_FAULTS="1")
    assert r.code == 0, r.out + r.err
    view = ledger_view(ws, "relaunch-hang")
    a1, a2, a3 = view["attempts"]
    assert [a1["state"], a2["state"], a3["state"]] == ["stalled", "stalled", "succeeded"]
    assert a2["first_step"] == 25, "the relaunch resumed from the rescue checkpoint of step 24"
    rows, _ = report.read_metrics(a1["run_dir"])
    steady = sorted(r["step_time_s"] for r in rows[3:])  # attempt 1's steps after the watchdog's warm-up
    step_s = steady[min(len(steady) - 1, round(0.99 * (len(steady) - 1)))]  # p99, as the watchdog reads it
    summary = a2["summary"]
    assert "heartbeats show who hangs" in summary["stall"], summary["stall"]
    assert summary["detected_after_s"] <= 3 * step_s + 2.0, (summary["detected_after_s"], step_s)
    assert [s["node"] for s in a2["suspects"]] == [a2["nodes"][1]], "rank 1's node, where the hang was put"
    assert view["stage"] == "passed"
