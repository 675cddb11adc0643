"""The operations behind the CLI and the remote endpoint functions, as plain functions.

    ledger = open_at(db_url, workdir, create=False)
    data = status_data(ledger, "demo")                 # what `campaign status demo --json` prints
    path = draw_plot(plot_data(ledger, ["demo"]), "progress", Path("plots"))

`campaign.cli` parses arguments and renders what these return; `campaign.remote`'s
endpoint functions call the same functions on the endpoint's host and send their JSON
back. Each takes an open `Ledger` (or plain data), returns data, and raises the errors of
`campaign.errors`; none prints, and none needs click.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from campaign.errors import CampaignError

if TYPE_CHECKING:
    from campaign.ledger import Ledger

PLOT_KINDS = ("progress", "scaling", "steps", "goodput")
EXPORT_KINDS = ("steps", "attempts", "nodes")
PAGE_ROWS = 20_000
"""Rows in one page of `ledger export --what steps` (a page is one ledger session)."""
PAGE_BYTES = 2 * 2**20
"""A page is also cut at about this much JSON (the remote service limits results)."""


def open_at(db_url: str | None, workdir: Path, *, create: bool = True) -> Ledger:
    """The ledger at `db_url`, else the default one in `workdir`."""
    from campaign.ledger import default_url, open_ledger

    return open_ledger(db_url or default_url(workdir), create=create)


def planned_version(db_url: str | None, workdir: Path, spec: Any, *, new_version: bool) -> tuple[int, str | None]:
    """The campaign version a `submit` of `spec` would run as (what the dry run shows as run
    directories): 1 for a campaign the ledger does not know, its version for the same file,
    the next one for a changed file with `--new-version`. Reads the ledger, never creates or
    changes it; the second item says why the ledger could not be read (then 1 is assumed)."""
    from campaign.errors import NoLedger
    from campaign.ledger import reads
    from campaign.spec import reread_digest

    try:
        ledger = open_at(db_url, workdir, create=False)
    except NoLedger:
        return 1, None
    except CampaignError as e:
        return 1, str(e)
    try:
        with ledger.session() as s:
            c = reads.get_campaign(s, spec.name)
            if c is None:
                return 1, None
            digest = spec.digest()
            changed = c.spec_digest != digest and reread_digest(c.spec_source, spec.name) != digest
            return int(c.version) + (1 if changed and new_version else 0), None
    finally:
        ledger.close()


def upgrade_schema(url: str) -> str:
    """`campaign db upgrade`: migrate the ledger at `url` to this release's schema (made if
    new), under the schema lock; its revision afterwards."""
    from campaign.ledger import schema
    from campaign.ledger.db import explained, make_engine, schema_lock

    engine = make_engine(url)
    try:
        with explained(engine):
            with schema_lock(engine):  # not while a driver creates it
                schema.upgrade(engine)
            with engine.connect() as conn:
                return str(schema.current_revision(conn))
    finally:
        engine.dispose()


def schema_revisions(url: str) -> tuple[str | None, str]:
    """`campaign db current`: the ledger's schema revision (None: empty) and this release's."""
    from campaign.ledger import schema
    from campaign.ledger.db import explained, make_engine

    engine = make_engine(url)
    try:
        with explained(engine), engine.connect() as conn:
            return schema.current_revision(conn), schema.head_revision()
    finally:
        engine.dispose()


# --- status ----------------------------------------------------------------------------

def status_data(ledger: Ledger, name: str | None) -> Any:
    """`campaign status [NAME] --json`: the list of campaigns, or one campaign's detail."""
    from campaign import summary
    from campaign.ledger import reads

    with ledger.session() as s:
        if name is None:
            return [reads.summarize_campaign_row(s, c) for c in reads.list_campaigns(s)]
        return summary.describe_campaign(s, reads.require_campaign(s, name, ledger.display_url))


def live_driver(ledger: Ledger, name: str) -> dict[str, Any] | None:
    """The live driver of campaign `name` (its lease's host, pid and the spec digest), or None."""
    from campaign.lease import is_live
    from campaign.ledger import reads
    from campaign.ledger.models import db_utcnow

    with ledger.session() as s:
        c = reads.get_campaign(s, name)
        lease = reads.get_lease(s, c) if c is not None else None
        if c is None or lease is None or not is_live(lease, db_utcnow(s)):
            return None
        return {"host": lease.host, "pid": lease.pid, "digest": c.spec_digest}


# --- cancel ----------------------------------------------------------------------------

