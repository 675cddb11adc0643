"""Architecture decisions kept as tests (each in a fresh interpreter, so nothing an earlier
test imported can hide a violation):

* the CLI imports neither torch nor parsl: `campaign status` / `validate` / `--help` are
  instant and work on a login node without the training stack;
* the built-in trainer (`campaign.train.*`) never imports the ledger or SQLAlchemy: only
  the driver writes the ledger, the trainer writes files;
* `campaign.report`, the trainer-contract helper for users' own scripts, needs only the
  standard library;
* the operations layer (`campaign.commands`, which the CLI and the remote endpoint
  functions call) needs no click, torch or parsl;
* the ledger's read models (`campaign.ledger.reads`) never import its writes.
"""

from __future__ import annotations

import importlib.util
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import campaign.train

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "parsl")
LEDGER = ("campaign.ledger", "sqlalchemy", "alembic", "psycopg")
TRAIN_MODULES = sorted(f"campaign.train.{m.name}" for m in pkgutil.iter_modules(campaign.train.__path__)
                       # the Triton kernels import triton, which CPU builds of torch lack (rotary.load_kernels
                       # imports them only where it is; tests/unit/test_dependencies.py checks the guard)
                       if m.name != "rotary_triton" or importlib.util.find_spec("triton") is not None)


def _imported_after(code: str, *watch: str) -> dict[str, list[str]]:
    """Run `code` in a fresh interpreter; for each step it prints, the watched modules
    (by prefix) that were loaded by then. `code` calls `mark(label)` after each step."""
    prelude = f"""
import json, sys
_watch = {watch!r}
_seen = {{}}
def mark(label):
    _seen[label] = sorted(m for m in sys.modules if any(m == w or m.startswith(w + ".") for w in _watch))
"""
    epilogue = "\nprint('@@' + json.dumps(_seen))\n"
    proc = subprocess.run([sys.executable, "-c", prelude + code + epilogue], capture_output=True, text=True,
                          cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.rsplit("@@", 1)[1])


def test_importing_the_cli_imports_neither_torch_nor_parsl() -> None:
    seen = _imported_after("import campaign.cli\nmark('import')", *HEAVY)
    assert seen == {"import": []}


def test_light_commands_import_neither_torch_nor_parsl(tmp_path: Path) -> None:
    from campaign.ledger import open_ledger

    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    open_ledger(url).close()
    commands = {
        "help": ["--help"],
        "validate": ["validate", str(REPO / "examples" / "local.yaml")],
        "status": ["status", "--db", url],
        "status-json": ["status", "--json", "--db", url],
        "db-current": ["db", "current", "--db", url],
        "nodes-list": ["nodes", "list", "--db", url],
    }
    code = "from campaign.cli import main\n" + "".join(
        f"try:\n    main({argv!r}, standalone_mode=False)\nexcept SystemExit:\n    pass\nmark({label!r})\n"
        for label, argv in commands.items()
    )
    seen = _imported_after(code, *HEAVY)
    assert seen == {label: [] for label in commands}


def test_the_operations_layer_needs_no_click_torch_or_parsl() -> None:
    seen = _imported_after("import campaign.commands, campaign.remote\nmark('import')", "click", *HEAVY)
    assert seen == {"import": []}


def test_ledger_reads_never_import_writes() -> None:
    seen = _imported_after("import campaign.ledger.reads\nmark('reads')", "campaign.ledger.writes")
    assert seen == {"reads": []}


def test_trainer_modules_are_present() -> None:
    assert "campaign.train.config" in TRAIN_MODULES
    assert len(TRAIN_MODULES) >= 2


def test_trainer_never_imports_the_ledger() -> None:
    """Every module under campaign/train/ (whatever exists), imported one after another."""
    code = "import importlib\n" + "".join(f"importlib.import_module({m!r})\nmark({m!r})\n" for m in TRAIN_MODULES)
    seen = _imported_after(code, *LEDGER)
    offenders = {m: mods for m, mods in seen.items() if mods}
    assert offenders == {}, f"the trainer imports ledger code (first offender first): {offenders}"


@pytest.mark.parametrize("module", ["campaign.report", "campaign.exits", "campaign.errors"])
def test_contract_helpers_need_only_the_standard_library(module: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", f"import json, sys, {module}\n"
         "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} - set(sys.stdlib_module_names))))"],
        capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 0, proc.stderr
    third_party = [m for m in json.loads(proc.stdout) if m != "campaign" and not m.startswith("_") and m != "__main__"]
    assert third_party == []
