"""The block of one submission: its Parsl load, renewal, restart and unload, and the attempt runner on it.

    block = Block(site, campaign_dir, record=engine_record)   # record(kind, message, data): a ledger event
    with block.loaded():                                       # parsl.load(site.parsl_config()); cleanup after
        future = block.start(request)                          # the supervisor as a Parsl app on the block
        block.lost()                                           # "the Parsl interchange exited (code -9)" or None
        block.ended()                                          # "the block's job ended (CANCELLED)" or None
        block.replace(why)                                     # a fresh load (a new block) after the job ended
        block.renew(excluded)                                  # batch sites: a new block once the spares are spent
        block.restart(why)                                     # once: a fresh load after the block never started

The driver owns exactly one block at a time and it is the only owner: whoever loads it
cleans it up (Parsl's cleanup cancels the provider's job and stops the worker pools), and
`campaign.recovery.reap_dead_driver` stops what a killed driver's block left (its
interchange and workers: `driver.json` names them). `runner=` replaces Parsl by another
attempt runner (`campaign.runner.run_in_thread`): then nothing is loaded.

Layer "attempt" (docs/architecture.md): it imports the supervisor and the sites, and writes
the ledger only through `record`, which the engine hands in.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from campaign import report
from campaign.attempt import AttemptRequest
from campaign.executors.base import LABEL, Site
from campaign.rundir import DRIVER_FILE
from campaign.runner import AttemptRunner

JOB_POLL_S = 5.0
"""How often `ended()` asks the provider for the block's job state while an attempt runs (one
squeue/qstat of one job id). Parsl polls Slurm and PBS every 60 s, and an interchange notices
a cancelled block only when its manager's heartbeats stop (120 s): a cancelled or failed block
cost the attempt 2 minutes before (issue 29 item 8 found it: the Slurm block-cancel test
waited 117 s of its 133 s for it)."""
POLLER_JOIN_S = 10.0
"""How long cleanup waits for Parsl's job status poller once the interchange is gone."""
_ABANDONED: list[Any] = []
"""Command clients of executors whose interchange died (release_lost_executor)."""

Record = Callable[[str, str, "dict[str, Any] | None"], None]
"""Records a block event (kind, message, data) in the ledger and says it: the engine's."""


def release_lost_executor(dfk: Any) -> None:
    """Let `dfk.cleanup()` finish although the executor's interchange is gone. Parsl asks the
    interchange over a REQ socket with no timeout, so two calls would wait forever for a
    reply: scale_in at cleanup (so the blocks are cancelled through the provider here and
    scale_in skipped), and a status poll that the job status poller's thread may have sent
    just before (seen in CI: sent 30 ms before cleanup began; cleanup then joined that thread
    forever). The poller's thread is a daemon: cleanup stops waiting for it after
    POLLER_JOIN_S and leaves it blocked on the dead socket, which is not closed under it."""
    executor = dfk.executors[LABEL]
    executor.provider.cancel(list(executor.blocks_to_job_id.values()))
    executor.scale_in = lambda *args, **kwargs: []
    poller = dfk.job_status_poller
    close = poller.close
    poller.close = lambda timeout=None: close(timeout=POLLER_JOIN_S if timeout is None else timeout)
    # Nor is the command client closed under that thread: zmq's term() waits for a socket
    # another thread still waits on (seen: the driver stuck in shutdown's close(), and, when
    # left to the garbage collector, in Context.__del__). It is kept until the process exits,
    # where pyzmq destroys nothing.
    _ABANDONED.append(executor.command_client)
    executor.command_client.close = lambda: None


