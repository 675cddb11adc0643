"""Charts of the ledger, as pure functions from query results to matplotlib Figures.

    series = reads.sample_campaign_steps(session, campaign)          # downsampled in SQL
    fig = progress_figure([series], reference=curves, log_x=True)
    save(fig, "out/progress.png")

Figures are built on the object API with the Agg canvas (no pyplot, no display), so they
work on a login node and in tests. Only `campaign plot` imports this module.

* run:      the campaign's chart (the default): loss against cumulative tokens of its long run
  across attempts, each relaunch marked and labelled with its cause, rescue and steps lost.
* progress: loss against cumulative tokens, one colour per run and stage, one line per
  attempt; line style by node count (solid for the smallest, dashed for the next, ...),
  as in AuroraGPT's production progress chart; reference curves in black and grey.
* scaling:  tokens/s (with ideal linear scaling), efficiency and the collective-time share
  against node count, from each scaling stage's table.
* steps:    step time and loss against step; attempt boundaries dotted, relaunches red.
* goodput:  stacked bars of productive time and each lost bucket, per stage and campaign.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter

from campaign.exits import ExitClass
from campaign.goodput import LOST
from campaign.views import GOODPUT_LABELS, fmt_tokens

DPI = 100
PROGRESS_SIZE = (10.0, 6.0)
"""Inches: 1000 x 600 pixels at DPI."""
SCALING_SIZE = (14.0, 4.8)
STEPS_SIZE = (10.0, 7.0)
NODE_STYLES = ("-", "--", ":", "-.")
"""Line style per node count, smallest count first."""
REFERENCE_COLOURS = ("black", "0.45", "0.65", "0.3")
FEW_POINTS = 20
"""Curves with at most this many points get markers (imported end points, short stages)."""
GOODPUT_COLOURS = {"productive_s": "tab:green", "startup_s": "tab:blue", "checkpoint_stall_s": "tab:purple",
                   "recomputed_s": "tab:orange", "detection_s": "tab:red", "restart_s": "tab:brown", "other_s": "0.7"}


def _figure(size: tuple[float, float]) -> Figure:
    fig = Figure(figsize=size, dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _finite(xs: Sequence[Any], ys: Sequence[Any], *, positive_x: bool = False) -> tuple[list[Any], list[Any]]:
    pts = [(x, y) for x, y in zip(xs, ys) if x is not None and y is not None and math.isfinite(y)
           and (not positive_x or x > 0)]
    return [p[0] for p in pts], [p[1] for p in pts]


def _token_axis(ax: Any) -> None:
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: fmt_tokens(int(v)) if v >= 0 else ""))


def _node_styles(counts: Sequence[int | None]) -> dict[int, str]:
    """Line style per known node count, smallest first; unknown counts (0/None) draw solid."""
    return {n: NODE_STYLES[i % len(NODE_STYLES)] for i, n in enumerate(sorted({n for n in counts if n}))}


def _group(s: dict[str, Any]) -> tuple[str, str]:
    """Series sharing a colour and a legend entry: an imported run is one curve over its
    stages; a campaign's own stages are separate experiments, one colour each."""
    return (s["campaign"], "") if s["site"] == "imported" else (s["campaign"], s["stage"])


def _run_label(s: dict[str, Any], several: bool, one_count: bool = True) -> str:
    """Legend name of a series: the run (and stage), with its node count when it has one."""
    if s["site"] == "imported":
        name = s["campaign"]
    else:
        name = f"{s['campaign']} / {s['stage']}" if several else s["stage"]
    return f"{name} ({s['node_count']}N)" if s.get("node_count") and one_count else name


