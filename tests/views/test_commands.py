"""campaign.commands, called as plain functions on a real SQLite ledger (the demo ledger of
conftest.py): what the CLI and the remote endpoint functions both return."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from campaign import commands, export
from campaign.errors import CampaignError
from campaign import summary
from campaign.ledger import Ledger, reads, writes

REPO = Path(__file__).resolve().parents[2]


def test_commands_run_without_click(demo_url: str) -> None:
    """A fresh interpreter where `import click` fails: status, plot data and export still work."""
    code = textwrap.dedent(f"""
        import json, sys
        sys.modules["click"] = None  # any import of click now raises ImportError
        from campaign import commands
        from campaign.ledger import open_ledger
        led = open_ledger({demo_url!r}, create=False)
        detail = commands.status_data(led, "demo-run")
        rows = list(commands.export_rows(led, "demo-run", "steps"))
        data = commands.plot_data(led, ["demo-*"], "scaling")
        print(json.dumps([detail["state"], len(rows), data["names"]]))
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == ["succeeded", 5 + 40 + 60 + 60, ["demo-run"]]


def test_status_data_lists_and_describes(demo: Ledger) -> None:
    rows = commands.status_data(demo, None)
    assert [(r["name"], r["state"], r["stage"]) for r in rows] == [("demo-run", "succeeded", "long-run")]
    detail = commands.status_data(demo, "demo-run")
    with demo.session() as s:
        assert detail == summary.describe_campaign(s, reads.get_campaign(s, "demo-run"))


def test_a_missing_campaign_names_the_ledger_and_its_campaigns(demo: Ledger) -> None:
    for call in (lambda: commands.status_data(demo, "nope"), lambda: commands.plot_data(demo, ["nope"]),
                 lambda: commands.export_rows(demo, "nope", "steps"),
                 lambda: commands.cancel_campaign(demo, "nope", 1.0)):
        with pytest.raises(CampaignError, match=r"no campaign named 'nope' in sqlite:///.*ledger\.db \(campaigns: demo-run\)"):
            call()


@pytest.mark.parametrize("max_rows", [1, 7, 59, 60, 1000])
def test_export_pages_cover_every_step_once(demo: Ledger, max_rows: int) -> None:
    pages = []
    rows = list(commands.iter_pages(lambda cursor: pages.append(cursor) or commands.export_page(
        demo, "demo-run", "steps", cursor, max_rows=max_rows)))
    with demo.session() as s:
        every = list(reads.iter_campaign_steps(s, reads.get_campaign(s, "demo-run")))
    assert rows == every
    assert len(pages) == len(every) // max_rows + 1  # a full last page is followed by an empty one


def test_export_pages_are_also_cut_by_size(demo: Ledger) -> None:
    page = commands.export_page(demo, "demo-run", "steps", None, max_rows=10_000, max_bytes=2_000)
    assert 5 <= len(page["rows"]) < 20 and page["cursor"] is not None


def test_export_writes_attempts_and_nodes(demo: Ledger, tmp_path: Path) -> None:
    out = tmp_path / "attempts.json"
    with out.open("w") as f:
        n = commands.write_export(commands.export_rows(demo, "demo-run", "attempts"), "attempts", "json", f)
    attempts = json.loads(out.read_text())
    assert n == len(attempts) == 5 and list(attempts[0]) == list(export.ATTEMPT_COLUMNS)
    assert [a["state"] for a in attempts] == ["succeeded", "succeeded", "succeeded", "stalled", "succeeded"]
    nodes = list(commands.export_rows(demo, "demo-run", "nodes"))
    n1 = next(n for n in nodes if n["node"] == "local-n1")
    assert n1["excluded"] and n1["suspect"] == 1


def test_plot_data_and_the_file_it_draws(demo: Ledger, tmp_path: Path) -> None:
    data = commands.plot_data(demo, ["demo-run"], "steps")
    assert [[s["stage"] for s in one] for one in data["series"]] == [["long-run", "long-run"]]  # the most steps
    path = commands.draw_plot(json.loads(json.dumps(data)), "steps", tmp_path)  # as it arrives from an endpoint
    assert path == tmp_path / "demo-run-steps.png" and path.read_bytes()[:4] == b"\x89PNG"
    scaling = commands.plot_data(demo, ["demo-run"], "scaling")
    assert [label for label, _ in scaling["tables"]] == ["scaling"]
    assert commands.draw_plot(scaling, "scaling", tmp_path).name == "demo-run-scaling.png"
    assert commands.plot_path(["a", "b", "c", "d"], "progress", tmp_path).name == "a+3-more-progress.png"


def test_plot_without_a_scaling_table_says_what_to_run(demo: Ledger, tmp_path: Path) -> None:
    curves = export.read_curves(REPO / "examples" / "auroragpt-progress.csv", run="256N")
    commands.import_reference(demo, commands.reference_targets("agpt", curves, "256N"), source="auroragpt-progress.csv")
    data = commands.plot_data(demo, ["agpt"], "scaling")
    with pytest.raises(CampaignError, match="no scaling table in agpt: run a scaling stage first"):
        commands.draw_plot(data, "scaling", tmp_path / "plots")
    assert not (tmp_path / "plots").exists()


