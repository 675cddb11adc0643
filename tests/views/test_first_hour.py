"""Issue 40: what a new user types and sees in the first hour tells the truth and works as
printed. Each test below failed on the code before issue 40 (the case it names in a
comment); they run on a ledger built with the query functions, as the other view tests.

A running campaign's driver is this test process (a lease with our pid on this host is
live: `lease.driver_alive`), or a process that has exited (a dead driver)."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from io import StringIO
from pathlib import Path
from typing import Any

import pytest

from campaign import commands
from campaign.errors import CampaignError
from campaign.exits import ExitClass
from campaign.ledger import Ledger, open_ledger, reads, writes


def steps(first: int, last: int, per_step: int = 512) -> list[dict[str, Any]]:
    """Step rows as tests/views/conftest.py makes them: loss 6 / (1 + step / 40), 40 ms a step."""
    return [{"step": i, "tokens": per_step * i, "loss": round(6.0 / (1 + i / 40), 6), "step_time_s": 0.04,
             "tokens_per_s": per_step / 0.04} for i in range(first, last + 1)]

EVENTS = 9
EXCLUDED = ("local-n1", *(f"local-n{i}" for i in range(3, 15)))


def watch_view(*args: Any) -> Any:
    from campaign.views import watch_view as view

    return view(*args)


def render(renderable: Any, width: int = 80) -> str:
    from rich.console import Console

    out = StringIO()
    Console(file=out, width=width, force_terminal=False, color_system=None).print(renderable)
    return out.getvalue()


def _running_campaign(led: Ledger, tmp_path: Path, *, pid: int | None = None) -> None:
    """Campaign `live`: a long run whose attempt 1 stalled at step 60 (local-n1 excluded for
    this campaign, after a drill), attempt 2 (relaunch 1) running on local-n0 and local-n2 at
    step 88 of 157, 40 ms a step; more events and exclusions than a 24-line screen holds."""
    now = time.time()
    with led.session() as s:
        c = writes.create_campaign(s, name="live", digest="cd" * 32, spec_json={"name": "live"}, source="",
                                   site="local", workdir=str(tmp_path / "live"))
        smoke, long_run = writes.ensure_stage_runs(s, c, [("smoke", "smoke"), ("long-run", "long_run")])
        writes.set_campaign_state(s, c, "running")
        writes.set_stage_state(s, smoke, "passed", verdict="3/3 ranks reported")
        writes.set_stage_state(s, long_run, "failed", verdict="cancelled by the user at step 12")  # an earlier run
        writes.set_stage_state(s, long_run, "running")
        # Rows as the driver writes them (the columns issue 40 added are set as attributes, so
        # that the tests can be run against the code before it, to see them fail).
        a1 = writes.create_attempt(s, long_run, nodes=["local-n0", "local-n1"], ranks_per_node=1,
                                   run_dir=str(tmp_path / "a1"))
        a1.target_steps = 157
        writes.ingest_steps(s, a1, steps(1, 60))
        writes.finish_attempt(s, a1, state="stalled", exit_code=124, suspects=[], summary={})
        drill = writes.exclude_node(s, site="local", node="local-n1", reason="stalled: computing step 61", attempt=a1)
        drill.campaign_id = c.id
        for node in EXCLUDED[1:]:
            writes.exclude_node(s, site="local", node=node, reason="a failing DIMM (site-wide)")
        a2 = writes.create_attempt(s, long_run, nodes=[], ranks_per_node=1, run_dir=str(tmp_path / "a2"),
                                   label="relaunch 1")
        a2.target_steps = 157
        a2.nodes = ["local-n0", "local-n2"]
        writes.ingest_steps(s, a2, [{**r, "time": now - (88 - r["step"]) * 0.04} for r in steps(61, 88)])
        for i in range(EVENTS):
            writes.add_event(s, c, "watchdog", f"event number {i} with a message long enough to need the ellipsis "
                             "at eighty columns, which the screen shows", stage_run=long_run)
        writes.take_lease(s, c, host=socket.gethostname(), pid=pid or os.getpid(), token="t", ttl_s=60)


@pytest.fixture
def live(tmp_path: Path) -> Any:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    led = open_ledger(url)
    _running_campaign(led, tmp_path)
    yield led, url
    led.close()


# --- status: the running attempt, in one screen --------------------------------------

def test_status_shows_step_target_eta_rate_loss_and_nodes_of_the_running_attempt(live: Any, run_cli: Any) -> None:
    """Before: `status NAME --watch` (and plain `status NAME`) showed no step, target, ETA or
    tokens/s, and a running attempt showed `nodes 0`."""
    led, url = live
    d = commands.status_data(led, "live")
    [a] = d["running"]
    assert (a["stage"], a["number"], a["step"], a["target"], a["nodes"]) == ("long-run", 2, 88, 157,
                                                                            ["local-n0", "local-n2"])
    assert a["step_time_s"] == pytest.approx(0.04, rel=0.01) and a["eta_s"] == pytest.approx(69 * 0.04, rel=0.01)
    assert a["tokens_per_s"] == pytest.approx(512 / 0.04)
    text = render(watch_view(d, 80, 24))
    assert "long-run #2 (relaunch 1): step 88/157 (56%)  eta 0:00:03  12.8K tok/s\n" in text
    silent = render(watch_view({**d, "running": [{**a, "last_step_age_s": 12.0}]}, 80, 24))
    assert "long-run #2 (relaunch 1): step 88/157 (56%)  no new step for 12.0 s\n" in silent
    assert "  loss 1.8750  45.1K tok  40 ms/step  2 nodes: local-n0, local-n2\n" in text
    # Plain `campaign status NAME`, as a user types it: the same two lines, above the tables.
    code, out, err = run_cli("status", "live", "--db", url)
    assert code == 0, err
    lines = out.splitlines()
    assert "long-run #2 (relaunch 1): step 88/157 (56%)  eta 0:00:03  12.8K tok/s" in lines
    assert "  loss 1.8750  45.1K tok  40 ms/step  2 nodes: local-n0, local-n2" in lines


def test_the_watch_screen_fits_24x80_and_counts_what_it_leaves_out(live: Any) -> None:
    """Before: in a 24-line terminal the exclusions and events were cut off silently."""
    led, _ = live
    text = render(watch_view(commands.status_data(led, "live"), 80, 24))
    lines = text.splitlines()
    assert len(lines) <= 23 and max(len(line) for line in lines) <= 80
    assert lines[-1].startswith("... ") and lines[-1].endswith("not shown: campaign status live")
    hidden = {what: int(n) for n, what in re.findall(r"(\d+) (excluded node|event)\(s\)", lines[-1])}
    assert sum(1 for line in lines if "event number" in line) + hidden.get("event", 0) == 5  # the newest five
    assert sum(1 for line in lines if line.startswith("  excluded ")) + hidden.get("excluded node", 0) == len(EXCLUDED)
    assert sum(hidden.values()) > 0
    assert "excluded local-n1 (this campaign)" in text
    # A tall terminal shows it all, and no summary line.
    tall = render(watch_view(commands.status_data(led, "live"), 80, 80)).splitlines()
    assert not tall[-1].startswith("... ") and sum("event number" in line for line in tall) == 5


def test_the_stale_verdict_of_an_earlier_run_is_not_shown_while_the_stage_runs(live: Any) -> None:
    """Before: a running stage kept the verdict of an earlier cancel."""
    led, _ = live
    d = commands.status_data(led, "live")
    assert d["stages"][1]["state"] == "running" and d["stages"][1]["verdict"] is None


def test_a_campaign_whose_driver_is_gone_is_not_running(live: Any, run_cli: Any) -> None:
    """Before: after the driver died, status still said `running` (and --watch never ended)."""
    led, url = live
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with led.session() as s:
        writes.take_lease(s, reads.get_campaign(s, "live"), host=socket.gethostname(), pid=dead.pid, token="t",
                          ttl_s=60)
    host = socket.gethostname()
    line = f"driver gone (pid {dead.pid} on {host}): run `campaign resume live`"
    code, out, err = run_cli("status", "live", "--db", url)
    assert code == 0, err
    assert line in " ".join(out.split()) and "— running" not in out
    code, out, _ = run_cli("status", "--db", url)
    assert "driver gone" in out and " running " not in out
    code, out, _ = run_cli("status", "live", "--json", "--db", url)
    d = json.loads(out)
    assert d["state"] == "driver_gone" and d["driver"] == {"state": "gone", "host": host, "pid": dead.pid}
    started = time.monotonic()
    code, out, _ = run_cli("status", "live", "--watch", "--interval", "5", "--db", url)
    assert code == 0 and time.monotonic() - started < 4 and line in " ".join(out.split())  # one view, then it ends


# --- nodes: as README prints them ------------------------------------------------------

def test_nodes_exclude_and_include_as_readme_prints_them(demo_url: str, run_cli: Any) -> None:
    """Before: `campaign nodes exclude NODE` / `include NODE` stopped with "Missing option
    '--site'" (and exclude also wanted --reason)."""
    code, out, err = run_cli("nodes", "exclude", "local-n7", "--db", demo_url)
    assert code == 0, err
    assert out.strip() == "excluded local-n7 on local; lift: campaign nodes include local-n7 --site local"
    led = open_ledger(demo_url)
    try:
        [row] = [r for r in commands.list_exclusions(led, "local") if r["node"] == "local-n7"]
    finally:
        led.close()
    assert row["reason"] == commands.default_reason() and row["reason"].startswith("excluded by ")
    code, out, err = run_cli("nodes", "include", "local-n7", "--db", demo_url)
    assert (code, out.strip()) == (0, "local-n7 on local: 1 exclusion(s) lifted"), err


