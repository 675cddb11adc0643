"""Goodput on a real local campaign (Parsl, virtual nodes, gloo ranks): a long run that
crashes once, relaunches from its checkpoint and finishes; `campaign status --json` then
accounts for every second of its wall time, and text status and the plot show it. With a
rescue checkpoint (the default) the relaunch recomputes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
from e2e_helpers import Workspace, ledger_view, tiny_spec

pytestmark = pytest.mark.slow

BUCKETS = {"startup_s", "checkpoint_stall_s", "recomputed_s", "detection_s", "restart_s", "other_s"}


def _balanced(g: dict) -> None:
    assert set(g["lost"]) == BUCKETS
    assert g["productive_s"] + sum(g["lost"].values()) == pytest.approx(g["wall_s"], abs=0.01)
    assert 0 < g["ettr"] < 1 and g["ettr"] == pytest.approx(g["productive_s"] / g["wall_s"], abs=1e-3)


def test_a_crashed_and_relaunched_long_run_accounts_for_its_wall_time(ws: Workspace) -> None:
    stage = {"name": "long", "kind": "long_run", "steps": 60, "checkpoint_every": 20, "max_attempts": 2,
             "exclude_suspects": False, "faults": [{"kind": "crash", "step": 45, "rank": 1, "attempt": 1}]}
    doc = tiny_spec("gp", [{"name": "smoke", "kind": "smoke", "steps": 3, "timeout_s": 120}, stage], nodes=2)
    doc["trainer"]["rescue"] = False  # steps since the checkpoint are recomputed: that bucket is under test
    spec = ws.write_spec(doc)
    r = ws.cli("submit", str(spec), CAMPAIGN_ALLOW_FAULTS="1")
    assert r.code == 0, r.out + r.err
    status = ws.status("gp")
    _balanced(status["goodput"])
    smoke, long = status["stages"]
    _balanced(smoke["goodput"])
    _balanced(long["goodput"])
    lost = long["goodput"]["lost"]
    # Steps 41-45 were trained, lost with the crash and trained again after the relaunch.
    assert lost["recomputed_s"] > 0 and lost["detection_s"] > 0 and lost["restart_s"] > 0
    assert lost["startup_s"] > 0 and lost["checkpoint_stall_s"] > 0
    assert smoke["goodput"]["lost"]["recomputed_s"] == smoke["goodput"]["lost"]["restart_s"] == 0
    total = status["goodput"]
    assert total["wall_s"] >= smoke["goodput"]["wall_s"] + long["goodput"]["wall_s"] - 0.01
    # Young/Daly: the run measured its saves and its step time, and the ledger saw one fault.
    interval = long["checkpoint_interval"]
    assert interval["source"] == "site history" and interval["steps"] >= 1 and interval["save_s"] > 0

    text = ws.cli("status", "gp")
    assert text.code == 0
    assert "goodput" in text.out and "ETTR" in text.out and "startup" in text.out, text.out
    # the text names every bucket worth 0.05 s or more (4 recomputed steps of a tiny model may be less)
    from campaign.views import GOODPUT_LABELS as LABELS

    shown = [LABELS[k] for k, v in lost.items() if v >= 0.05]
    assert all(label in text.out for label in shown), (shown, text.out)
    plot = ws.cli("plot", "gp", "--kind", "goodput", "--out", str(ws.root / "plots"))
    assert plot.code == 0, plot.err
    assert Path(plot.out.strip()).stat().st_size > 10_000


def test_a_rescued_relaunch_recomputes_nothing(ws: Workspace) -> None:
    """Rank 1 crashes at the start of step 45 (checkpoints every 20): rank 0, whose collective
    failed, saves step 44 when the supervisor asks, and the relaunch goes on from there."""
    stage = {"name": "long", "kind": "long_run", "steps": 60, "checkpoint_every": 20, "max_attempts": 2,
             "exclude_suspects": False, "faults": [{"kind": "crash", "step": 45, "rank": 1, "attempt": 1}]}
    r = ws.cli("submit", str(ws.write_spec(tiny_spec("rescued", [stage], nodes=2))), CAMPAIGN_ALLOW_FAULTS="1")
    assert r.code == 0, r.out + r.err
    view = ledger_view(ws, "rescued")
    a1, a2 = view["attempts"]
    assert a1["state"] == "crashed_unknown" and a1["last_step"] == 44
    rescue = a1["summary"]["rescue"]
    assert rescue["saved"] and rescue["step"] == 44 and rescue["rank"] == 0, rescue
    assert a2["first_step"] == 45, "resumed from the rescued step 44, not the checkpoint of step 40"
    messages = dict(view["events"])
    assert messages["rescue"].startswith("rescue checkpoint of step 44 saved by rank 0"), messages["rescue"]
    assert "from the rescue checkpoint of step 44; 0 step(s) lost" in messages["relaunch"], messages["relaunch"]
    long = ws.status("rescued")["stages"][0]
    _balanced(long["goodput"])
    assert long["goodput"]["lost"]["recomputed_s"] == 0


def test_auto_checkpoint_interval_without_a_failure_rate_is_refused(ws: Workspace) -> None:
    stage = {"name": "long", "kind": "long_run", "steps": 20, "checkpoint_every": "auto"}
    r = ws.cli("submit", str(ws.write_spec(tiny_spec("auto", [stage], nodes=2))))
    assert r.code == 2
    assert "stages[0].checkpoint_every: auto needs a failure rate" in r.err and "stages[0].mtbf_s" in r.err, r.err
    assert not (ws.workdir / "ledger.db").exists()  # the ledger untouched: not even created


def test_auto_checkpoint_interval_from_a_stated_mtbf(ws: Workspace) -> None:
    """No history: the first launch checkpoints at the provisional interval; once a save and
    steps were measured the next launch uses Young/Daly (here after a deliberate crash)."""
    stage = {"name": "long", "kind": "long_run", "steps": 70, "checkpoint_every": "auto", "mtbf_s": 3600,
             "max_attempts": 2, "exclude_suspects": False,
             "faults": [{"kind": "crash", "step": 55, "rank": 1, "attempt": 1}]}
    r = ws.cli("submit", str(ws.write_spec(tiny_spec("auto", [stage], nodes=2))), CAMPAIGN_ALLOW_FAULTS="1")
    assert r.code == 0, r.out + r.err
    from campaign.ledger import reads

    ledger = ws.ledger()
    try:
        with ledger.session() as s:
            c = reads.get_campaign(s, "auto")
            assert c is not None
            chosen = [e.data for e in reads.list_events(s, c) if e.kind == "checkpoint_interval"]
    finally:
        ledger.close()
    assert chosen[0] == {}  # provisional: nothing measured yet
    assert chosen[1]["source"] == "stated mtbf_s" and chosen[1]["mtbf_s"] == 3600 and chosen[1]["steps"] >= 1
