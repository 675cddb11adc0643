"""The `campaign` command line.

    campaign submit examples/local.yaml        run a campaign (stages in order), recorded in the ledger
    campaign status [NAME] [--json]            what the ledger says (no Parsl, no torch: instant)
    campaign status NAME --watch               one screen, refreshed until the campaign stops running
    campaign logs NAME [-f]                    a rank's log (rank 0 of the running attempt by default)
    campaign plot NAME...                      the long run's loss vs tokens across attempts (--kind: progress,
                                               scaling, steps, goodput) as PNG
    campaign ledger export|import-reference    steps/attempts/nodes as CSV/JSON; reference curves in
    campaign resume NAME                       continue after the driver died, from the ledger alone
    campaign cancel NAME                       stop a running campaign cleanly
    campaign inject NAME kill|hang --rank R    a drill: fault one rank of the running (or --attempt next) attempt
    campaign forget NAME [--yes]               remove a campaign's rows and run directories
    campaign report NAME --html OUT.html       one self-contained page (plots inline) to mail or publish
    campaign validate FILE [--preflight]       check a campaign file; print the resolved spec or the errors
    campaign check-trainer FILE                run your trainer briefly; what the trainer contract misses, with fixes
    campaign db upgrade|current                manage the ledger's schema
    campaign nodes list|exclude|include        the nodes the ledger tells every campaign not to use
    campaign data prepare TEXTS --out OUT      a token file (byte-level, or --tokenizer tokenizer.json)

    --endpoint UUID on submit, status, plot, ledger export and cancel runs them through a Globus
    Compute endpoint on the machine's login node (campaign.remote; docs/remote.md).

Exit codes: 0 success, 1 a stage failed, 2 bad input or usage.
This module imports neither torch nor parsl (a test holds that); commands import what
they need when they run.
"""

from __future__ import annotations

import dataclasses
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


def _completion_ledger(ctx: click.Context) -> tuple[str | None, Path]:
    """The ledger a command line being completed names (--db, --workdir, their variables)."""
    import os

    root = ctx.find_root()
    params = {**root.params, **ctx.params}
    db = params.get("db_url") or os.environ.get("CAMPAIGN_DB_URL")
    return db, Path(params.get("workdir") or os.environ.get("CAMPAIGN_WORKDIR") or "campaigns")


def _complete_campaigns(ctx: click.Context, incomplete: str) -> list[Any]:
    """Shell completion of a campaign NAME from the ledger (docs/observability.md, "Tab completion")."""
    from click.shell_completion import CompletionItem

    from campaign.commands import completion_names

    return [CompletionItem(n) for n in completion_names(*_completion_ledger(ctx)) if n.startswith(incomplete)]


def _complete_stages(ctx: click.Context, incomplete: str) -> list[Any]:
    """Shell completion of --stage: the stages of the campaign already on the command line."""
    from click.shell_completion import CompletionItem

    # While an option's value is completed, click leaves the arguments before it unparsed in ctx.args.
    name = ctx.params.get("name") or next(iter(ctx.params.get("names") or ()), None) or next(iter(ctx.args), None)
    if not name:
        return []
    from campaign.commands import completion_names

    return [CompletionItem(n) for n in completion_names(*_completion_ledger(ctx), campaign=name) if n.startswith(incomplete)]


CAMPAIGN_NAME = click.argument("name", shell_complete=lambda ctx, param, incomplete: _complete_campaigns(ctx, incomplete))
"""A NAME argument that tab-completes from the ledger."""
STAGE_COMPLETE = {"shell_complete": lambda ctx, param, incomplete: _complete_stages(ctx, incomplete)}


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
@click.option("--dry-run", is_flag=True, help="Print the preflight's findings, then what each stage would launch (in the run "
              "directories of the version it would run as: with --new-version, the next one; in the folder the ledger "
              "records for a known campaign, which a submit continues in); submit and record nothing.")
@click.option("--json", "as_json", is_flag=True,
              help="With --dry-run: a JSON document instead of text (each stage's launch command, environment, "
                   "and the first node's placement: CPUs, visible devices and device per local rank).")