def test_nodes_without_site_on_a_ledger_of_several_sites_names_them(demo: Ledger, demo_url: str,
                                                                     run_cli: Any) -> None:
    with demo.session() as s:
        writes.exclude_node(s, site="aurora", node="x1000c0s0b0n0", reason="bad")
    code, _, err = run_cli("nodes", "include", "local-n1", "--db", demo_url)
    assert code == 2 and "--site: the ledger knows the sites aurora, local: name one" in err


# --- inject: no silent wait, aims at the next attempt --------------------------------------

def test_inject_refuses_at_once_when_nothing_runs(demo_url: str, run_cli: Any) -> None:
    """Before: `campaign inject local-demo kill ...` after the demo waited silently for up
    to 10 minutes for a campaign that had finished."""
    started = time.monotonic()
    code, _, err = run_cli("inject", "demo-run", "kill", "--rank", "1", "--after-step", "50", "--wait", "30",
                           "--db", demo_url)
    assert code == 2 and time.monotonic() - started < 5
    assert "campaign 'demo-run' is not running (state succeeded): no attempt to inject into" in err
    assert "--attempt next" in err


def _launch(tmp_path: Path, name: str) -> tuple[Path, subprocess.Popen[bytes]]:
    """A run directory as the local launcher leaves it: one real process group (rank 0),
    its pids.json, and a metrics row."""
    run_dir = tmp_path / name
    run_dir.mkdir()
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    (run_dir / "pids.json").write_text(json.dumps({"host": socket.gethostname(), "pgids": [rank.pid],
                                                   "launcher": "local"}))
    (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 3, "tokens": 1536, "loss": 5.0}) + "\n")
    return run_dir, rank


