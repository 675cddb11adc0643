"""The import rules of test_architecture.py, counting the imports under `if TYPE_CHECKING:` too.

A type-only import never runs, but it is still a dependency of the design: a module that
names a higher layer's class for an annotation is written against that layer, and a circle
of type-only imports is a circle a refactor keeps tripping over (engine <-> stagecontext
was one). Where a lower module needs to name what a higher one hands it, it defines a
`Protocol` of what it uses (`campaign.stagebase.Context` for the stage modules,
`campaign.stagecontext.Driver` for the stage context).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import test_architecture as arch


@contextmanager
def _type_only_imports_counted() -> Iterator[None]:
    """test_architecture's parser, skipping nothing under TYPE_CHECKING."""
    original = arch._under_type_checking
    arch._under_type_checking = lambda tree: set()
    try:
        yield
    finally:
        arch._under_type_checking = original


@pytest.fixture(scope="module")
def graph() -> dict[str, dict[str, int]]:
    """The project's import graph, every import statement counted (type-only ones too)."""
    with _type_only_imports_counted():
        return arch._graph()


def test_the_graph_counts_type_only_imports(tmp_path: Path) -> None:
    """The parser itself: an import under TYPE_CHECKING is an edge here, not in test_architecture."""
    probe = tmp_path / "probe.py"
    probe.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from campaign.engine import Engine\n")
    modules = arch._modules()
    assert arch._imports("campaign.probe", probe, modules) == {}
    with _type_only_imports_counted():
        assert arch._imports("campaign.probe", probe, modules) == {"campaign.engine": 3}


def test_no_circle_counting_type_only_imports(graph: dict[str, dict[str, int]]) -> None:
    assert arch._cycles(graph) == []


def test_no_import_up_a_layer_counting_type_only_imports(graph: dict[str, dict[str, int]]) -> None:
    upward = sorted(f"{m} ({arch.LAYERS[arch._layer(m)][0]}) -> {t} ({arch.LAYERS[arch._layer(t)][0]}), line {line}"
                    for m, targets in graph.items() for t, line in targets.items() if arch._layer(t) > arch._layer(m))
    assert upward == []


def test_stage_modules_never_name_the_driver() -> None:
    """A stage module sees `stagebase.Context` and `stagebase.Outcome`, not the engine or the
    stage context (the driver layer), in any form."""
    found = [f"{p.name}: {word}" for p in sorted((arch.REPO / "stages").glob("*.py"))
             for word in ("campaign.engine", "campaign.stagecontext", "StageContext", "AttemptOutcome")
             if word in p.read_text()]
    assert found == []
