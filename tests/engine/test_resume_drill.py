"""The resume test's drill on a trainer of our own whose LR schedule follows max_steps, as
build-nanogpt's cosine does, and which saves a checkpoint at its end whatever it is told
(issue 39, item 5). A real ledger, the real supervisor (in a thread, no Parsl) and a stdlib
trainer honouring the contract through campaign.report; its state is one number, so a run
is deterministic and a resume exact when the state and the schedule are restored."""

from __future__ import annotations

import io
import textwrap
from pathlib import Path
from typing import Any

from campaign.engine import Engine
from campaign.ledger import open_ledger, reads
from campaign.progress import Progress
from campaign.runner import run_in_thread
from campaign.spec import CampaignSpec

COSINE = textwrap.dedent('''
    """One number of state, a cosine LR over max_steps; checkpoints at checkpoint_at and at its
    end; argv: seconds per step, the attempt whose launch aborts at exit (0: none), and
    optionally "own": one ckpt.json of its own, rewritten at every save (as nanoGPT's ckpt.pt)."""
    import json, math, os, sys, time
    from pathlib import Path
    from campaign import report
    pace, abort_in, own = float(sys.argv[1]), int(sys.argv[2]), sys.argv[3:] == ["own"]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    rep = report.Reporter.from_env(rank=rank, local_rank=int(os.environ["LOCAL_RANK"]), world_size=world)
    report.startup_check([report.rank_identity(rank, 0)], 1.0, rank=rank)
    run = report.run_config()
    w, step = 0.0, 0
    single = Path(run["checkpoint_dir"]) / "ckpt.json"
    latest = report.latest_complete_checkpoint(run["checkpoint_dir"]) if run["resume"] and not own else None
    if latest is not None or (own and run["resume"] and single.exists()):
        state = json.loads((single if own else latest / "state.json").read_text())
        w, step = state["w"], state["step"]

    def save(step):
        if own:
            single.parent.mkdir(parents=True, exist_ok=True)
            report.write_json_atomic(single, {"w": w, "step": step})
            return
        path = report.begin_checkpoint(run["checkpoint_dir"], step, rank=rank)
        (path / "state.json").write_text(json.dumps({"w": w, "step": step}))
        report.complete_checkpoint(path, step=step, tokens=8 * step, rank=rank)

    while step < run["max_steps"]:
        step += 1
        rep.phase("compute", step)
        time.sleep(pace)
        loss = (w - 1.0) ** 2 + 0.1 * math.sin(step)  # the forward, before this step's update
        lr = 0.05 * 0.5 * (1 + math.cos(math.pi * step / run["max_steps"]))  # build-nanogpt: over max_steps
        w -= lr * 2 * (w - 1.0)
        rep.phase("collective", step)
        rep.step(step=step, tokens=8 * step, loss=loss, step_time_s=pace)
        if step in run["checkpoint_at"]:
            save(step)
    save(step)  # at its end, whatever checkpoint_final says
    rep.close()
    if int(os.environ["CAMPAIGN_ATTEMPT"]) == abort_in:  # gloo's abort at exit, after the last step
        print("terminate called without an active exception", file=sys.stderr, flush=True)
        sys.exit(3)
''')


def _resume_test(tmp_path: Path, pace: float, abort_in: int, own: bool = False,
                 **stage: Any) -> tuple[Engine, io.StringIO]:
    script = tmp_path / "cosine.py"
    script.write_text(COSINE)
    trainer: dict[str, Any] = {"command": ["{python}", str(script), str(pace), str(abort_in)]}
    if own:
        trainer = {"command": [*trainer["command"], "own"], "checkpoints": {"glob": "ckpt.json", "complete": "exists"}}
    spec = CampaignSpec.model_validate({
        "name": "drill", "site": {"kind": "local", "nodes": 1, "ranks_per_node": 1}, "trainer": trainer,
        "stages": [{"name": "resume", "kind": "resume_test", "checkpoint_step": 10, "interrupt_step": 12, "steps": 16,
                    "signals": ["SIGKILL"], "timeout_s": 120, **stage}]})
    log = io.StringIO()
    return Engine(spec, open_ledger(f"sqlite:///{tmp_path / 'ledger.db'}"), workdir=tmp_path / "campaigns",
                  progress=Progress(log), runner=run_in_thread), log


def _stage(engine: Engine) -> tuple[str, str, list[tuple[str, str, int | None, int | None]], list[str]]:
    with engine.ledger.session() as s:
        c = reads.get_campaign(s, "drill")
        [run] = reads.current_stage_runs(s, c)
        attempts = [(a.label, a.state, a.first_step, a.last_step) for _, a in reads.list_attempts(s, c)]
        events = [e.message for e in reads.list_events(s, c)]
        return run.state, run.verdict, attempts, events


