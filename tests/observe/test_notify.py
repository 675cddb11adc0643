"""Notifications: delivered with retries and back-off from a background thread, never
blocking or failing the driver (a real HTTP server on 127.0.0.1, real shell commands)."""

from __future__ import annotations

import io
import json
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from campaign.engine import Engine
from campaign.errors import WorkdirError
from campaign.ledger import open_ledger
from campaign.observe import Observer, Observers
from campaign.observe.config import NotifyConfig
from campaign.observe.notify import Notify
from campaign.progress import Progress
from campaign.runner import run_in_thread
from campaign.spec import CampaignSpec


def record(kind: str, message: str, *, to: str | None = None, stage: str | None = "long", attempt: int | None = 1,
           **data: Any) -> dict[str, Any]:
    return {"id": 7, "kind": kind, "message": message, "data": {**data, **({"to": to} if to else {})},
            "campaign": "demo", "version": 1, "stage": stage, "attempt": attempt, "time": "2026-12-07T10:00:00+00:00"}


def test_a_webhook_that_fails_twice_gets_each_notification_once_after_back_off(webhook: Any) -> None:
    warned: list[str] = []
    notify = Notify(NotifyConfig(webhook=webhook.url, backoff_s=0.2, retries=3), cwd=Path.cwd(), warn=warned.append)
    t0 = time.monotonic()
    notify.events([record("relaunch", "relaunching after stalled (exit 124) from step 20", exit_class="stalled"),
                   record("attempt_started", "not a notification"),
                   record("stage_state", "stage long: running -> passed", to="passed")])
    assert time.monotonic() - t0 < 0.1, "events() only queues"
    assert notify.close() == []
    took = time.monotonic() - t0
    assert webhook.requests == 4 and len(webhook.bodies) == 2
    assert took >= 0.2 + 0.4, "two failed tries waited 0.2 s, then 0.4 s (doubling)"
    assert "relaunch" in webhook.bodies[0]["text"] and "exit 124" in webhook.bodies[0]["text"]
    assert "stage passed" in webhook.bodies[1]["text"]
    assert notify.delivered == [("relaunch", notify.targets[0][0]), ("stage_passed", notify.targets[0][0])]
    assert "secret" not in notify.targets[0][0], "the webhook's path (Slack's secret) is not shown"
    assert warned == []


def test_a_dead_webhook_neither_blocks_the_driver_nor_fails_it() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    warned: list[str] = []
    config = NotifyConfig(webhook=f"http://127.0.0.1:{port}/hook", backoff_s=5, retries=10, wait_s=1)
    notify = Notify(config, cwd=Path.cwd(), warn=warned.append)
    t0 = time.monotonic()
    notify.events([record("campaign_state", "campaign demo: running -> failed", to="failed", stage=None, attempt=None)])
    lines = notify.close()
    assert time.monotonic() - t0 < 3, "the end waits notify.wait_s (1 s), not 10 retries"
    assert lines == ["warning: 1 notification(s) not delivered within notify.wait_s (1 s); given up"]


def test_a_command_gets_the_event_on_stdin_and_a_hung_one_is_killed(tmp_path: Path) -> None:
    warned: list[str] = []
    ok = Notify(NotifyConfig(command='cat > "event-$CAMPAIGN_EVENT.json"'), cwd=tmp_path, warn=warned.append)
    ok.events([record("node_excluded", "excluded local-n1: rank 1 killed by SIGKILL", node="local-n1")])
    ok.close()
    sent = json.loads((tmp_path / "event-node_excluded.json").read_text())
    assert sent["event"] == "node_excluded" and sent["data"]["node"] == "local-n1"
    assert sent["text"] == "[campaign] demo/long attempt 1: node excluded: excluded local-n1: rank 1 killed by SIGKILL"

    hung = Notify(NotifyConfig(command="echo $$ > pid; sleep 60", timeout_s=0.5, retries=1, backoff_s=0),
                  cwd=tmp_path, warn=warned.append)
    t0 = time.monotonic()
    hung.events([record("relaunch", "relaunching")])
    assert hung.close() == []
    assert time.monotonic() - t0 < 5
    assert hung.failed and "killed" in hung.failed[0][2]
    assert warned == [f"warning: notification relaunch not delivered to {hung.targets[0][0]}: {hung.failed[0][2]}"]
    pid = int((tmp_path / "pid").read_text())
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]


