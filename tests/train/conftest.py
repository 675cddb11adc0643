"""Fixtures of the trainer tests; helpers live in train_helpers.py."""

from __future__ import annotations

import pytest
from train_helpers import Launcher, tiny_config


@pytest.fixture
def launch(tmp_path):
    launcher = Launcher(tmp_path)
    yield launcher
    launcher.close()


@pytest.fixture(scope="session")
def reference_30(tmp_path_factory) -> dict[int, float]:
    """Losses of 30 uninterrupted steps of the tiny model on 2 ranks (launched once)."""
    base = tmp_path_factory.mktemp("reference")
    launcher = Launcher(base)
    try:
        run = launcher(tiny_config(base / "ck", run={"max_steps": 30}), name="ref")
        assert run.wait() == [0, 0], run.logs()
        return run.losses()
    finally:
        launcher.close()
