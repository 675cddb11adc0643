"""SIGTERM: stop at the next step boundary and exit 143, and never hang. SIGUSR1: a rescue.

A Python signal handler only runs when the main thread returns to the interpreter, which a
rank blocked inside a collective never does. So the C-level handler also writes to a
wakeup fd, read by a daemon thread that sets the flag and, after a grace period
(CAMPAIGN_SIGTERM_GRACE seconds, default 20), ends the process with os._exit(143). A
second SIGTERM ends it at once. SIGUSR1 (the supervisor's rescue request,
campaign.train.rescue) is handed to `on_usr1` in the same thread; until a callback is set it
is ignored (its default action would end the process).
"""

from __future__ import annotations

import os
import signal
import socket
import threading
from collections.abc import Callable

from campaign import report


class StopFlag:
    """`requested` becomes True on SIGTERM."""

    def __init__(self) -> None:
        self.requested = False
        self._count = 0
        self._lock = threading.Lock()
        self.on_usr1: Callable[[], None] | None = None
        """Called in the signal reader thread on SIGUSR1 (set once the trainer can rescue)."""

    def __call__(self) -> bool:
        return self.requested

    def _on_term(self) -> None:
        with self._lock:
            self._count += 1
            self.requested = True
            first = self._count == 1
        if not first:
            os._exit(report.EXIT_SIGTERM)
        grace = float(os.environ.get("CAMPAIGN_SIGTERM_GRACE", "20"))
        timer = threading.Timer(grace, os._exit, args=(report.EXIT_SIGTERM,))
        timer.daemon = True
        timer.start()

    def install(self) -> StopFlag:
        """Call from the main thread."""
        rsock, wsock = socket.socketpair()
        rsock.setblocking(True)
        wsock.setblocking(False)
        signal.signal(signal.SIGTERM, lambda *_: None)  # the reader thread does the work
        signal.signal(signal.SIGUSR1, lambda *_: None)
        signal.set_wakeup_fd(wsock.fileno(), warn_on_full_buffer=False)
        self._socks = (rsock, wsock)

        def read() -> None:
            while True:
                data = rsock.recv(64)
                if not data:
                    return
                for b in data:
                    if b == signal.SIGTERM:
                        self._on_term()
                    elif b == signal.SIGUSR1 and self.on_usr1 is not None:
                        self.on_usr1()

        threading.Thread(target=read, name="campaign-sigterm", daemon=True).start()
        return self
