"""The trainer contract's inputs: the command line and the checkpoint layout of one attempt,
for the built-in trainer and for a trainer of your own (docs/trainer-contract.md).

    argv = command_line(trainer, values, spec_dir)   # the template, expanded; nothing appended
    list_checkpoints(trainer.checkpoints, ckpt_dir)  # the trainer's own layout, or step-NNNNNNNN/

`attempt.build_request` is the only caller of the first, so the supervisor, the bisection
drill and `--dry-run` see the same command line; it makes the environment too (its targets
typed, `attempt.RunTargets`, and as variables, `attempt.rank_environment`). Stdlib and
pydantic models only.
"""

from __future__ import annotations

import json
import re
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from campaign import report
from campaign.train.config import DEFAULT_COMMAND, CheckpointLayout, TrainConfig, TrainerConfig

if TYPE_CHECKING:
    from campaign.executors.base import Site
    from campaign.spec import CampaignSpec

_SCRIPT = re.compile(r"^(\./|\.\./)|\.(py|sh)$")
"""An argument that names a script: resolved against the campaign file's folder when relative."""


def placeholder_values(cfg: TrainerConfig, *, run_dir: Path, config: Path, hostfile: Path,
                       spec_dir: Path) -> dict[str, str]:
    """The value of every placeholder of `trainer.command` for one attempt."""
    run = cfg.run
    return {
        "config": str(config), "run_dir": str(run_dir), "checkpoint_dir": run.checkpoint_dir,
        "max_steps": str(trainers_max_steps(cfg)), "max_tokens": str(run.max_tokens or 0), "resume": str(int(run.resume)),
        "checkpoint_every": str(cfg.train.checkpoint_every), "checkpoint_at": ",".join(map(str, run.checkpoint_at)),
        "attempt": str(run.attempt), "hostfile": str(hostfile), "spec_dir": str(spec_dir),
        "python": "{python}",  # stays: the supervisor's interpreter, filled in by the launch plan
    }


def trainers_max_steps(cfg: TrainerConfig) -> int:
    """The last step to train in the trainer's own numbering (`trainer.first_step`): a trainer
    that counts from 0 and trains through its `max_iters` gets steps - 1."""
    return cfg.run.max_steps - (1 - cfg.train.first_step)


def batch_tokens(model: Any, trainer: TrainConfig, world_size: int) -> int:
    """Tokens one optimizer step trains over `world_size` ranks, from the spec's batch:
    seq_len x trainer.micro_batch_size x grad_accum x ranks."""
    from campaign.train.shapes import shape_for

    return shape_for(model).seq_len * trainer.micro_batch_size * trainer.grad_accum * world_size


def stdout_tokens_per_step(cfg: TrainerConfig, world_size: int) -> int | None:
    """For a trainer read through its output (`progress: stdout`) whose `step_pattern` has no
    `tokens` group: the tokens of one step from the spec's batch, when the spec states it
    (`trainer.micro_batch_size` set), so that its rows count tokens. None otherwise: the rows
    read 0 tokens (the trainer's own count, or none to give)."""
    t = cfg.train
    if t.progress != "stdout" or "tokens" in re.compile(t.step_pattern or "").groupindex:
        return None
    if "micro_batch_size" not in t.model_fields_set:
        return None
    return batch_tokens(cfg.model, t, world_size)


def command_line(trainer: TrainConfig, values: dict[str, str], spec_dir: Path,
                 resume_from: dict[str, Any] | None = None, *, launcher: str = "local") -> list[str]:
    """The trainer's argv: its template with the placeholders filled in, scripts resolved
    against `spec_dir`, and `trainer.resume_args` when the attempt resumes from a checkpoint;
    started through the node's fork server when `warm_start(trainer, launcher)`."""
    template = list(trainer.command or DEFAULT_COMMAND)
    if warm_start(trainer, launcher):  # the rank's process is the fork server's client
        template = [template[0], "-m", "campaign.executors.warm", "--", *template]
    argv = [_expand(_resolve(a, spec_dir), values) for a in template]
    if resume_from is not None:
        extra = {**values, "resume_path": str(resume_from["path"]), "resume_step": str(resume_from["step"])}
        argv += [_expand(a, extra) for a in trainer.resume_args]
    return argv


