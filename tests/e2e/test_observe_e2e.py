"""`campaign submit --tensorboard DIR` with `observe` (W&B offline) and `notify` set, on a long
run whose rank is SIGKILLed (Parsl, three virtual nodes, real gloo ranks), then `campaign
ledger export --format tensorboard`: what a user finds in each tool, read back with the tool's
own reader (tests/observe/ has the in-process twin and the readers' notes)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from e2e_helpers import Workspace, tiny_spec

pytestmark = pytest.mark.slow
pytest.importorskip("tensorboard")
pytest.importorskip("wandb")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "observe"))

FAST_WATCHDOG = {"startup_s": 120, "step_factor": 3, "floor_s": 4, "heartbeat_stale_s": 5}


def _texts(folder: Path) -> dict[str, list[str]]:
    from tensorboard.backend.event_processing.event_accumulator import TENSORS, EventAccumulator
    from tensorboard.util import tensor_util

    acc = EventAccumulator(str(folder), size_guidance={TENSORS: 0})
    acc.Reload()
    return {tag: [tensor_util.make_ndarray(e.tensor_proto).item().decode() for e in acc.Tensors(tag)]
            for tag in acc.Tags()["tensors"]}


def test_submit_with_observers_drilled_with_a_kill(ws: Workspace) -> None:
    import wandb_file

    spec = tiny_spec("observed", [{"name": "long", "kind": "long_run", "nodes": 2, "steps": 30, "checkpoint_every": 10,
                                   "max_attempts": 3, "backoff_s": 0, "timeout_s": 300, "watchdog": FAST_WATCHDOG,
                                   "faults": [{"kind": "sigkill", "step": 25, "node": "local-n0", "attempt": 1}]}])
    spec["observe"] = {"wandb": {"project": "drill"}}  # the local site's default mode is online: no credentials here
    spec["notify"] = {"command": "cat >> notes.jsonl"}
    path = ws.write_spec(spec)
    r = ws.cli("submit", str(path), "--tensorboard", "tb", CAMPAIGN_ALLOW_FAULTS="1", WANDB_API_KEY="",
               HOME=str(ws.root))  # no ~/.netrc: the run must go offline, with no prompt and no network
    assert r.code == 0, r.out + r.err
    assert "no credentials on this host" in r.out and "wandb sync " in r.out

    board = ws.root / "tb" / "observed" / "long"
    assert sorted(p.name for p in board.iterdir()) == ["attempt-1", "attempt-2", "events"]
    events = _texts(board / "events")
    assert "crashed_node" in events["relaunch"][0] and "excluded local-n0" in events["node_excluded"][0]

    [run_dir] = (ws.workdir / "observed" / "wandb").glob("offline-run-*")
    run = wandb_file.read_run(run_dir)
    assert {h["attempt"] for h in run["history"]} == {1, 2} and run["summary"]["state"] == "passed"
    assert any("relaunch" in a["title"] and "crashed_node" in a["text"] for a in run["alerts"])
    assert str(run_dir) in r.out

    notes = [json.loads(line) for line in (ws.root / "notes.jsonl").read_text().splitlines()]
    assert [n["event"] for n in notes] == ["node_excluded", "relaunch", "stage_passed", "campaign_end"]
    assert notes[1]["data"]["exit_class"] == "crashed_node"

    out = ws.root / "after"
    r = ws.cli("ledger", "export", "observed", "--format", "tensorboard", "--out", str(out))
    assert r.code == 0, r.err
    assert _texts(out / "observed" / "long" / "events") == events
    r = ws.cli("ledger", "export", "observed", "--format", "tensorboard")
    assert r.code == 2 and "give --out DIR" in r.err
