"""Stage kinds: one module each (`smoke`, `loss_check`, `scaling`, `long_run`, `resume_test`). `KINDS` maps a kind to its module name.

Installed as `campaign.stages`, so Parsl workers and the engine import
`campaign.stages.smoke` by reference from the installed package.
"""

from __future__ import annotations

import importlib
from types import ModuleType

KINDS = ("smoke", "loss_check", "scaling", "long_run", "resume_test")


def module(kind: str) -> ModuleType:
    """The module implementing a stage kind."""
    if kind not in KINDS:
        raise KeyError(f"unknown stage kind {kind!r}; known: {', '.join(KINDS)}")
    return importlib.import_module(f"campaign.stages.{kind}")
