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
import time
from pathlib import Path
from typing import Any

import pytest

from campaign import dryrun, summary
from campaign.attempt import build_request, trainer_config
from campaign.engine import Engine
from campaign.ledger import open_ledger
from campaign.ledger import reads
from campaign.progress import Progress
from campaign.runner import run_in_thread
from campaign.spec import CampaignSpec
from campaign.stagebase import Targets
from campaign.supervisor import supervise
from campaign.train.config import Fault
from campaign.watchdog import WatchdogPolicy


def _spec(stages: list[dict[str, Any]], *, command: list[str] | None = None, nodes: int = 2,
          **own: Any) -> CampaignSpec:
    trainer: dict[str, Any] = {"micro_batch_size": 2, "warmup_steps": 2, **own}
    if command:
        trainer["command"] = command
    return CampaignSpec.model_validate({
        "name": "inproc", "site": {"kind": "local", "nodes": nodes, "ranks_per_node": 1},
        "model": {"size": "tiny"}, "trainer": trainer, "stages": stages})


def _engine(spec: CampaignSpec, tmp_path: Path, spec_dir: Path | None = None) -> Engine:
    ledger = open_ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    return Engine(spec, ledger, workdir=tmp_path / "campaigns", progress=Progress(io.StringIO(), quiet=True),
                  runner=run_in_thread, spec_dir=spec_dir)


def _attempts(engine: Engine) -> list[Any]:
    with engine.ledger.session() as s:
        c = reads.get_campaign(s, engine.spec.name)
        assert c is not None
        return [(run.name, a.number, a.state, a.exit_code, dict(a.summary or {}), list(a.nodes))
                for run, a in reads.list_attempts(s, c)]


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
    spec = _spec([{"kind": "smoke", "steps": 2, "timeout_s": 120},
                  {"name": "long", "kind": "long_run", "steps": 4, "checkpoint_every": 2, "timeout_s": 120}])
    engine = _engine(spec, tmp_path)
    assert engine.submit() == 0
    [(_, _, _, _, smoke, _), (_, _, _, _, long, _)] = _attempts(engine)
    printed = dryrun.render_dry_run(spec, tmp_path / "campaigns")

    def norm(text: str) -> str:
        return re.sub(r"MASTER_PORT=\d+", "MASTER_PORT=<port>", text.replace(sys.executable, "python"))

    for header, summary in (("## stage 1/2 smoke (smoke):", smoke), ("## stage 2/2 long (long_run):", long)):
        planned = printed.split(header, 1)[1].split("\n", 1)[1].split("\n\n", 1)[0].strip()
        launched = norm(summary["launch_text"])
        assert norm(planned) == launched
    for key in ("CAMPAIGN_ATTEMPT=1", "CAMPAIGN_TRAINER_CONFIG=", "CAMPAIGN_HEARTBEAT_INTERVAL=",
                "PYTHONUNBUFFERED=1", "OMP_NUM_THREADS=", "CAMPAIGN_NODE=local-n1", "CAMPAIGN_MAX_STEPS=4",
                "CAMPAIGN_CHECKPOINT_EVERY=2", "CAMPAIGN_RESUME=1"):  # the long run's targets, as the dry run showed
        assert key in launched



def test_the_dry_run_of_a_new_version_shows_that_versions_directories(tmp_path: Path) -> None:
    """--new-version trains in NAME/v2/ (issue 13 item 5); the dry run of that submission must
    show the same run directories and checkpoint paths, not version 1's."""
    from campaign.commands import planned_version

    workdir = tmp_path / "campaigns"
    v1 = _spec([{"kind": "smoke", "steps": 2, "timeout_s": 120}])
    assert planned_version(None, workdir, v1, new_version=False) == (1, None, None)  # no ledger yet: nothing created
    assert not (workdir / "ledger.db").exists()
    engine = _engine(v1, tmp_path)
    assert engine.submit() == 0
    v2 = _spec([{"kind": "smoke", "steps": 3, "timeout_s": 120}])
    here = (workdir / v1.name).resolve()
    assert planned_version(f"sqlite:///{tmp_path / 'ledger.db'}", workdir, v1, new_version=True) == (1, None, here)
    assert planned_version(f"sqlite:///{tmp_path / 'ledger.db'}", workdir, v2, new_version=True) == (2, None, here)
    printed = dryrun.render_dry_run(v2, workdir, version=2)
    doc = dryrun.dry_run_document(v2, workdir, version=2)
    engine.ledger.close()
    engine = Engine(v2, open_ledger(f"sqlite:///{tmp_path / 'ledger.db'}"), workdir=workdir,
                    progress=Progress(io.StringIO(), quiet=True), runner=run_in_thread)
    assert engine.submit(new_version=True) == 0
    (_, _, _, _, summary, _) = _attempts(engine)[-1]
    launched = re.sub(r"MASTER_PORT=\d+", "MASTER_PORT=<port>", summary["launch_text"].replace(sys.executable, "python"))
    planned = printed.split("## stage 1/1 smoke (smoke):", 1)[1].split("\n", 1)[1].split("\n\n", 1)[0].strip()
    assert re.sub(r"MASTER_PORT=\d+", "MASTER_PORT=<port>", planned) == launched
    v2_dir = workdir.resolve() / "inproc" / "v2" / "smoke"
    assert f"CAMPAIGN_RUN_DIR={v2_dir / 'attempt-001'}" in launched
    assert f"# run directories under {v2_dir.parent} (version 2)" in printed
    assert doc["version"] == 2 and doc["stages"][0]["launch"]["attempts"][0]["run_dir"] == str(v2_dir / "attempt-001")

