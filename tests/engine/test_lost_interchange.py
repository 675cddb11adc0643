"""A Parsl interchange killed while Parsl's job status poller waits on it: cleanup still ends.

Real Parsl (the local site's HighThroughputExecutor config) and a real interchange killed
with SIGKILL. The race CI met (a status poll sent to the interchange 30 ms before cleanup
began, after it had died; cleanup then joined the poller's thread forever) is forced here
by having the poller's own thread ask the dead interchange for its blocks.
"""

from __future__ import annotations

import os
import signal
import threading

import parsl
import pytest

from campaign import block
from campaign.executors.base import LABEL
from campaign.executors.local import LocalSite


@pytest.mark.slow
def test_cleanup_ends_when_the_poller_waits_on_a_dead_interchange(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(block, "POLLER_JOIN_S", 2.0)
    site = LocalSite.model_validate({"kind": "local", "nodes": 1})
    dfk = parsl.load(site.parsl_config(tmp_path / "parsl"))
    try:
        executor = dfk.executors[LABEL]
        os.kill(executor.interchange_proc.pid, signal.SIGKILL)
        executor.interchange_proc.wait()
        asked = threading.Event()

        def ask() -> None:
            asked.set()
            executor.connected_blocks()  # a REQ with no timeout: no reply will ever come

        dfk.job_status_poller.callback = ask
        assert asked.wait(30), "the poller did not run"
        block.release_lost_executor(dfk)
        cleanup = threading.Thread(target=dfk.cleanup, daemon=True)
        cleanup.start()
        cleanup.join(30)
        assert not cleanup.is_alive(), "cleanup still waits for the poller's thread"
    finally:
        parsl.clear()
