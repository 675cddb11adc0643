"""The keys of what a trainer writes, each named once (stdlib only, imports nothing):

    metrics.jsonl   {"step", "tokens", "loss", "step_time_s"[, "tokens_per_s", "mfu", "mfu_float8", ...], "time"}
    events.jsonl    {"event", "step", "time"[, "seconds", ...]}
    heartbeats/     {"node", "time", "ranks": {"<rank>": {"step", "phase", "since", "time"[, "compute_s"]}}}

The writer (`campaign.report`), the driver's readers (`campaign.runfiles`) and the ledger's
step columns take them from here. They are the trainer contract's keys (docs/trainer-contract.md):
the stored strings never change.
"""

from __future__ import annotations

from typing import Final

# --- in every file -------------------------------------------------------------------
STEP: Final = "step"
"""The optimizer step (metrics rows, events, a rank's heartbeat state)."""
TIME: Final = "time"
"""Wall-clock seconds since the epoch when the line or document was written."""

# --- metrics.jsonl: one row per logged optimizer step ------------------------------------
TOKENS: Final = "tokens"
"""Cumulative tokens trained on (an integer)."""
LOSS: Final = "loss"
STEP_TIME_S: Final = "step_time_s"
TOKENS_PER_S: Final = "tokens_per_s"
MFU: Final = "mfu"
"""Model FLOPs utilisation (nanoGPT's estimate) against the device's dense bf16 peak."""
MFU_FLOAT8: Final = "mfu_float8"
"""`precision: float8` runs only: the same against the device's float8 dense peak."""
COMM_TIME_S: Final = "comm_time_s"
MEM_PEAK_GIB: Final = "mem_peak_gib"
LR: Final = "lr"
GRAD_NORM: Final = "grad_norm"

METRIC_FIELDS: Final = (LOSS, STEP_TIME_S, TOKENS_PER_S, MFU, COMM_TIME_S, MEM_PEAK_GIB, LR, GRAD_NORM, TIME,
                        MFU_FLOAT8)
"""A row's numbers the ledger keeps as floats (its step_metric columns, in the model's column
order), beside `step` and `tokens`. `mfu_float8` (migration 0005) comes last, where a migrated
ledger stores it and where `ledger export`'s CSV gained it (earlier columns keep their places)."""

# --- events.jsonl --------------------------------------------------------------------
EVENT: Final = "event"
"""The event's name (`campaign.report.EVENTS`)."""
SECONDS: Final = "seconds"
"""How long the event took (a checkpoint's save)."""

# --- heartbeats: a node's document and each rank's state in it -------------------------
NODE: Final = "node"
"""The node's name as the hostfile spells it."""
RANKS: Final = "ranks"
"""{rank (a string): that rank's state} in a node's document."""
PHASE: Final = "phase"
"""What the rank does now (`campaign.report.PHASES`)."""
SINCE: Final = "since"
"""When the rank entered its phase at its step."""
COMPUTE_S: Final = "compute_s"
"""The rank's compute time per step before the gradient collective (EMA)."""