PLAIN_TRAINER = textwrap.dedent('''
    """Knows nothing of campaign: its own arguments in, its own log lines out."""
    import argparse, os, time
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int)
    args = p.parse_args()
    for step in range(1, args.steps + 1):
        time.sleep(0.05)
        if os.environ["RANK"] == "0":
            print(f"iter {step}: loss {3.0 - 0.1 * step:.4f}, time 50.00ms", flush=True)
''')


def test_an_unmodified_trainer_passes_smoke_through_the_stdout_adapter(tmp_path: Path) -> None:
    """Item 3 of issue 14: a script next to the campaign file, its own arguments from the
    template, its progress read from rank 0's output; the verdict says what it could not check."""
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "plain.py").write_text(PLAIN_TRAINER)
    spec = _spec([{"kind": "smoke", "steps": 4, "timeout_s": 60}], command=["{python}", "plain.py", "--steps",
                                                                             "{max_steps}"],
                 progress="stdout", step_pattern=r"iter (?P<step>\d+): loss (?P<loss>[\d.]+), time (?P<ms>[\d.]+)ms")
    engine = _engine(spec, tmp_path, spec_dir=tmp_path / "specs")
    assert engine.submit() == 0
    [(_, _, state, code, _, _)] = _attempts(engine)
    with engine.ledger.session() as s:
        c = reads.get_campaign(s, "inproc")
        assert c is not None
        [run] = reads.current_stage_runs(s, c)
        assert (state, code, run.steps, run.last_loss) == ("succeeded", 0, 4, pytest.approx(2.6))
        assert "2/2 ranks exited 0" in run.verdict and "not checked: each rank's start-up" in run.verdict


def test_a_failure_names_the_missing_file_and_the_rank_log(tmp_path: Path) -> None:
    """Item 5 of issue 14: the same plain script without `progress: stdout` writes none of the
    contract's files; the verdict says which one is missing and where rank 0's output is."""
    (tmp_path / "plain.py").write_text(PLAIN_TRAINER)
    spec = _spec([{"kind": "smoke", "steps": 2, "timeout_s": 60}],
                 command=["{python}", str(tmp_path / "plain.py"), "--steps", "{max_steps}"])
    engine = _engine(spec, tmp_path)
    assert engine.submit() == 1
    run_dir = tmp_path / "campaigns" / "inproc" / "smoke" / "attempt-001"
    with engine.ledger.session() as s:
        [run] = reads.current_stage_runs(s, reads.get_campaign(s, "inproc"))
        verdict = run.verdict
        detail = summary.describe_campaign(s, reads.get_campaign(s, "inproc"))
    assert f"({run_dir}/startup.json is missing; rank 0's log: {run_dir}/logs/rank-0.log)" in verdict, verdict
    assert "iter 2: loss" in (run_dir / "logs" / "rank-0.log").read_text()  # the log it names holds the output
    assert [a["run_dir"] for a in detail["attempts_detail"]] == [str(run_dir)]  # what `campaign status` shows