@click.option("--new-version", is_flag=True, help="The file changed: record it as a new version of the campaign.")
@click.option("--quiet", "-q", is_flag=True, help="Print only errors and the final table.")
@click.option("--tensorboard", type=click.Path(file_okay=False, path_type=Path), metavar="DIR",
              help="Write TensorBoard event files to DIR as steps are ingested (`tensorboard --logdir DIR`); "
                   "wins over the spec's observe.tensorboard.")
@_endpoint_option
@_errors
def submit(file: Path, db_url: str | None, workdir: Path, dry_run: bool, as_json: bool, new_version: bool, quiet: bool,
           tensorboard: Path | None, endpoint: str | None) -> None:
    """Run the campaign in FILE: its stages in order, skipping those already passed.

    The same file again continues the same campaign; a changed file under the same name is
    refused unless --new-version. Exit code 0 if every stage passed, 1 if one failed, 2 for bad
    input, 130 if cancelled (`campaign cancel` or Ctrl-C).

    First, before anything is submitted or written, the preflight (`campaign validate
    --preflight` prints it alone, --dry-run above the plan): a loss reference that is neither
    in the ledger nor a file, a data.path that does not exist (relative paths are relative to
    FILE's folder), a placeholder left in (YOUR_PROJECT, <...>), no qsub/sbatch on PATH. Each
    refusal names the field and the fix; any refusal exits 2.
    """
    from campaign import spec as spec_mod

    if as_json and not dry_run:
        raise click.UsageError("--json goes with --dry-run (a submission prints its progress as it runs)")
    if tensorboard and endpoint:
        raise click.UsageError("--tensorboard names a folder here; with --endpoint set observe.tensorboard in the spec")
    from campaign import preflight

    source = preflight.Source.read(file)
    spec = source.spec()
    spec_mod.check_faults_allowed(spec, str(file))

    remote_default = spec.site.remote_workdir() if endpoint else None
    if remote_default is not None and click.get_current_context().get_parameter_source("workdir") \
            == click.core.ParameterSource.DEFAULT:
        workdir = remote_default
        click.echo(f"note: no --workdir given: the campaign runs in {workdir} on the endpoint's host "
                   f"(the {spec.site.kind} site's default)", err=True)
    # Before anything is submitted or written: every refusal at once (the endpoint's host checks
    # the paths, the scheduler and the ledger again for --endpoint: `remote.start_driver`).
    findings = preflight.check(spec, source, ledger=preflight.LedgerView(db_url, workdir), workdir=workdir,
                               here=not endpoint)
    if dry_run:
        from campaign import dryrun
        from campaign.commands import planned_version

        for line in preflight.render(findings, str(file)):
            click.echo(line, err=True)
        from campaign.attempt import reachable

        version, unread, recorded = planned_version(db_url, workdir, spec, new_version=new_version)
        if unread:
            click.echo(f"warning: {' '.join(unread.split())}; the run directories shown are those of a new campaign",
                       err=True)
        if recorded is not None and recorded != (workdir / spec.name).resolve():
            if reachable(recorded):  # where the submit would continue (Engine._work_in): show those paths
                click.echo(f"note: campaign {spec.name} works in {recorded} (recorded in the ledger), not in "
                           f"{workdir / spec.name}: the run directories shown are there", err=True)
                workdir = recorded.parent
            else:
                click.echo(f"warning: campaign {spec.name} works in {recorded} (recorded in the ledger), which this "
                           f"host cannot reach or write: a submit here is refused; run it with --workdir "
                           f"{recorded.parent} where that folder is", err=True)
        if as_json:
            doc = dryrun.dry_run_document(spec, workdir, file.parent, version)
            doc["preflight"] = [dataclasses.asdict(f) for f in findings]
            click.echo(json.dumps(doc, indent=2))
        else:
            click.echo(dryrun.render_dry_run(spec, workdir, file.parent, version))
        return
    for f in findings:
        if not f.refuse:
            click.echo(f"warning: {f.text(str(file))}", err=True)
    preflight.refuse_if_any(findings, str(file))
    if endpoint:  # a detached driver on the endpoint's host; this returns at once
        from campaign import remote

        _print_started(remote.submit(endpoint, file, workdir, db_url, new_version), endpoint, workdir)
        return
    from campaign import goodput
    from campaign.commands import check_workdir
    from campaign.engine import Engine
    from campaign.progress import Progress

    goodput.check_auto(lambda: _open(db_url, workdir, create=False), spec, str(file))  # auto needs a failure rate
    from campaign.observe import check_installed

    check_installed(spec, tensorboard=tensorboard is not None)  # observe's extras, before the ledger too
    check_workdir(workdir)
    ledger = _open(db_url, workdir)
    try:
        engine = Engine(spec, ledger, workdir=workdir, progress=Progress(quiet=quiet), spec_dir=file.parent,
                        tensorboard=tensorboard)
        code = engine.submit(file.read_text(), new_version=new_version)
    finally:
        ledger.close()
    sys.exit(code)


