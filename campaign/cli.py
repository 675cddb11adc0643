"""The `campaign` command line.

    campaign submit examples/local.yaml        run a campaign (stages in order), recorded in the ledger
    campaign status [NAME] [--json]            what the ledger says (no Parsl, no torch: instant)
    campaign status NAME --watch               refresh until the campaign stops running
    campaign plot NAME... --kind progress      loss vs tokens (or scaling, steps) as PNG
    campaign ledger export|import-reference    steps/attempts/nodes as CSV/JSON; reference curves in
    campaign resume NAME                       continue after the driver died, from the ledger alone
    campaign cancel NAME                       stop a running campaign cleanly
    campaign validate FILE                     check a campaign file; print the resolved spec or the errors
    campaign check-trainer FILE                run your trainer briefly; what the trainer contract misses, with fixes
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

from campaign.commands import EXPORT_KINDS, PLOT_KINDS
from campaign.errors import CampaignError

F = TypeVar("F", bound=Callable[..., Any])

DB_HELP = "Ledger URL (default: SQLite at WORKDIR/ledger.db). Postgres: postgresql://user@host/db."
WORKDIR_HELP = ("Work directory: run directories of every campaign and the default ledger (submit --endpoint of an "
                "aurora campaign without it: /lus/flare/projects/ACCOUNT/campaigns on the endpoint's host).")


def _db_options(f: F) -> F:
    f = click.option("--db", "db_url", envvar="CAMPAIGN_DB_URL", metavar="URL", help=DB_HELP)(f)
    f = click.option("--workdir", envvar="CAMPAIGN_WORKDIR", default="campaigns", show_default=True,
                     type=click.Path(path_type=Path), help=WORKDIR_HELP)(f)
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
    from campaign.commands import open_at

    return open_at(db_url, workdir, create=create)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="campaign")
def main() -> None:
    """Run multi-stage LLM training campaigns on HPC machines, with a ledger of record.

    A campaign is one YAML file: a model, a site (local, aurora, polaris, slurm) and stages
    that must pass in order (smoke, loss_check, scaling, long_run, resume_test). A stalled or
    crashed run is detected, its bad node excluded, and the run relaunched from its last
    complete checkpoint; under DDP a surviving rank first saves the last finished step (a
    rescue checkpoint, `trainer.rescue`), so the relaunch recomputes nothing. Start with
    `campaign submit examples/local.yaml`, then `campaign status local-demo`; `campaign
    validate FILE` lists every field a file may set.

    Exit codes: 0 success, 1 a stage failed, 2 bad input or usage, 130 cancelled.
    """


@main.command()
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@_db_options
@click.option("--dry-run", is_flag=True, help="Print what each stage would launch (in the run directories of the version "
              "it would run as: with --new-version, the next one); submit and record nothing.")
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
    from campaign import reference, walltime

    reference.check_files(spec.stages, file.parent)

    remote_default = spec.site.remote_workdir() if endpoint else None
    if remote_default is not None and click.get_current_context().get_parameter_source("workdir") \
            == click.core.ParameterSource.DEFAULT:
        workdir = remote_default
        click.echo(f"note: no --workdir given: the campaign runs in {workdir} on the endpoint's host "
                   f"(the {spec.site.kind} site's default)", err=True)
    site_says = spec.site.workdir_warnings(workdir, remote=bool(endpoint))
    from campaign.contract import custom_trainer_warnings

    for line in [*walltime.warnings(spec), *custom_trainer_warnings(spec), *site_says]:  # before anything is submitted
        click.echo(f"warning: {line}", err=True)
    if dry_run:
        from campaign import dryrun
        from campaign.commands import planned_version

        version, unread = planned_version(db_url, workdir, spec, new_version=new_version)
        if unread:
            click.echo(f"warning: {' '.join(unread.split())}; the run directories shown are those of a new campaign",
                       err=True)
        if as_json:
            click.echo(json.dumps(dryrun.dry_run_document(spec, workdir, file.parent, version), indent=2))
        else:
            click.echo(dryrun.render_dry_run(spec, workdir, file.parent, version))
        return
    if endpoint:  # a detached driver on the endpoint's host; this returns at once
        from campaign import remote

        _print_started(remote.submit(endpoint, file, workdir, db_url, new_version), endpoint, workdir)
        return
    from campaign import goodput
    from campaign.commands import check_workdir
    from campaign.engine import Engine
    from campaign.progress import Progress

    goodput.check_auto(lambda: _open(db_url, workdir, create=False), spec, str(file))  # auto needs a failure rate
    spec.site.preflight()  # what only this host can tell, before the ledger is touched
    check_workdir(workdir)
    ledger = _open(db_url, workdir)
    try:
        engine = Engine(spec, ledger, workdir=workdir, progress=Progress(quiet=quiet), spec_dir=file.parent)
        code = engine.submit(file.read_text(), new_version=new_version)
    finally:
        ledger.close()
    sys.exit(code)


def _print_started(info: dict[str, Any], endpoint: str, workdir: Path) -> None:
    """What `submit --endpoint` did there: started a driver, attached to one, or nothing to run."""
    if info.get("exit_code") == 0:
        click.echo(f"{info['name']}: every stage had passed; nothing to run (ledger {info['ledger']})")
        return
    verb = "attached to the running driver of" if info["attached"] else "started a driver for"
    click.echo(f"{verb} {info['name']} on {info['host']} (pid {info['pid']})")
    click.echo(f"  ledger: {info['ledger']}\n  log:    {info['log']}")
    if info.get("note"):
        click.echo(f"  note:   {info['note']}")
    click.echo(f"  watch:  campaign status {info['name']} --endpoint {endpoint} --workdir {workdir}")


@main.command()
@click.argument("name")
@_db_options
@click.option("--quiet", "-q", is_flag=True, help="Print only errors and the final summary.")
@_errors
def resume(name: str, db_url: str | None, workdir: Path, quiet: bool) -> None:
    """Continue campaign NAME after its driver died (or was cancelled), from the ledger alone.

    Attempts the dead driver left open are marked `orphaned` and their jobs stopped; stages
    already passed are not rerun; the long run continues from its newest complete checkpoint
    (a rescue checkpoint, if the last fault left one).
    Refused while another driver holds the campaign's lease, and on a SQLite ledger that
    fails `PRAGMA quick_check` (restore it first).
    """
    from campaign import spec as spec_mod
    from campaign.commands import check_workdir
    from campaign.engine import Engine
    from campaign.ledger import reads
    from campaign.progress import Progress

    check_workdir(workdir)
    ledger = _open(db_url, workdir, create=False)
    try:
        ledger.check_integrity()
        with ledger.session() as s:
            c = reads.require_campaign(s, name, ledger.display_url)
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
              help="Seconds to wait for the driver to stop its launch and record `cancelled`.")
@_endpoint_option
@_errors
def cancel(name: str, db_url: str | None, workdir: Path, wait_s: float, endpoint: str | None) -> None:
    """Stop a running campaign cleanly: its driver stops the running launch, cancels its
    scheduler jobs through the provider, and records the campaign as `cancelled`."""
    from campaign import commands

    if endpoint:  # the same cancel, run on the endpoint's host (where the driver runs)
        from campaign import remote

        click.echo(remote.cancel(endpoint, name, workdir, db_url, wait_s))
        return
    ledger = _open(db_url, workdir, create=False)
    try:
        state = commands.cancel_campaign(ledger, name, wait_s, notify=click.echo)
    finally:
        ledger.close()
    click.echo(f"{name}: {state}")


@main.command()
@click.argument("name")
@click.argument("fault", type=click.Choice(["kill", "hang"]))
@click.option("--rank", type=int, default=0, show_default=True, help="The rank whose process group gets the fault.")
@click.option("--after-step", type=int, default=0, show_default=True,
              help="Wait until the running attempt has reported this step (0: at once).")
@click.option("--wait", "wait_s", type=float, default=600.0, show_default=True,
              help="Seconds to wait for a running attempt and that step.")
@_db_options
@_errors
def inject(name: str, fault: str, rank: int, after_step: int, wait_s: float, db_url: str | None, workdir: Path) -> None:
    """A drill on any trainer, yours or one you did not write: `kill` sends SIGKILL, `hang`
    SIGSTOP (it neither prints nor exits) to one rank of the running attempt of campaign NAME
    (local launcher, this host), once it has reported --after-step. The watchdog and the
    stage then do what they would after a real fault; docs/trainer-contract.md, "Drills"."""
    import time

    from campaign import commands

    end = time.monotonic() + wait_s
    while True:  # the campaign may have just been submitted: its ledger comes with its first stage
        try:
            ledger = _open(db_url, workdir, create=False)
            break
        except CampaignError:
            if time.monotonic() > end:
                raise
            time.sleep(0.5)
    try:
        commands.inject_fault(ledger, name, fault, rank, after_step=after_step, wait_s=max(end - time.monotonic(), 1),
                              notify=click.echo)
    finally:
        ledger.close()


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
    "scaling", "events", "warnings" (e.g. rows of a trainer's metrics.jsonl that were
    skipped as invalid). Reads counters only, never the step metrics: instant at any size.
    """
    from campaign import commands

    if endpoint:  # the endpoint reads its ledger; the same views render it here
        from campaign import remote

        with remote.Endpoint(endpoint) as ep:
            _show_status(lambda: remote.status_data(ep, name, workdir, db_url), name, as_json, watch, interval, count)
        return
    ledger = _open(db_url, workdir, create=False)
    try:
        _show_status(lambda: commands.status_data(ledger, name), name, as_json, watch, interval, count)
    finally:
        ledger.close()