def progress_figure(campaigns: Sequence[Sequence[dict[str, Any]]], *, reference: dict[str, list[dict[str, Any]]] | None = None,
                    log_x: bool = False, title: str | None = None) -> Figure:
    """Loss against cumulative tokens. `campaigns`: per campaign, the attempt series of
    `reads.sample_campaign_steps`; `reference`: curves of `export.read_curves`. Each
    attempt's line has gid CAMPAIGN/STAGE/ATTEMPT (a reference run's: reference/RUN).
    In an imported run (site "imported"), a stage whose tokens continue where the previous
    stage ended is drawn joined to it (stage 2 of a pretraining run goes on from stage 1);
    a campaign's own stages each start afresh and stay apart."""
    fig = _figure(PROGRESS_SIZE)
    ax = fig.add_subplot()
    series = [s for c in campaigns for s in c if any(t for t in s["tokens"])]
    # A reference run is one curve: its stages continue one another, in file order.
    ref_runs = [(run, {"node_count": curves[0]["node_count"], "rows": [r for c in curves for r in c["rows"]]})
                for run, curves in (reference or {}).items()]
    styles = _node_styles([s["node_count"] for s in series] + [c["node_count"] for _, c in ref_runs])
    group_nodes: dict[tuple[str, str], set[int]] = {}
    for s in series:
        group_nodes.setdefault(_group(s), set()).add(s["node_count"])
    several = len({s["campaign"] for s in series}) > 1
    colours: dict[tuple[str, str], Any] = {}
    labelled: set[tuple[str, str]] = set()
    last_point: dict[str, tuple[float, float, str]] = {}
    for s in series:
        key = _group(s)
        colour = colours.setdefault(key, f"C{len(colours) % 10}")
        xs, ys = _finite(s["tokens"], s["loss"], positive_x=log_x)
        prev = last_point.get(s["campaign"])
        if prev and s["site"] == "imported" and prev[2] != s["stage"] and xs and xs[0] >= prev[0] and s["number"] == 1:
            xs, ys = [prev[0], *xs], [prev[1], *ys]
        if xs:
            last_point[s["campaign"]] = (xs[-1], ys[-1], s["stage"])
        ax.plot(xs, ys, color=colour, linestyle=styles.get(s["node_count"], "-"), linewidth=1.6,
                marker="o" if len(xs) <= FEW_POINTS else None, markersize=4, gid=f"{s['campaign']}/{s['stage']}/{s['number']}",
                label=_run_label(s, several, len(group_nodes[key]) == 1) if key not in labelled else "_nolegend_")
        labelled.add(key)
    for i, (run, c) in enumerate(ref_runs):
        xs, ys = _finite([r["tokens"] for r in c["rows"]], [r["loss"] for r in c["rows"]], positive_x=log_x)
        nodes = f" ({c['node_count']}N)" if c["node_count"] else ""
        ax.plot(xs, ys, color=REFERENCE_COLOURS[i % len(REFERENCE_COLOURS)], linestyle=styles.get(c["node_count"], "-"),
                linewidth=1.2, marker="s" if len(xs) <= FEW_POINTS else None, markersize=4, zorder=1,
                gid=f"reference/{run}", label=f"reference{': ' + run if run else ''}{nodes}")
    if log_x:
        ax.set_xscale("log")
    _token_axis(ax)
    names = ", ".join(dict.fromkeys(s["campaign"] for s in series)) or "no runs with tokens"
    ax.set_title(title or f"Loss vs tokens: {names}")
    ax.set_xlabel("tokens (cumulative over each stage's attempts)" + (", log scale" if log_x else ""))
    ax.set_ylabel("training loss")
    ax.grid(True, alpha=0.3, which="both" if log_x else "major")
    handles, labels = ax.get_legend_handles_labels()
    if len(styles) > 1:  # a key to the line styles
        for n, style in styles.items():
            handles.append(Line2D([], [], color="0.3", linestyle=style))
            labels.append(f"{n} node{'s' if n != 1 else ''}")
    if handles:
        ax.legend(handles, labels, fontsize=8, loc="upper right")
    return fig


RELAUNCH_COLOUR = "tab:red"


def relaunch_text(r: dict[str, Any]) -> str:
    """A relaunch's label on the chart: `relaunch 1: hang` then who was excluded, whether a
    rescue saved the last step, and the steps lost (what the `relaunch` event recorded)."""
    lines = [f"relaunch {r.get('relaunch') or '?'}: {r.get('cause') or r.get('exit_class') or 'fault'}"
             + (" (drill)" if r.get("drill") else "")]
    if r.get("excluded"):
        lines.append(f"excluded {', '.join(r['excluded'])}")
    if r.get("rescued"):
        lines.append(f"rescued step {r.get('resume_step')}")
    lost = r.get("steps_lost")
    lines.append(f"{lost} step{'s' if lost != 1 else ''} lost" if lost is not None else "steps lost unknown")
    return "\n".join(lines)