def _supervise_stdout_script(tmp_path: Path, body: str, *, steps: int, timeout_s: float,
                             policy: WatchdogPolicy, first_step: int = 1, nodes: int = 1) -> dict:
    """Supervise one attempt of a script (`import time` then `body`) whose progress is read
    from its `iter N: loss X` lines; the supervisor's report."""
    script = tmp_path / "script.py"
    script.write_text("import time\n" + body)
    spec = _spec([{"kind": "smoke"}], command=["{python}", str(script)], nodes=nodes, progress="stdout",
                 step_pattern=r"iter (?P<step>\d+): loss (?P<loss>\S+)", first_step=first_step)
    run_dir = tmp_path / "attempt-001"
    run_dir.mkdir()
    config = trainer_config(spec, Targets(steps=steps), stage_dir=tmp_path, attempt=1)
    (run_dir / "trainer.json").write_text(config.model_dump_json())
    return supervise(build_request(spec.site, config, run_dir=run_dir, nodes=nodes, excluded=[], timeout_s=timeout_s,
                                   master_port=None, spec_dir=tmp_path, watchdog=policy))


def test_a_stalled_stdout_trainer_is_stopped_without_blaming_its_node_for_missing_heartbeats(tmp_path: Path) -> None:
    """Without heartbeats (progress: stdout) the watchdog still stops a stall on step progress,
    and names no node for the heartbeats it never had."""
    rep = _supervise_stdout_script(
        tmp_path, "for s in (1, 2, 3):\n    print(f'iter {s}: loss 2.0', flush=True)\n    time.sleep(0.2)\n"
        "time.sleep(600)\n", steps=5, timeout_s=60,
        policy=WatchdogPolicy(startup_s=20, floor_s=2.0, warmup_steps=0, warmup_s=2.0, heartbeat_stale_s=3, drill_s=0))
    assert (rep["exit_class"], rep["last_step"], rep["suspects"]) == ("stalled", 3, [])
    assert "no new step" in rep["stall"]


def _noting_sigterms(exit_on_second: bool) -> str:
    """A trainer stuck in a call (as a rank inside a collective) that notes each SIGTERM's
    time; with `exit_on_second` it exits 143 on the second, as the built-in trainer does
    (campaign.train.signals), else it goes on."""
    return ("import os, signal, sys\n"
            "def noted(*_):\n"
            "    with open(os.environ['CAMPAIGN_RUN_DIR'] + '/sigterms', 'a') as f:\n"
            "        f.write(repr(time.time()) + '\\n')\n"
            f"    if {exit_on_second} and len(open(os.environ['CAMPAIGN_RUN_DIR'] + '/sigterms').readlines()) >= 2:\n"
            "        os._exit(143)\n"
            "signal.signal(signal.SIGTERM, noted)\n")


def _sigterms(tmp_path: Path) -> list[float]:
    return [float(x) for x in (tmp_path / "attempt-001" / "sigterms").read_text().split()]


def test_a_stalled_launch_gets_a_second_sigterm_after_one_second(tmp_path: Path) -> None:
    """A hung rank cannot stop at a step boundary, so the first SIGTERM's clean stop never
    comes (the goodput benchmark's stalled launches each ran out the full 5 s and were
    SIGKILLed). After a stall a second SIGTERM follows at SECOND_TERM_S, which ends a trainer
    that follows the contract at once: it exits 143 by itself, nothing is SIGKILLed."""
    from campaign.supervisor.launch import SECOND_TERM_S, TERM_GRACE_S

    rep = _supervise_stdout_script(
        tmp_path, _noting_sigterms(True) + "for s in (1, 2, 3):\n    print(f'iter {s}: loss 2.0', flush=True)\n"
        "    time.sleep(0.2)\nwhile True:\n    time.sleep(600)\n", steps=5, timeout_s=60,
        policy=WatchdogPolicy(startup_s=20, floor_s=2.0, warmup_steps=0, warmup_s=2.0, drill_s=0))
    first, second = _sigterms(tmp_path)
    assert (rep["exit_class"], rep["exit_code"]) == ("stalled", 124), rep
    assert SECOND_TERM_S - 0.1 <= second - first < TERM_GRACE_S - 1, (first, second)
    assert rep["first_failure"]["exit_code"] == 143, rep["first_failure"]  # its own exit, not SIGKILL's 137


def test_a_trainer_deaf_to_sigterm_is_sigkilled_at_the_grace_and_a_timeout_sends_one_sigterm(tmp_path: Path) -> None:
    """A trainer still stepping at its timeout may be stopping cleanly: one SIGTERM, and
    TERM_GRACE_S before the SIGKILL."""
    from campaign.supervisor.launch import TERM_GRACE_S

    rep = _supervise_stdout_script(
        tmp_path, _noting_sigterms(False) + "for s in range(1, 1000):\n    print(f'iter {s}: loss 2.0', flush=True)\n"
        "    time.sleep(0.1)\n", steps=999, timeout_s=3,
        policy=WatchdogPolicy(startup_s=20, floor_s=5.0, warmup_steps=0, warmup_s=5.0, drill_s=0))
    ended = time.time()
    terms = _sigterms(tmp_path)
    assert rep["exit_class"] == "timed_out", rep
    assert len(terms) == 1 and ended - terms[0] >= TERM_GRACE_S - 0.1, (terms, ended)


