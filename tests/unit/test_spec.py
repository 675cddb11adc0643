"""The campaign file: valid files load; every malformed one is refused with one precise
line (`field: message (file, line N)`) and exit code 2, by `campaign validate` and by
`campaign submit` before the ledger or any run directory is touched."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from campaign import spec
from campaign.errors import SpecError
from campaign.yamlfile import MAX_BYTES

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))

MINIMAL = "name: demo\nstages:\n  - kind: smoke\n"
FULL = """\
name: full.demo_1
description: every section written out
site:
  kind: local
  nodes: 3
  ranks_per_node: 2
  node_prefix: vn-
model:
  size: tiny
  n_layer: 2
data:
  source: file
  path: /data/tokens.bin
  dtype: uint32
trainer:
  parallelism: fsdp
  micro_batch_size: 2
  command: [python, my_train.py]
stages:
  - name: first
    kind: smoke
    nodes: 3
    steps: 4
  - name: second
    kind: smoke
    nodes: 1
    continue_on_failure: true
"""

# 2 MiB of a valid file padded with comments: refused on size before parsing.
HUGE = MINIMAL + ("# padding padding padding padding padding padding padding padding\n" * (MAX_BYTES // 60))
# Billion laughs: 9^7 leaves after expansion from a few hundred bytes of text.
BOMB = "".join(
    f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9) if i else ', '.join(['lol'] * 9)}]\n" for i in range(7)
) + "name: demo\nlol: *l6\n"

# (id, file text, the one expected problem line; {f} is the file's name)
MALFORMED: list[tuple[str, str | bytes, str]] = [
    # wrong types
    ("type-site-nodes", "name: demo\nsite:\n  kind: local\n  nodes: two\nstages:\n  - kind: smoke\n",
     "site.nodes: must be a whole number, got 'two' ({f}, line 4)"),
    ("type-stages-scalar", "name: demo\nstages: smoke\n",
     "stages: must be a list (one `- item` per line), got 'smoke' ({f}, line 2)"),
    ("type-name-list", "name: [a, b]\nstages:\n  - kind: smoke\n", "name: must be text, got a list ({f}, line 1)"),
    ("type-steps-float", "name: demo\nstages:\n  - kind: smoke\n    steps: 2.5\n",
     "stages[0].steps: must be a whole number, got 2.5 ({f}, line 4)"),
    ("type-bool", "name: demo\nstages:\n  - kind: smoke\n    continue_on_failure: maybe\n",
     "stages[0].continue_on_failure: must be true or false, got 'maybe' ({f}, line 4)"),
    # one problem for a value no member of a union takes, not one per member
    ("type-bool-or-auto", "name: demo\ntrainer:\n  warm_start: maybe\nstages:\n  - kind: smoke\n",
     "trainer.warm_start: must be true or false or one of 'auto', got 'maybe' ({f}, line 3)"),
    ("type-stage-scalar", "name: demo\nstages:\n  - smoke\n",
     "stages[0]: must be a mapping (`key: value` lines), got 'smoke' ({f}, line 3)"),
    ("type-site-scalar", "name: demo\nsite: local\nstages:\n  - kind: smoke\n",
     "site: must be a mapping (`key: value` lines), got 'local' ({f}, line 2)"),
    ("literal", "name: demo\nmodel:\n  size: huge\nstages:\n  - kind: smoke\n",
     "model.size: must be one of 'tiny', 'small', 'gpt2-124m', '1b' or 'auroragpt-2b'; got 'huge' ({f}, line 3)"),
    # unknown keys
    ("unknown-top", "name: demo\nstagez: []\nstages:\n  - kind: smoke\n",
     "stagez: unknown key; did you mean 'stages'? (known here: name, description, site, model, data, trainer, stages, "
     "observe, notify) ({f}, line 2)"),
    ("unknown-site", "name: demo\nsite:\n  kind: local\n  colour: blue\nstages:\n  - kind: smoke\n",
     "site.colour: unknown key (known here: {local_fields}) ({f}, line 4)"),
    ("unknown-stage", "name: demo\nstages:\n  - kind: smoke\n    stepz: 4\n",
     "stages[0].stepz: unknown key; did you mean 'steps'? (known here: {smoke_fields}) ({f}, line 4)"),
    ("unknown-trainer", "name: demo\ntrainer:\n  micro_batch: 4\nstages:\n  - kind: smoke\n",
     "trainer.micro_batch: unknown key; did you mean 'micro_batch_size'? (known here: {trainer_fields}) ({f}, line 3)"),
    # counts
    ("negative-nodes", "name: demo\nstages:\n  - kind: smoke\n    nodes: -1\n",
     "stages[0].nodes: must be >= 1, got -1 ({f}, line 4)"),
    ("zero-nodes", "name: demo\nstages:\n  - kind: smoke\n  - name: b\n    kind: smoke\n    nodes: 0\n",
     "stages[1].nodes: must be >= 1, got 0 ({f}, line 6)"),
    ("zero-steps", "name: demo\nstages:\n  - kind: smoke\n    steps: 0\n",
     "stages[0].steps: must be >= 1, got 0 ({f}, line 4)"),
    ("zero-timeout", "name: demo\nstages:\n  - kind: smoke\n    timeout_s: 0\n",
     "stages[0].timeout_s: must be > 0.0, got 0 ({f}, line 4)"),
    ("nodes-above-site", "name: demo\nsite:\n  kind: local\n  nodes: 2\nstages:\n  - kind: smoke\n    nodes: 3\n",
     "stages[0].nodes: 3 nodes asked, but the site has 2 ({f}, line 7)"),
    # required fields and names
    ("missing-stages", "name: demo\n", "stages: required field is missing ({f}, line 1)"),
    ("empty-stages", "name: demo\nstages: []\n", "stages: must list at least 1 stage, got 0 ({f}, line 2)"),
    ("missing-name", "stages:\n  - kind: smoke\n", "name: required field is missing ({f}, line 1)"),
    ("bad-name", "name: my campaign!\nstages:\n  - kind: smoke\n",
     "name: 'my campaign!' is not a valid name: use letters, digits, '.', '_' and '-', starting with a letter "
     "or digit, at most 64 characters ({f}, line 1)"),
    ("bad-stage-name", "name: demo\nstages:\n  - kind: smoke\n    name: -x\n",
     "stages[0].name: '-x' is not a valid name: use letters, digits, '.', '_' and '-', starting with a letter "
     "or digit, at most 64 characters ({f}, line 4)"),
    ("duplicate-stage-names", "name: demo\nstages:\n  - kind: smoke\n  - kind: smoke\n",
     "stages[1]: stage name 'smoke' is already used by stages[0] ({f}, line 4)"),
    ("data-file-without-path", "name: demo\ndata:\n  source: file\nstages:\n  - kind: smoke\n",
     "data.path: required when data.source is 'file' ({f}, line 2)"),
    # kinds
    ("unknown-stage-kind", "name: demo\nstages:\n  - kind: smoke\n  - kind: smokey\n",
     "stages[1].kind: unknown stage kind 'smokey'; known: {stage_kinds} ({f}, line 4)"),
    ("missing-stage-kind", "name: demo\nstages:\n  - steps: 3\n",
     "stages[0].kind: required field is missing; known stage kinds: {stage_kinds} ({f}, line 3)"),
    ("unknown-site-kind", "name: demo\nsite:\n  kind: lcal\nstages:\n  - kind: smoke\n",
     "site.kind: unknown site kind 'lcal'; known: {site_kinds} ({f}, line 3)"),
    # batch sites
    ("aurora-missing-account", "name: demo\nsite:\n  kind: aurora\n  nodes: 2\nstages:\n  - kind: smoke\n",
     "site.account: required field is missing ({f}, line 2)"),
    ("aurora-bad-walltime", "name: demo\nsite:\n  kind: aurora\n  account: p\n  walltime: 6h\nstages:\n  - kind: smoke\n",
     "site.walltime: walltime must be HH:MM:SS (e.g. 06:00:00), got '6h' ({f}, line 5)"),
    ("aurora-launcher", "name: demo\nsite:\n  kind: aurora\n  account: p\n  launcher: srun\nstages:\n  - kind: smoke\n",
     "site.launcher: must be one of 'pals' or 'mpich'; got 'srun' ({f}, line 5)"),
    ("aurora-unknown-key", "name: demo\nsite:\n  kind: aurora\n  account: p\n  filesystem: flare\nstages:\n"
     "  - kind: smoke\n",
     "site.filesystem: unknown key; did you mean 'filesystems'? (known here: {aurora_fields}) ({f}, line 5)"),
    ("polaris-negative-spares", "name: demo\nsite:\n  kind: polaris\n  account: p\n  spares: -1\nstages:\n"
     "  - kind: smoke\n", "site.spares: must be >= 0, got -1 ({f}, line 5)"),
    ("slurm-nodes-above-site", "name: demo\nsite:\n  kind: slurm\n  nodes: 4\nstages:\n  - kind: scaling\n"
     "    node_counts: [1, 8]\n", "stages[0].node_counts: 8 nodes asked, but the site has 4 ({f}, line 7)"),
    ("slurm-walltime-type", "name: demo\nsite:\n  kind: slurm\n  walltime: 3600\nstages:\n  - kind: smoke\n",
     "site.walltime: must be text, got 3600 ({f}, line 4)"),
    # the document itself
    ("empty-file", "", "file is empty: expected a mapping with name, site and stages ({f})"),
    ("only-comments", "# name: demo\n", "file is empty: expected a mapping with name, site and stages ({f})"),
    ("top-level-list", "- name: demo\n- stages: []\n",
     "(top level): expected a mapping (name: ..., stages: ...), got a list ({f}, line 1)"),
    ("top-level-scalar", "\n\nhello\n",
     "(top level): expected a mapping (name: ..., stages: ...), got a single value ({f}, line 3)"),
    ("duplicate-key", "name: demo\nstages:\n  - kind: smoke\nname: other\n",
     "name: duplicate key; keep one of them ({f}, lines 1 and 4)"),
    ("duplicate-nested-key", "name: demo\nstages:\n  - kind: smoke\n    steps: 1\n    steps: 2\n",
     "stages[0].steps: duplicate key; keep one of them ({f}, lines 4 and 5)"),
    ("non-text-key", "name: demo\nstages:\n  - kind: smoke\n    3: x\n",
     "stages[0]: key '3' is read as int, not text; put it in quotes if you mean it ({f}, line 4)"),
    ("merge-key", "base: &b {kind: smoke}\nname: demo\nstages:\n  - <<: *b\n",
     "stages[0]: merge keys (<<) are not supported; write the values out ({f}, line 4)"),
    ("huge", HUGE, f"file is {len(HUGE.encode()):,} bytes; campaign files are limited to {MAX_BYTES:,} ({{f}})"),
    ("alias-bomb", BOMB,
     "l5: too many values after alias expansion (limit 100,000); is this an alias bomb? ({f}, line 6)"),
    ("recursive-alias", "name: demo\nloop: &a [*a]\nstages:\n  - kind: smoke\n",
     "loop: nested more than 64 levels deep; is an alias recursive? ({f}, line 2)"),
    ("python-tag", "name: !!python/object/apply:os.system ['touch {marker}']\nstages:\n  - kind: smoke\n",
     "name: tag !!python/object/apply:os.system is not allowed; campaign files are plain YAML (no tags) ({f}, line 1)"),
    ("python-tag-scalar", "name: demo\nstages:\n  - kind: smoke\n    steps: !!python/name:os.system\n",
     "stages[0].steps: tag !!python/name:os.system is not allowed; campaign files are plain YAML (no tags) "
     "({f}, line 4)"),
    ("custom-tag", "name: demo\nstages:\n  - !Stage {kind: smoke}\n",
     "stages[0]: tag !Stage is not allowed; campaign files are plain YAML (no tags) ({f}, line 3)"),
    ("yaml-indentation", "name: demo\nstages:\n  - kind: smoke\n   steps: 3\n",
     "invalid YAML: expected <block end>, but found '<block mapping start>' (while parsing a block collection); "
     "check the indentation ({f}, line 4, column 4)"),
    ("yaml-unclosed", "name: demo\nstages: [\n  {kind: smoke}\n",
     "invalid YAML: expected ',' or ']', but got '<stream end>' (while parsing a flow sequence) ({f}, line 4, column 1)"),
    ("not-utf8", b"name: demo\ndescription: caf\xe9\nstages:\n  - kind: smoke\n",
     "not UTF-8 text: byte 0xe9 cannot be decoded (save the file as UTF-8) ({f}, line 2, column 17)"),
]


def _fields(model: type) -> str:
    return ", ".join(model.model_fields)  # type: ignore[attr-defined]


def _expected(template: str, path: Path, marker: Path) -> str:
    from campaign import executors, stages
    from campaign.executors.aurora import AuroraSite
    from campaign.executors.local import LocalSite
    from campaign.stages.smoke import SmokeStage
    from campaign.train.config import TrainConfig

    return template.format(f=path.name, marker=marker, stage_kinds=", ".join(stages.KINDS),
                           site_kinds=", ".join(executors.KINDS), smoke_fields=_fields(SmokeStage),
                           local_fields=_fields(LocalSite), aurora_fields=_fields(AuroraSite),
                           trainer_fields=_fields(TrainConfig))


@pytest.fixture(params=MALFORMED, ids=[case[0] for case in MALFORMED])
def malformed(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, str]:
    """A malformed campaign file and the one problem line it must produce."""
    ident, text, template = request.param
    path = tmp_path / f"{ident}.yaml"
    marker = tmp_path / "pwned"
    if isinstance(text, str):
        text = text.replace("{marker}", str(marker)).encode()
    path.write_bytes(text)
    return path, _expected(template, path, marker)


# --- valid files -----------------------------------------------------------------------

@pytest.mark.parametrize("example", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_examples_load(example: Path) -> None:
    s = spec.load(example)
    assert s.stages and s.name


def test_local_example_is_what_the_docs_say() -> None:
    s = spec.load(REPO / "examples" / "local.yaml")
    assert (s.name, s.site.kind, s.site.nodes) == ("local-demo", "local", 3)  # 2 active in each stage, a spare
    assert [st.nodes for st in s.stages] == [None, 2, None, 2, 2]
    assert [st.resolved_name for st in s.stages][:1] == ["smoke"]


def test_minimal_file_gets_defaults(tmp_path: Path) -> None:
    path = tmp_path / "min.yaml"
    path.write_text(MINIMAL)
    s = spec.load(path)
    assert s.site.kind == "local" and s.model.size == "tiny" and s.data.source == "synthetic"
    assert [(st.resolved_name, st.kind, st.nodes) for st in s.stages] == [("smoke", "smoke", None)]


def test_full_file(tmp_path: Path) -> None:
    path = tmp_path / "full.yaml"
    path.write_text(FULL)
    s = spec.load(path)
    assert s.site.node_names() == ["vn-0", "vn-1", "vn-2"]
    assert [st.resolved_name for st in s.stages] == ["first", "second"]
    assert s.stage("second").continue_on_failure is True
    assert s.trainer.command == ["python", "my_train.py"] and s.data.dtype == "uint32"


def test_digest_ignores_formatting_but_not_content(tmp_path: Path) -> None:
    a, b, c = tmp_path / "a.yaml", tmp_path / "b.yaml", tmp_path / "c.yaml"
    a.write_text(MINIMAL)
    b.write_text("# a comment\nstages: [{kind: smoke, steps: 3}]\nname: 'demo'\n")  # steps: 3 is the default
    c.write_text(MINIMAL.replace("smoke\n", "smoke\n    steps: 4\n"))
    assert spec.load(a).digest() == spec.load(b).digest() != spec.load(c).digest()


def test_validate_prints_the_resolved_spec_which_loads_back(tmp_path: Path, run_cli) -> None:
    path = tmp_path / "full.yaml"
    path.write_text(FULL)
    code, out, err = run_cli("validate", path)
    assert code == 0 and all(line.startswith("warning: ") for line in err.splitlines())
    assert "trainer.micro_batch_size, trainer.parallelism: built-in trainer field(s)" in err  # FULL has a command
    assert out.startswith(f"# {path}: valid; spec digest {spec.load(path).digest()[:12]}\n")
    again = tmp_path / "again.yaml"
    again.write_text(out)
    assert spec.load(again) == spec.load(path)


# --- malformed files -------------------------------------------------------------------

def test_at_least_twenty_malformed_cases() -> None:
    assert len(MALFORMED) >= 20


def test_malformed_file_names_field_file_and_line(malformed: tuple[Path, str]) -> None:
    path, expected = malformed
    start = time.monotonic()
    with pytest.raises(SpecError) as info:
        spec.load(path)
    assert time.monotonic() - start < 5, "refusing a file must be quick (alias bombs, huge files)"
    assert info.value.problems == [expected]
    assert str(info.value) == f"{path}: 1 problem\n  {expected}"
    assert info.value.exit_code == 2
    assert not (path.parent / "pwned").exists(), "a YAML tag ran code"


def test_validate_refuses_malformed_file(malformed: tuple[Path, str], run_cli) -> None:
    path, expected = malformed
    code, out, err = run_cli("validate", path)
    assert code == 2
    assert out == ""
    assert err == f"error: {path}: 1 problem\n  {expected}\n"


def test_submit_refuses_malformed_file_before_the_ledger(malformed: tuple[Path, str], run_cli, tmp_path: Path) -> None:
    path, expected = malformed
    workdir = tmp_path / "work"
    code, out, err = run_cli("submit", path, "--workdir", workdir)
    assert code == 2
    assert f"  {expected}\n" in err
    assert not workdir.exists(), "submit touched the work directory (ledger or run directories) for a bad file"


def test_missing_file(tmp_path: Path, run_cli) -> None:
    path = tmp_path / "nope.yaml"
    problem = "cannot read the file: No such file or directory (nope.yaml)"
    with pytest.raises(SpecError) as info:
        spec.load(path)
    assert info.value.problems == [problem]
    for args in (("validate", path), ("submit", path, "--workdir", tmp_path / "work")):
        code, out, err = run_cli(*args)
        assert (code, out) == (2, "")
        assert err == f"error: {path}: 1 problem\n  {problem}\n"
    assert not (tmp_path / "work").exists()


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    path = tmp_path / "many.yaml"
    path.write_text("name: demo\nsite:\n  kind: local\n  nodes: 0\nstages:\n  - kind: smoke\n    steps: 0\n"
                    "    colour: red\n")
    with pytest.raises(SpecError) as info:
        spec.load(path)
    assert str(info.value).startswith(f"{path}: 3 problems\n")
    assert [p.split(":")[0] for p in info.value.problems] == ["site.nodes", "stages[0].steps", "stages[0].colour"]


def test_parse_without_a_file_names_the_source() -> None:
    with pytest.raises(SpecError) as info:
        spec.parse({"name": "demo", "stages": [{"kind": "smoke", "nodes": 0}]}, "remote request")
    assert info.value.problems == ["stages[0].nodes: must be >= 1, got 0 (remote request)"]


def test_plain_yaml_values_still_work(tmp_path: Path) -> None:
    """The tag allow-list keeps YAML's plain scalars: null, bools, ints, floats, quoted text."""
    path = tmp_path / "plain.yaml"
    path.write_text("name: '007'\ndescription: !!str 42\ntrainer:\n  max_grad_norm: null\n  compile: yes\n"
                    "  lr: 1.0e-3\nstages:\n  - {kind: smoke, steps: 0x10}\n")
    s = spec.load(path)
    assert (s.name, s.description, s.trainer.max_grad_norm, s.trainer.compile) == ("007", "42", None, True)
    assert s.trainer.lr == pytest.approx(1e-3) and s.stages[0].steps == 16
    assert yaml.safe_load(path.read_text())["name"] == "007"


