"""Goodput as the user sees it: one line per stage in `campaign status`, and `campaign plot
--kind goodput` (stacked bars: productive time and each lost bucket, per stage and campaign).

Pure functions from the `status --json` shape; matplotlib is imported only by the figure.
"""

from __future__ import annotations

from typing import Any

from rich.markup import escape
from rich.table import Table

from campaign.goodput import LOST
from campaign.views import fmt_duration

LABELS = {"startup_s": "startup", "checkpoint_stall_s": "checkpoint", "recomputed_s": "recomputed",
          "detection_s": "detection", "restart_s": "restart", "other_s": "other"}
COLOURS = {"productive_s": "tab:green", "startup_s": "tab:blue", "checkpoint_stall_s": "tab:purple",
           "recomputed_s": "tab:orange", "detection_s": "tab:red", "restart_s": "tab:brown", "other_s": "0.7"}


def goodput_line(g: dict[str, Any]) -> str:
    """`ETTR 0.82: 41.0 s of 50.0 s trained; lost startup 5.0 s, detection 3.0 s` (largest first)."""
    if not g or not g.get("wall_s"):
        return "-"
    lost = sorted(((v, k) for k, v in g["lost"].items() if v >= 0.05), reverse=True)
    text = f"ETTR {g['ettr']:.2f}: {fmt_duration(g['productive_s'])} of {fmt_duration(g['wall_s'])} trained"
    if lost:
        text += "; lost " + ", ".join(f"{LABELS[k]} {fmt_duration(v)}" for v, k in lost)
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


def goodput_figure(campaigns: list[dict[str, Any]]) -> Any:
    """Horizontal stacked bars (seconds): per stage and per campaign, productive then each lost bucket."""
    from campaign.plots import _figure

    bars = [(f"{c['name']} / {st['name']}", st["goodput"]) for c in campaigns for st in c["stages"]
            if (st.get("goodput") or {}).get("wall_s")]
    bars += [(f"{c['name']} (campaign)", c["goodput"]) for c in campaigns if (c.get("goodput") or {}).get("wall_s")]
    fig = _figure((10.0, 1.6 + 0.45 * max(len(bars), 1)))
    ax = fig.add_subplot()
    for i, (_, g) in enumerate(bars):
        left = 0.0
        for key in ("productive_s", *LOST):
            width = g["productive_s"] if key == "productive_s" else g["lost"][key]
            ax.barh(i, width, left=left, color=COLOURS[key], label=(LABELS.get(key, "productive") if i == 0 else None))
            left += width
        ax.text(left, i, f"  ETTR {g['ettr']:.2f}", va="center", fontsize=8)
    ax.set_yticks(range(len(bars)), [b[0] for b in bars], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("wall time (s)")
    ax.set_xlim(0, 1.12 * max((g["wall_s"] for _, g in bars), default=1.0))  # room for the ETTR labels
    fig.legend(fontsize=8, ncols=7, loc="outside lower center")
    ax.set_title("Goodput: productive training time and where the rest went")
    return fig
