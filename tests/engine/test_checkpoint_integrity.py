"""Checkpoint integrity (issue 30, item 4): meta.json records a CRC-32 per file at save; a
resume verifies them before it loads, skips a checkpoint whose bytes changed (same size, so
the size check alone passes it) and falls back to the previous complete one, with a ledger
event naming the skipped folder, why, and the one really loaded. A real ledger, the built-in
trainer (one gloo rank), the supervisor in a thread."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from campaign.runner import run_in_thread
from campaign.engine import Engine
from campaign.ledger import open_ledger, reads
from campaign.progress import Progress
from campaign.spec import CampaignSpec


def _engine(tmp_path: Path) -> Engine:
    """A long run of 12 steps, checkpoints every 4; rank 0 crashes at step 11 of attempt 1 only."""
    stage = {"name": "long", "kind": "long_run", "nodes": 1, "steps": 12, "checkpoint_every": 4, "max_attempts": 1,
             "timeout_s": 120, "faults": [{"kind": "crash", "step": 11, "rank": 0, "attempt": 1}]}
    spec = CampaignSpec.model_validate({
        "name": "integrity", "site": {"kind": "local", "nodes": 1, "ranks_per_node": 1}, "model": {"size": "tiny"},
        "trainer": {"micro_batch_size": 2, "warmup_steps": 2, "rescue": False}, "stages": [stage]})
    return Engine(spec, open_ledger(f"sqlite:///{tmp_path / 'ledger.db'}"), workdir=tmp_path / "campaigns",
                  progress=Progress(io.StringIO(), quiet=True), runner=run_in_thread)


def test_a_same_size_corrupted_checkpoint_is_skipped_with_a_ledger_event(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CAMPAIGN_ALLOW_FAULTS", "1")
    engine = _engine(tmp_path)
    try:
        assert engine.submit() == 1, "one attempt only: the crash fails the stage"
    finally:
        engine.ledger.close()
    ckpts = tmp_path / "campaigns" / "integrity" / "long" / "checkpoints"
    assert sorted(p.name for p in ckpts.glob("step-*")) == ["step-00000004", "step-00000008"]
    newest = ckpts / "step-00000008"
    meta = json.loads((newest / "meta.json").read_text())
    shard = max(newest.glob("*.distcp"), key=lambda f: f.stat().st_size)
    assert meta["checksums"][shard.name].startswith("crc32:")
    data = bytearray(shard.read_bytes())  # flip bytes in the middle of the largest shard: same size
    data[len(data) // 2: len(data) // 2 + 64] = bytes(b ^ 0xFF for b in data[len(data) // 2: len(data) // 2 + 64])
    shard.write_bytes(bytes(data))

    engine = _engine(tmp_path)  # what `campaign resume` does
    try:
        assert engine.submit() == 0
        with engine.ledger.session() as s:
            c = reads.get_campaign(s, "integrity")
            attempts = [a for _, a in reads.list_attempts(s, c)]
            assert attempts[1].first_step == 5, "resumed from step 4, not from the corrupted step 8"
            [ev] = [e for e in reads.list_events(s, c) if e.kind == "checkpoint_skipped"]
            assert ev.data["path"] == str(newest) and ev.data["loaded"] == str(ckpts / "step-00000004")
            assert f"{shard.name} has checksum crc32:" in ev.data["why"] and "(corrupted)" in ev.data["why"]
            assert reads.list_exclusions(s, "local") == [], "a corrupted file is no node's fault"
            steps = sorted({m.step for a in attempts for m in reads.list_steps(s, a.id)})
            assert steps == list(range(1, 13)), "no step lost"
    finally:
        engine.ledger.close()
