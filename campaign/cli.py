"""The `campaign` command line.

    campaign submit examples/local.yaml        run a campaign (stages in order), recorded in the ledger
    campaign status [NAME] [--json]            what the ledger says (no Parsl, no torch: instant)
    campaign status NAME --watch               refresh until the campaign stops running
    campaign plot NAME... --kind progress      loss vs tokens (or scaling, steps) as PNG
    campaign ledger export|import-reference    steps/attempts/nodes as CSV/JSON; reference curves in
    campaign resume NAME                       continue after the driver died, from the ledger alone
    campaign cancel NAME                       stop a running campaign cleanly
    campaign validate FILE                     check a campaign file; print the resolved spec or the errors
    campaign db upgrade|current                manage the ledger's schema
    campaign nodes list|exclude|include        the nodes the ledger tells every campaign not to use

    --endpoint UUID on submit, status, plot, ledger export and cancel runs them through a Globus
    Compute endpoint on the machine's login node (campaign.remote; docs/remote.md).

Exit codes: 0 success, 1 a stage failed, 2 bad input or usage.
This module imports neither torch nor parsl (a test holds that); commands import what
they need when they run.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from campaign.errors import CampaignError

F = TypeVar("F", bound=Callable[..., Any])

DB_HELP = "Ledger URL (default: SQLite at WORKDIR/ledger.db). Postgres: postgresql://user@host/db."
WORKDIR_HELP = "Work directory: run directories of every campaign and the default ledger."


def _db_options(f: F) -> F:
    f = click.option("--db", "db_url", envvar="CAMPAIGN_DB_URL", metavar="URL", help=DB_HELP)(f)
    f = click.option("--workdir", envvar="CAMPAIGN_WORKDIR", default="campaigns", show_default=True,
                     type=click.Path(file_okay=False, path_type=Path), help=WORKDIR_HELP)(f)
    return f


def _endpoint_option(f: F) -> F:
    """--endpoint UUID: run the command's ledger side on a Globus Compute endpoint (campaign.remote)."""
    return click.option("--endpoint", "endpoint", envvar="CAMPAIGN_ENDPOINT", metavar="UUID",
                        help="Globus Compute endpoint on the machine's login node: the command runs there "
                             "(--workdir/--db name paths on that host). See docs/remote.md.")(f)


def _errors(f: F) -> F:
    """Print a CampaignError as one clear message on stderr and exit with its code."""

    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return f(*args, **kwargs)
        except CampaignError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(e.exit_code)

    return wrapper  # type: ignore[return-value]


def _open(db_url: str | None, workdir: Path, *, create: bool = True) -> Any:
    from campaign.ledger import default_url, open_ledger

    return open_ledger(db_url or default_url(workdir), create=create)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="campaign")
def main() -> None:
    """Run multi-stage LLM training campaigns on HPC machines, with a ledger of record.

    A campaign is one YAML file: a model, a site (local, aurora, polaris, slurm) and stages
    that must pass in order (smoke, loss_check, scaling, long_run, resume_test). A stalled or
    crashed run is detected, its bad node excluded, and the run relaunched from its last
    complete checkpoint. Start with `campaign submit examples/local.yaml`, then `campaign
    status local-demo`; `campaign validate FILE` lists every field a file may set.

    Exit codes: 0 success, 1 a stage failed, 2 bad input or usage, 130 cancelled.
    """


@main.command()
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@_db_options
@click.option("--dry-run", is_flag=True, help="Print what each stage would launch; submit and record nothing.")
@click.option("--json", "as_json", is_flag=True,
              help="With --dry-run: a JSON document instead of text (each stage's launch command, environment, "
                   "and the first node's placement: CPUs, visible devices and device per local rank).")
