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
           '{"step": 6, "tokens": 1e30, "loss": 1.0}']
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


def test_garbage_rows_are_skipped_counted_and_shown_by_status(tmp_path: Path, run_cli) -> None:
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    spec = CampaignSpec.model_validate({
        "name": "garbage", "site": {"kind": "local", "nodes": 1, "ranks_per_node": 1},
        "trainer": {"command": [sys.executable, str(script)]},
        "stages": [{"name": "smoke", "kind": "smoke", "steps": 5, "timeout_s": 120}]})
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    log = io.StringIO()
    engine = Engine(spec, open_ledger(url), workdir=tmp_path / "campaigns", progress=Progress(log), runner=run_in_thread)
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
    assert bad["examples"][0] == "byte 0: not a JSON object but int: 7"
    assert [e.split(": ", 2)[1] for e in bad["examples"][1:]] == [
        "not a JSON object but list", "step '4' is not an integer in [0, 2147483647]",
        "step 4.5 is not an integer in [0, 2147483647]", "tokens 1e+30 is not an integer in [0, 1e+18]"]
    said = log.getvalue().replace("\n", "")  # the driver said so once, when it first met one
    assert said.count("warning: smoke attempt 1: ") == 1 and "bad row(s) of " in said

    line = f"stage smoke attempt 1: 5 bad row(s) of {metrics} skipped (not valid metrics rows); first: byte 0: " \
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
    from campaign.ledger import writes
    from campaign.recovery import adopt_orphan

    run_dir = tmp_path / "attempt-001"
    run_dir.mkdir()
    valid = [json.dumps({"step": i, "tokens": i * 8, "loss": 2.0}) for i in range(1, 4)]
    (run_dir / "metrics.jsonl").write_text("\n".join([valid[0], *GARBAGE, *valid[1:]]) + "\n")
    led = open_ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    try:
        with led.session() as s:
            c = writes.create_campaign(s, name="orphan", digest="0" * 64, spec_json={}, source="", site="local",
                                       workdir=str(tmp_path))
            (run,) = writes.ensure_stage_runs(s, c, [("long", "long_run")])
            a = writes.create_attempt(s, run, nodes=["local-n0"], ranks_per_node=1, run_dir=str(run_dir))
            assert adopt_orphan(s, a)["steps"] == 3
        with led.session() as s:
            c = reads.get_campaign(s, "orphan")
            [(_, a)] = reads.list_attempts(s, c)
            assert a.summary["bad_metric_rows"]["count"] == 5 and a.last_step == 3
            assert summary.describe_campaign(s, c)["warnings"] == [
                f"stage long attempt 1: 5 bad row(s) of {run_dir / 'metrics.jsonl'} skipped (not valid metrics rows); "
                f"first: byte {len(valid[0]) + 1}: not a JSON object but int: 7"]
    finally:
        led.close()