def _show_status(fetch: Callable[[], Any], name: str | None, as_json: bool, watch: bool, interval: float,
                 count: int | None) -> None:
    """Print `fetch()` as JSON or as the status views; with `watch`, again until it stops running."""
    from campaign.views import campaign_detail, campaigns_table, console

    def render(data: Any) -> Any:
        if as_json:
            from rich.text import Text

            return Text(json.dumps(data, indent=2))
        return campaigns_table(data) if name is None else campaign_detail(data)

    if watch:
        from campaign.watch import watch as watch_loop

        watch_loop(fetch, render, console(), interval=interval, count=count)
    elif as_json:
        click.echo(json.dumps(fetch(), indent=2))
    else:
        console().print(render(fetch()))


@main.command()
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@_errors
def validate(file: Path) -> None:
    """Check a campaign file. Prints the resolved spec (defaults filled in) as YAML, or
    every problem with its field, file and line (exit 2). Touches no ledger."""
    import yaml

    from campaign import spec as spec_mod

    from campaign.contract import custom_trainer_warnings

    spec = spec_mod.load(file)
    for line in custom_trainer_warnings(spec):
        click.echo(f"warning: {line}", err=True)
    click.echo(f"# {file}: valid; spec digest {spec.digest()[:12]}")
    click.echo(yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False), nl=False)


