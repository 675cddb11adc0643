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
from typing import TYPE_CHECKING, Any, NamedTuple

from campaign.errors import CampaignError
from campaign.exits import ExitClass

if TYPE_CHECKING:
    from campaign.ledger import Ledger

PLOT_KINDS = ("run", "progress", "scaling", "steps", "goodput")
"""`campaign plot --kind`: run (the default) is the campaign's chart: loss against cumulative
tokens of its long run (or --stage) across attempts, each relaunch marked with its cause."""
EXPORT_KINDS = ("steps", "attempts", "nodes")
PAGE_ROWS = 20_000
"""Rows in one page of `ledger export --what steps` (a page is one ledger session)."""
PAGE_BYTES = 2 * 2**20
"""A page is also cut at about this much JSON (the remote service limits results)."""


def open_at(db_url: str | None, workdir: Path, *, create: bool = True) -> Ledger:
    """The ledger at `db_url`, else the default one in `workdir`."""
    from campaign.ledger import default_url, open_ledger

    return open_ledger(db_url or default_url(workdir), create=create)


class Planned(NamedTuple):
    """What a `submit` of a spec would run as: its `version`; `unread`, why the ledger could
    not be read (then version 1 is assumed); `recorded`, the campaign's folder as the ledger
    records it (None for a campaign it does not know), where a submit continues (`Engine._work_in`)."""

    version: int
    unread: str | None
    recorded: Path | None


def planned_version(db_url: str | None, workdir: Path, spec: Any, *, new_version: bool) -> Planned:
    """The campaign version a `submit` of `spec` would run as (what the dry run shows as run
    directories): 1 for a campaign the ledger does not know, its version for the same file,
    the next one for a changed file with `--new-version`; and the folder the ledger records
    for it. Reads the ledger, never creates or changes it."""
    from campaign.errors import NoLedger
    from campaign.ledger import reads
    from campaign.spec import reread_digest

    try:
        ledger = open_at(db_url, workdir, create=False)
    except NoLedger:
        return Planned(1, None, None)
    except CampaignError as e:
        return Planned(1, str(e), None)
    try:
        with ledger.session() as s:
            c = reads.get_campaign(s, spec.name)
            if c is None:
                return Planned(1, None, None)
            digest = spec.digest()
            changed = c.spec_digest != digest and reread_digest(c.spec_source, spec.name) != digest
            return Planned(int(c.version) + (1 if changed and new_version else 0), None,
                           Path(c.workdir) if c.workdir else None)
    finally:
        ledger.close()


def upgrade_schema(url: str) -> str:
    """`campaign db upgrade`: migrate the ledger at `url` to this release's schema (made if
    new), under the schema lock; its revision afterwards."""
    from campaign.ledger import schema
    from campaign.ledger.db import create_schema, explained, make_engine, revision, schema_lock

    engine = make_engine(url)
    try:
        with explained(engine):
            with schema_lock(engine):  # not while a driver creates it
                if revision(engine)[1]:  # an empty database: created in one transaction, as a submit does
                    create_schema(engine)
                else:
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
            return [_truthful(reads.summarize_campaign_row(s, c), summary.driver_info(s, c))
                    for c in reads.list_campaigns(s)]
        detail = summary.describe_campaign(s, reads.require_campaign(s, name, ledger.display_url))
        return _truthful(detail, detail["driver"])


DRIVER_GONE = "driver_gone"
"""The state status shows for a campaign the ledger says is running whose driver is gone."""


