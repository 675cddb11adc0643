"""The spec's `observe:` and `notify:` sections (pydantic models; the model layer).

    observe:
      tensorboard: tb            # event files for `tensorboard --logdir tb` (relative: to this file's folder)
      wandb: {project: my-project, mode: offline}
    notify:
      command: "mail -s campaign me@example.org"      # the event as JSON on stdin
      webhook: env:SLACK_WEBHOOK_URL                  # Slack-compatible {"text": ...}; env:VAR reads it at start
      events: [stage_failed, relaunch, node_excluded, campaign_end, driver_gave_up]

What reads them is `campaign.observe` (the driver's observers); these models only say what
a spec may ask for, so `campaign.spec` (a lower layer) can hold them.
"""

from __future__ import annotations

import re

from typing import Literal

from pydantic import Field, field_validator, model_validator

from campaign.stagebase import StrictModel

NOTIFY_EVENTS = ("stage_passed", "stage_failed", "relaunch", "node_excluded", "campaign_end", "driver_gave_up")
"""What `notify.events` may name: a stage passed or failed, a long run relaunched, a node excluded,
the campaign ended (succeeded, failed or cancelled), the driver stopped without finishing
(the ledger unreachable past its budget, the work directory unwritable, its lease taken, a bug)."""

NotifyEvent = Literal["stage_passed", "stage_failed", "relaunch", "node_excluded", "campaign_end", "driver_gave_up"]


class WandbConfig(StrictModel):
    """One W&B run per stage, logged by the driver (never the ranks)."""

    project: str = Field(min_length=1)
    """W&B project the runs go to."""
    entity: str | None = None
    """W&B entity (user or team); default: your W&B default."""
    mode: Literal["offline", "online"] | None = None
    """`offline` writes the runs to disk for `wandb sync` (the command is printed at the end);
    default: offline on sites whose compute nodes have no internet (aurora, polaris), online elsewhere."""
    dir: str | None = None
    """Folder W&B writes its `wandb/` run folders in (relative: to this file's folder);
    default: the campaign's run directory."""


class ObserveConfig(StrictModel):
    """Where the driver sends each step and event besides the ledger, as it ingests them."""

    tensorboard: str | None = None
    """Folder of TensorBoard event files (`tensorboard --logdir FOLDER`), one run per stage and
    attempt (CAMPAIGN/STAGE/attempt-N) and the events as text (CAMPAIGN/STAGE/events);
    relative: to this file's folder. `campaign submit|resume --tensorboard DIR` sets it too."""
    wandb: WandbConfig | None = None
    """W&B: one run per stage; relaunches, exclusions and failures as alerts."""


class NotifyConfig(StrictModel):
    """Tell a person when something happens: a command and/or a webhook, from a background
    thread that retries with back-off and never blocks or fails the campaign."""

    command: str | None = None
    """Shell command run for each event with the event as JSON on stdin (e.g. `mail -s campaign you@x`)."""
    webhook: str | None = None
    """URL that gets a POST of Slack-compatible JSON (`{"text": ...}`); `env:VAR` reads the URL
    from the driver's environment at its start (keeps a secret URL out of the ledger)."""
    events: list[NotifyEvent] = list(NOTIFY_EVENTS)  # type: ignore[assignment]
    """Which events notify (default: all of stage_passed, stage_failed, relaunch,
    node_excluded, campaign_end, driver_gave_up)."""
    retries: int = Field(default=5, ge=0, le=20)
    """Tries after the first for one delivery that fails (an HTTP error, a non-zero exit)."""
    backoff_s: float = Field(default=1.0, ge=0, le=300)
    """Wait before the first retry; it doubles with each retry (at most 60 s)."""
    timeout_s: float = Field(default=10.0, gt=0, le=300)
    """Limit of one try (the HTTP request, the command)."""
    wait_s: float = Field(default=15.0, ge=0, le=600)
    """At the driver's end, how long it waits for notifications still being delivered."""

    @field_validator("webhook")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"https?://\S+|env:[A-Za-z_][A-Za-z0-9_]*", v):
            raise ValueError(f"must be an http(s):// URL or env:VARIABLE, got {v!r}")
        return v

    @model_validator(mode="after")
    def _somewhere(self) -> NotifyConfig:
        if not self.command and not self.webhook:
            raise ValueError("give a `command`, a `webhook`, or both")
        return self
