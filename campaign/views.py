"""Terminal views of the ledger, as pure functions from plain data to Rich renderables.

Tests render them into a fixed-width `Console(file=StringIO())` and compare the text.
"""

from __future__ import annotations

from typing import Any

from rich.markup import escape
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
        t.add_row(str(i), escape(st["name"]), st["kind"], _state(st["state"]), str(st["attempts"]), fmt_tokens(st["tokens"]),
                  fmt_loss(st["last_loss"]), escape(st["verdict"] or ""))
    if summary.get("excluded_nodes"):
        t.caption = "excluded nodes: " + ", ".join(summary["excluded_nodes"])
    return t


def exclusions_list(rows: list[dict[str, Any]]) -> Table:
    """`campaign nodes list`: excluded nodes with reason, since, expiry and lifted."""
    t = Table(title="excluded nodes", title_justify="left")
    for col in ("site", "node", "reason", "since", "expires", "lifted"):
        t.add_column(col)
    for e in rows:
        t.add_row(e["site"], escape(e["node"]), escape(e["reason"]), _minute(e["since"]), _minute(e["expires"]) or "never",
                  _minute(e["lifted"]))
    return t


def _minute(t: Any) -> str:
    return t.strftime("%Y-%m-%d %H:%M") if t is not None else ""


def campaigns_table(rows: list[dict[str, Any]]) -> Table:
    """The list of campaigns in a ledger."""
    t = Table(title="campaigns", title_justify="left")
    for col in ("name", "site", "state", "stage reached", "tokens", "last loss", "updated"):
        t.add_column(col, justify="right" if col in ("tokens", "last loss") else "left")
    for r in rows:
        t.add_row(escape(r["name"]), r["site"], _state(r["state"]), escape(r["stage"] or "-"), fmt_tokens(r["tokens"]),
                  fmt_loss(r["last_loss"]), r["updated"])
    return t


def fmt_value(v: Any) -> str:
    """A table cell: floats with 4 significant digits, thousands separators for big ones."""
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}" if abs(v) < 1 else f"{v:.4g}"
    return str(v)


PERCENT_COLUMNS = frozenset({"comm_share"})
"""Fractions shown as percentages (their header says %)."""


def rows_table(title: str, rows: list[dict[str, Any]], columns: list[str],
               headers: dict[str, str] | None = None) -> Table:
    """A plain table of dict rows (e.g. the scaling table); `headers` renames columns."""
    t = Table(title=title, title_justify="left")
    for c in columns:
        t.add_column((headers or {}).get(c, c), justify="right", no_wrap=True)
    for r in rows:
        t.add_row(*(fmt_value(r.get(c) * 100 if c in PERCENT_COLUMNS and r.get(c) is not None else r.get(c))
                    for c in columns))
    return t


def console(file: Any = None) -> Any:
    """A Rich console: the terminal's width on a TTY, 120 columns in logs and pipes."""
    from rich.console import Console

    c = Console(file=file, highlight=False, soft_wrap=False)
    if not c.is_terminal:
        c = Console(file=file, highlight=False, width=120)
    return c


# --- one campaign in detail (`campaign status NAME`) -----------------------------------

SCALING_COLUMNS = ["nodes", "ranks", "step_time_s", "tokens_per_s", "comm_time_s", "comm_share", "mem_peak_gib",
                   "loss", "efficiency"]
SCALING_HEADERS = {"step_time_s": "step s", "tokens_per_s": "tok/s", "comm_time_s": "comm s", "comm_share": "comm %",
                   "mem_peak_gib": "mem GiB", "loss": "loss", "efficiency": "eff"}
MAX_ATTEMPTS_SHOWN = 20
"""The detail view lists the newest attempts; `status --json` has them all."""
NUMBERS_HIDDEN = {"table", "traceback"}
"""Stage numbers shown elsewhere (the scaling table) or too long for a cell."""


def fmt_duration(seconds: float | None) -> str:
    """12.3 s, 4m05s, 3h07m."""
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f} s"
    m, s = divmod(int(seconds), 60)
    return f"{m}m{s:02d}s" if m < 60 else f"{m // 60}h{m % 60:02d}m"


