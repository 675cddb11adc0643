"""Terminal views (status list, one campaign in detail, live progress) rendered into a
fixed-width console and compared with stored text (tests/views/golden/)."""

from __future__ import annotations

import json
from io import StringIO
from typing import Any

import pytest
import sqlalchemy as sa

from campaign import summary
from campaign.ledger import Ledger
from campaign.ledger import reads, writes
from campaign.progress import Progress
from campaign.stagebase import Verdict
from campaign.views import campaign_detail, campaigns_table

STAGE_KEYS = {"name", "kind", "state", "attempts", "tokens", "last_loss", "verdict", "goodput", "checkpoint_interval"}
DETAIL_KEYS = {"site", "version", "updated", "attempts_detail", "stage_numbers", "exclusions", "scaling", "events",
               "warnings", "driver", "running"}


def render(renderable: Any) -> str:
    from rich.console import Console

    out = StringIO()
    Console(file=out, width=120, force_terminal=False, color_system=None).print(renderable)
    return out.getvalue()


def _detail(led: Ledger) -> dict[str, Any]:
    with led.session() as s:
        c = reads.get_campaign(s, "demo-run")
        assert c is not None
        return summary.describe_campaign(s, c)


def test_campaign_detail_shows_relaunch_and_excluded_node(demo: Ledger, golden: Any) -> None:
    text = render(campaign_detail(_detail(demo)))
    golden("status_detail.txt", text)
    assert "relaunch" in text and "stalled" in text and "local-n1" in text and "scaling table" in text


def test_campaign_list(demo_url: str, run_cli: Any, golden: Any) -> None:
    code, out, err = run_cli("status", "--db", demo_url)
    assert code == 0, err
    golden("status_list.txt", out)


def test_detail_keys_are_additions_only(demo: Ledger) -> None:
    d = _detail(demo)
    assert set(d) == {"name", "state", "stages", "excluded_nodes", "goodput"} | DETAIL_KEYS
    assert all(set(st) == STAGE_KEYS for st in d["stages"])
    assert d["excluded_nodes"] == ["local-n1"]
    assert [(a["stage"], a["number"], a["state"]) for a in d["attempts_detail"]][-2:] == [
        ("long-run", 1, "stalled"), ("long-run", 2, "succeeded")]
    assert d["scaling"][0]["rows"][1]["efficiency"] == pytest.approx(0.824)


def test_status_json_shape_is_unchanged(demo_url: str, run_cli: Any) -> None:
    code, out, err = run_cli("status", "demo-run", "--json", "--db", demo_url)
    assert code == 0, err
    d = json.loads(out)
    assert set(d) - DETAIL_KEYS == {"name", "state", "stages", "excluded_nodes", "goodput"}
    assert [set(st) for st in d["stages"]] == [STAGE_KEYS] * 3
    assert (d["name"], d["state"], d["excluded_nodes"]) == ("demo-run", "succeeded", ["local-n1"])
    assert d["stages"][2] == {"name": "long-run", "kind": "long_run", "state": "passed", "attempts": 2,
                              "tokens": 51200, "last_loss": pytest.approx(1.724286), "verdict": d["stages"][2]["verdict"],
                              "goodput": d["stages"][2]["goodput"], "checkpoint_interval": None}


