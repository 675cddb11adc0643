"""Remote control through Globus Compute: `--endpoint UUID` on `submit`, `status`, `plot`,
`ledger export` and `cancel` (docs/remote.md sets up the endpoint on an Aurora login node).

    with Endpoint(uuid) as ep:                       # credentials, then a version report
        info = ep.call(start_driver, spec_text=..., filename=..., workdir="campaigns")

Two halves in one module:

* Endpoint functions run ON the endpoint host. They are plain module-level functions whose
  arguments and results are JSON data (the client sends both through the SDK's JSONData
  strategy, so nothing else survives); they travel by reference (DillCode, the SDK's
  default), so the endpoint imports them from its own installed `campaign`. Each answers
  {"ok": True, ...} or {"ok": False, "error", "exit_code"}; every answer is checked
  against the service's result limit. `endpoint_versions` alone travels as source text
  (PureSourceTextInspect) and needs only the standard library: it runs even where
  `campaign` is missing or another release, which is what it reports.
* The client (`Endpoint`): credentials are checked before any client exists, so a shell
  without a TTY and without tokens fails at once instead of waiting on a browser; one
  Executor comes from `executor_factory` (tests put a stand-in there); the endpoint's
  versions are compared with this process's before the first real call.

The detached driver is the ordinary `python -m campaign.cli submit` on the endpoint host,
in its own session with its log in WORKDIR/NAME/driver.log, so it outlives the function
that started it; its ledger lease is what makes a second submit attach instead.
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from campaign.errors import CampaignError, RemoteError

RESULT_LIMIT_BYTES = 10 * 2**20
"""The Globus Compute service refuses task results larger than this (10 MiB)."""
ANSWER_LIMIT_BYTES = 8 * 2**20
"""Endpoint functions refuse to return more JSON than this (headroom for the envelope)."""
PAGE_BYTES = 2 * 2**20
"""One page of `ledger export --what steps` is cut at about this much JSON."""
PAGE_ROWS = 20_000
DRIVER_START_S = 60.0
"""How long `start_driver` waits for the new driver to take the campaign's lease."""
CALL_TIMEOUT_S = float(os.environ.get("CAMPAIGN_REMOTE_TIMEOUT", "300"))
"""How long the client waits for one answer (a cold endpoint first starts a worker)."""
UUID_RE = re.compile(r"^[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}$")
NO_CREDENTIALS = (
    "no Globus credentials, and this shell cannot log in (stdin is not a terminal).\n"
    "  non-interactive use: export GLOBUS_COMPUTE_CLIENT_ID=... GLOBUS_COMPUTE_CLIENT_SECRET=...\n"
    "                       (a client identity: https://app.globus.org/settings/developers)\n"
    "  or log in once from a terminal: python -c 'from globus_compute_sdk import Client; Client()'\n"
    "  tokens are kept in $GLOBUS_COMPUTE_USER_DIR (default ~/.globus_compute/storage.db)"
)


# --- endpoint functions: run on the endpoint host; JSON in, JSON out --------------------

def endpoint_versions() -> dict:
    """What the endpoint's workers run. Travels as source text and imports only the
    standard library, so it answers even where `campaign` is missing."""
    import importlib.metadata as md
    import platform
    import socket
    import sys

    def version(dist):
        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            return None

    names = ("campaign", "parsl", "globus-compute-sdk", "globus-compute-endpoint", "dill")
    return {"python": platform.python_version(), "executable": sys.executable, "host": socket.gethostname(),
            **{n: version(n) for n in names}}


