"""`campaign report NAME --html OUT.html`: one campaign as one self-contained HTML page.

    data = commands.report_data(ledger, name)         # the ledger only (status's reads + faults + samples)
    write(Path("out.html"), render(data))             # atomically: a temporary file renamed over it

The page needs nothing from a network or a disk: its plots are PNG images inline (base64
`data:` URLs, drawn by campaign.plots), its style is inline, it has no script, and its
Content-Security-Policy forbids loading anything else, so it can be mailed or put on a web
space as it is. Every string that comes from the ledger (names, verdicts, node names,
evidence lines written by a trainer) is HTML-escaped: a forged line shows as text.

`render` is a pure function from `report_data`'s dict to the page's text; `watch` rewrites
the file every interval until the campaign stops running, with the page asking the
browser to reload itself meanwhile.
"""

from __future__ import annotations

import base64
import contextlib
import html
import io
import json
import os
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from campaign.errors import CampaignError
from campaign.views import GOODPUT_LABELS, NUMBERS_HIDDEN, fmt_duration, fmt_loss, fmt_mfu, fmt_tokens, fmt_value, goodput_line

MAX_ATTEMPTS = 500
"""Attempts listed (the newest); the ledger export has them all."""
MAX_VALUE_CHARS = 4000
"""An evidence value longer than this is cut (the attempt's run directory has the whole log)."""
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"
"""Nothing but inline images and styles: the page loads nothing, and runs nothing, whatever it holds."""
STATE_CLASS = {"passed": "ok", "succeeded": "ok", "failed": "bad", "running": "run", "cancelled": "warn",
               "pending": "dim", "skipped": "dim"}


def e(value: Any) -> str:
    """Text (any value) escaped for HTML content and attribute values."""
    return html.escape("" if value is None else str(value), quote=True)


# --- the page ---------------------------------------------------------------------------

