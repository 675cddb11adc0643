"""The trainer's files, split by who uses them (issue 43): `campaign.report` holds what trainers
write, `campaign.runfiles` the driver's readers, `campaign.heartbeatslot` the slot format both
share, and `campaign.fields` the keys of a metrics row, an event and a heartbeat, named once.

* the three new modules need only the standard library (tests/unit/test_architecture.py,
  with the other contract helpers), and none of them imports
  `campaign.report` (which forwards the readers' old names to `runfiles`, so the other way
  round would be a circle);
* importing `campaign.report` (what a trainer does) loads no reader;
* every name that moved is still reachable as `report.NAME` (older scripts);
* the writer and the readers spell out no key: they take them from `campaign.fields`, whose
  values are the stored strings of the trainer contract, and whose float fields are the
  ledger's step columns.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from campaign import fields, report, runfiles

REPO = Path(__file__).resolve().parents[2]
NEW = ("campaign.runfiles", "campaign.fields", "campaign.heartbeatslot")


@pytest.mark.parametrize("module", NEW)
def test_the_new_modules_never_import_report(module: str) -> None:
    tree = ast.parse((REPO / (module.replace(".", "/") + ".py")).read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {f"{n.module}.{a.name}" if n.module == "campaign" else str(n.module)
                 for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    assert "campaign.report" not in imported


def test_a_trainer_importing_report_loads_no_reader() -> None:
    code = ("import sys\nimport campaign.report as r\nbefore = 'campaign.runfiles' in sys.modules\n"
            "r.read_metrics\nprint(before, 'campaign.runfiles' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "True"]


def test_the_moved_names_are_still_reachable_from_report() -> None:
    for name in report._READERS:
        assert getattr(report, name) is getattr(runfiles, name), name
    from campaign.report import StepChain, read_heartbeats  # noqa: F401 (the import itself is the test)

    assert StepChain is runfiles.StepChain
    assert report.decode_heartbeat_slot(report.encode_heartbeat_slot({"node": "n1"}) or b"") == {"node": "n1"}
    with pytest.raises(AttributeError, match="no_such_reader"):
        report.no_such_reader  # noqa: B018


def test_the_float_fields_are_the_ledgers_step_columns() -> None:
    from campaign.ledger.models import StepMetric

    columns = [c.name for c in StepMetric.__table__.columns if c.name not in ("id", "attempt_id", "step", "tokens")]
    assert columns == list(fields.METRIC_FIELDS)


def test_the_keys_are_the_stored_strings_of_the_contract() -> None:
    assert (fields.STEP, fields.TIME, fields.TOKENS, fields.LOSS, fields.STEP_TIME_S) == (
        "step", "time", "tokens", "loss", "step_time_s")
    assert (fields.EVENT, fields.SECONDS) == ("event", "seconds")
    assert (fields.NODE, fields.RANKS, fields.PHASE, fields.SINCE, fields.COMPUTE_S) == (
        "node", "ranks", "phase", "since", "compute_s")


def test_a_reporter_writes_those_keys(tmp_path: Path) -> None:
    rep = report.Reporter(tmp_path, rank=0, local_rank=0, world_size=1, node="n1", interval=60)
    try:
        rep.phase("compute", 1)
        rep.phase("collective", 1)
        rep.step(step=1, tokens=8, loss=2.5, step_time_s=0.1)
        rep.event("checkpoint_saved", 1, seconds=0.2)
    finally:
        rep.close()
    row, = runfiles.read_metrics(tmp_path)[0]
    assert sorted(row) == ["loss", "step", "step_time_s", "time", "tokens"]
    event, = runfiles.read_events(tmp_path)
    assert sorted(event) == ["event", "seconds", "step", "time"]
    beat = runfiles.read_heartbeats(tmp_path)["n1"]
    assert sorted(beat) == ["node", "ranks", "time"]
    assert sorted(beat["ranks"]["0"]) == ["compute_s", "phase", "since", "step", "time"]


def _key_literals(tree: ast.AST, keys: set[str]) -> list[str]:
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef)) and n.body
                  and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return [f"line {n.lineno}: {n.value!r}" for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and n.value in keys and id(n) not in docstrings]


def test_the_writer_and_the_readers_spell_out_no_key() -> None:
    """Each key is named in campaign/fields.py only: the Reporter (the writer of metrics rows,
    events and heartbeats) and the readers take them from there."""
    keys = {v for k, v in vars(fields).items() if k.isupper() and isinstance(v, str)}
    readers = ast.parse((REPO / "campaign" / "runfiles.py").read_text())
    writer, = (n for n in ast.parse((REPO / "campaign" / "report.py").read_text()).body
               if isinstance(n, ast.ClassDef) and n.name == "Reporter")
    assert _key_literals(readers, keys) == []
    assert _key_literals(writer, keys) == []
