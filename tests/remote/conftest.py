"""Fixtures of the remote-control tests: `endpoint` puts the Executor stand-in
(fake_executor.py) behind `campaign.remote.executor_factory` and records every executor made."""

from __future__ import annotations

import functools
from collections.abc import Iterator

import pytest
from fake_executor import FakeExecutor

ENDPOINT_ID = "2b1f8a9e-6c3d-4e5f-8a7b-9c0d1e2f3a4b"


class FakeEndpoint:
    """Configures the stand-in executors the CLI will get; `.made` lists them."""

    id = ENDPOINT_ID

    def __init__(self) -> None:
        self.made: list[FakeExecutor] = []
        self.fake_versions: dict[str, str | None] = {}

    def factory(self, endpoint_id: str) -> FakeExecutor:
        from campaign import remote

        ex = FakeExecutor(endpoint_id, serializer=remote._serializer(by_source=False),
                          result_serializers=["globus_compute_sdk.serialize.JSONData"], fake_versions=self.fake_versions)
        self.made.append(ex)
        return ex

    @property
    def calls(self) -> list[str]:
        return [c for ex in self.made for c in ex.calls]


@pytest.fixture
def endpoint(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeEndpoint]:
    from campaign import remote

    fake = FakeEndpoint()
    monkeypatch.setattr(remote, "executor_factory", functools.partial(FakeEndpoint.factory, fake))
    monkeypatch.delenv("CAMPAIGN_ENDPOINT", raising=False)
    yield fake
