"""Notifications: tell a person when a stage passes or fails, a long run relaunches, a node is
excluded, the campaign ends, or the driver gives up (stdlib only).

    notify:
      command: "mail -s campaign you@example.org"   # run by /bin/sh with the event as JSON on stdin
      webhook: env:SLACK_WEBHOOK_URL                 # POST {"text": "..."} (Slack's incoming webhook body)

Delivery runs on a background thread from a queue, so the driver never waits on a slow
server: each delivery is tried `1 + retries` times with back-off (`backoff_s`, doubling, at most
60 s), each try bounded by `timeout_s`. At the driver's end it waits at most `wait_s` for what
is still queued, then says what was not delivered; a failed delivery is a warning line,
never the campaign's failure.

The command's stdin is one JSON object: {"event", "text", "kind", "message", "data",
"campaign", "version", "stage", "attempt", "time", "id"} (the ledger's event record plus the
notification's name and one-line text); CAMPAIGN_EVENT holds the name too.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from campaign.observe.base import Observer, Record

if TYPE_CHECKING:
    from campaign.observe.config import NotifyConfig

MAX_BACKOFF_S = 60.0

HEADLINES = {"stage_passed": "stage passed", "stage_failed": "stage FAILED", "relaunch": "relaunch",
             "node_excluded": "node excluded", "campaign_end": "campaign ended",
             "driver_gave_up": "the driver GAVE UP"}


def notification(r: Record) -> str | None:
    """Which notification (`notify.events`' names) a ledger event is, if any."""
    kind, to = r["kind"], (r.get("data") or {}).get("to")
    if kind == "stage_state" and to in ("passed", "failed"):
        return f"stage_{to}"
    if kind == "campaign_state" and to in ("succeeded", "failed", "cancelled"):
        return "campaign_end"
    if kind in ("relaunch", "node_excluded", "driver_gave_up"):
        return str(kind)
    return None


def text_of(name: str, r: Record) -> str:
    """The one line a person reads (Slack's `text`): where, what, and the ledger's message (the
    cause); a state change says only its outcome (the stage's verdict, the campaign's state)."""
    where = r["campaign"] + (f"/{r['stage']}" if r.get("stage") else "") + \
        (f" attempt {r['attempt']}" if r.get("attempt") else "")
    what, to = r["message"], (r.get("data") or {}).get("to")
    if r["kind"] in ("stage_state", "campaign_state") and to:
        what = what.partition(f"-> {to}: ")[2] or str(to)  # writes.set_stage_state: "stage S: A -> B: verdict"
    return f"[campaign] {where}: {HEADLINES[name]}: {what}"


class DeliveryError(Exception):
    """One try of one delivery failed (HTTP status, connection, exit code, timeout)."""


class Notify(Observer):
    """Queues each event the spec's `notify.events` names; a daemon thread delivers them."""

    def __init__(self, config: NotifyConfig, *, cwd: Path, warn: Callable[[str], None],
                 sleep: Callable[[float], bool] | None = None) -> None:
        self.config, self.cwd, self.warn = config, cwd, warn
        self.targets: list[tuple[str, Callable[[dict[str, Any]], None]]] = []
        if config.command:
            self.targets.append((f"command {config.command!r}", self._run_command))
        url = _resolve(config.webhook, warn) if config.webhook else None
        if url:
            self.targets.append((f"webhook {_shown(url)}", lambda payload: self._post(url, payload)))
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._stop = threading.Event()
        self._sleep = sleep or (lambda s: self._stop.wait(s))  # True: stop now
        self._thread: threading.Thread | None = None
        self.delivered: list[tuple[str, str]] = []  # (notification, target): what went out
        self.failed: list[tuple[str, str, str]] = []  # (notification, target, last error)

    def events(self, records: Sequence[Record]) -> None:
        for r in records:
            name = notification(r)
            if name is not None and name in self.config.events and self.targets:
                self._put({"event": name, "text": text_of(name, r), **r})

    def _put(self, payload: dict[str, Any]) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="campaign-notify", daemon=True)
            self._thread.start()
        self._queue.put(payload)

    def _work(self) -> None:
        while True:
            payload = self._queue.get()
            if payload is None:
                return
            for what, deliver in self.targets:
                if self._stop.is_set():
                    return
                self._deliver(payload, what, deliver)

    def _deliver(self, payload: dict[str, Any], what: str, deliver: Callable[[dict[str, Any]], None]) -> None:
        delay, error = self.config.backoff_s, ""
        for attempt in range(1 + self.config.retries):
            if attempt and self._sleep(delay):
                break
            if attempt:
                delay = min(delay * 2, MAX_BACKOFF_S)
            try:
                deliver(payload)
            except (DeliveryError, OSError, subprocess.SubprocessError) as e:
                error = str(e)
                continue
            self.delivered.append((payload["event"], what))
            return
        self.failed.append((payload["event"], what, error))
        self.warn(f"warning: notification {payload['event']} not delivered to {what}: {error}")

    def _post(self, url: str, payload: dict[str, Any]) -> None:
        body = json.dumps({"text": payload["text"]}).encode()
        req = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.config.timeout_s) as resp:  # noqa: S310 - the user's URL
                status = resp.status
        except urllib.error.HTTPError as e:
            raise DeliveryError(f"HTTP {e.code} {e.reason}") from None
        except urllib.error.URLError as e:
            raise DeliveryError(str(e.reason)) from None
        if not 200 <= status < 300:
            raise DeliveryError(f"HTTP {status}")

    def _run_command(self, payload: dict[str, Any]) -> None:
        assert self.config.command is not None
        proc = subprocess.Popen(self.config.command, shell=True, cwd=self.cwd, stdin=subprocess.PIPE,  # noqa: S602
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
                                env={**os.environ, "CAMPAIGN_EVENT": payload["event"]})
        try:
            _, err = proc.communicate(json.dumps(payload) + "\n", timeout=self.config.timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the shell and whatever it started
            proc.wait()
            raise DeliveryError(f"still running after {self.config.timeout_s:g} s (killed)") from None
        if proc.returncode != 0:
            raise DeliveryError(f"exit {proc.returncode}: {(err or '').strip()[-300:]}")

    def close(self) -> list[str]:
        """Wait at most `wait_s` for what is queued; then stop retrying and say what was lost."""
        if self._thread is None:
            return []
        self._queue.put(None)
        self._thread.join(self.config.wait_s)
        if not self._thread.is_alive():
            return []
        self._stop.set()
        left = self._queue.qsize()  # those queued, less the sentinel, plus the one being delivered now
        return [f"warning: {left} notification(s) not delivered within notify.wait_s ({self.config.wait_s:g} s); "
                "given up"]


def _resolve(webhook: str, warn: Callable[[str], None]) -> str | None:
    """The webhook's URL: as written, or `env:VAR`'s value in the driver's environment."""
    if not webhook.startswith("env:"):
        return webhook
    url = os.environ.get(webhook[4:], "").strip()
    if not url.startswith(("http://", "https://")):
        warn(f"warning: notify.webhook: {webhook[4:]} is not set to an http(s) URL in the driver's environment; "
             "no webhook notifications")
        return None
    return url


def _shown(url: str) -> str:
    """A webhook URL without its path (Slack's path is the secret)."""
    from urllib.parse import urlparse

    p = urlparse(url)
    return f"{p.scheme}://{p.netloc}/..." if p.path not in ("", "/") else url
