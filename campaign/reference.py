"""Reference loss curves for the loss check and the scaling stage.

A reference is one of: a named earlier stage run in the ledger (`stage_run: CAMPAIGN/STAGE`),
a CSV of `step,loss` (`file: PATH`, relative to the campaign file), or this run itself
(`record: true`).
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from campaign.errors import SpecError
from campaign.stagebase import StrictModel


class Reference(StrictModel):
    """Where the reference losses come from: exactly one of the three fields."""

    stage_run: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
    """An earlier stage run in the ledger, as CAMPAIGN/STAGE."""
    file: str | None = None
    """A CSV with a header `step,loss` (one row per step)."""
    record: bool = False
    """This run is the reference: it passes when it completes with finite losses."""

    @model_validator(mode="after")
    def _exactly_one(self) -> Reference:
        given = [k for k in ("stage_run", "file") if getattr(self, k)] + (["record"] if self.record else [])
        if len(given) != 1:
            raise ValueError(f"give exactly one of stage_run, file or record (got {', '.join(given) or 'none'})")
        return self


def read_csv(path: Path) -> dict[int, float]:
    """`step,loss` rows; a clear SpecError on anything else."""
    try:
        with path.open(newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f))
    except OSError as e:
        raise SpecError(str(path), [f"cannot read the reference file: {e.strerror or e}"]) from None
    except UnicodeDecodeError as e:
        raise SpecError(str(path), [not_text(e)]) from None
    except csv.Error as e:
        raise SpecError(str(path), [f"not a CSV file: {e}"]) from None
    if rows and rows[0] and not _is_number(rows[0][0]):
        header = [h.strip().lower() for h in rows[0]]
        if header[:2] != ["step", "loss"]:
            raise SpecError(str(path), [f"line 1: expected the header step,loss, got {','.join(rows[0])}"])
        rows = rows[1:]
    out: dict[int, float] = {}
    for i, row in enumerate(rows, 2):
        if not row:
            continue
        try:
            out[int(row[0])] = float(row[1])
        except (ValueError, IndexError):
            raise SpecError(str(path), [f"line {i}: expected step,loss numbers, got {','.join(row)}"]) from None
    return out


def not_text(e: UnicodeDecodeError) -> str:
    """The problem line for a file that is not UTF-8 text (a binary file given as a CSV)."""
    return f"not a text file: byte 0x{e.object[e.start]:02x} at offset {e.start} is not UTF-8; expected a CSV file"


def from_ledger(ledger: Any, ref: str) -> dict[int, float]:
    """Losses by step of the newest stage run CAMPAIGN/STAGE: its latest attempt covering each step."""
    from campaign.ledger import reads

    campaign, stage = ref.split("/", 1)
    with ledger.session() as s:
        run = reads.get_stage_run(s, campaign, stage)
        if run is None:
            raise SpecError(ref, [f"reference stage run {ref} is not in the ledger; run it first or record one"])
        out: dict[int, float] = {}
        for a in run.attempts:
            for m in reads.list_steps(s, a.id):
                if m.loss is not None:
                    out[m.step] = m.loss
        return out


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
