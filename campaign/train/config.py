"""Configuration of the built-in trainer (`python -m campaign.train --config FILE`).

These models are shared by two readers: the campaign spec (its `model`, `data` and
`trainer` sections are these classes) and the trainer itself, which reads one JSON file
(`TrainerConfig`) written by the supervisor for each attempt. This module imports only
pydantic, so the CLI can validate a spec without importing torch.
"""

from __future__ import annotations

import re
import string
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from campaign.names import node_problem

PLACEHOLDERS = ("python", "config", "run_dir", "checkpoint_dir", "max_steps", "max_tokens", "resume",
                "checkpoint_every", "checkpoint_at", "attempt", "hostfile", "spec_dir")
"""What `trainer.command` may name in braces (docs/trainer-contract.md, "Command line")."""
RESUME_PLACEHOLDERS = ("resume_path", "resume_step")
"""What `trainer.resume_args` may name besides PLACEHOLDERS."""
DEFAULT_COMMAND = ("{python}", "-m", "campaign.train", "--config", "{config}")
"""The built-in trainer; `{python}` is the interpreter of the supervisor that starts it."""


def placeholders(arg: str) -> list[str]:
    """The `{name}` placeholders of one argument (`{{` and `}}` are literal braces)."""
    return [name for _, name, _, _ in string.Formatter().parse(arg) if name is not None]


def _check_template(field: str, args: list[str], known: tuple[str, ...]) -> None:
    for i, arg in enumerate(args):
        try:
            names = placeholders(arg)
        except ValueError as e:
            raise ValueError(f"trainer.{field}[{i}]: {e} in {arg!r} (write {{{{ and }}}} for literal braces)") from None
        for name in names:
            if name not in known:
                raise ValueError(f"trainer.{field}[{i}]: unknown placeholder {{{name}}} in {arg!r}; "
                                 f"known: {', '.join('{' + k + '}' for k in known)}")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, frozen=True)


class ModelConfig(_Strict):
    """A GPT-style decoder. `size` picks a named shape; the other fields override it."""

    size: Literal["tiny", "small", "gpt2-124m", "1b", "auroragpt-2b"] = "tiny"
    """Named shape: `tiny` trains in seconds on CPU; `auroragpt-2b` is the AuroraGPT 2B shape."""
    n_layer: int | None = Field(default=None, ge=1)
    """Number of transformer blocks (overrides the size's value)."""
    n_head: int | None = Field(default=None, ge=1)
    """Number of attention heads (overrides the size's value)."""
    d_model: int | None = Field(default=None, ge=8)
    """Width of the residual stream (overrides the size's value)."""
    vocab_size: int | None = Field(default=None, ge=2)
    """Vocabulary size (overrides the size's value; must cover the data's token ids). Unset with a
    token file from `campaign data prepare`: the file's vocabulary (its sidecar, FILE.json)."""
    seq_len: int | None = Field(default=None, ge=2)
    """Context length in tokens (overrides the size's value)."""
    activation: Literal["swiglu", "gelu"] = "swiglu"
    """MLP activation."""
    tie_embeddings: bool = True
    """Share the input embedding and the output projection."""


class DataConfig(_Strict):
    """Where the training tokens come from."""

    source: Literal["synthetic", "file"] = "synthetic"
    """`synthetic`: a seeded Markov chain with a known entropy floor; `file`: a token file."""
    path: str | None = None
    """Token file (flat uint16/uint32 memmap, the usual `.bin` layout, e.g. nanoGPT's train.bin) when
    source is `file`; `campaign data prepare` writes one with a sidecar (FILE.json) giving its dtype
    and vocabulary."""
    dtype: Literal["uint16", "uint32"] | None = None
    """Element type of the token file. Unset: the sidecar's (FILE.json), else uint16 (nanoGPT's)."""
    seed: int = 1234
    """Seed of the sampler (and of the synthetic chain)."""
    synthetic_vocab: int = Field(default=256, ge=2)
    """Vocabulary of the synthetic source."""
    synthetic_branching: int = Field(default=4, ge=1)
    """Each synthetic token is followed by one of this many successors (entropy floor ln(b))."""

    @model_validator(mode="after")
    def _path_for_file(self) -> DataConfig:
        if self.source == "file" and not self.path:
            raise ValueError("data.path is required when data.source is 'file'")
        return self


