"""Warm start (campaign.executors.warm): the fork server and its thin client, with real processes.

Nothing is faked: each test starts real clients, which start a real server (torch imported)
in a scope of its own; the server is stopped at the end of the test. What a launcher would
see of a rank (exit code, death by a signal, output, environment, CPU binding) is asserted
on the client process, as the supervisor sees it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from train_helpers import REPO, free_port, tiny_config

from campaign.executors import warm

PROBE = """\
import json, os, sys, time, signal
import torch
out = {"pid": os.getpid(), "ppid": os.getppid(), "foo": os.environ.get("FOO"), "cwd": os.getcwd(),
       "affinity": sorted(os.sched_getaffinity(0)), "argv": sys.argv, "threads": torch.get_num_threads(),
       "umask": os.umask(0), "path0": sys.path[0]}
print(json.dumps(out), flush=True)
mode = sys.argv[1]
if mode == "term":
    signal.signal(signal.SIGTERM, lambda *a: (print("got SIGTERM", flush=True), sys.exit(143)))
    print("ready", flush=True)
    time.sleep(60)
elif mode == "sleep":
    print("ready", flush=True)
    time.sleep(60)
elif mode == "nap":
    print("ready", flush=True)
    time.sleep(3)
    sys.exit(0)
elif mode == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
elif mode == "raise":
    raise ValueError("boom")