def test_a_trainer_counting_from_0_reaches_its_last_step_and_ends_when_its_read_rank_does(tmp_path: Path) -> None:
    """Found when issues 27 and 30 met: CAMPAIGN_MAX_STEPS is in the trainer's numbering (4 for
    5 steps from 0), the rows in the ledger's (5); the row of the last step was taken for one
    past the attempt's end and dropped, so the finished run looked stalled."""
    rep = _supervise_stdout_script(  # rank 0 (read) trains steps 0-4 and exits; rank 1 hangs
        tmp_path, "import os\nfor s in range(int(os.environ['CAMPAIGN_MAX_STEPS']) + 1):\n"
        "    print(f'iter {s}: loss 2.0', flush=True)\nif os.environ['RANK'] != '0':\n    time.sleep(600)\n",
        steps=5, timeout_s=60, first_step=0, nodes=2,
        policy=WatchdogPolicy(startup_s=20, floor_s=20.0, warmup_steps=0, warmup_s=20.0, exit_s=2, drill_s=0))
    assert (rep["last_step"], rep["killed_by"], rep["exit_class"]) == (5, "exit_hung", "succeeded"), rep


def test_the_hard_timeout_is_its_own_class_not_a_stall(tmp_path: Path) -> None:
    """Issue 27 item 4: a trainer still making progress when the attempt's timeout_s passes
    ends `timed_out` (exit 124), and the reason says so, with the step it had reached."""
    rep = _supervise_stdout_script(
        tmp_path, "for s in range(1, 1000):\n    print(f'iter {s}: loss 2.0', flush=True)\n    time.sleep(0.1)\n",
        steps=999, timeout_s=3, policy=WatchdogPolicy(startup_s=20, floor_s=5.0, warmup_steps=0, warmup_s=5.0, drill_s=0))
    assert (rep["exit_class"], rep["exit_code"], rep["killed_by"]) == ("timed_out", 124, "timeout"), rep
    assert rep["stall"].startswith("hard timeout of 3 s (the stage's timeout_s) at step ") and rep["last_step"] > 5


def test_a_stage_that_crashes_in_the_driver_says_where_its_traceback_is(tmp_path: Path) -> None:
    """Issue 27 item 7: the reference file went away after validation; the verdict names the
    file holding the driver's whole traceback."""
    (tmp_path / "plain.py").write_text(PLAIN_TRAINER)
    spec = _spec([{"kind": "loss_check", "steps": 3, "window": 2, "timeout_s": 60,
                   "reference": {"file": str(tmp_path / "gone.csv")}}],
                 command=["{python}", str(tmp_path / "plain.py"), "--steps", "{max_steps}"], progress="stdout",
                 step_pattern=r"iter (?P<step>\d+): loss (?P<loss>[\d.]+)")
    engine = _engine(spec, tmp_path)
    assert engine.submit() == 1
    with engine.ledger.session() as s:
        [run] = reads.current_stage_runs(s, reads.get_campaign(s, "inproc"))
        verdict, numbers = run.verdict, dict(run.numbers or {})
    path = tmp_path / "campaigns" / "inproc" / "loss_check" / "driver-traceback.txt"
    assert verdict.startswith("stage crashed in the driver: SpecError") and f"(traceback: {path})" in verdict, verdict
    assert "Traceback (most recent call last)" in path.read_text() and numbers["traceback_file"] == str(path)