class CheckpointLayout(_Strict):
    """Where a trainer of your own writes its checkpoints, and when one is complete."""

    glob: str
    """Checkpoint files or folders, relative to the attempt's checkpoint directory (e.g. `ckpt_*.pt`)."""
    step_pattern: str = r"(?P<step>\d+)"
    """Regex on the name that gives the step (named group `step`; default: the first number)."""
    complete: Literal["exists", "zip", "marker"] = "zip"
    """`zip`: a `torch.save` file whose zip directory is intact (a save cut short is not);
    `exists`: any match; `marker`: a folder holding the file `marker`."""
    marker: str = ".complete"
    """The file that marks a checkpoint folder complete (with `complete: marker`)."""

    @field_validator("step_pattern")
    @classmethod
    def _has_step(cls, v: str) -> str:
        try:
            groups = re.compile(v).groupindex
        except re.error as e:
            raise ValueError(f"trainer.checkpoints.step_pattern: not a regular expression ({e})") from None
        if "step" not in groups:
            raise ValueError("trainer.checkpoints.step_pattern: needs a named group (?P<step>...)")
        return v


class TrainConfig(_Strict):
    """How to train: parallelism, batch, optimizer, precision, checkpoints."""

    command: list[str] | None = None
    """Your own trainer, as an argument template (e.g. [python, train.py, --steps, "{max_steps}"]);
    nothing is appended; relative `.py`/`.sh` and `./` paths are resolved against the campaign
    file's folder (docs/trainer-contract.md). Default: the built-in trainer."""
    progress: Literal["metrics", "stdout"] = "metrics"
    """`metrics`: the trainer writes metrics.jsonl (campaign.report); `stdout`: the supervisor
    reads rank 0's output with `step_pattern` and writes the rows for it (an unmodified script)."""
    step_pattern: str | None = None
    """With `progress: stdout`: a regex with named groups `step` and `loss` (optional `tokens`,
    cumulative, `tokens_per_s`, and `step_time` in seconds or `step_time_ms`), matched
    against each line of rank 0's output."""
    first_step: Literal[0, 1] = 1
    """The number your trainer prints for its first step: 1, or 0 for scripts that count from
    0 (nanoGPT, build-nanogpt print `iter 0` first). With 0, `{max_steps}` and
    CAMPAIGN_MAX_STEPS are the last step in the trainer's numbering (steps - 1), so it trains
    exactly the steps asked, and its printed step N is recorded as step N + 1."""
    checkpoints: CheckpointLayout | None = None
    """Your trainer's own checkpoint layout (default: `step-NNNNNNNN/` folders with `.complete`)."""
    resume_args: list[str] = []
    """Arguments appended when an attempt resumes from a complete checkpoint, e.g. [--resume,
    "{resume_path}"]; `{resume_step}` is its step."""
    parallelism: Literal["ddp", "fsdp"] = "ddp"
    """Data parallelism: DDP, or FSDP2 (`fully_shard`)."""
    micro_batch_size: int = Field(default=4, ge=1)
    """Sequences per rank per micro-step."""
    grad_accum: int = Field(default=1, ge=1)
    """Micro-steps per optimizer step."""
    lr: float = Field(default=3e-3, gt=0)
    """Peak learning rate."""
    min_lr_ratio: float = Field(default=0.1, ge=0, le=1)
    """Final learning rate as a fraction of the peak."""
    warmup_steps: int = Field(default=10, ge=0)
    """Linear warm-up steps."""
    schedule: Literal["cosine", "linear", "constant"] = "cosine"
    """Decay after warm-up, down to min_lr_ratio x lr at the schedule's horizon."""
    schedule_steps: int = Field(default=1000, ge=1)
    """Horizon of the LR schedule in steps (keep it fixed across stages for comparable losses)."""
    weight_decay: float = Field(default=0.1, ge=0)
    """AdamW weight decay."""
    max_grad_norm: float | None = Field(default=1.0, gt=0)
    """Gradient clipping norm (null: no clipping)."""
    precision: Literal["auto", "fp32", "bf16", "float8"] = "auto"
    """`auto`: bf16 autocast on accelerators, fp32 on CPU. `float8`: torchao's float8 training
    (rowwise scaling) of the linear layers, bf16 elsewhere; NVIDIA compute capability 8.9 or newer
    and the `float8` extra (torchao), else the trainer refuses with exit 93
    (campaign.train.float8)."""
    compile: bool = False
    """Wrap the model in torch.compile."""
    compile_scope: Literal["auto", "model", "blocks"] = "auto"
    """With `compile`, what one compiled graph covers. `model`: the whole model (one graph,
    fused across blocks; the longest compile); one rank only: with several ranks the blocks
    are compiled apart whatever this says. `blocks`: each transformer block and the
    output (norm, head, loss) on their own: the blocks share one compiled graph (Dynamo
    traces and Inductor compiles one block, not n_layer), so a start compiles and loads
    far less, at some cost per step on one rank for small models. `auto`: `blocks` with
    several ranks (DDP's bucket overlap and FSDP2's per-block sharding need the blocks apart),
    and on one rank from 1e9 parameters (as fast per step there; `model` below it:
    campaign.train.parallelize.BLOCKS_FROM_PARAMS, with the measurements)."""
    compile_cache: bool = True
    """With `compile`: keep torch.compile's caches (Inductor's FX graphs, AOTAutograd, Triton
    kernels) in the campaign's folder on the shared filesystem (`<campaign>/compile-cache`, one
    subfolder per rank), so a relaunch loads what the first launch compiled instead of compiling
    again (campaign.train.compile_cache). false: every start compiles from nothing."""
    activation_checkpointing: bool = False
    """Recompute block activations in the backward pass to save memory."""
    device: Literal["auto", "cpu", "cuda", "xpu"] = "auto"
    """Device type; `auto` picks cuda, then xpu, then cpu."""
    backend: Literal["auto", "gloo", "nccl", "xccl", "ccl"] = "auto"
    """torch.distributed backend; `auto` follows the device."""
    deterministic: bool | Literal["auto"] = "auto"
    """Deterministic kernels, so resumed runs can be compared bit for bit (slower on GPUs).
    `auto`: the stage decides: true for `resume_test`, false for the others (nothing else
    compares losses bit for bit); a trainer run by hand takes true."""
    seed: int = 0
    """Seed of model initialisation and dropout."""
    checkpoint_every: int = Field(default=0, ge=0)
    """Save a checkpoint every this many steps (0: only where a stage asks for one)."""
    checkpoint_async: bool | Literal["auto"] = "auto"
    """Write checkpoints in the background (DCP async_save, pinned-memory staging on CUDA):
    training stops only for the copy into CPU memory. `auto`: on CUDA, not elsewhere."""
    overlap_steps: bool | Literal["auto"] = "auto"
    """Queue the next step's forward and backward before reading this step's loss, so the
    device never waits for the host between steps (the loop still reads every step's loss
    and flags before the next update). `auto`: on CUDA, unless faults are configured (their
    step boundaries are the host's, which overlap blurs); `true` anywhere (on CPU the order
    of the host's work changes, nothing else)."""
    keep_last: int = Field(default=3, ge=1)
    """Complete checkpoints to keep."""
    log_every: int = Field(default=1, ge=1)
    """Write a metrics line every this many steps."""
    warm_start: bool | Literal["auto"] = "auto"
    """Start ranks from a fork server per node that keeps Python, torch and the trainer
    imported (`campaign.executors.warm`): a relaunch then skips the interpreter start and the
    import of torch (1.4 s of a 2.4 s relaunch on a small machine; far more from a shared
    filesystem at scale). `auto`: the built-in trainer with the `local` launcher (where it is
    tested end to end); true: also PALS, srun and torchrun, and your own command if it starts
    with `{python}`. Refused with MPICH's Hydra (`launcher: mpich`), and a rank whose launcher
    passes PMI by descriptor (`PMI_FD`: `srun --mpi=pmi2`) starts cold: a forked child cannot
    use the descriptor."""
    rescue: bool | Literal["auto"] = "auto"
    """After a crash or a hang, one surviving replica saves the last finished step before the
    launch is stopped, so the relaunch recomputes nothing (`campaign.train.rescue`; the
    built-in trainer under DDP, on the CPU or CUDA, in stages that resume). `auto`: with the
    launchers that deliver SIGUSR1 to every rank (`local`, `srun`, MPICH's `mpich`:
    `contract.RESCUE_LAUNCHERS`); true: PALS too, where that is not checked."""

    @model_validator(mode="after")
    def _own_trainer(self) -> TrainConfig:
        _check_template("command", self.command or [], PLACEHOLDERS)
        _check_template("resume_args", self.resume_args, PLACEHOLDERS + RESUME_PLACEHOLDERS)
        if self.progress == "stdout":
            if not self.step_pattern:
                raise ValueError("trainer.step_pattern is required with progress: stdout")
            try:
                groups = re.compile(self.step_pattern).groupindex
            except re.error as e:
                raise ValueError(f"trainer.step_pattern: not a regular expression ({e})") from None
            lacking = [g for g in ("step", "loss") if g not in groups]
            if lacking:
                raise ValueError(f"trainer.step_pattern: needs the named group(s) {', '.join(lacking)} "
                                 "(e.g. (?P<step>\\d+))")
        elif self.step_pattern:
            raise ValueError("trainer.step_pattern: only read with progress: stdout")
        if self.warm_start is True and self.command and self.command[0] != "{python}":
            raise ValueError(f"trainer.warm_start: the command must start with {{python}} (the interpreter the "
                             f"fork server keeps warm), not {self.command[0]!r}")
        if self.rescue is True and self.command is not None:
            raise ValueError("trainer.rescue: only the built-in trainer saves a rescue checkpoint; set it to "
                             "false or auto for a command of your own")
        if self.command is None and (self.progress != "metrics" or self.checkpoints or self.resume_args
                                     or self.first_step != 1):
            raise ValueError("trainer.command: progress, first_step, checkpoints and resume_args describe a trainer of your "
                             "own; name its command")
        return self


