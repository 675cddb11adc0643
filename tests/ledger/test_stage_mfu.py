"""Issue 44 item 3: MFU per stage in the ledger (the stage's numbers, from its newest step
rows, when it ends) and in `campaign status` (the stage numbers; a running attempt's line);
a float8 run's second figure, against the float8 peak, beside the first."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from io import StringIO

from rich.console import Console

from campaign import summary
from campaign.ledger import open_ledger, reads, writes
from campaign.views import campaign_detail, numbers_table, running_lines


def _rows(first: int, last: int, mfu: Any) -> list[dict[str, Any]]:
    return [{"step": i, "tokens": 1024 * i, "loss": 3.0, "step_time_s": 0.1, "tokens_per_s": 10240.0,
             "mfu": mfu(i) if callable(mfu) else mfu, "time": 1000.0 + i} for i in range(first, last + 1)]


def _float8(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of a float8 run on Hopper: the float8 dense peak is about twice the bf16 one."""
    return [{**r, "mfu_float8": None if r["mfu"] is None else r["mfu"] / 2} for r in rows]


def _text(renderable: Any, width: int = 80) -> str:
    out = StringIO()
    Console(file=out, width=width, color_system=None).print(renderable)
    return out.getvalue()


def _stage(tmp_path: Path, rows: list[dict[str, Any]], state: str = "passed", url: str | None = None) -> dict[str, Any]:
    led = open_ledger(url or f"sqlite:///{tmp_path / 'ledger.db'}")
    try:
        with led.session() as s:
            c = writes.create_campaign(s, name="gpu", digest="ab" * 32, spec_json={"name": "gpu"}, source="",
                                       site="local", workdir=str(tmp_path))
            (run,) = writes.ensure_stage_runs(s, c, [("long-run", "long_run")])
            writes.set_stage_state(s, run, "running")
            a = writes.create_attempt(s, run, nodes=["gpu-n0"], ranks_per_node=1, run_dir=str(tmp_path / "a1"),
                                      target_steps=rows[-1]["step"] if rows else 10)
            writes.ingest_steps(s, a, rows)
            live = summary.live_attempt(s, run, a)
            if state != "running":
                writes.finish_attempt(s, a, state="succeeded", exit_code=0, suspects=[], summary={})
                writes.set_stage_state(s, run, state, verdict="done", numbers={"steps_done": len(rows)})
        with led.session() as s:
            c = reads.get_campaign(s, "gpu")
            assert c is not None
            return {"detail": summary.describe_campaign(s, c), "live": live}
    finally:
        led.close()


def test_a_finished_stage_records_the_median_mfu_of_its_newest_steps(tmp_path: Path) -> None:
    # the first 50 steps compile (MFU 0.01); the steady state is 0.40-0.42: the median of the
    # newest MFU_WINDOW rows leaves the warm-up out
    rows = _rows(1, 50, 0.01) + _rows(51, 50 + reads.MFU_WINDOW, lambda i: (0.40, 0.41, 0.42)[i % 3])
    d = _stage(tmp_path, rows)["detail"]
    numbers = d["stage_numbers"]["long-run"]
    assert numbers == {"steps_done": len(rows), "mfu": 0.41}
    table = numbers_table(d)
    assert table is not None
    text = _text(table)
    assert "MFU 41.0%" in text and "steps_done" in text and "float8" not in text


def test_a_stage_without_mfu_rows_records_none(tmp_path: Path) -> None:
    """CPU (no known peak) and trainers that do not report it: no `mfu` key, nothing invented."""
    d = _stage(tmp_path, _rows(1, 20, None))["detail"]
    assert d["stage_numbers"]["long-run"] == {"steps_done": 20}


def test_a_running_attempt_shows_its_newest_mfu(tmp_path: Path) -> None:
    live = _stage(tmp_path, _rows(1, 30, lambda i: 0.3 + i / 1000), state="running")["live"]
    assert live["mfu"] == pytest.approx(0.33)
    assert live["mfu_float8"] is None  # a bf16 run: no float8 figure, and status shows none
    head, detail = running_lines(live)
    assert "MFU 33.0%" in detail and len(detail) <= 80, detail
    assert "float8" not in detail


def test_a_float8_stage_records_both_medians_over_the_same_rows(ledger_url: str, tmp_path: Path) -> None:
    rows = _float8(_rows(1, 50, 0.01) + _rows(51, 50 + reads.MFU_WINDOW, lambda i: (0.40, 0.41, 0.42)[i % 3]))
    d = _stage(tmp_path, rows, url=ledger_url)["detail"]
    assert d["stage_numbers"]["long-run"] == {"steps_done": len(rows), "mfu": 0.41, "mfu_float8": 0.205}
    text = _text(numbers_table(d))
    assert "MFU 41.0% (float8 peak 20.5%)" in text, text
    assert "mfu_float8" not in text and "0.205" not in text  # one figure beside the other, not a raw entry


def test_a_running_float8_attempt_shows_both_figures_in_80_columns(ledger_url: str, tmp_path: Path) -> None:
    d = _stage(tmp_path, _float8(_rows(1, 30, lambda i: 0.3 + i / 1000)), state="running", url=ledger_url)["detail"]
    (live,) = d["running"]  # what `status --json` carries
    assert (live["mfu"], live["mfu_float8"]) == (pytest.approx(0.33), pytest.approx(0.165))
    lines = running_lines(live)
    assert all(len(line) <= 80 for line in lines), lines
    assert "  loss 3.0000  30.7K tok  1000 ms/step  MFU 33.0% (float8 peak 16.5%)" in lines
    assert lines[-1] == "  1 node: gpu-n0"  # the nodes go on a line of their own rather than past 80 columns
    text = _text(campaign_detail(d))
    assert "MFU 33.0% (float8 peak 16.5%)\n" in text and "  1 node: gpu-n0\n" in text, text
    # `watch` on a wide terminal: the nodes stay on the line where they fit.
    from campaign.views import watch_lines

    head, _, _ = watch_lines(d, width=120)
    assert "  loss 3.0000  30.7K tok  1000 ms/step  MFU 33.0% (float8 peak 16.5%)  1 node: gpu-n0" in head, head
    assert watch_lines(d, width=80)[0][-1] == "  1 node: gpu-n0"


def test_the_html_report_reads_a_float8_run_s_mfu_as_status_does(tmp_path: Path) -> None:
    """The page's stage numbers said `mfu 0.41` and `mfu_float8 0.205`; now one `MFU` entry
    with status's wording."""
    from campaign.htmlreport import _numbers

    d = _stage(tmp_path, _float8(_rows(1, 50, 0.41)))["detail"]
    page = _numbers(d)
    assert "<dt>MFU</dt><dd><span>41.0% (float8 peak 20.5%)</span></dd>" in page
    assert "mfu_float8" not in page and "<dt>mfu</dt>" not in page