def test_a_reference_file_under_home_is_read_where_the_preflight_found_it(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """`reference.file: ~/ref.csv` passes the preflight (which expands `~`); the stage must read
    the same file, not `<campaign folder>/~/ref.csv`."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    (home / "ref.csv").write_text("step,loss\n" + "".join(f"{s},{3.0 - 0.1 * s:.4f}\n" for s in range(1, 4)))
    (tmp_path / "plain.py").write_text(PLAIN_TRAINER)
    spec = _spec([{"kind": "loss_check", "steps": 3, "window": 2, "timeout_s": 60, "reference": {"file": "~/ref.csv"}}],
                 command=["{python}", str(tmp_path / "plain.py"), "--steps", "{max_steps}"], progress="stdout",
                 step_pattern=r"iter (?P<step>\d+): loss (?P<loss>[\d.]+)")
    engine = _engine(spec, tmp_path)
    code = engine.submit()
    with engine.ledger.session() as s:
        [run] = reads.current_stage_runs(s, reads.get_campaign(s, "inproc"))
        verdict = run.verdict
    assert code == 0 and run.state == "passed", verdict


def test_a_resume_test_whose_trainer_never_saves_where_asked_stops_and_says_so(tmp_path: Path) -> None:
    """Issue 27 item 2: the interrupted run used to train until its timeout and fail "stalled";
    it is stopped once far past the interrupt step, and the verdict says which checkpoint never came."""
    (tmp_path / "plain.py").write_text(PLAIN_TRAINER)
    spec = _spec([{"kind": "resume_test", "checkpoint_step": 2, "interrupt_step": 3, "steps": 5,
                   "signals": ["SIGKILL"], "timeout_s": 60}],
                 command=["{python}", str(tmp_path / "plain.py"), "--steps", "{max_steps}"], progress="stdout",
                 step_pattern=r"iter (?P<step>\d+): loss (?P<loss>[\d.]+)", checkpoints={"glob": "ckpt.pt"})
    engine = _engine(spec, tmp_path)
    t0 = time.monotonic()
    assert engine.submit() == 1
    with engine.ledger.session() as s:
        [run] = reads.current_stage_runs(s, reads.get_campaign(s, "inproc"))
        verdict = run.verdict
    assert "the interrupted run (SIGKILL) reached step" in verdict and "without a complete checkpoint of step 2" \
        in verdict and "(trainer.checkpoints.glob 'ckpt.pt'): the trainer must save at {checkpoint_at}" in verdict, \
        verdict
    assert time.monotonic() - t0 < 40, "stopped long before the 60 s timeout"


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
    config = trainer_config(spec, Targets(steps=5), stage_dir=tmp_path, attempt=1)
    request = build_request(spec.site, config, run_dir=run_dir, nodes=2, excluded=[], timeout_s=timeout_s,
                            master_port=None, spec_dir=tmp_path, watchdog=policy)
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


def test_the_supervisor_removes_what_killed_ranks_left_in_node_local_storage(tmp_path: Path) -> None:
    """Issue 13 item 9: a rank killed by SIGKILL never runs its own cleanup, so its node's
    /dev/shm/campaign-* folder would stay behind; the supervisor removes it after the attempt,
    for every node of the launch (here: rank 1's, killed, and rank 0's, stopped)."""
    from campaign.report import _node_local_dir

    request = _request(tmp_path, {"FAKE_CRASH_RANK": "1", "FAKE_CRASH_HOW": "sigkill"})
    dirs = [_node_local_dir(str(request.run_dir), node, "1") for node in ("local-n0", "local-n1")]
    rep = supervise(request)
    assert rep["exit_code"] == 137 and rep["nodes"] == ["local-n0", "local-n1"]
    assert [d.exists() for d in dirs] == [False, False]


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
    config = trainer_config(spec, Targets(steps=7, max_tokens=900), stage_dir=tmp_path, attempt=4,
                            faults=(Fault(kind="crash", step=2),))
    make = lambda: build_request(spec.site, config, run_dir=tmp_path / "a", nodes=2,  # noqa: E731
                                 excluded=["n9"], timeout_s=5, master_port=1234, spec_dir=tmp_path)
    first, again = make(), make()
    assert first == again and not (tmp_path / "a").exists()  # same input, same request, nothing written
    assert first.env["CAMPAIGN_ATTEMPT"] == "4" and first.env["CAMPAIGN_ALLOW_FAULTS"] == "1"
    assert (first.env["CAMPAIGN_MAX_STEPS"], first.env["CAMPAIGN_MAX_TOKENS"]) == ("7", "900")
    assert first.env["CAMPAIGN_CHECKPOINT_DIR"] == str(tmp_path / "checkpoints") and first.env["CAMPAIGN_RESUME"] == "0"
    trainer = ["{python}", "-m", "campaign.train", "--config", str(tmp_path / "a" / "trainer.json")]
    # `warm_start: auto`: through the node's fork server with the local launcher only.
    warm = ["{python}", "-m", "campaign.executors.warm", "--"] if spec.site.launcher == "local" else []
    assert first.argv == [*warm, *trainer]
    assert first.launcher == spec.site.launcher and first.exclude == ["n9"]


def test_the_same_file_after_an_upgrade_that_added_spec_fields_is_the_same_campaign(tmp_path: Path) -> None:
    """A release that adds spec fields changes every resolved spec's digest; the ledger keeps
    the file's text, so an unchanged file is recognised (no --new-version needed), while a
    changed file is still refused."""
    from campaign import spec as spec_mod
    from campaign.errors import CampaignConflict

    text = textwrap.dedent("""\
        name: inproc
        site: {kind: local, nodes: 1, ranks_per_node: 1}
        model: {size: tiny}
        stages: [{kind: smoke, steps: 1}]
        """)
    engine = _engine(spec_mod.loads(text, "inproc.yaml"), tmp_path)
    c = engine.register(text)
    with engine.ledger.session() as s:  # as an older release would have stored it
        s.get(type(c), c.id).spec_digest = "0" * 64
    again = _engine(spec_mod.loads(text, "inproc.yaml"), tmp_path).register(text)
    assert again.version == 1 and again.spec_digest == spec_mod.loads(text, "x").digest()
    changed = text.replace("steps: 1", "steps: 2")
    with pytest.raises(CampaignConflict, match="different spec"):
        _engine(spec_mod.loads(changed, "inproc.yaml"), tmp_path).register(changed)


def test_steps_left_when_the_attempt_ends_during_a_ledger_outage_are_not_lost(tmp_path: Path) -> None:
    """The attempt's last ingestion has no later tick: it waits out the outage (a held SQLite
    lock past the 10 s busy timeout here; a Postgres restart in tests/e2e/test_ledger_outage.py)."""
    import sqlite3
    import threading
    from concurrent.futures import Future

    spec = _spec([{"kind": "smoke", "steps": 5, "timeout_s": 60}])
    db = tmp_path / "ledger.db"
    holder = sqlite3.connect(db, isolation_level=None, check_same_thread=False)

    def runner_then_outage(request: Any) -> Future[dict[str, Any]]:
        done: Future[dict[str, Any]] = Future()
        done.set_result(supervise(request))  # no ingestion tick ran: every row is left for the last one
        holder.execute("BEGIN EXCLUSIVE")
        threading.Timer(12, lambda: holder.execute("COMMIT")).start()
        return done

    ledger = open_ledger(f"sqlite:///{db}")
    engine = Engine(spec, ledger, workdir=tmp_path / "campaigns", progress=Progress(io.StringIO(), quiet=True),
                    runner=runner_then_outage)
    assert engine.submit() == 0
    with engine.ledger.session() as s:
        [run] = reads.current_stage_runs(s, reads.get_campaign(s, "inproc"))
        assert run.steps == 5, "every step the trainer reported reached the ledger"


ABORTS_AT_EXIT = textwrap.dedent('''
    """A stdlib trainer that trains its steps, then dies by SIGABRT in teardown, as torch's
    gloo teardown now and then does ("terminate called without an active exception"): on
    rank ABORT_RANK, in the attempts listed in ABORT_ATTEMPTS (all attempts: "all")."""
    import os, sys
    from campaign.report import Reporter
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    rep = Reporter.from_env(rank=rank, local_rank=int(os.environ["LOCAL_RANK"]), world_size=world)
    rep.startup({"ranks": [{"rank": r} for r in range(world)], "allreduce": {"got": 1, "expected": 1}})
    for step in range(1, int(os.environ["CAMPAIGN_MAX_STEPS"]) + 1):
        rep.phase("compute", step)
        rep.step(step=step, tokens=step * 8, loss=2.0 - 0.01 * step, step_time_s=0.01)
    rep.close()
    attempts = os.environ["ABORT_ATTEMPTS"]
    if rank == int(os.environ["ABORT_RANK"]) and (attempts == "all" or os.environ["CAMPAIGN_ATTEMPT"] in attempts.split(",")):
        print("terminate called without an active exception", file=sys.stderr, flush=True)
        os.abort()
''')


def _verdict(engine: Engine, stage: str) -> tuple[str, str]:
    with engine.ledger.session() as s:
        run = reads.get_stage_run(s, engine.spec.name, stage)
        assert run is not None
        return run.state, run.verdict or ""


@pytest.mark.parametrize("stage", [{"kind": "smoke", "steps": 3, "timeout_s": 60},
                                   {"kind": "loss_check", "steps": 6, "window": 2, "timeout_s": 60,
                                    "reference": {"record": True}}])
def test_a_one_off_abort_without_evidence_gets_the_confirming_retry_it_was_promised(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stage: dict[str, Any]) -> None:
    """An abort after the last step with nothing against the node is `crashed_unknown`, whose
    finding promises one confirming retry (issue 13): smoke and loss_check make it, pass on it,
    and the verdict names the first attempt's error line and log; nobody is excluded."""
    (tmp_path / "abort.py").write_text(ABORTS_AT_EXIT)
    monkeypatch.setenv("ABORT_RANK", "1")
    monkeypatch.setenv("ABORT_ATTEMPTS", "1")
    engine = _engine(_spec([stage], command=["{python}", str(tmp_path / "abort.py")]), tmp_path)
    assert engine.submit() == 0
    name = stage["kind"]
    assert [(a[1], a[2], a[3]) for a in _attempts(engine)] == [(1, "crashed_unknown", 134), (2, "succeeded", 0)]
    state, verdict = _verdict(engine, name)
    assert state == "passed"
    assert ("(on a confirming retry: attempt 1 ended crashed_unknown, exit 134: "
            "'terminate called without an active exception'; log: ") in verdict
    assert f"{name}/attempt-001/logs/rank-1.log)" in verdict
    with engine.ledger.session() as s:
        assert reads.list_exclusions(s, "local") == []


