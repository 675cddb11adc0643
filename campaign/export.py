"""Moving ledger data in and out: CSV/JSON export of steps, attempts and nodes, and the
reader of reference curves that `campaign ledger import-reference` stores.

A reference file is CSV with a header. It needs `loss` and `step` and/or `tokens`;
optional columns `run`, `stage`, `attempt` and `nodes` split it into several curves:

    step,loss                      a loss-check reference (one curve)
    tokens,loss                    a progress curve (tokens may be written 4.674T, 12.5B, 3e9)
    run,stage,nodes,tokens,loss    several runs and stages, e.g. examples/auroragpt-progress.csv

Lines starting with `#` are comments. An export of `--what steps` reads back as a
reference file (it has stage, attempt, nodes, step, tokens, loss).
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, TextIO

from campaign.errors import SpecError

SUFFIX = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}
"""Token count suffixes: 12.5K, 4.67M, 1.2B (or G), 7.771T."""
ATTEMPT_COLUMNS = ("stage", "number", "label", "state", "exit_code", "node_count", "nodes", "first_step", "last_step",
                   "tokens", "last_loss", "started", "finished", "duration_s", "suspects")
NODE_COLUMNS = ("node", "attempts", "failed", "suspect", "excluded", "reason")


# --- export ----------------------------------------------------------------------------

def write_rows(rows: Iterable[dict[str, Any]], columns: Sequence[str], fmt: str, out: TextIO) -> int:
    """Stream `rows` to `out` as CSV (header first) or as one JSON array; returns the count.
    Lists are joined with spaces in CSV; non-finite floats are null in JSON."""
    n = 0
    if fmt == "csv":
        w = csv.writer(out, lineterminator="\n")
        w.writerow(columns)
        for r in rows:
            w.writerow([_csv_cell(r.get(c)) for c in columns])
            n += 1
        return n
    out.write("[")
    for r in rows:
        out.write(",\n  " if n else "\n  ")
        out.write(json.dumps({c: _json_cell(r.get(c)) for c in columns}))
        n += 1
    out.write("\n]\n" if n else "]\n")
    return n


def _csv_cell(v: Any) -> Any:
    if v is None:
        return ""
    if isinstance(v, list):
        return " ".join(str(x) for x in v)
    return repr(v) if isinstance(v, float) else v


def _json_cell(v: Any) -> Any:
    return None if isinstance(v, float) and not math.isfinite(v) else v


# --- reference curves ------------------------------------------------------------------

def parse_tokens(text: str) -> int:
    """`4.674T` -> 4674000000000; plain numbers (also 3e9) as they are."""
    t = text.strip().lower().replace(",", "").replace("_", "")
    if t and t[-1] in SUFFIX:
        return int(round(float(t[:-1]) * SUFFIX[t[-1]]))
    return int(round(float(t)))


def read_curves(path: Path, *, run: str | None = None, nodes: int | None = None,
                tokens_per_step: int | None = None) -> dict[str, list[dict[str, Any]]]:
    """Curves of a reference file: {run name ("" if the file has none): [{"stage",
    "attempt", "node_count", "rows": [{"step", "tokens", "loss"}]}]} in file order.
    `run` keeps one run; `nodes` fills a missing node count; `tokens_per_step` turns a
    `step,loss` file into tokens (else its tokens are 0)."""
    header, records = _read_table(path)
    cols = {name: i for i, name in enumerate(header)}
    if "loss" not in cols or not ({"step", "tokens"} & cols.keys()):
        raise SpecError(str(path), [f"line 1: expected a header with loss and step and/or tokens, got {','.join(header)}"])
    runs: dict[str, dict[tuple[str, int], dict[str, Any]]] = {}
    for line, rec in records:
        get = lambda c: rec[cols[c]].strip() if c in cols and cols[c] < len(rec) else ""  # noqa: E731
        name = get("run")
        if run is not None and name != run:
            continue
        try:
            key = (get("stage") or "run", int(get("attempt") or 1))
            curve = runs.setdefault(name, {}).setdefault(key, {
                "stage": key[0], "attempt": key[1], "node_count": int(get("nodes") or 0) or nodes, "rows": []})
            step = int(get("step")) if get("step") else len(curve["rows"]) + 1
            tokens = parse_tokens(get("tokens")) if get("tokens") else step * (tokens_per_step or 0)
            curve["rows"].append({"step": step, "tokens": tokens, "loss": float(get("loss"))})
        except ValueError as e:
            raise SpecError(str(path), [f"line {line}: {e} in {','.join(rec)}"]) from None
    if run is not None and run not in runs:
        raise SpecError(str(path), [f"no run named {run!r} (runs: {', '.join(_run_names(path)) or 'none'})"])
    if not runs:
        raise SpecError(str(path), ["no data rows"])
    return {name: list(curves.values()) for name, curves in runs.items()}


def _read_table(path: Path) -> tuple[list[str], list[tuple[int, list[str]]]]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise SpecError(str(path), [f"cannot read the file: {e.strerror or e}"]) from None
    except UnicodeDecodeError as e:
        from campaign.reference import not_text

        raise SpecError(str(path), [not_text(e)]) from None
    lines = [(i, ln) for i, ln in enumerate(text.splitlines(), 1) if ln.strip() and not ln.lstrip().startswith("#")]
    if not lines:
        raise SpecError(str(path), ["the file is empty"])
    try:
        parsed = list(csv.reader([ln for _, ln in lines]))
    except csv.Error as e:
        raise SpecError(str(path), [f"not a CSV file: {e}"]) from None
    header = [h.strip().lower() for h in parsed[0]]
    return header, [(lines[i][0], rec) for i, rec in enumerate(parsed) if i > 0]


def _run_names(path: Path) -> list[str]:
    header, records = _read_table(path)
    if "run" not in header:
        return []
    i = header.index("run")
    return list(dict.fromkeys(r[i].strip() for _, r in records if i < len(r)))