@click.option("--new-version", is_flag=True, help="The file changed: record it as a new version of the campaign.")
@click.option("--quiet", "-q", is_flag=True, help="Print only errors and the final table.")
@_endpoint_option
@_errors
def submit(file: Path, db_url: str | None, workdir: Path, dry_run: bool, as_json: bool, new_version: bool, quiet: bool,
           endpoint: str | None) -> None:
    """Run the campaign in FILE: its stages in order, skipping those already passed.

    The same file again continues the same campaign; a changed file under the same name is
    refused unless --new-version. Exit code 0 if every stage passed, 1 if one failed, 2 for bad
    input, 130 if cancelled (`campaign cancel` or Ctrl-C).
    """
    from campaign import spec as spec_mod

    if as_json and not dry_run:
        raise click.UsageError("--json goes with --dry-run (a submission prints its progress as it runs)")
    spec = spec_mod.load(file)
    spec_mod.check_faults_allowed(spec, str(file))
    from campaign import walltime

    for line in walltime.warnings(spec):  # before anything is submitted
        click.echo(f"warning: {line}", err=True)
    if dry_run:
        from campaign import dryrun

        if as_json:
            click.echo(json.dumps(dryrun.dry_run_document(spec, workdir), indent=2))
        else:
            click.echo(dryrun.render_dry_run(spec, workdir))
        return
    if endpoint:  # a detached driver on the endpoint's host; this returns at once
        from campaign import remote

        sys.exit(remote.submit_command(endpoint, file, workdir, db_url, new_version))
    from campaign.engine import Engine
    from campaign.progress import Progress

    ledger = _open(db_url, workdir)
    try:
        engine = Engine(spec, ledger, workdir=workdir, progress=Progress(quiet=quiet), spec_dir=file.parent)
        code = engine.submit(file.read_text(), new_version=new_version)
    finally:
        ledger.close()
    sys.exit(code)


@main.command()
@click.argument("name")
@_db_options
@click.option("--quiet", "-q", is_flag=True, help="Print only errors and the final summary.")
@_errors
def resume(name: str, db_url: str | None, workdir: Path, quiet: bool) -> None:
    """Continue campaign NAME after its driver died (or was cancelled), from the ledger alone.

    Attempts the dead driver left open are marked `orphaned` and their jobs stopped; stages
    already passed are not rerun; the long run continues from its last complete checkpoint.
    Refused while another driver holds the campaign's lease.
    """
    from campaign import spec as spec_mod
    from campaign.engine import Engine
    from campaign.ledger import queries as q
    from campaign.progress import Progress

    ledger = _open(db_url, workdir, create=False)
    try:
        with ledger.session() as s:
            c = q.require_campaign(s, name, ledger.display_url)
            source, spec_dir = c.spec_source, c.spec_dir
        spec = spec_mod.loads(source, f"{name} (spec kept in the ledger)")
        engine = Engine(spec, ledger, workdir=workdir, progress=Progress(quiet=quiet),
                        spec_dir=Path(spec_dir) if spec_dir else None)
        code = engine.submit(source)
    finally:
        ledger.close()
    sys.exit(code)


@main.command()
@click.argument("name")
@_db_options
@click.option("--wait", "wait_s", type=float, default=60.0, show_default=True,
              help="Seconds to wait for the driver to stop its job and record `cancelled`.")
@_endpoint_option
@_errors
def cancel(name: str, db_url: str | None, workdir: Path, wait_s: float, endpoint: str | None) -> None:
    """Stop a running campaign cleanly: its driver stops the running job, cancels its
    scheduler jobs through the provider, and records the campaign as `cancelled`."""
    import os
    import signal
    import socket
    import time

    from campaign.ledger import queries as q

    if endpoint:  # the same cancel, run on the endpoint's host (where the driver runs)
        from campaign import remote

        return remote.cancel_command(endpoint, name, workdir, db_url, wait_s)
    ledger = _open(db_url, workdir, create=False)
    try:
        with ledger.session() as s:
            c = q.require_campaign(s, name, ledger.display_url)
            lease = q.get_lease(s, c)
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
        click.echo(f"asked the driver of {name} (pid {pid}) to stop")
        end = time.monotonic() + wait_s
        while time.monotonic() < end:
            with ledger.session() as s:
                c = q.get_campaign(s, name)
                if c is not None and q.get_lease(s, c) is None:
                    click.echo(f"{name}: {c.state}")
                    return
            time.sleep(0.5)
    finally:
        ledger.close()
    raise CampaignError(f"the driver of {name!r} did not stop within {wait_s:g} s; it may be waiting for its job to exit")