def test_a_schedule_over_max_steps_resumes_bit_for_bit(tmp_path: Path) -> None:
    """Item 5 (a): the interrupted run gets the reference's max_steps. Before, it got 10^9: its
    cosine trained another run from step 2, the resumed step 11 differed from the reference's,
    and the verdict blamed the data position or the RNG state."""
    engine, log = _resume_test(tmp_path, 0.25, abort_in=0)
    try:
        assert engine.submit() == 0, log.getvalue()
        state, verdict, attempts, _ = _stage(engine)
    finally:
        engine.ledger.close()
    assert (state, verdict) == ("passed", "SIGKILL: resumed from step 10, equal bit for bit (the interrupted run's own "
                                          "steps 11-12: bit for bit)"), verdict
    assert [a[0] for a in attempts] == ["reference", "SIGKILL at step 12", "resume after SIGKILL"], attempts


def test_a_schedule_over_max_steps_resumes_bit_for_bit_and_a_retry_loads_the_checkpoint_under_test(tmp_path: Path) -> None:
    """Item 5: (a) the interrupted run gets the reference's max_steps (before: 10^9, so its
    cosine trained another run and the verdict blamed the resume); (b) the first resume ends
    in an abort at exit after saving at its end (step 16): the confirming retry resumes from
    the checkpoint of step 10 again (before: from step 16's, "the resumed run reported no
    step" or "started at step 17")."""
    engine, log = _resume_test(tmp_path, 0.25, abort_in=3)
    try:
        assert engine.submit() == 0, log.getvalue()
        state, verdict, attempts, events = _stage(engine)
    finally:
        engine.ledger.close()
    assert state == "passed" and "SIGKILL: resumed from step 10, equal bit for bit (the interrupted run's own " \
        "steps 11-12: bit for bit)" in verdict, verdict
    assert [(label, cls) for label, cls, _, _ in attempts] == [
        ("reference", "succeeded"), ("SIGKILL at step 12", "cancelled"), ("resume after SIGKILL", "crashed_unknown"),
        ("resume after SIGKILL, confirming retry", "succeeded")], attempts
    assert [a[2:] for a in attempts[2:]] == [(11, 16), (11, 16)], attempts
    [aside] = [e for e in events if e.startswith("before the confirming retry: set aside")]
    assert "1 checkpoint(s) written after step 10 by attempt 3 (step(s) 16)" in aside, aside
    assert "on a confirming retry: attempt 3 ended crashed_unknown, exit 3: 'terminate called without an active " \
        "exception'" in verdict, verdict


def test_a_retry_whose_checkpoint_under_test_was_overwritten_interrupts_a_run_again(tmp_path: Path) -> None:
    """Item 5 (b), a trainer's own single checkpoint file (nanoGPT's ckpt.pt): the failed
    resume rewrote it at its end (step 16), so the checkpoint of step 10 is gone; the
    confirming retry does not load the later one: a run is interrupted again, into its own
    folder, and the retry resumes from that run's checkpoint of step 10."""
    engine, log = _resume_test(tmp_path, 0.25, abort_in=3, own=True)
    try:
        assert engine.submit() == 0, log.getvalue()
        state, verdict, attempts, _ = _stage(engine)
    finally:
        engine.ledger.close()
    assert state == "passed" and "SIGKILL: resumed from step 10, equal bit for bit" in verdict, verdict
    assert [(label, cls) for label, cls, _, _ in attempts] == [
        ("reference", "succeeded"), ("SIGKILL at step 12", "cancelled"), ("resume after SIGKILL", "crashed_unknown"),
        ("SIGKILL at step 12", "cancelled"), ("resume after SIGKILL, confirming retry", "succeeded")], attempts
    assert attempts[-1][2:] == (11, 16), attempts
    assert (tmp_path / "campaigns" / "drill" / "resume" / "checkpoints-sigkill-retry" / "ckpt.json").exists()


def test_an_interrupted_run_that_ends_before_the_signal_is_said_so(tmp_path: Path) -> None:
    """With the reference's max_steps a trainer of your own may finish before the signal
    lands (4 steps of well under 1 ms after step 12; the supervisor looks every 0.25 s): the
    stage says nothing was interrupted and how to fix it, instead of judging a resume that
    never was."""
    engine, log = _resume_test(tmp_path, 0.0, abort_in=0)
    try:
        assert engine.submit() == 1, log.getvalue()
        state, verdict, attempts, _ = _stage(engine)
    finally:
        engine.ledger.close()
    assert state == "failed" and verdict.startswith("the interrupted run (SIGKILL) reached its last step (16, exit "), \
        verdict
    assert "before the signal could land after step 12: nothing was interrupted mid-training" in verdict, verdict
    assert "leave more steps between interrupt_step and steps" in verdict and len(attempts) == 2, attempts