def test_an_abort_that_recurs_on_the_retry_fails_the_stage_without_blaming_a_node(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "abort.py").write_text(ABORTS_AT_EXIT)
    monkeypatch.setenv("ABORT_RANK", "1")
    monkeypatch.setenv("ABORT_ATTEMPTS", "all")
    engine = _engine(_spec([{"kind": "smoke", "steps": 3, "timeout_s": 60}], nodes=3,
                           command=["{python}", str(tmp_path / "abort.py")]), tmp_path)
    assert engine.submit() == 1
    assert [(a[1], a[3]) for a in _attempts(engine)] == [(1, 134), (2, 134)]
    state, verdict = _verdict(engine, "smoke")
    assert state == "failed" and verdict.startswith("trainer exited 134") and "confirming retry: attempt 1" in verdict
    with engine.ledger.session() as s:
        assert reads.list_exclusions(s, "local") == []


SLOW_TRAINER = textwrap.dedent('''
    """A stdlib trainer that takes its time: 0.1 s a step, to CAMPAIGN_MAX_STEPS."""
    import os, time
    from campaign.report import Reporter
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    rep = Reporter.from_env(rank=rank, local_rank=int(os.environ["LOCAL_RANK"]), world_size=world)
    for step in range(1, int(os.environ["CAMPAIGN_MAX_STEPS"]) + 1):
        rep.phase("compute", step)
        time.sleep(0.1)
        rep.step(step=step, tokens=step * 8, loss=2.0, step_time_s=0.1)
    rep.close()
''')


