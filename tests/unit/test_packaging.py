"""The wheel holds every package of the source tree: pyproject.toml lists its packages by hand
(`[tool.setuptools] packages`, with `package-dir` mapping stages/, executors/ and migrations/),
so a new package folder that is not listed would be left out of the wheel and only `make
wheel-check` (CI) would find it, after the whole suite. Found here in a second instead."""

from __future__ import annotations

import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]


def test_every_package_folder_is_listed_for_the_wheel() -> None:
    tool = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    roots = {name: REPO / folder for name, folder in tool["package-dir"].items()}
    found = set()
    for name, folder in roots.items():
        for init in folder.rglob("__init__.py"):
            rel = init.parent.relative_to(folder)
            if "__pycache__" in rel.parts:
                continue
            found.add(".".join([name, *rel.parts]) if rel.parts else name)
    missing = sorted(found - set(tool["packages"]))
    assert missing == [], f"packages not listed in pyproject.toml's [tool.setuptools] packages (left out of the wheel): {missing}"
