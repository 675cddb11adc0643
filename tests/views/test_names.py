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
