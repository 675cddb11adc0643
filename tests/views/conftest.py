"""A ledger in a known state, built with the query functions (no training): campaign
`demo-run` with a smoke test, a scaling stage (its table), and a long run whose first
attempt stalled, got its node excluded and was relaunched from a checkpoint. Every
timestamp is fixed, so views of it can be compared with stored text.

Regenerate the stored views (tests/views/golden/*.txt) after an intended change with:

    CAMPAIGN_UPDATE_GOLDEN=1 pytest tests/views
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from campaign.ledger import Ledger, open_ledger, writes
from campaign.ledger.models import Attempt, Campaign, Event, Exclusion, StageRun

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("CAMPAIGN_UPDATE_GOLDEN") == "1"
T0 = dt.datetime(2026, 11, 29, 8, 0, 0)
SCALING_TABLE = [
    {"nodes": 1, "ranks": 1, "step_time_s": 0.0169, "tokens_per_s": 15153.1, "comm_time_s": 0.000225,
     "comm_share": 0.0133, "mem_peak_gib": 0.346, "last_loss": 4.8198, "loss": 4.8198, "efficiency": 1.0},
    {"nodes": 2, "ranks": 2, "step_time_s": 0.0205, "tokens_per_s": 24980.7, "comm_time_s": 0.00312,
     "comm_share": 0.152, "mem_peak_gib": 0.344, "last_loss": 4.8198, "loss": 4.8198, "efficiency": 0.824},
]


def steps(first: int, last: int, *, per_step: int = 512, offset: float = 0.0, slow_at: int | None = None) -> list[dict[str, Any]]:
    """Deterministic step rows: loss falls as 6 / (1 + step / 40); step time 40 ms."""
    return [{"step": i, "tokens": per_step * i, "loss": round(6.0 / (1 + i / 40) + offset, 6),
             "step_time_s": 0.5 if i == slow_at else 0.04, "tokens_per_s": per_step / 0.04, "lr": 1e-3}
            for i in range(first, last + 1)]


def build_demo(led: Ledger) -> None:
    with led.session() as s:
        c = writes.create_campaign(s, name="demo-run", digest="ab" * 32, spec_json={"name": "demo-run"}, source="",
                                   site="local", workdir="/w/demo-run")
        smoke, scaling, long_run = writes.ensure_stage_runs(s, c, [("smoke", "smoke"), ("scaling", "scaling"),
                                                                   ("long-run", "long_run")])
        writes.set_campaign_state(s, c, "running")
        # smoke: one attempt on 2 nodes
        writes.set_stage_state(s, smoke, "running")
        a = writes.create_attempt(s, smoke, nodes=["local-n0", "local-n1"], ranks_per_node=1, run_dir="/w/smoke/a1")
        writes.ingest_steps(s, a, steps(1, 5))
        writes.finish_attempt(s, a, state="succeeded", exit_code=0, suspects=[], summary={"duration_s": 7.5})
        writes.set_stage_state(s, smoke, "passed", verdict="2/2 ranks reported; all-reduce 3 == 3; 5 steps, loss finite",
                               numbers={"expected_ranks": 2, "ranks_reported": 2, "steps_done": 5})
        # scaling: 1 and 2 nodes
        writes.set_stage_state(s, scaling, "running")
        for n in (1, 2):
            a = writes.create_attempt(s, scaling, nodes=[f"local-n{i}" for i in range(n)], ranks_per_node=1,
                                      run_dir=f"/w/scaling/a{n}", label=f"{n} node(s)", tokens_base=int(scaling.tokens))
            writes.ingest_steps(s, a, steps(1, 20))
            writes.finish_attempt(s, a, state="succeeded", exit_code=0, suspects=[], summary={})
        writes.set_stage_state(s, scaling, "passed", verdict="2 node counts; efficiency at 2 node(s) 0.82",
                               numbers={"table": SCALING_TABLE, "min_efficiency": 0.25})
        # long run: attempt 1 stalls at step 60 (local-n1 blamed), is excluded; attempt 2 resumes from step 40
        writes.set_stage_state(s, long_run, "running")
        a1 = writes.create_attempt(s, long_run, nodes=["local-n0", "local-n1"], ranks_per_node=1, run_dir="/w/long/a1")
        writes.ingest_steps(s, a1, steps(1, 60, slow_at=30))
        suspects = [{"node": "local-n1", "reason": "no heartbeat for 30 s"}]
        writes.finish_attempt(s, a1, state="stalled", exit_code=124, suspects=suspects, summary={"killed_by": "watchdog"})
        writes.exclude_node(s, site="local", node="local-n1", reason="stalled: no heartbeat for 30 s", attempt=a1,
                            evidence={"attempt": a1.id})
        writes.add_event(s, c, "node_excluded", "excluded local-n1 on site local: no heartbeat for 30 s",
                         stage_run=long_run, attempt=a1, data={"node": "local-n1"})
        writes.add_event(s, c, "relaunch", "relaunch 1 (attempt 2) after hang: from the checkpoint of step 40; "
                         "20 step(s) lost [stalled, exit 124]", stage_run=long_run, attempt=a1,
                         data={"relaunch": 1, "attempt": 2, "cause": "hang", "exit_class": "stalled", "resume_step": 40,
                               "steps_lost": 20, "rescued": False, "last_step": 60, "excluded": ["local-n1"]})
        a2 = writes.create_attempt(s, long_run, nodes=["local-n0", "local-n2"], ranks_per_node=1, run_dir="/w/long/a2",
                                   tokens_base=0, label="relaunch 1", target_steps=100)
        writes.ingest_steps(s, a2, steps(41, 100, offset=0.01))
        writes.finish_attempt(s, a2, state="succeeded", exit_code=0, suspects=[], summary={})
        writes.set_stage_state(s, long_run, "passed", verdict="reached 51,200 tokens (step 100) in 2 attempt(s); final loss 1.2100",
                               numbers={"attempts": 2, "last_step": 100, "exit_classes": ["stalled", "succeeded"]})
        writes.set_campaign_state(s, c, "succeeded")
    _fix_times(led)


def _fix_times(led: Ledger) -> None:
    """Every timestamp a view shows, made deterministic (10 s per attempt, 1 s apart)."""
    with led.session() as s:
        for i, a in enumerate(s.scalars(sa.select(Attempt).order_by(Attempt.id))):
            a.started = T0 + dt.timedelta(seconds=60 * i)
            a.finished = a.started + dt.timedelta(seconds=10 + 5 * i)
            a.created = a.updated = a.started
        for i, e in enumerate(s.scalars(sa.select(Event).order_by(Event.id))):
            e.created = T0 + dt.timedelta(seconds=i)
        for e in s.scalars(sa.select(Exclusion)):
            e.created = e.updated = T0 + dt.timedelta(minutes=5)
        for r in s.scalars(sa.select(StageRun)):
            r.created = r.updated = T0
        for c in s.scalars(sa.select(Campaign)):
            c.created = c.updated = T0 + dt.timedelta(minutes=10)


@pytest.fixture(scope="session")
def _demo_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("demo") / "ledger.db"
    led = open_ledger(f"sqlite:///{path}")
    try:
        build_demo(led)
        with led.engine.connect() as conn:  # fold the WAL in, so one file is the whole ledger
            conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        led.close()
    return path


@pytest.fixture
def demo_url(_demo_file: Path, tmp_path: Path) -> str:
    """A fresh copy of the demo ledger (built once per session)."""
    path = tmp_path / "ledger.db"
    shutil.copyfile(_demo_file, path)
    return f"sqlite:///{path}"


@pytest.fixture
def demo(demo_url: str) -> Iterator[Ledger]:
    led = open_ledger(demo_url)
    try:
        yield led
    finally:
        led.close()


def check_golden(name: str, text: str) -> None:
    """Compare `text` with tests/views/golden/NAME (rewritten when CAMPAIGN_UPDATE_GOLDEN=1)."""
    path = GOLDEN / name
    if UPDATE:
        path.write_text(text)
        return
    assert path.exists(), f"no stored view {path}; create it with CAMPAIGN_UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{name} changed; if intended, regenerate with CAMPAIGN_UPDATE_GOLDEN=1"


@pytest.fixture
def golden() -> Any:
    """`golden(NAME, text)`: compare with the stored view (see the module docstring)."""
    return check_golden