@main.command()
@click.argument("name", required=False)
@_db_options
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (a fixed shape scripts can rely on).")
@click.option("--watch", is_flag=True, help="Refresh until the campaign is no longer running (Ctrl-C stops).")
@click.option("--interval", type=click.FloatRange(min=0.1), default=2.0, show_default=True, metavar="S",
              help="Seconds between refreshes with --watch.")
@click.option("--count", type=click.IntRange(min=1), metavar="N", help="With --watch: stop after N refreshes.")
@_endpoint_option
@_errors
def status(name: str | None, db_url: str | None, workdir: Path, as_json: bool, watch: bool, interval: float,
           count: int | None, endpoint: str | None) -> None:
    """Show the campaigns in the ledger, or one campaign in detail: stages with verdicts
    and numbers, attempts with exit classes and nodes, excluded nodes, the scaling table.

    With --json and a NAME, prints {"name", "state", "stages": [{"name", "kind", "state",
    "attempts", "tokens", "last_loss", "verdict"}], "excluded_nodes"} plus the detail keys
    "site", "version", "updated", "attempts_detail", "stage_numbers", "exclusions",
    "scaling", "events". Reads counters only, never the step metrics: instant at any size.
    """
    from campaign.ledger import queries as q

    if endpoint:  # the endpoint reads its ledger; the same views render it here
        from campaign import remote

        return remote.status_command(endpoint, name, workdir, db_url, as_json, watch, interval, count)
    ledger = _open(db_url, workdir, create=False)

    def fetch() -> Any:
        with ledger.session() as s:
            if name is None:
                return [q.summarize_campaign_row(s, c) for c in q.list_campaigns(s)]
            c = q.require_campaign(s, name, ledger.display_url)
            return q.describe_campaign(s, c)

    from campaign.views import campaign_detail, campaigns_table, console

    try:
        if watch:
            from campaign.watch import watch as watch_loop

            from rich.text import Text

            render = (lambda d: Text(json.dumps(d, indent=2))) if as_json else (campaigns_table if name is None else campaign_detail)
            watch_loop(fetch, render, console(), interval=interval, count=count)
            return
        data = fetch()
    finally:
        ledger.close()
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    console().print(campaigns_table(data) if name is None else campaign_detail(data))


@main.command()
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@_errors
def validate(file: Path) -> None:
    """Check a campaign file. Prints the resolved spec (defaults filled in) as YAML, or
    every problem with its field, file and line (exit 2). Touches no ledger."""
    import yaml

    from campaign import spec as spec_mod

    spec = spec_mod.load(file)
    click.echo(f"# {file}: valid; spec digest {spec.digest()[:12]}")
    click.echo(yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False), nl=False)


@main.group()
def db() -> None:
    """Manage the ledger's schema (Alembic migrations shipped with campaign)."""


@db.command("upgrade")
@_db_options
@_errors
def db_upgrade(db_url: str | None, workdir: Path) -> None:
    """Migrate the ledger to this release's schema (creates it if new)."""
    from campaign.ledger import default_url, schema
    from campaign.ledger.db import make_engine

    engine = make_engine(db_url or default_url(workdir))
    try:
        schema.upgrade(engine)
        with engine.connect() as conn:
            click.echo(f"{engine.url.render_as_string(hide_password=True)}: at {schema.current_revision(conn)} (head)")
    finally:
        engine.dispose()


@db.command("current")
@_db_options
@_errors
def db_current(db_url: str | None, workdir: Path) -> None:
    """Print the ledger's schema revision and this release's."""
    from campaign.ledger import default_url, schema
    from campaign.ledger.db import make_engine

    engine = make_engine(db_url or default_url(workdir))
    try:
        with engine.connect() as conn:
            current = schema.current_revision(conn)
    finally:
        engine.dispose()
    head = schema.head_revision()
    state = "up to date" if current == head else "needs `campaign db upgrade`"
    click.echo(f"current: {current or '(empty)'}\nhead:    {head}\n{state}")


