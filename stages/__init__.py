"""Stage kinds: one module each (`smoke`, `loss_check`, `scaling`, `long_run`, `resume_test`),
named as its kind. `KINDS` lists them; `module(kind)` and `spec_class(kind)` find a kind's
module and its spec class. A new kind is its module and nothing else: it is found here.

Installed as `campaign.stages`, so Parsl workers and the engine import
`campaign.stages.smoke` by reference from the installed package.
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType
from typing import Any

BUILT_IN = ("smoke", "loss_check", "scaling", "long_run", "resume_test")
"""The built-in kinds, in the order a campaign usually runs them (messages list them so)."""
KINDS = BUILT_IN + tuple(sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name not in BUILT_IN))
"""Every stage kind: the built-in ones, then any other module of this package."""


def module(kind: str) -> ModuleType:
    """The module implementing a stage kind."""
    if kind not in KINDS:
        raise KeyError(f"unknown stage kind {kind!r}; known: {', '.join(KINDS)}")
    return importlib.import_module(f"campaign.stages.{kind}")


def spec_class(kind: str) -> Any:
    """The spec class of a stage kind: the one `StageSpec` subclass its module defines."""
    from campaign.stagebase import StageSpec

    mod = module(kind)
    (cls,) = [v for v in vars(mod).values()
              if isinstance(v, type) and issubclass(v, StageSpec) and v.__module__ == mod.__name__]
    return cls
