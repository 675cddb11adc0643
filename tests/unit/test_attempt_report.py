"""The report an attempt comes back with is typed (`campaign.attempt.AttemptReport`), also
when the driver writes it itself (the supervisor app never returned, or the runner was lost),
and a report with keys on the side is refused, not passed along (issue 29, item 1)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from campaign.attempt import AttemptReport
from campaign.stagecontext import _app_failure, _summary


def test_a_failed_supervisor_app_reports_an_attempt_report(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from parsl.executors.errors import BadStateException

    rep = _app_failure(RuntimeError("boom"), tmp_path)
    assert isinstance(rep, AttemptReport)
    assert (rep.exit_code, rep.exit_class, rep.block_failed) == (1, "crashed_systemic", False)
    assert rep.error == "supervisor app failed: boom"
    unstarted = _app_failure(BadStateException(SimpleNamespace(label="block"), RuntimeError("no worker")), tmp_path)
    assert (unstarted.exit_code, unstarted.exit_class, unstarted.block_failed) == (143, "block_lost", True)


def test_the_supervisors_dict_reads_back_as_the_same_report_and_unknown_keys_are_refused() -> None:
    sent = AttemptReport(exit_code=124, exit_class="stalled", duration_s=12.5, nodes=["n0", "n1"], stall="no new step",
                         suspects=[{"node": "n1", "reason": "rank 1 heartbeat stopped", "evidence": {}}],
                         detected_after_s=4.2)
    assert AttemptReport.from_dict(sent.to_dict()) == sent
    # A supervisor of an older release sends fewer keys: they take their defaults.
    older = {k: v for k, v in sent.to_dict().items() if k not in ("rescue", "block_failed")}
    assert AttemptReport.from_dict(older) == sent
    with pytest.raises(ValueError, match="unknown key.*block_lost_on_the_side"):
        AttemptReport.from_dict({**sent.to_dict(), "block_lost_on_the_side": True})


def test_the_ledger_summary_keeps_what_a_user_reads_and_drops_empty_fields() -> None:
    rep = AttemptReport(exit_code=124, exit_class="stalled", duration_s=3.0, nodes=["n0"], stall="no new step",
                        detected_after_s=4.2)
    assert _summary(rep) == {"duration_s": 3.0, "stall": "no new step", "detected_after_s": 4.2}
    assert {f.name for f in dataclasses.fields(AttemptReport)} >= set(_summary(rep))
