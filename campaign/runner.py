"""Attempt runners: how the driver has the supervisor run one attempt's request.

    future = run_in_thread(request)     # the supervisor in a thread of this process; no Parsl
    report = future.result()            # the supervisor's report (a plain dict)

The engine's default runner is the supervisor as a Parsl app on the site's block
(`campaign.block.Block.start`); tests and a driver that runs on the node itself pass
`runner=run_in_thread`.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from campaign.attempt import AttemptRequest

AttemptRunner = Callable[[AttemptRequest], "Future[dict[str, Any]]"]
"""Runs the supervisor for a request somewhere and returns a future of its report."""


def run_in_thread(request: AttemptRequest) -> Future[dict[str, Any]]:
    """An attempt runner without Parsl: the supervisor in a thread of this process (tests,
    and a machine where the driver runs on the node itself)."""
    from campaign.supervisor import supervise

    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="supervisor")
    future = pool.submit(supervise, request)
    pool.shutdown(wait=False)
    return future
