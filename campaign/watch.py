"""`campaign status --watch`: re-read the ledger every interval and show it again.

On a terminal the view is redrawn in place (Rich Live); in a log or pipe a new copy is
printed only when the ledger changed, so a watched log grows by one view per change.
The watch ends when the campaign is no longer running, after `count` refreshes, or on
Ctrl-C. `fetch`, `sleep` and the console enter as arguments, so tests need no terminal.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

RUNNING_STATES = frozenset({"running"})


def watch(fetch: Callable[[], Any], render: Callable[[Any], Any], console: Any, *, interval: float = 2.0,
          count: int | None = None, running: Callable[[Any], bool] | None = None,
          sleep: Callable[[float], None] = time.sleep) -> int:
    """Show `render(fetch())` until `running(data)` is false or `count` refreshes; returns
    how many refreshes it made. Data that did not change is not printed again off a TTY."""
    running = running or _any_running
    refreshes = 0
    live = None
    last = None
    try:
        if console.is_terminal:
            from rich.live import Live

            live = Live(console=console, auto_refresh=False, transient=False)
            live.start()
        while True:
            data = fetch()
            refreshes += 1
            key = json.dumps(data, sort_keys=True, default=str)
            if live is not None:
                live.update(render(data), refresh=True)
            elif key != last:
                console.print(render(data))
            last = key
            if not running(data) or (count is not None and refreshes >= count):
                break
            sleep(interval)
    except KeyboardInterrupt:
        pass
    finally:
        if live is not None:
            live.stop()
    return refreshes


def _any_running(data: Any) -> bool:
    if isinstance(data, dict):
        return data.get("state") in RUNNING_STATES
    return any(r.get("state") in RUNNING_STATES for r in data)
