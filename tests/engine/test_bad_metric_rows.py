"""Garbage in a trainer's metrics.jsonl (issue 13, item 6): the driver skips each bad row,
keeps every valid one, the stage goes on, and `campaign status` warns with the attempt, the
count, the first reason and the file. A real ledger, a real supervisor (in a thread, no
Parsl) and a stdlib trainer that honours the contract and writes the garbage itself."""

from __future__ import annotations

import io
import json
import sys
import textwrap
from pathlib import Path

from campaign.runner import run_in_thread
from campaign.engine import Engine
from campaign import summary
from campaign.ledger import open_ledger, reads
from campaign.progress import Progress
from campaign.spec import CampaignSpec

GARBAGE = ['7', '[1, 2]', '{"step": "4", "loss": 1.0}', '{"step": 4.5, "loss": 1.0}',
           '{"step": 5, "tokens": 1e30, "loss": 1.0}']
"""A bare number, a list, a string step, a float step, 1e30 tokens."""

TRAINER = textwrap.dedent(f'''
    """Five valid steps; before each, rank 0 appends one garbage line to metrics.jsonl."""
    import os, time
    from pathlib import Path
    from campaign.report import METRICS_FILE, Reporter
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    rep = Reporter.from_env(rank=rank, local_rank=int(os.environ["LOCAL_RANK"]), world_size=world)
    rep.startup({{"ranks": [{{"rank": r}} for r in range(world)], "allreduce": {{"got": 1, "expected": 1}}}})
    garbage = {GARBAGE!r}
    for step in range(1, 6):
        rep.phase("compute", step)
        if rank == 0:
            with open(Path(os.environ["CAMPAIGN_RUN_DIR"]) / METRICS_FILE, "a") as f:
                f.write(garbage[step - 1] + "\\n")
        time.sleep(0.3)
        rep.phase("collective", step)
        rep.step(step=step, tokens=step * 8, loss=2.0 - 0.1 * step, step_time_s=0.3)
    rep.close()
''')


def _smoke_of(tmp_path: Path, name: str, trainer: str, steps: int = 5) -> tuple[CampaignSpec, str, io.StringIO, Engine]:
    """A one-stage campaign (a `steps`-step smoke test) of the trainer script `trainer`, on a
    SQLite ledger in tmp_path: (spec, ledger URL, the driver's output, its engine)."""
    script = tmp_path / "trainer.py"
    script.write_text(trainer)
    spec = CampaignSpec.model_validate({
        "name": name, "site": {"kind": "local", "nodes": 1, "ranks_per_node": 1},
        "trainer": {"command": [sys.executable, str(script)]},
        "stages": [{"name": "smoke", "kind": "smoke", "steps": steps, "timeout_s": 120}]})
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    log = io.StringIO()
    engine = Engine(spec, open_ledger(url), workdir=tmp_path / "campaigns", progress=Progress(log), runner=run_in_thread)
    return spec, url, log, engine


def test_garbage_rows_are_skipped_counted_and_shown_by_status(tmp_path: Path, run_cli) -> None:
    spec, url, log, engine = _smoke_of(tmp_path, "garbage", TRAINER)
    try:
        assert engine.submit() == 0, log.getvalue()  # the stage went on and passed
        with engine.ledger.session() as s:
            [(run, a)] = reads.list_attempts(s, reads.get_campaign(s, "garbage"))
            assert [(m.step, m.tokens) for m in reads.list_steps(s, a.id)] == [(i, i * 8) for i in range(1, 6)]
            bad = a.summary["bad_metric_rows"]
    finally:
        engine.ledger.close()
    metrics = tmp_path / "campaigns" / "garbage" / "smoke" / "attempt-001" / "metrics.jsonl"
    assert bad["count"] == 5 and bad["file"] == str(metrics) and len(bad["examples"]) == 5
    assert bad["examples"][0] == "line 1: not a JSON object but int: 7"
    assert [e.split(": ", 2)[1] for e in bad["examples"][1:]] == [
        "not a JSON object but list", "step '4' is not an integer in [0, 2147483647]",
        "step 4.5 is not an integer in [0, 2147483647]", "tokens 1e+30 is not an integer in [0, 1e+18]"]
    said = log.getvalue().replace("\n", "")  # the driver said so once, when it first met one
    assert said.count("warning: smoke attempt 1: ") == 1 and "bad row(s) of " in said

    line = f"stage smoke attempt 1: 5 bad row(s) of {metrics} skipped (not valid metrics rows); first: line 1: " \
           "not a JSON object but int: 7"
    code, out, err = run_cli("status", "garbage", "--json", "--db", url)
    assert code == 0, err
    detail = json.loads(out)
    assert detail["warnings"] == [line] and detail["attempts_detail"][0]["bad_metric_rows"] == 5
    assert any(e["kind"] == "bad_metric_rows" for e in detail["events"])
    code, out, err = run_cli("status", "garbage", "--db", url)
    assert code == 0 and "warning: stage smoke attempt 1: 5 bad row(s) of" in out.replace("\n", " "), out


