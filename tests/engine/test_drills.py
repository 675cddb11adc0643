"""Issue 40: a drill leaves no trap. `campaign inject` hangs a rank of a running long run (the
real command's function, on the real run directory and process groups); the watchdog names
its node, which is excluded for that campaign only, announced with the exact command that
lifts it; the next campaign on the same site still gets every node.

Before issue 40, the drill's exclusion held the whole local site for 24 h, silently, and the
next local campaign's smoke test failed with "all-reduce over 0 ranks returned None".
The engine runs without Parsl (`run_in_thread`), as in test_engine_in_process.py.
"""

from __future__ import annotations

import io
import threading
from pathlib import Path
from typing import Any

import pytest

from campaign import commands
from campaign.engine import Engine
from campaign.ledger import open_ledger, reads
from campaign.progress import Progress
from campaign.runner import run_in_thread
from campaign.spec import CampaignSpec


def _spec(name: str, stages: list[dict[str, Any]]) -> CampaignSpec:
    return CampaignSpec.model_validate({
        "name": name, "site": {"kind": "local", "nodes": 3, "ranks_per_node": 1}, "model": {"size": "tiny"},
        "trainer": {"micro_batch_size": 2, "warmup_steps": 2}, "stages": stages})


def test_a_drills_exclusion_binds_its_campaign_only_and_says_how_to_lift_it(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CAMPAIGN_ALLOW_FAULTS", "1")  # the slow-down below
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    out = io.StringIO()
    # At least 0.1 s a step: on a loaded machine (CI's two workers) the drill landed ten steps
    # late, inside the step-20 save, and the relaunch rightly used that checkpoint, no rescue.
    slow = {"kind": "slow", "step": 1, "delay_s": 0.1}
    first = Engine(_spec("drilled", [{"name": "long", "kind": "long_run", "nodes": 2, "steps": 120,
                                      "checkpoint_every": 20, "max_attempts": 2, "timeout_s": 300,
                                      "faults": [slow],
                                      "watchdog": {"heartbeat_stale_s": 5}}]),  # as examples/local.yaml
                   open_ledger(url), workdir=tmp_path / "campaigns", progress=Progress(out), runner=run_in_thread)
    drill: dict[str, Any] = {}
    inject = threading.Thread(target=lambda: drill.update(commands.inject_fault(
        open_ledger(url), "drilled", "hang", 1, after_step=10, attempt="next", stage="long", wait_s=240)))
    inject.start()
    assert first.submit() == 0, out.getvalue()
    inject.join(timeout=10)
    assert drill["signal"] == "SIGSTOP" and drill["run_dir"].endswith("attempt-001")
    said = " ".join(out.getvalue().split())  # the log wraps at 120 columns
    assert "excluded local-n1 for campaign drilled only (a drill) for 24 h: " in said, said
    assert "lift: campaign nodes include local-n1 --site local" in said
    with first.ledger.session() as s:
        c = reads.get_campaign(s, "drilled")
        [excl] = reads.list_exclusions(s, "local")
        assert (excl.node, excl.campaign_id) == ("local-n1", c.id)
        [(_, a1), (_, a2)] = reads.list_attempts(s, c)
        assert a1.state == "stalled" and a2.label == "relaunch 1" and a2.nodes == ["local-n0", "local-n2"]
        [news] = [e for e in reads.list_news(s, c, limit=50) if e.kind == "relaunch"]
        assert news.message.startswith("relaunch 1 (attempt 2) after hang (a drill): from the rescue checkpoint of step ")
        assert "; 0 step(s) lost [stalled, exit 124; " in news.message
        assert news.data["cause"] == "hang" and news.data["excluded"] == ["local-n1"] and news.data["rescued"]
        assert news.data["drill"] == "`campaign inject hang` on rank 1"
        [excluded] = [e for e in reads.list_news(s, c, limit=50) if e.kind == "node_excluded"]
        assert excluded.data["evidence"]["drill"] == "`campaign inject hang` on rank 1"
    first.ledger.close()
    # The next campaign on the site: its smoke test gets all three nodes.
    second = Engine(_spec("after", [{"kind": "smoke", "steps": 2, "timeout_s": 120}]), open_ledger(url),
                    workdir=tmp_path / "campaigns", progress=Progress(io.StringIO(), quiet=True), runner=run_in_thread)
    assert second.submit() == 0
    with second.ledger.session() as s:
        [(_, a)] = reads.list_attempts(s, reads.get_campaign(s, "after"))
        assert a.nodes == ["local-n0", "local-n1", "local-n2"]
    second.ledger.close()