def cancel_campaign(ledger: Ledger, name: str, wait_s: float, *, notify: Callable[[str], None] = lambda line: None,
                    poll_s: float = 0.5) -> str:
    """Ask the driver of campaign `name` (on this host) to stop, with SIGTERM, and wait
    until it released its lease; returns the campaign's state then. `notify` hears
    progress lines. Raises CampaignError when no driver runs, it runs elsewhere, or it
    did not stop within `wait_s`."""
    from campaign.ledger import reads

    with ledger.session() as s:
        lease = reads.get_lease(s, reads.require_campaign(s, name, ledger.display_url))
        holder = (lease.host, lease.pid) if lease else None
    if holder is None:
        raise CampaignError(f"campaign {name!r} is not running (no driver holds it); its state is in `campaign status {name}`")
    host, pid = holder
    if host != socket.gethostname():
        raise CampaignError(f"campaign {name!r} is driven from {host} (pid {pid}); run `campaign cancel` there, "
                            "or through its Globus Compute endpoint with --endpoint")
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        raise CampaignError(f"the driver of {name!r} (pid {pid}) is gone; `campaign resume {name}` recovers it") from None
    notify(f"asked the driver of {name} (pid {pid}) to stop")
    end = time.monotonic() + wait_s
    while time.monotonic() < end:
        with ledger.session() as s:
            c = reads.get_campaign(s, name)
            if c is not None and reads.get_lease(s, c) is None:
                return c.state
        time.sleep(poll_s)
    raise CampaignError(f"the driver of {name!r} did not stop within {wait_s:g} s; it may be waiting for its launch to exit")


# --- plot ------------------------------------------------------------------------------

def plot_data(ledger: Ledger, names: Sequence[str], kind: str = "progress", stage: str | None = None,
              max_points: int = 4000) -> dict[str, Any]:
    """What `campaign plot` draws (JSON-ready): `names` of the campaigns found (wildcards
    allowed), and `summaries` (goodput: each campaign's status summary), `tables`
    (scaling: [label, rows]) or `series` (progress, steps;
    downsampled in SQL to about `max_points` per campaign)."""
    from campaign import summary
    from campaign.ledger import reads

    check_plot_names(names)
    with ledger.session() as s:
        found = reads.find_campaigns(s, tuple(names), ledger.display_url)
        out: dict[str, Any] = {"names": [c.name for c in found]}
        if kind == "goodput":  # the status summaries carry each stage's goodput (campaign.goodput)
            out["summaries"] = [summary.summarize_campaign(s, c) for c in found]
            return out
        if kind == "scaling":
            out["tables"] = [[f"{c.name} / {r.name}" if len(found) > 1 else r.name, r.numbers["table"]]
                             for c in found for r in reads.current_stage_runs(s, c)
                             if r.kind == "scaling" and (r.numbers or {}).get("table")]
            return out
        columns = ("loss", "step_time_s") if kind == "steps" else ("loss",)
        out["series"] = [reads.sample_campaign_steps(s, c, max_points=max_points, columns=columns,
                                                     stage=stage or (reads.busiest_stage(s, c) if kind == "steps" else None))
                         for c in found]
        return out


def check_plot_names(patterns: Sequence[str]) -> None:
    """NAME arguments of `plot`: campaign names, wildcards allowed, never a path."""
    from campaign import names

    for p in patterns:
        names.check_pattern(p, "NAME")


def plot_path(names: Sequence[str], kind: str, out_dir: Path) -> Path:
    """The PNG file a plot of campaigns `names` goes to, inside `out_dir`. Each name is
    checked again (a ledger written by an older release may hold any name)."""
    from campaign import names as rule

    for n in names:
        rule.check(n, "campaign name in the ledger")
    stem = "+".join(names) if len(names) <= 3 else f"{names[0]}+{len(names) - 1}-more"
    return out_dir / f"{stem}-{kind}.png"


def draw_plot(data: dict[str, Any], kind: str, out_dir: Path, *, reference_file: Path | None = None,
              log_x: bool = False) -> Path:
    """Draw `plot_data`'s answer (local or from an endpoint) as a PNG in `out_dir`; its path."""
    from campaign import export, plots

    found = data["names"]
    if kind == "goodput":
        fig = plots.goodput_figure(data["summaries"])
    elif kind == "scaling":
        if not data["tables"]:
            raise CampaignError(f"no scaling table in {', '.join(found)}: run a scaling stage first")
        fig = plots.scaling_figure([(label, rows) for label, rows in data["tables"]])
    elif kind == "steps":
        fig = plots.steps_figure(data["series"])
    else:
        ref = export.read_curves(reference_file) if reference_file else None
        fig = plots.progress_figure(data["series"], reference=ref, log_x=log_x)
    return plots.save(fig, plot_path(found, kind, out_dir))


