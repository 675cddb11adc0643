"""Fencing (issue 30, item 3): a driver whose lease another driver took stops at its next
ledger write, which is not committed, even when it has not noticed the take-over itself (its
renewal thread is slow here, as it was with a skewed clock on SQLite: the displaced driver
went on for ~70 s and marked the campaign failed). A real SQLite ledger, a real supervisor (in
a thread) and a stdlib trainer that honours the contract."""

from __future__ import annotations

import io
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from campaign import lease as lease_mod
from campaign.runner import run_in_thread
from campaign.engine import Engine
from campaign.errors import LeaseLost
from campaign.ledger import open_ledger
from campaign.progress import Progress
from campaign.spec import CampaignSpec
from campaign.supervisor import STOP_FILE

TRAINER = textwrap.dedent('''
    """60 steps of 0.1 s each (one rank), through campaign.report."""
    import os, time
    from campaign.report import Reporter
    rep = Reporter.from_env(rank=0, local_rank=0, world_size=1)
    rep.startup({"ranks": [{"rank": 0}], "allreduce": {"got": 1, "expected": 1}})
    for step in range(1, 61):
        rep.phase("compute", step)
        time.sleep(0.1)
        rep.step(step=step, tokens=step * 8, loss=2.0, step_time_s=0.1)
    rep.close()
''')

COUNTS = sa.text("SELECT (SELECT count(*) FROM step_metric), (SELECT count(*) FROM event), "
                 "(SELECT count(*) FROM attempt), (SELECT state FROM campaign), (SELECT max(updated) FROM stage_run)")


def test_a_displaced_driver_commits_nothing_after_the_take_over(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lease_mod, "RENEW_S", 3600.0)  # the displaced driver's renewal will not tell it
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    spec = CampaignSpec.model_validate({
        "name": "fenced", "site": {"kind": "local", "nodes": 1, "ranks_per_node": 1},
        "trainer": {"command": [sys.executable, str(script)]},
        "stages": [{"name": "long", "kind": "long_run", "steps": 60, "timeout_s": 120, "max_attempts": 1}]})
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    engine = Engine(spec, open_ledger(url), workdir=tmp_path / "campaigns", progress=Progress(io.StringIO()),
                    runner=run_in_thread)
    other = sa.create_engine(url)  # the new driver, on another host: it takes the lease over
    seen: dict[str, object] = {}

    def take_over() -> None:
        deadline = time.time() + 60
        while time.time() < deadline:
            with other.connect() as conn:
                if conn.execute(sa.text("SELECT count(*) FROM step_metric")).scalar_one() >= 5:
                    break
            time.sleep(0.05)
        with other.begin() as conn:  # one transaction: the take-over and what the ledger held then
            conn.execute(sa.text("UPDATE lease SET token = 'new-driver', host = 'elsewhere', pid = 1"))
            seen["at_take_over"] = tuple(conn.execute(COUNTS).one())

    thief = threading.Thread(target=take_over)
    thief.start()
    try:
        with pytest.raises(LeaseLost, match="fencing"):
            engine.submit()
    finally:
        thief.join()
        engine.ledger.close()
        (tmp_path / "campaigns" / "fenced" / "long" / "attempt-001" / STOP_FILE).touch()  # the new driver's job now
    with other.connect() as conn:
        after = tuple(conn.execute(COUNTS).one())
    other.dispose()
    assert seen["at_take_over"][0] >= 5
    assert after == seen["at_take_over"], "the displaced driver committed nothing after the take-over"
    assert after[3] == "running", "it did not mark the campaign failed under the new driver"
