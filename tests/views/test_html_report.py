"""`campaign report NAME --html OUT.html` (issue 42, item 4): one self-contained page of the
demo ledger (tests/views/conftest.py: a stall, an exclusion and a relaunch), checked as
text here and in a real headless Chromium in test_html_report_browser.py."""

from __future__ import annotations

import base64
import struct
import subprocess
import sys
import threading
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from campaign import htmlreport
from campaign.cli import main
from campaign.ledger import Ledger, reads, writes

REPO = Path(__file__).resolve().parents[2]
FORGED_NODE = 'x"><img src=x onerror=alert(1)>'
FORGED_LINE = "</pre></dd></dl><script>alert('evidence')</script><a href=\"http://evil.example/\">click</a>"
FORGED_REASON = "<b>bold</b> & <style>body{display:none}</style>"


class Page(HTMLParser):
    """What a browser would build of the page: tags with attributes, and the text."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.chunks: list[str] = []
        self.feed(text)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.chunks.append(data)

    @property
    def text(self) -> str:
        return "".join(self.chunks)

    def all(self, tag: str) -> list[dict[str, str | None]]:
        return [a for t, a in self.tags if t == tag]


def report(url: str, out: Path, *args: str) -> Any:
    return CliRunner().invoke(main, ["report", "demo-run", "--db", url, "--html", str(out), *args])


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_the_page_holds_every_table_and_its_plots_inline(demo_url, tmp_path):
    r = report(demo_url, tmp_path / "out" / "demo.html")
    assert r.exit_code == 0, r.output
    text = (tmp_path / "out" / "demo.html").read_text()
    page = Page(text)
    assert [s["id"] for s in page.all("section")] == ["stages", "plots", "attempts", "faults", "exclusions", "scaling",
                                                      "numbers", "events"]
    imgs = page.all("img")
    assert len(imgs) == 3  # progress, steps (with the relaunch), scaling; the demo has no goodput recorded
    for img in imgs:
        assert img["src"].startswith("data:image/png;base64,")
        assert png_size(base64.b64decode(img["src"].split(",", 1)[1])) == (int(img["width"]), int(img["height"]))
        assert img["alt"]
    for want in ("2/2 ranks reported; all-reduce 3 == 3; 5 steps, loss finite",  # a verdict
                 "efficiency at 2 node(s) 0.82", "stalled", "suspect node local-n1: no heartbeat for 30 s",
                 "stalled: no heartbeat for 30 s",  # the exclusion
                 "relaunch 1 (attempt 2) after hang: from the checkpoint of step 40", "24,981",  # an event, the scaling table
                 "3 of 3 stages passed · 5 attempts · 1 fault · 1 excluded node"):
        assert want in page.text, want
    # nothing to fetch: every src is inline, every link a fragment, and the policy forbids the rest
    assert {a["src"][:5] for a in imgs} == {"data:"}
    assert all(a["href"].startswith(("#", "data:")) for a in page.all("a") + page.all("link"))
    csp = [m for m in page.all("meta") if m.get("http-equiv") == "Content-Security-Policy"]
    assert csp and csp[0]["content"].startswith("default-src 'none'")
    assert not page.all("script") and "refresh" not in [m.get("http-equiv") for m in page.all("meta")]


def add_forged_rows(led: Ledger) -> None:
    """A crashed attempt whose node name, suspect reason, evidence lines, exclusion and event
    message are HTML (a trainer or a site may write any text)."""
    with led.session() as s:
        c = reads.get_campaign(s, "demo-run")
        run = reads.current_stage_runs(s, c)[2]
        a = writes.create_attempt(s, run, nodes=[FORGED_NODE, "local-n0"], ranks_per_node=1, run_dir="/w/long/a3",
                                  label=FORGED_REASON)
        suspects = [{"node": FORGED_NODE, "reason": FORGED_REASON, "evidence": {"lines": [FORGED_LINE, "second line"]}}]
        writes.finish_attempt(s, a, state="crashed_node", exit_code=1, suspects=suspects,
                              summary={"error": FORGED_LINE, "first_failure": {"rank": 1, "line": FORGED_LINE}})
        writes.exclude_node(s, site="local", node=FORGED_NODE, reason=FORGED_REASON, attempt=a,
                            evidence={"log_tail": [FORGED_LINE]})
        writes.add_event(s, c, "node_excluded", f"excluded {FORGED_NODE}: {FORGED_LINE}", stage_run=run, attempt=a)
        writes.set_stage_state(s, run, "failed", verdict=FORGED_REASON)


def test_ledger_strings_are_escaped_so_a_forged_evidence_line_stays_text(demo, demo_url, tmp_path):
    add_forged_rows(demo)
    r = report(demo_url, tmp_path / "forged.html")
    assert r.exit_code == 0, r.output
    text = (tmp_path / "forged.html").read_text()
    page = Page(text)
    assert not page.all("script") and not page.all("style")[1:]  # only the page's own style
    assert [a["src"][:22] for a in page.all("img")] == ["data:image/png;base64,"] * len(page.all("img"))
    assert not [a for a in page.all("a") if a["href"].startswith("http")]
    assert not [t for t, a in page.tags if any(k.startswith("on") for k in a)]
    for forged in (FORGED_NODE, FORGED_LINE, FORGED_REASON):
        assert forged not in text
        assert forged in page.text  # shown as the text it is
    assert text.count(htmlreport.e(FORGED_LINE)) >= 4  # the error, the suspect's lines, the exclusion, the event


def test_the_report_reads_only_the_ledger(demo_url, tmp_path):
    """No Parsl, no torch: the report is written on a login node as quickly as `status`."""
    code = ("import sys\nfrom campaign.cli import main\n"
            f"try:\n    main(['report', 'demo-run', '--db', {demo_url!r}, '--html', {str(tmp_path / 'r.html')!r}])\n"
            "except SystemExit as e:\n    assert not e.code, e.code\n"
            "print(sorted(m for m in ('torch', 'parsl') if m in sys.modules))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().splitlines()[-1] == "[]"
    assert (tmp_path / "r.html").stat().st_size > 10_000


@pytest.mark.parametrize("case", ["unknown", "path_name", "out_under_a_file"])
def test_bad_input_is_one_line_and_exit_2_and_writes_nothing(demo_url, tmp_path, case):
    (tmp_path / "afile").write_text("x")
    name, out = {"unknown": ("no-such", tmp_path / "r.html"), "path_name": ("../../tmp/x", tmp_path / "r.html"),
                 "out_under_a_file": ("demo-run", tmp_path / "afile" / "r.html")}[case]
    r = CliRunner().invoke(main, ["report", name, "--db", demo_url, "--html", str(out)])
    assert r.exit_code == 2, r.output
    assert r.output.startswith("error: ") and len(r.output.strip().splitlines()) == 1, r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "ledger.db"]


def test_watch_rewrites_the_page_by_renaming_until_the_campaign_ends(demo, tmp_path):
    from campaign import commands

    states = iter(["running", "running", "succeeded"])
    seen: list[tuple[int, bool, str]] = []
    out = tmp_path / "live.html"

    def fetch() -> dict[str, Any]:
        data = commands.report_data(demo, "demo-run", max_points=50)
        data["detail"]["state"] = next(states)
        return data

    def notify(line: str) -> None:
        text = out.read_text()
        seen.append((out.stat().st_ino, 'http-equiv="refresh" content="7"' in text, line))

    n = htmlreport.watch(fetch, out, interval=7, notify=notify, sleep=lambda s: None)
    assert n == 3
    assert [r for _, r, _ in seen] == [True, True, False]  # the last page stops reloading itself
    assert len({ino for ino, _, _ in seen}) == 3  # each write is a new file renamed over the old one
    assert "(campaign succeeded)" in seen[-1][2]
    assert sorted(p.name for p in tmp_path.iterdir() if "live" in p.name) == ["live.html"]  # no temporary file left

    def interrupted(_s: float) -> None:
        raise KeyboardInterrupt

    states = iter(["running"] * 5)
    assert htmlreport.watch(fetch, out, interval=7, sleep=interrupted) == 1  # Ctrl-C: the page written stays
    assert out.read_text().endswith("</html>\n")
    states = iter(["running"] * 5)
    assert htmlreport.watch(fetch, out, interval=7, count=2, sleep=lambda s: None) == 2


def test_a_reader_never_sees_half_a_page(tmp_path):
    """Rewrites of a 4 MB page while another thread reads it: every read is a whole page."""
    out = tmp_path / "r.html"
    pages = [("<!DOCTYPE html>" + c * 4_000_000 + "</html>\n") for c in "ab"]
    htmlreport.write(out, pages[0])
    stop = threading.Event()
    bad: list[int] = []

    def reader() -> None:
        while not stop.is_set():
            text = out.read_text()
            if text not in pages:
                bad.append(len(text))

    t = threading.Thread(target=reader)
    t.start()
    try:
        for i in range(30):
            htmlreport.write(out, pages[i % 2])
    finally:
        stop.set()
        t.join()
    assert bad == []


@pytest.mark.timeout(60)  # a --watch that ignores its bounds never returns
def test_report_watch_on_the_command_line_returns_and_writes_the_page(demo_url, tmp_path):
    """`campaign report NAME --html OUT --watch`: on a finished campaign one write, then it
    returns; on a running one `--count` bounds it (each write said on stderr)."""
    out = tmp_path / "share" / "live.html"
    r = CliRunner().invoke(main, ["report", "demo-run", "--db", demo_url, "--html", str(out), "--watch",
                                  "--interval", "1"])
    assert r.exit_code == 0, r.output
    page = out.read_text()
    assert page.endswith("</html>\n") and "<title>campaign demo-run — succeeded</title>" in page
    assert 'http-equiv="refresh"' not in page  # the last write: nothing more to reload
    assert r.stderr.count(f"{out}: written at") == 1 and "(campaign succeeded)" in r.stderr, r.stderr

    import sqlite3

    with sqlite3.connect(demo_url.removeprefix("sqlite:///")) as db:
        db.execute("UPDATE campaign SET state = 'running' WHERE name = 'demo-run'")
    out.unlink()
    r = CliRunner().invoke(main, ["report", "demo-run", "--db", demo_url, "--html", str(out), "--watch",
                                  "--interval", "1", "--count", "2"])
    assert r.exit_code == 0, r.output
    assert r.stderr.count(f"{out}: written at") == 2 and r.stderr.count("(campaign running)") == 2, r.stderr
    assert out.read_text().endswith("</html>\n")