def _print_started(info: dict[str, Any], endpoint: str, workdir: Path) -> None:
    """What `submit --endpoint` did there: started a driver, attached to one, or nothing to run."""
    for line in info.get("warnings", []):  # the endpoint host's preflight
        click.echo(f"warning: {line} (checked on the endpoint's host)", err=True)
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
@CAMPAIGN_NAME
@_db_options
@click.option("--quiet", "-q", is_flag=True, help="Print only errors and the final summary.")
@click.option("--tensorboard", type=click.Path(file_okay=False, path_type=Path), metavar="DIR",
              help="Write TensorBoard event files to DIR as steps are ingested (`tensorboard --logdir DIR`); "
                   "wins over the spec's observe.tensorboard.")
@_errors
def resume(name: str, db_url: str | None, workdir: Path, quiet: bool, tensorboard: Path | None) -> None:
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
                        spec_dir=Path(spec_dir) if spec_dir else None, tensorboard=tensorboard)
        code = engine.submit(source)
    finally:
        ledger.close()
    sys.exit(code)


@main.command()
@CAMPAIGN_NAME
@_db_options
@click.option("--wait", "wait_s", type=float, default=60.0, show_default=True,
              help="Seconds to wait for the driver to stop its launch and record `cancelled`.")
@_endpoint_option
@_errors
def cancel(name: str, db_url: str | None, workdir: Path, wait_s: float, endpoint: str | None) -> None:
    """Stop a running campaign cleanly: its driver stops the running launch, cancels its
    scheduler jobs through the provider, and records the campaign as `cancelled`. When the
    driver is gone (killed, its host lost), cancel stops what it left running, as `resume`
    would, and records `cancelled`; `campaign resume NAME` continues it later."""
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
@CAMPAIGN_NAME
@click.option("--stage", help="A stage's attempts (default: the running attempt, else the newest).", **STAGE_COMPLETE)
@click.option("--attempt", "number", type=click.IntRange(min=1), help="Attempt N of the stage.")
@click.option("--rank", type=click.IntRange(min=0), default=0, show_default=True, help="Whose log.")
@click.option("--follow", "-f", is_flag=True,
              help="Go on as the log grows, and on to the next attempt (without --attempt) while the campaign runs.")
@_db_options
@_errors
def logs(name: str, stage: str | None, number: int | None, rank: int, follow: bool, db_url: str | None,
         workdir: Path) -> None:
    """Print (or follow, -f) a rank's log of campaign NAME: rank 0 of the running attempt by
    default, else of the newest; behind mpiexec, srun or torchrun, the launcher's log."""
    from campaign import commands

    ledger = _open(db_url, workdir, create=False)
    try:
        commands.follow_log(ledger, name, lambda text: (sys.stdout.write(text), sys.stdout.flush()), stage=stage,
                            attempt=number, rank=rank, follow=follow)
    except KeyboardInterrupt:
        pass
    finally:
        ledger.close()