sys.exit(int(mode))
"""


@pytest.fixture
def scope(tmp_path, monkeypatch):
    """A scope of its own (one server), tied to this test process; the server stopped after."""
    name = f"test-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("CAMPAIGN_WARM_SCOPE", name)
    monkeypatch.setenv("CAMPAIGN_WARM_PARENT", f"{os.uname().nodename}:{os.getpid()}")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    (tmp_path / "probe.py").write_text(PROBE)
    yield name
    sock = warm.socket_path(warm.server_key(sys.executable, dict(os.environ)))
    pid = warm.server_pid(sock)
    if pid:
        os.kill(pid, signal.SIGTERM)


def client(tmp_path: Path, *args: str, env: dict[str, str] | None = None, **kw) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "campaign.executors.warm", "--", sys.executable, str(tmp_path / "probe.py"), *args]
    out = open(tmp_path / f"out-{uuid.uuid4().hex[:6]}.log", "w+")
    p = subprocess.Popen(cmd, cwd=tmp_path, env={**os.environ, **(env or {})}, stdout=out,
                         stderr=subprocess.STDOUT, **kw)
    p.out = out  # type: ignore[attr-defined]
    return p


def output(p: subprocess.Popen) -> str:
    p.out.seek(0)  # type: ignore[attr-defined]
    return p.out.read()  # type: ignore[attr-defined]


def probe(p: subprocess.Popen) -> dict:
    line = next(line for line in output(p).splitlines() if line.startswith("{"))
    return json.loads(line)


def wait_for(p: subprocess.Popen, text: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while text not in output(p):
        assert p.poll() is None, output(p)
        assert time.monotonic() < deadline, output(p)
        time.sleep(0.05)


def server_of(scope_env: dict[str, str] | None = None) -> int | None:
    env = {**os.environ, **(scope_env or {})}
    return warm.server_pid(warm.socket_path(warm.server_key(sys.executable, env)))


def test_the_child_is_the_client_exit_code_output_environment_and_place(tmp_path, scope):
    (tmp_path / "sub").mkdir()
    affinity = sorted(os.sched_getaffinity(0))[:1]
    first = client(tmp_path, "3", env={"FOO": "one"}, preexec_fn=lambda: os.sched_setaffinity(0, affinity))
    assert first.wait(120) == 3, output(first)
    server = server_of()
    assert server is not None
    environ = Path(f"/proc/{server}/environ").read_bytes().split(b"\0")
    assert not [v for v in environ if v.startswith((b"RANK=", b"CAMPAIGN_RUN_DIR="))]
    second = client(tmp_path, "5", env={"FOO": "two", "OMP_NUM_THREADS": "1"})
    assert second.wait(60) == 5, output(second)
    a, b = probe(first), probe(second)
    # Both are children of the one server (the second start paid no import), not of their clients.
    assert a["ppid"] == b["ppid"] == server
    assert a["pid"] != first.pid and b["pid"] != second.pid
    assert "started warm (fork server pid" in output(second)
    assert (a["foo"], b["foo"]) == ("one", "two")
    assert a["cwd"] == b["cwd"] == str(tmp_path) == a["path0"]
    assert a["argv"] == [str(tmp_path / "probe.py"), "3"]
    # The CPU binding a launcher gave the client is the child's, and OpenMP is sized from it.
    assert a["affinity"] == affinity and a["threads"] == 1
    assert b["affinity"] == sorted(os.sched_getaffinity(0))


def test_signals_are_forwarded_and_exits_by_signal_are_relayed(tmp_path, scope):
    p = client(tmp_path, "term")
    wait_for(p, "ready", timeout=120)
    p.send_signal(signal.SIGTERM)
    assert p.wait(30) == 143
    assert "got SIGTERM" in output(p)
    k = client(tmp_path, "kill")
    assert k.wait(30) == -signal.SIGKILL  # the launcher sees the rank killed, as it would cold
    e = client(tmp_path, "raise")
    assert e.wait(30) == 1
    assert "ValueError: boom" in output(e) and "Traceback" in output(e)


def test_a_client_killed_takes_its_child_with_it(tmp_path, scope):
    p = client(tmp_path, "sleep")
    wait_for(p, "ready", timeout=120)
    child = probe(p)["pid"]
    p.kill()
    p.wait()
    deadline = time.monotonic() + 10
    while _alive(child):
        assert time.monotonic() < deadline, "the child outlived its killed client"
        time.sleep(0.05)


def test_a_server_outlives_its_block_only_until_its_trainers_finish(tmp_path, scope, monkeypatch):
    """The block's process gone (the Parsl worker pool, a dead driver's): no new launch is
    served, a running rank trains on to its end, as a cold one would (resume adopts it),
    then the server exits."""
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    monkeypatch.setenv("CAMPAIGN_WARM_PARENT", f"{os.uname().nodename}:{holder.pid}")
    monkeypatch.setenv("CAMPAIGN_WARM_SCOPE", f"{scope}-block")
    p = client(tmp_path, "nap")
    wait_for(p, "ready", timeout=120)
    server = server_of()
    assert server is not None and _alive(server)
    holder.kill()
    holder.wait()
    assert p.wait(30) == 0, output(p)  # not killed with its server
    deadline = time.monotonic() + 15
    while _alive(server):
        assert time.monotonic() < deadline, "the server outlived its block and its last trainer"
        time.sleep(0.1)


def test_the_server_keeps_no_launchs_rank_variables():
    """Tools find a launch's ranks by /proc/PID/environ (recovery, `ps e`): the long-lived
    server must not look like the first launch's rank."""
    env = {"PATH": "/bin", "LD_LIBRARY_PATH": "/opt/x", "RANK": "3", "LOCAL_RANK": "1", "MASTER_PORT": "1",
           "CAMPAIGN_RUN_DIR": "/r/attempt-001", "CAMPAIGN_WARM_SCOPE": "s", "PMI_RANK": "3",
           "CUDA_VISIBLE_DEVICES": "2", "PALS_RANKID": "3", "OMP_NUM_THREADS": "4"}
    assert warm.server_environment(env) == {"PATH": "/bin", "LD_LIBRARY_PATH": "/opt/x", "CAMPAIGN_WARM_SCOPE": "s",
                                            "OMP_NUM_THREADS": "4"}


def test_commands_it_cannot_fork_start_cold(tmp_path, scope):
    shell = subprocess.run([sys.executable, "-m", "campaign.executors.warm", "--", "/bin/sh", "-c", "exit 7"])
    assert shell.returncode == 7
    off = client(tmp_path, "0", env={"CAMPAIGN_WARM": "0"})
    assert off.wait(120) == 0
    assert probe(off)["pid"] == off.pid  # exec'd in place: no server involved
    assert server_of() is None


def test_a_server_that_cannot_start_means_a_cold_start_not_a_failed_rank(tmp_path, scope):
    # A temp dir whose socket path is longer than a Unix socket allows: the server cannot bind.
    deep = tmp_path / ("d" * 110)
    deep.mkdir()
    p = client(tmp_path, "4", env={"TMPDIR": str(deep)})
    assert p.wait(120) == 4, output(p)
    assert probe(p)["pid"] == p.pid and "starting cold" in output(p)