def test_inject_attempt_next_aims_at_the_relaunch_not_the_attempt_that_failed(live: Any, tmp_path: Path) -> None:
    """Before: a drill could not aim at the next attempt, so a second drill hit a rank that
    "has already exited" (the first attempt's, still marked running)."""
    led, _ = live
    old_dir, old_rank = _launch(tmp_path, "old")
    new_dir, new_rank = _launch(tmp_path, "new")
    try:
        with led.session() as s:
            a = next(a for _, a in reads.list_attempts(s, reads.get_campaign(s, "live")) if a.state == "running")
            a.run_dir = str(old_dir)
        done: dict[str, Any] = {}
        drill = threading.Thread(target=lambda: done.update(commands.inject_fault(
            led, "live", "kill", 0, attempt="next", stage="long-run", wait_s=30, poll_s=0.05)))
        drill.start()
        time.sleep(0.5)  # the drill has seen the campaign's attempts; the running one is not "next"
        assert drill.is_alive() and old_rank.poll() is None
        with led.session() as s:
            run = reads.get_stage_run(s, "live", "long-run")
            writes.create_attempt(s, run, nodes=["local-n0", "local-n2"], ranks_per_node=1, run_dir=str(new_dir),
                                  label="relaunch 2")
        drill.join(timeout=20)
        assert done["run_dir"] == str(new_dir) and new_rank.wait(timeout=10) == -9
        assert old_rank.poll() is None  # the earlier attempt's rank was left alone
        marker = json.loads((new_dir / "injected.json").read_text())  # the driver learns it was a drill
        assert (marker["fault"], marker["rank"], marker["step"]) == ("kill", 0, 3)
    finally:
        for p in (old_rank, new_rank):
            if p.poll() is None:
                p.kill()
            p.wait()