def _answer(fn: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
    """An endpoint function's answer: {"ok": True, ...}, or a CampaignError as
    {"ok": False, "error", "exit_code"}; refused when larger than ANSWER_LIMIT_BYTES."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> dict[str, Any]:
        try:
            out = {"ok": True, **fn(*args, **kwargs)}
        except CampaignError as e:
            return {"ok": False, "error": str(e), "exit_code": e.exit_code}
        size = len(json.dumps(out))
        if size > ANSWER_LIMIT_BYTES:
            return {"ok": False, "exit_code": 2,
                    "error": f"{fn.__name__} would return {size / 2**20:.1f} MiB, over the {ANSWER_LIMIT_BYTES // 2**20} MiB "
                             f"this tool allows under the service's {RESULT_LIMIT_BYTES // 2**20} MiB result limit; "
                             "ask for less (fewer campaigns, --max-points)"}
        return out

    return wrapper


def _where(workdir: str, db_url: str | None) -> tuple[Path, str]:
    """The work directory and ledger URL on this host: a relative workdir is under $HOME
    (an endpoint worker's cwd is the endpoint's own), the ledger as the CLI resolves it."""
    from campaign.ledger import default_url

    wd = Path(workdir).expanduser()
    wd = wd if wd.is_absolute() else Path.home() / wd
    return wd, db_url or os.environ.get("CAMPAIGN_DB_URL") or default_url(wd)


def _cli(wd: Path, url: str, *argv: str) -> list[str]:
    return [sys.executable, "-m", "campaign.cli", *argv, "--workdir", str(wd), "--db", url]


def _driver(ledger: Any, name: str) -> dict[str, Any] | None:
    """The live driver of campaign `name` (its lease), or None."""
    from campaign.lease import is_live
    from campaign.ledger import queries as q

    with ledger.session() as s:
        c = q.get_campaign(s, name)
        lease = q.get_lease(s, c) if c is not None else None
        if lease is None or not is_live(lease):
            return None
        return {"host": lease.host, "pid": lease.pid, "digest": c.spec_digest}


@_answer
def start_driver(spec_text: str, filename: str, workdir: str = "campaigns", db_url: str | None = None,
                 new_version: bool = False) -> dict[str, Any]:
    """Start a detached `campaign submit` of the spec on this host, or attach to the driver
    that already holds the campaign's lease. Answers name, ledger, workdir, host, pid, log
    and `attached` (True: a driver was already running; nothing was started)."""
    from campaign import spec as spec_mod
    from campaign.errors import CampaignConflict
    from campaign.ledger import open_ledger

    spec = spec_mod.loads(spec_text, filename)
    wd, url = _where(workdir, db_url)
    wd.mkdir(parents=True, exist_ok=True)
    ledger = open_ledger(url)
    try:
        where = {"name": spec.name, "ledger": ledger.display_url, "workdir": str(wd),
                 "log": str(wd / spec.name / "driver.log")}
        held = _driver(ledger, spec.name)
        if held is not None:
            if held["digest"] != spec.digest() and not new_version:
                raise CampaignConflict(f"campaign {spec.name!r} is running there with a different spec; "
                                       f"`campaign cancel {spec.name} --endpoint ...` first, or rename it")
            return {**where, "attached": True, "host": held["host"], "pid": held["pid"]}
        path = wd / "specs" / f"{spec.name}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(spec_text)
        proc = _spawn(_cli(wd, url, "submit", str(path), *(["--new-version"] if new_version else [])), Path(where["log"]))
        return {**where, **_await_lease(ledger, spec.name, proc, Path(where["log"])), "spec_file": str(path)}
    finally:
        ledger.close()


def _spawn(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    """Start `argv` detached: its own session (no hangup or group kill from the endpoint
    worker), stdin closed, stdout and stderr appended to `log`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        out.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(argv)}\n".encode())
        out.flush()
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                cwd=log.parent, start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _await_lease(ledger: Any, name: str, proc: subprocess.Popen[bytes], log: Path) -> dict[str, Any]:
    """Wait until the new driver holds the lease (or lost it to another, or exited)."""
    end = time.monotonic() + DRIVER_START_S
    while time.monotonic() < end:
        held = _driver(ledger, name)
        if held is not None:
            return {"attached": held["pid"] != proc.pid, "host": held["host"], "pid": held["pid"]}
        code = proc.poll()
        if code == 0:  # nothing left to run: every stage had passed
            return {"attached": False, "host": os.uname().nodename, "pid": proc.pid, "exit_code": 0}
        if code is not None:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
            raise CampaignError(f"the driver exited with code {code} before taking the lease; {log} ends:\n{tail}")
        time.sleep(0.2)
    return {"attached": False, "host": os.uname().nodename, "pid": proc.pid,
            "note": f"started, but it held no lease after {DRIVER_START_S:g} s; see {log}"}


