"""The HTML report of a real campaign drilled with a kill (issue 42): a long run whose rank on
local-n0 is SIGKILLed at step 12, its node excluded and the run relaunched; `campaign report`
then writes the page, which loads in headless Chromium (tests/views/browser.py) with no
error, shows its plots, and holds the fault with its evidence and the exclusion."""

from __future__ import annotations

import json
import sys

import pytest
from e2e_helpers import REPO, Workspace, tiny_spec

sys.path.insert(0, str(REPO / "tests" / "views"))
from browser import Browser, chromium_binary  # noqa: E402

pytestmark = pytest.mark.slow


def test_the_report_of_a_campaign_drilled_with_a_kill_opens_in_chromium(ws: Workspace) -> None:
    stage = {"name": "long", "kind": "long_run", "nodes": 2, "steps": 24, "checkpoint_every": 6, "max_attempts": 3,
             "backoff_s": 0, "timeout_s": 300,
             "faults": [{"kind": "sigkill", "step": 12, "node": "local-n0", "attempt": 1}]}
    spec = ws.write_spec(tiny_spec("drilled", [{"name": "smoke", "kind": "smoke", "steps": 3}, stage]))
    r = ws.cli("submit", str(spec), CAMPAIGN_ALLOW_FAULTS="1")
    assert r.code == 0, r.out + r.err
    out = ws.root / "share" / "drilled.html"
    r = ws.cli("report", "drilled", "--html", str(out))
    assert r.code == 0 and r.out.strip() == str(out), r.err
    with Browser(chromium_binary()) as b:
        page = b.open(out, width=1280, height=2000)
        assert page.problems == []
        images = json.loads(page.evaluate(
            "JSON.stringify([...document.images].map(i => [i.complete, i.naturalWidth, +i.getAttribute('width')]))"))
        assert len(images) == 3 and all(c and w > 0 and w == a for c, w, a in images), images  # progress, steps, goodput
        faults = page.evaluate("document.getElementById('faults').innerText")
        excluded = page.evaluate("document.getElementById('exclusions').innerText")
        header = page.evaluate("document.querySelector('header').innerText")
        page.screenshot(ws.root / "drilled.png")
    assert "long · attempt 1" in faults and "crashed_node" in faults and "exit 137" in faults
    assert "suspect node local-n0" in faults and "SIGKILL" in faults and "rank-0.log" in faults
    assert "local-n0" in excluded and "SIGKILL" in excluded
    assert "2 of 2 stages passed" in header and "1 fault" in header and "ETTR" in header
