"""Remote control through Globus Compute: `--endpoint UUID` on `submit`, `status`, `plot`,
`ledger export` and `cancel` (docs/remote.md sets up the endpoint on an Aurora login node).

    with Endpoint(uuid) as ep:                       # credentials, then a version report
        info = ep.call(start_driver, spec_text=..., filename=..., workdir="campaigns")

Two halves in one module, neither holding a command's logic (that is `campaign.commands`,
which the CLI calls too; the CLI renders what comes back):

* Endpoint functions run ON the endpoint host: thin wrappers of `campaign.commands`
  functions, plain module-level functions whose
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

import contextlib
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

from campaign import commands
from campaign.errors import CampaignError, RemoteError

RESULT_LIMIT_BYTES = 10 * 2**20
"""The Globus Compute service refuses task results larger than this (10 MiB)."""
ANSWER_LIMIT_BYTES = 8 * 2**20
"""Endpoint functions refuse to return more JSON than this (headroom for the envelope)."""
PAGE_ROWS = commands.PAGE_ROWS
"""Rows the client asks for in one page of `ledger export --what steps` (tests make it small)."""
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


@_answer
def start_driver(spec_text: str, filename: str, workdir: str = "campaigns", db_url: str | None = None,
                 new_version: bool = False) -> dict[str, Any]:
    """Start a detached `campaign submit` of the spec on this host, or attach to the driver
    that already holds the campaign's lease. Answers name, ledger, workdir, host, pid, log
    and `attached` (True: a driver was already running; nothing was started)."""
    from campaign import spec as spec_mod
    from campaign.errors import CampaignConflict
    from campaign.ledger import open_ledger

    from campaign import preflight

    spec = spec_mod.loads(spec_text, filename)
    wd, url = _where(workdir, db_url)
    # The submission's preflight, here where the paths, the scheduler and the ledger are the ones
    # the driver will use; before the work directory, the ledger or a job is made.
    findings = preflight.check(spec, preflight.Source.parse(spec_text, filename, wd / "specs"),
                               ledger=preflight.LedgerView(url, wd), workdir=wd, remote=True)
    preflight.refuse_if_any(findings, f"{filename} (on {os.uname().nodename})")
    wd.mkdir(parents=True, exist_ok=True)
    ledger = open_ledger(url)
    try:
        where = {"name": spec.name, "ledger": ledger.display_url, "workdir": str(wd),
                 "log": str(wd / spec.name / "driver.log"), "warnings": [f.text() for f in findings]}
        held = commands.live_driver(ledger, spec.name)
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
        held = commands.live_driver(ledger, name)
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
    with _ledger(workdir, db_url) as ledger:
        data = commands.status_data(ledger, name)
        driver = commands.live_driver(ledger, name) if name is not None else None
        return {"data": data, "ledger": ledger.display_url, "driver": driver}


@_answer
def read_plot_data(names: list[str], kind: str = "progress", stage: str | None = None, max_points: int = 4000,
                   workdir: str = "campaigns", db_url: str | None = None) -> dict[str, Any]:
    """`commands.plot_data` of the ledger on this host: what `campaign plot` draws."""
    with _ledger(workdir, db_url) as ledger:
        return commands.plot_data(ledger, names, kind, stage, max_points)


@_answer
def read_export_page(name: str, what: str = "steps", cursor: list[int] | None = None, workdir: str = "campaigns",
                     db_url: str | None = None, max_rows: int = commands.PAGE_ROWS,
                     max_bytes: int = commands.PAGE_BYTES) -> dict[str, Any]:
    """`commands.export_page` of the ledger on this host: one page of `campaign ledger export`."""
    with _ledger(workdir, db_url) as ledger:
        return commands.export_page(ledger, name, what, cursor, max_rows=max_rows, max_bytes=max_bytes)


@_answer
def cancel_driver(name: str, workdir: str = "campaigns", db_url: str | None = None, wait_s: float = 60.0) -> dict[str, Any]:
    """`commands.cancel_campaign` on this host (where the driver runs); answers its output."""
    lines: list[str] = []
    with _ledger(workdir, db_url) as ledger:
        state = commands.cancel_campaign(ledger, name, wait_s, notify=lines.append)
    return {"output": "\n".join([*lines, f"{name}: {state}"]), "state": state}


@contextlib.contextmanager
def _ledger(workdir: str, db_url: str | None) -> Iterator[Any]:
    """The existing ledger on this host (as `_where` finds it), closed afterwards."""
    from campaign.ledger import open_ledger

    ledger = open_ledger(_where(workdir, db_url)[1], create=False)
    try:
        yield ledger
    finally:
        ledger.close()


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


# --- the client halves (campaign.cli calls these when --endpoint is given) --------------

def submit(endpoint_id: str, file: Path, workdir: Path, db_url: str | None, new_version: bool) -> dict[str, Any]:
    """`campaign submit FILE --endpoint UUID`: the spec (validated here) goes with the call;
    `start_driver`'s answer."""
    with Endpoint(endpoint_id) as ep:
        return ep.call(start_driver, spec_text=file.read_text(), filename=file.name, workdir=str(workdir),
                       db_url=db_url, new_version=new_version)


def status_data(ep: Endpoint, name: str | None, workdir: Path, db_url: str | None) -> Any:
    """`commands.status_data` of the endpoint's ledger (the CLI renders it here)."""
    return ep.call(read_status, name=name, workdir=str(workdir), db_url=db_url)["data"]


def plot_data(endpoint_id: str, names: tuple[str, ...], workdir: Path, db_url: str | None, kind: str, stage: str | None,
              max_points: int) -> dict[str, Any]:
    """`commands.plot_data` of the endpoint's ledger (the figure is drawn here)."""
    with Endpoint(endpoint_id) as ep:
        return ep.call(read_plot_data, names=list(names), kind=kind, stage=stage, max_points=max_points,
                       workdir=str(workdir), db_url=db_url)


def export_rows(ep: Endpoint, name: str, what: str, workdir: Path, db_url: str | None) -> Iterator[dict[str, Any]]:
    """Every row of `ledger export --what WHAT` of the endpoint's ledger, a page (at most
    PAGE_ROWS rows) per call."""
    return commands.iter_pages(lambda cursor: ep.call(read_export_page, name=name, what=what, cursor=cursor,
                                                      workdir=str(workdir), db_url=db_url, max_rows=PAGE_ROWS))


def cancel(endpoint_id: str, name: str, workdir: Path, db_url: str | None, wait_s: float) -> str:
    """`campaign cancel NAME --endpoint UUID`: the same cancel, run where the driver runs; its output."""
    with Endpoint(endpoint_id, timeout_s=max(CALL_TIMEOUT_S, wait_s + 120)) as ep:
        return str(ep.call(cancel_driver, name=name, workdir=str(workdir), db_url=db_url, wait_s=wait_s)["output"])
