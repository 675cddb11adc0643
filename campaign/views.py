"""Terminal views of the ledger, as pure functions from plain data to Rich renderables.

Tests render them into a fixed-width `Console(file=StringIO())` and compare the text.
"""

from __future__ import annotations

from typing import Any

from rich.table import Table

STATE_STYLE = {"passed": "green", "succeeded": "green", "failed": "red", "running": "yellow", "skipped": "dim",
               "pending": "dim", "cancelled": "magenta"}


def fmt_tokens(n: int | None) -> str:
    """Tokens with a unit: 950, 12.3K, 4.67M, 1.20B, 7.77T."""
    if n is None:
        return "-"
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.3g}{unit}"
    return str(n)


def fmt_loss(x: float | None) -> str:
    return "-" if x is None else f"{x:.4f}"


def _state(s: str) -> str:
    style = STATE_STYLE.get(s)
    return f"[{style}]{s}[/]" if style else s


def campaign_table(summary: dict[str, Any]) -> Table:
    """One campaign's stages (the `status --json` shape) as a table."""
    t = Table(title=f"campaign {summary['name']} — {summary['state']}", title_justify="left", expand=True)
    for col, kw in (("#", {"justify": "right"}), ("stage", {}), ("kind", {}), ("state", {}),
                    ("attempts", {"justify": "right"}), ("tokens", {"justify": "right"}),
                    ("last loss", {"justify": "right"})):
        t.add_column(col, no_wrap=True, **kw)
    t.add_column("verdict", overflow="fold", ratio=1, min_width=24)
    for i, st in enumerate(summary["stages"], 1):
        t.add_row(str(i), st["name"], st["kind"], _state(st["state"]), str(st["attempts"]), fmt_tokens(st["tokens"]),
                  fmt_loss(st["last_loss"]), st["verdict"] or "")
    if summary.get("excluded_nodes"):
        t.caption = "excluded nodes: " + ", ".join(summary["excluded_nodes"])
    return t


def campaigns_table(rows: list[dict[str, Any]]) -> Table:
    """The list of campaigns in a ledger."""
    t = Table(title="campaigns", title_justify="left")
    for col in ("name", "site", "state", "stage reached", "tokens", "last loss", "updated"):
        t.add_column(col, justify="right" if col in ("tokens", "last loss") else "left")
    for r in rows:
        t.add_row(r["name"], r["site"], _state(r["state"]), r["stage"] or "-", fmt_tokens(r["tokens"]),
                  fmt_loss(r["last_loss"]), r["updated"])
    return t


def fmt_value(v: Any) -> str:
    """A table cell: floats with 4 significant digits, thousands separators for big ones."""
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}" if abs(v) < 1 else f"{v:.4g}"
    return str(v)


def rows_table(title: str, rows: list[dict[str, Any]], columns: list[str],
               headers: dict[str, str] | None = None) -> Table:
    """A plain table of dict rows (e.g. the scaling table); `headers` renames columns."""
    t = Table(title=title, title_justify="left")
    for c in columns:
        t.add_column((headers or {}).get(c, c), justify="right", no_wrap=True)
    for r in rows:
        t.add_row(*(fmt_value(r.get(c)) for c in columns))
    return t


def console(file: Any = None) -> Any:
    """A Rich console: the terminal's width on a TTY, 120 columns in logs and pipes."""
    from rich.console import Console

    c = Console(file=file, highlight=False, soft_wrap=False)
    if not c.is_terminal:
        c = Console(file=file, highlight=False, width=120)
    return c