def test_import_reference_refuses_a_live_campaign_and_replaces_an_imported_one(demo: Ledger) -> None:
    curves = export.read_curves(REPO / "examples" / "auroragpt-progress.csv")
    with pytest.raises(CampaignError, match="'demo-run' exists .* not an imported one"):
        commands.import_reference(demo, {"demo-run": curves["256N"]}, source="x.csv")
    targets = commands.reference_targets("agpt", curves)
    assert list(targets) == [f"agpt-{run}" for run in curves]
    made = commands.import_reference(demo, targets, source="auroragpt-progress.csv")
    assert [m.split(":")[0] for m in made] == list(targets)
    with pytest.raises(CampaignError, match="pass --replace"):
        commands.import_reference(demo, targets, source="auroragpt-progress.csv")
    again = commands.import_reference(demo, targets, source="auroragpt-progress.csv", replace=True)
    assert again == made


def test_nodes_exclude_list_include(demo: Ledger) -> None:
    commands.exclude_node(demo, "x9", "local", "flaky NIC", hours=2)
    rows = commands.list_exclusions(demo, "local")
    assert {r["node"]: r["reason"] for r in rows}["x9"] == "flaky NIC"
    assert commands.include_node(demo, "x9", "local") == 1
    assert "x9" not in {r["node"] for r in commands.list_exclusions(demo, "local")}
    assert "x9" in {r["node"] for r in commands.list_exclusions(demo, "local", show_all=True)}
    with pytest.raises(CampaignError, match="x9 is not excluded on local"):
        commands.include_node(demo, "x9", "local")


# --- cancel: a real process holds the lease ---------------------------------------------

def test_cancel_stops_the_driver_that_holds_the_lease(demo: Ledger, demo_url: str, lease_holder) -> None:
    with pytest.raises(CampaignError, match="'demo-run' is not running"):
        commands.cancel_campaign(demo, "demo-run", 1.0)
    driver = lease_holder(demo_url, "demo-run")
    heard: list[str] = []
    assert commands.cancel_campaign(demo, "demo-run", 30.0, notify=heard.append, poll_s=0.05) == "cancelled"
    assert heard == [f"asked the driver of demo-run (pid {driver.pid}) to stop"]
    assert driver.wait(timeout=10) == 0


def test_cancel_reports_the_state_the_driver_left_when_it_stops_between_two_reads(
        demo: Ledger, demo_url: str, lease_holder, monkeypatch: pytest.MonkeyPatch) -> None:
    """The interleaving CI met once under load (the campaign read as 'succeeded'): the cancel
    reads the campaign, the driver then commits its state and drops its lease in one
    transaction, and the cancel reads the lease as gone. On SQLite each SELECT is its own
    snapshot, so the state read first is the old one; the cancel must read it again. The
    driver's stop is forced between the two reads here (its own process, the real ledger)."""
    import os
    import signal

    driver = lease_holder(demo_url, "demo-run")
    real = reads.get_lease
    polls = {"n": 0}

    def get_lease(s, c):  # type: ignore[no-untyped-def]
        polls["n"] += 1
        if polls["n"] == 2:  # the first poll after the SIGTERM: let the driver stop right here
            os.kill(driver.pid, signal.SIGCONT)
            driver.wait(timeout=10)
        return real(s, c)

    os.kill(driver.pid, signal.SIGSTOP)  # it handles the cancel's SIGTERM only once let go, above
    monkeypatch.setattr(reads, "get_lease", get_lease)
    assert commands.cancel_campaign(demo, "demo-run", 30.0, poll_s=0.05) == "cancelled"


def test_cancel_refuses_a_driver_elsewhere_or_gone(demo: Ledger) -> None:
    with demo.session() as s:
        writes.take_lease(s, reads.get_campaign(s, "demo-run"), host="login-7", pid=4242, token="t", ttl_s=60)
    with pytest.raises(CampaignError, match="driven from login-7 .pid 4242.; run `campaign cancel` there"):
        commands.cancel_campaign(demo, "demo-run", 1.0)



def test_cancel_of_a_campaign_whose_driver_is_gone_records_it_cancelled(demo: Ledger) -> None:
    """Issue 39 item 3: before, "the driver is gone; campaign resume recovers it" while its
    ranks trained on. Now cancel takes the dead driver's lease, stops what it left (as resume
    would; tests/e2e/test_takeover.py drives real ranks) and records the campaign cancelled."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with demo.session() as s:
        c = reads.get_campaign(s, "demo-run")
        c.spec_source = "name: demo-run\nsite: {kind: local, nodes: 2}\nstages: [{name: smoke, kind: smoke}]\n"
        writes.take_lease(s, c, host=socket.gethostname(), pid=dead.pid, token="t", ttl_s=60)
    heard: list[str] = []
    assert commands.cancel_campaign(demo, "demo-run", 1.0, notify=heard.append) == "cancelled"
    assert heard[0] == "the driver of demo-run is gone: stopping what it left running, as `campaign resume demo-run` would"
    with demo.session() as s:
        c = reads.get_campaign(s, "demo-run")
        assert c.state == "cancelled" and reads.get_lease(s, c) is None
        assert all(a.state != "running" for r in reads.current_stage_runs(s, c) for a in r.attempts)
        assert all(r.state != "running" for r in reads.current_stage_runs(s, c))