@main.command()
@CAMPAIGN_NAME
@click.option("--yes", "-y", is_flag=True, help="Do not ask.")
@click.option("--missing-ok", is_flag=True, help="A campaign the ledger does not hold is not an error (make demo).")
@_db_options
@_errors
def forget(name: str, yes: bool, missing_ok: bool, db_url: str | None, workdir: Path) -> None:
    """Remove campaign NAME from the ledger (its stages, attempts, steps, events and its own
    exclusions) and its run directories. Refused while its driver runs. Exclusions of the
    whole site stay (`campaign nodes list`)."""
    from campaign import commands, names
    from campaign.errors import NoLedger

    names.check(name, "NAME")
    try:
        ledger = _open(db_url, workdir, create=False)
    except NoLedger:
        if missing_ok:
            return
        raise
    try:
        if missing_ok and not commands.campaign_exists(ledger, name):
            return
        plan = commands.forget_plan(ledger, name)
        what = (f"campaign {name}: {plan['attempts']} attempt(s), {plan['steps']:,} step(s)"
                + (f", {plan['exclusions']} exclusion(s) of its own" if plan["exclusions"] else "")
                + (f", and the run directory {plan['run_dir']}" if plan["run_dir"] else ""))
        if not yes and not click.confirm(f"forget {what}?", default=False):
            click.echo("nothing removed")
            return
        commands.forget_campaign(ledger, name)
    finally:
        ledger.close()
    click.echo(f"forgot {what}")


@main.command()
@CAMPAIGN_NAME
@click.argument("fault", type=click.Choice(["kill", "hang"]))
@click.option("--rank", type=int, default=0, show_default=True, help="The rank whose process group gets the fault.")
@click.option("--after-step", type=int, default=0, show_default=True,
              help="Wait until the attempt has reported this step (0: at once).")
@click.option("--attempt", "which", type=click.Choice(["current", "next"]), default="current", show_default=True,
              help="current: the attempt running now (refused at once if the campaign is not running); next: the "
                   "first attempt that starts after this command (it waits for the campaign to start).")
@click.option("--stage", help="Only an attempt of this stage.", **STAGE_COMPLETE)
@click.option("--wait", "wait_s", type=float, default=600.0, show_default=True,
              help="Seconds to wait for that attempt and that step.")
@_db_options
@_errors
def inject(name: str, fault: str, rank: int, after_step: int, which: str, stage: str | None, wait_s: float,
           db_url: str | None, workdir: Path) -> None:
    """A drill on any trainer, yours or one you did not write: `kill` sends SIGKILL, `hang`
    SIGSTOP (it neither prints nor exits) to one rank of an attempt of campaign NAME (local
    launcher, this host), once it has reported --after-step. The watchdog and the stage then
    do what they would after a real fault, except that a node excluded for it is excluded for
    this campaign only; docs/trainer-contract.md, "Drills"."""
    import time

    from campaign import commands

    end = time.monotonic() + wait_s
    while True:  # `--attempt next` may come before the campaign's ledger: it comes with its first stage
        try:
            ledger = _open(db_url, workdir, create=False)
            break
        except CampaignError:
            if which == "current" or time.monotonic() > end:
                raise
            time.sleep(0.5)
    try:
        commands.inject_fault(ledger, name, fault, rank, after_step=after_step, wait_s=max(end - time.monotonic(), 1),
                              attempt=which, stage=stage, notify=click.echo)
    finally:
        ledger.close()


@main.command()
@click.argument("name", required=False,
                shell_complete=lambda ctx, param, incomplete: _complete_campaigns(ctx, incomplete))
@_db_options
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (a fixed shape scripts can rely on).")
@click.option("--watch", is_flag=True, help="Refresh until the campaign is no longer running (Ctrl-C stops): with NAME, "
              "one screen (running attempts' step/target, ETA, tokens/s, loss, nodes; exclusions; newest events).")
@click.option("--interval", type=click.FloatRange(min=0.1), default=2.0, show_default=True, metavar="S",
              help="Seconds between refreshes with --watch.")