# --- export ----------------------------------------------------------------------------

def export_columns(what: str) -> tuple[str, ...]:
    """The columns of `ledger export --what WHAT`."""
    from campaign import export
    from campaign.ledger.reads import EXPORT_STEP_COLUMNS

    return {"steps": EXPORT_STEP_COLUMNS, "attempts": export.ATTEMPT_COLUMNS, "nodes": export.NODE_COLUMNS}[what]


def export_page(ledger: Ledger, name: str, what: str = "steps", cursor: Sequence[int] | None = None, *,
                max_rows: int = PAGE_ROWS, max_bytes: int = PAGE_BYTES) -> dict[str, Any]:
    """One page of `ledger export`: {"rows", "cursor"} (cursor None: the last page). Steps
    are paged by (attempt, step) on the index; attempts and nodes come whole."""
    from campaign import summary
    from campaign.ledger import reads

    with ledger.session() as s:
        c = reads.find_campaigns(s, (name,), ledger.display_url)[0]
        if what == "attempts":
            return {"rows": summary.describe_campaign(s, c)["attempts_detail"], "cursor": None}
        if what == "nodes":
            return {"rows": reads.list_campaign_nodes(s, c), "cursor": None}
        rows, nxt = _steps_page(s, c, cursor, max_rows, max_bytes)
        return {"rows": rows, "cursor": nxt}


def _steps_page(s: Any, c: Any, cursor: Sequence[int] | None, max_rows: int,
                max_bytes: int) -> tuple[list[dict[str, Any]], list[int] | None]:
    """Rows shaped like `reads.iter_campaign_steps`, from attempt index cursor[0] after
    step cursor[1], until max_rows or about max_bytes of JSON."""
    import sqlalchemy as sa

    from campaign.ledger import reads
    from campaign.ledger.models import StepMetric

    first, after = cursor or (0, None)
    pairs = reads.list_attempts(s, c)
    rows: list[dict[str, Any]] = []
    size = 0
    for i in range(first, len(pairs)):
        run, a = pairs[i]
        query = (sa.select(StepMetric.step, StepMetric.tokens, *(getattr(StepMetric, f) for f in reads.METRIC_FIELDS))
                 .where(StepMetric.attempt_id == a.id).order_by(StepMetric.step).limit(max_rows - len(rows)))
        if i == first and after is not None:
            query = query.where(StepMetric.step > after)
        for row in s.execute(query):
            out = {"stage": run.name, "attempt": a.number, "label": a.label, "nodes": reads.attempt_node_count(a),
                   "step": row[0], "tokens": a.tokens_base + row[1], "attempt_tokens": row[1],
                   **dict(zip(reads.METRIC_FIELDS, row[2:]))}
            rows.append(out)
            size += len(json.dumps(out))
            if len(rows) >= max_rows or size >= max_bytes:
                return rows, [i, int(row[0])]
    return rows, None


