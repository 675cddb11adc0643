"""A long run with `observe` and `notify` set, drilled with a SIGKILL of one rank: what
TensorBoard, W&B (offline) and the notifications hold afterwards, read back with each tool's
own reader (TensorBoard's EventAccumulator; W&B's protobuf records of its run file; a real
HTTP server on 127.0.0.1 and a real shell command for the notifications).

The engine runs without Parsl (`runner=run_in_thread`); the trainer's ranks are real gloo
processes. tests/e2e/test_observe_e2e.py drives the same through `campaign submit`.
"""

from __future__ import annotations

import io
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from campaign.engine import Engine
from campaign.ledger import open_ledger, reads
from campaign.progress import Progress
from campaign.runner import run_in_thread
from campaign.spec import CampaignSpec
from tb_file import scalars, texts

pytest.importorskip("tensorboard")
pytest.importorskip("wandb")

FAST_WATCHDOG = {"startup_s": 120, "step_factor": 3, "floor_s": 4, "heartbeat_stale_s": 5}


def drilled_spec(name: str, webhook_url: str, **observe: Any) -> dict[str, Any]:
    """Three virtual nodes (two active, one spare); rank 0's node SIGKILLed at step 25 of the first attempt."""
    return {
        "name": name, "site": {"kind": "local", "nodes": 3, "ranks_per_node": 1},
        "model": {"size": "tiny"}, "trainer": {"micro_batch_size": 2, "warmup_steps": 2},
        "observe": {"tensorboard": "tb", "wandb": {"project": "drill", "mode": "offline"}, **observe},
        "notify": {"webhook": webhook_url, "backoff_s": 0.2, "wait_s": 30,
                   # fails once (no marker yet), then appends the event to notes.jsonl
                   "command": "test -f seen || { touch seen; exit 3; }; cat >> notes.jsonl"},
        "stages": [{"name": "long", "kind": "long_run", "nodes": 2, "steps": 30, "checkpoint_every": 10,
                    "max_attempts": 3, "backoff_s": 0, "timeout_s": 300, "watchdog": FAST_WATCHDOG,
                    "faults": [{"kind": "sigkill", "step": 25, "node": "local-n0", "attempt": 1}]}],
    }


def run_drill(tmp_path: Path, spec: dict[str, Any]) -> tuple[Engine, int, str]:
    out = io.StringIO()
    ledger = open_ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    engine = Engine(CampaignSpec.model_validate(spec), ledger, workdir=tmp_path / "campaigns",
                    progress=Progress(out), runner=run_in_thread,
                    spec_dir=tmp_path)
    code = engine.submit()
    return engine, code, out.getvalue()


def ledger_steps(engine: Engine) -> dict[int, dict[int, float]]:
    """attempt -> step -> loss, from the ledger."""
    with engine.ledger.session() as s:
        c = reads.get_campaign(s, engine.spec.name)
        assert c is not None
        out: dict[int, dict[int, float]] = {}
        for row in reads.iter_campaign_steps(s, c):
            out.setdefault(row["attempt"], {})[row["step"]] = row["loss"]
        return out