def run_figure(runs: Sequence[dict[str, Any]], *, log_x: bool = False, title: str | None = None) -> Figure:
    """The campaign's chart: loss against cumulative tokens of one stage (the long run) across
    all its attempts; each relaunch marked where it resumed (red dashed line, gid
    CAMPAIGN/STAGE/relaunch-K), the failed attempt's last step crossed (gid .../fault-K), the
    steps lost shaded, and a label with its cause, exclusions, rescue and steps lost.
    `runs`: `commands.run_series` per campaign. Attempt lines carry gid CAMPAIGN/STAGE/N."""
    fig = _figure(PROGRESS_SIZE)
    ax = fig.add_subplot()
    several = len(runs) > 1
    labels_at: list[float] = []
    for ci, run in enumerate(runs):
        by_number = {s["number"]: s for s in run["series"]}
        for i, s in enumerate(run["series"]):
            xs, ys = _finite(s["tokens"], s["loss"], positive_x=log_x)
            colour = f"C{ci % 10}" if several else f"C{i % 10}"
            what = f"attempt {s['number']}" + (f" ({s['label']})" if s.get("label") else "")
            ax.plot(xs, ys, color=colour, linewidth=1.6, marker="o" if len(xs) <= FEW_POINTS else None, markersize=3,
                    gid=f"{run['campaign']}/{run['stage']}/{s['number']}",
                    label=f"{run['campaign']}: {what}" if several else what)
        for r in run["relaunches"]:
            failed, nxt = by_number.get(r.get("after")), by_number.get((r.get("after") or 0) + 1)
            gid = f"{run['campaign']}/{run['stage']}"
            k = r.get("relaunch") or r.get("after")
            fx, fy = _finite(failed["tokens"], failed["loss"], positive_x=log_x) if failed else ([], [])
            nx, _ = _finite(nxt["tokens"], nxt["loss"], positive_x=log_x) if nxt else ([], [])
            if fx:
                ax.plot([fx[-1]], [fy[-1]], "x", color=RELAUNCH_COLOUR, markersize=9, markeredgewidth=2,
                        gid=f"{gid}/fault-{k}")
            at = _resumed_at(failed, r.get("resume_step"), nx)
            if at is None:
                continue
            ax.axvline(at, color=RELAUNCH_COLOUR, linestyle="--", linewidth=1, gid=f"{gid}/relaunch-{k}")
            if fx and fx[-1] > at:  # the steps lost: trained again by the relaunch
                ax.axvspan(at, fx[-1], color=RELAUNCH_COLOUR, alpha=0.12, linewidth=0, gid=f"{gid}/lost-{k}")
            # Labels of relaunches close together step down the axes instead of overlapping.
            near = sum(1 for x in labels_at if abs(x - at) < 0.15 * max(ax.get_xlim()[1], 1))
            labels_at.append(at)
            ax.annotate(relaunch_text(r), (at, 0.97 - 0.2 * near), xycoords=("data", "axes fraction"), xytext=(4, 0),
                        textcoords="offset points", va="top", ha="left", fontsize=8, color=RELAUNCH_COLOUR,
                        bbox={"boxstyle": "round,pad=0.3", "facecolor": "white", "edgecolor": RELAUNCH_COLOUR,
                              "alpha": 0.85}, gid=f"{gid}/label-{k}")
    if log_x:
        ax.set_xscale("log")
    _token_axis(ax)
    named = [f"{r['campaign']} / {r['stage']}" for r in runs if r.get("stage")]
    n_att = sum(len(r["series"]) for r in runs)
    n_rel = sum(len(r["relaunches"]) for r in runs)
    ax.set_title(title or (f"Loss vs tokens: {', '.join(named)} ({n_att} attempt{'s' if n_att != 1 else ''}, "
                           f"{n_rel} relaunch{'es' if n_rel != 1 else ''})" if named else "no stage with steps"))
    ax.set_xlabel("tokens (cumulative over the stage's attempts)" + (", log scale" if log_x else ""))
    ax.set_ylabel("training loss")
    ax.grid(True, alpha=0.3, which="both" if log_x else "major")
    handles, labels = ax.get_legend_handles_labels()
    if any(r["relaunches"] for r in runs):  # a key to the relaunch marks
        handles += [Line2D([], [], color=RELAUNCH_COLOUR, marker="x", linestyle="", markersize=8, markeredgewidth=2),
                    Line2D([], [], color=RELAUNCH_COLOUR, linestyle="--", linewidth=1)]
        labels += ["last step before the fault", "relaunch: resumed from here (shaded: steps lost)"]
    if handles:
        ax.legend(handles, labels, fontsize=8, loc="upper right")
    return fig


