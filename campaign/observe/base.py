"""The observer interface (`Observer`, whose base is the null observer) and `Observers`,
several sinks as one; see `campaign.observe`."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any

Record = dict[str, Any]
"""One ledger event as `ledger.reads.event_record` makes it."""


class Observer:
    """A sink of a campaign's steps and events; this base is the null one (it does nothing)."""

    def steps(self, stage: str, attempt: int, rows: Sequence[dict[str, Any]], *, version: int = 1) -> None:
        """Step rows of `stage`'s attempt number `attempt`, in step order (as the trainer wrote them)."""

    def events(self, records: Sequence[Record]) -> None:
        """Ledger events, committed, oldest first."""

    def close(self) -> list[str]:
        """The driver is done (its end, or it gave up): flush, finish; lines for the user."""
        return []


class Observers(Observer):
    """Several sinks as one. A sink that raises is skipped for that call and the user told
    once (`warn`), never the campaign failed; calls come from the driver's threads (the
    ingestion, the lease's renewals), one at a time."""

    def __init__(self, sinks: Sequence[Observer], warn: Callable[[str], None]) -> None:
        self.sinks, self.warn = list(sinks), warn
        self._lock = threading.Lock()
        self._said: set[str] = set()

    def _each(self, call: Callable[[Observer], Any]) -> list[Any]:
        out = []
        with self._lock:
            for sink in self.sinks:
                try:
                    out.append(call(sink))
                except Exception as e:  # noqa: BLE001 - an observer must never stop the driver
                    name = type(sink).__name__
                    if name not in self._said:
                        self._said.add(name)
                        self.warn(f"warning: {name} failed ({type(e).__name__}: {e}); the campaign goes on")
        return out

    def steps(self, stage: str, attempt: int, rows: Sequence[dict[str, Any]], *, version: int = 1) -> None:
        self._each(lambda s: s.steps(stage, attempt, rows, version=version))

    def events(self, records: Sequence[Record]) -> None:
        self._each(lambda s: s.events(records))

    def close(self) -> list[str]:
        return [line for lines in self._each(lambda s: s.close()) for line in lines]


class Queued(Observer):
    """A sink on a thread of its own: the driver only queues, so a slow sink (W&B's start,
    a server that answers late) never holds up ingestion. `close()` waits at most `wait_s` for
    what is queued and the sink's own close, which run on that thread too."""

    def __init__(self, sink: Observer, *, warn: Callable[[str], None], wait_s: float) -> None:
        self.name, self.wait_s = type(sink).__name__, wait_s
        self._sink = Observers([sink], warn)  # what the sink raises is a warning there
        self._queue: queue.Queue[Callable[[], Any] | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lines: list[str] = []

    def _put(self, call: Callable[[], Any]) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name=f"campaign-{self.name}", daemon=True)
            self._thread.start()
        self._queue.put(call)

    def _work(self) -> None:
        while (call := self._queue.get()) is not None:
            call()
        self._lines = self._sink.close()

    def steps(self, stage: str, attempt: int, rows: Sequence[dict[str, Any]], *, version: int = 1) -> None:
        self._put(lambda: self._sink.steps(stage, attempt, rows, version=version))

    def events(self, records: Sequence[Record]) -> None:
        self._put(lambda: self._sink.events(records))

    def close(self) -> list[str]:
        if self._thread is None:
            return []
        self._queue.put(None)
        self._thread.join(self.wait_s)
        if self._thread.is_alive():
            return [f"warning: {self.name} did not finish within {self.wait_s:g} s; the driver stops without it"]
        return self._lines