@main.group()
def nodes() -> None:
    """Nodes the ledger tells every campaign on a site not to use."""


@nodes.command("list")
@_db_options
@click.option("--site", help="Only this site (e.g. local, aurora).")
@click.option("--all", "show_all", is_flag=True, help="Include lifted and expired exclusions.")
@_errors
def nodes_list(db_url: str | None, workdir: Path, site: str | None, show_all: bool) -> None:
    """List excluded nodes with reason and expiry."""
    from rich.table import Table

    from campaign.ledger import queries as q

    ledger = _open(db_url, workdir, create=False)
    try:
        with ledger.session() as s:
            rows = q.list_exclusions(s, site, active=not show_all)
            t = Table(title="excluded nodes", title_justify="left")
            for col in ("site", "node", "reason", "since", "expires", "lifted"):
                t.add_column(col)
            for e in rows:
                t.add_row(e.site, e.node, e.reason, e.created.strftime("%Y-%m-%d %H:%M"),
                          e.expires.strftime("%Y-%m-%d %H:%M") if e.expires else "never",
                          e.lifted.strftime("%Y-%m-%d %H:%M") if e.lifted else "")
    finally:
        ledger.close()
    from campaign.views import console

    console().print(t)


@nodes.command("exclude")
@click.argument("node")
@click.option("--site", required=True, help="Site the node belongs to (e.g. local, aurora).")
@click.option("--reason", required=True, help="Why (kept in the ledger).")
@click.option("--hours", type=click.FloatRange(min=0, min_open=True), help="Expire after this many hours (default: never).")
@_db_options
@_errors
def nodes_exclude(node: str, site: str, reason: str, hours: float | None, db_url: str | None, workdir: Path) -> None:
    """Exclude NODE on a site from every later attempt, stage and campaign."""
    import datetime as dt

    from campaign.ledger import queries as q
    from campaign.ledger.models import utcnow

    ledger = _open(db_url, workdir)
    try:
        with ledger.session() as s:
            expires = utcnow() + dt.timedelta(hours=hours) if hours else None
            q.exclude_node(s, site=site, node=node, reason=reason, evidence={"by": "user"}, expires=expires)
    finally:
        ledger.close()
    click.echo(f"excluded {node} on {site}" + (f" for {hours:g} h" if hours else ""))


@nodes.command("include")
@click.argument("node")
@click.option("--site", required=True, help="Site the node belongs to.")
@_db_options
@_errors
def nodes_include(node: str, site: str, db_url: str | None, workdir: Path) -> None:
    """Lift the exclusions of NODE on a site."""
    from campaign.ledger import queries as q

    ledger = _open(db_url, workdir, create=False)
    try:
        with ledger.session() as s:
            n = q.include_node(s, site=site, node=node)
    finally:
        ledger.close()
    if n == 0:
        raise CampaignError(f"{node} is not excluded on {site}")
    click.echo(f"{node} on {site}: {n} exclusion(s) lifted")


# --- seeing the campaign: plots, export, imported references -----------------------------
# Thin definitions: the work is in campaign.plots / campaign.export / ledger.queries, imported
# when a command runs (matplotlib only by `plot`).

PLOT_KINDS = ("progress", "scaling", "steps")


@main.group()
def data() -> None:
    """Prepare training data for the built-in trainer."""


@data.command("prepare")
@click.argument("texts", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--out", "out_path", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Token file to write (flat memmap, the usual .bin layout).")
@click.option("--dtype", type=click.Choice(["uint16", "uint32"]), default="uint16", show_default=True,
              help="Element type of the token file.")
