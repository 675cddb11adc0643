"""The preflight: every check `campaign submit` makes before anything is submitted or a
ledger row written (issue 38), through the real CLI (in process) and `remote.start_driver`.

What a user checks: the exit code, the one line per refusal naming the field and the fix, and
that the work directory (ledger, run directories) was not created. The scheduler commands are
faked only at PATH (empty `qsub`, `qstat`, `qdel` scripts): the boundary the preflight reads.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
AURORA = REPO / "examples" / "auroragpt-2b.yaml"
PBS_COMMANDS = ("qsub", "qstat", "qdel")


def _bin(tmp_path: Path, *commands: str) -> str:
    """A PATH holding only `commands` (each an empty script exiting 0)."""
    d = tmp_path / "bin"
    d.mkdir(exist_ok=True)
    for c in commands:
        (d / c).write_text("#!/bin/sh\nexit 0\n")
        (d / c).chmod(0o755)
    return str(d)


def _refusals(err: str) -> list[str]:
    """The refusal lines under the preflight's error heading."""
    return [line.strip() for line in err.splitlines()[1:] if line.startswith("  ")]


def _line_of(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def _filled(tmp_path: Path) -> tuple[Path, Path]:
    """examples/auroragpt-2b.yaml with the placeholders filled and data.path an existing file."""
    tokens = tmp_path / "tokens.bin"
    tokens.write_bytes(b"\0" * 64)
    text = AURORA.read_text().replace("/lus/flare/projects/YOUR_PROJECT/datasets/dolma-v1_7/tokens.bin", str(tokens))
    spec = tmp_path / "auroragpt-2b.yaml"
    spec.write_text(text.replace("YOUR_PROJECT", "datascience"))
    return spec, tokens


def test_the_shipped_aurora_example_is_refused_before_anything_is_written(run_cli, tmp_path):
    wd = tmp_path / "wd"
    code, _, err = run_cli("submit", AURORA, "--workdir", wd, env={"PATH": _bin(tmp_path)})
    assert code == 2
    assert "preflight refused the submission" in err and "Traceback" not in err
    refusals = _refusals(err)
    by_field = {line.split(":", 1)[0] for line in refusals}
    assert by_field == {"site.account", "site.worker_init", "data.path", "stages[1].reference.stage_run", "site.kind"}
    assert f"site.account: 'YOUR_PROJECT' is a placeholder: replace it with your own value (line " \
           f"{_line_of(AURORA, 'account: YOUR_PROJECT')})" in refusals
    assert any("auroragpt-2b-reference/loss-check is not in the ledger" in r for r in refusals)
    assert any("`qsub`, `qstat` and `qdel`" in r and "not on PATH here" in r for r in refusals)
    assert not wd.exists()  # no ledger, no run directory, no Parsl folder


def test_with_the_placeholders_filled_the_missing_reference_alone_is_named(run_cli, tmp_path):
    spec, _ = _filled(tmp_path)
    wd = tmp_path / "wd"
    code, _, err = run_cli("submit", spec, "--workdir", wd, env={"PATH": _bin(tmp_path, *PBS_COMMANDS)})
    assert code == 2
    assert _refusals(err) == [
        f"stages[1].reference.stage_run: auroragpt-2b-reference/loss-check is not in the ledger (there is no ledger "
        f"yet at {wd / 'ledger.db'}); record it first (the same file with `name: auroragpt-2b-reference` and "
        "`reference: {record: true}`, run on a known-good stack), or give `reference: {file: losses.csv}` (a "
        f"step,loss CSV) (line {_line_of(spec, 'stage_run: auroragpt-2b-reference')})"]
    assert not wd.exists()


def test_validate_preflight_and_the_dry_run_print_the_same_list(run_cli, tmp_path):
    spec, _ = _filled(tmp_path)
    path = _bin(tmp_path, *PBS_COMMANDS)
    code, out, _ = run_cli("validate", "--preflight", spec, "--workdir", tmp_path / "wd", env={"PATH": path})
    assert code == 2
    assert out.splitlines()[0].startswith(f"preflight: {spec}: 1 refusal, ")
    assert "  refuse  stages[1].reference.stage_run: auroragpt-2b-reference/loss-check is not in the ledger" in out
    # the dry run submits nothing: it shows the list, then the plan, and exits 0
    code, out, err = run_cli("submit", spec, "--dry-run", "--workdir", tmp_path / "wd", env={"PATH": path})
    assert code == 0 and "#PBS" in out
    assert "  refuse  stages[1].reference.stage_run: auroragpt-2b-reference/loss-check" in err
    code, out, _ = run_cli("submit", spec, "--dry-run", "--json", "--workdir", tmp_path / "wd", env={"PATH": path})
    doc = json.loads(out)
    assert [(f["field"], f["refuse"]) for f in doc["preflight"] if f["refuse"]] == [("stages[1].reference.stage_run", True)]
    assert not (tmp_path / "wd").exists()


def test_a_ledger_reference_must_hold_the_steps_the_check_compares(run_cli, tmp_path):
    wd = tmp_path / "wd"
    ref = tmp_path / "ref.csv"
    ref.write_text("step,loss\n" + "".join(f"{i},{4 - i / 100}\n" for i in range(1, 21)))
    assert run_cli("ledger", "import-reference", "known-good", ref, "--workdir", wd)[0] == 0
    spec = tmp_path / "uses.yaml"
    spec.write_text("name: uses-ref\nstages:\n  - kind: loss_check\n    steps: 30\n"
                    "    reference: {stage_run: known-good/run}\n")
    code, out, _ = run_cli("validate", "--preflight", spec, "--workdir", wd)
    assert code == 2
    assert ("stages[0].reference.stage_run: known-good/run has no loss for steps 26-30, which this stage compares "
            "(it has steps 1-20)") in out
    spec.write_text(spec.read_text().replace("steps: 30", "steps: 20"))
    code, out, _ = run_cli("validate", "--preflight", spec, "--workdir", wd)
    assert (code, out.strip()) == (0, f"preflight: {spec}: every check passed")
    # an earlier stage of the same campaign that records the reference needs no ledger row
    spec.write_text("name: self-ref\nstages:\n  - {name: ref, kind: loss_check, steps: 20}\n"
                    "  - {name: check, kind: loss_check, steps: 20, reference: {stage_run: self-ref/ref}}\n")
    assert run_cli("validate", "--preflight", spec, "--workdir", tmp_path / "empty")[0] == 0


def test_a_reference_file_must_exist_and_cover_the_check(run_cli, tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text("name: file-ref\nstages:\n  - kind: loss_check\n    steps: 10\n    window: 2\n"
                    "    reference: {file: losses.csv}\n")
    code, out, _ = run_cli("validate", "--preflight", spec, cwd=tmp_path.parent)
    assert code == 2
    assert (f"stages[0].reference.file: losses.csv (resolved against the campaign file's folder: "
            f"{tmp_path / 'losses.csv'}) does not exist (line 6)") in out
    (tmp_path / "losses.csv").write_text("step,loss\n1,3.0\n2,2.9\n")
    code, out, _ = run_cli("validate", "--preflight", spec, cwd=tmp_path.parent)
    assert code == 2 and "has no loss for step(s) 9-10, which this stage compares (it has steps 1-2)" in out


def test_a_relative_data_path_is_relative_to_the_campaign_file(run_cli, tmp_path):
    from campaign import spec as spec_mod
    from campaign.attempt import trainer_config
    from campaign.stagebase import Targets

    folder, elsewhere = tmp_path / "proj", tmp_path / "elsewhere"
    folder.mkdir()
    elsewhere.mkdir()
    spec = folder / "spec.yaml"
    spec.write_text("name: rel-data\ndata: {source: file, path: data/tokens.bin}\nstages:\n  - {kind: smoke, steps: 2}\n")
    code, out, _ = run_cli("validate", "--preflight", spec, "--workdir", tmp_path / "wd", cwd=elsewhere)
    assert code == 2
    assert (f"data.path: data/tokens.bin (resolved against the campaign file's folder: {folder / 'data/tokens.bin'}) "
            "does not exist; `campaign data prepare TEXTS --out FILE` writes a token file (line 2)") in out
    (folder / "data").mkdir()
    (folder / "data" / "tokens.bin").write_bytes(b"\1\0" * 100)
    assert run_cli("validate", "--preflight", spec, "--workdir", tmp_path / "wd", cwd=elsewhere)[0] == 0
    # and the trainer is handed that file, not a path under its run directory
    cfg = trainer_config(spec_mod.load(spec), Targets(steps=2), stage_dir=tmp_path / "stage", attempt=1,
                         spec_dir=folder)
    assert cfg.data.path == str(folder / "data" / "tokens.bin")


@pytest.mark.parametrize("value, found", [
    ("/lus/flare/projects/<project>/venv", "'<project>'"),
    ("CHANGE_ME", "'CHANGE_ME'"),
])
def test_placeholders_are_refused_wherever_they_stand(run_cli, tmp_path, value, found):
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"name: ph\ndescription: fill in <project> later\ntrainer:\n  progress: stdout\n"
                    f"  command: [python, '{value}']\n  step_pattern: 'step (?P<step>\\d+) loss (?P<loss>\\S+)'\n"
                    "stages:\n  - {kind: smoke, steps: 2}\n")
    code, out, _ = run_cli("validate", "--preflight", spec, "--workdir", tmp_path / "wd")
    assert code == 2, out
    assert f"  refuse  trainer.command[1]: {found} is a placeholder: replace it with your own value (line 5)" in out
    assert "description" not in out  # free text may say <project>


def test_a_regex_group_is_no_placeholder(run_cli, tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text("name: own\ntrainer:\n  command: [python, train.py]\n  progress: stdout\n"
                    "  step_pattern: 'iter (?P<step>\\d+): loss (?P<loss>[0-9.]+)'\n"
                    "stages:\n  - {kind: smoke, steps: 2}\n")
    code, out, _ = run_cli("validate", "--preflight", spec, "--workdir", tmp_path / "wd")
    assert "placeholder" not in out


def test_a_stage_asking_more_nodes_than_the_site_has_is_refused_before_the_ledger(run_cli, tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text("name: too-many\nsite: {kind: local, nodes: 2}\nstages:\n  - {kind: smoke, steps: 2, nodes: 4}\n")
    code, _, err = run_cli("submit", spec, "--workdir", tmp_path / "wd")
    assert code == 2
    assert "stages[0].nodes: 4 nodes asked, but the site has 2" in err
    assert not (tmp_path / "wd").exists()


def test_an_endpoint_submission_runs_the_preflight_on_the_endpoint_host_first(tmp_path):
    """`remote.start_driver` is the function the endpoint runs (the Globus Compute service,
    which cannot run here, only carries the call: the stand-in of tests/remote does that)."""
    from campaign import remote

    wd = tmp_path / "wd"
    text = ("name: remote-pf\ndata: {source: file, path: tokens.bin}\nsite: {kind: local, nodes: 1}\n"
            "stages:\n  - {kind: smoke, steps: 2}\n")
    answer = remote.start_driver(spec_text=text, filename="remote-pf.yaml", workdir=str(wd))
    assert answer["ok"] is False and answer["exit_code"] == 2
    assert ("data.path: tokens.bin is relative, and the file was submitted from another host: give the absolute path "
            "on the endpoint's host (line 2)") in answer["error"]
    assert not wd.exists()
    answer = remote.start_driver(spec_text=text.replace("tokens.bin", str(tmp_path / "none.bin")),
                                 filename="remote-pf.yaml", workdir=str(wd))
    assert answer["ok"] is False and f"data.path: {tmp_path / 'none.bin'} does not exist;" in answer["error"]
    assert not wd.exists()


def test_what_only_the_machine_can_tell_is_a_warning_not_a_refusal(run_cli, tmp_path):
    """Copper off at 1000 nodes with the venv on Lustre, and a work directory in $HOME: the
    site's own advice (executors/aurora.py, quoted from ALCF's pages), printed, never refused."""
    spec, _ = _filled(tmp_path)
    text = spec.read_text().replace("nodes: 512 ", "nodes: 1000").replace("copper: auto", "copper: false")
    spec.write_text(text.replace("stage_run: auroragpt-2b-reference/loss-check", "record: true"))
    code, out, _ = run_cli("validate", "--preflight", spec, "--workdir", Path.home() / "campaigns",
                           env={"PATH": _bin(tmp_path, *PBS_COMMANDS)})
    assert code == 0, out
    warned = [line[len("  warn    "):] for line in out.splitlines() if line.startswith("  warn")]
    assert any(w.startswith("site.copper: off for 1000 nodes while Python imports from /lus/flare/projects/"
                            "datascience/venvs/campaign") for w in warned), warned
    assert any(w.startswith(f"--workdir {Path.home() / 'campaigns'}: it is under your home directory") for w in warned)


def test_plain_validate_warns_of_copper_off_at_scale_from_the_file_alone(run_cli, tmp_path):
    """Issue 38 item 4: "a warning at validate when it is off there and the venv is on Lustre".
    Plain `validate` (no --preflight, no host looked at) prints it on stderr and still exits 0;
    at 999 nodes (below ALCF's 1000) it does not."""
    spec, _ = _filled(tmp_path)
    text = spec.read_text().replace("copper: auto", "copper: false")
    spec.write_text(text.replace("nodes: 512 ", "nodes: 1000"))
    code, out, err = run_cli("validate", spec)
    assert code == 0 and "valid; spec digest" in out, err
    assert ("warning: site.copper: off for 1000 nodes while Python imports from /lus/flare/projects/datascience/"
            "venvs/campaign") in err, err
    spec.write_text(text.replace("nodes: 512 ", "nodes: 999 "))
    code, _, err = run_cli("validate", spec)
    assert code == 0 and "site.copper" not in err, err