def test_an_adopted_orphan_keeps_the_count_of_its_bad_rows(tmp_path: Path) -> None:
    """A driver that died left the attempt open; the next one adopts its metrics.jsonl whole
    (recovery.adopt_orphan) and records how many rows it skipped, and why."""
    run_dir = tmp_path / "attempt-001"
    run_dir.mkdir()
    valid = [json.dumps({"step": i, "tokens": i * 8, "loss": 2.0}) for i in range(1, 4)]
    (run_dir / "metrics.jsonl").write_text("\n".join([valid[0], *GARBAGE, *valid[1:]]) + "\n")
    led = open_ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    try:
        assert _adopt(led, tmp_path, run_dir)["steps"] == 3
        with led.session() as s:
            c = reads.get_campaign(s, "orphan")
            [(_, a)] = reads.list_attempts(s, c)
            assert a.summary["bad_metric_rows"]["count"] == 5 and a.last_step == 3
            assert summary.describe_campaign(s, c)["warnings"] == [
                f"stage long attempt 1: 5 bad row(s) of {run_dir / 'metrics.jsonl'} skipped (not valid metrics rows); "
                f"first: line 2: not a JSON object but int: 7"]
    finally:
        led.close()


HUGE = "1" + "0" * 400
"""A 401-digit number: valid JSON, too large for a float (float() raises OverflowError)."""
ADVERSARY = [f'{{"step": 1, "tokens": 8, "loss": 1.0, "step_time_s": {HUGE}}}',
             f'{{"step": 2, "tokens": {HUGE}, "loss": 1.0}}',
             f'{{"step": 3, "tokens": 24, "loss": 1.0, "tokens_per_s": {HUGE}}}',
             '{"step": 2147483647, "tokens": 32, "loss": 1.0}',
             '{"step": 1, "tokens": 8, "loss": 1.0}',
             '{"step": 5, "loss": ']
"""Before valid step k, rank 0 appends ADVERSARY[k - 1] (the last one too after step 5): a
401-digit step time, token count and tokens/s, step 2147483647 (beyond the attempt's last step:
taken, it would freeze the stage's step and tokens), a step that goes back, a cut line."""
BAD_EVENTS = ['[1, 2]', '{"event": "checkpoint_saved", "step": "x", "seconds": "slow"}',
              f'{{"event": "checkpoint_saved", "step": 3, "seconds": {HUGE}}}', '{"event": 7}', 'not json {']
"""events.jsonl lines the supervisor's watch and the driver's goodput would trip on."""