class Fault(_Strict):
    """A deliberate fault, for tests and drills only (needs CAMPAIGN_ALLOW_FAULTS=1)."""

    kind: Literal[
        "hang", "hang_in_collective", "crash", "slow", "sigkill", "data_off_by_one", "nonfinite",
        "sigkill_in_checkpoint", "sigkill_in_rescue",
    ]
    """What goes wrong (`nonfinite`: the rank's loss becomes NaN at `step`, test-only)."""
    step: int = Field(ge=1)
    """At which step."""
    rank: int | None = Field(default=None, ge=0)
    """Which global rank (or use `node`)."""
    node: str | None = None
    """All ranks of this node."""

    @field_validator("node")
    @classmethod
    def _one_node(cls, v: str | None) -> str | None:
        why = None if v is None else node_problem(v)
        if why is not None:
            raise ValueError(f"{v!r} {why}")
        return v
    factor: float = Field(default=5.0, gt=1)
    """Slow-down factor for `slow`."""
    delay_s: float | None = Field(default=None, gt=0)
    """For `slow`: sleep this many seconds per step instead (a run time that does not
    depend on the machine's speed)."""
    exit_code: int = Field(default=1, ge=1, le=255)
    """Exit code for `crash`."""
    attempt: int | None = Field(default=None, ge=1)
    """Only in this attempt number of the stage (null: every attempt)."""