def _stage_model(kind: str) -> type:
    from campaign import stages
    from campaign.stagebase import StageSpec

    module = stages.module(kind)
    return next(v for v in vars(module).values()
                if isinstance(v, type) and issubclass(v, StageSpec) and getattr(v.model_fields.get("kind"), "default", None) == kind)


def test_every_stage_kind_names_its_own_fields_for_an_unknown_key(tmp_path: Path) -> None:
    from campaign import stages

    for kind in stages.KINDS:
        path = tmp_path / f"{kind}.yaml"
        path.write_text(f"name: demo\nstages:\n  - kind: {kind}\n    timeout_z: 5\n")
        with pytest.raises(SpecError) as info:
            spec.load(path)
        fields = ", ".join(_stage_model(kind).model_fields)
        expected = (f"stages[0].timeout_z: unknown key; did you mean 'timeout_s'? (known here: {fields}) "
                    f"({path.name}, line 4)")
        assert expected in info.value.problems, kind


def test_warm_start_true_is_refused_where_the_launcher_hands_pmi_over_by_descriptor(tmp_path: Path) -> None:
    # MPICH's Hydra gives each rank PMI_FD, an inherited descriptor a fork server's child lacks
    # (tests/train/test_warm.py measures it); PALS (PMIx over a socket) may warm-start.
    text = ("name: w\nsite: {kind: aurora, account: A, launcher: %s}\ntrainer: {warm_start: true}\n"
            "stages:\n  - kind: smoke\n")
    (tmp_path / "hydra.yaml").write_text(text % "mpich")
    with pytest.raises(SpecError) as err:
        spec.load(tmp_path / "hydra.yaml")
    assert "trainer.warm_start: the 'mpich' launcher" in str(err.value) and "PMI_FD" in str(err.value)
    (tmp_path / "pals.yaml").write_text(text % "pals")
    assert spec.load(tmp_path / "pals.yaml").trainer.warm_start is True
