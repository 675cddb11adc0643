"""Remote control without the cloud: the stand-in executor (fake_executor.py) round-trips
every call through the SDK's serializer in another process. Fast checks here; the whole
submit-status-plot-cancel path is in test_remote_e2e.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ENDPOINT_ID, FakeEndpoint
from fake_executor import FakeExecutor, RemoteTaskFailed

from campaign import remote
from campaign.errors import RemoteError



def defined_in_a_test_module() -> str:
    return "the endpoint cannot import this module"


def test_the_stand_in_fails_what_a_real_call_could_not_carry() -> None:
    ex = FakeExecutor(ENDPOINT_ID, serializer=remote._serializer(by_source=False),
                      result_serializers=["globus_compute_sdk.serialize.JSONData"])
    try:
        with pytest.raises(RemoteTaskFailed, match="ModuleNotFoundError"):
            ex.submit(defined_in_a_test_module).result()  # pickled by reference, unknown over there
        with pytest.raises(Exception, match="Data serialization strategy JSONData failed"):
            ex.submit(remote.read_status, name=Path("not-json"))
        assert ex.submit(remote.endpoint_versions).result()["python"]  # by reference: campaign is installed
    finally:
        ex.shutdown()


def test_answers_over_the_limit_are_refused_with_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(remote, "ANSWER_LIMIT_BYTES", 1000)
    big = remote._answer(lambda: {"rows": ["x" * 100] * 20})
    out = big()
    assert out["ok"] is False and "over the" in out["error"] and "10 MiB result limit" in out["error"]


def test_a_parsl_version_mismatch_is_explained(endpoint: FakeEndpoint, run_cli) -> None:
    endpoint.fake_versions.update(parsl="2025.1.6")
    code, out, err = run_cli("status", "--endpoint", ENDPOINT_ID)
    assert code == 2, out + err
    assert "runs other versions than this client" in err
    line = next(ln for ln in err.splitlines() if ln.strip().startswith("parsl"))
    assert "2025.1.6" in line and "2026.10.26" in line and "campaign pins Parsl exactly" in line
    assert "globus-compute-endpoint restart" in err
    assert endpoint.calls == ["endpoint_versions"], "nothing else is sent to a mismatched endpoint"


def test_campaign_missing_on_the_endpoint_is_reported_not_a_pickling_error(endpoint: FakeEndpoint, run_cli) -> None:
    endpoint.fake_versions.update(campaign=None)
    code, _, err = run_cli("status", "--endpoint", ENDPOINT_ID)
    assert code == 2
    assert "campaign" in err and "not installed" in err, err


def test_not_a_uuid(run_cli) -> None:
    code, _, err = run_cli("status", "--endpoint", "my-endpoint")
    assert code == 2 and "is not a UUID" in err


def test_status_of_a_missing_ledger_says_so(endpoint: FakeEndpoint, run_cli, tmp_path: Path) -> None:
    code, _, err = run_cli("status", "--endpoint", ENDPOINT_ID, "--workdir", tmp_path / "nothing-here")
    assert code == 2 and f"on endpoint {ENDPOINT_ID}:" in err, err


def _no_credentials_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GLOBUS_", "CAMPAIGN_"))}
    env.update(HOME=str(tmp_path), GLOBUS_COMPUTE_USER_DIR=str(tmp_path / ".globus_compute"), **extra)
    return env


@pytest.mark.parametrize("command", [["status"], ["cancel", "x"]])
def test_missing_credentials_fail_fast_without_a_terminal(tmp_path: Path, command: list[str]) -> None:
    """stdin is an open pipe nobody writes to: a login prompt would wait forever."""
    start = time.monotonic()
    p = subprocess.Popen([sys.executable, "-m", "campaign.cli", *command, "--endpoint", ENDPOINT_ID],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=_no_credentials_env(tmp_path), cwd=tmp_path)
    try:
        out, err = p.communicate(timeout=15)
    finally:
        p.kill()
    elapsed = time.monotonic() - start
    assert p.returncode == 2, out + err
    assert elapsed < 5, f"took {elapsed:.1f} s"
    assert "no Globus credentials" in err and "GLOBUS_COMPUTE_CLIENT_ID" in err and "Traceback" not in err


def test_a_secret_without_a_client_id_is_refused(tmp_path: Path) -> None:
    p = subprocess.run([sys.executable, "-m", "campaign.cli", "status", "--endpoint", ENDPOINT_ID],
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30, check=False,
                       env=_no_credentials_env(tmp_path, GLOBUS_COMPUTE_CLIENT_SECRET="s3cret"))
    assert p.returncode == 2 and "GLOBUS_COMPUTE_CLIENT_ID is not" in p.stderr


def test_version_rules_compare_what_matters() -> None:
    here = {"python": "3.11.7", "dill": "0.3.9", "globus-compute-sdk": "4.19.0", "campaign": "0.1.0", "parsl": "2026.10.26"}
    assert remote.version_problems(here, {**here, "python": "3.11.9", "globus-compute-sdk": "4.20.1"}) == []
    problems = remote.version_problems(here, {**here, "python": "3.12.1", "dill": "0.4.0"})
    assert [p.split()[0] for p in problems] == ["python", "dill"]


def test_endpoint_errors_keep_their_message_and_exit_code(endpoint: FakeEndpoint, tmp_path: Path) -> None:
    from campaign.ledger import default_url, open_ledger

    open_ledger(default_url(tmp_path)).close()
    with remote.Endpoint(ENDPOINT_ID) as ep:
        assert json.loads(json.dumps(ep.versions)) == ep.versions
        with pytest.raises(RemoteError, match="no campaign named 'nope'") as info:
            ep.call(remote.read_status, name="nope", workdir=str(tmp_path))
    assert info.value.exit_code == 2


def test_cancel_through_the_endpoint_stops_the_driver_holding_the_lease(endpoint: FakeEndpoint, run_cli,
                                                                        tmp_path: Path, lease_holder) -> None:
    """`cancel --endpoint` runs campaign.commands.cancel_campaign there (no CLI subprocess):
    the driver, a real process holding the lease, gets SIGTERM and records `cancelled`."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    driver = lease_holder(url, "held", create=True)
    code, out, err = run_cli("cancel", "held", "--endpoint", ENDPOINT_ID, "--db", url, "--wait", "30")
    assert code == 0, out + err
    assert out.splitlines() == [f"asked the driver of held (pid {driver.pid}) to stop", "held: cancelled"]
    assert driver.wait(timeout=10) == 0 and endpoint.calls[-1] == "cancel_driver"
    code, out, err = run_cli("cancel", "held", "--endpoint", ENDPOINT_ID, "--db", url)
    assert code == 2 and "'held' is not running (no driver holds it)" in err, out + err
