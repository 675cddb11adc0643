"""Plots (PNG size from the header; data read back from the figure's lines, not pixels),
the SQL downsampling behind them, export/import round trips, and the import boundary."""

from __future__ import annotations

import csv
import json
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from campaign import export, plots
from campaign import summary
from campaign.ledger import Ledger, reads, writes

REPO = Path(__file__).resolve().parents[2]


def png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR"
    return struct.unpack(">II", head[16:24])


def _series(led: Ledger, name: str = "demo-run", **kw: Any) -> list[dict[str, Any]]:
    with led.session() as s:
        c = reads.get_campaign(s, name)
        assert c is not None
        return reads.sample_campaign_steps(s, c, **kw)


def _lines(fig: Any) -> dict[str, Any]:
    return {ln.get_gid(): ln for ax in fig.axes for ln in ax.get_lines() if ln.get_gid()}


def test_progress_plot_matches_the_ledger(demo: Ledger, tmp_path: Path) -> None:
    fig = plots.progress_figure([_series(demo)])
    lines = _lines(fig)
    with demo.session() as s:
        pairs = reads.list_attempts(s, reads.get_campaign(s, "demo-run"))
        for run, a in pairs:
            rows = reads.list_steps(s, a.id)
            line = lines[f"demo-run/{run.name}/{a.number}"]
            assert list(line.get_xdata()) == [a.tokens_base + r.tokens for r in rows]
            assert list(line.get_ydata()) == [r.loss for r in rows]
            assert line.get_linestyle() == ("-" if len(a.nodes) == 1 else "--")  # solid for the fewest nodes
    path = plots.save(fig, tmp_path / "p.png")
    assert png_size(path) == (1000, 600)


def test_progress_plot_of_several_runs_with_reference(demo: Ledger, tmp_path: Path) -> None:
    curves = export.read_curves(REPO / "examples" / "auroragpt-progress.csv")
    with demo.session() as s:
        for run, runs in curves.items():
            writes.import_reference(s, f"agpt-{run}", runs, source="auroragpt-progress.csv")
    fig = plots.progress_figure([_series(demo), _series(demo, "agpt-256N")], reference=curves, log_x=True)
    lines = _lines(fig)
    # stage 2 of an imported run continues stage 1: drawn joined to its end point
    assert list(lines["agpt-256N/stage-2/1"].get_xdata()) == [4_674_000_000_000, 6_085_000_000_000]
    assert list(lines["reference/512N"].get_ydata()) == [2.687, 2.481]
    assert list(lines["reference/reference"].get_xdata()) == [7_771_000_000_000]
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "demo-run / long-run (2N)" in legend and "agpt-256N (256N)" in legend and "256 nodes" in legend
    assert fig.axes[0].get_xscale() == "log"
    assert png_size(plots.save(fig, tmp_path / "p.png")) == (1000, 600)


def test_scaling_plot(demo: Ledger, tmp_path: Path) -> None:
    with demo.session() as s:
        table = summary.describe_campaign(s, reads.get_campaign(s, "demo-run"))["scaling"][0]["rows"]
    fig = plots.scaling_figure([("demo-run", table)], min_efficiency=0.25)
    lines = _lines(fig)
    assert list(lines["demo-run/tokens_per_s"].get_xdata()) == [1, 2]
    assert list(lines["demo-run/tokens_per_s"].get_ydata()) == [r["tokens_per_s"] for r in table]
    assert list(lines["demo-run/efficiency"].get_ydata()) == [1.0, 0.824]
    assert list(lines["demo-run/comm_share"].get_ydata()) == pytest.approx([1.33, 15.2])
    assert png_size(plots.save(fig, tmp_path / "s.png")) == (1400, 480)


def test_steps_plot_marks_the_relaunch(demo: Ledger, tmp_path: Path) -> None:
    fig = plots.steps_figure([_series(demo, stage="long-run", columns=("loss", "step_time_s"))])
    lines = _lines(fig)
    assert list(lines["demo-run/long-run/1/loss"].get_xdata()) == list(range(1, 61))
    assert max(lines["demo-run/long-run/1/step_time"].get_ydata()) == 500.0  # the slow step, in ms
    assert list(lines["demo-run/long-run/2/relaunch"].get_xdata()) == [41, 41]
    assert png_size(plots.save(fig, tmp_path / "t.png")) == (1000, 700)


def test_steps_plot_labels_the_relaunch_above_the_data(demo: Ledger) -> None:
    """The label sat inside the step-time axes, over the relaunch's slow first steps; now
    it is in the band above them, below the title, centred on the red line."""
    fig = plots.steps_figure([_series(demo, stage="long-run", columns=("loss", "step_time_s"))])
    ax_time = fig.axes[0]
    [label] = [t for t in ax_time.texts if t.get_gid() == "demo-run/long-run/2/relaunch-label"]
    assert label.get_text() == "relaunch 1 after stalled"
    renderer = fig.canvas.get_renderer()
    fig.draw(renderer)  # the constrained layout places the axes and the title
    box, axes, title = label.get_window_extent(renderer), ax_time.get_window_extent(renderer), \
        ax_time.title.get_window_extent(renderer)
    assert box.y0 >= axes.y1, (box, axes)  # above the axes: it covers no point of the data
    assert box.y1 <= title.y0, (box, title)  # and under the title
    line_x = ax_time.transData.transform((41, 0))[0]
    assert box.x0 < line_x < box.x1


def test_relaunch_labels_close_together_stack() -> None:
    assert plots._label_rows([21, 27, 60], (0, 100)) == [0, 1, 0]
    assert plots._label_rows([10, 50, 90], (0, 100)) == [0, 0, 0]