def test_a_webhook_from_the_environment_and_a_missing_one(webhook: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    webhook.fail_first = 0
    monkeypatch.setenv("HOOK_URL", webhook.url)
    notify = Notify(NotifyConfig(webhook="env:HOOK_URL"), cwd=Path.cwd(), warn=print)
    notify.events([record("stage_state", "stage long: running -> failed: loss diverged", to="failed")])
    notify.close()
    assert "stage FAILED" in webhook.bodies[0]["text"] and "loss diverged" in webhook.bodies[0]["text"]
    warned: list[str] = []
    Notify(NotifyConfig(webhook="env:NOT_SET_ANYWHERE"), cwd=Path.cwd(), warn=warned.append)
    assert warned == ["warning: notify.webhook: NOT_SET_ANYWHERE is not set to an http(s) URL in the driver's "
                      "environment; no webhook notifications"]


def test_a_sink_that_raises_is_one_warning_and_the_others_still_get_everything() -> None:
    class Broken(Observer):
        def events(self, records: Any) -> None:
            raise OSError(28, "No space left on device")

    class Keeper(Observer):
        def __init__(self) -> None:
            self.got: list[Any] = []

        def events(self, records: Any) -> None:
            self.got += records

    warned: list[str] = []
    keeper = Keeper()
    both = Observers([Broken(), keeper], warned.append)
    both.events([record("relaunch", "a")])
    both.events([record("relaunch", "b")])
    assert [r["message"] for r in keeper.got] == ["a", "b"]
    assert warned == ["warning: Broken failed (OSError: [Errno 28] No space left on device); the campaign goes on"]


def test_the_driver_giving_up_is_notified_with_its_cause(tmp_path: Path) -> None:
    """The stage's folder cannot be made (a file is in its place): the driver stops with
    WorkdirError (exit 2, `resume` continues), and the notification says why."""
    spec = CampaignSpec.model_validate({
        "name": "gives-up", "site": {"kind": "local", "nodes": 1, "ranks_per_node": 1}, "model": {"size": "tiny"},
        "notify": {"command": "cat >> notes.jsonl"},
        "stages": [{"name": "long", "kind": "long_run", "steps": 3, "timeout_s": 60}]})
    (tmp_path / "campaigns" / "gives-up").mkdir(parents=True)
    (tmp_path / "campaigns" / "gives-up" / "long").write_text("a file where the stage's folder goes\n")
    engine = Engine(spec, open_ledger(f"sqlite:///{tmp_path / 'ledger.db'}"), workdir=tmp_path / "campaigns",
                    progress=Progress(io.StringIO()), runner=run_in_thread, spec_dir=tmp_path)
    with pytest.raises(WorkdirError):
        engine.submit()
    notes = [json.loads(line) for line in (tmp_path / "notes.jsonl").read_text().splitlines()]
    # The ledger records the stage and the campaign stopped (issue 39: states true after a driver
    # stops on its work directory), so those two notifications come first, then the driver's.
    assert [n["event"] for n in notes] == ["stage_failed", "campaign_end", "driver_gave_up"]
    gave_up = notes[-1]
    assert gave_up["message"].startswith("the driver of gives-up stopped: WorkdirError: cannot write the attempt's "
                                         "run directory"), gave_up["message"]
    assert "campaign resume gives-up" in gave_up["text"]
    assert all("cannot write the attempt's run directory" in n["text"] + n.get("message", "") for n in notes)


def test_a_slow_sink_holds_up_neither_ingestion_nor_the_end_past_its_bound() -> None:
    from campaign.observe import Queued

    class Slow(Observer):
        def __init__(self) -> None:
            self.got: list[int] = []

        def steps(self, stage: str, attempt: int, rows: Any, *, version: int = 1) -> None:
            time.sleep(0.5)  # a flush to a file system that answers late
            self.got += [r["step"] for r in rows]

        def close(self) -> list[str]:
            return ["closed"]

    slow = Slow()
    queued = Queued(slow, warn=print, wait_s=5)
    t0 = time.monotonic()
    for step in range(1, 4):
        queued.steps("long", 1, [{"step": step}])
    assert time.monotonic() - t0 < 0.1, "the driver only queues"
    assert queued.close() == ["closed"] and slow.got == [1, 2, 3], "in order, all of it, then the sink's close"

    stuck = Queued(Slow(), warn=print, wait_s=0.2)
    for step in range(1, 10):
        stuck.steps("long", 1, [{"step": step}])
    t0 = time.monotonic()
    assert stuck.close() == ["warning: Slow did not finish within 0.2 s; the driver stops without it"]
    assert time.monotonic() - t0 < 1
