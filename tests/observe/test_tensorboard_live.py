"""TensorBoard is live: what `TensorBoard.steps` and `.events` were given is in the event
files, read with TensorBoard's own EventAccumulator, before `close()` (a login node's
`tensorboard --logdir` sees the campaign as it runs, not when the driver ends)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("tensorboard")

from campaign.observe.tensorboard import TensorBoard  # noqa: E402
from tb_file import accumulate, scalars  # noqa: E402


def _row(step: int) -> dict[str, Any]:
    return {"step": step, "loss": 5.0 - 0.1 * step, "lr": 1e-3, "tokens": 512 * step, "tokens_per_s": 4096.0,
            "step_time_s": 0.125, "mem_peak_gib": 0.75, "time": 1.7e9 + step}


def test_steps_and_events_are_in_the_files_before_close(tmp_path: Path) -> None:
    tb = TensorBoard(tmp_path / "tb" / "live")
    try:
        tb.steps("long", 1, [_row(s) for s in (1, 2, 3)])
        run = tmp_path / "tb" / "live" / "long" / "attempt-1"
        assert run.is_dir(), "nothing written before close()"
        assert scalars(run, "loss") == pytest.approx({1: 4.9, 2: 4.8, 3: 4.7})
        for tag in ("lr", "tokens", "tokens_per_s", "step_time_s", "mem_peak_gib"):
            assert sorted(scalars(run, tag)) == [1, 2, 3], tag

        # The next batch, still open: a reader polling the folder sees it too.
        tb.steps("long", 1, [_row(4)])
        assert sorted(scalars(run, "loss")) == [1, 2, 3, 4]

        now = dt.datetime.now(dt.timezone.utc).isoformat()
        tb.events([{"id": 7, "kind": "relaunch", "message": "relaunch 1 (attempt 2) after crashed_node",
                    "data": {"exit_class": "crashed_node"}, "campaign": "live", "version": 1, "stage": "long",
                    "attempt": 1, "time": now}])
        from tensorboard.util import tensor_util

        [text] = accumulate(tmp_path / "tb" / "live" / "long" / "events").Tensors("relaunch")
        assert text.step == 7
        assert "after crashed_node" in tensor_util.make_ndarray(text.tensor_proto).item().decode()
    finally:
        tb.close()


def _has_losses(run: Path, n: int) -> bool:
    """Whether `run`'s event files hold `n` loss points yet (a file whose first flush has not
    come has no "loss" tag at all: TensorBoard's reader raises KeyError; seen in a CI run)."""
    try:
        return run.is_dir() and len(scalars(run, "loss")) == n
    except KeyError:
        return False


def test_the_driver_s_tensorboard_sink_is_live_too(tmp_path: Path) -> None:
    """What the driver holds (`observe.for_campaign`: the writer on a thread of its own):
    the rows reach the files within a few seconds of being ingested, the driver still running."""
    import time

    from campaign import observe
    from campaign.spec import CampaignSpec

    spec = CampaignSpec.model_validate({
        "name": "live", "site": {"kind": "local", "nodes": 1, "ranks_per_node": 1}, "model": {"size": "tiny"},
        "observe": {"tensorboard": "tb"}, "stages": [{"name": "long", "kind": "long_run", "nodes": 1, "steps": 4}]})
    sink = observe.for_campaign(spec, tmp_path / "c", tmp_path, warn=pytest.fail)
    try:
        sink.steps("long", 1, [_row(s) for s in (1, 2)])
        run, deadline = tmp_path / "tb" / "live" / "long" / "attempt-1", time.monotonic() + 4  # under flush_secs
        while not _has_losses(run, 2) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert run.is_dir() and sorted(scalars(run, "loss")) == [1, 2], "not in the files while the driver runs"
    finally:
        assert sink.close() == [f"TensorBoard: tensorboard --logdir {tmp_path / 'tb'}"]


def test_a_float8_run_s_mfu_against_both_peaks_is_on_the_board(tmp_path: Path) -> None:
    """A `precision: float8` row's `mfu_float8` (against the float8 peak) is a scalar beside `mfu`."""
    tb = TensorBoard(tmp_path / "tb" / "f8")
    try:
        tb.steps("long", 1, [{**_row(s), "mfu": 0.4, "mfu_float8": 0.2} for s in (1, 2)])
        run = tmp_path / "tb" / "f8" / "long" / "attempt-1"
        assert scalars(run, "mfu") == pytest.approx({1: 0.4, 2: 0.4})
        assert scalars(run, "mfu_float8") == pytest.approx({1: 0.2, 2: 0.2})
    finally:
        tb.close()
