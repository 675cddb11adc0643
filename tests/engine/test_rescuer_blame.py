"""Blame when the rescuer dies (issue 30, item 7): rank 0 (node local-n0) crashes; rank 1
(node local-n1), asked to save a rescue checkpoint, is killed (SIGKILL) as it starts writing
it. Rank 1's death is a consequence of the rescue, not evidence against its node: local-n1 is
never excluded. A real ledger, the built-in trainer with gloo, the supervisor in a thread."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from campaign.runner import run_in_thread
from campaign.engine import Engine
from campaign.ledger import open_ledger, reads
from campaign.progress import Progress
from campaign.spec import CampaignSpec


def test_a_rescuer_killed_mid_save_does_not_get_its_healthy_node_excluded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CAMPAIGN_ALLOW_FAULTS", "1")
    faults = [{"kind": "crash", "step": 12, "rank": 0, "attempt": 1},
              {"kind": "sigkill_in_rescue", "step": 1, "rank": 1, "attempt": 1}]
    spec = CampaignSpec.model_validate({
        "name": "rescuer", "site": {"kind": "local", "nodes": 3, "ranks_per_node": 1}, "model": {"size": "tiny"},
        "trainer": {"micro_batch_size": 2, "warmup_steps": 2},
        "stages": [{"name": "long", "kind": "long_run", "nodes": 2, "steps": 16, "checkpoint_every": 5,
                    "max_attempts": 3, "backoff_s": 0, "timeout_s": 120, "faults": faults,
                    "watchdog": {"startup_s": 120, "step_factor": 3, "floor_s": 4, "heartbeat_stale_s": 5}}]})
    log = io.StringIO()
    engine = Engine(spec, open_ledger(f"sqlite:///{tmp_path / 'ledger.db'}"), workdir=tmp_path / "campaigns",
                    progress=Progress(log), runner=run_in_thread)
    try:
        assert engine.submit() == 0, log.getvalue()
        with engine.ledger.session() as s:
            c = reads.get_campaign(s, "rescuer")
            excluded = {e.node for e in reads.list_exclusions(s, "local")}
            attempts = [a for _, a in reads.list_attempts(s, c)]
            first = attempts[0]
            rescue = (first.summary or {}).get("rescue") or {}
    finally:
        engine.ledger.close()
    assert "local-n1" not in excluded, (excluded, log.getvalue())
    assert rescue.get("rank") == 1 and not rescue.get("saved"), rescue