def _resumed_at(failed: dict[str, Any] | None, resume_step: int | None, next_tokens: list[Any]) -> Any:
    """Where on the token axis a relaunch resumed: the failed attempt's tokens at the
    checkpoint's step (the relaunch trains on from there), else the relaunch's first point."""
    if failed is not None and resume_step is not None and resume_step in failed["steps"]:
        return failed["tokens"][failed["steps"].index(resume_step)]
    if next_tokens:
        return next_tokens[0]
    return failed["tokens"][-1] if failed and failed["tokens"] else None


def scaling_figure(tables: Sequence[tuple[str, Sequence[dict[str, Any]]]], *, min_efficiency: float | None = None,
                   title: str | None = None) -> Figure:
    """Tokens/s, efficiency and collective-time share against node count; `tables`: (run
    label, scaling table rows) pairs. Lines carry gid LABEL/tokens_per_s|efficiency|comm_share."""
    fig = _figure(SCALING_SIZE)
    ax_tps, ax_eff, ax_comm = fig.subplots(1, 3)
    for i, (label, rows) in enumerate(tables):
        colour = f"C{i % 10}"
        nodes = [r["nodes"] for r in rows]
        xs, tps = _finite(nodes, [r.get("tokens_per_s") for r in rows])
        ax_tps.plot(xs, tps, "o-", color=colour, gid=f"{label}/tokens_per_s", label=label)
        if xs:
            ax_tps.plot(xs, [tps[0] * n / xs[0] for n in xs], ":", color=colour, alpha=0.6, gid=f"{label}/ideal",
                        label=f"{label}: ideal")
        xe, eff = _finite(nodes, [r.get("efficiency") for r in rows])
        ax_eff.plot(xe, eff, "o-", color=colour, gid=f"{label}/efficiency", label=label)
        xc, share = _finite(nodes, [r.get("comm_share") for r in rows])
        ax_comm.plot(xc, [100 * v for v in share], "o-", color=colour, gid=f"{label}/comm_share", label=label)
    if min_efficiency is not None:
        ax_eff.axhline(min_efficiency, color="red", linestyle="--", linewidth=1, label=f"floor {min_efficiency:g}")
    ax_tps.yaxis.set_major_formatter(FuncFormatter(lambda v, _p: fmt_tokens(int(v))))
    for ax, ylabel, name in ((ax_tps, "tokens/s", "Throughput"), (ax_eff, "efficiency (per-node tokens/s vs smallest)",
                                                                   "Scaling efficiency"),
                             (ax_comm, "collective time, % of step", "Collective-time share")):
        ax.set_xlabel("nodes")
        ax.set_ylabel(ylabel)
        ax.set_title(name)
        ax.grid(True, alpha=0.3)
        counts = sorted({r["nodes"] for _, rows in tables for r in rows})
        if counts:
            ax.set_xticks(counts)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    ax_eff.set_ylim(bottom=0)
    ax_comm.set_ylim(bottom=0)
    fig.suptitle(title or "Scaling: " + ", ".join(label for label, _ in tables))
    return fig