def render(data: dict[str, Any], *, refresh_s: float | None = None) -> str:
    """The whole page. `refresh_s`: the browser reloads it that often (while it is rewritten)."""
    d = data["detail"]
    title = f"campaign {d['name']} — {d['state']}"
    sections = [_stages(d), _plots(data), _attempts(d), _faults(data["faults"]), _exclusions(data["exclusions"]),
                _scaling(d), _numbers(d), _events(d)]
    body = "\n".join(s for s in sections if s)
    refresh = f'<meta http-equiv="refresh" content="{int(refresh_s)}">\n' if refresh_s else ""
    return (f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{e(CSP)}">
<meta name="viewport" content="width=device-width, initial-scale=1">
{refresh}<title>{e(title)}</title>
<link rel="icon" href="data:,">
<style>{STYLE}</style>
</head>
<body>
{_header(data, refresh_s)}
{_nav(sections)}
<main>
{body}
</main>
<footer>Written by <code>campaign report</code> from the ledger {e(data.get('ledger'))}.
Every table is also in <code>campaign status {e(d['name'])} --json</code> and <code>campaign ledger export</code>.</footer>
</body>
</html>
""")


def _header(data: dict[str, Any], refresh_s: float | None) -> str:
    d = data["detail"]
    meta = [f"site {e(d.get('site'))}", f"version {e(d.get('version'))}", f"updated {e(_minute(d.get('updated')))} UTC",
            f"report written {e(_minute(data.get('generated')))} UTC"]
    if refresh_s:
        meta.append(f"rewritten every {fmt_duration(refresh_s)} while the campaign runs")
    warn = "".join(f'<p class="warning">warning: {e(w)}</p>' for w in d.get("warnings") or [])
    tokens = sum(st["tokens"] or 0 for st in d["stages"])
    passed = sum(st["state"] == "passed" for st in d["stages"])
    facts = [e(f"{passed} of {len(d['stages'])} stages passed"),
             _link("attempts", _count(len(d.get("attempts_detail") or []), "attempt")),
             _link("faults", _count(len(data["faults"]), "fault")),
             _link("exclusions", _count(len(data["exclusions"]), "excluded node")), e(f"{fmt_tokens(tokens)} tokens")]
    g = d.get("goodput") or {}
    goodput = f'<p class="goodput"><b>goodput</b> {e(goodput_line(g))}</p>\n' if g.get("wall_s") else ""
    return (f'<header><h1>campaign {e(d["name"])} {_state(d["state"])}</h1>\n'
            f'<p class="meta">{" · ".join(meta)}</p>\n'
            f'<p class="facts">{" · ".join(facts)}</p>\n{goodput}{warn}</header>')


def _link(section: str, text: str) -> str:
    return f'<a href="#{section}">{e(text)}</a>'


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


SECTION_TITLES = {"stages": "Stages", "plots": "Plots", "attempts": "Attempts", "faults": "Faults",
                  "exclusions": "Excluded nodes", "scaling": "Scaling", "numbers": "Stage numbers",
                  "events": "Events"}


def _nav(sections: Sequence[str]) -> str:
    ids = [k for k in SECTION_TITLES if any(s.startswith(f'<section id="{k}"') for s in sections)]
    return "<nav>" + " ".join(f'<a href="#{k}">{SECTION_TITLES[k]}</a>' for k in ids) + "</nav>"


def _section(key: str, inner: str, note: str = "") -> str:
    note_html = f'<p class="note">{note}</p>' if note else ""
    return f'<section id="{key}">\n<h2>{SECTION_TITLES[key]}</h2>\n{note_html}{inner}\n</section>'


def _table(headers: Sequence[str], rows: Iterable[Sequence[str]], *, numeric: Iterable[int] = (),
           cls: str = "") -> str:
    """Cells are HTML already (escape them with `e` or build them from escaped parts)."""
    right = set(numeric)
    head = "".join(f'<th{" class=num" if i in right else ""}>{e(h)}</th>' for i, h in enumerate(headers))
    body = "\n".join("<tr>" + "".join(f'<td{" class=num" if i in right else ""}>{c}</td>' for i, c in enumerate(r))
                     + "</tr>" for r in rows)
    return f'<div class="scroll"><table{f" class={cls}" if cls else ""}>\n<thead><tr>{head}</tr></thead>\n' \
           f'<tbody>\n{body}\n</tbody></table></div>'


def _state(state: str | None) -> str:
    return f'<span class="state {STATE_CLASS.get(state or "", "bad")}">{e(state)}</span>'


def _minute(iso: str | None) -> str:
    return (iso or "-")[:19].replace("T", " ")


def _time(iso: str | None) -> str:
    return f'<span class="time">{e(_minute(iso))}</span>'



def _stages(d: dict[str, Any]) -> str:
    """One row per stage; the goodput column only where some stage has its time accounted."""
    goodput = any((st.get("goodput") or {}).get("wall_s") for st in d["stages"])
    rows = []
    for i, st in enumerate(d["stages"], 1):
        g = st.get("goodput") or {}
        row = [str(i), e(st["name"]), e(st["kind"]), _state(st["state"]), e(st["attempts"]),
               e(fmt_tokens(st["tokens"])), e(fmt_loss(st["last_loss"]))]
        row += [f'<span class="goodput">{e(goodput_line(g)) if g.get("wall_s") else "-"}</span>'] if goodput else []
        rows.append(row + [f'<span class="verdict">{e(st["verdict"])}</span>'])
    headers = ["#", "stage", "kind", "state", "attempts", "tokens", "last loss", *(["goodput"] if goodput else []),
               "verdict"]
    return _section("stages", _table(headers, rows, numeric=(0, 4, 5, 6)))


def _attempts(d: dict[str, Any]) -> str:
    attempts = d.get("attempts_detail") or []
    if not attempts:
        return ""
    shown = attempts[-MAX_ATTEMPTS:]
    rows = []
    for a in shown:
        steps = "-" if a["last_step"] is None else f"{a['first_step']}–{a['last_step']}"
        nodes = ", ".join(a["nodes"]) or (str(a["node_count"]) if a["node_count"] else "-")
        suspects = f' <span class="suspects">suspects: {e(", ".join(str(x) for x in a["suspects"]))}</span>' \
            if a.get("suspects") else ""
        rows.append([e(a["stage"]), e(a["number"]), e(a["label"]), _state(a["state"]), e(_dash(a["exit_code"])),
                     e(steps), e(fmt_tokens(a["tokens"])), e(fmt_loss(a["last_loss"])), e(fmt_duration(a["duration_s"])),
                     _time(a["started"]), f'<span class="nodes">{e(nodes)}</span>{suspects}'])
    note = (f"the newest {MAX_ATTEMPTS} of {len(attempts)} (campaign ledger export --what attempts lists them all)"
            if len(attempts) > MAX_ATTEMPTS else "")
    return _section("attempts", _table(["stage", "#", "label", "exit class", "exit", "steps", "tokens", "last loss",
                                        "took", "started", "nodes"], rows, numeric=(1, 4, 6, 7, 8)), e(note))


def _dash(v: Any) -> str:
    return "-" if v is None else str(v)


def _faults(faults: list[dict[str, Any]]) -> str:
    if not faults:
        return _section("faults", '<p class="none">No attempt failed.</p>')
    cards = []
    for f in faults:
        head = (f'<h3>{e(f["stage"])} · attempt {e(f["number"])} {_state(f["state"])}'
                f'<span class="exit">exit {e(_dash(f["exit_code"]))}</span>'
                f'<span class="when">{e(_minute(f["finished"]))}</span></h3>')
        parts = [f'<p class="what">{e(f["what"])}</p>'] if f.get("what") else []
        facts = [(label, f[k]) for k, label in FAULT_FACTS.items() if f.get(k) is not None]
        if facts:
            parts.append('<p class="facts">' + " · ".join(f"{e(label)} <b>{e(_short(v))}</b>"
                                                             for label, v in facts) + "</p>")
        for s in f.get("suspects") or []:
            parts.append(f'<div class="suspect"><p>suspect node <b class="node">{e(s.get("node"))}</b>: '
                         f'{e(s.get("reason"))}</p>{_evidence(s.get("evidence"))}</div>')
        if f.get("evidence"):
            parts.append(_evidence(f["evidence"]))
        cards.append(f'<article class="fault">{head}\n' + "\n".join(parts) + "</article>")
    return _section("faults", "\n".join(cards))


FAULT_FACTS = {"rule": "rule", "signature": "signature", "detected_after_s": "detected after", "killed_by": "killed by"}


def _evidence(ev: Any) -> str:
    """An evidence dict as a definition list; strings and lists of lines in <pre>."""
    if not ev:
        return ""
    if not isinstance(ev, dict):
        ev = {"evidence": ev}
    items = []
    for k, v in ev.items():
        if v is None or v == "":
            continue
        scalars = isinstance(v, list) and all(isinstance(x, (str, int, float)) and "\n" not in str(x) for x in v)
        if scalars and len(", ".join(map(str, v))) <= 80:
            text = ", ".join(map(str, v))
        elif scalars:  # log lines
            text = "\n".join(map(str, v))
        elif isinstance(v, str):
            text = v
        elif isinstance(v, float):
            text = fmt_value(v)
        elif isinstance(v, dict) and all(not isinstance(x, (dict, list)) for x in v.values()):
            text = " · ".join(f"{k2} {_scalar(k2, x)}" for k2, x in v.items())
        else:
            text = json.dumps(v, default=str)
        if len(text) > MAX_VALUE_CHARS:
            text = text[:MAX_VALUE_CHARS] + f"\n… ({len(text) - MAX_VALUE_CHARS:,} more characters)"
        value = f"<pre>{e(text)}</pre>" if "\n" in text or len(text) > 80 else f"<span>{e(text)}</span>"
        items.append(f"<dt>{e(k)}</dt><dd>{value}</dd>")
    return f'<dl class="evidence">{"".join(items)}</dl>'


def _scalar(key: str, v: Any) -> str:
    """A value inside an evidence dict: epoch seconds (`*_at`) as a UTC time, floats short."""
    if key.endswith("_at") and isinstance(v, (int, float)) and v > 1e9:
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(v))
    return fmt_value(v) if isinstance(v, float) else str(v)


def _short(v: Any) -> str:
    return fmt_duration(v) if isinstance(v, float) else str(v)


def _exclusions(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return _section("exclusions", '<p class="none">No node is excluded on this site.</p>')
    out = [[f'<b class="node">{e(x["node"])}</b>', _time(x["since"]), _time(x["expires"]) if x["expires"] else "never",
            e(x.get("attempt") or "-"), f'{e(x["reason"])}{_evidence(x.get("evidence"))}'] for x in rows]
    return _section("exclusions", _table(["node", "since", "expires", "attempt", "reason and evidence"], out))


SCALING_COLUMNS = (("nodes", "nodes"), ("ranks", "ranks"), ("step_time_s", "step s"), ("tokens_per_s", "tok/s"),
                   ("comm_share", "comm %"), ("mem_peak_gib", "mem GiB"), ("loss", "loss"), ("efficiency", "eff"))


def _scaling(d: dict[str, Any]) -> str:
    tables = []
    for sc in d.get("scaling") or []:
        rows = [[e(fmt_value(r.get(k) * 100 if k == "comm_share" and isinstance(r.get(k), (int, float)) else r.get(k)))
                 for k, _ in SCALING_COLUMNS] for r in sc["rows"] if isinstance(r, dict)]
        tables.append(f"<h3>{e(sc['stage'])}</h3>" + _table([h for _, h in SCALING_COLUMNS], rows,
                                                            numeric=range(len(SCALING_COLUMNS))))
    return _section("scaling", "\n".join(tables)) if tables else ""


def _numbers(d: dict[str, Any]) -> str:
    rows = []
    for name, numbers in (d.get("stage_numbers") or {}).items():
        shown = {k: v for k, v in numbers.items() if k not in NUMBERS_HIDDEN}
        if isinstance(shown.get("mfu"), (int, float)):  # as status reads it: `40.0% (float8 peak 20.0%)`
            shown["MFU"] = fmt_mfu(shown.pop("mfu"), shown.pop("mfu_float8", None))
        if shown:
            rows.append([e(name), _evidence(shown)])
    return _section("numbers", _table(["stage", "numbers"], rows)) if rows else ""


def _events(d: dict[str, Any]) -> str:
    events = d.get("events") or []
    if not events:
        return ""
    rows = [[_time(x["time"]), f'<span class="kind">{e(x["kind"])}</span>', e(x["message"])] for x in events]
    return _section("events", _table(["time (UTC)", "kind", "message"], rows),
                    f"the newest {len(events)} events that are news (watchdog actions, exclusions, relaunches)")


# --- plots ------------------------------------------------------------------------------

def _plots(data: dict[str, Any]) -> str:
    figures = list(_figures(data))
    if not figures:
        return _section("plots", '<p class="none">No steps recorded yet.</p>')
    return _section("plots", "\n".join(_img(fig, caption) for fig, caption in figures))


def _figures(data: dict[str, Any]) -> Iterable[tuple[Any, str]]:
    from campaign import plots

    d = data["detail"]
    if any(any(s["tokens"]) for s in data["progress"]):
        yield (plots.progress_figure([data["progress"]]),
               "Loss against cumulative tokens: one line per attempt, one colour per stage.")
    if data["steps"]:
        yield (plots.steps_figure([data["steps"]]),
               f"Step time and loss of stage {data['steps'][0]['stage']} against step; each relaunch in red.")
    if any((st.get("goodput") or {}).get("wall_s") for st in d["stages"]):
        yield (plots.goodput_figure([d]),
               "Goodput: productive training time and where the rest went (" +
               ", ".join(GOODPUT_LABELS.values()) + ").")
    if d.get("scaling"):
        yield (plots.scaling_figure([(sc["stage"], sc["rows"]) for sc in d["scaling"]]),
               "Scaling: tokens/s against nodes (dashed: ideal), efficiency, collective-time share.")


def _img(fig: Any, caption: str) -> str:
    from campaign import plots

    buf = io.BytesIO()
    fig.savefig(buf, dpi=plots.DPI, format="png")
    w, h = (round(x * plots.DPI) for x in fig.get_size_inches())
    src = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")
    return (f'<figure><img src="{src}" width="{w}" height="{h}" alt="{e(caption)}">'
            f"<figcaption>{e(caption)}</figcaption></figure>")


# --- writing ----------------------------------------------------------------------------

def write(path: Path, text: str) -> Path:
    """Replace `path` with `text` at once: a temporary file beside it, renamed over it, so a
    reader (a browser, a web server) sees the old page or the new one, never half of one.
    Its mode is the umask's, as any file this user makes (readable by a web server if the
    umask allows), not a private temporary file's 0600."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise CampaignError(f"{err.filename or path}: {err.strerror or err}") from None
    return path


