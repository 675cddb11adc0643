"""Reading TensorBoard's event files back with TensorBoard's own reader (EventAccumulator),
for the observe tests. Not a test module."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def accumulate(folder: Path) -> Any:
    from tensorboard.backend.event_processing.event_accumulator import TENSORS, EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={TENSORS: 0})  # keep every point
    acc.Reload()
    return acc


def scalars(folder: Path, tag: str) -> dict[int, float]:
    from tensorboard.util import tensor_util

    return {e.step: float(tensor_util.make_ndarray(e.tensor_proto)) for e in accumulate(folder).Tensors(tag)}


def texts(folder: Path) -> dict[str, list[str]]:
    """tag -> texts, in step (ledger event id) order."""
    from tensorboard.util import tensor_util

    acc = accumulate(folder)
    return {tag: [tensor_util.make_ndarray(e.tensor_proto).item().decode() for e in acc.Tensors(tag)]
            for tag in acc.Tags()["tensors"]}