@click.option("--count", type=click.IntRange(min=1), metavar="N", help="With --watch: stop after N refreshes.")
@_endpoint_option
@_errors
def status(name: str | None, db_url: str | None, workdir: Path, as_json: bool, watch: bool, interval: float,
           count: int | None, endpoint: str | None) -> None:
    """Show the campaigns in the ledger, or one campaign in detail: stages with verdicts
    and numbers (MFU against the device's bf16 peak; a float8 run's also against its float8
    peak), running attempts (step/target, ETA, tokens/s, loss, nodes), attempts with exit
    classes and nodes (two lines each where the table would not fit the terminal), excluded
    nodes, the scaling table. A campaign whose driver died
    reads `driver gone (pid P on HOST): run `campaign resume NAME`` (state "driver_gone").

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
    from campaign.views import campaign_detail, campaigns_table, console, watch_view

    out = console()

    def render(data: Any) -> Any:
        if as_json:
            from rich.text import Text

            return Text(json.dumps(data, indent=2))
        if name is None:
            return campaigns_table(data)
        if watch:  # one screen, redrawn: what fits the terminal, the rest counted in its last line
            return watch_view(data, out.size.width, out.size.height)
        return campaign_detail(data)

    if watch:
        from campaign.watch import watch as watch_loop

        watch_loop(fetch, render, out, interval=interval, count=count)
    elif as_json:
        click.echo(json.dumps(fetch(), indent=2))
    else:
        console().print(render(fetch()))


@main.command()
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--preflight", "run_preflight", is_flag=True,
              help="Also run the checks `submit` runs before it submits anything, on this host: loss references in "
                   "the ledger (--db/--workdir) or on disk, data.path, placeholders such as YOUR_PROJECT, the "
                   "scheduler's commands on PATH, the site's own checks. Prints each refusal and warning with its "
                   "field and fix; exit 2 on a refusal.")
@_db_options
@_errors
def validate(file: Path, run_preflight: bool, db_url: str | None, workdir: Path) -> None:
    """Check a campaign file. Prints the resolved spec (defaults filled in) as YAML, or
    every problem with its field, file and line (exit 2). Touches no ledger (--preflight
    reads it, to find loss references, and never writes it)."""
    import yaml


    from campaign.contract import custom_trainer_warnings

    from campaign import preflight

    source = preflight.Source.read(file)
    spec = source.spec()
    if run_preflight:
        findings = preflight.check(spec, source, ledger=preflight.LedgerView(db_url, workdir), workdir=workdir)
        for line in preflight.render(findings, str(file)):
            click.echo(line)
        if any(f.refuse for f in findings):
            sys.exit(2)
        return
    for line in custom_trainer_warnings(spec):
        click.echo(f"warning: {line}", err=True)
    for line in spec.site.settings_warnings():  # what the file alone tells (no host checked: --preflight)
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
    """Migrate the ledger to this release's schema. A new or empty one is created in one
    transaction: a disk that fills part way leaves it empty, with one line saying so."""
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
    """List excluded nodes with reason, scope (the site, or one campaign after a drill) and expiry."""
    from campaign import commands
    from campaign.views import console, exclusions_list

    ledger = _open(db_url, workdir, create=False)
    try:
        rows = commands.list_exclusions(ledger, site, show_all=show_all)
    finally:
        ledger.close()
    console().print(exclusions_list(rows))


SITE_HELP = "Site the node belongs to (e.g. local, aurora); default: the ledger's one site."


@nodes.command("exclude")
@click.argument("node")
@click.option("--site", help=SITE_HELP)
@click.option("--reason", help="Why (kept in the ledger). Default: 'excluded by USER'.")
@click.option("--hours", type=click.FloatRange(min=0, min_open=True), help="Expire after this many hours (default: never).")
@_db_options
@_errors
def nodes_exclude(node: str, site: str | None, reason: str | None, hours: float | None, db_url: str | None,
                  workdir: Path) -> None:
    """Exclude NODE on a site from every later attempt, stage and campaign."""
    from campaign import commands

    commands.check_exclusion(node, site)  # before the ledger is opened (or made)
    ledger = _open(db_url, workdir, create=site is not None)
    try:
        site = site or commands.default_site(ledger)
        commands.exclude_node(ledger, node, site, reason or commands.default_reason(), hours)
    finally:
        ledger.close()
    click.echo(f"excluded {node} on {site}" + (f" for {hours:g} h" if hours else "")
               + f"; lift: campaign nodes include {node} --site {site}")


@nodes.command("include")
@click.argument("node")
@click.option("--site", help=SITE_HELP)
@_db_options
@_errors
def nodes_include(node: str, site: str | None, db_url: str | None, workdir: Path) -> None:
    """Lift the exclusions of NODE on a site (site-wide ones and every campaign's)."""
    from campaign import commands

    commands.check_exclusion(node, site)  # before the ledger is opened
    ledger = _open(db_url, workdir, create=False)
    try:
        site = site or commands.default_site(ledger)
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
              help="Token file to write (flat memmap, the usual .bin layout), and its sidecar OUT.json.")
