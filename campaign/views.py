"""Terminal views of the ledger, as pure functions from plain data to Rich renderables.

Tests render them into a fixed-width `Console(file=StringIO())` and compare the text.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console, ConsoleOptions, RenderResult
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from campaign.exits import ExitClass
from campaign.goodput import rescued_words

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


def fmt_mfu(x: float | None, float8: float | None = None) -> str:
    """Model FLOPs utilisation as a percentage of the device's dense bf16 peak: `41.3%`; `-` when
    unknown. A float8 run's `float8` (against the float8 peak) beside it: `41.3% (float8 peak 20.6%)`."""
    if x is None:
        return "-"
    return f"{100 * x:.1f}%" + (f" (float8 peak {100 * float8:.1f}%)" if isinstance(float8, (int, float)) else "")


def fmt_loss(x: float | None) -> str:
    return "-" if x is None else f"{x:.4f}"


def _state(s: str) -> str:
    style = STATE_STYLE.get(s)
    return f"[{style}]{s}[/]" if style else s


def state_text(row: dict[str, Any]) -> str:
    """A campaign's state as a person should read it: a campaign whose driver is gone is
    not `running` (`commands.DRIVER_GONE`): it says which process and what to run."""
    if row.get("state") != "driver_gone":
        return str(row.get("state"))
    d = row.get("driver") or {}
    who = f"pid {d['pid']} on {d['host']}" if d.get("pid") else "no driver holds it"
    return f"driver gone ({who}): run `campaign resume {row['name']}`"


NARROW = 100
"""Below this many columns the stage table leaves out `kind` and prints each verdict under the
table: at 80 columns the verdict column was squeezed to two characters a line."""


class StagesTable:
    """One campaign's stages (the `status --json` shape): a table whose layout follows the
    width it is drawn at (`NARROW`). `caption`: the line under it (the excluded nodes)."""

    def __init__(self, summary: dict[str, Any]) -> None:
        self.summary = summary
        self.caption = ("excluded nodes: " + ", ".join(summary["excluded_nodes"])
                        if summary.get("excluded_nodes") else None)

    def table(self, narrow: bool) -> Table:
        summary = self.summary
        t = Table(title=f"campaign {summary['name']} — {escape(state_text(summary))}", title_justify="left",
                  expand=True, caption=self.caption)
        for col, kw in (("#", {"justify": "right"}), ("stage", {}), ("kind", {}), ("state", {}),
                        ("attempts", {"justify": "right"}), ("tokens", {"justify": "right"}),
                        ("last loss", {"justify": "right"})):
            if not (narrow and col == "kind"):
                t.add_column(col, no_wrap=True, **kw)
        if not narrow:
            t.add_column("verdict", overflow="fold", ratio=1, min_width=24)
        for i, st in enumerate(summary["stages"], 1):
            cells = [str(i), escape(st["name"]), *([] if narrow else [st["kind"]]), _state(st["state"]),
                     str(st["attempts"]), fmt_tokens(st["tokens"]), fmt_loss(st["last_loss"])]
            t.add_row(*cells, *([] if narrow else [escape(st["verdict"] or "")]))
        return t

    def __rich_console__(self, console: Any, options: Any) -> Any:
        narrow = options.max_width < NARROW
        yield self.table(narrow)
        if narrow:
            for i, st in enumerate(self.summary["stages"], 1):
                if st.get("verdict"):
                    yield Text(f"{i} {st['name']}: {st['verdict']}")


def campaign_table(summary: dict[str, Any]) -> StagesTable:
    """One campaign's stages as a table (`StagesTable`: at under 100 columns the verdicts
    follow the table, one per stage)."""
    return StagesTable(summary)


def exclusions_list(rows: list[dict[str, Any]]) -> Table:
    """`campaign nodes list`: excluded nodes with reason, since, expiry and lifted."""
    t = Table(title="excluded nodes", title_justify="left")
    for col in ("site", "node", "for", "reason", "since", "expires", "lifted"):
        t.add_column(col)
    for e in rows:
        t.add_row(e["site"], escape(e["node"]), escape(f"campaign {e['campaign']}" if e.get("campaign") else "the site"),
                  escape(e["reason"]), _minute(e["since"]), _minute(e["expires"]) or "never", _minute(e["lifted"]))
    return t


def _minute(t: Any) -> str:
    return t.strftime("%Y-%m-%d %H:%M") if t is not None else ""