@main.command("check-trainer")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--steps", default=6, show_default=True, type=click.IntRange(2), help="Steps of the first run.")
@_errors
def check_trainer(file: Path, steps: int) -> None:
    """Run the trainer of FILE (a campaign file, or a script) briefly with 2 local ranks and list
    what the trainer contract needs and is missing, with the fix for each. Exit 1 if any is missing.

    Two runs: to --steps with a checkpoint halfway, then a resume from it. A run that fails
    without evidence either way (a one-off abort) is run once more, as a stage would; the
    `exit codes` line then says what the first run hit. docs/trainer-contract.md lists the items."""
    from campaign import checktrainer

    sys.exit(checktrainer.main(file, steps=steps))


@main.group()
def db() -> None:
    """Manage the ledger's schema (Alembic migrations shipped with campaign)."""


@db.command("upgrade")
@_db_options
@_errors
def db_upgrade(db_url: str | None, workdir: Path) -> None:
    """Migrate the ledger to this release's schema (creates it if new)."""
    from campaign import commands
    from campaign.ledger import default_url

    url = db_url or default_url(workdir)
    revision = commands.upgrade_schema(url)
    click.echo(f"{_shown(url)}: at {revision} (head)")


@db.command("current")
@_db_options
@_errors
def db_current(db_url: str | None, workdir: Path) -> None:
    """Print the ledger's schema revision and this release's."""
    from campaign import commands
    from campaign.ledger import default_url

    current, head = commands.schema_revisions(db_url or default_url(workdir))
    state = "up to date" if current == head else "needs `campaign db upgrade`"
    click.echo(f"current: {current or '(empty)'}\nhead:    {head}\n{state}")


def _shown(url: str) -> str:
    """A ledger URL as it may be printed (no password)."""
    import sqlalchemy as sa

    return sa.engine.make_url(url).render_as_string(hide_password=True)


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
    from campaign import commands
    from campaign.views import console, exclusions_list

    ledger = _open(db_url, workdir, create=False)
    try:
        rows = commands.list_exclusions(ledger, site, show_all=show_all)
    finally:
        ledger.close()
    console().print(exclusions_list(rows))


