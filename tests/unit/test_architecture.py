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
* the ledger's read models (`campaign.ledger.reads`) never import its writes;
* the project's modules import each other without a circle, and no module imports one of a
  higher layer (`LAYERS`, the same table as docs/architecture.md's "Layers"). These two read
  the source (ast), not a running interpreter: every `import` statement counts, a function's
  own imports too (a lazy import is still a dependency, and a circle of lazy imports is one
  a refactor can close); only those under `if TYPE_CHECKING:` do not: they name a type for
  an annotation and never run (a stage module names the `StageContext` it is handed).
"""

from __future__ import annotations

import ast
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
    (tmp_path / "a.txt").write_text("hello")
    commands = {
        "help": ["--help"],
        "validate": ["validate", str(REPO / "examples" / "local.yaml")],
        "status": ["status", "--db", url],
        "status-json": ["status", "--json", "--db", url],
        "db-current": ["db", "current", "--db", url],
        "nodes-list": ["nodes", "list", "--db", url],
        "data-prepare": ["data", "prepare", str(tmp_path / "a.txt"), "--out", str(tmp_path / "a.bin")],
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


@pytest.mark.parametrize("module", ["campaign.report", "campaign.exits", "campaign.errors", "campaign.rundir",
                                    "campaign.signatures", "campaign.guard", "campaign.runfiles", "campaign.fields",
                                    "campaign.heartbeatslot"])
def test_contract_helpers_need_only_the_standard_library(module: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", f"import json, sys, {module}\n"
         "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} - set(sys.stdlib_module_names))))"],
        capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 0, proc.stderr
    third_party = [m for m in json.loads(proc.stdout) if m != "campaign" and not m.startswith("_") and m != "__main__"]
    assert third_party == []


# --- the import graph, from the source -------------------------------------------------
PACKAGE_DIRS = {"campaign": "campaign", "stages": "campaign.stages", "executors": "campaign.executors",
                "migrations": "campaign.migrations"}
"""Source folder -> the package it is installed as (pyproject's package-dir)."""

LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("foundation", ("campaign.__init__", "campaign.errors", "campaign.names", "campaign.exits", "campaign.report",
                    "campaign.rundir", "campaign.runfiles", "campaign.fields", "campaign.heartbeatslot",
                    "campaign.signatures", "campaign.yamlfile", "campaign.guard")),
    ("trainer", ("campaign.train",)),
    ("ledger", ("campaign.ledger", "campaign.migrations")),
    ("model", ("campaign.stagebase", "campaign.watchdog", "campaign.evidence", "campaign.goodput", "campaign.summary",
               "campaign.reference", "campaign.executors", "campaign.spec", "campaign.contract", "campaign.stages",
               "campaign.walltime", "campaign.lease", "campaign.observe.config")),
    ("attempt", ("campaign.attempt", "campaign.supervisor", "campaign.recovery", "campaign.runner", "campaign.block",
                 "campaign.checktrainer")),
    ("views", ("campaign.views", "campaign.plots", "campaign.progress", "campaign.export", "campaign.watch",
               "campaign.htmlreport", "campaign.observe")),
    ("driver", ("campaign.stagecontext", "campaign.engine", "campaign.dryrun")),
    ("operations", ("campaign.commands", "campaign.remote", "campaign.preflight")),
    ("cli", ("campaign.cli",)),
)
"""Lowest first; the same table as docs/architecture.md's "Layers". A module belongs to the
layer of its longest listed prefix (`campaign.__init__` is the package itself); it may import
its own layer and those below, never one above."""


def _modules() -> dict[str, Path]:
    found = {}
    for folder, package in PACKAGE_DIRS.items():
        for path in sorted((REPO / folder).rglob("*.py")):
            parts = list(path.relative_to(REPO / folder).with_suffix("").parts)
            if folder == "campaign" and parts[0] in PACKAGE_DIRS:
                continue
            if parts[-1] == "__init__" and (parts[:-1] or package != "campaign"):
                parts.pop()  # a package is its __init__, except `campaign` itself: then every module would be in it
            found[".".join([package, *parts])] = path
    return found


def _under_type_checking(tree: ast.AST) -> set[int]:
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return skip


def _imports(name: str, path: Path, modules: dict[str, Path]) -> dict[str, int]:
    """The project's modules that `name` imports (module -> first line), at any depth."""
    tree = ast.parse(path.read_text(), str(path))
    skip = _under_type_checking(tree)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: dict[str, int] = {}
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.setdefault(target, node.lineno)
    return found


def _graph() -> dict[str, dict[str, int]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _layer(module: str) -> int:
    best = (-1, -1)
    for rank, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if module == p or module.startswith(p + "."):
                best = max(best, (len(p), rank))
    return best[1]


def _cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_import_graph_sees_the_known_edges() -> None:
    """The parser itself: a top-level, a lazy (function-level) and a relative import."""
    graph = _graph()
    assert "campaign.supervisor" in graph and "campaign.stages.smoke" in graph and "campaign.executors.base" in graph
    assert "campaign.ledger.models" in graph["campaign.ledger.writes"]
    assert "campaign.executors.launchers" in graph["campaign.supervisor"]  # imported inside a function
    assert "campaign.engine" not in graph["campaign.stagecontext"]  # under TYPE_CHECKING only


def test_every_module_has_a_layer() -> None:
    assert [m for m in _graph() if _layer(m) < 0] == []


def test_the_project_imports_no_circle() -> None:
    assert _cycles(_graph()) == []


def test_no_module_imports_a_higher_layer() -> None:
    graph = _graph()
    upward = sorted(f"{m} ({LAYERS[_layer(m)][0]}) -> {t} ({LAYERS[_layer(t)][0]}), line {line}"
                    for m, targets in graph.items() for t, line in targets.items() if _layer(t) > _layer(m))
    assert upward == []
