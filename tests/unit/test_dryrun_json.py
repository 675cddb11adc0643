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


def test_the_dry_run_shows_the_folder_the_ledger_records_for_the_campaign(run_cli: Callable[..., Any],
                                                                          tmp_path: Path) -> None:
    """A campaign on a shared ledger (--db) works in the folder it was first submitted with
    (a teammate's --workdir); a submit from another --workdir continues there (Engine._work_in).
    The dry run shows those run directories, saying why; where that folder cannot be reached
    it says a submit would be refused. Before: it showed --workdir's paths either way."""
    from campaign import spec as spec_mod
    from campaign.ledger import open_ledger, writes

    example = REPO / "examples" / "local.yaml"
    spec = spec_mod.load(example)
    db = f"sqlite:///{tmp_path / 'shared' / 'ledger.db'}"
    theirs = tmp_path / "theirs"
    (theirs / spec.name).mkdir(parents=True)
    led = open_ledger(db)
    with led.session() as s:
        writes.create_campaign(s, name=spec.name, digest=spec.digest(), spec_json={}, source=example.read_text(),
                               site="local", workdir=str(theirs / spec.name))
    led.close()
    mine = tmp_path / "mine"
    code, out, err = run_cli("submit", example, "--dry-run", "--json", "--db", db, "--workdir", mine)
    assert code == 0, err
    assert f"works in {theirs / spec.name} (recorded in the ledger)" in " ".join(err.split()), err
    run_dir = json.loads(out)["stages"][0]["launch"]["attempts"][0]["env"]["CAMPAIGN_RUN_DIR"]
    assert run_dir.startswith(str(theirs / spec.name) + "/"), run_dir
    assert not mine.exists(), "a dry run writes nothing"
    # The recorded folder gone with the folder above it (another host's disk): a warning, --workdir's paths.
    led = open_ledger(db)
    with led.session() as s:
        from campaign.ledger import reads

        reads.get_campaign(s, spec.name).workdir = str(tmp_path / "elsewhere" / "gone" / spec.name)
    led.close()
    code, out, err = run_cli("submit", example, "--dry-run", "--json", "--db", db, "--workdir", mine)
    assert code == 0, err
    assert "which this host cannot reach or write: a submit here is refused" in " ".join(err.split()), err
    run_dir = json.loads(out)["stages"][0]["launch"]["attempts"][0]["env"]["CAMPAIGN_RUN_DIR"]
    assert run_dir.startswith(str(mine / spec.name) + "/"), run_dir