ADVERSARY_TRAINER = textwrap.dedent(f'''
    """Five valid steps; rank 0 appends one adversarial line to metrics.jsonl before each and
    one bad line to events.jsonl."""
    import os, time
    from pathlib import Path
    from campaign.report import EVENTS_FILE, METRICS_FILE, Reporter
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    rep = Reporter.from_env(rank=rank, local_rank=int(os.environ["LOCAL_RANK"]), world_size=world)
    rep.startup({{"ranks": [{{"rank": r}} for r in range(world)], "allreduce": {{"got": 1, "expected": 1}}}})
    run_dir = Path(os.environ["CAMPAIGN_RUN_DIR"])
    bad, events = {ADVERSARY!r}, {BAD_EVENTS!r}
    for step in range(1, 6):
        rep.phase("compute", step)
        if rank == 0:
            with open(run_dir / METRICS_FILE, "a") as f:
                f.write(bad[step - 1] + "\\n")
            with open(run_dir / EVENTS_FILE, "a") as f:
                f.write(events[step - 1] + "\\n")
        time.sleep(0.3)
        rep.phase("collective", step)
        rep.step(step=step, tokens=step * 8, loss=2.0 - 0.1 * step, step_time_s=0.3)
    if rank == 0:
        with open(run_dir / METRICS_FILE, "a") as f:
            f.write(bad[5] + "\\n")
    rep.close()
''')


def test_adversarial_lines_neither_crash_nor_freeze_and_resume_still_works(tmp_path: Path, run_cli) -> None:
    """Issue 30, item 2: 401-digit numbers, step 2147483647, a step going back, a cut line and
    bad events lines: every valid step is kept, each bad line skipped and counted, one warning
    per file names it and the line, and `campaign status` and `resume` work on the ledger."""
    spec, url, log, engine = _smoke_of(tmp_path, "adversary", ADVERSARY_TRAINER)
    try:
        assert engine.submit() == 0, log.getvalue()
        with engine.ledger.session() as s:
            c = reads.get_campaign(s, "adversary")
            [(run, a)] = reads.list_attempts(s, c)
            assert [(m.step, m.tokens) for m in reads.list_steps(s, a.id)] == [(i, i * 8) for i in range(1, 6)]
            assert (a.last_step, a.tokens, run.steps, run.tokens) == (5, 40, 5, 40)
            bad, bad_events = a.summary["bad_metric_rows"], a.summary["bad_event_rows"]
    finally:
        engine.ledger.close()
    run_dir = tmp_path / "campaigns" / "adversary" / "smoke" / "attempt-001"
    assert (bad["count"], bad["file"]) == (6, str(run_dir / "metrics.jsonl"))
    assert [e.split(": ", 2)[:2] for e in bad["examples"]] == [
        ["line 1", f"step_time_s an integer of 401 digits is not a finite number >= 0"],
        ["line 3", "tokens an integer of 401 digits is not an integer in [0, 1e+18]"],
        ["line 5", "tokens_per_s an integer of 401 digits is out of a float's range"],
        ["line 7", "step 2147483647 is beyond the attempt's last step 5"],
        ["line 9", "step 1 does not follow step 4"]]
    assert (bad_events["count"], bad_events["file"]) == (5, str(run_dir / "events.jsonl"))
    said = log.getvalue().replace("\n", "")
    assert said.count(f"bad row(s) of {run_dir / 'metrics.jsonl'}") == 1, said
    assert said.count(f"bad row(s) of {run_dir / 'events.jsonl'}") == 1, said
    assert "Traceback" not in said

    code, out, err = run_cli("status", "adversary", "--json", "--db", url)
    assert code == 0, err
    assert [w.split(" skipped")[0] for w in json.loads(out)["warnings"]] == [
        f"stage smoke attempt 1: 6 bad row(s) of {run_dir / 'metrics.jsonl'}",
        f"stage smoke attempt 1: 5 bad row(s) of {run_dir / 'events.jsonl'}"]
    log = io.StringIO()  # what `campaign resume` does with the ledger: nothing breaks, nothing runs twice
    engine = Engine(spec, open_ledger(url), workdir=tmp_path / "campaigns", progress=Progress(log), runner=run_in_thread)
    try:
        assert engine.submit() == 0, log.getvalue()
        with engine.ledger.session() as s:
            assert len(reads.list_attempts(s, reads.get_campaign(s, "adversary"))) == 1
    finally:
        engine.ledger.close()