def test_a_driver_that_lost_its_lease_stops_and_leaves_the_trainers_running(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 13 item 2: another driver took the lease (it judged this one dead). This driver
    stops at its next renewal or write (fencing) without touching the launch: no STOP file, no signal, the attempt
    left as it was for the new holder to adopt or stop, the new holder's lease kept."""
    import threading

    import sqlalchemy as sa

    from campaign.errors import LeaseLost
    from campaign.ledger.models import Lease
    from campaign.rundir import STOP_FILE

    monkeypatch.setattr("campaign.lease.RENEW_S", 0.2)
    (tmp_path / "slow.py").write_text(SLOW_TRAINER)
    spec = _spec([{"name": "long", "kind": "long_run", "steps": 600, "checkpoint_every": 1000, "timeout_s": 120}],
                 command=["{python}", str(tmp_path / "slow.py")])
    engine = _engine(spec, tmp_path)
    run_dir = tmp_path / "campaigns" / "inproc" / "long" / "attempt-001"

    def take_the_lease() -> None:
        deadline = time.time() + 60
        while time.time() < deadline and not ((run_dir / "metrics.jsonl").exists()
                                               and len((run_dir / "metrics.jsonl").read_text().splitlines()) >= 3):
            time.sleep(0.1)
        with engine.ledger.session(fenced=False) as s:  # the new holder's write, not this driver's
            s.execute(sa.update(Lease).values(token="the-new-holder", host="login9", pid=4242))

    intruder = threading.Thread(target=take_the_lease)
    intruder.start()
    with pytest.raises(LeaseLost, match="login9"):
        engine.submit()
    intruder.join()
    pgids = json.loads((run_dir / "pids.json").read_text())["pgids"]
    try:
        assert [_group_alive(g) for g in pgids] == [True, True], "the trainers go on for the new holder"
        assert not (run_dir / STOP_FILE).exists()
        [(_, _, state, code, _, _)] = _attempts(engine)
        assert (state, code) == ("running", None)
        with engine.ledger.session() as s:
            assert s.scalar(sa.select(Lease.token)) == "the-new-holder"
    finally:
        (run_dir / STOP_FILE).touch()  # what the new holder's recovery does: the supervisor stops the job
        deadline = time.time() + 30
        while time.time() < deadline and any(_group_alive(g) for g in pgids):
            time.sleep(0.2)


def _group_alive(pgid: int) -> bool:
    import os

    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


RANK1_FAILS_LATE = textwrap.dedent('''
    """Rank 0 (whose output is read) trains every step and exits 0; rank 1 then exits 3."""
    import os, sys, time
    steps = int(os.environ["CAMPAIGN_MAX_STEPS"])
    if os.environ["RANK"] != "0":
        time.sleep(0.05 * steps + 1.5)
        sys.exit(3)
    for step in range(1, steps + 1):
        time.sleep(0.05)
        print(f"iter {step}: loss {3.0 - 0.1 * step:.4f}, time 50.00ms", flush=True)
''')


def test_a_failure_after_rank_0_reached_the_target_is_not_relaunched(tmp_path: Path) -> None:
    """Issue 39, item 5: rank 0 had reported the long run's last step when rank 1 failed; the
    relaunch redid the steps (this trainer saves no checkpoint: all of them) and the verdict
    quoted the earlier attempt's final loss. Now the stage ends there, on rank 0's own final
    step and loss, and says how the launch ended."""
    (tmp_path / "late.py").write_text(RANK1_FAILS_LATE)
    spec = _spec([{"kind": "long_run", "steps": 6, "checkpoint_every": 3, "timeout_s": 60, "backoff_s": 0,
                   "exclude_suspects": False, "watchdog": {"exit_s": 20, "drill_s": 0}}],
                 command=["{python}", str(tmp_path / "late.py")], progress="stdout",
                 step_pattern=r"iter (?P<step>\d+): loss (?P<loss>[\d.]+)")
    engine = _engine(spec, tmp_path)
    assert engine.submit() == 0
    attempts = _attempts(engine)
    with engine.ledger.session() as s:
        [run] = reads.current_stage_runs(s, reads.get_campaign(s, "inproc"))
        verdict, numbers = run.verdict, dict(run.numbers or {})
    assert [(a[2], a[3]) for a in attempts] == [("crashed_unknown", 3)], attempts
    assert "reached 6 steps (step 6," in verdict and "final loss 2.4000" in verdict, verdict
    assert "attempt 1 then ended crashed_unknown (exit 3) after its rank 0 reported the last step" in verdict, verdict
    assert "not relaunched" in verdict and numbers["last_step"] == 6


def test_strong_scaling_of_a_stdout_trainer_records_the_tokens_it_trains(tmp_path: Path) -> None:
    """Issue 39, item 5: `batch: strong` shrank the built-in trainer's micro-batch at 2 nodes
    and the stdout reader counted that (half) batch for a script that trains its own: the
    ledger recorded half the tokens the script trained. A script read through its output
    trains trainer.micro_batch_size per rank at every count, and is counted at it."""
    from campaign.contract import batch_tokens, custom_trainer_warnings

    (tmp_path / "plain.py").write_text(PLAIN_TRAINER)
    spec = _spec([{"kind": "scaling", "node_counts": [1, 2], "batch": "strong", "steps": 4, "warmup_steps": 1,
                   "min_efficiency": 0.0, "loss_tolerance": 1.0, "timeout_s": 60}],
                 command=["{python}", str(tmp_path / "plain.py"), "--steps", "{max_steps}"], progress="stdout",
                 step_pattern=r"iter (?P<step>\d+): loss (?P<loss>[\d.]+), time (?P<step_time_ms>[\d.]+)ms")
    assert any(w.startswith("stages[0].batch: strong shrinks the built-in trainer's per-rank batch; your trainer "
                            "(progress: stdout) keeps") for w in custom_trainer_warnings(spec))
    engine = _engine(spec, tmp_path)
    assert engine.submit() == 0
    with engine.ledger.session() as s:
        c = reads.get_campaign(s, "inproc")
        tokens = {a.number: [m.tokens for m in reads.list_steps(s, a.id)] for _, a in reads.list_attempts(s, c)}
    per_rank = batch_tokens(spec.model, spec.trainer, 1)  # seq_len x micro_batch_size 2 x grad_accum
    assert tokens == {1: [per_rank * k for k in range(1, 5)], 2: [2 * per_rank * k for k in range(1, 5)]}, tokens