def iter_pages(page: Callable[[list[int] | None], dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every row of the pages `page(cursor)` answers, first page first. The first page is
    asked for at once, so a missing campaign raises before anything is written."""
    first = page(None)

    def rows() -> Iterator[dict[str, Any]]:
        p = first
        while True:
            yield from p["rows"]
            if p["cursor"] is None:
                return
            p = page(p["cursor"])

    return rows()


def export_rows(ledger: Ledger, name: str, what: str) -> Iterator[dict[str, Any]]:
    """Every row of `ledger export --what WHAT` of the ledger here. Steps stream from one
    session (no pages: nothing limits a local answer); a missing campaign raises at once,
    before anything is written."""
    from campaign.ledger import reads

    if what != "steps":
        return iter(export_page(ledger, name, what)["rows"])
    with ledger.session() as s:
        reads.find_campaigns(s, (name,), ledger.display_url)
    return _stream_steps(ledger, name)


def _stream_steps(ledger: Ledger, name: str) -> Iterator[dict[str, Any]]:
    from campaign.ledger import reads

    with ledger.session() as s:
        yield from reads.iter_campaign_steps(s, reads.find_campaigns(s, (name,), ledger.display_url)[0])


def write_export(rows: Iterator[dict[str, Any]], what: str, fmt: str, out: Any) -> int:
    """Write export rows as CSV or JSON to the open text file `out`; returns the count."""
    from campaign import export

    return export.write_rows(rows, export_columns(what), fmt, out)


def write_export_file(rows: Iterator[dict[str, Any]], what: str, fmt: str, path: Path) -> int:
    """`write_export` to the file `path`, all or nothing: the rows go to a temporary file in
    the same folder, renamed to `path` once the last row is written; on any error it is
    removed and `path` is left as it was."""
    import tempfile

    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    except OSError as e:
        raise CampaignError(f"--out {path}: cannot write there ({e.strerror or e})") from None
    try:
        with os.fdopen(fd, "w", newline="") as out:
            n = write_export(rows, what, fmt, out)
        os.replace(tmp, path)
    except OSError as e:  # a full disk, a quota: nothing written, one line
        Path(tmp).unlink(missing_ok=True)
        raise CampaignError(f"--out {path}: cannot write there ({e.strerror or e}); nothing was written") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return n


def write_export_stdout(rows: Iterator[dict[str, Any]], what: str, fmt: str, out: Any) -> int:
    """`write_export` to standard output (`out`); a write that fails there (a shell redirect
    onto a full disk, a closed pipe) is one CampaignError, and nothing more is written."""
    try:
        n = write_export(rows, what, fmt, out)
        out.flush()
    except OSError as e:
        # What is still buffered would fail again when the interpreter flushes it at exit.
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), out.fileno())
        raise CampaignError(f"writing the export to standard output: {e.strerror or e}; use --out FILE "
                            "on a file system with room") from None
    return n


def check_workdir(workdir: Path) -> Path:
    """The work directory a driver writes run directories into: made if missing; a
    CampaignError naming --workdir if it is a file or cannot be written."""
    import tempfile

    if workdir.exists() and not workdir.is_dir():
        raise CampaignError(f"--workdir {workdir}: is a file, not a directory")
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=workdir):
            pass
    except OSError as e:
        raise CampaignError(f"--workdir {workdir}: cannot write there ({e.strerror or e})") from None
    return workdir


# --- imported references ---------------------------------------------------------------

def reference_targets(name: str, curves: dict[str, list[dict[str, Any]]],
                      run: str | None = None) -> dict[str, list[dict[str, Any]]]:
    """The campaign each run of a reference file (`export.read_curves`) is stored as: NAME
    for one run (or `run`), else NAME-RUN. Every name is checked by the campaign-name rule
    (campaign.names) before anything is stored, since plots use them in file names."""
    from campaign import names

    names.check(name, "NAME")
    targets = {}
    for run_name, runs in curves.items():
        for r in runs:
            names.check_length(r["stage"], names.MAX_LENGTH, "stage (a column of the file)")
        target = name if run is not None or not run_name or len(curves) == 1 else f"{name}-{run_name}"
        targets[names.check(target, f"NAME-RUN (run {run_name!r} of the file)" if target != name else "NAME")] = runs
    return targets


def import_reference(ledger: Ledger, targets: dict[str, list[dict[str, Any]]], *, source: str,
                     replace: bool = False) -> list[str]:
    """Store reference curves as campaigns of site "imported" ({campaign name: runs}, from
    `reference_targets`); one line per campaign made. An existing campaign of that name is
    refused, unless it is an imported one and `replace`."""
    from campaign import names
    from campaign.ledger import reads, writes

    made = []
    with ledger.session() as s:
        for target, runs in targets.items():
            names.check(target, "NAME")
            old = reads.get_campaign(s, target)
            if old is not None:
                if not (replace and old.site == "imported"):
                    raise CampaignError(f"campaign {target!r} exists in {ledger.display_url}; "
                                        + ("pass --replace to import it again" if old.site == "imported"
                                           else "it is not an imported one: choose another NAME"))
                writes.delete_campaign(s, old)
            writes.import_reference(s, target, runs, source=source)
            points = sum(len(r["rows"]) for r in runs)
            made.append(f"{target}: {len(runs)} curve(s), {points} point(s)"
                        + ("" if any(p["tokens"] for r in runs for p in r["rows"]) else
                           " (no tokens: pass --tokens-per-step to plot it against tokens)"))
    return made


# --- nodes -----------------------------------------------------------------------------

def list_exclusions(ledger: Ledger, site: str | None = None, *, show_all: bool = False) -> list[dict[str, Any]]:
    """`campaign nodes list`: excluded nodes (with lifted and expired ones when `show_all`)."""
    from campaign.ledger import reads

    with ledger.session() as s:
        return [{"site": e.site, "node": e.node, "reason": e.reason, "since": e.created, "expires": e.expires,
                 "lifted": e.lifted} for e in reads.list_exclusions(s, site, active=not show_all)]


def exclude_node(ledger: Ledger, node: str, site: str, reason: str, hours: float | None = None) -> None:
    """`campaign nodes exclude`: exclude `node` on `site` (for `hours`, or until lifted)."""
    import datetime as dt

    from campaign.ledger import writes
    from campaign.ledger.models import utcnow

    check_exclusion(node, site)
    with ledger.session() as s:
        expires = utcnow() + dt.timedelta(hours=hours) if hours else None
        writes.exclude_node(s, site=site, node=node, reason=reason, evidence={"by": "user"}, expires=expires)


def check_exclusion(node: str, site: str) -> None:
    """A node and site name that fit the ledger's exclusion columns (no database refuses them)."""
    from campaign import names
    from campaign.ledger.models import Exclusion

    names.check_node(node, "NODE")
    names.check_length(node, Exclusion.__table__.c.node.type.length, "NODE")
    names.check_length(site, Exclusion.__table__.c.site.type.length, "--site")


def include_node(ledger: Ledger, node: str, site: str) -> int:
    """`campaign nodes include`: lift the exclusions of `node` on `site`; how many. Raises
    CampaignError when it was not excluded."""
    from campaign.ledger import writes

    check_exclusion(node, site)
    with ledger.session() as s:
        n = writes.include_node(s, site=site, node=node)
    if n == 0:
        raise CampaignError(f"{node} is not excluded on {site}")
    return n


INJECTED = {"kill": signal.SIGKILL, "hang": signal.SIGSTOP}
"""`campaign inject`: what each fault does to the rank's process group (a hang is a stopped
process: it neither prints nor exits, as a rank stuck in a collective or a dead NFS mount)."""


def inject_fault(ledger: Ledger, name: str, fault: str, rank: int, *, after_step: int = 0, wait_s: float = 600.0,
                 notify: Callable[[str], None] = lambda line: None, poll_s: float = 0.2) -> dict[str, Any]:
    """A drill on any trainer, yours or not: once the running attempt of campaign `name` has
    reported `after_step`, send rank `rank`'s process group SIGKILL (`kill`) or SIGSTOP
    (`hang`). The attempt is the one the ledger marks running, on this host, started by the
    local launcher (one process per rank). Returns what was done; raises CampaignError when
    nothing runs, the rank is not there, or the step is not reached within `wait_s`."""
    from campaign import report
    from campaign.ledger import reads
    from campaign.supervisor import PIDS_FILE

    end = time.monotonic() + wait_s
    while True:
        with ledger.session() as s:
            c = reads.get_campaign(s, name)
            open_ = reads.list_open_attempts(s, c) if c is not None else []
            run_dir = Path(open_[-1].run_dir) if open_ and open_[-1].run_dir else None
        pids = _read_json(run_dir / PIDS_FILE) if run_dir else None
        rows, _ = report.read_metrics(run_dir) if run_dir else ([], 0)
        if pids and (rows and rows[-1]["step"] >= after_step or not after_step):
            break
        if time.monotonic() > end:
            if c is None:
                with ledger.session() as s:
                    reads.require_campaign(s, name, ledger.display_url)  # names the campaigns there are
            raise CampaignError(f"campaign {name!r}: no running attempt reported step {after_step} within {wait_s:g} s"
                                + (f" (last: {run_dir})" if run_dir else ""))
        time.sleep(poll_s)
    assert run_dir is not None and pids is not None
    if pids.get("host") != socket.gethostname():
        raise CampaignError(f"the attempt in {run_dir} runs on {pids.get('host')}; run `campaign inject` there")
    if pids.get("launcher") != "local":
        raise CampaignError(f"the attempt in {run_dir} was started by {pids.get('launcher')}, one process for every "
                            "rank: `campaign inject` targets a rank of the local launcher only")
    pgids = pids.get("pgids") or []
    if not 0 <= rank < len(pgids):
        raise CampaignError(f"rank {rank} is not in the attempt in {run_dir} (ranks 0-{len(pgids) - 1})")
    try:
        os.killpg(pgids[rank], INJECTED[fault])
    except ProcessLookupError:
        raise CampaignError(f"rank {rank} of the attempt in {run_dir} has already exited") from None
    done = {"fault": fault, "rank": rank, "run_dir": str(run_dir), "step": rows[-1]["step"] if rows else None,
            "signal": INJECTED[fault].name}
    notify(f"{fault}: sent {done['signal']} to rank {rank} (process group {pgids[rank]}) of {run_dir} at step "
           f"{done['step'] if done['step'] is not None else 'none yet'}")
    return done


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