class RunConfig(_Strict):
    """What one attempt must do; written by the supervisor, not by users."""

    max_steps: int = Field(ge=1)
    """Stop after this optimizer step."""
    max_tokens: int | None = Field(default=None, ge=1)
    """Stop once this many tokens (cumulative, all ranks) have been trained on."""
    checkpoint_dir: str
    """Where `step-NNNNNNNN/` checkpoints live (shared across a stage's attempts)."""
    checkpoint_at: list[int] = []
    """Extra steps at which to save a checkpoint."""
    checkpoint_final: bool = True
    """Save a checkpoint after the last step (false in stages that never resume from it)."""
    resume: bool = True
    """Resume from the newest complete checkpoint in checkpoint_dir, if any."""
    deadline_unix: float | None = None
    """Wall-clock deadline (scheduler walltime); checkpoint and exit 143 before it."""
    attempt: int = 1
    """Attempt number within the stage (faults may target one)."""
    rescue: bool = False
    """Answer the supervisor's rescue request (SIGUSR1) after a fault: one surviving replica
    saves the last finished step (campaign.train.rescue; DDP, on the CPU or CUDA)."""
    compile_cache_dir: str | None = None
    """Where this attempt's ranks keep torch.compile's caches (rank-R subfolders); None: none
    kept (a fresh private folder per process). Set from trainer.compile_cache."""
    rescue_linger_s: float = Field(default=20.0, ge=0)
    """How long a rank whose collective failed (a peer died) waits for the rescue request
    before it fails; 0 behind a launcher that ends every rank when one fails (PALS, Hydra):
    contract.rescue_linger_s."""


class TrainerConfig(_Strict):
    """The single file the trainer reads: `python -m campaign.train --config FILE`."""

    model: ModelConfig = ModelConfig()
    data: DataConfig = DataConfig()
    train: TrainConfig = TrainConfig()
    run: RunConfig
    faults: list[Fault] = []