def test_an_adopted_orphan_with_adversarial_lines_is_adopted_without_a_traceback(tmp_path: Path) -> None:
    """`campaign resume` adopts a dead driver's attempt whole (recovery.adopt_orphan): the same
    lines that crashed every resume before (a 401-digit float column) are skipped and counted."""
    run_dir = tmp_path / "attempt-001"
    run_dir.mkdir()
    valid = [json.dumps({"step": i, "tokens": i * 8, "loss": 2.0}) for i in range(1, 6)]
    lines = [x for pair in zip(ADVERSARY, valid) for x in pair] + [ADVERSARY[5]]
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    (run_dir / "trainer.json").write_text(json.dumps({"run": {"max_steps": 5, "checkpoint_dir": str(tmp_path / "ck")}}))
    led = open_ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    try:
        assert _adopt(led, tmp_path, run_dir)["steps"] == 5
        with led.session() as s:
            [(run, a)] = reads.list_attempts(s, reads.get_campaign(s, "orphan"))
            assert (a.last_step, a.tokens, run.tokens) == (5, 40, 40)
            assert a.summary["bad_metric_rows"]["count"] == 6
    finally:
        led.close()


def _adopt(led, tmp_path: Path, run_dir: Path) -> dict:
    """What `campaign resume` does with an orphaned attempt of a campaign `orphan` whose run
    directory is `run_dir`: `adopt_orphan`'s result."""
    from campaign.ledger import writes
    from campaign.recovery import adopt_orphan

    with led.session() as s:
        c = writes.create_campaign(s, name="orphan", digest="0" * 64, spec_json={}, source="", site="local",
                                   workdir=str(tmp_path))
        (run,) = writes.ensure_stage_runs(s, c, [("long", "long_run")])
        a = writes.create_attempt(s, run, nodes=["local-n0"], ranks_per_node=1, run_dir=str(run_dir))
        return adopt_orphan(s, a)


FORGER = textwrap.dedent('''
    """1,000 steps; after step 108 someone appends a forged row to the running attempt's
    metrics.jsonl (issue 39, item 2): a step inside the attempt's range, far ahead."""
    import os, time
    from pathlib import Path
    from campaign.report import METRICS_FILE, Reporter
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    rep = Reporter.from_env(rank=rank, local_rank=int(os.environ["LOCAL_RANK"]), world_size=world)
    rep.startup({"ranks": [{"rank": r} for r in range(world)], "allreduce": {"got": 1, "expected": 1}})
    for step in range(1, 1001):
        rep.phase("compute", step)
        time.sleep(0.002)
        rep.step(step=step, tokens=step * 8, loss=2.0 - step / 1000, step_time_s=0.002)
        if step == 108 and rank == 0:
            with open(Path(os.environ["CAMPAIGN_RUN_DIR"]) / METRICS_FILE, "a") as f:
                f.write('{"step": 999, "loss": 1.0, "tokens": 1}\\n')
    rep.close()
''')


def test_one_forged_row_is_rejected_and_counted_never_the_real_rows_after_it(tmp_path: Path) -> None:
    """Issue 39, item 2: before, the driver stored the forged step 999 and rejected the 890
    real rows after it ("step 109 does not follow step 999"), and the stage passed."""
    spec, url, log, engine = _smoke_of(tmp_path, "forged", FORGER, steps=1000)
    try:
        assert engine.submit() == 0, log.getvalue()
        with engine.ledger.session() as s:
            [(run, a)] = reads.list_attempts(s, reads.get_campaign(s, "forged"))
            steps = [(m.step, m.tokens, m.loss) for m in reads.list_steps(s, a.id)]
            bad = a.summary["bad_metric_rows"]
            assert (a.last_step, a.tokens, run.steps) == (1000, 8000, 1000)
    finally:
        engine.ledger.close()
    assert [st for st, _, _ in steps] == list(range(1, 1001)), "every real step, none forged"
    assert steps[998] == (999, 7992, 2.0 - 999 / 1000)
    assert bad["count"] == 1 and bad["examples"][0].startswith("line 109: ") and '"step": 999' in bad["examples"][0]