def steps_figure(campaigns: Sequence[Sequence[dict[str, Any]]], *, title: str | None = None) -> Figure:
    """Step time (ms) and loss against step. Series as in `progress_figure` with the
    `step_time_s` column; lines carry gid CAMPAIGN/STAGE/ATTEMPT/step_time|loss. Every
    attempt's first step is marked (dotted); a relaunch (after a failed attempt of the
    same stage) in red, named with the exit class it followed, above the axes (gid
    .../relaunch-label): inside them the label covered the slow first steps of the relaunch."""
    fig = _figure(STEPS_SIZE)
    ax_time, ax_loss = fig.subplots(2, 1, sharex=True)
    several = len({s["campaign"] for c in campaigns for s in c}) > 1
    colours: dict[tuple[str, str], str] = {}
    labels: list[tuple[Any, str, str]] = []  # (step, text, gid) of each relaunch
    for c in campaigns:
        prev: dict[str, Any] | None = None
        for s in c:
            key = (s["campaign"], s["stage"])
            new = key not in colours
            colour = colours.setdefault(key, f"C{len(colours) % 10}")
            gid = f"{key[0]}/{key[1]}/{s['number']}"
            label = f"{_run_label(s, several)}" if new else "_nolegend_"
            xs, ts = _finite(s["steps"], s.get("step_time_s", []))
            ax_time.plot(xs, [1000 * t for t in ts], color=colour, linewidth=1.2, gid=f"{gid}/step_time", label=label)
            xl, ls = _finite(s["steps"], s["loss"])
            ax_loss.plot(xl, ls, color=colour, linewidth=1.2, gid=f"{gid}/loss", label=label)
            relaunch = (prev is not None and prev["stage"] == s["stage"]
                        and prev["state"] not in (ExitClass.SUCCEEDED, "running"))
            if s["steps"] and (relaunch or s["number"] > 1):
                first = s["steps"][0]
                for ax in (ax_time, ax_loss):
                    ax.axvline(first, color="red" if relaunch else "0.5", linestyle="--" if relaunch else ":",
                               linewidth=1, gid=f"{gid}/{'relaunch' if relaunch else 'boundary'}")
                if relaunch:
                    labels.append((first, f"relaunch {s['number'] - 1} after {prev['state']}", f"{gid}/relaunch-label"))
            prev = s
    rows = _label_rows([x for x, _, _ in labels], ax_time.get_xlim())
    for (x, text, gid), row in zip(labels, rows):
        # In the band between the title and the axes, centred on the red line: never over the data.
        ax_time.annotate(text, (x, 1), xycoords=("data", "axes fraction"), xytext=(0, 3 + LABEL_ROW_PT * row),
                         textcoords="offset points", ha="center", va="bottom", fontsize=8, color="red", gid=gid)
    ax_time.set_ylabel("step time (ms)")
    ax_loss.set_ylabel("training loss")
    ax_loss.set_xlabel("step")
    for ax in (ax_time, ax_loss):
        ax.grid(True, alpha=0.3)
    if ax_loss.get_legend_handles_labels()[0]:
        ax_loss.legend(fontsize=8, loc="upper right")
    names = ", ".join(dict.fromkeys(f"{s['campaign']} / {s['stage']}" for c in campaigns for s in c))
    ax_time.set_title(title or f"Step time and loss: {names}", pad=6 + LABEL_ROW_PT * (max(rows) + 1) if rows else 6)
    return fig


LABEL_ROW_PT = 11
"""Points between rows of relaunch labels above the step-time axes."""


def _label_rows(xs: Sequence[Any], xlim: tuple[float, float], *, width: float = 0.22) -> list[int]:
    """A row (0: just above the axes) for each label centred at xs, so that labels closer than
    `width` of the x range (about one label's length) stack instead of overlapping."""
    span = max(xlim[1] - xlim[0], 1e-9)
    placed: list[tuple[float, int]] = []
    rows = []
    for x in xs:
        taken = {r for px, r in placed if abs(px - x) < width * span}
        row = next(r for r in range(len(placed) + 1) if r not in taken)
        placed.append((x, row))
        rows.append(row)
    return rows


def goodput_figure(campaigns: list[dict[str, Any]]) -> Any:
    """Horizontal stacked bars (seconds): per stage and per campaign, productive then each lost bucket."""
    bars = [(f"{c['name']} / {st['name']}", st["goodput"]) for c in campaigns for st in c["stages"]
            if (st.get("goodput") or {}).get("wall_s")]
    bars += [(f"{c['name']} (campaign)", c["goodput"]) for c in campaigns if (c.get("goodput") or {}).get("wall_s")]
    fig = _figure((10.0, 1.6 + 0.45 * max(len(bars), 1)))
    ax = fig.add_subplot()
    for i, (_, g) in enumerate(bars):
        left = 0.0
        for key in ("productive_s", *LOST):
            width = g["productive_s"] if key == "productive_s" else g["lost"][key]
            ax.barh(i, width, left=left, color=GOODPUT_COLOURS[key], label=(GOODPUT_LABELS.get(key, "productive") if i == 0 else None))
            left += width
        ax.text(left, i, f"  ETTR {g['ettr']:.2f}", va="center", fontsize=8)
    ax.set_yticks(range(len(bars)), [b[0] for b in bars], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("wall time (s)")
    ax.set_xlim(0, 1.12 * max((g["wall_s"] for _, g in bars), default=1.0))  # room for the ETTR labels
    fig.legend(fontsize=8, ncols=7, loc="outside lower center")
    ax.set_title("Goodput: productive training time and where the rest went")
    return fig


def save(fig: Figure, path: str | Path) -> Path:
    """Write the figure as PNG (its size in inches times DPI pixels) and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, format="png")
    return path