@_errors
def data_prepare(texts: tuple[Path, ...], out_path: Path, dtype: str) -> None:
    """Turn TEXTS (UTF-8 or any bytes) into one token file with the byte-level tokenizer
    (token = byte + 1, 0 between documents; vocabulary 257). Use it as
    `data: {source: file, path: OUT, dtype: DTYPE}` with `model: {vocab_size: 257}` or more."""
    from campaign.train.data import prepare_text

    if out_path.exists() and out_path.resolve() in {t.resolve() for t in texts}:
        raise CampaignError(f"--out {out_path} is one of the input files")
    info = prepare_text(list(texts), out_path, dtype)
    click.echo(f"{info['path']}: {info['tokens']:,} tokens from {info['documents']} document(s), {info['dtype']}, "
               f"vocabulary {info['vocab_size']}")


@main.command()
@click.argument("names", nargs=-1, required=True, metavar="NAME...")
@_db_options
@click.option("--kind", type=click.Choice(PLOT_KINDS), default="progress", show_default=True,
              help="progress: loss vs tokens; scaling: tokens/s, efficiency, collective share vs nodes; "
                   "steps: step time and loss vs step.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("plots"),
              show_default=True, help="Directory for the PNG files.")
@click.option("--log-x", is_flag=True, help="Logarithmic token axis (progress).")
@click.option("--reference", "reference_file", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="A reference curve file (step|tokens,loss; optional run,stage,nodes columns) drawn in black.")
@click.option("--stage", help="Only this stage (steps: default the stage with the most steps).")
@click.option("--max-points", type=click.IntRange(min=10), default=4000, show_default=True,
              help="Points per campaign, sampled in the database.")
@_endpoint_option
@_errors
def plot(names: tuple[str, ...], db_url: str | None, workdir: Path, kind: str, out_dir: Path, log_x: bool,
         reference_file: Path | None, stage: str | None, max_points: int, endpoint: str | None) -> None:
    """Draw campaigns from the ledger as a PNG in --out: progress, scaling or steps.

    Several NAMEs (shell wildcards allowed) go on one figure, e.g. a live campaign beside
    runs imported with `campaign ledger import-reference`."""
    from campaign import export, plots
    from campaign.ledger import queries as q

    if endpoint:  # the endpoint samples its ledger; the figure is drawn here
        from campaign import remote

        click.echo(str(remote.plot_command(endpoint, names, workdir, db_url, kind, out_dir, log_x, reference_file,
                                           stage, max_points)))
        return
    ledger = _open(db_url, workdir, create=False)
    try:
        with ledger.session() as s:
            found = q.find_campaigns(s, names, ledger.display_url)
            if kind == "scaling":
                tables = [(f"{c.name} / {r.name}" if len(found) > 1 else r.name, r.numbers["table"])
                          for c in found for r in q.current_stage_runs(s, c)
                          if r.kind == "scaling" and (r.numbers or {}).get("table")]
                if not tables:
                    raise CampaignError(f"no scaling table in {', '.join(c.name for c in found)}: run a scaling stage first")
                fig = plots.scaling_figure(tables)
            else:
                columns = ("loss", "step_time_s") if kind == "steps" else ("loss",)
                series = [q.sample_campaign_steps(s, c, stage=stage or (q.busiest_stage(s, c) if kind == "steps" else None),
                                                  max_points=max_points, columns=columns) for c in found]
                if kind == "steps":
                    fig = plots.steps_figure(series)
                else:
                    ref = export.read_curves(reference_file) if reference_file else None
                    fig = plots.progress_figure(series, reference=ref, log_x=log_x)
    finally:
        ledger.close()
    stem = "+".join(c.name for c in found) if len(found) <= 3 else f"{found[0].name}+{len(found) - 1}-more"
    path = plots.save(fig, out_dir / f"{stem}-{kind}.png")
    click.echo(str(path))


@main.group()
def ledger() -> None:
    """Move ledger data out (CSV/JSON) and reference curves in."""


@ledger.command("export")
@click.argument("name")
@_db_options
@click.option("--format", "fmt", type=click.Choice(["csv", "json"]), default="csv", show_default=True)
@click.option("--what", type=click.Choice(["steps", "attempts", "nodes"]), default="steps", show_default=True,
              help="steps: every step row; attempts: one row per attempt; nodes: per node used or excluded.")