@nodes.command("exclude")
@click.argument("node")
@click.option("--site", required=True, help="Site the node belongs to (e.g. local, aurora).")
@click.option("--reason", required=True, help="Why (kept in the ledger).")
@click.option("--hours", type=click.FloatRange(min=0, min_open=True), help="Expire after this many hours (default: never).")
@_db_options
@_errors
def nodes_exclude(node: str, site: str, reason: str, hours: float | None, db_url: str | None, workdir: Path) -> None:
    """Exclude NODE on a site from every later attempt, stage and campaign."""
    from campaign import commands

    commands.check_exclusion(node, site)  # before the ledger is opened (or made)
    ledger = _open(db_url, workdir)
    try:
        commands.exclude_node(ledger, node, site, reason, hours)
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
    from campaign import commands

    commands.check_exclusion(node, site)  # before the ledger is opened
    ledger = _open(db_url, workdir, create=False)
    try:
        n = commands.include_node(ledger, node, site)
    finally:
        ledger.close()
    click.echo(f"{node} on {site}: {n} exclusion(s) lifted")


# --- seeing the campaign: plots, export, imported references -----------------------------
# Thin definitions: the work is in campaign.commands (and plots / export under it), imported
# when a command runs (matplotlib only by `plot`).



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
                   "steps: step time and loss vs step; goodput: where each stage's wall time went.")
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
    from campaign import commands

    commands.check_plot_names(names)  # before anything is read or drawn
    if endpoint:  # the endpoint samples its ledger; the figure is drawn here
        from campaign import remote

        data = remote.plot_data(endpoint, names, workdir, db_url, kind, stage, max_points)
    else:
        led = _open(db_url, workdir, create=False)
        try:
            data = commands.plot_data(led, names, kind, stage, max_points)
        finally:
            led.close()
    click.echo(str(commands.draw_plot(data, kind, out_dir, reference_file=reference_file, log_x=log_x)))


@main.group()
def ledger() -> None:
    """Move ledger data out (CSV/JSON) and reference curves in."""


@ledger.command("export")
@click.argument("name")
@_db_options
@click.option("--format", "fmt", type=click.Choice(["csv", "json"]), default="csv", show_default=True)
@click.option("--what", type=click.Choice(EXPORT_KINDS), default="steps", show_default=True,
              help="steps: every step row; attempts: one row per attempt; nodes: per node used or excluded.")
@click.option("--out", "out_file", type=click.Path(dir_okay=False, path_type=Path), help="File to write (default: stdout).")
@_endpoint_option
@_errors
def ledger_export(name: str, db_url: str | None, workdir: Path, fmt: str, what: str, out_file: Path | None,
                  endpoint: str | None) -> None:
    """Write campaign NAME's steps, attempts or nodes as CSV or JSON (streamed)."""
    from campaign import commands

    if endpoint:  # pages of rows from the endpoint's ledger, written here as they arrive
        from campaign import remote

        with remote.Endpoint(endpoint) as ep:
            n = _write_export(remote.export_rows(ep, name, what, workdir, db_url), what, fmt, out_file)
    else:
        led = _open(db_url, workdir, create=False)
        try:
            n = _write_export(commands.export_rows(led, name, what), what, fmt, out_file)
        finally:
            led.close()
    if out_file:
        click.echo(f"{out_file}: {n} {what} row(s)", err=True)


def _write_export(rows: Any, what: str, fmt: str, out_file: Path | None) -> int:
    from campaign import commands

    if out_file is None:
        return commands.write_export_stdout(rows, what, fmt, sys.stdout)
    return commands.write_export_file(rows, what, fmt, out_file)


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
    from campaign import commands, export, names

    names.check(name, "NAME")  # before the file is read or the ledger opened
    curves = export.read_curves(file, run=run, nodes=nodes, tokens_per_step=tokens_per_step)
    targets = commands.reference_targets(name, curves, run)
    led = _open(db_url, workdir)
    try:
        made = commands.import_reference(led, targets, source=file.name, replace=replace)
    finally:
        led.close()
    click.echo("imported " + "; ".join(made))


if __name__ == "__main__":
    main()
