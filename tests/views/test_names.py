"""Names that become file names are checked by the campaign-name rule (campaign.names):
`ledger import-reference NAME` and `plot NAME...` refuse a path such as
`../../../../tmp/x` with one line naming the argument, exit 2, and write nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from campaign import names
from campaign.errors import CampaignError
from campaign.ledger import open_ledger, reads, writes


def _files(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize("bad", ["../../../../tmp/x", "a/b", ".hidden", "-x", "x" * 65, "", "a b", "é"])
def test_the_rule_refuses_paths_and_long_names(bad: str) -> None:
    with pytest.raises(CampaignError, match=r"^NAME: "):
        names.check(bad, "NAME")


def test_the_rule_names_the_limit_of_a_long_name() -> None:
    assert names.problem("x" * 80) == "is 80 characters long; the ledger keeps names of at most 64 characters"
    assert names.check("auroragpt-2b_v1.2", "NAME") == "auroragpt-2b_v1.2" and names.problem("x" * 64) is None


@pytest.fixture
def reference(tmp_path: Path) -> Path:
    path = tmp_path / "ref.csv"
    path.write_text("step,loss\n1,5.0\n2,4.5\n")
    return path


def test_import_reference_refuses_a_path_as_name(run_cli, tmp_path: Path, reference: Path) -> None:
    wd = tmp_path / "work" / "deep"
    before = _files(tmp_path)
    code, out, err = run_cli("ledger", "import-reference", "../../../../tmp/x", reference, "--workdir", wd)
    assert code == 2, out + err
    assert err.strip() == (f"error: NAME: '../../../../tmp/x' is not a valid name: {names.RULE}")
    assert _files(tmp_path) == before and not wd.exists(), "nothing written: no ledger, no folder"


def test_import_reference_checks_the_run_names_of_the_file(run_cli, tmp_path: Path) -> None:
    ref = tmp_path / "runs.csv"
    ref.write_text("run,tokens,loss\ngood,100,5.0\n../../evil,100,4.0\n")
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    open_ledger(url).close()
    code, out, err = run_cli("ledger", "import-reference", "ref", ref, "--db", url)
    assert code == 2 and len(err.strip().splitlines()) == 1, out + err
    assert "NAME-RUN (run '../../evil' of the file): 'ref-../../evil' is not a valid name" in err
    led = open_ledger(url, create=False)
    with led.session() as s:
        assert reads.list_campaigns(s) == [], "no run of the file was stored"
    led.close()


def test_plot_refuses_a_path_as_name(run_cli, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    open_ledger(url).close()
    before = _files(tmp_path)
    code, out, err = run_cli("plot", "../../../../tmp/x", "--db", url, "--out", tmp_path / "plots")
    assert code == 2, out + err
    assert err.startswith("error: NAME: '../../../../tmp/x' is not a valid name or pattern") and err.count("\n") == 1
    assert _files(tmp_path) == before


def test_plot_accepts_wildcards(run_cli, demo_url: str, tmp_path: Path) -> None:
    code, out, err = run_cli("plot", "demo-*", "--db", demo_url, "--out", tmp_path / "plots")
    assert code == 0, out + err
    assert Path(out.strip()) == tmp_path / "plots" / "demo-run-run.png"


def test_plot_never_writes_outside_out_for_a_bad_name_already_in_the_ledger(run_cli, tmp_path: Path) -> None:
    """A ledger written before the rule held (an import named `../escape`): the plot refuses
    to build a file name from it."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    led = open_ledger(url)
    with led.session() as s:
        writes.import_reference(s, "../escape", [{"stage": "run", "attempt": 1, "node_count": 1,
                                                  "rows": [{"step": 1, "tokens": 10, "loss": 5.0}]}], source="old.csv")
    led.close()
    before = _files(tmp_path)
    code, out, err = run_cli("plot", "*", "--db", url, "--out", tmp_path / "a" / "b")
    assert code == 2, out + err
    assert "campaign name in the ledger: '../escape' is not a valid name" in err
    assert _files(tmp_path) == before and not (tmp_path / "a" / "escape-progress.png").exists()


