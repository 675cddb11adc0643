"""A missing run directory and a resume from another work directory are recoverable states
(issue 39, item 3). A real SQLite ledger, the real engine with its supervisor in a thread
(`run_in_thread`), and a stdlib trainer that honours the contract: it checkpoints every 10
steps (`checkpoints/step-N/` with `.complete` last) and resumes from the newest complete one."""

from __future__ import annotations

import io
import shutil
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from campaign.engine import Engine
from campaign.errors import WorkdirError
from campaign.ledger import open_ledger, reads
from campaign.progress import Progress
from campaign.rundir import STOP_FILE
from campaign.runner import run_in_thread
from campaign.spec import CampaignSpec

TRAINER = textwrap.dedent('''
    """STEPS steps of 0.05 s (one rank), a checkpoint every 10, resuming from the newest complete one."""
    import json, os, time
    from pathlib import Path
    from campaign.report import META_FILE, Reporter, begin_checkpoint, complete_checkpoint, latest_complete_checkpoint
    ckpt = os.environ["CAMPAIGN_CHECKPOINT_DIR"]
    last = int(os.environ["CAMPAIGN_MAX_STEPS"])
    found = latest_complete_checkpoint(ckpt) if os.environ.get("CAMPAIGN_RESUME") == "1" else None
    start = json.loads((found / META_FILE).read_text())["step"] if found else 0
    rep = Reporter.from_env(rank=0, local_rank=0, world_size=1)
    rep.startup({"ranks": [{"rank": 0}], "allreduce": {"got": 1, "expected": 1}})
    for step in range(start + 1, last + 1):
        rep.phase("compute", step)
        time.sleep(0.05)
        rep.step(step=step, tokens=step * 8, loss=2.0, step_time_s=0.05)
        if step % 10 == 0:
            path = begin_checkpoint(ckpt, step, rank=0)
            complete_checkpoint(path, step=step, tokens=step * 8, rank=0)
    rep.close()
''')


def _spec(script: Path, name: str, steps: int = 120) -> CampaignSpec:
    return CampaignSpec.model_validate({
        "name": name, "site": {"kind": "local", "nodes": 1, "ranks_per_node": 1},
        "trainer": {"command": [sys.executable, str(script)]},
        "stages": [{"name": "long", "kind": "long_run", "steps": steps, "timeout_s": 120, "max_attempts": 3,
                    "checkpoint_every": 10, "backoff_s": 0,
                    "watchdog": {"startup_s": 30, "step_factor": 3, "floor_s": 4, "heartbeat_stale_s": 5}}]})


def _engine(spec: CampaignSpec, url: str, workdir: Path, out: io.StringIO | None = None) -> Engine:
    return Engine(spec, open_ledger(url), workdir=workdir, progress=Progress(out or io.StringIO()),
                  runner=run_in_thread)


def _wait_rows(metrics: Path, n: int, timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= n):
        assert time.time() < deadline, f"{metrics} never reached {n} rows"
        time.sleep(0.05)


def _cancel_after(engine: Engine, metrics: Path, n: int) -> threading.Thread:
    """Ctrl-C once the attempt wrote `n` rows (what the engine's signal handler does)."""
    def cancel() -> None:
        _wait_rows(metrics, n)
        engine.cancel_requested = True
        (metrics.parent / STOP_FILE).touch()

    t = threading.Thread(target=cancel)
    t.start()
    return t


def _attempts(url: str, name: str) -> list[dict]:
    ledger = open_ledger(url)
    try:
        with ledger.session() as s:
            c = reads.get_campaign(s, name)
            run = reads.current_stage_runs(s, c)[0]
            return [{"run_dir": a.run_dir, "state": a.state, "steps": [m.step for m in reads.list_steps(s, a.id)]}
                    for a in run.attempts] + [{"stage": run.state, "verdict": run.verdict, "campaign": c.state,
                                               "tokens": run.tokens}]
    finally:
        ledger.close()


def test_resume_from_another_workdir_continues_in_the_recorded_one_or_refuses_naming_it(tmp_path: Path) -> None:
    """A teammate on a shared ledger resumes with their own --workdir. Before: the resume
    trained from step 1 in the new folder, the checkpoints split over two folders."""
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    spec = _spec(script, "shared")
    url = f"sqlite:///{tmp_path / 'shared-ledger.db'}"  # stands for the shared Postgres: the ledger is not the point
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    first = _engine(spec, url, mine)
    t = _cancel_after(first, mine / "shared" / "long" / "attempt-001" / "metrics.jsonl", 25)
    try:
        assert first.submit() == 130
    finally:
        t.join()
        first.ledger.close()
    out = io.StringIO()
    second = _engine(spec, url, theirs, out)
    try:
        assert second.submit() == 0, out.getvalue()
    finally:
        second.ledger.close()
    *attempts, stage = _attempts(url, "shared")
    assert stage["stage"] == "passed", stage
    assert attempts[1]["run_dir"].startswith(str(mine / "shared")), attempts[1]["run_dir"]
    assert attempts[1]["steps"][0] > 1, "the resume continued from the checkpoint in the recorded folder"
    assert not (theirs / "shared").exists(), "nothing started over in the second folder"
    assert f"works in {mine / 'shared'}" in out.getvalue()
    # The recorded folder out of this host's reach: refused, naming it; nothing started here.
    shutil.move(str(mine), str(tmp_path / "elsewhere"))
    third = _engine(spec, url, tmp_path / "third")
    try:
        with pytest.raises(WorkdirError, match=rf"works in {mine / 'shared'} .recorded in the ledger."):
            third.submit()
    finally:
        third.ledger.close()
    assert not (tmp_path / "third" / "shared").exists()


def test_a_run_directory_deleted_mid_stage_is_recreated_and_the_stage_passes(tmp_path: Path) -> None:
    """The attempt's run directory deleted under a running long run. Before: the driver
    crashed (FileNotFoundError on STOP), and after a mkdir every resume failed the stage.
    Now the driver recreates what it owns, adopts what the checkpoints show (steps whose rows
    went with the folder count through the newest complete checkpoint), and the stage passes."""
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    spec = _spec(script, "rmdir")
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    run_dir = tmp_path / "work" / "rmdir" / "long" / "attempt-001"
    engine = _engine(spec, url, tmp_path / "work")

    def delete() -> None:
        _wait_rows(run_dir / "metrics.jsonl", 25)
        shutil.rmtree(run_dir)

    t = threading.Thread(target=delete)
    t.start()
    out = io.StringIO()
    engine.progress = Progress(out)
    try:
        code = engine.submit()
    finally:
        t.join()
        engine.ledger.close()
    *attempts, stage = _attempts(url, "rmdir")
    assert code == 0 and stage["stage"] == "passed", (stage, attempts, out.getvalue())
    assert "Traceback" not in out.getvalue()
    assert stage["tokens"] == 120 * 8
    assert attempts[0]["state"] == "orphaned", attempts  # resumable, nobody's fault: no node named
    ledger = open_ledger(url)
    try:
        with ledger.session() as s:
            assert reads.list_exclusions(s, "local") == [], "a deleted folder is no node's fault"
    finally:
        ledger.close()
    assert sorted(p.name for p in run_dir.iterdir()), "the run directory was made again"
    # Rows lost: only those the deleted metrics.jsonl held that the driver had not ingested yet,
    # or that the trainer wrote into the deleted file, up to the newest complete checkpoint:
    # the relaunch trains every step after it again.
    missing = set(range(1, 121)) - {step for a in attempts for step in a["steps"]}
    assert len(missing) <= 10, f"rows lost: {sorted(missing)}"
    print(f"rows lost: {len(missing)}")