def test_status_never_reads_step_metrics(demo: Ledger) -> None:
    statements: list[str] = []
    sa.event.listen(demo.engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    _detail(demo)
    assert statements and not [s for s in statements if "step_metric" in s]


def test_watch_prints_on_change_and_stops(demo_url: str, run_cli: Any, demo: Ledger) -> None:
    code, out, _ = run_cli("status", "demo-run", "--watch", "--interval", "0.1", "--db", demo_url)
    assert code == 0 and out.count("campaign demo-run") == 1  # not running: one view, then stop
    with demo.session() as s:
        writes.set_campaign_state(s, reads.get_campaign(s, "demo-run"), "running")
    code, out, _ = run_cli("status", "demo-run", "--watch", "--interval", "0.1", "--count", "3", "--db", demo_url)
    assert code == 0 and out.count("campaign demo-run") == 1  # unchanged: printed once in a log
    assert "\x1b" not in out


def _drive(p: Progress, clock: list[float]) -> None:
    p.campaign_started("demo-run", "sqlite:///ledger.db", 1)
    p.stage_started("long-run", "long_run", 0, 1)
    p.attempt_started("long-run", 1, 2, 100, "")
    for step in (1, 20, 40, 60):
        clock[0] += 4.0
        p.steps("long-run", {"step": step, "tokens": 512 * step, "loss": 6 / (1 + step / 40), "tokens_per_s": 12800.0,
                             "step_time_s": 0.04}, 100)
    p.event("watchdog: no heartbeat from local-n1 for 30 s; killing the job (exit 124)")
    p.attempt_finished("long-run", 1, {"exit_class": "stalled", "exit_code": 124, "duration_s": 16.0, "last_step": 60,
                                       "nodes": ["local-n0", "local-n1"],
                                       "suspects": [{"node": "local-n1", "reason": "no heartbeat"}]})
    p.event("excluded local-n1 on site local for 24 h: no heartbeat; lift: campaign nodes include local-n1 --site local")
    p.event("relaunch 1 (attempt 2) after hang: from the checkpoint of step 40; 20 step(s) lost [stalled, exit 124]")
    p.attempt_started("long-run", 2, 2, 100, "")
    for step in (41, 100):
        clock[0] += 4.0
        p.steps("long-run", {"step": step, "tokens": 512 * step, "loss": 6 / (1 + step / 40)}, 100)
    p.attempt_finished("long-run", 2, {"exit_class": "succeeded", "exit_code": 0, "duration_s": 8.0, "last_step": 100,
                                       "nodes": ["local-n0", "local-n2"]})
    p.stage_finished("long-run", Verdict(True, "reached 100 steps in 2 attempt(s)"))
    p.campaign_finished({"name": "demo-run", "state": "succeeded", "stages": [
        {"name": "long-run", "kind": "long_run", "state": "passed", "attempts": 2, "tokens": 51200, "last_loss": 1.2,
         "verdict": "reached 100 steps in 2 attempt(s)"}], "excluded_nodes": ["local-n1"]})


def test_progress_in_a_plain_log(golden: Any) -> None:
    out, clock = StringIO(), [0.0]
    _drive(Progress(out, interval=10.0, clock=lambda: clock[0]), clock)
    text = out.getvalue()
    assert "\x1b" not in text and "\r" not in text
    golden("progress_log.txt", text)
    assert "long-run #1: step 1/100" in text and "step 20/100" not in text  # at most one line per 10 s
    assert "eta 0:00:" in text


def test_progress_on_a_terminal_draws_bars_and_events() -> None:
    out, clock = StringIO(), [0.0]
    p = Progress(out, force_terminal=True, clock=lambda: clock[0])
    _drive(p, clock)
    text = out.getvalue()
    assert "relaunch 1 (attempt 2) after hang" in text and "excluded local-n1" in text and "long-run #2" in text
    assert p._bars is None  # stopped at the end of the campaign


def test_campaigns_table_renders_rows() -> None:
    text = render(campaigns_table([{"name": "a", "site": "local", "state": "running", "stage": "long-run",
                                    "tokens": 7_771_000_000_000, "last_loss": 2.033, "updated": "2026-11-29 08:00"}]))
    assert "7.77T" in text and "2.0330" in text


def test_the_attempts_table_shows_each_label_once() -> None:
    """A relaunch's own label ("relaunch 1", "confirming retry") is shown as it is (it was
    printed "relaunch relaunch 1"); an unlabelled attempt after a failed one reads "relaunch K"
    for attempt K + 1, the one numbering status, events, plots and export share."""
    from rich.console import Console

    from campaign.views import attempts_table

    def row(number: int, label: str, state: str) -> dict:
        return {"stage": "long", "number": number, "label": label, "state": state, "exit_code": 0, "first_step": 1,
                "last_step": 10, "tokens": 100, "last_loss": 1.0, "duration_s": 1.0, "nodes": ["n1"], "node_count": 1}

    console = Console(width=200, record=True)
    console.print(attempts_table([row(1, "", "stalled"), row(2, "relaunch 1", "crashed_unknown"),
                                  row(3, "confirming retry", "stalled"), row(4, "", "succeeded")]))
    text = console.export_text()
    assert "relaunch relaunch" not in text and "relaunch confirming" not in text
    assert "relaunch 1" in text and "confirming retry" in text
    assert [line.split("│")[3].strip() for line in text.splitlines() if line.startswith("│")][-1] == "relaunch 3"


def _history() -> list[dict]:
    """A long run's three attempts as the 124m relaunch benchmark left them (a kill, a hang)."""
    def row(number: int, label: str, state: str, code: int, steps: tuple[int, int], suspects: list[str]) -> dict:
        return {"stage": "long-run", "number": number, "label": label, "state": state, "exit_code": code,
                "first_step": steps[0], "last_step": steps[1], "tokens": 8192 * steps[1], "last_loss": 1.4979,
                "duration_s": 35.2, "nodes": ["local-n0"], "node_count": 1, "suspects": suspects}
    return [row(1, "", "crashed_unknown", 137, (1, 44), []),
            row(2, "relaunch 1, confirming retry", "stalled", 124, (21, 94), ["local-n0"]),
            row(3, "", "succeeded", 0, (81, 120), [])]


def test_the_attempts_read_whole_at_80_columns() -> None:
    """At 80 columns the ten-column table cut every cell (`lon…`, `…`) and dropped the nodes;
    there each attempt takes two lines instead, every value whole."""
    from rich.console import Console

    from campaign.views import AttemptsView

    console = Console(width=80, record=True, color_system=None)
    console.print(AttemptsView(_history()))
    text = console.export_text()
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= 80
    assert "long-run #1  crashed_unknown (exit 137)  steps 1-44" in text
    assert "\n    took 35.2 s; relaunch 1, confirming retry; nodes 1:" in text  # wrapped from here
    assert "took 35.2 s; relaunch 1, confirming retry; nodes 1: local-n0 (suspects: local-n0)" in " ".join(text.split())
    assert "long-run #3  succeeded (exit 0)  steps 81-120" in text and "relaunch 2; nodes 1: local-n0" in text


def test_the_attempts_table_where_it_fits_and_not_one_column_less() -> None:
    from rich.console import Console

    from campaign.views import AttemptsView

    view = AttemptsView(_history(), caption="the last 3 of 3 attempts")
    for width, table in ((view.width(), True), (view.width() - 1, False)):
        console = Console(width=width, record=True, color_system=None)
        console.print(view)
        text = console.export_text()
        assert ("exit class" in text) is table, width
        assert "…" not in text, text
        assert "the last 3 of 3 attempts" in text


def test_a_running_attempt_at_80_columns_shows_what_it_has() -> None:
    from rich.console import Console

    from campaign.views import AttemptsView

    running = {**_history()[0], "number": 4, "state": "running", "exit_code": None, "first_step": None,
               "last_step": None, "tokens": None, "last_loss": None, "duration_s": None, "suspects": []}
    console = Console(width=80, record=True, color_system=None)
    console.print(AttemptsView([*_history(), running]))
    lines = console.export_text().splitlines()
    i = lines.index("long-run #4  running")
    assert lines[i + 1] == "    nodes 1: local-n0"  # no "steps -", "- tok", "took -"