@_answer
def read_status(name: str | None, workdir: str = "campaigns", db_url: str | None = None) -> dict[str, Any]:
    """`campaign status [NAME] --json` of the ledger on this host, plus its live driver."""
    from campaign.ledger import open_ledger
    from campaign.ledger import queries as q

    ledger = open_ledger(_where(workdir, db_url)[1], create=False)
    try:
        with ledger.session() as s:
            if name is None:
                return {"data": [q.summarize_campaign_row(s, c) for c in q.list_campaigns(s)], "ledger": ledger.display_url}
            c = q.get_campaign(s, name)
            if c is None:
                known = ", ".join(x.name for x in q.list_campaigns(s)) or "none"
                raise CampaignError(f"no campaign named {name!r} in {ledger.display_url} (campaigns: {known})")
            data = q.describe_campaign(s, c)
        return {"data": data, "ledger": ledger.display_url, "driver": _driver(ledger, name)}
    finally:
        ledger.close()


@_answer
def read_plot_data(names: list[str], kind: str = "progress", stage: str | None = None, max_points: int = 4000,
                   workdir: str = "campaigns", db_url: str | None = None) -> dict[str, Any]:
    """What `campaign plot` draws, from the ledger on this host: `tables` (scaling) or
    `series` (progress, steps; downsampled in SQL to `max_points` per campaign)."""
    from campaign.ledger import open_ledger
    from campaign.ledger import queries as q

    ledger = open_ledger(_where(workdir, db_url)[1], create=False)
    try:
        with ledger.session() as s:
            found = q.find_campaigns(s, tuple(names), ledger.display_url)
            out: dict[str, Any] = {"names": [c.name for c in found]}
            if kind == "scaling":
                out["tables"] = [(f"{c.name} / {r.name}" if len(found) > 1 else r.name, r.numbers["table"])
                                 for c in found for r in q.current_stage_runs(s, c)
                                 if r.kind == "scaling" and (r.numbers or {}).get("table")]
            else:
                columns = ("loss", "step_time_s") if kind == "steps" else ("loss",)
                out["series"] = [q.sample_campaign_steps(s, c, stage=stage or (q.busiest_stage(s, c) if kind == "steps" else None),
                                                         max_points=max_points, columns=columns) for c in found]
            return out
    finally:
        ledger.close()


@_answer
def read_export_page(name: str, what: str = "steps", cursor: list[int] | None = None, workdir: str = "campaigns",
                     db_url: str | None = None, max_rows: int = PAGE_ROWS, max_bytes: int = PAGE_BYTES) -> dict[str, Any]:
    """One page of `campaign ledger export`: `rows` and the `cursor` of the next page (None:
    the last). Steps are paged by (attempt, step) on the index; attempts and nodes come whole."""
    from campaign.ledger import open_ledger
    from campaign.ledger import queries as q

    ledger = open_ledger(_where(workdir, db_url)[1], create=False)
    try:
        with ledger.session() as s:
            c = q.find_campaigns(s, (name,), ledger.display_url)[0]
            if what == "attempts":
                return {"rows": q.describe_campaign(s, c)["attempts_detail"], "cursor": None}
            if what == "nodes":
                return {"rows": q.list_campaign_nodes(s, c), "cursor": None}
            rows, nxt = _steps_page(s, c, cursor, max_rows, max_bytes)
            return {"rows": rows, "cursor": nxt}
    finally:
        ledger.close()


def _steps_page(s: Any, c: Any, cursor: list[int] | None, max_rows: int,
                max_bytes: int) -> tuple[list[dict[str, Any]], list[int] | None]:
    """Rows shaped like `queries.iter_campaign_steps`, from attempt index cursor[0] after
    step cursor[1], until max_rows or about max_bytes of JSON."""
    import sqlalchemy as sa

    from campaign.ledger import queries as q
    from campaign.ledger.models import StepMetric

    first, after = cursor or (0, None)
    pairs = q.list_attempts(s, c)
    rows: list[dict[str, Any]] = []
    size = 0
    for i in range(first, len(pairs)):
        run, a = pairs[i]
        query = (sa.select(StepMetric.step, StepMetric.tokens, *(getattr(StepMetric, f) for f in q.METRIC_FIELDS))
                 .where(StepMetric.attempt_id == a.id).order_by(StepMetric.step).limit(max_rows - len(rows)))
        if i == first and after is not None:
            query = query.where(StepMetric.step > after)
        for row in s.execute(query):
            out = {"stage": run.name, "attempt": a.number, "label": a.label, "nodes": q.attempt_node_count(a),
                   "step": row[0], "tokens": a.tokens_base + row[1], "attempt_tokens": row[1],
                   **dict(zip(q.METRIC_FIELDS, row[2:]))}
            rows.append(out)
            size += len(json.dumps(out))
            if len(rows) >= max_rows or size >= max_bytes:
                return rows, [i, int(row[0])]
    return rows, None


