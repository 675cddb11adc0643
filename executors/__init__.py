"""Sites: one module each (`local`, `aurora`, `polaris`, `slurm`), each a pydantic options
model plus a factory of fresh Parsl `Config`s. `KINDS` maps a site kind to its module name;
`batch` holds what the batch sites share and `launchers` the launch commands.

Installed as `campaign.executors`. Site modules import parsl only inside functions, so
validating a spec stays cheap.
"""

from __future__ import annotations

import importlib
from types import ModuleType

KINDS = ("local", "aurora", "polaris", "slurm")


def module(kind: str) -> ModuleType:
    """The module implementing a site kind."""
    if kind not in KINDS:
        raise KeyError(f"unknown site kind {kind!r}; known: {', '.join(KINDS)}")
    return importlib.import_module(f"campaign.executors.{kind}")