def test_a_second_kill_of_an_exited_rank_points_at_attempt_next(live: Any, tmp_path: Path) -> None:
    led, _ = live
    run_dir, rank = _launch(tmp_path, "gone")
    rank.kill()
    rank.wait()
    with led.session() as s:
        a = next(a for _, a in reads.list_attempts(s, reads.get_campaign(s, "live")) if a.state == "running")
        a.run_dir = str(run_dir)
    with pytest.raises(CampaignError, match="has already exited; aim at the relaunch with `--attempt next`"):
        commands.inject_fault(led, "live", "kill", 0, wait_s=5)
    assert not (run_dir / "injected.json").exists()


# --- plots: the campaign's chart, one relaunch numbering ----------------------------------

def test_the_default_plot_is_the_long_run_across_attempts_with_each_relaunch_labelled(
        demo_url: str, run_cli: Any, tmp_path: Path) -> None:
    """Before: `campaign plot NAME` drew every stage from 0 tokens, and no chart showed the
    long run across its attempts with each restart marked and why."""
    from campaign import plots

    code, out, err = run_cli("plot", "demo-run", "--db", demo_url, "--out", tmp_path)
    assert code == 0, err
    assert Path(out.strip()) == tmp_path / "demo-run-run.png" and Path(out.strip()).stat().st_size > 10_000
    led = open_ledger(demo_url)
    try:
        data = commands.plot_data(led, ["demo-run"], "run")
    finally:
        led.close()
    [run] = data["runs"]
    assert run["stage"] == "long-run" and [s["number"] for s in run["series"]] == [1, 2]
    fig = plots.run_figure(data["runs"])
    ax = fig.axes[0]
    by_gid = {a.get_gid(): a for a in [*ax.lines, *ax.texts, *ax.patches]}
    assert list(by_gid["demo-run/long-run/relaunch-1"].get_xdata()) == [40 * 512] * 2  # resumed from step 40
    assert by_gid["demo-run/long-run/label-1"].get_text() == "relaunch 1: hang\nexcluded local-n1\n20 steps lost"
    assert "demo-run/long-run/lost-1" in by_gid  # steps 41-60 trained twice, shaded
    assert [line.get_label() for line in ax.lines if line.get_gid() in ("demo-run/long-run/1", "demo-run/long-run/2")] \
        == ["attempt 1", "attempt 2 (relaunch 1)"]


