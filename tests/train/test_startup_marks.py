"""Start-up marks, compile-cache wiring and the fork server's device check (issue 41).

What needs a GPU (the compile cache's effect, CUDA under the warm start) is measured by
benchmarks/gpu_relaunch.py; here: the marks a CPU trainer writes, their arithmetic, where the
caches go, and the relaunch breakdown computed from a recorded attempt pair.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from train_helpers import REPO, tiny_config

from campaign.executors import warm
from campaign.train import compile_cache, marks

sys.path.insert(0, str(REPO / "benchmarks"))


def test_durations_run_from_the_previous_mark_present():
    m = {"process": 100.0, "main": 100.5, "imports": 102.0, "process_group": 103.0, "model_built": 104.0,
         "checkpoint_loaded": 106.5, "first_step": 116.5}
    d = marks.durations(m)
    # startup_check is missing: its time falls into model_built (from process_group)
    assert d == {"main": 0.5, "imports": 1.5, "process_group": 1.0, "model_built": 1.0,
                 "checkpoint_loaded": 2.5, "first_step": 10.0}


def test_marks_keep_the_first_time_and_refuse_unknown_phases():
    m = marks.Marks()
    m.mark("main")
    first = m.wall["main"]
    time.sleep(0.01)
    m.mark("main")
    assert m.wall["main"] == first
    with pytest.raises(ValueError, match="unknown start-up phase"):
        m.mark("lunch")
    doc = m.document(warm=True)
    assert doc["warm"] is True and "main" in doc["marks"] and "main" in doc["mono"]


def test_process_start_is_when_the_process_began():
    code = "import time; t=time.time(); from campaign.train import marks; print(marks.process_start_wall(), t)"
    before = time.time()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO,
                         env={**os.environ, "PYTHONPATH": str(REPO)}).stdout.split()
    start, first_line = float(out[0]), float(out[1])
    # created after we asked for it (ticks of 10 ms), before its first line ran
    assert before - 0.05 <= start <= first_line + 0.02


def test_compile_cache_goes_to_one_folder_per_rank(tmp_path):
    env: dict[str, str] = {}
    got = compile_cache.configure(str(tmp_path / "compile-cache"), 3, env)
    assert got == {"mode": "campaign", "dir": str(tmp_path / "compile-cache" / "rank-3")}
    assert env["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "compile-cache" / "rank-3")
    assert env["TRITON_CACHE_DIR"] == str(tmp_path / "compile-cache" / "rank-3" / "triton")
    assert (tmp_path / "compile-cache" / "rank-3").is_dir()


def test_without_a_folder_every_start_compiles_from_nothing(tmp_path):
    a, b = {}, {}
    got_a = compile_cache.configure(None, 0, a)
    got_b = compile_cache.configure(None, 0, b)
    assert got_a["mode"] == "private" and got_a["dir"] != got_b["dir"]
    assert a["TORCHINDUCTOR_CACHE_DIR"] == got_a["dir"] and Path(got_a["dir"]).is_dir()


def _spec(tmp_path, **trainer):
    from campaign.spec import CampaignSpec

    return CampaignSpec.model_validate({"name": "c", "site": {"kind": "local", "nodes": 1},
                                        "trainer": trainer, "stages": [{"name": "s", "kind": "smoke"}]})


@pytest.mark.parametrize(("trainer", "expect"), [
    ({"compile": True}, True), ({"compile": True, "compile_cache": False}, False), ({}, False)])
def test_the_attempt_names_the_campaigns_cache_folder_when_compiling(tmp_path, trainer, expect):
    from campaign.attempt import trainer_config
    from campaign.stages.smoke import first_targets

    spec = _spec(tmp_path, **trainer)
    targets = first_targets(spec.stages[0], spec, 1)
    cfg = trainer_config(spec, targets, stage_dir=tmp_path / "c" / "s", attempt=2)
    want = str(tmp_path / "c" / compile_cache.FOLDER) if expect else None
    assert cfg.run.compile_cache_dir == want


def test_devices_opened_sees_a_device_file_held_open(tmp_path):
    fds = tmp_path / "fd"
    fds.mkdir()
    (fds / "3").symlink_to("/dev/null")
    assert warm.devices_opened(str(fds)) == []
    (fds / "7").symlink_to("/dev/nvidiactl")
    (fds / "8").symlink_to("/dev/dri/renderD128")
    assert warm.devices_opened(str(fds)) == ["/dev/dri/renderD128", "/dev/nvidiactl"]


def test_the_fork_server_holds_no_device_after_its_imports():
    code = ("from campaign.executors import warm; warm._preload(); import sys; "
            "print(warm.devices_opened()); sys.exit(0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO,
                         env={**os.environ, "PYTHONPATH": str(REPO)}).stdout.strip().splitlines()[-1]
    assert out == "[]"


def test_a_child_of_the_fork_server_wraps_the_model_for_torch_compile_without_importing():
    """What `torch.compile` imports when the model is wrapped (Inductor's backend) comes with
    the fork, not in every relaunch's model build (issue 41: "model built" at 1b)."""
    code = ("import sys; from campaign.executors import warm; warm._preload(); before = set(sys.modules); "
            "import torch; import campaign.train.model; "
            "torch.compile(torch.nn.Linear(2, 2)); print(sorted(set(sys.modules) - before)[:5])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO,
                         env={**os.environ, "PYTHONPATH": str(REPO)}).stdout.strip().splitlines()[-1]
    assert out == "[]"


def test_the_trainer_writes_its_startup_marks_after_the_first_step(launch, tmp_path):
    ck = tmp_path / "ck"
    first = launch(tiny_config(ck, run={"max_steps": 4}, train={"checkpoint_every": 2}), world=1, name="a1")
    assert first.wait() == [0], first.logs()
    second = launch(tiny_config(ck, run={"max_steps": 6, "attempt": 2}), world=1, name="a2", attempt=2)
    assert second.wait() == [0], second.logs()
    for run, first_step in ((first, 1), (second, 5)):
        [ev] = [e for e in run.events() if e["event"] == marks.EVENT]
        assert ev["step"] == first_step
        m = ev["marks"]
        assert list(m) == [p for p in marks.PHASES if p in m]  # made in order
        assert set(marks.PHASES) - {"process"} <= set(m)
        times = [m[p] for p in marks.PHASES if p in m]
        assert times == sorted(times)
        assert ev["warm"] is True  # the local site's fork server started it
        assert ev["compile_cache"] is None  # not compiled
        row = next(r for r in run.metrics() if r["step"] == first_step)
        assert m["first_step"] >= row["time"] - 1e-3


def test_the_relaunch_breakdown_from_a_recorded_pair(tmp_path):
    import gpu_relaunch as g

    failed_dir = tmp_path / "a1"
    failed_dir.mkdir()
    t = 1_000_000.0
    (failed_dir / "supervisor.json").write_text(json.dumps({"duration_s": 40.0, "detected_after_s": 9.0}))
    os.utime(failed_dir / "supervisor.json", (t + 41.0, t + 41.0))  # stopped at t+41
    failed = {"number": 1, "state": "stalled", "run_dir": str(failed_dir), "started": t,
              "steps": [(s, t + s, 1.0) for s in range(1, 31)], "finished": t + 42.0}  # last step 30 at t+30
    marks_ = {"process": t + 44.0, "main": t + 44.1, "imports": t + 44.2, "process_group": t + 45.0,
              "startup_check": t + 45.5, "model_built": t + 47.5, "checkpoint_loaded": t + 50.5,
              "first_step": t + 60.5}
    nxt = {"number": 2, "state": "succeeded", "run_dir": str(tmp_path / "a2"), "started": t + 42.5,
           "startup": {"marks": marks_, "warm": True, "compile_cache": {"mode": "campaign"}},
           "steps": [(s, t + 60.5 + (s - 21), 1.0) for s in range(21, 41)]}
    r = g.relaunch(failed, nxt, step_s=1.0)
    seg = r["segments"]
    assert seg == {"detected": 9.0, "stopped": 2.0, "new ranks": 3.0, "interpreter": pytest.approx(0.1),
                   "imports": pytest.approx(0.1), "process group": 1.3, "model built": 2.0,
                   "checkpoint loaded": 3.0, "compiled": 9.0, "first step": 1.0}
    assert r["startup_s"] == pytest.approx(3.0 + 0.1 + 0.1 + 1.3 + 2.0 + 3.0 + 9.0 + 1.0)
    assert r["resumed_from"] == 20 and r["recompute_steps"] == 10 and r["fault_step"] == 31
    # step 30 was reached again at t+60.5+9; lost = that - t+30 - one step
    assert r["lost_s"] == pytest.approx(60.5 + 9 - 30 - 1.0)
    assert r["to_first_step_s"] == pytest.approx(60.5 - 30)


def test_the_fork_server_preloads_a_module_only_where_its_package_is_installed(monkeypatch, capsys):
    """`PRELOAD_IF_FOUND`: the rotary's Triton kernels where Triton is installed; elsewhere
    nothing is tried (no "cannot preload" line in the server's log)."""
    import sys as _sys

    monkeypatch.setattr(warm, "PRELOAD", ())
    monkeypatch.setattr(warm, "PRELOAD_IF_FOUND", {"email.mime.audio": "email", "nosuchpkg_x.kernels": "nosuchpkg_x"})
    monkeypatch.delitem(_sys.modules, "email.mime.audio", raising=False)
    warm._preload()
    assert "email.mime.audio" in _sys.modules
    assert "cannot preload" not in capsys.readouterr().out