# --- node names (issue 39, item 4): a newline in one was listed as two nodes ------------------

@pytest.mark.parametrize("bad", ["n1\nn2", "n1\r", "n\x1b[31m1", "n1 n2", "n1,n2", "n\x85", "\t", ""])
def test_a_node_name_with_control_characters_spaces_or_commas_is_refused(bad: str) -> None:
    with pytest.raises(CampaignError, match=r"^NODE: "):
        names.check_node(bad, "NODE")
    assert names.check_node("x4000c0s0b0n0", "NODE") == "x4000c0s0b0n0"
    assert names.node_problem("local-n1") is None and names.node_problem("nid001234.hsn.cm") is None


@pytest.mark.parametrize("verb", ["exclude", "include"])
def test_nodes_exclude_and_include_refuse_a_node_name_with_a_newline(run_cli, tmp_path: Path, verb: str) -> None:
    """`campaign nodes exclude $'n1\\nn2'` was stored, then `nodes list` showed two nodes and
    srun's --exclude got two. Refused with one line, before the ledger is opened (or made)."""
    wd = tmp_path / "work"
    extra = ["--reason", "flaky"] if verb == "exclude" else []
    code, out, err = run_cli("nodes", verb, "n1\nn2", "--site", "slurm", *extra, "--workdir", wd)
    assert code == 2, out + err
    assert err.count("\n") == 1 and err.startswith("error: NODE: 'n1\\nn2' holds '\\n'"), err
    assert not wd.exists(), "no ledger made"


def test_a_fault_on_a_node_name_with_a_newline_is_a_spec_error(run_cli, tmp_path: Path) -> None:
    import yaml

    spec = {"name": "faulty", "site": {"kind": "local", "nodes": 2, "ranks_per_node": 1}, "model": {"size": "tiny"},
            "stages": [{"kind": "long_run", "steps": 10, "faults": [{"kind": "hang", "step": 3, "node": "local-n1\nx"}]}]}
    path = tmp_path / "faulty.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    code, out, err = run_cli("submit", path, "--workdir", tmp_path / "work", "--dry-run")
    assert code == 2, out + err
    assert "stages[0].faults[0].node" in err and "'local-n1\\nx' holds '\\n'" in err and "Traceback" not in err, err


def test_a_scheduler_node_file_with_a_control_character_is_refused_naming_the_line(tmp_path: Path,
                                                                                  monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The supervisor reads the block's nodes from PBS_NODEFILE (a real file, as PBS Pro writes
    it; the scheduler itself is not run here): a name that is not one word stops the attempt
    as a config error naming the file and the line, before anything is launched."""
    from campaign import supervisor
    from campaign.attempt import AttemptRequest

    nodefile = tmp_path / "nodefile"
    nodefile.write_text("x1000c0s0b0n0\nx1000c0s0b0n0\nx1000c0s1\x1bb0n0\n")
    monkeypatch.setenv("PBS_NODEFILE", str(nodefile))
    with pytest.raises(ValueError, match=r"line 3: 'x1000c0s1\\x1bb0n0' holds '\\x1b'"):
        supervisor.block_nodes()
    run_dir = tmp_path / "attempt-001"
    run_dir.mkdir()
    request = AttemptRequest(run_dir=str(run_dir), attempt=1, allocation=None, nodes=1, ranks_per_node=1,
                             launcher="local", argv=["{python}", "-c", "pass"], env={}, timeout_s=10)
    rep = supervisor.supervise(request)
    assert rep["exit_class"] == "config_error" and "PBS_NODEFILE" in rep["error"] and rep["nodes"] == []
    assert not (run_dir / "hostfile").exists(), "nothing launched"
    nodefile.write_text("x1000c0s0b0n0\r\nx1000c0s1b0n0\r\n")  # CRLF lines are two plain names
    assert supervisor.block_nodes() == ["x1000c0s0b0n0", "x1000c0s1b0n0"]
