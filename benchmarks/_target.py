"""Targets: every benchmark states what it must meet, prints the verdict, and exits 1 on a miss.

Not run on its own; the scripts beside it import it (`python benchmarks/x.py` puts benchmarks/
on sys.path):

    from _target import Targets, skip
    t = Targets("benchmarks/x.py")
    t.check("detection s", detect, "<=", 3 * step + 10)
    t.exit()                      # prints every verdict; exit 1 if one was missed, else 0

A benchmark that cannot run here (no GPU, no nanoGPT checkout) calls `skip(reason)`: the
reason is printed and the exit status is 0, so `make bench-smoke` passes on a CPU machine
without pretending a GPU figure was measured. Exit status 2 stays what argparse and the
scripts use for a bad command line; anything else non-zero means the benchmark broke.
"""

from __future__ import annotations

import math
import operator
import sys
from typing import NoReturn

OPS = {"<=": operator.le, "<": operator.lt, ">=": operator.ge, ">": operator.gt, "==": operator.eq}


class Targets:
    """The targets one benchmark checks, in the order it checks them."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.verdicts: list[tuple[str, bool]] = []

    def check(self, what: str, value: float, op: str, bound: float, unit: str = "") -> bool:
        """Judge `value op bound` (NaN never meets a target), print it, remember it."""
        if op not in OPS:
            raise ValueError(f"op must be one of {', '.join(OPS)}, got {op!r}")
        met = not (isinstance(value, float) and math.isnan(value)) and bool(OPS[op](value, bound))
        line = f"target {what}: {_fmt(value)}{unit} {op} {_fmt(bound)}{unit}: {'met' if met else 'MISSED'}"
        print(line, flush=True)
        self.verdicts.append((line, met))
        return met

    def require(self, what: str, ok: bool, detail: str = "") -> bool:
        """A target that is a condition, not a number (e.g. every policy met the same faults)."""
        line = f"target {what}: {'met' if ok else 'MISSED'}{f' ({detail})' if detail else ''}"
        print(line, flush=True)
        self.verdicts.append((line, bool(ok)))
        return bool(ok)

    @property
    def missed(self) -> list[str]:
        return [line for line, met in self.verdicts if not met]

    def exit(self) -> NoReturn:
        """Exit 1 if any target was missed (or none was checked: a benchmark must judge one)."""
        if not self.verdicts:
            print(f"{self.name}: no target was checked", flush=True)
            sys.exit(1)
        missed = self.missed
        print(f"{self.name}: {len(self.verdicts) - len(missed)}/{len(self.verdicts)} targets met"
              + (f"; MISSED: {'; '.join(missed)}" if missed else ""), flush=True)
        sys.exit(1 if missed else 0)


def skip(name: str, reason: str) -> NoReturn:
    """This benchmark cannot run here: say why and exit 0 (nothing was measured, nothing missed)."""
    print(f"{name}: SKIPPED: {reason}", flush=True)
    sys.exit(0)


def has_cuda() -> bool:
    """A CUDA device torch can use (False where torch is the CPU wheel)."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def _fmt(x: float) -> str:
    if isinstance(x, (int, float)) and abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.4g}" if isinstance(x, float) else str(x)