@click.option("--out", "out_file", type=click.Path(dir_okay=False, path_type=Path), help="File to write (default: stdout).")
@_endpoint_option
@_errors
def ledger_export(name: str, db_url: str | None, workdir: Path, fmt: str, what: str, out_file: Path | None,
                  endpoint: str | None) -> None:
    """Write campaign NAME's steps, attempts or nodes as CSV or JSON (streamed)."""
    from campaign import export
    from campaign.ledger import queries as q

    if endpoint:  # pages of rows from the endpoint's ledger, written here as they arrive
        from campaign import remote

        n = remote.export_command(endpoint, name, workdir, db_url, fmt, what, out_file)
        if out_file:
            click.echo(f"{out_file}: {n} {what} row(s)", err=True)
        return
    led = _open(db_url, workdir, create=False)
    out = out_file.open("w", newline="") if out_file else sys.stdout
    try:
        with led.session() as s:
            c = q.find_campaigns(s, (name,), led.display_url)[0]
            if what == "steps":
                rows: Any = q.iter_campaign_steps(s, c)
                columns: Any = q.EXPORT_STEP_COLUMNS
            elif what == "attempts":
                rows, columns = q.describe_campaign(s, c)["attempts_detail"], export.ATTEMPT_COLUMNS
            else:
                rows, columns = q.list_campaign_nodes(s, c), export.NODE_COLUMNS
            n = export.write_rows(rows, columns, fmt, out)
    finally:
        led.close()
        if out_file:
            out.close()
    if out_file:
        click.echo(f"{out_file}: {n} {what} row(s)", err=True)


@ledger.command("import-reference")
@click.argument("name")
@click.argument("file", type=click.Path(dir_okay=False, exists=True, path_type=Path))
@_db_options
@click.option("--run", help="Import only this run of a file with a `run` column (as NAME).")
@click.option("--nodes", type=click.IntRange(min=1), help="Node count of the run(s), where the file has none.")
@click.option("--tokens-per-step", type=click.IntRange(min=1), help="Tokens per step, for a step,loss file.")
@click.option("--replace", is_flag=True, help="Replace an imported campaign of the same name.")
@_errors
def ledger_import_reference(name: str, file: Path, db_url: str | None, workdir: Path, run: str | None,
                            nodes: int | None, tokens_per_step: int | None, replace: bool) -> None:
    """Store the loss curve(s) of FILE (`step,loss`, `tokens,loss`, or `run,stage,nodes,tokens,loss`)
    as campaign NAME of site "imported", to plot beside live campaigns. A file of several
    runs becomes one campaign per run, NAME-RUN (or only --run, as NAME)."""
    from campaign import export
    from campaign.ledger import queries as q

    curves = export.read_curves(file, run=run, nodes=nodes, tokens_per_step=tokens_per_step)
    led = _open(db_url, workdir)
    try:
        with led.session() as s:
            made = []
            for run_name, runs in curves.items():
                target = name if run is not None or not run_name or len(curves) == 1 else f"{name}-{run_name}"
                old = q.get_campaign(s, target)
                if old is not None:
                    if not (replace and old.site == "imported"):
                        raise CampaignError(f"campaign {target!r} exists in {led.display_url}; "
                                            + ("pass --replace to import it again" if old.site == "imported"
                                               else "it is not an imported one: choose another NAME"))
                    q.delete_campaign(s, old)
                q.import_reference(s, target, runs, source=file.name)
                points = sum(len(r["rows"]) for r in runs)
                made.append(f"{target}: {len(runs)} curve(s), {points} point(s)"
                            + ("" if any(p["tokens"] for r in runs for p in r["rows"]) else
                               " (no tokens: pass --tokens-per-step to plot it against tokens)"))
    finally:
        led.close()
    click.echo("imported " + "; ".join(made))


if __name__ == "__main__":
    main()
