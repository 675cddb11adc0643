"""End to end through the Executor stand-in: `campaign submit --endpoint` starts a detached
driver (a real `campaign submit` on the local site, Parsl HTEX and CPU training), status
shows it move, a second submit attaches, plot and export read the ledger there, cancel
stops it cleanly. Every call crosses the SDK serializer into another process."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import ENDPOINT_ID, FakeEndpoint

from campaign import remote

SPEC = {
    "name": "remote-demo",
    "site": {"kind": "local", "nodes": 1, "ranks_per_node": 1},
    "model": {"size": "tiny"},
    "trainer": {"micro_batch_size": 2, "warmup_steps": 2},
    # Far more steps than the test waits for: it is cancelled while it runs.
    "stages": [{"name": "long", "kind": "long_run", "steps": 200000, "checkpoint_every": 500, "max_attempts": 1}],
}


@pytest.fixture
def drivers() -> Iterator[list[int]]:
    """Pids of the drivers this test started (each leads its own session); any still alive
    at the end is stopped by its process group, by id."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(pid, sig)
            except (ProcessLookupError, PermissionError):
                break
            time.sleep(3)


def _wait(what: str, probe: Callable[[], Any], timeout: float = 180, every: float = 1.0) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = probe()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.slow
def test_submit_detach_status_plot_export_cancel(endpoint: FakeEndpoint, run_cli, tmp_path: Path,
                                                 drivers: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    spec = tmp_path / "remote-demo.yaml"
    spec.write_text(yaml.safe_dump(SPEC, sort_keys=False))
    wd = tmp_path / "endpoint-home" / "campaigns"
    on_ep = ("--endpoint", ENDPOINT_ID, "--workdir", wd)

    code, out, err = run_cli("submit", spec, *on_ep)
    assert code == 0, out + err
    started = re.search(r"started a driver for remote-demo on (\S+) \(pid (\d+)\)", out)
    assert started, out
    pid = int(started[2])
    drivers.append(pid)
    assert (wd / "specs" / "remote-demo.yaml").read_text() == spec.read_text(), "the spec travelled with the call"
    assert f"log:    {wd / 'remote-demo' / 'driver.log'}" in out

    def status() -> dict[str, Any]:
        code, out, err = run_cli("status", "remote-demo", "--json", *on_ep)
        assert code == 0, out + err
        return json.loads(out)

    # Status changes while the detached driver trains (the submit call returned long ago).
    first = _wait("the long run to report steps", lambda: (s := status())["stages"][0]["tokens"] > 0 and s)
    assert first["state"] == "running" and first["stages"][0]["state"] == "running"
    later = _wait("more steps", lambda: (s := status())["stages"][0]["tokens"] > first["stages"][0]["tokens"] and s)
    assert later["attempts_detail"][0]["last_step"] > first["attempts_detail"][0]["last_step"]

    # The same spec again attaches to the running driver instead of starting a second.
    code, out, err = run_cli("submit", spec, *on_ep)
    assert code == 0, out + err
    assert f"attached to the running driver of remote-demo on {started[1]} (pid {pid})" in out

    code, out, err = run_cli("status", *on_ep)  # the list of campaigns, rendered here
    assert code == 0 and "remote-demo" in out and "running" in out, out + err

    plots = tmp_path / "plots"
    code, out, err = run_cli("plot", "remote-demo", "--out", plots, *on_ep)
    assert code == 0, out + err
    png = Path(out.strip())
    assert png == plots / "remote-demo-run.png" and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    code, out, err = run_cli("cancel", "remote-demo", *on_ep)
    assert code == 0, out + err
    assert "remote-demo: cancelled" in out
    _wait("the driver to exit", lambda: not _alive(pid), timeout=60)
    final = status()
    assert final["state"] == "cancelled"
    assert final["attempts_detail"][0]["state"] == "cancelled" and final["stages"][0]["state"] == "failed"

    # Export in about three pages: the same rows as the ledger holds, no overlap, no gap.
    rows = final["attempts_detail"][0]["last_step"] - final["attempts_detail"][0]["first_step"] + 1
    monkeypatch.setattr(remote, "PAGE_ROWS", rows // 3 + 1)
    steps_csv = tmp_path / "steps.csv"
    code, out, err = run_cli("ledger", "export", "remote-demo", "--out", steps_csv, *on_ep)
    assert code == 0, out + err
    remote_rows = list(csv.DictReader(io.StringIO(steps_csv.read_text())))
    assert len(remote_rows) == rows and f"{rows} steps row(s)" in err
    steps = [int(r["step"]) for r in remote_rows]
    assert steps == list(range(steps[0], steps[0] + rows)), "pages neither overlap nor leave gaps"
    assert endpoint.calls.count("read_export_page") == 3

    code, out, err = run_cli("ledger", "export", "remote-demo", "--what", "attempts", "--format", "json", *on_ep)
    assert code == 0 and json.loads(out)[0]["stage"] == "long", out + err
    assert endpoint.calls.count("endpoint_versions") == len(endpoint.made), "versions checked once per command"


def _alive(pid: int) -> bool:
    """Running (a zombie left to an init that does not reap counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False