def _truthful(row: dict[str, Any], driver: dict[str, Any]) -> dict[str, Any]:
    """A campaign whose driver is gone is not `running`: its state reads DRIVER_GONE (and
    `driver` says which process it was), so a watch ends and a script sees it."""
    if row["state"] == "running" and driver["state"] == "gone":
        row = {**row, "state": DRIVER_GONE, "driver": driver}
    return row


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
    until it released its lease; returns the campaign's state then. A driver that is gone
    (its process, or a lease on another host not renewed within its ttl) cannot be asked: the
    launch it left is stopped here as `campaign resume` would (`cancel_without_driver`). `notify`
    hears progress lines. Raises CampaignError when no driver ran, a live one runs elsewhere,
    or it did not stop within `wait_s`."""
    from campaign.lease import is_live
    from campaign.ledger import reads
    from campaign.ledger.models import db_utcnow

    with ledger.session() as s:
        c = reads.require_campaign(s, name, ledger.display_url)
        lease = reads.get_lease(s, c)
        holder = (lease.host, lease.pid) if lease else None
        live = lease is not None and is_live(lease, db_utcnow(s))
        left_open = bool(reads.list_open_attempts(s, c))
    if holder is None and not left_open:
        raise CampaignError(f"campaign {name!r} is not running (no driver holds it); its state is in `campaign status {name}`")
    if holder is None or not live:
        return cancel_without_driver(ledger, name, notify=notify)
    host, pid = holder
    if host != socket.gethostname():
        raise CampaignError(f"campaign {name!r} is driven from {host} (pid {pid}); run `campaign cancel` there, "
                            "or through its Globus Compute endpoint with --endpoint")
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:  # gone since the look
        return cancel_without_driver(ledger, name, notify=notify)
    notify(f"asked the driver of {name} (pid {pid}) to stop")
    end = time.monotonic() + wait_s
    while time.monotonic() < end:
        with ledger.session() as s:
            c = reads.get_campaign(s, name)
            if c is not None and reads.get_lease(s, c) is None:
                # Read the state again, after the lease: on SQLite each SELECT is its own snapshot
                # (pysqlite begins no transaction for reads), so the row read first may predate
                # the driver's last commit, which records its state and drops its lease together.
                s.refresh(c)
                return c.state
        time.sleep(poll_s)
    raise CampaignError(f"the driver of {name!r} did not stop within {wait_s:g} s; it may be waiting for its launch to exit")


def cancel_without_driver(ledger: Ledger, name: str, *, notify: Callable[[str], None] = lambda line: None) -> str:
    """Cancel campaign `name` whose driver is gone: take its lease over (a live driver is
    refused, naming it), stop what the dead driver left (its Parsl processes, every open
    attempt's launch, which `recovery.stop_orphan` sees gone before it returns), take in what
    those attempts wrote, and record them, the stage that ran and the campaign `cancelled`.
    `campaign resume` continues it later from its newest complete checkpoint."""
    from campaign import spec as spec_mod
    from campaign.lease import DriverLease
    from campaign.ledger import reads, writes
    from campaign.ledger.models import Campaign
    from campaign.recovery import reap_dead_driver, recover_orphans

    with ledger.session() as s:
        c = reads.require_campaign(s, name, ledger.display_url)
        campaign_id, source, workdir = c.id, c.spec_source, c.workdir
        running = [r.id for r in reads.current_stage_runs(s, c) if r.state == "running"]
    spec = spec_mod.loads(source, f"{name} (spec kept in the ledger)")
    lease = DriverLease(ledger, campaign_id)
    lease.acquire()
    try:
        notify(f"the driver of {name} is gone: stopping what it left running, as `campaign resume {name}` would")
        if workdir and Path(workdir).parent.is_dir():
            Path(workdir).mkdir(exist_ok=True)  # deleted: its attempts' STOP files go there (recovery.stop_orphan)
            reaped = reap_dead_driver(Path(workdir))
            if reaped:
                notify(f"stopped {reaped} Parsl process(es) the dead driver left running")
        recover_orphans(ledger, campaign_id, spec.site, notify, state=ExitClass.CANCELLED,
                        why="was stopped by `campaign cancel` (its driver had died)")
        for unit in ledger.retrying("recording the campaign cancelled", warn=notify):
            with unit as s:
                c = s.get(Campaign, campaign_id)
                assert c is not None
                for r in reads.current_stage_runs(s, c):
                    if r.id in running or r.state == "running":
                        writes.set_stage_state(s, r, "failed", verdict="cancelled by the user (its driver had died)")
                writes.set_campaign_state(s, c, "cancelled", "cancelled by `campaign cancel`; its driver had died")
                state = c.state
    finally:
        lease.release()
    return state


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
        if kind == "run":
            out["runs"] = [run_series(s, c, stage, max_points) for c in found]
            return out
        columns = ("loss", "step_time_s") if kind == "steps" else ("loss",)
        out["series"] = [reads.sample_campaign_steps(s, c, max_points=max_points, columns=columns,
                                                     stage=stage or (reads.busiest_stage(s, c) if kind == "steps" else None))
                         for c in found]
        return out


# --- report ----------------------------------------------------------------------------

def report_data(ledger: Ledger, name: str, *, max_points: int = 2000, events: int = 200) -> dict[str, Any]:
    """What `campaign report NAME --html` shows (JSON-ready; the ledger only): `detail`
    (status NAME --json's shape with the newest `events` news), `faults` (every attempt
    that did not succeed, with its evidence), `exclusions` (the site's, with evidence),
    `progress` and `steps` (series downsampled in SQL), `generated`, `ledger`."""
    import datetime as dt

    from campaign import summary
    from campaign.ledger import reads

    with ledger.session() as s:
        c = reads.require_campaign(s, name, ledger.display_url)
        pairs = reads.list_attempts(s, c)
        numbers = {a.id: f"{run.name} #{a.number}" for run, a in pairs}
        busiest = reads.busiest_stage(s, c)
        return {
            "detail": summary.describe_campaign(s, c, events=events),
            "faults": [reads.describe_fault(run, a) for run, a in pairs
                       if a.state not in (ExitClass.SUCCEEDED, "running")],
            "exclusions": [{"node": x.node, "reason": x.reason, "since": reads.iso_time(x.created),
                            "expires": reads.iso_time(x.expires), "attempt": numbers.get(x.attempt_id),
                            "evidence": reads.jsonable(x.evidence or {})}
                           for x in reads.list_exclusions(s, c.site)],
            "progress": reads.sample_campaign_steps(s, c, max_points=max_points),
            "steps": reads.sample_campaign_steps(s, c, max_points=max_points, columns=("loss", "step_time_s"),
                                                 stage=busiest) if busiest else [],
            "generated": dt.datetime.now(dt.timezone.utc).replace(tzinfo=None).isoformat(timespec="seconds"),
            "ledger": ledger.display_url,
        }


def run_series(s: Any, c: Any, stage: str | None, max_points: int) -> dict[str, Any]:
    """One campaign's chart data: the stage (`stage`, else its first long run, else the stage
    with the most steps), its attempts' series (cumulative tokens), and each relaunch: the
    attempt it followed, its cause, steps lost, whether a rescue saved the last step and the
    nodes excluded for it (from the `relaunch` and `node_excluded` events)."""
    from campaign.ledger import reads

    runs = reads.current_stage_runs(s, c)
    run = next((r for r in runs if r.name == stage), None) if stage else \
        next((r for r in runs if r.kind == "long_run"), None)
    if stage and run is None:
        raise CampaignError(f"--stage {stage}: campaign {c.name!r} has the stages {', '.join(r.name for r in runs)}")
    name = run.name if run is not None else reads.busiest_stage(s, c)
    series = reads.sample_campaign_steps(s, c, stage=name, max_points=max_points) if name else []
    relaunches = []
    excluded: dict[int, list[str]] = {}
    if name:
        run = next(r for r in runs if r.name == name)
        for e in reads.list_stage_events(s, run, ("node_excluded", "relaunch")):
            if e.kind == "node_excluded" and e.attempt_id is not None:
                excluded.setdefault(e.attempt_id, []).append(str((e.data or {}).get("node") or "?"))
            elif e.kind == "relaunch":
                relaunches.append({**(e.data or {}), "attempt_id": e.attempt_id, "message": e.message})
        numbers = {a.id: a.number for _, a in reads.list_attempts(s, c)}
        for r in relaunches:
            r["after"] = numbers.get(r["attempt_id"])
            r["excluded"] = r.get("excluded") or excluded.get(r["attempt_id"], [])
    return {"campaign": c.name, "stage": name, "series": series, "relaunches": relaunches}


def check_plot_names(patterns: Sequence[str]) -> None:
    """NAME arguments of `plot`: campaign names, wildcards allowed, never a path."""
    from campaign import names

    for p in patterns:
        names.check_pattern(p, "NAME")


STAGE_PLOT_KINDS = ("run", "steps", "progress")
"""The kinds of `campaign plot` that draw one stage when --stage names it."""


def plot_path(names: Sequence[str], kind: str, out_dir: Path, stage: str | None = None) -> Path:
    """The PNG file a plot of campaigns `names` goes to, inside `out_dir`:
    `NAME-KIND.png`, or `NAME-STAGE-KIND.png` when --stage chose the stage (so that a chart
    of another stage never overwrites the default one). Each name is checked again (a
    ledger written by an older release may hold any name), the stage too."""
    from campaign import names as rule

    for n in names:
        rule.check(n, "campaign name in the ledger")
    stem = "+".join(names) if len(names) <= 3 else f"{names[0]}+{len(names) - 1}-more"
    if stage and kind in STAGE_PLOT_KINDS:
        stem = f"{stem}-{rule.check(stage, '--stage')}"
    return out_dir / f"{stem}-{kind}.png"


def draw_plot(data: dict[str, Any], kind: str, out_dir: Path, *, reference_file: Path | None = None,
              log_x: bool = False, stage: str | None = None) -> Path:
    """Draw `plot_data`'s answer (local or from an endpoint) as a PNG in `out_dir`; its path
    (`plot_path`: the stage is in its name when `stage`, --stage, chose it)."""
    from campaign import export, plots

    found = data["names"]
    if kind == "run":
        fig = plots.run_figure(data["runs"], log_x=log_x)
    elif kind == "goodput":
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
    return plots.save(fig, plot_path(found, kind, out_dir, stage))


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


def export_tensorboard(ledger: Ledger, name: str, out: Path) -> tuple[int, int]:
    """`ledger export NAME --format tensorboard --out DIR`: the current version's steps and
    events as the driver writes them live (`campaign.observe.tensorboard`, the same files
    under DIR/NAME); returns (steps, events) written. Needs the `tensorboard` extra."""
    from itertools import groupby

    from campaign.ledger import reads

    try:
        from campaign.observe.tensorboard import TensorBoard
    except ImportError:
        raise CampaignError("--format tensorboard needs the `tensorboard` package: "
                            "pip install 'campaign[tensorboard]'") from None
    with ledger.session() as s:
        c = reads.find_campaigns(s, (name,), ledger.display_url)[0]
        board, steps = TensorBoard(out / c.name), 0
        try:
            for (stage, attempt), rows in groupby(reads.iter_campaign_steps(s, c), lambda r: (r["stage"], r["attempt"])):
                batch = [{**r, "tokens": r["attempt_tokens"]} for r in rows]  # as the trainer wrote it (live: the same)
                board.steps(stage, attempt, batch, version=c.version)
                steps += len(batch)
            records = [r for r in reads.list_event_records(s, c) if r["version"] == c.version]
            board.events(records)
        finally:
            board.close()
    return steps, len(records)


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
        scope = {c.id: c.name for c in reads.list_campaigns(s)}
        return [{"site": e.site, "node": e.node, "reason": e.reason, "since": e.created, "expires": e.expires,
                 "lifted": e.lifted, "campaign": scope.get(e.campaign_id) if e.campaign_id else None}
                for e in reads.list_exclusions(s, site, active=not show_all)]


def exclude_node(ledger: Ledger, node: str, site: str, reason: str, hours: float | None = None) -> None:
    """`campaign nodes exclude`: exclude `node` on `site` (for `hours`, or until lifted)."""
    import datetime as dt

    from campaign.ledger import writes
    from campaign.ledger.models import utcnow

    check_exclusion(node, site)
    with ledger.session() as s:
        expires = utcnow() + dt.timedelta(hours=hours) if hours else None
        writes.exclude_node(s, site=site, node=node, reason=reason, evidence={"by": "user"}, expires=expires)


def default_site(ledger: Ledger) -> str:
    """The site `nodes exclude/include` mean without --site: the one site the ledger knows
    (its campaigns' and exclusions'; imported runs have none). Raises CampaignError naming
    the sites when there are several, or none."""
    import sqlalchemy as sa

    from campaign.ledger.models import Campaign, Exclusion

    with ledger.session() as s:
        sites = sorted({*s.scalars(sa.select(Campaign.site).where(Campaign.site != "imported")),
                        *s.scalars(sa.select(Exclusion.site))})
    if len(sites) != 1:
        raise CampaignError("--site: " + (f"the ledger knows the sites {', '.join(sites)}: name one" if sites else
                                          f"the ledger {ledger.display_url} knows no site yet: name one (e.g. local)"))
    return sites[0]


def default_reason() -> str:
    """The reason recorded for `nodes exclude` without --reason: who did it."""
    import getpass

    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry and no USER (a container): say so, do not fail
        user = f"uid {os.getuid()}"
    return f"excluded by {user}"


def check_exclusion(node: str, site: str | None) -> None:
    """A node and site name that fit the ledger's exclusion columns (no database refuses them);
    `site` None: not given (the ledger's one site is used, which fits)."""
    from campaign import names
    from campaign.ledger.models import Exclusion

    names.check_node(node, "NODE")
    names.check_length(node, Exclusion.__table__.c.node.type.length, "NODE")
    if site is not None:
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
                 attempt: str = "current", stage: str | None = None,
                 notify: Callable[[str], None] = lambda line: None, poll_s: float = 0.2) -> dict[str, Any]:
    """A drill on any trainer, yours or not: once an attempt of campaign `name` has reported
    `after_step`, send rank `rank`'s process group SIGKILL (`kill`) or SIGSTOP (`hang`).

    `attempt`: "current", the attempt running now (refused at once when the campaign is not
    running: nothing would ever come), or "next", the first attempt that starts after this
    call (waits for the campaign to start, as after `make demo`'s submit). `stage`: only an
    attempt of that stage. The attempt runs on this host, started by the local launcher (one
    process per rank). Before the signal, the run directory gets `injected.json`, so the
    driver knows the fault was a drill (an exclusion it causes binds this campaign only).
    Returns what was done; raises CampaignError when nothing runs, the campaign ends first,
    the rank is not there, or the step is not reached within `wait_s`."""
    from campaign import rundir, runfiles
    from campaign.lease import is_live
    from campaign.ledger import reads
    from campaign.ledger.models import db_utcnow
    from campaign.rundir import PIDS_FILE

    if attempt not in ("current", "next"):
        raise CampaignError(f"--attempt {attempt}: give current or next")
    end = time.monotonic() + wait_s
    after_id: int | None = None  # "next": attempts with a larger id than any there was at the start
    seen_running = False
    while True:
        with ledger.session() as s:
            c = reads.get_campaign(s, name)
            if c is None and attempt == "current":
                reads.require_campaign(s, name, ledger.display_url)  # names the campaigns there are
            if after_id is None:
                after_id = (max((a.id for _, a in reads.list_attempts(s, c)), default=0) if c is not None else 0) \
                    if attempt == "next" else 0
            lease = reads.get_lease(s, c) if c is not None else None
            running = c is not None and c.state == "running" and lease is not None and is_live(lease, db_utcnow(s))
            open_ = [a for a in (reads.list_open_attempts(s, c) if c is not None else [])
                     if a.id > after_id and (stage is None or a.stage_run.name == stage)]
            run_dir = Path(open_[-1].run_dir) if open_ and open_[-1].run_dir else None
            state = c.state if c is not None else None
        if not running and (attempt == "current" or seen_running):
            why = "has ended" if seen_running else f"is not running (state {state})"
            raise CampaignError(f"campaign {name!r} {why}: no attempt to inject into"
                                + ("" if seen_running else f"; to aim at its next run: `campaign inject {name} {fault} "
                                   f"--attempt next`, then `campaign resume {name}` or `campaign submit FILE`"))
        seen_running = seen_running or running
        pids = rundir.read_json(run_dir / PIDS_FILE) if run_dir else None
        rows, _ = runfiles.read_metrics(run_dir) if run_dir else ([], 0)
        if pids and (rows and rows[-1]["step"] >= after_step or not after_step):
            break
        if time.monotonic() > end:
            raise CampaignError(f"campaign {name!r}: no {'new ' if attempt == 'next' else ''}attempt"
                                f"{' of stage ' + stage if stage else ''} reported step {after_step} within {wait_s:g} s"
                                + (f" (last: {run_dir})" if run_dir else ""))
        time.sleep(poll_s)
    return _send_fault(run_dir, pids, fault, rank, rows[-1]["step"] if rows else None, notify)


def _send_fault(run_dir: Path, pids: dict[str, Any], fault: str, rank: int, step: int | None,
                notify: Callable[[str], None]) -> dict[str, Any]:
    """Mark the run directory as drilled (`injected.json`), then signal the rank's process group."""
    from campaign import report, rundir

    if pids.get("host") != socket.gethostname():
        raise CampaignError(f"the attempt in {run_dir} runs on {pids.get('host')}; run `campaign inject` there")
    if pids.get("launcher") != "local":
        raise CampaignError(f"the attempt in {run_dir} was started by {pids.get('launcher')}, one process for every "
                            "rank: `campaign inject` targets a rank of the local launcher only")
    pgids = list(pids.get("pgids") or [])
    if not 0 <= rank < len(pgids):
        raise CampaignError(f"rank {rank} is not in the attempt in {run_dir} (ranks 0-{len(pgids) - 1})")
    try:  # a warm-start server forked the rank: its own process group, not the client's the launcher started
        pgids[rank] = int(rundir.rank_pid_file(run_dir, rank).read_text())
    except (OSError, ValueError):
        pass
    done = {"fault": fault, "rank": rank, "run_dir": str(run_dir), "step": step, "signal": INJECTED[fault].name,
            "time": time.time()}
    marker = run_dir / rundir.INJECTED_FILE
    report.write_json_atomic(marker, done)
    try:
        os.killpg(pgids[rank], INJECTED[fault])
    except ProcessLookupError:
        marker.unlink(missing_ok=True)
        raise CampaignError(f"rank {rank} of the attempt in {run_dir} has already exited; aim at the relaunch with "
                            "`--attempt next`") from None
    notify(f"{fault}: sent {done['signal']} to rank {rank} (process group {pgids[rank]}) of {run_dir} at step "
           f"{step if step is not None else 'none yet'}")
    return done



# --- logs ------------------------------------------------------------------------------

def log_target(ledger: Ledger, name: str, *, stage: str | None = None, attempt: int | None = None,
               rank: int = 0) -> dict[str, Any]:
    """Which log `campaign logs` shows: rank `rank`'s of attempt `attempt` of `stage`; by
    default the running attempt (the newest one when none runs). {"stage", "number", "state",
    "run_dir", "path", "running"}; raises CampaignError naming what there is."""
    from campaign import rundir
    from campaign.ledger import reads

    with ledger.session() as s:
        c = reads.require_campaign(s, name, ledger.display_url)
        pairs = [(r, a) for r, a in reads.list_attempts(s, c) if stage is None or r.name == stage]
        if not pairs:
            known = ", ".join(dict.fromkeys(r.name for r, _ in reads.list_attempts(s, c))) or "none yet"
            raise CampaignError(f"campaign {name!r} has no attempt" + (f" of stage {stage!r}" if stage else "")
                                + f" (stages with attempts: {known})")
        if attempt is not None:
            in_stage = [(r, a) for r, a in pairs if r.name == (stage or pairs[-1][0].name)]
            found = [(r, a) for r, a in in_stage if a.number == attempt]
            if not found:
                raise CampaignError(f"--attempt {attempt}: stage {in_stage[-1][0].name} of {name!r} has attempts "
                                    f"1-{max(a.number for _, a in in_stage)}")
            run, a = found[0]
        else:
            running = [(r, a) for r, a in pairs if a.state == "running"]
            run, a = (running or pairs)[-1]
        run_dir = Path(a.run_dir) if a.run_dir else None
        out = {"stage": run.name, "number": a.number, "state": a.state, "run_dir": str(run_dir) if run_dir else None,
               "running": a.state == "running", "attempt_id": a.id}
    if run_dir is None:
        raise CampaignError(f"attempt {out['number']} of {out['stage']} has no run directory (an imported run?)")
    own = rundir.rank_log(run_dir, rank)
    out["path"] = str(own if own.exists() or not rundir.launcher_log(run_dir).exists() else rundir.launcher_log(run_dir))
    return out


def follow_log(ledger: Ledger, name: str, write: Callable[[str], None], *, stage: str | None = None,
               attempt: int | None = None, rank: int = 0, follow: bool = False, poll_s: float = 0.5,
               sleep: Callable[[float], None] = time.sleep) -> dict[str, Any]:
    """Write the log `log_target` picks to `write`; with `follow`, go on as it grows until
    its attempt ends, and (no `attempt` given) on to the campaign's next attempt while the
    campaign runs, each announced with a `==> stage #N rank R: PATH <==` line."""
    from campaign.ledger import reads
    from campaign.ledger.models import Attempt

    target = log_target(ledger, name, stage=stage, attempt=attempt, rank=rank)
    while True:
        path = Path(target["path"])
        if follow:
            write(f"==> {target['stage']} #{target['number']} rank {rank}: {path} <==\n")
        offset = _copy_from(path, 0, write)
        if not follow:
            if not path.exists():
                raise CampaignError(f"no log at {path} (attempt {target['number']} of {target['stage']}: "
                                    f"{target['state']}); its run directory: {target['run_dir']}")
            return target
        while True:  # until the attempt is over and its log read to the end
            with ledger.session() as s:
                a = s.get(Attempt, target["attempt_id"])
                done, state = a is None or a.state != "running", a.state if a is not None else "gone"
            offset = _copy_from(path, offset, write)
            if done:
                break
            sleep(poll_s)
        write(f"==> attempt {target['number']} of {target['stage']} ended: {state} <==\n")
        if attempt is not None:
            return target
        while True:  # the next attempt of the campaign (of `stage`), while the campaign runs
            if live_driver(ledger, name) is None:
                return target
            with ledger.session() as s:
                c = reads.get_campaign(s, name)
                nxt = c is not None and any(a.id > target["attempt_id"] and (stage is None or r.name == stage)
                                            for r, a in reads.list_attempts(s, c))
            if nxt:
                break
            sleep(poll_s)
        target = log_target(ledger, name, stage=stage, rank=rank)


def _copy_from(path: Path, offset: int, write: Callable[[str], None]) -> int:
    """Write what `path` holds past `offset` (nothing if it is not there yet); the new offset."""
    try:
        with path.open("rb") as f:
            f.seek(offset)
            data = f.read()
    except OSError:
        return offset
    if data:
        write(data.decode("utf-8", "replace"))
    return offset + len(data)


# --- forget ----------------------------------------------------------------------------

def campaign_exists(ledger: Ledger, name: str) -> bool:
    from campaign.ledger import reads

    with ledger.session() as s:
        return reads.get_campaign(s, name) is not None


def forget_plan(ledger: Ledger, name: str) -> dict[str, Any]:
    """What `campaign forget NAME` would remove: {"name", "attempts", "steps", "run_dir"
    (None when it is not a directory of that name), "exclusions" (its own: a drill's)}.
    Raises CampaignError while a driver runs it."""
    import sqlalchemy as sa

    from campaign.ledger import reads
    from campaign.ledger.models import Exclusion

    with ledger.session() as s:
        c = reads.require_campaign(s, name, ledger.display_url)
        pairs = reads.list_attempts(s, c)
        own = s.scalar(sa.select(sa.func.count()).select_from(Exclusion).where(Exclusion.campaign_id == c.id))
        workdir = Path(c.workdir) if c.workdir else None
    driver = live_driver(ledger, name)
    if driver is not None:
        raise CampaignError(f"campaign {name!r} is running (driver pid {driver['pid']} on {driver['host']}): "
                            f"`campaign cancel {name}` first")
    run_dir = workdir if workdir is not None and workdir.name == name and workdir.is_dir() \
        and not workdir.is_symlink() else None
    return {"name": name, "attempts": len(pairs), "steps": sum((a.last_step or 0) for _, a in pairs),
            "run_dir": str(run_dir) if run_dir else None, "exclusions": int(own or 0)}


def forget_campaign(ledger: Ledger, name: str) -> dict[str, Any]:
    """`campaign forget NAME`: delete the campaign's rows (stages, attempts, steps, events, its
    own exclusions: the database cascades) and then its run directories; what was removed.
    The rows go first: a run directory left by a failure is only files, never a campaign
    the ledger half-knows."""
    import shutil

    from campaign import names
    from campaign.ledger import reads, writes

    names.check(name, "NAME")
    plan = forget_plan(ledger, name)
    with ledger.session() as s:
        c = reads.require_campaign(s, name, ledger.display_url)
        writes.delete_campaign(s, c)
    if plan["run_dir"]:
        try:
            shutil.rmtree(plan["run_dir"])
        except OSError as e:
            raise CampaignError(f"the ledger forgot {name!r}, but its run directory {plan['run_dir']} could not be "
                                f"removed ({e.strerror or e}); remove it by hand") from None
    return plan


def completion_names(db_url: str | None, workdir: Path, campaign: str | None = None) -> list[str]:
    """For shell completion: the ledger's campaign names, or the stage names of `campaign`.
    Never raises (no ledger, a bad URL: nothing to offer)."""
    from campaign.ledger import reads

    try:
        ledger = open_at(db_url, workdir, create=False)
    except Exception:  # completion must never print a traceback into the user's shell
        return []
    try:
        with ledger.session() as s:
            if campaign is None:
                return sorted(c.name for c in reads.list_campaigns(s))
            c = reads.get_campaign(s, campaign)
            return [r.name for r in reads.current_stage_runs(s, c)] if c is not None else []
    except Exception:
        return []
    finally:
        ledger.close()
