"""The trainer contract's inputs (docs/trainer-contract.md): a trainer of your own gets its
command line from an explicit template (nothing appended), its scripts resolved against the
campaign file's folder, its targets as environment variables; `campaign validate` refuses an
unknown placeholder and warns about fields only the built-in trainer reads."""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import pytest

from campaign import contract
from campaign.attempt import build_request, trainer_config
from campaign.spec import CampaignSpec
from campaign.stagebase import Targets


def _spec(trainer: dict[str, Any], **extra: Any) -> CampaignSpec:
    return CampaignSpec.model_validate({"name": "own", "site": {"kind": "local", "nodes": 2},
                                        "trainer": trainer, "stages": [{"kind": "smoke"}], **extra})


def _request(spec: CampaignSpec, tmp_path: Path, targets: Targets, resume_from: dict[str, Any] | None = None) -> Any:
    config = trainer_config(spec, targets, stage_dir=tmp_path / "stage", attempt=2)
    return build_request(spec.site, config, run_dir=tmp_path / "stage" / "attempt-002", nodes=2, excluded=[],
                         timeout_s=60, master_port=None, spec_dir=tmp_path / "specs", resume_from=resume_from)


def test_a_template_is_expanded_and_nothing_is_appended(tmp_path: Path) -> None:
    spec = _spec({"command": ["{python}", "train.py", "--steps={max_steps}", "--out", "{checkpoint_dir}",
                              "--tokens", "{max_tokens}", "--resume", "{resume}", "--every", "{checkpoint_every}"]})
    req = _request(spec, tmp_path, Targets(steps=40, resume=True, train={"checkpoint_every": 10}))
    ckpt = str(tmp_path / "stage" / "checkpoints")
    assert req.argv == ["{python}", str(tmp_path / "specs" / "train.py"), "--steps=40", "--out", ckpt,
                        "--tokens", "0", "--resume", "1", "--every", "10"]
    assert {k: req.env[k] for k in ("CAMPAIGN_MAX_STEPS", "CAMPAIGN_CHECKPOINT_DIR", "CAMPAIGN_RESUME",
                                    "CAMPAIGN_CHECKPOINT_EVERY", "CAMPAIGN_RUN_DIR", "CAMPAIGN_SPEC_DIR")} == {
        "CAMPAIGN_MAX_STEPS": "40", "CAMPAIGN_CHECKPOINT_DIR": ckpt, "CAMPAIGN_RESUME": "1",
        "CAMPAIGN_CHECKPOINT_EVERY": "10", "CAMPAIGN_RUN_DIR": str(tmp_path / "stage" / "attempt-002"),
        "CAMPAIGN_SPEC_DIR": str(tmp_path / "specs")}
    assert "CAMPAIGN_MAX_TOKENS" not in req.env and "CAMPAIGN_RESUME_FROM" not in req.env


@pytest.mark.parametrize(("arg", "resolved"), [("train.py", True), ("./run.sh", True), ("../x/t.py", True),
                                               ("/abs/t.py", False), ("-m", False), ("torchrun", False),
                                               ("--script=t.py", False), ("{spec_dir}/t.py", False)])
def test_relative_scripts_resolve_against_the_campaign_files_folder(tmp_path: Path, arg: str, resolved: bool) -> None:
    req = _request(_spec({"command": ["python", arg]}), tmp_path, Targets(steps=1))
    expect = str(tmp_path / "specs" / arg) if resolved else arg.replace("{spec_dir}", str(tmp_path / "specs"))
    assert req.argv == ["python", expect]


def test_resume_args_are_added_only_when_resuming_from_a_checkpoint(tmp_path: Path) -> None:
    spec = _spec({"command": ["python", "t.py"], "resume_args": ["--init_from", "{resume_path}", "--at={resume_step}"]})
    fresh = _request(spec, tmp_path, Targets(steps=9, resume=True))
    resumed = _request(spec, tmp_path, Targets(steps=9, resume=True), {"path": "/c/ckpt_4.pt", "step": 4})
    assert fresh.argv == ["python", str(tmp_path / "specs" / "t.py")]
    assert resumed.argv[2:] == ["--init_from", "/c/ckpt_4.pt", "--at=4"]
    assert resumed.env["CAMPAIGN_RESUME_FROM"] == "/c/ckpt_4.pt"


