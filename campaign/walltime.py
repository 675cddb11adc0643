"""Does the block's walltime fit the stages? Warnings for the user before submitting.

    for line in warnings(spec):       # [] when everything fits
        print("warning:", line, file=sys.stderr)

A stage's expected duration comes from the spec: a long run with a token target and a
throughput hint (`site.expected_tokens_per_s`, or a measured rate the caller passes)
needs tokens / rate; any other stage is bounded by `timeout_s` per attempt (times its
attempts: one per node count of a scaling run, 1 + 2 per signal of a resume test).
Only batch sites have a block walltime; the local site has none to check.
"""

from __future__ import annotations

from dataclasses import dataclass

from campaign.executors.batch import BatchSite
from campaign.spec import CampaignSpec
from campaign.stagebase import StageSpec


@dataclass(frozen=True)
class Estimate:
    """How long a stage should take: per attempt and in all, and where the number comes from."""

    attempt_s: float
    total_s: float
    source: str


def estimate(stage: StageSpec, tokens_per_s: float | None) -> Estimate:
    """The expected duration of `stage` (an upper bound where only `timeout_s` is known)."""
    tokens = stage.token_target()
    if stage.continues_across_blocks() and tokens and tokens_per_s:
        need = tokens / tokens_per_s
        return Estimate(need, need, f"{tokens:,} tokens at {tokens_per_s:,.0f} tokens/s")
    attempts = stage.attempts_bound()
    return Estimate(stage.timeout_s, stage.timeout_s * attempts, f"timeout_s x {attempts} attempt(s)")


def warnings(spec: CampaignSpec, tokens_per_s: float | None = None) -> list[str]:
    """What cannot finish within the block's walltime (nothing for sites without one), and
    what the site's queue table cannot vouch for (`site.queue_warnings()`)."""
    site = spec.site
    if not isinstance(site, BatchSite):  # the local site's simulated walltime is per attempt
        return []
    wall = float(site.walltime_s)
    rate = tokens_per_s or site.expected_tokens_per_s
    out: list[str] = [f"site.queue: {w}" for w in site.queue_warnings()]
    total = 0.0
    for stage in spec.stages:
        if stage.continues_across_blocks() and not (stage.token_target() and rate):
            out.append(f"stage {stage.resolved_name}: no throughput known to check its target against the block walltime; "
                       "set site.expected_tokens_per_s (the long run continues across blocks either way)")
            continue
        est = estimate(stage, rate)
        total += est.total_s
        if stage.continues_across_blocks() and est.attempt_s > wall:
            blocks = int(-(-est.attempt_s // wall))
            out.append(f"stage {stage.resolved_name} needs ~{_h(est.attempt_s)} ({est.source}) but a block lasts "
                       f"{site.walltime}: it will checkpoint at each block's end and continue in a new one "
                       f"(~{blocks} blocks, each with its queue wait)")
        elif not stage.continues_across_blocks() and est.attempt_s > wall:
            out.append(f"stage {stage.resolved_name}: timeout_s {stage.timeout_s:g} s is longer than the block walltime "
                       f"{site.walltime}: an attempt still running then is killed (exit 143); lower timeout_s or "
                       "raise site.walltime")
    if total > wall:
        out.append(f"the stages need up to ~{_h(total)} in all, the block walltime is {site.walltime}: the later "
                   "stages will wait for a new block")
    return out


def _h(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"
