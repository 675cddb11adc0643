"""W&B's mode follows the site when the spec names none: offline where compute nodes have no
internet (Aurora, Polaris: `COMPUTE_NODES_ONLINE = False`), online elsewhere, even with
credentials on the host. The sink is built as the driver builds it (`observe.for_campaign`);
no W&B run starts (that waits for the first step)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

pytest.importorskip("wandb")

from campaign import observe  # noqa: E402
from campaign.spec import CampaignSpec  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def _wandb_sink(example: str, tmp_path: Path, **wandb: str) -> observe.Observer:
    from campaign.observe.wandb import Wandb

    raw = yaml.safe_load((REPO / "examples" / example).read_text())
    raw["observe"] = {"wandb": {"project": "p", **wandb}}
    spec = CampaignSpec.model_validate(raw)
    built = observe.for_campaign(spec, tmp_path / "c", tmp_path, warn=pytest.fail)
    assert isinstance(built, observe.Observers)
    [queued] = built.sinks
    assert isinstance(queued, observe.Queued) and queued._thread is None, "nothing started yet"
    [sink] = queued._sink.sinks
    assert isinstance(sink, Wandb)
    return sink


@pytest.mark.parametrize(("example", "mode"), [("auroragpt-2b.yaml", "offline"), ("polaris.yaml", "offline"),
                                               ("local.yaml", "online")])
def test_the_default_mode_follows_the_site(example: str, mode: str, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)  # credentials: online is possible, the site decides
    sink = _wandb_sink(example, tmp_path)
    assert sink.mode == mode, f"{example}: {sink.mode}"
    assert sink.note is None


def test_the_spec_s_mode_wins_over_the_site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert _wandb_sink("auroragpt-2b.yaml", tmp_path, mode="online").mode == "online"
    assert _wandb_sink("local.yaml", tmp_path, mode="offline").mode == "offline"