@click.option("--tokenizer", "tokenizer_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="A Hugging Face tokenizer.json (GPT-2's, Llama's, your own) to encode with; needs the "
                   "`data` extra (pip install 'campaign[data]'). Default: the byte-level tokenizer.")
@click.option("--dtype", type=click.Choice(["uint16", "uint32"]),
              help="Element type of the token file. Default: uint16 when the vocabulary fits (at most 65,536 "
                   "ids), else uint32.")
@click.option("--eos", metavar="TOKEN",
              help="With --tokenizer: the token written after each file (default: the first of <|endoftext|>, "
                   "<|end_of_text|>, </s>, <eos>, <|eot_id|>, [SEP] the tokenizer has; '' for none).")
@_errors
def data_prepare(texts: tuple[Path, ...], out_path: Path, tokenizer_file: Path | None, dtype: str | None,
                 eos: str | None) -> None:
    """Turn TEXTS (each file one document) into one token file for the built-in trainer.

    \b
    campaign data prepare corpus/*.txt --out train.bin --tokenizer tokenizer.json
    campaign data prepare corpus/*.txt --out train.bin          # byte-level: token = byte + 1, vocabulary 257

    Next to OUT it writes OUT.json with the file's dtype, vocabulary size and token count.
    Use it as `data: {source: file, path: OUT}`: the trainer takes the dtype from OUT.json and,
    unless `model.vocab_size` is set, sizes the model's vocabulary to the tokenizer's. A token
    file without OUT.json (nanoGPT's train.bin / val.bin) is read as it is: uint16, or `data.dtype`."""
    from campaign.train import tokenfile

    if out_path.exists() and out_path.resolve() in {t.resolve() for t in (*texts, tokenizer_file) if t}:
        raise CampaignError(f"--out {out_path} is one of the input files")
    if eos is not None and tokenizer_file is None:
        raise click.UsageError("--eos goes with --tokenizer (the byte-level tokenizer ends a document with 0)")
    if tokenizer_file is None:
        info = tokenfile.prepare_text(list(texts), out_path, dtype)
    else:
        info = tokenfile.prepare_tokenized(list(texts), out_path, tokenizer_file, dtype=dtype, eos=eos)
    click.echo(f"{info['path']}: {info['tokens']:,} tokens from {info['documents']} document(s), {info['dtype']}, "
               f"vocabulary {info['vocab_size']:,} ({info['tokenizer']}); sidecar {tokenfile.sidecar_path(out_path)}")


@main.command()
@click.argument("names", nargs=-1, required=True, metavar="NAME...",
                shell_complete=lambda ctx, param, incomplete: _complete_campaigns(ctx, incomplete))
@_db_options
@click.option("--kind", type=click.Choice(PLOT_KINDS), default="run", show_default=True,
              help="run: loss vs cumulative tokens of the long run (or --stage) across its attempts, each relaunch "
                   "marked with its cause and steps lost; progress: loss vs tokens of every stage and run; scaling: "
                   "tokens/s, efficiency, collective share vs nodes; steps: step time and loss vs step; goodput: "
                   "where each stage's wall time went.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("plots"),
              show_default=True, help="Directory for the PNG files.")
@click.option("--log-x", is_flag=True, help="Logarithmic token axis (progress).")
@click.option("--reference", "reference_file", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="A reference curve file (step|tokens,loss; optional run,stage,nodes columns) drawn in black.")
@click.option("--stage", help="The stage to draw (run, steps: default the long run, else the stage with the most "
              "steps); the file is then NAME-STAGE-KIND.png.", **STAGE_COMPLETE)
@click.option("--max-points", type=click.IntRange(min=10), default=4000, show_default=True,
              help="Points per campaign, sampled in the database.")
