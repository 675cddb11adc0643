"""Every third-party module the installed package imports is declared in pyproject.toml.

`pip install campaign` (no extras) must give a working trainer and `campaign plot`: a
module imported at module level anywhere in campaign/, stages/, executors/ or migrations/
must be a core dependency; an optional one (an extra) may only be imported inside a
function, and only from the modules listed in OPTIONAL. The names come from parsing the
sources, so the list cannot drift.
"""

from __future__ import annotations

import ast
import re
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")

REPO = Path(__file__).resolve().parents[2]
SOURCES = ("campaign", "stages", "executors", "migrations")
# import name -> (extra that declares it, the only files that may import it, lazily)
OPTIONAL = {"globus_compute_sdk": ("globus", {"campaign/remote.py"}),
            "tokenizers": ("data", {"campaign/train/tokenfile.py"}),
            "torchao": ("float8", {"campaign/train/float8.py"}),
            "tensorboard": ("tensorboard", {"campaign/observe/tensorboard.py"}),
            "wandb": ("wandb", {"campaign/observe/wandb.py"})}
# import name -> the only file that may import it: what torch's GPU builds bring with them
# (not ours to declare: a CPU build has none). That file is imported only inside a function,
# behind an ImportError guard (test_triton_stays_behind_the_guard).
WITH_TORCH = {"triton": "campaign/train/rotary_triton.py"}


def _imports() -> dict[str, list[tuple[str, bool]]]:
    """Third-party top-level import name -> [(file, imported at module level)]."""
    found: dict[str, list[tuple[str, bool]]] = {}
    for folder in SOURCES:
        for path in sorted((REPO / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            top_level = {id(n) for n in tree.body} | {id(n) for t in tree.body if isinstance(t, ast.If)
                                                      for n in t.body + t.orelse}
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    names = [node.module]
                else:
                    continue
                type_checking = any(isinstance(t, ast.If) and "TYPE_CHECKING" in ast.unparse(t.test)
                                    and node in ast.walk(t) for t in tree.body)
                for name in names:
                    top = name.split(".")[0]
                    if top in sys.stdlib_module_names or top == "campaign" or type_checking:
                        continue
                    found.setdefault(top, []).append((str(path.relative_to(REPO)), id(node) in top_level))
    return found


def _dist_names(requirements: list[str]) -> set[str]:
    return {re.split(r"[\s\[<>=!~;]", r, maxsplit=1)[0].lower().replace("_", "-") for r in requirements}


def test_every_import_is_declared() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    core = _dist_names(project["dependencies"])
    extras = {k: _dist_names(v) for k, v in project["optional-dependencies"].items()}
    dists = packages_distributions()
    problems = []
    for module, uses in sorted(_imports().items()):
        names = {d.lower().replace("_", "-") for d in dists.get(module, [module])}
        if names & core:
            continue
        if module in WITH_TORCH:
            problems += [f"{module}: imported by {f}, only {WITH_TORCH[module]} may" for f, _ in uses
                         if f != WITH_TORCH[module]]
            continue
        if module in OPTIONAL:
            extra, allowed = OPTIONAL[module]
            if not names & extras.get(extra, set()):
                problems.append(f"{module}: not in the {extra!r} extra")
            problems += [f"{module}: imported by {f}, only {sorted(allowed)} may (lazily)"
                         for f, _ in uses if f not in allowed]
            problems += [f"{module}: imported at module level by {f}" for f, top in uses if top]
            continue
        problems.append(f"{module} (distribution {sorted(names)}) is imported by {sorted({f for f, _ in uses})} "
                        "but is not a core dependency in pyproject.toml")
    assert problems == []


def test_the_check_sees_the_known_imports() -> None:
    found = _imports()
    for module in ("torch", "numpy", "matplotlib", "parsl", "sqlalchemy", "pydantic", "yaml", "psutil"):
        assert module in found, module


def test_triton_stays_behind_the_guard() -> None:
    """rotary_triton (which imports triton at its top) is imported by rotary.load_kernels
    alone, inside the function, under `except ImportError`: a CPU build of torch, which has
    no Triton, must still train."""
    found = []
    for folder in SOURCES:
        for path in sorted((REPO / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            parents = {id(c): n for n in ast.walk(tree) for c in ast.iter_child_nodes(n)}
            for node in ast.walk(tree):
                names = [a.name for a in node.names] if isinstance(node, (ast.Import, ast.ImportFrom)) else []
                if not any("rotary_triton" in n for n in names):
                    continue
                chain, up = [], parents.get(id(node))
                while up is not None:
                    chain.append(up)
                    up = parents.get(id(up))
                fn = next((c.name for c in chain if isinstance(c, ast.FunctionDef)), None)
                guard = any(isinstance(c, ast.Try) and any(h.type is not None and "ImportError" in ast.unparse(h.type)
                                                           for h in c.handlers) for c in chain)
                found.append((str(path.relative_to(REPO)), fn, guard))
    assert found == [("campaign/train/rotary.py", "load_kernels", True)]


# The tests of these extras skip when the package is missing (pytest.importorskip in
# tests/observe/ and tests/e2e/test_observe_e2e.py; tokenizers in tests/train/): here their
# absence is a failure, so a `make test` that dropped an extra cannot pass by skipping.
TESTED_EXTRAS = {"tensorboard": "tensorboard", "wandb": "wandb", "tokenizers": "test"}
"""import name -> the extra of pyproject.toml that `make test` installs it with."""


def _make_test_extras() -> set[str]:
    """The extras of the Makefile's `pip install -e ".[...]"` (what `make test` installs)."""
    [extras] = re.findall(r'pip install .*-e "\.\[([^\]]+)\]"', (REPO / "Makefile").read_text())
    return set(extras.split(","))


@pytest.mark.parametrize("module", sorted(TESTED_EXTRAS))
def test_the_extras_the_tests_need_are_installed(module: str) -> None:
    import importlib

    extras = _make_test_extras()
    extra = TESTED_EXTRAS[module]
    assert extra in extras, f"the Makefile's install ({sorted(extras)}) lacks the {extra!r} extra ({module})"
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert module in _dist_names(project["optional-dependencies"][extra]), f"{module} not in the {extra!r} extra"
    try:
        importlib.import_module(module)
    except ImportError as e:
        pytest.fail(f"{module} is not importable ({e}): its tests would skip, not run. `make test` installs it with "
                    f"the Makefile's extras .[{','.join(sorted(extras))}] ({module}: {extra!r}); "
                    f"in another venv: pip install -e '.[{extra}]'")
