"""The engine and the supervisor without Parsl: `Engine(runner=run_in_thread)` runs each
attempt's supervisor in a thread of the test process; the trainer's ranks are real
processes (the built-in trainer with gloo, or a small stdlib script that honours the
trainer contract through `campaign.report`). What is left out is only Parsl's transport,
which the slow e2e tests cover.
"""

from __future__ import annotations

import io
import json
import re
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from campaign import dryrun
from campaign.attempt import build_request, run_in_thread
from campaign.engine import Engine
from campaign.ledger import open_ledger
from campaign.ledger import queries as q
from campaign.progress import Progress
from campaign.spec import CampaignSpec
from campaign.supervisor import supervise
from campaign.watchdog import WatchdogPolicy


def _spec(stages: list[dict[str, Any]], *, command: list[str] | None = None, nodes: int = 2) -> CampaignSpec:
    trainer: dict[str, Any] = {"micro_batch_size": 2, "warmup_steps": 2}
    if command:
        trainer["command"] = command
    return CampaignSpec.model_validate({
        "name": "inproc", "site": {"kind": "local", "nodes": nodes, "ranks_per_node": 1},
        "model": {"size": "tiny"}, "trainer": trainer, "stages": stages})


def _engine(spec: CampaignSpec, tmp_path: Path) -> Engine:
    ledger = open_ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    return Engine(spec, ledger, workdir=tmp_path / "campaigns", progress=Progress(io.StringIO(), quiet=True),
                  runner=run_in_thread)


def _attempts(engine: Engine) -> list[Any]:
    with engine.ledger.session() as s:
        c = q.get_campaign(s, engine.spec.name)
        assert c is not None
        return [(run.name, a.number, a.state, a.exit_code, dict(a.summary or {}), list(a.nodes))
                for run, a in q.list_attempts(s, c)]


def test_smoke_stage_passes_without_parsl_and_records_the_attempt(tmp_path: Path) -> None:
    engine = _engine(_spec([{"kind": "smoke", "steps": 3, "timeout_s": 120}]), tmp_path)
    assert engine.submit() == 0
    [(stage, number, state, code, summary, nodes)] = _attempts(engine)
    assert (stage, number, state, code, nodes) == ("smoke", 1, "succeeded", 0, ["local-n0", "local-n1"])
    assert not (tmp_path / "campaigns" / "inproc" / "parsl").exists()  # no Parsl was loaded


def test_dry_run_shows_exactly_what_the_supervisor_launched(tmp_path: Path) -> None:
    """Item 2 of the redesign: one launch plan. The recorded launch (command and
    environment of every rank) equals the dry run's text for the same attempt, up to the
    interpreter path and the rendezvous port the supervisor picks at launch."""
    spec = _spec([{"kind": "smoke", "steps": 2, "timeout_s": 120}])
    engine = _engine(spec, tmp_path)
    assert engine.submit() == 0
    [(_, _, _, _, summary, _)] = _attempts(engine)
    printed = dryrun.render_dry_run(spec, tmp_path / "campaigns")
    planned = printed.split("## stage 1/1 smoke (smoke):", 1)[1].split("\n", 1)[1].strip()

    def norm(text: str) -> str:
        return re.sub(r"MASTER_PORT=\d+", "MASTER_PORT=<port>", text.replace(sys.executable, "python"))

    launched = norm(summary["launch_text"])
    assert norm(planned) == launched
    for key in ("CAMPAIGN_ATTEMPT=1", "CAMPAIGN_TRAINER_CONFIG=", "CAMPAIGN_HEARTBEAT_INTERVAL=",
                "PYTHONUNBUFFERED=1", "OMP_NUM_THREADS=", "CAMPAIGN_NODE=local-n1"):
        assert key in launched


FAKE_TRAINER = textwrap.dedent('''
    """A stdlib trainer honouring the contract; its behaviour is chosen per rank by env."""
    import os, signal, sys, time
    from campaign.report import Reporter
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    rep = Reporter.from_env(rank=rank, local_rank=int(os.environ["LOCAL_RANK"]), world_size=world)
    rep.startup({"ranks": [{"rank": r} for r in range(world)], "allreduce": {"got": 1, "expected": 1}})
    for step in range(1, 6):
        rep.phase("compute", step)
        if os.environ.get("FAKE_CRASH_RANK") in (str(rank), "all") and step == 3:
            how = os.environ.get("FAKE_CRASH_HOW", "exit")
            if how == "sigkill":
                os.kill(os.getpid(), signal.SIGKILL)
            if how == "import":
                print("ModuleNotFoundError: No module named 'flash_attn'", file=sys.stderr, flush=True)
                sys.exit(1)
            sys.exit(3)
        hang = os.environ.get("FAKE_HANG_RANK")
        if hang is not None and step == 3:
            if hang != str(rank):
                rep.phase("collective", step)  # the peers wait in the collective for the hung rank
            time.sleep(600)
        rep.phase("collective", step)
        time.sleep(0.05)
        rep.step(step=step, tokens=step * 8, loss=2.0 - 0.1 * step, step_time_s=0.05)
    rep.close()
''')