def test_the_built_in_trainer_still_gets_its_config(tmp_path: Path) -> None:
    req = _request(_spec({}), tmp_path, Targets(steps=3))
    # On the local launcher it starts warm, through the node's fork server (warm_start: auto).
    assert req.argv == ["{python}", "-m", "campaign.executors.warm", "--", "{python}", "-m", "campaign.train", "--config",
                        str(tmp_path / "stage" / "attempt-002" / "trainer.json")]
    cold = _request(_spec({"warm_start": False}), tmp_path, Targets(steps=3))
    assert cold.argv == req.argv[4:]


def test_warm_start_wraps_your_own_command_only_when_asked(tmp_path: Path, run_cli: Any) -> None:
    own = {"command": ["{python}", "train.py", "--steps={max_steps}"]}
    auto = _request(_spec(own), tmp_path, Targets(steps=3))
    assert auto.argv[:2] == ["{python}", str(tmp_path / "specs" / "train.py")]
    asked = _request(_spec({**own, "warm_start": True}), tmp_path, Targets(steps=3))
    assert asked.argv[:5] == ["{python}", "-m", "campaign.executors.warm", "--", "{python}"]
    code, out, err = _validate(run_cli, tmp_path, "name: x\ntrainer:\n  command: [bash, run.sh]\n"
                                                  "  warm_start: true\nstages: [{kind: smoke}]\n")
    assert code == 2 and out == ""
    assert "trainer.warm_start: the command must start with {python}" in err and "(c.yaml, line 4)" in err


def _validate(run_cli: Any, tmp_path: Path, text: str) -> tuple[int, str, str]:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return run_cli("validate", path)


def test_an_unknown_placeholder_is_refused_naming_the_field(run_cli: Any, tmp_path: Path) -> None:
    code, out, err = _validate(run_cli, tmp_path, "name: x\ntrainer:\n  command: [python, t.py, '{max_step}']\n"
                                                  "stages: [{kind: smoke}]\n")
    assert code == 2 and out == ""
    assert "trainer.command[2]: unknown placeholder {max_step}" in err and "line 3" in err


def test_stdout_progress_needs_a_pattern_with_step_and_loss(run_cli: Any, tmp_path: Path) -> None:
    code, _, err = _validate(run_cli, tmp_path, "name: x\ntrainer:\n  command: [python, t.py]\n  progress: stdout\n"
                                                "  step_pattern: 'iter (?P<step>\\d+)'\nstages: [{kind: smoke}]\n")
    assert code == 2 and "trainer.step_pattern: needs the named group(s) loss" in err


def test_scaling_with_stdout_progress_needs_tokens_per_step_or_is_refused(run_cli: Any, tmp_path: Path) -> None:
    """Issue 27 item 1: without tokens in the lines or a batch in the spec, tokens/s cannot be
    derived: refused at validate, naming the stage and both ways out."""
    head = ("name: x\ntrainer:\n  command: [python, t.py]\n  progress: stdout\n"
            "  step_pattern: 'iter (?P<step>\\d+): loss (?P<loss>\\S+)'\n")
    code, out, err = _validate(run_cli, tmp_path, head + "stages: [{kind: scaling, node_counts: [1, 2]}]\n")
    assert code == 2 and out == ""
    assert "stages[0]: a scaling stage cannot measure tokens/s" in err and "(?P<tokens>...)" in err, err
    assert "trainer.micro_batch_size" in err
    code, _, err = _validate(run_cli, tmp_path, head + "  micro_batch_size: 4\nstages: [{kind: scaling, node_counts: [1, 2]}]\n")
    assert code == 0, err
    tokens = head.replace("(?P<loss>\\S+)", "(?P<loss>\\S+) tokens (?P<tokens>\\d+)")
    code, _, err = _validate(run_cli, tmp_path, tokens + "stages: [{kind: scaling, node_counts: [1, 2]}]\n")
    assert code == 0, err
    rate = head.replace("(?P<loss>\\S+)", "(?P<loss>\\S+) tok/s (?P<tokens_per_s>\\S+)")
    code, _, err = _validate(run_cli, tmp_path, rate + "stages: [{kind: scaling, node_counts: [1, 2]}]\n")
    assert code == 0, err


