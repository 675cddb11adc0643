"""check-trainer's confirming rerun: an attempt that fails without evidence either way (a
one-off abort) is run once more from the same checkpoint, as a stage would, and its result
counts. The boundary faked here is `checktrainer._launch` (one supervised launch, covered for
real by tests/e2e/test_own_trainer.py): each call returns the report a launch would give."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from campaign import checktrainer, report
from campaign.stagebase import Targets


def _spec(tmp_path: Path):
    script = tmp_path / "train.py"
    script.write_text("")
    return checktrainer.spec_for(script)[0]


def _checkpoint(root: Path, step: int) -> None:
    path = report.begin_checkpoint(root / "checkpoints", step, rank=0)
    report.complete_checkpoint(path, step=step, tokens=step, rank=0)


class Launches:
    """Stands in for `_launch`: hands out the given exit classes in turn, records each call."""

    def __init__(self, *classes: str) -> None:
        self.classes = list(classes)
        self.calls: list[dict[str, Any]] = []

    def __call__(self, spec, spec_dir, root, name, number, targets, resume_from, timeout_s):
        self.calls.append({"name": name, "resume_from": resume_from,
                           "checkpoints": [c["step"] for c in report.list_checkpoints(root / "checkpoints")]})
        cls = self.classes.pop(0)
        code = {"succeeded": 0, "crashed_unknown": 134, "crashed_node": 137}[cls]
        if len(self.calls) == 1 and targets.resume:
            _checkpoint(root, 9)  # the failed run got as far as a checkpoint of its own
        error = 'rank 1 on local-n1 was killed by SIGABRT (134): "terminate called without an active exception"'
        return {"exit_code": code, "exit_class": cls, "error": None if code == 0 else error,
                "run_dir": str(root / name), "metrics": [], "resume_from": resume_from}


def test_a_one_off_abort_is_rerun_from_the_same_checkpoint_and_the_rerun_counts(tmp_path, monkeypatch):
    _checkpoint(tmp_path, 6)
    launches = Launches("crashed_unknown", "succeeded")
    monkeypatch.setattr(checktrainer, "_launch", launches)
    got = checktrainer._attempt(_spec(tmp_path), tmp_path, tmp_path, 2, Targets(steps=9, resume=True), 60)
    assert [c["name"] for c in launches.calls] == ["attempt-002", "attempt-002-rerun"]
    assert [c["resume_from"]["step"] for c in launches.calls] == [6, 6]
    assert launches.calls[1]["checkpoints"] == [6], "the failed run's checkpoint of step 9 is gone before the rerun"
    assert got["exit_code"] == 0
    exit_finding = checktrainer._exit(got)
    assert exit_finding.ok and "confirming rerun" in exit_finding.seen and "SIGABRT (134)" in exit_finding.seen


@pytest.mark.parametrize("cls", ["succeeded", "crashed_node"])
def test_a_success_or_a_failure_with_evidence_is_not_rerun(tmp_path, monkeypatch, cls):
    launches = Launches(cls)
    monkeypatch.setattr(checktrainer, "_launch", launches)
    got = checktrainer._attempt(_spec(tmp_path), tmp_path, tmp_path, 1, Targets(steps=6), 60)
    assert len(launches.calls) == 1 and got["exit_class"] == cls and "rerun_after" not in got


def test_an_abort_that_recurs_stays_missing_and_names_both_runs(tmp_path, monkeypatch):
    monkeypatch.setattr(checktrainer, "_launch", Launches("crashed_unknown", "crashed_unknown"))
    got = checktrainer._attempt(_spec(tmp_path), tmp_path, tmp_path, 1, Targets(steps=6), 60)
    finding = checktrainer._exit(got)
    assert not finding.ok and finding.seen.startswith("exit 134 (crashed_unknown)")
    assert "the first run: rank 1 on local-n1 was killed by SIGABRT" in finding.seen
