"""SIGTERM: stop at the next step boundary and exit 143, and never hang.

A Python signal handler only runs when the main thread returns to the interpreter, which a
rank blocked inside a collective never does. So the C-level handler also writes to a
wakeup fd, read by a daemon thread that sets the flag and, after a grace period
(CAMPAIGN_SIGTERM_GRACE seconds, default 20), ends the process with os._exit(143). A
second SIGTERM ends it at once.
"""

from __future__ import annotations

import os
import signal
import socket
import threading

from campaign import report


class StopFlag:
    """`requested` becomes True on SIGTERM."""

    def __init__(self) -> None:
        self.requested = False
        self._count = 0
        self._lock = threading.Lock()

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
        signal.set_wakeup_fd(wsock.fileno(), warn_on_full_buffer=False)
        self._socks = (rsock, wsock)

        def read() -> None:
            while True:
                data = rsock.recv(64)
                if not data:
                    return
                for _ in (b for b in data if b == signal.SIGTERM):
                    self._on_term()

        threading.Thread(target=read, name="campaign-sigterm", daemon=True).start()
        return self