def warm_start(trainer: TrainConfig, launcher: str) -> bool:
    """Whether ranks start from the node's fork server (campaign.executors.warm): `true` for a
    command that starts with `{python}`; `auto` for the built-in trainer with the local
    launcher (a script of your own runs in the warm interpreter only when you ask)."""
    if trainer.warm_start is True:  # validation refused it for a command not starting with {python}
        return True
    return trainer.warm_start == "auto" and trainer.command is None and launcher == "local"


RESCUE_LAUNCHERS = ("local", "srun", "mpich")
"""Launchers that pass the supervisor's SIGUSR1 on to every rank, where `trainer.rescue: auto`
is on: the local launcher (one process group per rank); srun (srun(1), Slurm 22.05.8,
SIGNALS AND ESCAPE SEQUENCES: "Signals sent to the srun command are automatically forwarded
to the tasks it is controlling with a few exceptions"; tests/hpc/test_slurm_faults.py); MPICH's
Hydra mpiexec (tests/hpc/test_pbs_site.py). Not PALS: no ALCF page read here says its mpiexec
passes SIGUSR1 on, and it ends every rank when one exits (no survivor after a crash);
`rescue: true` there is the user's call. Hydra ends every rank when one exits too, so what
is rescued behind mpiexec is a hang, not a crash."""

LINGER_LAUNCHERS = ("local", "srun")
"""Launchers that leave a failed rank's peers running until the supervisor stops the launch,
so that a rank whose collective failed lingers (`rescue_linger_s`) for a rescue request: the
local launcher, and srun as executors/launchers.py runs it (`--kill-on-bad-exit=0`; srun(1),
Slurm 22.05.8: "Controls whether or not to terminate a step if any task exits with a non-zero
exit code. [...] An option argument of zero will not terminate the job."). srun logs the failed
task at once ("srun: error: n2: task 1: Exited with exit code 1"), which the supervisor reads
(tests/hpc/test_slurm_faults.py). Elsewhere a rank does not linger (0 s)."""


def rescue_linger_s(launcher: str) -> float:
    """How long a rank whose peer failed waits for a rescue request behind `launcher`."""
    return 20.0 if launcher in LINGER_LAUNCHERS else 0.0


def rescue(trainer: TrainConfig, launcher: str) -> bool:
    """Whether an attempt's trainer is asked to answer rescue requests (campaign.train.rescue):
    the built-in trainer only; `auto` with the launchers of RESCUE_LAUNCHERS."""
    if trainer.command is not None or trainer.rescue is False:
        return False
    return trainer.rescue is True or launcher in RESCUE_LAUNCHERS


def rescue_covers(trainer: TrainConfig, site: Site, nodes: int) -> bool:
    """Whether a launch on `nodes` nodes of `site` can save a rescue checkpoint after a fault:
    its trainer answers rescue requests (`rescue`), and a rank on another node than the failed
    or suspect one holds the whole state (DDP on 2+ nodes; not FSDP, which shards it; not
    XPU, `trainer.device: auto` taken as the site's device: `campaign.train.rescue.supported`;
    the rescuer is never taken from a suspect node, `supervisor.rescue._rescuer`). Where it
    cannot, no history of rescued faults lengthens its checkpoint interval."""
    device = site.devices()[0] if trainer.device == "auto" else trainer.device
    return rescue(trainer, site.launcher) and nodes >= 2 and trainer.parallelism == "ddp" and device != "xpu"


def _expand(arg: str, values: dict[str, str]) -> str:
    return arg.format_map(values)


def spec_path(value: str, spec_dir: Path) -> Path:
    """A path the campaign file gives (data.path, a reference file): a relative one is relative
    to the file's folder, as its user reads it, not to where a trainer or the driver runs."""
    p = Path(value).expanduser()
    return p if p.is_absolute() else spec_dir / p


def _resolve(arg: str, spec_dir: Path) -> str:
    if "{" in arg or arg.startswith("-") or Path(arg).is_absolute() or not _SCRIPT.search(arg):
        return arg
    return str(spec_dir / arg)