def fmt_nodes(nodes: list[str], count: int, limit: int = 3) -> str:
    """`2: n0, n1`; long lists end in `+N`."""
    if not nodes:
        return str(count)
    shown = ", ".join(nodes[:limit]) + (f" +{len(nodes) - limit}" if len(nodes) > limit else "")
    return f"{count}: {shown}"


def _numbers_text(numbers: dict[str, Any]) -> str:
    parts = []
    for k, v in numbers.items():
        if k in NUMBERS_HIDDEN or isinstance(v, dict):
            continue
        if isinstance(v, list):
            if len(v) > 6 or any(isinstance(x, (dict, list)) for x in v):
                continue
            v = "[" + ", ".join(fmt_value(x) for x in v) + "]"
        parts.append(f"{k} {fmt_value(v)}")
    return "; ".join(parts)


def numbers_table(detail: dict[str, Any]) -> Table | None:
    """Each stage's recorded numbers (scalars and short lists)."""
    rows = [(name, _numbers_text(n)) for name, n in detail.get("stage_numbers", {}).items()]
    rows = [r for r in rows if r[1]]
    if not rows:
        return None
    t = Table(title="stage numbers", title_justify="left", expand=True)
    t.add_column("stage", no_wrap=True)
    t.add_column("numbers", overflow="fold", ratio=1)
    for name, text in rows:
        t.add_row(escape(name), escape(text))
    return t


def attempts_table(attempts: list[dict[str, Any]]) -> Table:
    """Every attempt: exit class and code, nodes, the steps and tokens it reached."""
    t = Table(title="attempts", title_justify="left", expand=True)
    for col, kw in (("stage", {}), ("#", {"justify": "right"}), ("label", {}), ("exit class", {}),
                    ("exit", {"justify": "right"}), ("steps", {"justify": "right"}), ("tokens", {"justify": "right"}),
                    ("last loss", {"justify": "right"}), ("took", {"justify": "right"})):
        t.add_column(col, no_wrap=True, **kw)
    t.add_column("nodes", overflow="fold", ratio=1, min_width=12)
    prev: dict[str, Any] | None = None
    for a in attempts:
        relaunch = prev is not None and prev["stage"] == a["stage"] and prev["state"] not in ("succeeded", "running")
        steps = "-" if a["last_step"] is None else f"{a['first_step']}-{a['last_step']}"
        t.add_row(escape(a["stage"]), str(a["number"]), escape(a["label"] or ("relaunch" if relaunch else "")),
                  _state(a["state"]), "-" if a["exit_code"] is None else str(a["exit_code"]), steps,
                  fmt_tokens(a["tokens"]), fmt_loss(a["last_loss"]), fmt_duration(a["duration_s"]),
                  escape(fmt_nodes(a["nodes"], a["node_count"]) + (f" (suspects: {', '.join(a['suspects'])})"
                                                                    if a.get("suspects") else "")))
        prev = a
    return t


def run_dirs_table(attempts: list[dict[str, Any]]) -> Table:
    """Where each attempt's files are: its logs (logs/rank-R.log), metrics.jsonl, trainer.json."""
    t = Table(title="run directories (logs/, metrics.jsonl, trainer.json)", title_justify="left", expand=True)
    t.add_column("stage", no_wrap=True)
    t.add_column("#", justify="right", no_wrap=True)
    t.add_column("run directory", overflow="fold", ratio=1)
    for a in attempts:
        t.add_row(escape(a["stage"]), str(a["number"]), escape(a.get("run_dir") or "-"))
    return t


def exclusions_table(exclusions: list[dict[str, Any]]) -> Table:
    t = Table(title="excluded nodes", title_justify="left", expand=True)
    for col in ("node", "since", "expires"):
        t.add_column(col, no_wrap=True)
    t.add_column("reason", overflow="fold", ratio=1)
    for e in exclusions:
        t.add_row(escape(e["node"]), (e["since"] or "-")[:16], (e["expires"] or "never")[:16], escape(e["reason"]))
    return t


def events_table(events: list[dict[str, Any]]) -> Table:
    """Watchdog actions, exclusions, relaunches: the events that are news."""
    t = Table(title="recent events", title_justify="left", expand=True)
    t.add_column("time", no_wrap=True)
    t.add_column("kind", no_wrap=True)
    t.add_column("message", overflow="fold", ratio=1)
    for e in events:
        t.add_row((e["time"] or "")[5:19], escape(e["kind"]), escape(e["message"]))
    return t