class Block:
    """The site's Parsl block for one submission and the runner of attempts on it."""

    def __init__(self, site: Site, campaign_dir: Path, *, record: Record, runner: AttemptRunner | None = None,
                 warm: bool = False) -> None:
        """`runner`: how attempts run (default: the supervisor as a Parsl app on this block,
        which is then loaded, renewed and restarted here; any other runner gets no Parsl).
        `warm`: the ranks start from a fork server (`contract.warm_start`); on a site whose
        block runs on this host (local) the server is started before Parsl is loaded."""
        self.site = site
        self._warm = warm
        self._warm_server: Any = None
        """The fork server this driver started (`_prestart_warm`), reaped once it exits."""
        self._warm_scope: dict[str, str] = {}
        """The scope `_prestart_warm` put in this process's environment, removed at unload."""
        self.campaign_dir = campaign_dir
        self._record = record
        self._runner = runner
        self._app: Any = None
        self._dfk: Any = None
        self._restarted = False
        self._job_polled = 0.0

    def start(self, request: AttemptRequest) -> Future[dict[str, Any]]:
        """Run the supervisor for `request` through the runner: its future report."""
        if self._runner is not None:
            return self._runner(request)
        if self._app is None:
            from parsl import python_app

            from campaign.supervisor import supervise

            self._app = python_app(supervise, executors=[LABEL])
        return self._app(request)  # type: ignore[no-any-return]

    def lost(self) -> str | None:
        """Why attempts can no longer complete through Parsl (its interchange exited), or None."""
        if self._dfk is None:
            return None
        proc = getattr(self._dfk.executors.get(LABEL), "interchange_proc", None)
        code = proc.poll() if proc is not None else None
        return None if code is None else f"the Parsl interchange exited (code {code})"

    def ended(self, now: float | None = None) -> str | None:
        """Why the block's scheduler job is over (every block of the executor in a terminal
        state by the provider: cancelled, failed, out of walltime, gone from the queue), or
        None; asks the provider at most every JOB_POLL_S. A provider that cannot answer
        (squeue down) is not a lost block: None, and the interchange's heartbeats still apply."""
        now = time.monotonic() if now is None else now
        if self._dfk is None or now - self._job_polled < JOB_POLL_S:
            return None
        self._job_polled = now
        executor = self._dfk.executors[LABEL]
        try:
            states = executor.status()
        except Exception as e:  # the provider's command failed: ask again next time
            logging.getLogger(__name__).warning("asking the provider for the block's state failed: %s", e)
            return None
        if not states or not all(s.terminal for s in states.values()):
            return None
        jobs = ", ".join(f"job {executor.blocks_to_job_id.get(b, b)} {s.status_name}"
                         + (" (done, or gone from the queue)" if s.status_name == "COMPLETED" else "")
                         + (f": {s.message}" if s.message else "") for b, s in sorted(states.items()))
        return f"the block's scheduler job ended under the attempt: {jobs}"

    def replace(self, why: str) -> bool:
        """A fresh load (and so a new block) after the block's job ended under an attempt:
        Parsl's own strategy would ask for one only at its next status poll (60 s on Slurm and
        PBS). False where nothing is loaded (another runner)."""
        if self._dfk is None:
            return False
        self._record("block_replaced", f"{why}; loading Parsl again for a new block", None)
        self._unload()
        self._load(self.site)
        return True

    @contextlib.contextmanager
    def loaded(self) -> Iterator[None]:
        """One Parsl DataFlowKernel (and one block) for the stages of this submission; a fresh
        Config each time, as Parsl requires; `renew` and `restart` may replace it in between.
        Nothing to load when attempts run through another runner."""
        if self._runner is not None:
            yield
            return
        self._load(self.site)
        try:
            yield
        finally:
            self._unload()

    def _load(self, site: Site) -> None:
        import parsl

        # Parsl logs to files in the campaign's folder: on a full disk each record would print
        # "--- Logging error ---" and a traceback to the terminal (thousands of lines). Drop
        # such records instead; the driver says what failed in its own words.
        logging.raiseExceptions = False
        if self._warm and site.launcher == "local":
            self._prestart_warm(site)
        self._dfk = parsl.load(site.parsl_config(self.campaign_dir / "parsl"))
        proc = getattr(self._dfk.executors.get(LABEL), "interchange_proc", None)
        report.write_json_atomic(self.campaign_dir / DRIVER_FILE, {
            "host": socket.gethostname(), "pid": os.getpid(), "interchange_pid": proc.pid if proc else None,
            "parsl_dir": str(self.campaign_dir / "parsl")})

    def _prestart_warm(self, site: Site) -> None:
        """The fork server the local block's first launch will reach, started now: its imports
        overlap Parsl's start (measured on an H100 host: 6 s from the CLI to the first attempt,
        then the server's 5-7 s of imports after it). The block inherits the scope from this
        process's environment (`warm.launch_environment` keeps it), so its launches find the
        server; one whose environment differs where the key looks starts its own, as before."""
        from campaign.executors import warm

        scope = warm.driver_environment()
        os.environ.update(scope)  # the worker inherits it; removed when the block is unloaded
        self._warm_scope = scope
        self._warm_server = warm.prestart({**os.environ, **site.launch_options().env}) or self._warm_server

    def _unload(self) -> None:
        import parsl

        if self._warm_server is not None and self._warm_server.poll() is not None:
            self._warm_server = None  # reaped; one still serving drains when this driver is gone
        for key, value in self._warm_scope.items():
            if os.environ.get(key) == value:
                del os.environ[key]
        self._warm_scope = {}

        if self._dfk is not None:
            if self.lost() is not None:
                release_lost_executor(self._dfk)
            self._dfk.cleanup()
            self._dfk = None
            parsl.clear()

    def restart(self, why: str) -> bool:
        """A fresh Parsl load of the same site after its block failed to start or its interchange
        died (once per submission)."""
        if self._dfk is None or self._restarted:
            return False
        self._restarted = True
        self._record("block_restarted", f"the block is gone; loading Parsl again for a new block "
                     f"({why.splitlines()[0][:200]})", None)
        self._unload()
        self._load(self.site)
        return True

    def renew(self, excluded: list[str]) -> bool:
        """Replace the block by a new one that can still provide the stage's nodes (batch sites:
        the spares are spent). False where no new block can help (the local site)."""
        new_site = self.site.renewed(excluded)
        if new_site is None or self._dfk is None:
            return False
        self._record("block_renewed", f"spares spent ({len(excluded)} node(s) excluded): asking the provider for a "
                     f"new block of {new_site.block_nodes} node(s)", {"excluded": excluded})
        self._unload()
        self._load(new_site)
        return True