@_endpoint_option
@_errors
def plot(names: tuple[str, ...], db_url: str | None, workdir: Path, kind: str, out_dir: Path, log_x: bool,
         reference_file: Path | None, stage: str | None, max_points: int, endpoint: str | None) -> None:
    """Draw campaigns from the ledger as a PNG in --out: by default the campaign's chart (its
    long run's loss against tokens across attempts, each relaunch marked and labelled).

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
    click.echo(str(commands.draw_plot(data, kind, out_dir, reference_file=reference_file, log_x=log_x,
                                      stage=stage)))


@main.command()
@click.argument("name")
@_db_options
@click.option("--html", "out", required=True, type=click.Path(dir_okay=False, path_type=Path), metavar="OUT.html",
              help="The page to write (its folder is made if missing).")
@click.option("--watch", is_flag=True,
              help="Rewrite OUT.html every --interval seconds until the campaign stops running (Ctrl-C stops); "
                   "each write replaces the file at once, and the page reloads itself meanwhile.")
@click.option("--interval", type=click.FloatRange(min=1), default=30.0, show_default=True, metavar="S",
              help="Seconds between rewrites with --watch.")
@click.option("--count", type=click.IntRange(min=1), metavar="N", help="With --watch: stop after N writes.")
@click.option("--max-points", type=click.IntRange(min=10), default=2000, show_default=True, metavar="N",
              help="Points per plot, sampled in the database.")
@_errors
def report(name: str, db_url: str | None, workdir: Path, out: Path, watch: bool, interval: float, count: int | None,
           max_points: int) -> None:
    """Write campaign NAME as one self-contained HTML page to mail or put on a web space.

    \b
    campaign report long-run-7b --html report.html
    campaign report long-run-7b --html ~/public_html/run.html --watch --interval 60

    The page holds the stages with their verdicts and goodput, plots (loss against tokens,
    step time and loss, goodput, scaling) as inline images, every attempt, each fault with
    its evidence (the finding, the suspect nodes, the log lines), the excluded nodes and
    the recent events. It loads nothing from anywhere and runs no script. Reads only the
    ledger (no Parsl, no torch), like `campaign status`."""
    from campaign import commands, htmlreport, names

    names.check(name, "NAME")
    led = _open(db_url, workdir, create=False)
    try:
        def fetch() -> dict[str, Any]:
            return commands.report_data(led, name, max_points=max_points)

        if watch:
            htmlreport.watch(fetch, out, interval=interval, count=count, notify=lambda line: click.echo(line, err=True))
        else:
            htmlreport.write(out, htmlreport.render(fetch()))
            click.echo(str(out))
    finally:
        led.close()


@main.group()
def ledger() -> None:
    """Move ledger data out (CSV/JSON) and reference curves in."""


@ledger.command("export")
@CAMPAIGN_NAME
@_db_options
@click.option("--format", "fmt", type=click.Choice(["csv", "json", "tensorboard"]), default="csv", show_default=True,
              help="tensorboard: event files in the folder --out, as `submit --tensorboard` writes them live.")
@click.option("--what", type=click.Choice(EXPORT_KINDS), default="steps", show_default=True,
              help="steps: every step row; attempts: one row per attempt; nodes: per node used or excluded.")
@click.option("--out", "out_file", type=click.Path(path_type=Path),
              help="File to write (default: stdout); with --format tensorboard, a folder.")
@_endpoint_option
@_errors
def ledger_export(name: str, db_url: str | None, workdir: Path, fmt: str, what: str, out_file: Path | None,
                  endpoint: str | None) -> None:
    """Write campaign NAME's steps, attempts or nodes as CSV or JSON (streamed), or its steps
    and events as TensorBoard event files (--format tensorboard --out DIR)."""
    from campaign import commands

    if fmt == "tensorboard":
        _export_tensorboard(name, db_url, workdir, out_file, endpoint)
        return
    if out_file is not None and out_file.is_dir():
        raise click.BadParameter(f"{out_file} is a folder; name a file", param_hint="--out")
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


def _export_tensorboard(name: str, db_url: str | None, workdir: Path, out: Path | None, endpoint: str | None) -> None:
    from campaign import commands

    if out is None or endpoint:
        raise click.UsageError("--format tensorboard writes a folder here: give --out DIR (and no --endpoint)")
    led = _open(db_url, workdir, create=False)
    try:
        steps, events = commands.export_tensorboard(led, name, out)
    finally:
        led.close()
    click.echo(f"{out / name}: {steps} step(s), {events} event(s); tensorboard --logdir {out}", err=True)


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