def test_sampling_downsamples_in_sql_and_keeps_the_last_step(demo: Ledger) -> None:
    series = _series(demo, stage="long-run", max_points=20)
    first, second = series
    assert len(first["steps"]) + len(second["steps"]) <= 24
    assert first["steps"][0] == 1 and first["steps"][-1] == 60
    assert second["steps"][-1] == 100
    assert len(_series(demo, stage="long-run")[0]["steps"]) == 60  # under the budget: every step


def test_plot_command_writes_pngs(demo_url: str, run_cli: Any, tmp_path: Path) -> None:
    for kind in ("progress", "scaling", "steps"):
        code, out, err = run_cli("plot", "demo-run", "--kind", kind, "--out", tmp_path, "--db", demo_url,
                                 "--reference", REPO / "examples" / "auroragpt-progress.csv")
        assert code == 0, err
        assert Path(out.strip()).exists()


def test_export_import_round_trip(demo_url: str, run_cli: Any, tmp_path: Path) -> None:
    out = tmp_path / "steps.csv"
    assert run_cli("ledger", "export", "demo-run", "--out", out, "--db", demo_url)[0] == 0
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 5 + 20 + 20 + 60 + 60
    code, msg, err = run_cli("ledger", "import-reference", "copy", out, "--db", demo_url)
    assert code == 0, err
    code, back, _ = run_cli("ledger", "export", "copy", "--format", "json", "--db", demo_url)
    again = json.loads(back)
    key = ("stage", "attempt", "step", "tokens", "loss")
    assert [tuple(r[k] for k in key) for r in again] == [
        (r["stage"], int(r["attempt"]), int(r["step"]), int(r["tokens"]), float(r["loss"])) for r in rows]
    assert {r["nodes"] for r in again} == {1, 2}
    assert run_cli("ledger", "import-reference", "copy", out, "--db", demo_url)[0] == 2  # exists: refused
    assert run_cli("ledger", "import-reference", "copy", out, "--replace", "--db", demo_url)[0] == 0


def test_export_attempts_and_nodes(demo_url: str, run_cli: Any) -> None:
    code, out, _ = run_cli("ledger", "export", "demo-run", "--what", "attempts", "--format", "json", "--db", demo_url)
    attempts = json.loads(out)
    assert [(a["stage"], a["number"], a["state"], a["exit_code"]) for a in attempts][-2:] == [
        ("long-run", 1, "stalled", 124), ("long-run", 2, "succeeded", 0)]
    code, out, _ = run_cli("ledger", "export", "demo-run", "--what", "nodes", "--db", demo_url)
    nodes = {r["node"]: r for r in csv.DictReader(out.splitlines())}
    assert nodes["local-n1"]["excluded"] == "True" and nodes["local-n1"]["suspect"] == "1"
    assert nodes["local-n2"]["attempts"] == "1"


@pytest.mark.parametrize("text,expect", [
    ("step,loss\n1,5.0\n2,4.5\n", {"": [[(1, 0, 5.0), (2, 0, 4.5)]]}),
    ("tokens,loss\n1.5M,5.0\n3e6,4.5\n", {"": [[(1, 1_500_000, 5.0), (2, 3_000_000, 4.5)]]}),
    ("# c\nrun,nodes,tokens,loss\na,8,1K,3\nb,16,2K,2\n", {"a": [[(1, 1000, 3.0)]], "b": [[(1, 2000, 2.0)]]}),
])
def test_read_curves(tmp_path: Path, text: str, expect: dict[str, Any]) -> None:
    f = tmp_path / "c.csv"
    f.write_text(text)
    got = export.read_curves(f)
    assert {k: [[(r["step"], r["tokens"], r["loss"]) for r in c["rows"]] for c in v] for k, v in got.items()} == expect


def test_import_of_a_step_loss_file_with_tokens_per_step(tmp_path: Path, demo_url: str, run_cli: Any) -> None:
    f = tmp_path / "ref.csv"
    f.write_text("step,loss\n1,5.0\n2,4.5\n")
    code, out, err = run_cli("ledger", "import-reference", "ref", f, "--tokens-per-step", "512", "--nodes", "4",
                             "--db", demo_url)
    assert code == 0, err
    code, out, _ = run_cli("status", "ref", "--json", "--db", demo_url)
    d = json.loads(out)
    assert d["stages"][0]["tokens"] == 1024 and d["attempts_detail"][0]["node_count"] == 4


def test_bad_reference_file_is_a_clear_error(tmp_path: Path, demo_url: str, run_cli: Any) -> None:
    f = tmp_path / "bad.csv"
    f.write_text("when,what\n1,2\n")
    code, _, err = run_cli("ledger", "import-reference", "x", f, "--db", demo_url)
    assert code == 2 and "expected a header with loss" in err


def test_the_cli_imports_no_matplotlib_torch_or_parsl() -> None:
    code = "import sys, campaign.cli; print(sorted(m for m in ('matplotlib', 'torch', 'parsl') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.stdout.strip() == "[]", out.stderr


def test_sampling_of_a_sparsely_logged_attempt(demo: Ledger) -> None:
    with demo.session() as s:
        run = reads.get_stage_run(s, "demo-run", "smoke")
        a = writes.create_attempt(s, run, nodes=["n0"], ranks_per_node=1, run_dir="/w/sparse")
        writes.ingest_steps(s, a, [{"step": 10 * i, "tokens": 5120 * i, "loss": 1.0 / i} for i in range(1, 101)])
        got = reads.sample_steps(s, [a], max_points=10)[a.id]
    steps = [r[0] for r in got]
    assert 5 <= len(steps) <= 12 and steps[0] == 10 and steps[-1] == 1000