def test_a_drilled_long_run_leaves_tensorboard_wandb_and_notifications(tmp_path: Path, webhook: Any) -> None:
    import wandb_file

    engine, code, printed = run_drill(tmp_path, drilled_spec("drill", webhook.url))
    assert code == 0, printed
    losses = ledger_steps(engine)
    assert sorted(losses) == [1, 2], "the SIGKILL cost one attempt and the relaunch finished"

    # TensorBoard: one run per attempt, every ingested step's loss as the ledger has it.
    board = tmp_path / "tb" / "drill" / "long"
    for attempt, steps in losses.items():
        got = scalars(board / f"attempt-{attempt}", "loss")
        assert sorted(got) == sorted(steps)
        assert all(math.isclose(got[k], v, rel_tol=1e-6) for k, v in steps.items())
        for tag in ("tokens", "tokens_per_s", "step_time_s", "lr", "mem_peak_gib"):
            assert sorted(scalars(board / f"attempt-{attempt}", tag)) == sorted(steps), tag
    events = texts(board / "events")
    [relaunch] = events["relaunch"]
    assert "crashed_node" in relaunch and "exit 137" in relaunch, relaunch
    [excluded] = events["node_excluded"]
    assert "excluded local-n0" in excluded, excluded
    assert "killed by SIGKILL" in excluded and '"exit_class": "crashed_node"' in excluded, excluded  # why
    assert any("running -> passed" in t for t in events["stage_state"])
    assert any("-> succeeded" in t for t in texts(tmp_path / "tb" / "drill" / "events")["campaign_state"])

    # `ledger export --format tensorboard` writes the same after the fact.
    from campaign import commands

    steps, n_events = commands.export_tensorboard(engine.ledger, "drill", tmp_path / "exported")
    assert steps == sum(len(v) for v in losses.values()) and n_events > 0
    again = tmp_path / "exported" / "drill" / "long"
    for attempt in losses:
        for tag in ("loss", "tokens", "tokens_per_s", "step_time_s", "lr", "mem_peak_gib"):
            assert scalars(again / f"attempt-{attempt}", tag) == scalars(board / f"attempt-{attempt}", tag), tag
    assert texts(again / "events") == events

    # W&B, offline: one run for the stage; both attempts' steps; the relaunch and the exclusion as alerts.
    [run_dir] = (tmp_path / "campaigns" / "drill" / "wandb").glob("offline-run-*")
    run = wandb_file.read_run(run_dir)
    assert (run["name"], run["group"], run["project"], run["job_type"]) == ("drill/long", "drill", "drill", "long_run")
    logged = {(h["attempt"], h["trainer/step"]): h["loss"] for h in run["history"]}
    assert logged.keys() == {(a, st) for a, steps in losses.items() for st in steps}
    assert all(math.isclose(logged[(a, st)], v, rel_tol=1e-9) for a, steps in losses.items() for st, v in steps.items())
    alerts = {a["title"].split(": ", 1)[1].split(" #")[0]: a for a in run["alerts"]}
    assert "crashed_node" in alerts["relaunch (attempt 1)"]["text"]
    assert "local-n0" in alerts["node_excluded (attempt 1)"]["text"]
    assert "killed by SIGKILL" in alerts["node_excluded (attempt 1)"]["text"], "the exclusion's cause"
    assert alerts["relaunch (attempt 1)"]["level"] == "WARN"
    assert run["summary"]["state"] == "passed" and run["exit"] == 0
    assert f"wandb sync {run_dir}" in printed, printed
    synced = subprocess.run([str(Path(sys.executable).parent / "wandb"), "sync", "--dry-run", str(run_dir)],
                            capture_output=True, text=True, timeout=120, env={"WANDB_MODE": "offline", "PATH": ""})
    assert run_dir.name in synced.stdout + synced.stderr, synced  # wandb's own CLI takes the printed folder

    # Notifications: the webhook failed twice and the command once; each event still arrived, once, in order.
    wanted = ["node_excluded", "relaunch", "stage_passed", "campaign_end"]
    notes = [json.loads(line) for line in (tmp_path / "notes.jsonl").read_text().splitlines()]
    assert [n["event"] for n in notes] == wanted
    relaunched = notes[1]
    assert relaunched["stage"] == "long" and relaunched["attempt"] == 1
    assert relaunched["data"]["exit_class"] == "crashed_node" and "exit 137" in relaunched["message"]
    assert notes[0]["data"]["node"] == "local-n0" and notes[0]["data"]["evidence"]["exit_class"] == "crashed_node"
    assert webhook.requests == len(wanted) + 2
    assert [b["content_type"] for b in webhook.bodies] == ["application/json"] * len(wanted)
    hooks = [b["text"] for b in webhook.bodies]
    assert [set(b) for b in webhook.bodies] == [{"content_type", "text"}] * len(wanted), "Slack's body: text only"
    assert "node excluded" in hooks[0] and "local-n0" in hooks[0]
    assert "relaunch" in hooks[1] and "crashed_node" in hooks[1]
    assert "campaign ended" in hooks[3] and "succeeded" in hooks[3]
    assert "not delivered" not in printed
