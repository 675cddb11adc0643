"""Where a campaign's steps and events go besides the ledger: TensorBoard, W&B, notifications.

    observer = observe.for_campaign(spec, campaign_dir, spec_dir, warn=print)   # Observer() if none is set
    observer.steps("long", 2, rows)     # each batch of step rows the driver ingested (metrics.jsonl)
    observer.events(records)            # each unit of work's events, once committed (the ledger's listener)
    observer.close()                    # the driver's end: lines to print (the `wandb sync` command)

Every transition goes through one door, `ledger.writes.add_event`; the ledger hands the
committed events to its listeners (`Ledger.listeners`), and the engine makes its observer
one of them. The step rows come from the driver's ingestion (`StageContext._ingest`). So the
engine never asks which sinks are on: with none, the observer is the null `Observer()`.

A sink (observe/tensorboard.py, observe/wandb.py, observe/notify.py) imports its package (an
extra: `campaign[tensorboard]`, `campaign[wandb]`; notifications need nothing) only when the
spec asks for it. A sink never fails the campaign: `Observers` catches what one raises and
says so once per sink; notifications are delivered from a background thread.

An event record (`ledger.reads.event_record`) is plain JSON: {"id", "kind", "message", "data",
"campaign", "version", "stage", "attempt", "time"}.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from campaign.observe.base import Observer, Observers, Queued, Record

if TYPE_CHECKING:
    from campaign.spec import CampaignSpec

__all__ = ["Observer", "Observers", "Queued", "Record", "check_installed", "for_campaign", "gave_up"]


TENSORBOARD_WAIT_S = 60.0
"""At the driver's end, how long it waits for the TensorBoard files to be written and closed."""
WANDB_WAIT_S = 120.0
"""At the driver's end, how long it waits for W&B to log what is queued and finish its runs."""


def for_campaign(spec: CampaignSpec, campaign_dir: Path, spec_dir: Path, *, warn: Callable[[str], None],
                 tensorboard: Path | None = None) -> Observer:
    """The observer the spec's `observe:` and `notify:` ask for (`tensorboard`: the
    `--tensorboard DIR` option, which wins over the spec's); the null Observer() if none."""
    obs, sinks = spec.observe, []
    board = tensorboard or (_under(spec_dir, obs.tensorboard) if obs and obs.tensorboard else None)
    check_installed(spec, tensorboard=board is not None)
    if board is not None:
        from campaign.observe.tensorboard import TensorBoard

        # Queued: a flush to a slow file system waits there, not in the driver's ingestion.
        sinks.append(Queued(TensorBoard(board / spec.name), warn=warn, wait_s=TENSORBOARD_WAIT_S))
    if obs and obs.wandb:
        from campaign.observe.wandb import Wandb

        mode = obs.wandb.mode or ("online" if spec.site.COMPUTE_NODES_ONLINE else "offline")
        folder = _under(spec_dir, obs.wandb.dir) if obs.wandb.dir else campaign_dir
        # On a thread of its own: W&B's start takes seconds, online longer (never the driver's wait).
        sinks.append(Queued(Wandb(obs.wandb, mode=mode, folder=folder, spec=spec), warn=warn, wait_s=WANDB_WAIT_S))
    if spec.notify:
        from campaign.observe.notify import Notify

        sinks.append(Notify(spec.notify, cwd=spec_dir, warn=warn))
    return Observers(sinks, warn) if sinks else Observer()


def check_installed(spec: CampaignSpec, *, tensorboard: bool = False) -> None:
    """SpecError naming each `observe` field whose extra is not installed (`tensorboard`: the
    `--tensorboard` option was given); `campaign submit` asks before the ledger is opened."""
    import importlib.util

    from campaign.errors import SpecError

    def absent(name: str) -> bool:
        try:
            return importlib.util.find_spec(name) is None
        except ValueError:  # in sys.modules as None: import refused
            return True

    obs = spec.observe
    wanted = {"tensorboard": tensorboard or bool(obs and obs.tensorboard), "wandb": bool(obs and obs.wandb)}
    missing = [f"observe.{extra}: needs the `{extra}` package: pip install 'campaign[{extra}]'"
               for extra, asked in wanted.items() if asked and absent(extra)]
    if missing:
        raise SpecError(spec.name, missing)


def gave_up(campaign: str, why: str) -> Record:
    """The record of a driver that stops without finishing (not a ledger event: the ledger
    may be what failed)."""
    import datetime as dt

    return {"kind": "driver_gave_up", "message": f"the driver of {campaign} stopped: {why}", "data": {"why": why},
            "campaign": campaign, "version": None, "stage": None, "attempt": None,
            "time": dt.datetime.now(dt.timezone.utc).isoformat()}


def _under(base: Path, path: str) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() else base / p
