"""The `campaign` command line.

    campaign submit examples/local.yaml        run a campaign (stages in order), recorded in the ledger
    campaign status [NAME] [--json]            what the ledger says (no Parsl, no torch: instant)
    campaign validate FILE                     check a campaign file; print the resolved spec or the errors
    campaign db upgrade|current                manage the ledger's schema
    campaign nodes list|exclude|include        the nodes the ledger tells every campaign not to use

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

    A campaign is one YAML file: a model, a site (local, ...), and stages that must pass in
    order (smoke test, ...). Start with `campaign submit examples/local.yaml`, then
    `campaign status`.
    """


@main.command()
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@_db_options
@click.option("--dry-run", is_flag=True, help="Print what each stage would launch; submit and record nothing.")
@click.option("--new-version", is_flag=True, help="The file changed: record it as a new version of the campaign.")
@click.option("--quiet", "-q", is_flag=True, help="Print only errors and the final summary's exit code.")
@_errors
def submit(file: Path, db_url: str | None, workdir: Path, dry_run: bool, new_version: bool, quiet: bool) -> None:
    """Run the campaign in FILE: its stages in order, skipping those already passed.

    The same file again continues the same campaign; a changed file under the same name is
    refused unless --new-version. Exit code 0 if every stage passed, 1 if one failed.
    """
    from campaign import spec as spec_mod

    spec = spec_mod.load(file)
    spec_mod.check_faults_allowed(spec, str(file))
    if dry_run:
        from campaign.dryrun import render_dry_run

        click.echo(render_dry_run(spec, workdir))
        return
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
@click.argument("name", required=False)
@_db_options
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (a fixed shape scripts can rely on).")
@_errors
def status(name: str | None, db_url: str | None, workdir: Path, as_json: bool) -> None:
    """Show the campaigns in the ledger, or one campaign's stages in detail.

    With --json and a NAME, prints {"name", "state", "stages": [{"name", "kind", "state",
    "attempts", "tokens", "last_loss", "verdict"}], "excluded_nodes"}.
    """
    from campaign.errors import CampaignError as _CE
    from campaign.ledger import queries as q

    ledger = _open(db_url, workdir, create=False)
    try:
        with ledger.session() as s:
            if name is None:
                rows = [_campaign_row(s, c) for c in q.list_campaigns(s)]
            else:
                c = q.get_campaign(s, name)
                if c is None:
                    known = ", ".join(x.name for x in q.list_campaigns(s)) or "none"
                    raise _CE(f"no campaign named {name!r} in {ledger.display_url} (campaigns: {known})")
                summary = q.summarize_campaign(s, c)
    finally:
        ledger.close()
    if as_json:
        click.echo(json.dumps(rows if name is None else summary, indent=2))
        return
    from campaign.views import campaign_table, campaigns_table, console

    console().print(campaigns_table(rows) if name is None else campaign_table(summary))


def _campaign_row(s: Any, c: Any) -> dict[str, Any]:
    from campaign.ledger import queries as q

    runs = q.current_stage_runs(s, c)
    reached = next((r for r in reversed(runs) if r.state != "pending"), None)
    return {"name": c.name, "site": c.site, "state": c.state, "stage": reached.name if reached else None,
            "tokens": int(sum(r.tokens for r in runs)), "last_loss": reached.last_loss if reached else None,
            "updated": c.updated.strftime("%Y-%m-%d %H:%M")}


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
    from rich.console import Console
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
    Console(highlight=False).print(t)


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


if __name__ == "__main__":
    main()