def test_validate_warns_about_fields_a_custom_command_ignores(run_cli: Any, tmp_path: Path) -> None:
    code, out, err = _validate(run_cli, tmp_path, "name: x\nmodel: {size: small}\ntrainer:\n  command: [python, t.py]\n"
                                                  "  lr: 0.1\n  checkpoint_every: 5\nstages: [{kind: smoke}]\n")
    assert code == 0 and "valid" in out
    assert "warning: model: set" in err and "warning: trainer.lr: built-in trainer field" in err
    assert "checkpoint_every" not in err  # a target every trainer gets ({checkpoint_every})
    code, _, err = _validate(run_cli, tmp_path, "name: x\nmodel: {size: small}\ntrainer: {lr: 0.1}\n"
                                                "stages: [{kind: smoke}]\n")
    assert code == 0 and err == ""


def test_checkpoints_of_a_trainers_own_layout_and_their_completeness(tmp_path: Path) -> None:
    layout = _spec({"command": ["python", "t.py"], "checkpoints": {"glob": "ckpt_*.pt"}}).trainer.checkpoints
    for step in (5, 10):
        with zipfile.ZipFile(tmp_path / f"ckpt_{step:06d}.pt", "w") as z:
            z.writestr("data.pkl", b"x" * 100)
    whole = (tmp_path / "ckpt_000010.pt").read_bytes()
    (tmp_path / "ckpt_000015.pt").write_bytes(whole[: len(whole) // 2])  # a save cut short by kill -9
    found = contract.list_checkpoints(layout, tmp_path)
    assert [(c["step"], c["complete"]) for c in found] == [(5, True), (10, True), (15, False)]
    newest = contract.newest_complete(layout, tmp_path)
    assert newest is not None and newest["step"] == 10
    assert contract.newest_complete(None, tmp_path) is None  # no step-NNNNNNNN/ folders here


def test_progress_lines_are_read_from_an_offset_leaving_a_partial_line(tmp_path: Path) -> None:
    import re

    from campaign import report

    log = tmp_path / "rank-0.log"
    pattern = re.compile(r"iter (?P<step>\d+): loss (?P<loss>\S+), (?P<step_time>[\d.]+)s")
    log.write_text("loading...\niter 1: loss 2.5, 0.5s\niter 2: loss nan, 0.25s\niter 3: lo")
    rows, offset = report.read_progress_lines(log, pattern)
    assert [(r["step"], r["step_time_s"]) for r in rows] == [(1, 0.5), (2, 0.25)] and rows[1]["loss"] != rows[1]["loss"]
    with open(log, "a") as f:
        f.write("ss 1.9, 0.5s\n")
    rows, _ = report.read_progress_lines(log, pattern, offset)
    assert rows == [{"step": 3, "loss": 1.9, "step_time_s": 0.5}]
    ms = re.compile(r"iter (?P<step>\d+): loss (?P<loss>\S+), time (?P<step_time_ms>[\d.]+)ms")  # nanoGPT's line
    log.write_text("iter 0: loss 3.4675, time 441.38ms, mfu -100.00%\n")
    assert report.read_progress_lines(log, ms)[0] == [{"step": 0, "loss": 3.4675, "step_time_s": 0.44138}]
    bng = re.compile(r"step +(?P<step>\d+) \| loss: (?P<loss>\S+) \|.*tok/sec: (?P<tokens_per_s>[\d.]+)")  # build-nanogpt
    log.write_text("step     0 | loss: 10.955 | lr 6.0000e-06 | norm: 15.4 | dt: 120.50ms | tok/sec: 4350.86\n")
    assert report.read_progress_lines(log, bng)[0] == [{"step": 0, "loss": 10.955, "tokens_per_s": 4350.86}]


def _rows_read_from_rank0(req: Any, log: str) -> list[dict[str, Any]]:
    """What the supervisor's ProgressAdapter appends to metrics.jsonl for rank 0's output `log`."""
    from campaign import report
    from campaign.supervisor import ProgressAdapter

    run_dir = Path(req.run_dir)
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "logs" / "rank-0.log").write_text(log)
    adapter = ProgressAdapter.for_request(req)
    assert adapter is not None
    adapter.poll(100.0)
    return report.read_metrics(run_dir)[0]


def test_a_trainer_counting_from_0_trains_exactly_the_steps_asked(tmp_path: Path) -> None:
    """Issue 27 item 5: nanoGPT prints `iter 0` first and trains through --max_iters; with
    `first_step: 0` it gets steps - 1 and its printed step N is recorded as step N + 1."""
    trainer = {"command": ["python", "t.py", "--max_iters={max_steps}"], "progress": "stdout", "first_step": 0,
               "step_pattern": r"iter (?P<step>\d+): loss (?P<loss>\S+),"}
    req = _request(_spec(trainer), tmp_path, Targets(steps=5))
    assert req.argv[-1] == "--max_iters=4" and req.env["CAMPAIGN_MAX_STEPS"] == "4"
    rows = _rows_read_from_rank0(req, "".join(f"iter {i}: loss 3.5, time 1ms\n" for i in range(5)))
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    one = _request(_spec({**trainer, "first_step": 1}), tmp_path, Targets(steps=5))
    assert one.argv[-1] == "--max_iters=5"


def test_a_stdout_trainer_without_a_tokens_group_counts_the_specs_batch_per_step(tmp_path: Path) -> None:
    """Issue 27: a trainer read through its output that prints no tokens had every row at 0
    tokens (a token target and the progress plot saw nothing). With the batch in the spec
    (micro_batch_size x grad_accum x seq_len x ranks) step N counts N batches; without it, 0."""
    trainer = {"command": ["python", "t.py"], "progress": "stdout", "first_step": 0,
               "step_pattern": r"iter (?P<step>\d+): loss (?P<loss>\S+),", "micro_batch_size": 3, "grad_accum": 2}
    rows_of = {}
    for name, t in (("batch", trainer), ("none", {k: v for k, v in trainer.items() if k != "micro_batch_size"}),
                    ("own", {**trainer, "step_pattern": r"iter (?P<step>\d+): loss (?P<loss>\S+), tok (?P<tokens>\d+)"})):
        req = _request(_spec(t, model={"seq_len": 16}), tmp_path / name, Targets(steps=3))
        rows = _rows_read_from_rank0(req, "".join(f"iter {i}: loss 3.5, tok {7 * i}\n" for i in range(3)))
        rows_of[name] = [r["tokens"] for r in rows]
    per_step = 16 * 3 * 2 * 2  # seq_len x micro_batch_size x grad_accum x (2 nodes x 1 rank)
    assert rows_of == {"batch": [per_step, 2 * per_step, 3 * per_step], "none": [0, 0, 0], "own": [0, 7, 14]}


def test_a_single_file_checkpoint_gets_the_step_reported_when_it_was_saved(tmp_path: Path) -> None:
    """Issue 27 item 2: nanoGPT rewrites one `ckpt.pt` (no step in the name): its step is
    bounded by the steps printed before and after its mtime, and is the one in that range the
    trainer was asked to save at; noted while the supervisor watches, never guessed."""
    import os

    layout = _spec({"command": ["python", "t.py"], "checkpoints": {"glob": "rank0/ckpt.pt"}}).trainer.checkpoints
    ckpt = tmp_path / "ckpt"
    (ckpt / "rank0").mkdir(parents=True)
    t0 = 1_800_000_000.0
    seen = [(s, t0 + s - 1, t0 + s) for s in range(1, 13)]  # one line per poll: step s read at t0 + s
    with zipfile.ZipFile(ckpt / "rank0" / "ckpt.pt", "w") as z:
        z.writestr("data.pkl", b"x")
    os.utime(ckpt / "rank0" / "ckpt.pt", (t0 + 5.5, t0 + 5.5))
    assert [c["step"] for c in contract.list_checkpoints(layout, ckpt)] == [None], "unknown until noted"
    contract.note_checkpoint_steps(layout, ckpt, seen)  # step 6 may have been printed before it, or after
    assert [c["step"] for c in contract.list_checkpoints(layout, ckpt)] == [None]
    every5 = contract.expected_saves(5, ())
    contract.note_checkpoint_steps(layout, ckpt, seen, expected=every5)
    assert [(c["step"], c["complete"]) for c in contract.list_checkpoints(layout, ckpt)] == [(5, True)]
    os.utime(ckpt / "rank0" / "ckpt.pt", (t0 + 10.5, t0 + 10.5))  # saved again in place
    contract.note_checkpoint_steps(layout, ckpt, seen, expected=every5)
    assert contract.newest_complete(layout, ckpt)["step"] == 10  # type: ignore[index]
    assert contract.checkpoint_since(layout, ckpt, 10, since=0) is not None
    assert contract.checkpoint_since(layout, ckpt, 11, since=0) is None


def test_the_step_at_a_save_read_in_the_same_poll_as_its_neighbours() -> None:
    """Steps 1-7 read in one poll (0, 10] with the save at 4 inside it: only the step the
    trainer was asked to save at fits; without that, or with two that fit, it stays unknown."""
    seen = [(s, 0.0, 10.0) for s in range(1, 8)]
    every4 = contract.expected_saves(4, ())
    assert contract.step_at_save(5.0, seen, every4) == 4
    assert contract.step_at_save(5.0, seen, contract.expected_saves(0, (4,))) == 4
    assert contract.step_at_save(5.0, seen, None) is None
    assert contract.step_at_save(5.0, seen, contract.expected_saves(2, ())) is None  # 2, 4 and 6 fit
    assert contract.step_at_save(5.0, seen[:3], every4) is None  # nothing read after it yet: may still narrow
    later = seen + [(8, 10.0, 20.0), (9, 20.0, 30.0)]
    assert contract.step_at_save(25.0, later, every4) == 8  # printed before 20, after 20: exactly 8


def test_a_timestamp_in_a_folder_name_is_never_read_as_a_step(tmp_path: Path) -> None:
    """Issue 27 item 2: FSDP2's example saves DCP folders named by unix time in ms."""
    import os

    layout = _spec({"command": ["python", "t.py"], "checkpoints": {
        "glob": "checkpoints/dtensor_api/*", "complete": "marker", "marker": "optim_state_dict.pt"}}).trainer.checkpoints
    for i, stamp in enumerate((1_764_900_000_123, 1_764_900_009_456)):
        folder = tmp_path / "checkpoints" / "dtensor_api" / str(stamp)
        folder.mkdir(parents=True)
        (folder / "optim_state_dict.pt").write_bytes(b"x")
        os.utime(folder, (1000 + i, 1000 + i))
    found = contract.list_checkpoints(layout, tmp_path)
    assert [c["step"] for c in found] == [None, None] and found[-1]["path"].endswith("1764900009456")
    # the run started after both were written: neither is this run's checkpoint
    assert contract.checkpoint_since(layout, tmp_path, 10, since=2000) is None
    assert contract.checkpoint_since(layout, tmp_path, 10, since=1001) is not None


def test_a_resume_test_no_checkpoint_can_satisfy_is_refused_at_validate(run_cli: Any, tmp_path: Path) -> None:
    """Issue 27 item 2: before any node is spent."""
    text = ("name: x\ntrainer:\n  command: [python, t.py]\n  progress: stdout\n"
            "  step_pattern: 'iter (?P<step>\\d+): loss (?P<loss>\\S+)'\nstages: [{kind: resume_test}]\n")
    code, out, err = _validate(run_cli, tmp_path, text)
    assert code == 2 and out == ""
    assert "stages[0]: the resume test cannot run with this trainer" in err and "trainer.checkpoints" in err, err
    code, _, err = _validate(run_cli, tmp_path, text.replace("stages:", "  checkpoints: {glob: ckpt.pt}\nstages:"))
    assert code == 0, err


def test_step_times_narrow_when_lines_read_in_one_poll_were_printed() -> None:
    """Lines 1-11 read in one poll (0, 6.5] with nanoGPT's step times (a save of step 8 took 1 s
    inside step 9's): the bounds put 8 before the save, so step 8 is the only save step left."""
    from campaign.supervisor import printed_between

    times = {s: 0.3 for s in range(1, 12)}
    times[9] = 1.3  # eval + save + the step: nanoGPT's dt runs from one step's end to the next's
    rows = [{"step": s, "loss": 3.0, "step_time_s": times[s]} for s in range(1, 12)]
    seen = printed_between(rows, 0.0, 6.5)
    assert seen[-1] == (11, pytest.approx(4.0), 6.5) and seen[7] == (8, pytest.approx(2.1), pytest.approx(4.6))
    assert all(a <= b for _, a, b in seen)
    # true times: line s at 2.0 + 0.3 s (s <= 8), the save ending at 5.3, lines 9-11 at 5.6, 5.9,
    # 6.2: without step times any of 1-11 could have been printed after the save (4 or 8?)
    assert contract.step_at_save(5.3, [(s, 0.0, 6.5) for s in range(1, 12)], contract.expected_saves(4, ())) is None
    assert contract.step_at_save(5.3, seen, contract.expected_saves(4, ())) == 8


def test_rescue_is_on_by_default_behind_the_launchers_that_pass_sigusr1_on() -> None:
    """Issue 28: `rescue: auto` is on where the launch delivers the supervisor's SIGUSR1 to
    every rank (local; srun, whose man page says it forwards signals to its tasks; MPICH's
    Hydra), off behind PALS and torchrun; never for a command of your own."""
    from campaign.train.config import TrainConfig

    auto = TrainConfig()
    assert {launcher: contract.rescue(auto, launcher) for launcher in ("local", "srun", "mpich", "pals", "torchrun")} \
        == {"local": True, "srun": True, "mpich": True, "pals": False, "torchrun": False}
    assert contract.rescue(TrainConfig(rescue=True), "pals") and not contract.rescue(TrainConfig(rescue=False), "srun")
    assert not contract.rescue(TrainConfig(command=["python", "t.py"]), "srun")


def test_a_rescue_covers_a_fault_only_where_another_node_holds_the_whole_state() -> None:
    """What lengthens a long run's checkpoint interval after rescued faults (goodput.suggest_interval):
    the trainer answers rescue requests and a rank on another node holds a replica (DDP on 2+
    nodes, not XPU), as campaign.train.rescue.supported and the rescuer's choice require."""
    from campaign.executors.aurora import AuroraSite
    from campaign.executors.local import LocalSite
    from campaign.executors.slurm import SlurmSite
    from campaign.train.config import TrainConfig

    auto, slurm = TrainConfig(), SlurmSite(nodes=2)
    assert contract.rescue_covers(auto, slurm, 2) and contract.rescue_covers(auto, LocalSite(nodes=8), 8)
    assert not contract.rescue_covers(auto, slurm, 1)  # one node: the rescuer is never on the suspect node
    assert not contract.rescue_covers(TrainConfig(parallelism="fsdp"), slurm, 8)  # sharded
    assert not contract.rescue_covers(TrainConfig(device="xpu"), LocalSite(nodes=8), 8)
    aurora = AuroraSite(account="p", queue="capacity", nodes=8)
    assert not contract.rescue_covers(TrainConfig(rescue=True), aurora, 8)  # Aurora: `device: auto` is XPU there
    assert not contract.rescue_covers(auto, aurora, 8) and not contract.rescue_covers(TrainConfig(rescue=False), slurm, 8)