def watch(fetch: Callable[[], dict[str, Any]], out: Path, *, interval: float, count: int | None = None,
          notify: Callable[[str], None] = lambda line: None, sleep: Callable[[float], None] = time.sleep) -> int:
    """Write the page of `fetch()` to `out`, again every `interval` seconds until the campaign
    is no longer running, after `count` writes, or Ctrl-C; returns the number of writes. While
    more writes follow, the page asks the browser to reload itself every `interval`."""
    writes = 0
    try:
        while True:
            data = fetch()
            writes += 1
            last = data["detail"]["state"] != "running" or (count is not None and writes >= count)
            write(out, render(data, refresh_s=None if last else max(interval, 1.0)))
            notify(f"{out}: written at {time.strftime('%H:%M:%S')} (campaign {data['detail']['state']})")
            if last:
                return writes
            sleep(interval)
    except KeyboardInterrupt:
        return writes


STYLE = """
:root { --fg: #1d2330; --muted: #5b6475; --line: #dde2ea; --bg: #ffffff; --head: #f4f6f9;
        --ok: #1a7f37; --bad: #c0262d; --run: #9a6700; --warn: #8250df; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--fg);
       background: var(--bg); }
header, nav, main, footer { max-width: 1200px; margin: 0 auto; padding: 0 20px; }
header { padding-top: 18px; }
h1 { font-size: 24px; margin: 0 0 6px; }
h2 { font-size: 18px; margin: 28px 0 10px; padding-bottom: 4px; border-bottom: 2px solid var(--line); }
h3 { font-size: 15px; margin: 0 0 6px; }
p { margin: 4px 0; }
.meta, .note, figcaption, footer, .when { color: var(--muted); }
.facts b { font-weight: 600; }
nav { position: sticky; top: 0; background: var(--bg); padding-top: 8px; padding-bottom: 8px;
      border-bottom: 1px solid var(--line); z-index: 1; }
nav a { margin-right: 14px; color: #0b57d0; text-decoration: none; }
.state { display: inline-block; padding: 1px 8px; border-radius: 10px; font-size: 12px; font-weight: 600;
         vertical-align: middle; background: #eef0f4; color: var(--muted); white-space: nowrap; }
.state.ok { background: #dafbe1; color: var(--ok); }
.state.bad { background: #ffebe9; color: var(--bad); }
.state.run { background: #fff8c5; color: var(--run); }
.state.warn { background: #fbefff; color: var(--warn); }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; width: 100%; font-size: 13px; }
th, td { text-align: left; vertical-align: top; padding: 5px 8px; border-bottom: 1px solid var(--line); }
th { background: var(--head); font-weight: 600; white-space: nowrap; }
td.num, th.num { text-align: right; white-space: nowrap; font-variant-numeric: tabular-nums; }
.verdict { display: block; min-width: 220px; }
.goodput { display: block; min-width: 180px; font-size: 12px; }
.nodes { word-break: break-word; }
.suspects { color: var(--bad); }
.warning { color: var(--run); }
figure { margin: 12px 0 22px; }
figure img { display: block; max-width: 100%; height: auto; border: 1px solid var(--line); }
.fault { border: 1px solid var(--line); border-left: 4px solid var(--bad); border-radius: 4px; padding: 10px 12px;
         margin: 10px 0; }
.fault .exit, .fault .when { font-weight: normal; font-size: 12px; margin-left: 10px; }
.suspect { margin-top: 6px; }
.node { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; white-space: nowrap; }
.time, .kind { white-space: nowrap; }
dl.evidence { display: grid; grid-template-columns: max-content 1fr; gap: 2px 12px; margin: 6px 0 0; font-size: 12px; }
dl.evidence dt { color: var(--muted); }
dl.evidence dd { margin: 0; min-width: 0; }
pre { margin: 0; padding: 6px 8px; background: #f6f8fa; border-radius: 4px; white-space: pre-wrap;
      overflow-wrap: anywhere; font-size: 12px; max-height: 320px; overflow: auto; }
.none { color: var(--muted); font-style: italic; }
footer { margin: 30px auto 24px; font-size: 12px; }
"""
