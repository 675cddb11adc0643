"""TensorBoard event files of a campaign, written by the driver as it ingests (needs the
`tensorboard` extra: its own event-file writer and summary protos, no TensorFlow).

    DIR/CAMPAIGN/STAGE/attempt-N/   scalars of one attempt: loss, lr, tokens, tokens_per_s, step_time_s,
                                    mem_peak_gib (and mfu, mfu_float8, comm_time_s, grad_norm when the trainer reports them)
    DIR/CAMPAIGN/STAGE/events/      the stage's ledger events as text, one tag per kind (relaunch, node_excluded, ...)
    DIR/CAMPAIGN/events/            the campaign's own events (its state, block renewals, the driver giving up)

A version after the first writes under DIR/CAMPAIGN/vN/. One run per attempt keeps each run's
steps increasing (a relaunch resumes from an earlier step), which TensorBoard needs: a step
that goes back makes it drop the points after it. For the same reason a text event's step is
the ledger's event id (increasing across drivers, and the same in `ledger export --format
tensorboard`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from campaign.observe.base import Observer, Record

SCALARS = ("loss", "lr", "tokens", "tokens_per_s", "step_time_s", "mem_peak_gib", "mfu", "mfu_float8", "comm_time_s",
           "grad_norm")
"""Fields of a metrics.jsonl row written as scalars (under the same names), when present."""


class TensorBoard(Observer):
    """Event files under `root` (DIR/CAMPAIGN), flushed after each batch: `tensorboard
    --logdir DIR` shows the campaign live."""

    def __init__(self, root: Path) -> None:
        from tensorboard.compat.proto import event_pb2
        from tensorboard.plugins.scalar.summary_v2 import scalar_pb
        from tensorboard.plugins.text.summary_v2 import text_pb
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self.root = root
        self._event, self._scalar, self._text, self._writer_class = event_pb2.Event, scalar_pb, text_pb, EventFileWriter
        self._writers: dict[Path, Any] = {}

    def _writer(self, version: int | None, *parts: str) -> Any:
        folder = (self.root if not version or version == 1 else self.root / f"v{version}").joinpath(*parts)
        w = self._writers.get(folder)
        if w is None:
            w = self._writers[folder] = self._writer_class(str(folder), flush_secs=5)
        return w

    def steps(self, stage: str, attempt: int, rows: Sequence[dict[str, Any]], *, version: int = 1) -> None:
        if not rows:
            return
        w = self._writer(version, stage, f"attempt-{attempt}")
        for row in rows:
            step, when = int(row["step"]), _wall_time(row)
            for key in SCALARS:
                value = row.get(key)
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    w.add_event(self._event(step=step, wall_time=when, summary=self._scalar(key, float(value))))
        w.flush()

    def events(self, records: Sequence[Record]) -> None:
        touched = {}
        for r in records:
            if r.get("id") is None:
                continue  # not a ledger row (the driver giving up): it has no place in the order
            w = self._writer(r["version"], *((r["stage"], "events") if r["stage"] else ("events",)))
            w.add_event(self._event(step=int(r["id"]), wall_time=_epoch(r["time"]),
                                    summary=self._text(r["kind"], self._markdown(r))))
            touched[id(w)] = w
        for w in touched.values():
            w.flush()

    @staticmethod
    def _markdown(r: Record) -> str:
        """`**kind** (attempt N): message`, and the event's data as an indented JSON line."""
        head = f"**{r['kind']}**" + (f" (attempt {r['attempt']})" if r.get("attempt") else "") + f": {r['message']}"
        data = {k: v for k, v in (r.get("data") or {}).items() if v not in (None, {}, [])}
        return head + (f"\n\n    {json.dumps(data, sort_keys=True)}" if data else "")

    def close(self) -> list[str]:
        for w in self._writers.values():
            w.close()
        self._writers.clear()
        return [f"TensorBoard: tensorboard --logdir {self.root.parent}"] if self.root.exists() else []


def _epoch(iso: str) -> float:
    import datetime as dt

    return dt.datetime.fromisoformat(iso).timestamp()


def _wall_time(row: dict[str, Any]) -> float:
    """The row's own time (`time`, seconds since the epoch, when the trainer wrote it), else now."""
    import time

    t = row.get("time")
    return float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) and t > 0 \
        else time.time()