@_answer
def cancel_driver(name: str, workdir: str = "campaigns", db_url: str | None = None, wait_s: float = 60.0) -> dict[str, Any]:
    """`campaign cancel NAME` on this host (where the driver runs); answers its output."""
    wd, url = _where(workdir, db_url)
    p = subprocess.run(_cli(wd, url, "cancel", name, "--wait", str(wait_s)), capture_output=True, text=True,
                       stdin=subprocess.DEVNULL, timeout=wait_s + 60, check=False)
    if p.returncode != 0:
        err = p.stderr.strip().removeprefix("error: ")
        raise RemoteError(err or f"`campaign cancel {name}` exited with {p.returncode}")
    return {"output": p.stdout.strip()}


# --- the client -------------------------------------------------------------------------

def globus_executor(endpoint_id: str) -> Any:
    """A real `globus_compute_sdk.Executor` for `endpoint_id`, after the credentials check."""
    from globus_compute_sdk import Executor

    return Executor(endpoint_id=endpoint_id, client=_client(), serializer=_serializer(by_source=False),
                    result_serializers=["globus_compute_sdk.serialize.JSONData"])


executor_factory: Callable[[str], Any] = globus_executor
"""Makes the Executor an `Endpoint` uses; tests replace it with a stand-in (tests/remote)."""


def _client() -> Any:
    """A globus_compute_sdk Client that will not wait on a browser: with
    GLOBUS_COMPUTE_CLIENT_ID/SECRET a client identity; else stored tokens; else a login,
    only where stdin is a terminal. The SDK asks for a login when a call first needs
    tokens (GlobusApp.login_required), so that is checked here, before any call."""
    cid, secret = os.environ.get("GLOBUS_COMPUTE_CLIENT_ID"), os.environ.get("GLOBUS_COMPUTE_CLIENT_SECRET")
    if secret and not cid:
        raise RemoteError("GLOBUS_COMPUTE_CLIENT_SECRET is set but GLOBUS_COMPUTE_CLIENT_ID is not: "
                          "set both (a client identity) or neither (your own login)")
    from globus_compute_sdk import Client

    client = Client(do_version_check=False)  # the version check is a web call, which would log in
    if cid and secret:
        return client
    try:
        needs_login = client.app is not None and client.app.login_required()
    except Exception as e:  # an unreadable token store is the same problem: no usable tokens
        raise RemoteError(f"cannot read the stored Globus tokens ({type(e).__name__}: {e})\n{NO_CREDENTIALS}") from e
    if needs_login and not sys.stdin.isatty():
        raise RemoteError(NO_CREDENTIALS)
    return client


def _serializer(*, by_source: bool) -> Any:
    """JSON for arguments (and results, via result_serializers); code by reference, or as
    source text for `endpoint_versions`."""
    from globus_compute_sdk.serialize import (
        ComputeSerializer,
        DillCode,
        JSONData,
        PureSourceTextInspect,
    )

    return ComputeSerializer(strategy_code=PureSourceTextInspect() if by_source else DillCode(), strategy_data=JSONData())


def local_versions() -> dict[str, Any]:
    return endpoint_versions()


# (name, how much must agree, why) for each version the two sides must share.
VERSION_RULES = (
    ("python", "minor", ("functions travel pickled by reference (dill); a pickle made by one Python minor "
                         "release is not promised to load in another")),
    ("dill", "exact", "globus-compute-sdk pins dill; the endpoint unpickles what this client pickles"),
    ("globus-compute-sdk", "major", "the endpoint must read this SDK's task and serializer formats"),
    ("campaign", "exact", "the endpoint runs this release's functions, spec checks and ledger schema"),
    ("parsl", "exact", ("campaign pins Parsl exactly: the driver on the endpoint must run the Parsl release "
                        "this client validated the spec with (and its workers the same one)")),
)


def version_problems(here: dict[str, Any], there: dict[str, Any]) -> list[str]:
    """One line per version that differs where it matters; empty if compatible."""
    def part(v: str | None, how: str) -> tuple[str, ...] | None:
        if v is None:
            return None
        pieces = tuple(v.split("."))
        return pieces[:1] if how == "major" else pieces[:2] if how == "minor" else pieces

    lines = []
    for name, how, why in VERSION_RULES:
        if part(here.get(name), how) != part(there.get(name), how):
            lines.append(f"  {name:<20} here {here.get(name) or 'not installed':<14} endpoint "
                         f"{there.get(name) or 'not installed':<14} {why}")
    return lines


