"""Fixtures of the observer tests: a webhook server on 127.0.0.1 that fails its first requests."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest


class FlakyWebhook:
    """A real HTTP server (Slack's incoming-webhook side of the wire): answers 503 to the
    first `fail_first` POSTs, then 200, keeping each accepted JSON body."""

    def __init__(self, fail_first: int) -> None:
        self.fail_first, self.requests, self.bodies = fail_first, 0, []
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                hook.requests += 1
                ok = hook.requests > hook.fail_first
                if ok:
                    hook.bodies.append({"content_type": self.headers.get("Content-Type"), **json.loads(body)})
                self.send_response(200 if ok else 503)
                self.end_headers()
                self.wfile.write(b"ok" if ok else b"try later")

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/services/T000/B000/secret"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def webhook() -> Iterator[FlakyWebhook]:
    hook = FlakyWebhook(fail_first=2)
    yield hook
    hook.close()
