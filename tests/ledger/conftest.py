"""Fixtures of the ledger tests: an open ledger on each database `ledger_url` gives (SQLite,
then the real PostgreSQL)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from campaign.ledger import Ledger, open_ledger


@pytest.fixture
def ledger(ledger_url: str) -> Iterator[Ledger]:
    led = open_ledger(ledger_url)
    try:
        yield led
    finally:
        led.close()
