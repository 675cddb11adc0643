"""The stage kinds end to end on the local site (Parsl, virtual nodes, gloo ranks), and the
whole example campaign as a newcomer runs it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from e2e_helpers import REPO, Workspace, tiny_spec

pytestmark = pytest.mark.slow


def loss_stage(reference: dict[str, object], name: str = "loss") -> dict[str, object]:
    return {"name": name, "kind": "loss_check", "steps": 20, "window": 5, "tolerance": 0.10, "reference": reference}


def test_loss_check_against_recorded_reference_and_shifted_csv(ws: Workspace) -> None:
    a = ws.write_spec(tiny_spec("ref", [loss_stage({"record": True})], nodes=2), "ref.yaml")
    assert ws.cli("submit", str(a)).code == 0
    assert not list((ws.workdir / "ref" / "loss").glob("checkpoints-*/step-*")), "nothing resumes a loss check"

    ledger = ws.ledger()
    from campaign.ledger import reads

    with ledger.session() as s:
        run = reads.get_stage_run(s, "ref", "loss")
        rows = reads.list_steps(s, run.attempts[0].id)
        curve = [(m.step, m.loss + 0.2) for m in rows]
    ledger.close()
    (ws.root / "shifted.csv").write_text("step,loss\n" + "".join(f"{st},{lo!r}\n" for st, lo in curve))
    # One campaign, two checks: against the recorded stage run (passes), then against the file (fails).
    stages = [loss_stage({"stage_run": "ref/loss"}, "same"), loss_stage({"file": "shifted.csv"}, "shifted")]
    b = ws.write_spec(tiny_spec("check", stages, nodes=2), "check.yaml")
    r = ws.cli("submit", str(b))
    assert r.code == 1, r.out + r.err
    same, shifted = ws.status("check")["stages"]
    assert same["state"] == "passed" and "difference +0.0000" in same["verdict"], same
    assert shifted["state"] == "failed", shifted
    assert "difference -0.2000, outside ±0.1" in shifted["verdict"], shifted["verdict"]


def test_scaling_records_one_row_per_node_count(ws: Workspace) -> None:
    stage = {"name": "scale", "kind": "scaling", "node_counts": [1, 2], "batch": "strong", "steps": 8,
             "warmup_steps": 2, "min_efficiency": 0.01, "loss_tolerance": 0.10}
    spec = ws.write_spec(tiny_spec("scale", [stage], nodes=2))
    r = ws.cli("submit", str(spec))
    assert r.code == 0, r.out + r.err
    from campaign.ledger import reads

    ledger = ws.ledger()
    with ledger.session() as s:
        run = reads.get_stage_run(s, "scale", "scale")
        table = run.numbers["table"]
        labels = [a.label for a in run.attempts]
    ledger.close()
    assert [row["nodes"] for row in table] == [1, 2] and [row["ranks"] for row in table] == [1, 2]
    for row in table:
        assert row["tokens_per_s"] > 0 and row["step_time_s"] > 0 and row["last_step"] == 8
        assert row["comm_share"] is not None and 0 <= row["comm_share"] < 1
    assert table[0]["efficiency"] == 1.0
    assert abs(table[1]["last_loss"] - table[0]["last_loss"]) < 0.01, "strong scaling follows the same curve"
    assert labels == ["1 node(s)", "2 node(s)"]
    assert "scaling table" in r.out
    stage_dir = ws.workdir / "scale" / "scale"
    assert not list(stage_dir.glob("checkpoints-*/step-*")), "scaling never resumes: no final checkpoint"
    cfg = json.loads((stage_dir / "attempt-001" / "trainer.json").read_text())
    assert cfg["run"]["checkpoint_final"] is False and cfg["train"]["deterministic"] is False


def resume_stage(**over: object) -> dict[str, object]:
    stage = {"name": "resume", "kind": "resume_test", "checkpoint_step": 6, "interrupt_step": 8, "steps": 10,
             "signals": ["SIGKILL"], "tolerance": 0.0}
    stage.update(over)
    return stage


def test_resume_test_is_bit_exact_and_catches_an_off_by_one(ws: Workspace) -> None:
    good = ws.write_spec(tiny_spec("resume-ok", [resume_stage()], nodes=2), "ok.yaml")
    r = ws.cli("submit", str(good))
    assert r.code == 0, r.out + r.err
    assert "SIGKILL: resumed from step 6, equal bit for bit" in ws.status("resume-ok")["stages"][0]["verdict"]
    stage_dir = ws.workdir / "resume-ok" / "resume"
    configs = [json.loads(p.read_text()) for p in sorted(stage_dir.glob("attempt-*/trainer.json"))]
    assert [c["train"]["deterministic"] for c in configs] == [True, True, True], "auto: exact in the resume test"
    assert [c["run"]["checkpoint_final"] for c in configs] == [False, False, False]
    # issue 39: the interrupted run trains to the reference's max_steps; the signal ends it
    assert [c["run"]["max_steps"] for c in configs] == [10, 10, 10]
    from campaign import report

    assert [c["step"] for c in report.list_checkpoints(stage_dir / "checkpoints-sigkill")] == [6]

    fault = [{"kind": "data_off_by_one", "step": 1, "attempt": 3}]
    bad = ws.write_spec(tiny_spec("resume-bad", [resume_stage(faults=fault)], nodes=2), "bad.yaml")
    refused = ws.cli("submit", str(bad))
    assert refused.code == 2 and "CAMPAIGN_ALLOW_FAULTS=1" in refused.err, "faults never run by accident"
    r = ws.cli("submit", str(bad), CAMPAIGN_ALLOW_FAULTS="1")
    assert r.code == 1
    verdict = ws.status("resume-bad")["stages"][0]["verdict"]
    assert "loss differs first at step 7" in verdict, verdict


def test_cancel_stops_a_running_campaign(ws: Workspace) -> None:
    stage = {"name": "long", "kind": "long_run", "steps": 100000, "checkpoint_every": 1000}
    spec = ws.write_spec(tiny_spec("cancelme", [stage], nodes=2))
    p = ws.popen("submit", str(spec))
    metrics = ws.workdir / "cancelme" / "long" / "attempt-001" / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not (metrics.exists() and metrics.stat().st_size > 0):
        time.sleep(0.2)
    r = ws.cli("cancel", "cancelme", "--wait", "60")
    assert r.code == 0, r.out + r.err
    assert p.wait(timeout=60) == 130
    status = ws.status("cancelme")
    assert status["state"] == "cancelled"
    assert status["stages"][0]["verdict"] == "cancelled by the user"
    import subprocess

    left = subprocess.run(["pgrep", "-f", f"CAMPAIGN_RUN_DIR={metrics.parent}"], capture_output=True)
    assert left.returncode == 1, "no trainer process left behind"


def test_local_example_passes_all_five_stages(ws: Workspace) -> None:
    r = ws.cli("submit", str(REPO / "examples" / "local.yaml"), timeout=900)
    assert r.code == 0, r.out + r.err
    status = ws.status("local-demo")
    assert status["state"] == "succeeded"
    assert [s["kind"] for s in status["stages"]] == ["smoke", "loss_check", "scaling", "long_run", "resume_test"]
    for st in status["stages"]:
        assert st["state"] == "passed", st
        assert st["tokens"] > 0 and st["last_loss"] is not None and st["verdict"]
    assert {"name", "state", "stages", "excluded_nodes"} <= set(status), "the skeleton's --json shape stays"
    # keys are added (goodput, checkpoint_interval), never changed
    assert all(set(st) == {"name", "kind", "state", "attempts", "tokens", "last_loss", "verdict", "goodput",
                           "checkpoint_interval"} for st in status["stages"])
    for part in (status, *status["stages"]):
        g = part["goodput"]
        assert g["productive_s"] > 0 and abs(g["productive_s"] + sum(g["lost"].values()) - g["wall_s"]) < 0.05, g
    again = ws.cli("submit", str(REPO / "examples" / "local.yaml"))
    assert again.code == 0 and again.out.count("passed earlier") == 5, "same file again: nothing reruns"
    assert Path(ws.workdir / "ledger.db").exists()
