"""The report an attempt comes back with is the supervisor's `AttemptReport`, also when the
driver writes it itself (the supervisor app never returned, or the runner was lost): the same
keys, none added on the side (`block_failed` is one of its fields)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from campaign.stagecontext import _app_failure
from campaign.supervisor import AttemptReport

FIELDS = {f.name for f in dataclasses.fields(AttemptReport)}


def test_a_failed_supervisor_app_reports_an_attempt_report(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from parsl.executors.errors import BadStateException

    rep = _app_failure(RuntimeError("boom"), tmp_path)
    assert set(rep) == FIELDS
    assert (rep["exit_code"], rep["exit_class"], rep["block_failed"]) == (1, "crashed_systemic", False)
    assert rep["error"] == "supervisor app failed: boom"
    unstarted = _app_failure(BadStateException(SimpleNamespace(label="block"), RuntimeError("no worker")), tmp_path)
    assert set(unstarted) == FIELDS
    assert (unstarted["exit_code"], unstarted["exit_class"], unstarted["block_failed"]) == (143, "block_lost", True)