def _request(tmp_path: Path, env: dict[str, str], *, timeout_s: float = 60) -> Any:
    script = tmp_path / "fake_trainer.py"
    script.write_text(FAKE_TRAINER)
    spec = _spec([{"kind": "smoke"}], command=[sys.executable, str(script)])
    run_dir = tmp_path / "attempt-001"
    run_dir.mkdir()
    (run_dir / "trainer.json").write_text(json.dumps({"run": {}}))
    policy = WatchdogPolicy(startup_s=20, floor_s=2.0, warmup_steps=0, heartbeat_stale_s=3, drill_s=0)
    request = build_request(spec.site, spec.trainer.command, run_dir=run_dir, attempt=1, nodes=2, excluded=[],
                            timeout_s=timeout_s, faults=False, master_port=None, watchdog=policy)
    return request.model_copy(update={"env": {**request.env, **env}})


def test_supervisor_reports_success_with_the_nodes_it_used(tmp_path: Path) -> None:
    rep = supervise(_request(tmp_path, {}))
    assert (rep["exit_code"], rep["exit_class"], rep["nodes"], rep["last_step"]) == (0, "succeeded",
                                                                                    ["local-n0", "local-n1"], 5)
    assert json.loads((tmp_path / "attempt-001" / "supervisor.json").read_text()) == rep


def test_a_rank_killed_by_a_signal_is_evidence_against_its_node(tmp_path: Path) -> None:
    rep = supervise(_request(tmp_path, {"FAKE_CRASH_RANK": "1", "FAKE_CRASH_HOW": "sigkill"}))
    assert (rep["exit_code"], rep["exit_class"], rep["first_failure"]["rank"]) == (137, "crashed_node", 1)
    assert [s["node"] for s in rep["suspects"]] == ["local-n1"] and rep["finding"]["kind"] == "node"


def test_a_plain_exit_on_one_rank_blames_nobody_until_confirmed(tmp_path: Path) -> None:
    """Exit 3 with nothing in the log: not evidence against the node (issue 13)."""
    rep = supervise(_request(tmp_path, {"FAKE_CRASH_RANK": "1"}))
    assert (rep["exit_code"], rep["exit_class"], rep["suspects"]) == (3, "crashed_unknown", [])
    assert rep["finding"]["retry"] == "confirm_once" and "rank-1.log" in rep["error"]


def test_the_same_error_on_every_node_is_systemic_and_quoted(tmp_path: Path) -> None:
    rep = supervise(_request(tmp_path, {"FAKE_CRASH_RANK": "all", "FAKE_CRASH_HOW": "import"}))
    assert (rep["exit_class"], rep["suspects"]) == ("crashed_systemic", [])
    assert "No module named 'flash_attn'" in rep["error"] and "rank-" in rep["error"]


def test_supervisor_stops_a_stall_and_names_the_node_that_kept_computing(tmp_path: Path) -> None:
    rep = supervise(_request(tmp_path, {"FAKE_HANG_RANK": "0"}))
    assert (rep["exit_code"], rep["exit_class"], rep["killed_by"]) == (124, "stalled", "stalled")
    assert [s["node"] for s in rep["suspects"]] == ["local-n0"]
    assert rep["detected_after_s"] < 15


@pytest.mark.parametrize("site", [{"kind": "local", "nodes": 3},
                                  {"kind": "slurm", "nodes": 2, "env": {"X": "1"}},
                                  {"kind": "aurora", "account": "p", "queue": "debug", "nodes": 2}])
def test_the_request_is_pure_and_carries_the_contract_environment(tmp_path: Path, site: dict[str, Any]) -> None:
    spec = CampaignSpec.model_validate({"name": "x", "site": site, "stages": [{"kind": "smoke"}]})
    make = lambda: build_request(spec.site, None, run_dir=tmp_path / "a", attempt=4, nodes=2,  # noqa: E731
                                 excluded=["n9"], timeout_s=5, faults=True, master_port=1234)
    first, again = make(), make()
    assert first == again and not (tmp_path / "a").exists()  # same input, same request, nothing written
    assert first.env["CAMPAIGN_ATTEMPT"] == "4" and first.env["CAMPAIGN_ALLOW_FAULTS"] == "1"
    assert first.argv[-2:] == ["--config", str(tmp_path / "a" / "trainer.json")]
    assert first.launcher == spec.site.launcher and first.exclude == ["n9"]