def campaign_detail(detail: dict[str, Any]) -> Any:
    """One campaign in full (the `status NAME --json` shape with its detail keys): stages
    with verdicts, stage numbers, attempts, excluded nodes, scaling tables, recent events."""
    from rich.console import Group
    from rich.text import Text

    parts: list[Any] = [Text(f"site {detail.get('site', '-')}, version {detail.get('version', 1)}, "
                             f"updated {(detail.get('updated') or '-')[:16]}")]
    parts += [Text(f"warning: {w}", style="yellow") for w in detail.get("warnings") or []]
    stages = campaign_table(detail)
    stages.caption = None
    parts.append(stages)
    parts += [g for g in (goodput_table(detail),) if g is not None]  # one line per stage: where the time went
    numbers = numbers_table(detail)
    if numbers is not None:
        parts.append(numbers)
    attempts = detail.get("attempts_detail") or []
    if attempts:
        t = attempts_table(attempts[-MAX_ATTEMPTS_SHOWN:])
        if len(attempts) > MAX_ATTEMPTS_SHOWN:
            t.caption = f"the last {MAX_ATTEMPTS_SHOWN} of {len(attempts)} attempts (--json lists every one)"
        parts.append(t)
        parts.append(run_dirs_table(attempts[-MAX_ATTEMPTS_SHOWN:]))
    if detail.get("exclusions"):
        parts.append(exclusions_table(detail["exclusions"]))
    for sc in detail.get("scaling", []):
        parts.append(rows_table(f"{sc['stage']}: scaling table", sc["rows"], SCALING_COLUMNS, SCALING_HEADERS))
    if detail.get("events"):
        parts.append(events_table(detail["events"]))
    return Group(*parts)


# --- goodput ---------------------------------------------------------------------------
GOODPUT_LABELS = {"startup_s": "startup", "checkpoint_stall_s": "checkpoint", "recomputed_s": "recomputed",
                  "detection_s": "detection", "restart_s": "restart", "other_s": "other"}
"""The lost buckets of `campaign.goodput` (its `LOST`, in that order) as `status` and the plot name them."""


def goodput_line(g: dict[str, Any]) -> str:
    """`ETTR 0.82: 41.0 s of 50.0 s trained; lost startup 5.0 s, detection 3.0 s` (largest first)."""
    if not g or not g.get("wall_s"):
        return "-"
    lost = sorted(((v, k) for k, v in g["lost"].items() if v >= 0.05), reverse=True)
    text = f"ETTR {g['ettr']:.2f}: {fmt_duration(g['productive_s'])} of {fmt_duration(g['wall_s'])} trained"
    if lost:
        text += "; lost " + ", ".join(f"{GOODPUT_LABELS[k]} {fmt_duration(v)}" for v, k in lost)
    return text


def goodput_table(summary: dict[str, Any]) -> Table | None:
    """One line per stage with goodput, then the campaign; a long run's line adds the
    checkpoint interval Young/Daly suggests."""
    rows = [(st["name"], st.get("goodput"), st.get("checkpoint_interval")) for st in summary.get("stages", [])]
    rows = [r for r in rows if r[1] and r[1].get("wall_s")]
    if not rows:
        return None
    t = Table(title="goodput", title_justify="left", expand=True)
    t.add_column("stage", no_wrap=True)
    t.add_column("where the time went", overflow="fold", ratio=1)
    for name, g, interval in rows:
        text = goodput_line(g)
        if interval:
            text += (f"; checkpoint every {interval['steps']} steps suggested (Young/Daly: save {interval['save_s']:g} s,"
                     f" MTBF {fmt_duration(interval['mtbf_s'])} from {interval['source']}"
                     + (f", {interval['rescued'][0]} of {interval['rescued'][1]} faults rescued: without a rescue "
                        f"{fmt_duration(interval['unrescued_mtbf_s'])}" if interval.get("rescued") else "") + ")")
        t.add_row(escape(name), escape(text))
    t.add_row("[bold]campaign[/]", escape(goodput_line(summary.get("goodput") or {})))
    return t