def campaigns_table(rows: list[dict[str, Any]]) -> Table:
    """The list of campaigns in a ledger."""
    t = Table(title="campaigns", title_justify="left")
    for col in ("name", "site", "state", "stage reached", "tokens", "last loss", "updated"):
        t.add_column(col, justify="right" if col in ("tokens", "last loss") else "left")
    for r in rows:
        state = _state(r["state"]) if r["state"] != "driver_gone" else f"[red]{escape(state_text(r))}[/]"
        t.add_row(escape(r["name"]), r["site"], state, escape(r["stage"] or "-"), fmt_tokens(r["tokens"]),
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
    mfu = numbers.get("mfu")
    mfu = mfu if isinstance(mfu, (int, float)) else None
    parts = []
    for k, v in numbers.items():
        if k in NUMBERS_HIDDEN or isinstance(v, dict) or (k == "mfu_float8" and mfu is not None):
            continue  # a float8 run's second MFU figure is shown beside the first
        if isinstance(v, list):
            if len(v) > 6 or any(isinstance(x, (dict, list)) for x in v):
                continue
            v = "[" + ", ".join(fmt_value(x) for x in v) + "]"
        parts.append(f"MFU {fmt_mfu(mfu, numbers.get('mfu_float8'))}" if k == "mfu" and mfu is not None
                     else f"{k} {fmt_value(v)}")
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


ATTEMPT_COLUMNS = (("stage", {}), ("#", {"justify": "right"}), ("label", {}), ("exit class", {}),
                   ("exit", {"justify": "right"}), ("steps", {"justify": "right"}), ("tokens", {"justify": "right"}),
                   ("last loss", {"justify": "right"}), ("took", {"justify": "right"}))
"""The attempts table's columns kept on one line each; `nodes` (last) folds."""
NODES_MIN = 12


def attempts_table(attempts: list[dict[str, Any]]) -> Table:
    """Every attempt: exit class and code, nodes, the steps and tokens it reached."""
    return _cells_table(_attempt_cells(attempts))


def _cells_table(rows: list[tuple[str, ...]], caption: str | None = None) -> Table:
    t = Table(title="attempts", title_justify="left", expand=True, caption=caption)
    for col, kw in ATTEMPT_COLUMNS:
        t.add_column(col, no_wrap=True, **kw)
    t.add_column("nodes", overflow="fold", ratio=1, min_width=NODES_MIN)
    for cells in rows:
        t.add_row(*cells)
    return t


def _attempt_cells(attempts: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    """Each attempt's cells (markup), in ATTEMPT_COLUMNS' order, then its nodes."""
    rows, prev = [], None
    for a in attempts:
        relaunch = (prev is not None and prev["stage"] == a["stage"]
                    and prev["state"] not in (ExitClass.SUCCEEDED, "running"))
        steps = "-" if a["last_step"] is None else f"{a['first_step']}-{a['last_step']}"
        rows.append((escape(a["stage"]), str(a["number"]),
                     escape(a["label"] or (f"relaunch {a['number'] - 1}" if relaunch else "")),
                     _state(a["state"]), "-" if a["exit_code"] is None else str(a["exit_code"]), steps,
                     fmt_tokens(a["tokens"]), fmt_loss(a["last_loss"]), fmt_duration(a["duration_s"]),
                     escape(fmt_nodes(a["nodes"], a["node_count"]) + (f" (suspects: {', '.join(a['suspects'])})"
                                                                      if a.get("suspects") else ""))))
        prev = a
    return rows


class AttemptsView:
    """The attempts table where its one-line columns fit the terminal; else two lines per
    attempt (at 80 columns the table had shown `lon…`, `…` and no nodes at all)."""

    def __init__(self, attempts: list[dict[str, Any]], caption: str | None = None) -> None:
        self.rows, self.caption = _attempt_cells(attempts), caption

    def width(self) -> int:
        """What the table needs: its one-line columns whole, the nodes at their minimum
        (a cell's padding and its left rule: 3 columns; the last rule: 1)."""
        cols = [max([len(h)] + [Text.from_markup(r[i]).cell_len for r in self.rows])
                for i, (h, _) in enumerate(ATTEMPT_COLUMNS)]
        return sum(cols) + NODES_MIN + 3 * (len(cols) + 1) + 1

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        if self.width() <= options.max_width:
            yield _cells_table(self.rows, self.caption)
            return
        yield Text("attempts", style="italic")
        for stage, number, label, state, code, steps, tokens, loss, took, nodes in self.rows:
            known = [f"{k}{v}{unit}" for k, v, unit in (("steps ", steps, ""), ("", tokens, " tok"), ("loss ", loss, ""))
                     if v != "-"]  # a running attempt has none of them yet
            yield Text.from_markup("  ".join([f"{stage} #{number}", state + ("" if code == "-" else f" (exit {code})"),
                                              *known]), overflow="fold")
            yield Text.from_markup("    " + "; ".join(x for x in (took != "-" and f"took {took}", label,
                                                                 f"nodes {nodes}") if x), overflow="fold")
        if self.caption:
            yield Text(self.caption, style="dim")


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
    for col in ("node", "for", "since", "expires"):
        t.add_column(col, no_wrap=True)
    t.add_column("reason", overflow="fold", ratio=1)
    for e in exclusions:
        t.add_row(escape(e["node"]), "this campaign" if e.get("campaign_only") else "the site", (e["since"] or "-")[:16],
                  (e["expires"] or "never")[:16], escape(e["reason"]))
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

    parts: list[Any] = [Text(f"site {detail.get('site', '-')}, version {detail.get('version', 1)}, "
                             f"updated {(detail.get('updated') or '-')[:16]}")]
    if detail.get("state") == "driver_gone":
        parts.append(Text(state_text(detail), style="bold red"))
    parts += [Text(line, style="bold" if not line.startswith(" ") else "") for a in detail.get("running") or []
              for line in running_lines(a)]
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
        parts.append(AttemptsView(attempts[-MAX_ATTEMPTS_SHOWN:], f"the last {MAX_ATTEMPTS_SHOWN} of {len(attempts)} "
                                  "attempts (--json lists every one)" if len(attempts) > MAX_ATTEMPTS_SHOWN else None))
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
                     + (f", {rescued_words(*interval['rescued'])}: without a rescue "
                        f"{fmt_duration(interval['unrescued_mtbf_s'])}" if interval.get("rescued") else "") + ")")
        t.add_row(escape(name), escape(text))
    t.add_row("[bold]campaign[/]", escape(goodput_line(summary.get("goodput") or {})))
    return t


# --- live: the running attempts, and `status NAME --watch` in one screen ---------------

STATE_MARK = {"passed": "ok", "failed": "FAILED", "running": "running", "pending": "-", "skipped": "skipped",
              "cancelled": "cancelled"}
STALE_AFTER_S = 5.0
"""A running attempt whose newest step is older than this (and 3 step times) shows how long
it has been silent instead of an ETA (the watchdog decides what that means)."""
WATCH_EVENTS = 5
"""Events the watch screen shows at most (newest last); the rest are counted."""


def fmt_eta(seconds: float | None) -> str:
    if seconds is None:
        return "eta -"
    m, s = divmod(int(round(seconds)), 60)
    return f"eta {m // 60}:{m % 60:02d}:{s:02d}"


RUNNING_WIDTH = 80
"""Columns a running attempt's second line may take before its nodes go on a third."""


def running_lines(a: dict[str, Any], width: int = RUNNING_WIDTH) -> list[str]:
    """A running attempt in two lines of at most `width` columns (for a short name):
    `long-run #2 (relaunch 1): step 88/157 (56%)  eta 0:00:03  12.8K tok/s` and
    `  loss 1.8750  45.1K tok  40 ms/step  2 nodes: local-n0, local-n2` (3 names, then +N);
    the nodes on a third line when the second would be wider (`MFU 41.3% (float8 peak 20.6%)`);
    `watch` passes its terminal's width, `status` keeps 80."""
    name = f"{a['stage']} #{a['number']}" + (f" ({a['label']})" if a.get("label") else "")
    if a.get("step") is None:
        head = f"{name}: starting (no step yet)" + (f", target {a['target']} steps" if a.get("target") else "")
    else:
        target = a.get("target")
        pct = f" ({100 * a['step'] // target}%)" if target else ""
        parts = [f"step {a['step']}/{target if target else '?'}{pct}"]
        age, per_step = a.get("last_step_age_s"), a.get("step_time_s") or 0.0
        if age is not None and age > max(STALE_AFTER_S, 3 * per_step):  # the rate and ETA no longer say anything
            parts.append(f"no new step for {fmt_duration(age)}")
        else:
            parts.append(fmt_eta(a.get("eta_s")))
            if a.get("tokens_per_s"):
                parts.append(f"{fmt_tokens(int(a['tokens_per_s']))} tok/s")
        head = f"{name}: " + "  ".join(parts)
    nodes = a.get("nodes") or []
    where = f"{len(nodes)} node{'s' if len(nodes) != 1 else ''}: {', '.join(nodes[:3])}" \
        + (f" +{len(nodes) - 3}" if len(nodes) > 3 else "") if nodes else "nodes: not launched yet"
    extra = [f"loss {fmt_loss(a.get('loss'))}"] if a.get("loss") is not None else []
    if a.get("tokens") is not None:
        extra.append(f"{fmt_tokens(a['tokens'])} tok")
    if a.get("step_time_s"):
        extra.append(f"{a['step_time_s'] * 1000:.0f} ms/step")
    if a.get("mfu") is not None:
        extra.append(f"MFU {fmt_mfu(a['mfu'], a.get('mfu_float8'))}")
    line = "  " + "  ".join([*extra, where])
    if len(line) <= width or not extra:
        return [head, line]
    return [head, "  " + "  ".join(extra), "  " + where]  # a float8 run's MFU or long node names


def _packed(first: str, items: list[str], width: int) -> list[str]:
    """`items` joined by ", " into lines of at most `width` characters (an item never split)."""
    lines = [first]
    for i, item in enumerate(items):
        sep = ", " if i < len(items) - 1 else ""
        if len(lines[-1]) + len(item) + len(sep) > width and lines[-1].strip():
            lines.append("  ")
        lines[-1] += item + sep
    return lines


def watch_lines(detail: dict[str, Any], width: int = 80) -> tuple[list[str], list[str], list[str]]:
    """The watch screen's parts: the lines it must show (title, stages, running attempts),
    the exclusions' and the events' lines (shown while they fit)."""
    name, state = detail["name"], state_text(detail)
    head = [f"campaign {name}: {state}"]
    d = detail.get("driver") or {}
    if d.get("state") == "live":
        head[0] += f" (driver pid {d['pid']} on {d['host']})"
    stages = [f"{i}. {st['name']} {STATE_MARK.get(st['state'], st['state'])}"
              + (f" ({st['attempts']} attempts)" if st["attempts"] > 1 else "")
              for i, st in enumerate(detail["stages"], 1)]
    head += _packed("stages: ", stages, width)
    for a in detail.get("running") or []:
        head += running_lines(a, width)
    if detail.get("state") not in ("running", "driver_gone") and not detail.get("running"):
        last = next((st for st in reversed(detail["stages"]) if st.get("verdict")), None)
        if last:
            head.append(f"{last['name']}: {last['verdict']}")
    excl = [f"excluded {e['node']}" + (" (this campaign)" if e.get("campaign_only") else "") + f": {e['reason']}"
            for e in detail.get("exclusions") or []]
    events = [f"{(e['time'] or '')[11:19]} {e['message']}" for e in (detail.get("events") or [])]
    return head, excl, events[-WATCH_EVENTS:]


def watch_view(detail: dict[str, Any], width: int = 80, height: int = 24) -> Any:
    """`campaign status NAME --watch`: one screen of `width` x `height` (a 24x80 terminal
    holds it): title, stages, each running attempt, then the newest events (each in up to two
    lines) and the excluded nodes while they fit. A line too long ends in an ellipsis;
    whatever does not fit is counted in the last line, which names the command that shows it all."""
    import textwrap

    from rich.console import Group

    head, excl, events = watch_lines(detail, width)
    lines = [(line, "bold" if i == 0 else "") for i, line in enumerate(head)]
    room = max(height - 1 - len(lines), 0)  # the last line of a terminal scrolls a redraw: keep it free
    # (kind, lines) items; the newest events first: they say what is happening.
    items: list[tuple[str, list[tuple[str, str]]]] = []
    if events:
        items.append(("title", [("recent events:", "bold")]))
        for e in events:
            wrapped = textwrap.wrap(e, width - 2, subsequent_indent=" " * 9, max_lines=2, placeholder=" …")
            items.append(("event", [("  " + w, "") for w in wrapped]))
    if excl:
        items.append(("title", [("excluded nodes:", "bold")]))
        items += [("excluded node", [("  " + x, "yellow")]) for x in excl]
    budget = room if sum(len(item) for _, item in items) <= room else room - 1  # the summary takes a line
    shown: list[tuple[str, list[tuple[str, str]]]] = []
    hidden = {"event": 0, "excluded node": 0}
    for kind, item in items:
        if not any(hidden.values()) and sum(len(x) for _, x in shown) + len(item) <= budget:
            shown.append((kind, item))
        elif kind != "title":
            hidden[kind] += 1
    while shown and shown[-1][0] == "title":  # a heading with nothing under it
        shown.pop()
    lines += [line for _, item in shown for line in item]
    if any(hidden.values()):
        what = ", ".join(f"{n} {k}(s)" for k, n in hidden.items() if n)
        lines.append((f"... {what} not shown: campaign status {detail['name']}", "dim"))
    return Group(*(Text(text, style=style, no_wrap=True, overflow="ellipsis") for text, style in lines))
