"""The `scaling` stage: the same steps at each node count, then weak-scaling efficiency.

Per node count it records the median step time (warm-up steps excluded), tokens/s,
collective time and its share of the step, peak memory and the mean loss of the last
`loss_window` steps (one step's loss is noise; loss_check judges a window too).
Efficiency is the per-node throughput at each count over that at the smallest count
(weak scaling: the per-rank batch is fixed), or the speed-up over that count divided by the
node ratio (strong scaling: the global batch is fixed). Passes when every count's efficiency is at
least `min_efficiency` and its window's mean loss is within `loss_tolerance` of the
reference's mean over the same steps (by default the smallest count's run).

Tokens/s is the trainer's own (`tokens_per_s` in its metrics rows) or, for a trainer read
through its output (`trainer.progress: stdout`), derived from step times alone: tokens per
step from the cumulative `tokens` of its rows (a `tokens` group of `step_pattern`) or from
the spec (`model.seq_len` x `trainer.micro_batch_size` x `trainer.grad_accum` x ranks, set to
your trainer's values). With neither, `campaign validate` refuses the stage (`tokens_source`).
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from campaign.reference import Reference
from campaign.stagebase import Context, StageSpec, Targets, Verdict, after_retry, at_step


EPS = 1e-9


class ScalingStage(StageSpec):
    """The same number of steps at each node count; efficiency and loss must hold up."""

    kind: Literal["scaling"] = "scaling"
    """Stage kind."""
    node_counts: list[int] = Field(default=[1, 2], min_length=1)
    """Node counts to measure, e.g. [1, 2, 4, 8] (ascending, no repeats)."""
    batch: Literal["weak", "strong"] = "weak"
    """`weak`: the per-rank batch stays fixed (the global batch grows with the nodes);
    `strong`: the global batch of the smallest count stays fixed (per-rank batch shrinks),
    so every count follows the same loss curve. The per-rank batch reaches the built-in
    trainer (and yours, through trainer.json); a script read through its output
    (`progress: stdout`) keeps its own, and is counted at it (`campaign validate` says so)."""
    steps: int = Field(default=20, ge=2)
    """Steps at each node count."""
    warmup_steps: int = Field(default=5, ge=0)
    """Leading steps left out of the medians (compilation, allocator warm-up)."""
    min_efficiency: float = Field(default=0.7, ge=0, le=1.5)
    """Lowest acceptable weak-scaling efficiency at any count."""
    loss_tolerance: float = Field(default=0.10, ge=0)
    """Largest allowed |window loss - reference loss| at any count."""
    loss_window: int = Field(default=5, ge=1)
    """The loss compared is the mean over the last this-many steps (e.g. steps 16-20 of 20; at most `steps`)."""
    reference: Reference | None = None
    """Reference losses (default: the smallest count's own run)."""

    @field_validator("node_counts")
    @classmethod
    def _ascending(cls, v: list[int]) -> list[int]:
        if any(n < 1 for n in v):
            raise ValueError("every node count must be >= 1")
        if v != sorted(set(v)):
            raise ValueError(f"node counts must be ascending without repeats, got {v}")
        return v

    @model_validator(mode="after")
    def _warmup_fits(self) -> ScalingStage:
        if self.warmup_steps >= self.steps:
            raise ValueError(f"warmup_steps ({self.warmup_steps}) must be less than steps ({self.steps})")
        if self.nodes is not None:
            raise ValueError("scaling uses node_counts, not nodes")
        return self

    def check_batch(self, micro_batch_size: int) -> None:
        """Strong scaling needs a global batch that every node count divides."""
        if self.batch == "strong":
            for n in self.node_counts:
                strong_micro_batch(micro_batch_size, self.node_counts[0], n)

    def check_in(self, spec: Any) -> None:
        try:
            self.check_batch(spec.trainer.micro_batch_size)
        except ValueError as e:
            raise ValueError(f"batch: {e}") from None
        if self.node_counts[-1] > spec.site.nodes:
            raise ValueError(f"node_counts: {self.node_counts[-1]} nodes asked, but the site has {spec.site.nodes}")
        if tokens_source(spec.trainer) is None:
            raise ValueError(": a scaling stage cannot measure tokens/s: trainer.progress is stdout and "
                             "trainer.step_pattern has no `tokens` group; add (?P<tokens>...) for the cumulative "
                             "tokens your trainer prints, or set trainer.micro_batch_size (with model.seq_len and "
                             "trainer.grad_accum) to your trainer's batch, so tokens/s is derived from step times")

    def attempt_nodes(self, site_nodes: int) -> list[int]:
        return list(self.node_counts)

    def reference_check_steps(self) -> list[int] | None:
        return window_steps(self) if self.reference else None

    def trainer_warnings(self, trainer: Any) -> list[str]:
        from campaign.contract import takes_batch

        if self.batch == "strong" and not takes_batch(trainer):
            return ["batch: strong shrinks the built-in trainer's per-rank batch; your trainer (progress: stdout) keeps "
                    "the one its own arguments give it, so each node count trains and is counted at "
                    "trainer.micro_batch_size per rank (weak scaling)"]
        return []

    def attempts_bound(self) -> int:
        return len(self.node_counts)


def tokens_source(trainer: Any) -> str | None:
    """Where tokens/s comes from for `trainer` (a TrainConfig): `metrics` (the trainer writes
    it), `tokens` (cumulative tokens in its progress lines), `spec` (the spec's batch), or
    None: nothing gives it, and the stage cannot judge efficiency."""
    if trainer.progress != "stdout":
        return "metrics"
    import re

    groups = re.compile(trainer.step_pattern or "").groupindex
    if "tokens_per_s" in groups:
        return "metrics"
    if "tokens" in groups:
        return "tokens"
    return "spec" if "micro_batch_size" in trainer.model_fields_set else None


def spec_tokens_per_step(spec: Any, nodes: int) -> int:
    """Tokens one optimizer step trains at `nodes` nodes, from the spec's batch (all ranks)."""
    from campaign import contract

    return contract.batch_tokens(spec.model, spec.trainer, nodes * spec.site.ranks_per_node)


def run(ctx: Context, stage: ScalingStage) -> Verdict:
    rows, retried = [], None
    from_spec = tokens_source(ctx.spec.trainer) == "spec"
    for n in stage.node_counts:
        outcome, first = ctx.launch_confirmed(first_targets(stage, ctx.spec, n), nodes=n, timeout_s=stage.timeout_s,
                                          label=f"{n} node(s)")
        retried = first or retried
        per_step = spec_tokens_per_step(ctx.spec, n) if from_spec else None
        row = measure(outcome.metrics, nodes=n, warmup=stage.warmup_steps, window=window_steps(stage),
                      tokens_per_step=per_step)
        row.update(ranks=outcome.world_size, exit_code=outcome.exit_code, exit_class=outcome.exit_class,
                   attempt=outcome.number)
        rows.append(row)
        if outcome.exit_code != 0:
            break
    reference = ctx.reference_losses(stage.reference) if stage.reference else None
    verdict = after_retry(judge(rows, stage, reference), retried)
    ctx.show_table("scaling table", rows, ["nodes", "ranks", "step_time_s", "tokens_per_s", "comm_time_s", "comm_share",
                                     "mem_peak_gib", "loss", "efficiency"])
    return verdict


def first_targets(stage: ScalingStage, spec: Any, nodes: int) -> Targets:
    """What the attempt at `nodes` nodes must do; `--dry-run` shows the same."""
    from campaign.contract import takes_batch

    train: dict[str, Any] = {"checkpoint_every": 0}
    if stage.batch == "strong" and takes_batch(spec.trainer):
        # Not for a script read through its output: it trains its own batch, and its rows are
        # counted at the batch the spec gives for it (contract.stdout_tokens_per_step).
        train["micro_batch_size"] = strong_micro_batch(spec.trainer.micro_batch_size, stage.node_counts[0], nodes)
    return Targets(steps=stage.steps, checkpoints=f"checkpoints-{nodes}n", train=train, checkpoint_final=False)


def strong_micro_batch(base: int, base_nodes: int, nodes: int) -> int:
    """Per-rank batch at `nodes` that keeps the global batch of `base_nodes` (must divide)."""
    total = base * base_nodes
    if total % nodes:
        raise ValueError(f"strong scaling: the global batch {total} does not split evenly over {nodes} nodes")
    return total // nodes


def window_steps(stage: ScalingStage) -> list[int]:
    """The steps whose mean loss is compared: the last `loss_window` of the run (all, if fewer)."""
    return list(range(max(1, stage.steps - stage.loss_window + 1), stage.steps + 1))


def measure(metrics: list[dict[str, Any]], *, nodes: int, warmup: int, window: list[int] | None = None,
            tokens_per_step: float | None = None) -> dict[str, Any]:
    """One row of the scaling table from one attempt's step metrics; `loss` is the mean over
    the `window` steps (None if one is missing). Without `tokens_per_s` in the rows, tokens/s
    is tokens per step (from the rows' cumulative tokens, else `tokens_per_step`) over the
    median step time."""
    steady = [m for m in metrics if m["step"] > warmup] or metrics
    row: dict[str, Any] = {"nodes": nodes, "steps": len(metrics)}
    for key in ("step_time_s", "tokens_per_s", "comm_time_s"):
        vals = [m[key] for m in steady if m.get(key) is not None]
        row[key] = statistics.median(vals) if vals else None
    if row["tokens_per_s"] is None and row["step_time_s"]:
        per_step = _tokens_per_step(steady) or tokens_per_step
        row["tokens_per_s"] = per_step / row["step_time_s"] if per_step else None
    mems = [m["mem_peak_gib"] for m in metrics if m.get("mem_peak_gib") is not None]
    row["mem_peak_gib"] = max(mems) if mems else None
    row["comm_share"] = (row["comm_time_s"] / row["step_time_s"]
                         if row["comm_time_s"] is not None and row["step_time_s"] else None)
    row["last_loss"] = metrics[-1]["loss"] if metrics else None
    losses = {m["step"]: m["loss"] for m in metrics}
    window = window or ([metrics[-1]["step"]] if metrics else [])
    row["loss"] = _mean([losses.get(s) for s in window])
    row["last_step"] = metrics[-1]["step"] if metrics else None
    return row


def judge(rows: list[dict[str, Any]], stage: ScalingStage, reference: dict[int, float] | None) -> Verdict:
    """Pure verdict over the per-count rows (efficiency is filled in here)."""
    numbers: dict[str, Any] = {"table": rows, "min_efficiency": stage.min_efficiency}
    done = {r["nodes"] for r in rows if r.get("exit_code") == 0 and r.get("last_step") == stage.steps}
    missing = [n for n in stage.node_counts if n not in done]
    _efficiency(rows)
    if missing:
        bad = next((r for r in rows if r["nodes"] == missing[0]), None)
        why = f"exited {bad['exit_code']} ({bad['exit_class']}) {at_step(bad['last_step'])}" if bad else "did not run"
        return Verdict(False, f"{missing[0]} node(s): {why}", numbers)
    base = rows[0]
    window = window_steps(stage)
    span = f"steps {window[0]}-{window[-1]}" if len(window) > 1 else f"step {window[0]}"
    numbers["loss_steps"] = [window[0], window[-1]]
    ref_loss = _mean([reference.get(s) for s in window]) if reference is not None else base["loss"]
    if ref_loss is None:
        return Verdict(False, f"the reference has no loss for every one of {span}", numbers)
    problems = []
    for r in rows:
        if r["efficiency"] is None:
            problems.append(f"{r['nodes']} node(s): no tokens/s reported"
                            + ("" if r.get("step_time_s") else " and no step time to derive it from"))
        elif r["efficiency"] + EPS < stage.min_efficiency:
            problems.append(f"{r['nodes']} node(s): efficiency {r['efficiency']:.2f} below {stage.min_efficiency:g}")
        loss = r["loss"]
        if loss is None or not math.isfinite(loss) or abs(loss - ref_loss) > stage.loss_tolerance + EPS:
            problems.append(f"{r['nodes']} node(s): mean loss over {span} {_fmt(loss)} vs reference {ref_loss:.4f} "
                            f"outside ±{stage.loss_tolerance:g}")
    if problems:
        return Verdict(False, "; ".join(problems), numbers)
    top = rows[-1]
    return Verdict(True, f"{len(rows)} node counts; efficiency at {top['nodes']} node(s) {top['efficiency']:.2f}; "
                         f"tokens/s {base['tokens_per_s']:,.0f} -> {top['tokens_per_s']:,.0f}; mean loss over {span} "
                         f"within ±{stage.loss_tolerance:g} of {ref_loss:.4f}", numbers)


def _tokens_per_step(rows: list[dict[str, Any]]) -> float | None:
    """Median tokens per step between consecutive rows' cumulative tokens (None: no tokens)."""
    deltas = [(b["tokens"] - a["tokens"]) / (b["step"] - a["step"]) for a, b in zip(rows, rows[1:])
              if a.get("tokens") and b.get("tokens") and b["step"] > a["step"]]
    return statistics.median(deltas) if deltas else None


def _mean(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known and len(known) == len(values) else None


def _fmt(loss: float | None) -> str:
    return "missing" if loss is None else f"{loss:.4f}"


def _efficiency(rows: list[dict[str, Any]]) -> None:
    """Per-node throughput relative to the smallest count; the same formula serves weak and
    strong scaling (tokens/s per node, whatever the batch)."""
    base = rows[0] if rows else None
    for r in rows:
        ok = base and base.get("tokens_per_s") and r.get("tokens_per_s")
        r["efficiency"] = (r["tokens_per_s"] / r["nodes"]) / (base["tokens_per_s"] / base["nodes"]) if ok else None
