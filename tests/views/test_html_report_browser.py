"""The HTML report in a real headless Chromium (Debian's package, installed when missing;
tests/views/browser.py drives it through the DevTools protocol): it loads with no console
error, no failed load and no policy violation, its plots decode and render at their size,
forged ledger strings stay text, and its screenshot is a painted page.

Control: the same checks catch a page that runs a script or fetches an image.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from browser import Browser, chromium_binary
from click.testing import CliRunner
from matplotlib import image as mpimg
from test_html_report import FORGED_LINE, FORGED_NODE, FORGED_REASON, add_forged_rows

from campaign.cli import main

IMAGES = """JSON.stringify([...document.images].map(i => ({src: i.src.slice(0, 22), complete: i.complete,
    natural: [i.naturalWidth, i.naturalHeight], attr: [+i.getAttribute('width'), +i.getAttribute('height')], shown: i.getBoundingClientRect().width})))"""


@pytest.fixture(scope="module")
def browser():
    with Browser(chromium_binary()) as b:
        yield b


def test_the_report_loads_cleanly_and_its_plots_render_in_chromium(demo, demo_url, tmp_path, browser):
    add_forged_rows(demo)
    out = tmp_path / "report.html"
    r = CliRunner().invoke(main, ["report", "demo-run", "--db", demo_url, "--html", str(out)])
    assert r.exit_code == 0, r.output
    page = browser.open(out, width=1280, height=2000)
    assert page.problems == []
    images = json.loads(page.evaluate(IMAGES))
    assert len(images) == 3
    for img in images:
        assert img["src"] == "data:image/png;base64," and img["complete"]
        assert img["natural"][0] > 0 and img["natural"] == img["attr"], img  # decoded, at the size the page says
        assert 0 < img["shown"] <= 1280
    assert page.evaluate("document.scripts.length") == 0
    assert page.evaluate("document.title") == "campaign demo-run — succeeded"
    # the forged strings are text in the DOM, where they were put
    nodes = json.loads(page.evaluate("JSON.stringify([...document.querySelectorAll('b.node')].map(n => n.textContent))"))
    assert FORGED_NODE in nodes and "local-n1" in nodes
    pres = json.loads(page.evaluate("JSON.stringify([...document.querySelectorAll('pre')].map(n => n.textContent))"))
    assert sum(FORGED_LINE in p for p in pres) >= 2
    assert page.evaluate("document.body.innerText").count(FORGED_REASON) >= 2
    assert page.evaluate("[...document.querySelectorAll('a')].every(a => a.getAttribute('href').startsWith('#'))")
    shot = page.screenshot(tmp_path / "report.png")
    pixels = mpimg.imread(shot)
    assert pixels.shape[:2] == (2000, 1280)
    # painted: not one colour, and the plots' pixels (the first is 1000 px wide) are there
    assert len(np.unique(pixels.reshape(-1, pixels.shape[-1]), axis=0)) > 100


def test_the_checks_catch_a_page_that_fetches_or_runs_something(demo_url, tmp_path, browser):
    """A report with an image from the network and a script slipped in: the page's policy
    blocks both, and the blocks are reported (what the test above asserts is absent)."""
    out = tmp_path / "report.html"
    assert CliRunner().invoke(main, ["report", "demo-run", "--db", demo_url, "--html", str(out)]).exit_code == 0
    out.write_text(out.read_text().replace(
        "<main>", '<main><img src="http://127.0.0.1:9/x.png"><script>document.title = "ran"</script>', 1))
    page = browser.open(out)
    problems = page.problems
    assert any("Content Security Policy" in p and "127.0.0.1:9/x.png" in p for p in problems), problems
    assert any("Content Security Policy" in p and "script" in p for p in problems), problems
    assert page.evaluate("document.title") != "ran"