def test_plot_stage_draws_that_stage_into_its_own_file(demo_url: str, run_cli: Any, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """`campaign plot NAME --stage STAGE` draws that stage (the title names it) into
    NAME-STAGE-run.png. Before: the file was NAME-run.png whatever --stage, so the chart of
    another stage overwrote the default chart."""
    from campaign import commands, plots

    titles: list[str] = []
    save = plots.save
    monkeypatch.setattr(plots, "save", lambda fig, path: (titles.append(fig.axes[0].get_title()), save(fig, path))[1])
    code, out, err = run_cli("plot", "demo-run", "--db", demo_url, "--out", tmp_path)
    assert code == 0, err
    default = tmp_path / "demo-run-run.png"
    assert Path(out.strip()) == default
    drawn = default.read_bytes()
    code, out, err = run_cli("plot", "demo-run", "--stage", "scaling", "--db", demo_url, "--out", tmp_path)
    assert code == 0, err
    assert Path(out.strip()) == tmp_path / "demo-run-scaling-run.png" and Path(out.strip()).stat().st_size > 10_000
    assert default.read_bytes() == drawn  # the default chart is still the long run's
    assert titles == ["Loss vs tokens: demo-run / long-run (2 attempts, 1 relaunch)",
                      "Loss vs tokens: demo-run / scaling (2 attempts, 0 relaunches)"]
    code, out, err = run_cli("plot", "demo-run", "--kind", "steps", "--stage", "long-run", "--db", demo_url,
                             "--out", tmp_path)
    assert (code, Path(out.strip())) == (0, tmp_path / "demo-run-long-run-steps.png"), err
    code, _, err = run_cli("plot", "demo-run", "--stage", "nope", "--db", demo_url, "--out", tmp_path)
    assert code == 2 and "--stage nope: campaign 'demo-run' has the stages smoke, scaling, long-run" in err
    # Kinds that draw every stage keep one file name; a stage name never leaves --out.
    assert commands.plot_path(["demo-run"], "goodput", tmp_path, "scaling").name == "demo-run-goodput.png"
    with pytest.raises(CampaignError, match="--stage: '../x' is not a valid name"):
        commands.plot_path(["demo-run"], "steps", tmp_path, "../x")


def _relaunch(exit_class: ExitClass, *, last_step: int, resume_step: int, rescued: bool = False,
              excluded: tuple[str, ...] = ()) -> dict[str, Any]:
    """A `relaunch` event's data as stages/long_run.py writes it after attempt 1."""
    from campaign.stages import long_run

    return {"resume_step": resume_step, "steps_lost": last_step - resume_step, "exit_class": exit_class,
            "cause": long_run.relaunch_cause(exit_class), "relaunch": 1, "attempt": 2, "rescued": rescued,
            "last_step": last_step, "drill": False, "excluded": list(excluded)}


@pytest.mark.parametrize(("event", "label"), [
    (_relaunch(ExitClass.CRASHED_NODE, last_step=60, resume_step=40, excluded=("local-n1",)),
     "relaunch 1: crash\nexcluded local-n1\n20 steps lost"),
    (_relaunch(ExitClass.BLOCK_LOST, last_step=55, resume_step=40),
     "relaunch 1: node lost\n15 steps lost"),
    (_relaunch(ExitClass.STALLED, last_step=60, resume_step=60, rescued=True, excluded=("local-n1",)),
     "relaunch 1: hang\nexcluded local-n1\nrescued step 60\n0 steps lost"),
    (_relaunch(ExitClass.STALLED, last_step=61, resume_step=60, rescued=True),
     "relaunch 1: hang\nrescued step 60\n1 step lost"),
], ids=["crash", "node-lost", "rescued", "rescued-one-lost"])
def test_a_relaunch_label_names_its_cause_the_rescue_and_the_steps_lost(event: dict[str, Any], label: str) -> None:
    """Issue 40: each relaunch on the campaign's chart is labelled with why (hang, crash, node
    lost), the rescue that saved its last step, and the steps lost."""
    from campaign import plots

    assert plots.relaunch_text(event) == label


def test_one_relaunch_numbering_in_status_events_plots_and_export(demo: Ledger, demo_url: str, run_cli: Any) -> None:
    """Before: "relaunch 1" in status was "relaunch #2" on the steps plot."""
    from campaign import plots

    d = commands.status_data(demo, "demo-run")
    assert [(a["number"], a["label"]) for a in d["attempts_detail"] if a["stage"] == "long-run"] == [
        (1, ""), (2, "relaunch 1")]
    assert any(e["message"].startswith("relaunch 1 (attempt 2) after hang") for e in d["events"])
    data = commands.plot_data(demo, ["demo-run"], "steps", "long-run")
    texts = [t.get_text() for t in plots.steps_figure(data["series"]).axes[0].texts]
    assert texts == ["relaunch 1 after stalled"]
    code, out, _ = run_cli("ledger", "export", "demo-run", "--what", "attempts", "--format", "json", "--db", demo_url)
    assert [(a["number"], a["label"]) for a in json.loads(out) if a["stage"] == "long-run"] == [(1, ""),
                                                                                             (2, "relaunch 1")]


# --- logs and forget -----------------------------------------------------------------------

def test_logs_prints_rank_0_of_the_running_attempt_and_follows_it_to_its_end(live: Any, tmp_path: Path,
                                                                              run_cli: Any) -> None:
    """Before: there was no way to follow a rank's log but copying a path from `status`."""
    led, url = live
    log = tmp_path / "a2" / "logs" / "rank-0.log"
    log.parent.mkdir(parents=True)
    log.write_text("step 87\n")
    (log.parent / "rank-1.log").write_text("rank one\n")
    code, out, err = run_cli("logs", "live", "--db", url)
    assert (code, out) == (0, "step 87\n"), err
    assert run_cli("logs", "live", "--rank", "1", "--db", url)[1] == "rank one\n"
    code, _, err = run_cli("logs", "live", "--stage", "long-run", "--attempt", "7", "--db", url)
    assert code == 2 and "--attempt 7: stage long-run of 'live' has attempts 1-2" in err
    got: list[str] = []
    follow = threading.Thread(target=commands.follow_log, args=(led, "live", got.append),
                              kwargs={"follow": True, "attempt": 2, "stage": "long-run", "poll_s": 0.05})
    follow.start()
    time.sleep(0.3)
    with log.open("a") as f:
        f.write("step 88\n")
    time.sleep(0.3)
    with led.session() as s:
        a = next(a for _, a in reads.list_attempts(s, reads.get_campaign(s, "live")) if a.state == "running")
        writes.finish_attempt(s, a, state="succeeded", exit_code=0, suspects=[], summary={})
    follow.join(timeout=10)
    assert not follow.is_alive()
    assert "".join(got) == (f"==> long-run #2 rank 0: {log} <==\nstep 87\nstep 88\n"
                            "==> attempt 2 of long-run ended: succeeded <==\n")


def test_forget_asks_then_removes_the_rows_and_run_directories(live: Any, tmp_path: Path, run_cli: Any) -> None:
    """Before: rerunning the demo meant deleting campaigns/ by hand."""
    led, url = live
    (tmp_path / "live" / "long-run").mkdir(parents=True)
    code, out, err = run_cli("forget", "live", "--db", url)
    assert code == 2 and "is running (driver pid" in err and "`campaign cancel live` first" in err
    with led.session() as s:
        writes.set_campaign_state(s, reads.get_campaign(s, "live"), "cancelled")
        writes.drop_lease(s, reads.get_campaign(s, "live"), "t")
    code, out, err = run_cli("forget", "live", "--db", url, input="n\n")
    assert code == 0 and "nothing removed" in out and (tmp_path / "live").is_dir()
    code, out, err = run_cli("forget", "live", "--db", url, input="y\n")
    assert code == 0, err
    assert "1 exclusion(s) of its own" in out and f"the run directory {tmp_path / 'live'}" in out
    assert not (tmp_path / "live").exists()
    with led.session() as s:
        assert reads.get_campaign(s, "live") is None
        assert sorted(e.node for e in reads.list_exclusions(s, "local")) == sorted(EXCLUDED[1:])  # the site's stay
    assert run_cli("forget", "live", "--yes", "--missing-ok", "--db", url)[0] == 0  # make demo, the first time
    assert run_cli("forget", "live", "--yes", "--missing-ok", "--workdir", tmp_path / "none")[0] == 0
    assert run_cli("forget", "live", "--yes", "--db", url)[0] == 2


# --- tab completion ------------------------------------------------------------------------

def test_tab_completion_offers_campaign_and_stage_names(live: Any) -> None:
    from click.shell_completion import ShellComplete

    from campaign.cli import main

    _, url = live

    def complete(args: list[str], incomplete: str) -> list[str]:
        return [c.value for c in ShellComplete(main, {}, "campaign", "_CAMPAIGN_COMPLETE")
                .get_completions(args, incomplete)]

    assert complete(["status", "--db", url], "li") == ["live"]
    assert complete(["plot", "--db", url], "") == ["live"]
    assert complete(["logs", "live", "--db", url, "--stage"], "lo") == ["long-run"]
    assert complete(["inject", "--db", url, "live", "kill", "--stage"], "") == ["smoke", "long-run"]
    assert complete(["status", "--db", "sqlite:////nonexistent/x.db"], "") == []  # no ledger: nothing, no error


def test_a_running_attempt_has_its_nodes_once_it_reports(tmp_path: Path) -> None:
    """Before: a running attempt showed `nodes 0` (its nodes were recorded only at its end).
    The driver's ingestion takes them from the attempt's hostfile with its first rows."""
    from campaign.stagecontext import StageContext

    led = open_ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    try:
        run_dir = tmp_path / "attempt-001"
        run_dir.mkdir()
        (run_dir / "hostfile").write_text("local-n0\nlocal-n2\n")
        with led.session() as s:
            c = writes.create_campaign(s, name="n", digest="0" * 64, spec_json={}, source="", site="local",
                                       workdir=str(tmp_path))
            [run] = writes.ensure_stage_runs(s, c, [("long-run", "long_run")])
            a = writes.create_attempt(s, run, nodes=[], ranks_per_node=1, run_dir=str(run_dir))
            StageContext._write_rows(s, a.id, steps(1, 3), None, None, run_dir)
        d = commands.status_data(led, "n")
        assert [(x["number"], x["nodes"], x["node_count"]) for x in d["running"]] == [(1, ["local-n0", "local-n2"], 2)]
        assert d["attempts_detail"][0]["node_count"] == 2
    finally:
        led.close()
