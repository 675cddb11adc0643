"""README's main job, `make demo`, run as a user runs it (issue 40: "the demo shows the tool's
point" and "`make demo` on a second run starts the demo over"): the Makefile's own demo target,
from a directory that is not the clone (only `examples/` is linked in, as `make demo` reads
`examples/local.yaml` relative to where it runs), with the venv the tests run in. Twice in the
same directory: the second run must forget the first and start over.

Each run: exit 0; a rescue checkpoint saved the hung attempt's last step; local-n1 excluded for
this campaign only, with its evidence; the long run relaunched after the drill on nodes without
local-n1; the resume test resumed bit for bit. The elapsed time of each run is printed (`-s`)
and recorded as a property (`demo_run_N_s`), not asserted.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import REPO, Workspace, ledger_view

pytestmark = pytest.mark.slow

DEMO = "local-demo"
DRILLED = "local-n1"
"""The Makefile's drill hangs rank 1, on local-n1 (2 nodes a stage, one rank a node)."""


def make_demo(cwd: Path, venv: Path, timeout: float = 600) -> tuple[int, str, float]:
    """`make demo` with the repository's Makefile in `cwd`; exit code, output, seconds. `-o`
    keeps make from (re)installing the venv (its rule would `pip install -e .` from `cwd`)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAMPAIGN_")}
    # The venv's `campaign` runs the tree under test (its editable install may serve another).
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    env["PYTHONUNBUFFERED"] = "1"
    argv = ["make", "-f", str(REPO / "Makefile"), "demo", f"VENV={venv}", "-o", f"{venv}/.installed"]
    started = time.monotonic()
    p = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)  # make, the drill and the driver: their own session
        out, _ = p.communicate()
        pytest.fail(f"make demo ran past {timeout} s:\n{out[-5000:]}")
    return p.returncode, out, time.monotonic() - started


def check_run(ws: Workspace, code: int, out: str) -> dict[str, Any]:
    """What one `make demo` must leave in the ledger; `status local-demo --json`."""
    assert code == 0, out[-5000:]
    status = ws.status(DEMO)
    view = ledger_view(ws, DEMO)
    assert status["state"] == "succeeded", out[-5000:]
    kinds = [kind for kind, _ in view["events"]]
    # The drill: the hung attempt's last step saved by a surviving rank, then the exclusion, then the relaunch.
    assert "rescue" in kinds and kinds.index("rescue") < kinds.index("node_excluded") < kinds.index("relaunch"), kinds
    [rescue] = [msg for kind, msg in view["events"] if kind == "rescue"]
    assert rescue.startswith("rescue checkpoint of step "), rescue
    [excluded] = [msg for kind, msg in view["events"] if kind == "node_excluded"]
    assert excluded.startswith(f"excluded {DRILLED} for campaign {DEMO} only (a drill)"), excluded
    assert f"lift: campaign nodes include {DRILLED} --site local" in excluded
    [relaunch] = [msg for kind, msg in view["events"] if kind == "relaunch"]
    assert relaunch.startswith("relaunch 1 (attempt 2) after hang (a drill): from the rescue checkpoint of step ")
    # The exclusion is this campaign's only (it goes with `forget`), with its evidence.
    assert [(e["node"], e["campaign_only"]) for e in status["exclusions"]] == [(DRILLED, True)]
    [row] = view["exclusions"]
    assert row["node"] == DRILLED and row["evidence"]["exit_class"] == "stalled", row
    assert row["evidence"]["drill"] == "`campaign inject hang` on rank 1" and row["evidence"]["stall"], row
    # The long run: attempt 1 on local-n1 stalled, attempt 2 (relaunch 1) on nodes without it, to the end.
    long_run = [a for a in status["attempts_detail"] if a["stage"] == "long-run"]
    assert [(a["number"], a["label"], a["state"]) for a in long_run] == [
        (1, "", "stalled"), (2, "relaunch 1", "succeeded")], long_run
    assert DRILLED in long_run[0]["nodes"] and DRILLED not in long_run[1]["nodes"] and len(long_run[1]["nodes"]) == 2
    stages = {s["name"]: s for s in status["stages"]}
    assert all(s["state"] == "passed" for s in stages.values()), stages
    assert stages["resume-test"]["verdict"].startswith("SIGKILL: resumed from step "), stages["resume-test"]
    assert ", equal bit for bit (the interrupted run's own steps " in stages["resume-test"]["verdict"]
    assert f"campaign {DEMO}" in out  # the Makefile ends with `campaign status local-demo`
    return status


def test_make_demo_shows_a_drill_and_starts_over_on_a_second_run(
        tmp_path: Path, record_property: Callable[[str, Any], None]) -> None:
    if shutil.which("make") is None:
        pytest.skip("no `make` on PATH")
    venv = Path(sys.prefix)
    assert (venv / "bin" / "campaign").is_file(), f"no campaign script in {venv}/bin: run the tests from the venv"
    (tmp_path / "examples").symlink_to(REPO / "examples")
    ws = Workspace(tmp_path)  # make demo's ledger: ./campaigns/ledger.db

    code, out, took = make_demo(tmp_path, venv)
    print(f"make demo, first run: {took:.1f} s", flush=True)
    record_property("demo_run_1_s", round(took, 1))
    first = check_run(ws, code, out)
    assert "forgot campaign" not in out  # nothing to forget the first time

    code, out, took = make_demo(tmp_path, venv)
    print(f"make demo, second run: {took:.1f} s", flush=True)
    record_property("demo_run_2_s", round(took, 1))
    assert code == 0, out[-5000:]
    forgot = [line for line in out.splitlines() if line.startswith(f"forgot campaign {DEMO}:")]
    assert forgot and f"{len(first['attempts_detail'])} attempt(s)" in forgot[0], out[:3000]
    assert "1 exclusion(s) of its own" in forgot[0] and str(ws.workdir / DEMO) in forgot[0], forgot
    second = check_run(ws, code, out)
    # Started over: attempts numbered from 1 again, and the first run's drill exclusion went with
    # it (the new long run's attempt 1 is on local-n1 again, as the first run's was).
    assert [a["number"] for a in second["attempts_detail"] if a["stage"] == "long-run"] == [1, 2]
    assert [a["number"] for a in second["attempts_detail"]] == [a["number"] for a in first["attempts_detail"]]
