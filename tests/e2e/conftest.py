"""Fixtures of the end-to-end tests (helpers live in e2e_helpers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from e2e_helpers import Workspace


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    return Workspace(tmp_path)