class Endpoint:
    """One Globus Compute endpoint, used for a few calls: `with Endpoint(uuid) as ep: ep.call(fn, **kw)`."""

    def __init__(self, endpoint_id: str, *, factory: Callable[[str], Any] | None = None,
                 timeout_s: float = CALL_TIMEOUT_S) -> None:
        if not UUID_RE.match(endpoint_id.strip()):
            raise RemoteError(f"--endpoint {endpoint_id!r} is not a UUID; `globus-compute-endpoint list` on the "
                              "endpoint's host shows it")
        self.endpoint_id, self.timeout_s = endpoint_id.strip(), timeout_s
        self.factory = factory or executor_factory
        self.executor: Any = None
        self.versions: dict[str, Any] = {}

    def __enter__(self) -> Endpoint:
        self.executor = self.factory(self.endpoint_id)
        try:
            self.check_versions()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.executor is not None:
            self.executor.shutdown(wait=False, cancel_futures=True)
            self.executor = None

    def check_versions(self) -> None:
        """Ask the endpoint what it runs; refuse, saying what differs and why it matters."""
        self.executor.serializer = _serializer(by_source=True)
        try:
            there = self._result(endpoint_versions, {})
        finally:
            self.executor.serializer = _serializer(by_source=False)
        self.versions = there
        here = local_versions()
        problems = version_problems(here, there)
        if problems:
            py = ".".join(here["python"].split(".")[:2])
            raise RemoteError(
                f"endpoint {self.endpoint_id} ({there.get('host')}, {there.get('executable')}) runs other versions "
                "than this client:\n" + "\n".join(problems) + f"\n  fix: in the endpoint's environment (Python {py}) "
                f"pip install campaign=={here['campaign']} (it pins parsl=={here['parsl']}), then restart the endpoint "
                "(`globus-compute-endpoint restart NAME`); or use a client with the endpoint's versions")

    def call(self, fn: Callable[..., Any], **kwargs: Any) -> dict[str, Any]:
        """Run endpoint function `fn(**kwargs)` there; its answer, or its error raised here."""
        out = self._result(fn, kwargs)
        if not isinstance(out, dict) or "ok" not in out:
            raise RemoteError(f"{fn.__name__} on endpoint {self.endpoint_id} answered {type(out).__name__}, not a dict")
        if not out["ok"]:
            err = RemoteError(f"on endpoint {self.endpoint_id}: {out['error']}")
            err.exit_code = int(out.get("exit_code", 2))
            raise err
        return out

    def _result(self, fn: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
        import concurrent.futures

        try:
            future = self.executor.submit(fn, **kwargs)
        except CampaignError:
            raise
        except Exception as e:
            raise RemoteError(f"cannot send {fn.__name__} to endpoint {self.endpoint_id}: {type(e).__name__}: {e}") from e
        try:
            return future.result(timeout=self.timeout_s)
        except concurrent.futures.TimeoutError:
            raise RemoteError(f"endpoint {self.endpoint_id} did not answer {fn.__name__} within {self.timeout_s:g} s "
                              "(CAMPAIGN_REMOTE_TIMEOUT); is it running? `globus-compute-endpoint list` on its host") from None
        except Exception as e:
            raise RemoteError(f"{fn.__name__} failed on endpoint {self.endpoint_id}: {type(e).__name__}: {e}") from e


# --- the commands' remote halves (campaign.cli calls these when --endpoint is given) ----

def _echo(text: str, err: bool = False) -> None:
    import click

    click.echo(text, err=err)


def submit_command(endpoint_id: str, file: Path, workdir: Path, db_url: str | None, new_version: bool) -> int:
    """`campaign submit FILE --endpoint UUID`: the spec (validated here) goes with the call."""
    with Endpoint(endpoint_id) as ep:
        info = ep.call(start_driver, spec_text=file.read_text(), filename=file.name, workdir=str(workdir),
                       db_url=db_url, new_version=new_version)
    if info.get("exit_code") == 0:
        _echo(f"{info['name']}: every stage had passed; nothing to run (ledger {info['ledger']})")
        return 0
    verb = "attached to the running driver of" if info["attached"] else "started a driver for"
    _echo(f"{verb} {info['name']} on {info['host']} (pid {info['pid']})")
    _echo(f"  ledger: {info['ledger']}\n  log:    {info['log']}")
    if info.get("note"):
        _echo(f"  note:   {info['note']}")
    _echo(f"  watch:  campaign status {info['name']} --endpoint {endpoint_id} --workdir {workdir}")
    return 0


def status_command(endpoint_id: str, name: str | None, workdir: Path, db_url: str | None, as_json: bool,
                   watch: bool, interval: float, count: int | None) -> None:
    from campaign.views import campaign_detail, campaigns_table, console

    def fetch() -> Any:
        return ep.call(read_status, name=name, workdir=str(workdir), db_url=db_url)["data"]

    with Endpoint(endpoint_id) as ep:
        if watch:
            from rich.text import Text

            from campaign.watch import watch as watch_loop

            render = (lambda d: Text(json.dumps(d, indent=2))) if as_json else (campaigns_table if name is None else campaign_detail)
            watch_loop(fetch, render, console(), interval=interval, count=count)
            return
        data = fetch()
    if as_json:
        _echo(json.dumps(data, indent=2))
    else:
        console().print(campaigns_table(data) if name is None else campaign_detail(data))


def plot_command(endpoint_id: str, names: tuple[str, ...], workdir: Path, db_url: str | None, kind: str, out_dir: Path,
                 log_x: bool, reference_file: Path | None, stage: str | None, max_points: int) -> Path:
    """`campaign plot ... --endpoint UUID`: the endpoint samples, this machine draws."""
    from campaign import export, plots

    with Endpoint(endpoint_id) as ep:
        data = ep.call(read_plot_data, names=list(names), kind=kind, stage=stage, max_points=max_points,
                       workdir=str(workdir), db_url=db_url)
    found = data["names"]
    if kind == "scaling":
        if not data["tables"]:
            raise CampaignError(f"no scaling table in {', '.join(found)}: run a scaling stage first")
        fig = plots.scaling_figure([tuple(t) for t in data["tables"]])
    elif kind == "steps":
        fig = plots.steps_figure(data["series"])
    else:
        ref = export.read_curves(reference_file) if reference_file else None
        fig = plots.progress_figure(data["series"], reference=ref, log_x=log_x)
    stem = "+".join(found) if len(found) <= 3 else f"{found[0]}+{len(found) - 1}-more"
    return plots.save(fig, out_dir / f"{stem}-{kind}.png")


def export_rows(ep: Endpoint, name: str, what: str, workdir: Path, db_url: str | None) -> Iterator[dict[str, Any]]:
    """Every row of `ledger export --what WHAT`, a page (at most PAGE_ROWS rows) per call."""
    cursor: list[int] | None = None
    while True:
        page = ep.call(read_export_page, name=name, what=what, cursor=cursor, workdir=str(workdir), db_url=db_url,
                       max_rows=PAGE_ROWS)
        yield from page["rows"]
        cursor = page["cursor"]
        if cursor is None:
            return


def export_command(endpoint_id: str, name: str, workdir: Path, db_url: str | None, fmt: str, what: str,
                   out_file: Path | None) -> int:
    """`campaign ledger export ... --endpoint UUID`, written here (file or stdout) as pages arrive."""
    from campaign import export
    from campaign.ledger.queries import EXPORT_STEP_COLUMNS

    columns = {"steps": EXPORT_STEP_COLUMNS, "attempts": export.ATTEMPT_COLUMNS, "nodes": export.NODE_COLUMNS}[what]
    with Endpoint(endpoint_id) as ep:
        out = out_file.open("w", newline="") if out_file else sys.stdout
        try:
            return export.write_rows(export_rows(ep, name, what, workdir, db_url), columns, fmt, out)
        finally:
            if out_file:
                out.close()


def cancel_command(endpoint_id: str, name: str, workdir: Path, db_url: str | None, wait_s: float) -> None:
    """`campaign cancel NAME --endpoint UUID`: the same cancel, run where the driver runs."""
    with Endpoint(endpoint_id, timeout_s=max(CALL_TIMEOUT_S, wait_s + 120)) as ep:
        out = ep.call(cancel_driver, name=name, workdir=str(workdir), db_url=db_url, wait_s=wait_s)
    _echo(out["output"])