TIMESTAMP_MIN = 10**9
"""A number of 10 or more digits in a checkpoint's name is a unix time (s or ms), not a step."""
STEPS_FILE = ".campaign-checkpoint-steps.json"
"""In the checkpoint directory: the step of each checkpoint whose name gives none, as the
trainer reported it when the checkpoint was saved ({name: {"mtime_ns", "step"}})."""


def list_checkpoints(layout: CheckpointLayout | None, checkpoint_dir: str | Path) -> list[dict[str, Any]]:
    """Checkpoints in `checkpoint_dir`, oldest first, as `report.list_checkpoints` gives them:
    {step, tokens, path, complete, time}; with `layout`, the trainer's own files or folders.
    The step comes from the name (`layout.step_pattern`) unless the name holds none or a unix
    time (`checkpoints/1733380000123/`): then from STEPS_FILE (what the trainer had reported
    when it saved, `note_checkpoint_steps`), else None, and such checkpoints sort by mtime."""
    if layout is None:
        return report.list_checkpoints(checkpoint_dir)
    root = Path(checkpoint_dir)
    pattern = re.compile(layout.step_pattern)
    noted = _noted_steps(root)
    out = []
    for path in root.glob(layout.glob) if root.is_dir() else []:
        st = path.stat()
        step = _step_in_name(pattern, path.name)
        if step is None:
            entry = noted.get(str(path.relative_to(root)))
            step = entry["step"] if entry and entry.get("mtime_ns") == st.st_mtime_ns else None
        out.append({"step": step, "tokens": None, "path": str(path), "complete": _complete(layout, path),
                    "time": st.st_mtime})
    if any(c["step"] is None for c in out):  # mtime order
        return sorted(out, key=lambda c: c["time"])
    return sorted(out, key=lambda c: (c["step"], c["time"]))


def _step_in_name(pattern: re.Pattern[str], name: str) -> int | None:
    m = pattern.search(name)
    if m is None or int(m["step"]) >= TIMESTAMP_MIN:
        return None
    return int(m["step"])