def test_the_built_in_trainer_trains_the_same_losses_warm_as_cold(tmp_path, scope):
    """Two gloo ranks, 6 steps, deterministic: warm (forked) and cold give identical losses."""
    losses = {}
    for mode in ("cold", "warm", "warm-again"):
        run = tmp_path / mode
        run.mkdir()
        cfg = run / "config.json"
        cfg.write_text(json.dumps(tiny_config(run / "ck", run={"max_steps": 6})))
        port = str(free_port())
        procs = []
        for rank in range(2):
            env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank),
                   "LOCAL_WORLD_SIZE": "2", "CAMPAIGN_RUN_DIR": str(run), "CAMPAIGN_NODE": "local-n0",
                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "OMP_NUM_THREADS": "1",
                   "CAMPAIGN_HEARTBEAT_INTERVAL": "0.2"}
            prefix = [] if mode == "cold" else [sys.executable, "-m", "campaign.executors.warm", "--"]
            log = open(run / f"rank-{rank}.log", "w")
            procs.append(subprocess.Popen([*prefix, sys.executable, "-m", "campaign.train", "--config", str(cfg)],
                                          cwd=run, env=env, stdout=log, stderr=subprocess.STDOUT))
        codes = [p.wait(180) for p in procs]
        logs = "".join((run / f"rank-{r}.log").read_text() for r in range(2))
        assert codes == [0, 0], logs
        assert ("started warm" in logs) == (mode != "cold"), logs
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        losses[mode] = [r["loss"] for r in rows]
    assert len(losses["cold"]) == 6
    assert losses["cold"] == losses["warm"] == losses["warm-again"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for our purposes
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


FD_PROBE = """\
import os, sys
fd = int(os.environ["PMI_FD"])
try:
    os.fstat(fd)
    print(f"rank {os.environ['PMI_RANK']}: PMI_FD {fd} open in pid {os.getpid()}", flush=True)
except OSError as e:
    print(f"rank {os.environ['PMI_RANK']}: PMI_FD {fd} bad ({e.strerror})", flush=True)
    sys.exit(3)
"""


@pytest.mark.skipif(not shutil.which("mpiexec.hydra"), reason="needs MPICH's Hydra mpiexec (Debian's mpich)")
def test_a_rank_that_mpich_hands_pmi_by_descriptor_starts_cold_and_keeps_its_descriptor(tmp_path, scope):
    # Hydra connects each rank to its proxy through an inherited descriptor (PMI_FD); a child
    # of the fork server would hold a bad one. The client must run such a rank cold.
    (tmp_path / "fd.py").write_text(FD_PROBE)
    cmd = ["mpiexec.hydra", "-launcher", "fork", "-n", "2", sys.executable, "-m", "campaign.executors.warm", "--",
           sys.executable, str(tmp_path / "fd.py")]
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("open in pid") == 2
    assert done.stderr.count("PMI_FD=") == 2 and "starting cold" in done.stderr
    assert server_of() is None


def test_a_hung_server_is_replaced_and_the_rank_starts_cold(tmp_path, scope):
    """Issue 30, item 5: a server that accepts connections but never answers (SIGSTOPped
    here) held every rank of every relaunch forever. The client gives it CAMPAIGN_WARM_ACK_S,
    kills it, starts its rank cold (same exit code), and the next launch gets a new server."""
    first = client(tmp_path, "0")
    assert first.wait(timeout=180) == 0, output(first)
    sock = warm.socket_path(warm.server_key(sys.executable, dict(os.environ)))
    hung = warm.server_pid(sock)
    assert hung
    os.kill(hung, signal.SIGSTOP)
    try:
        t0 = time.time()
        p = client(tmp_path, "3", env={"CAMPAIGN_WARM_ACK_S": "2"})
        assert p.wait(timeout=60) == 3, output(p)
        assert time.time() - t0 < 30
        assert "did not answer within 2 s" in output(p) and f"killed it (pid {hung})" in output(p), output(p)
        deadline = time.time() + 10
        while time.time() < deadline and Path(f"/proc/{hung}").exists() and \
                Path(f"/proc/{hung}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
            time.sleep(0.1)
        assert not Path(f"/proc/{hung}").exists() or \
            Path(f"/proc/{hung}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z", "the hung server is gone"
        again = client(tmp_path, "0")
        assert again.wait(timeout=180) == 0, output(again)
        replaced = warm.server_pid(sock)
        assert replaced and replaced != hung, "a new server serves the next launch"
        probe = next(json.loads(line) for line in output(again).splitlines() if line.startswith("{"))
        assert probe["ppid"] == replaced, "the rank was forked by the new server"
    finally:
        try:
            os.kill(hung, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_the_local_driver_prestarts_the_server_its_blocks_launches_reach(tmp_path, monkeypatch):
    """Issue 41: on the local site the driver starts the fork server before it loads Parsl
    (`Block._prestart_warm`), so that the server's imports overlap the block's start. A launch
    of that block (the worker inherits the driver's environment; the supervisor adds
    `launch_environment()` and the site's launch options) must reach that same server: its
    rank is forked by it and no second server starts."""
    from campaign.block import Block
    from campaign.executors.local import LocalSite

    for name in ("CAMPAIGN_WARM_SCOPE", "CAMPAIGN_WARM_PARENT", "PARSL_WORKER_POOL_ID"):
        monkeypatch.setenv(name, "x")  # recorded, so the values _prestart_warm sets are undone after
        monkeypatch.delenv(name)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    (tmp_path / "probe.py").write_text(PROBE)
    site = LocalSite(nodes=1)
    Block(site, tmp_path, record=lambda *a: None, warm=True)._prestart_warm(site)
    assert warm.launch_environment()["CAMPAIGN_WARM_PARENT"] == f"{os.uname().nodename}:{os.getpid()}"
    # What the block's worker computes: it runs in a Parsl worker pool (which sets
    # PARSL_WORKER_POOL_ID), with the driver's environment, maybe through `python3`.
    monkeypatch.setenv("PARSL_WORKER_POOL_ID", "pool-1")
    assert warm.launch_environment()["CAMPAIGN_WARM_PARENT"] == f"{os.uname().nodename}:{os.getpid()}"
    launch_env = {**os.environ, **warm.launch_environment(), **site.launch_options().env}
    assert warm.server_key(sys.executable, launch_env) == warm.server_key(
        str(Path(sys.executable).with_name("python3")), launch_env)
    path = warm.socket_path(warm.server_key(sys.executable, launch_env))
    try:
        deadline = time.monotonic() + 120
        while warm.server_pid(path) is None:  # listening once torch and the trainer are imported
            assert time.monotonic() < deadline, path.with_suffix(".log").read_text()
            time.sleep(0.1)
        prestarted = warm.server_pid(path)
        assert warm.prestart(launch_env) is None  # it answers: no second one
        rank = client(tmp_path, "0", env=site.launch_options().env)
        assert rank.wait(120) == 0, output(rank)
        assert probe(rank)["ppid"] == prestarted
        assert warm.server_pid(path) == prestarted
    finally:
        pid = warm.server_pid(path)
        if pid:
            os.kill(pid, signal.SIGTERM)
    assert warm.prestart({**launch_env, "CAMPAIGN_WARM": "0"}) is None


def test_a_handed_down_scope_is_kept_only_on_the_drivers_host_and_outside_a_scheduler_job(monkeypatch):
    """sbatch exports the caller's environment: a compute node's supervisor must not take the
    scope a local driver handed its own block (another host's parent never drains the server)."""
    host = os.uname().nodename
    monkeypatch.delenv("PARSL_WORKER_POOL_ID", raising=False)
    for var in ("SLURM_JOB_ID", "PBS_JOBID"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("CAMPAIGN_WARM_SCOPE", "vm-driver-7")
    monkeypatch.setenv("CAMPAIGN_WARM_PARENT", f"{host}:7")
    assert warm.launch_environment() == {"CAMPAIGN_WARM_SCOPE": "vm-driver-7", "CAMPAIGN_WARM_PARENT": f"{host}:7"}
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    assert warm.launch_environment()["CAMPAIGN_WARM_SCOPE"] == "42"
    monkeypatch.delenv("SLURM_JOB_ID")
    monkeypatch.setenv("CAMPAIGN_WARM_PARENT", "login-node-1:7")
    assert warm.launch_environment()["CAMPAIGN_WARM_PARENT"] == f"{host}:{os.getpid()}"
