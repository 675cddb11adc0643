"""`campaign submit FILE --dry-run --json`: each stage carries `launch.placement`, computed by
the trainer's own placement function, and the exact commands the supervisor will run."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def _doc(run_cli: Callable[..., Any], tmp_path: Path, example: str) -> dict[str, Any]:
    code, out, err = run_cli("submit", REPO / "examples" / example, "--dry-run", "--json", "--workdir", tmp_path / "wd")
    assert code == 0, err
    assert not (tmp_path / "wd").exists(), "a dry run writes nothing"
    return json.loads(out)


def test_aurora_places_one_tile_per_rank_under_flat(run_cli: Callable[..., Any], tmp_path: Path) -> None:
    doc = _doc(run_cli, tmp_path, "auroragpt-2b.yaml")
    launch = doc["stages"][0]["launch"]
    rows = launch["placement"]
    assert [r["device"] for r in rows] == [f"xpu:{i}" for i in range(12)]
    assert rows[0]["cpus"] == "1-8" and rows[6]["cpus"] == "53-60", "cores 0 and 52 stay with the OS"
    # Each rank's numbers as it computes them from what Aurora's PALS (PMIx mode) gives it:
    # PMIX_RANK and PALS_LOCAL_RANKID, the world from the hostfile's nodes x ranks per node.
    nodes = doc["stages"][0]["node_counts"][0]
    assert {(r["rank_source"], r["world_size"], r["local_world_size"]) for r in rows} == {("pals-pmix", 12 * nodes, 12)}
    assert [r["rank"] for r in rows] == list(range(12))
    first = launch["attempts"][0]
    assert first["env"]["ZE_FLAT_DEVICE_HIERARCHY"] == "FLAT" and "--gpu-bind" not in first["command"]
    assert first["env"]["CAMPAIGN_ATTEMPT"] == "1" and " && qsub " in doc["block"]["submit"][0]


def test_polaris_ranks_each_see_one_gpu_and_use_device_0(run_cli: Callable[..., Any], tmp_path: Path) -> None:
    """The Polaris affinity wrapper leaves one GPU per rank: device 0 of what it sees (before:
    set_device(local_rank) failed for local ranks 1-3)."""
    rows = _doc(run_cli, tmp_path, "polaris.yaml")["stages"][0]["launch"]["placement"]
    assert [(r["visible_devices"], r["device"]) for r in rows] == [("3", "cuda:0"), ("2", "cuda:0"),
                                                                   ("1", "cuda:0"), ("0", "cuda:0")]


def test_local_example_has_a_command_per_node_count(run_cli: Callable[..., Any], tmp_path: Path) -> None:
    doc = _doc(run_cli, tmp_path, "local.yaml")
    scaling = next(s for s in doc["stages"] if s["kind"] == "scaling")
    assert [a["nodes"] for a in scaling["launch"]["attempts"]] == [1, 2] and doc["block"] is None
    assert [r["device"] for r in scaling["launch"]["placement"]] == ["cpu"]


def test_json_without_dry_run_is_a_usage_error(run_cli: Callable[..., Any], tmp_path: Path) -> None:
    code, _, err = run_cli("submit", REPO / "examples" / "local.yaml", "--json", "--workdir", tmp_path / "wd")
    assert code == 2 and "--json goes with --dry-run" in err and not (tmp_path / "wd").exists()