def _noted_steps(root: Path) -> dict[str, Any]:
    try:
        data = json.loads((root / STEPS_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def note_checkpoint_steps(layout: CheckpointLayout | None, checkpoint_dir: str | Path,
                          seen: list[tuple[int, float, float]], *, since: float = 0.0,
                          expected: Callable[[int], bool] | None = None) -> None:
    """Record in STEPS_FILE the step of every checkpoint of `layout` whose name gives none and
    which was written (mtime) since `since`, once `step_at_save` can tell it from the steps
    the attempt reported (`seen`: (step, earliest, latest) times it was printed). Called by
    the supervisor while it watches, so a single `ckpt.pt` rewritten in place keeps the step
    of its last save."""
    root = Path(checkpoint_dir)
    if layout is None or not root.is_dir():
        return
    pattern = re.compile(layout.step_pattern)
    noted = _noted_steps(root)
    changed = False
    for path in root.glob(layout.glob):
        name, mtime_ns = str(path.relative_to(root)), path.stat().st_mtime_ns
        if _step_in_name(pattern, path.name) is not None or mtime_ns / 1e9 < since:
            continue
        if (noted.get(name) or {}).get("mtime_ns") == mtime_ns:
            continue
        step = step_at_save(mtime_ns / 1e9, seen, expected)
        if step is not None:
            noted[name] = {"mtime_ns": mtime_ns, "step": step}
            changed = True
    if changed:
        report.write_json_atomic(root / STEPS_FILE, noted)


def step_at_save(mtime: float, seen: list[tuple[int, float, float]],
                 expected: Callable[[int], bool] | None = None) -> int | None:
    """The step a checkpoint saved at `mtime` holds, from the steps reported around it (each
    (step, earliest, latest): when its line can have been printed), for a trainer that prints
    a step's line before it saves that step (nanoGPT and most loops): at least every step
    printed before the save, at most the last one that can have been. Where lines read in the
    same poll as the save leave a range, the one step in it at which the trainer was asked to
    save (`expected`: {checkpoint_every} multiples, {checkpoint_at}); None while unknown (no
    poll since the save yet, or no single step fits)."""
    if not seen or max(latest for _, _, latest in seen) < mtime:
        return None
    lo = max((step for step, _, latest in seen if latest <= mtime), default=0)
    top = max((step for step, earliest, _ in seen if earliest < mtime), default=0)
    if top <= lo:
        return lo
    fits = [s for s in range(lo, top + 1) if expected is not None and expected(s)]
    return fits[0] if len(fits) == 1 else None


def expected_saves(every: int, at: tuple[int, ...] | list[int]) -> Callable[[int], bool]:
    """Whether the trainer was asked to save at a step: a multiple of `every`, or one of `at`."""
    return lambda step: step > 0 and ((every > 0 and step % every == 0) or step in at)


def checkpoint_since(layout: CheckpointLayout | None, checkpoint_dir: str | Path, step: int,
                     since: float) -> dict[str, Any] | None:
    """A complete checkpoint of `step` or later, or (its step unknown) written since `since`."""
    for c in reversed(list_checkpoints(layout, checkpoint_dir)):
        if c["complete"] and (c["step"] >= step if c["step"] is not None else c["time"] >= since):
            return c
    return None


def _complete(layout: CheckpointLayout, path: Path) -> bool:
    if layout.complete == "zip":
        return path.is_file() and zipfile.is_zipfile(path)
    if layout.complete == "marker":
        return (path / layout.marker).exists()
    return path.exists()


def newest_complete(layout: CheckpointLayout | None, checkpoint_dir: str | Path) -> dict[str, Any] | None:
    """The newest complete checkpoint, or None."""
    done = [c for c in list_checkpoints(layout, checkpoint_dir) if c["complete"]]
    return done[-1] if done else None


BUILT_IN_ONLY = ("parallelism", "micro_batch_size", "grad_accum", "lr", "min_lr_ratio", "warmup_steps", "schedule",
                 "schedule_steps", "weight_decay", "max_grad_norm", "precision", "compile",
                 "compile_scope", "compile_cache", "activation_checkpointing", "device", "backend", "deterministic", "seed", "keep_last", "log_every")
"""`trainer` fields only the built-in trainer reads (a command of your own gets them only in trainer.json)."""


def custom_trainer_warnings(spec: CampaignSpec) -> list[str]:
    """Fields a spec sets that its own trainer command will not see unless it reads trainer.json."""
    if spec.trainer.command is None:
        return []
    out = []
    per_step = any(st.kind in ("scaling", "long_run") for st in spec.stages)  # tokens per step from the spec
    for section in ("model", "data"):
        fields = set(getattr(spec, section).model_fields_set)
        if section == "model" and per_step:
            fields -= {"seq_len"}
        if fields:
            out.append(f"{section}: set, but trainer.command runs your own trainer, which gets it only in "
                       "trainer.json ({config}); the built-in trainer's section")
    own = set(BUILT_IN_ONLY) & spec.trainer.model_fields_set
    if per_step:  # tokens per step, when the lines give none
        own -= {"micro_batch_size", "grad_accum"}
    own = sorted(own)
    if own:
        out.append(f"trainer.{', trainer.'.join(own)}: built-in trainer field(s); your command gets them only in "
                   "trainer.json ({config})")
    for i, st in enumerate(spec.stages):
        if st.injected_faults():
            out.append(f"stages[{i}].faults: fault injection is the built-in trainer's; your trainer ignores it")
        if st.token_target() and spec.trainer.progress == "stdout":
            out.append(f"stages[{i}].tokens: a token target needs tokens in the progress lines; with progress: "
                       "stdout give `steps` unless step_pattern has a `tokens` group")
        out += [f"stages[{i}].{line}" for line in st.trainer_warnings(spec.trainer)]
    return out


def takes_batch(trainer: TrainConfig) -> bool:
    """Whether a stage's change of the per-rank batch (`micro_batch_size`, strong scaling)
    reaches what `trainer` trains: the built-in trainer reads it from trainer.json, and so may
    a trainer of your own that reports its own rows; a script read through its output
    (`progress: stdout`) trains the batch of its own arguments, the one the spec describes."""
    return trainer.command is None or trainer.progress != "stdout"
