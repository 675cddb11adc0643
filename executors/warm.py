"""Warm start: a fork server per node keeps Python, torch and the trainer imported, so a
relaunch costs a fork instead of an interpreter start and an import of torch.

    {python} -m campaign.executors.warm -- {python} -m campaign.train --config FILE

The launcher (local processes, mpiexec, srun, torchrun) starts this thin client as each
rank's process, where and how it would have started the trainer: same environment, CPU
binding, working directory and standard streams. The client imports nothing heavy. It
connects to its node's server over a Unix socket (starting one when there is none), hands
over its argv, environment, working directory, CPU affinity, umask, resource limits and its
three standard streams (SCM_RIGHTS), and the server forks a child that takes all of these
on and runs the command's module or script (runpy) in the already-warm interpreter. The
client relays what happens both ways:

- signals sent to the client (SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2) go to the child;
- the child's exit is the client's: the same code, or death by the same signal (137 for
  SIGKILL, 134 for SIGABRT), so launchers, the supervisor and the evidence rules see what
  a cold trainer would have shown;
- a client that dies (SIGKILL, its launch torn down) takes its child with it: the server
  kills the child's process group when the client's connection closes, and a child dies
  with its server (PR_SET_PDEATHSIG).

The first launch on a node pays the import once (the server's); every later launch in the
same scope reuses it. A scope is one block: `CAMPAIGN_WARM_SCOPE`, else the scheduler's job
id, else the host. On the local site the driver is the block's host: it starts the server
itself (`prestart`, scope `driver_environment`) before it loads Parsl, so the import runs
while the block starts. The server exits when idle for `CAMPAIGN_WARM_IDLE_S` (300 s). When
`CAMPAIGN_WARM_PARENT` (`host:pid`, the block's process on this host) is gone it drains:
no new launch is served, running ranks finish (as cold ones would), then it exits. A server that does
not fork a client's child within `CAMPAIGN_WARM_ACK_S` (10 s) is taken for hung: the client
kills it, removes its socket and starts cold; the next launch starts a new server. It never
touches a device: CUDA or XPU start in each child (a server whose imports opened a device file
refuses to serve, exit 3, and its clients start cold: `devices_opened`).

What a fork cannot give a child, and what is done instead (tested in tests/train/test_warm.py):
- variables read when torch is imported (LD_PRELOAD, LD_LIBRARY_PATH, PYTHONPATH, ...)
  are part of the server's key: a client whose values differ gets a server of its own;
- OpenMP read its thread count when torch was imported: the child sets torch's intra-op
  threads from its own OMP_NUM_THREADS or MKL_NUM_THREADS, else the physical cores of its
  CPU affinity, as a cold start would;
- /proc/PID/environ and cmdline of a child are the server's (which holds no rank variables);
- the hash seed is the server's (deterministic code does not care).
`CAMPAIGN_WARM=0`, a command that is not this interpreter running `-m module` or a script,
a launcher that passes PMI by file descriptor (`PMI_FD`: MPICH's Hydra, `srun --mpi=pmi2`),
or a server that cannot be reached, start the command cold (exec), as without warm start.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
"""Signals the client passes on to its child."""
IMPORT_TIME_ENV = ("LD_PRELOAD", "LD_LIBRARY_PATH", "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "CONDA_PREFIX",
                   "MALLOC_CONF", "PYTORCH_NVML_BASED_CUDA_CHECK", "CAMPAIGN_WARM_PRELOAD",
                   "TRITON_INTERPRET")  # read when a Triton kernel is decorated (the preloaded rotary's)
"""Read when torch or Python starts: a server serves only clients with the same values."""
PER_LAUNCH_PREFIXES = ("CAMPAIGN_", "PMI_", "PMIX_", "PALS_", "OMPI_", "TORCHELASTIC_", "SLURM_STEP", "MPI_LOCAL")
PER_LAUNCH = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "MASTER_ADDR",
              "MASTER_PORT", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "CUDA_VISIBLE_DEVICES",
              "ZE_AFFINITY_MASK", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"}
"""What one launch's rank is told (rank variables, run directory, device mask): not the server's."""
RLIMITS = ("RLIMIT_NOFILE", "RLIMIT_CORE", "RLIMIT_MEMLOCK", "RLIMIT_STACK")
"""Resource limits a launcher may set that the child takes from its client."""
PRELOAD = ("torch", "torch.distributed", "torch.nn.parallel", "numpy", "campaign.report",
           # use_deterministic_algorithms imports dynamo and inductor (0.5 s here); they start no thread.
           "torch._dynamo", "torch._inductor",
           # torch.compile() imports Inductor's backend (~600 modules, networkx among them) when the
           # model is wrapped: 0.9 s of a 2-core VM's model build, paid by every relaunch otherwise.
           "torch._inductor.compile_fx", "torch._dynamo.repro.after_dynamo", "torch._inductor.compiler_bisector",
           "campaign.train.__main__", "campaign.train.loop", "campaign.train.dist", "campaign.train.faults",
           "campaign.train.signals", "campaign.train.placement", "campaign.train.checkpoint", "campaign.train.model")
"""What the server imports before it serves (CAMPAIGN_WARM_PRELOAD adds more, comma-separated)."""
PRELOAD_IF_FOUND = {"campaign.train.rotary_triton": "triton"}
"""Imported too where the package on the right is installed (the rotary's Triton kernels: the
model imports them when it is built on a CUDA device; importing Triton opens no device)."""
DEVICE_FILES = ("/dev/nvidia", "/dev/dri/", "/dev/accel/")
"""Device files a GPU driver opens when it is initialised (NVIDIA; Intel's XPU and others through
DRM or accel): a server holding one has initialised a device, and a child forked from it cannot
use that device (CUDA's driver state does not survive a fork)."""
EXIT_DEVICE_OPEN = 3
"""The server's exit when its imports initialised a device: it serves nobody, clients start cold."""
IDLE_S = 300.0
CONNECT_WAIT_S = 120.0
"""How long a client waits for a server it started (the server imports torch first)."""
ACK_WAIT_S = 10.0
"""How long a client waits for a connected server to fork its child (CAMPAIGN_WARM_ACK_S)
before it takes the server for hung, replaces it and starts cold."""


# --- framing: one JSON message per length-prefixed frame -----------------------------------

def _send(sock: socket.socket, msg: dict[str, Any], fds: list[int] | None = None) -> None:
    data = json.dumps(msg).encode()
    frame = struct.pack("!I", len(data)) + data
    if fds:
        socket.send_fds(sock, [frame], fds)
    else:
        sock.sendall(frame)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError("connection closed")
        buf += chunk
    return buf


def _recv(sock: socket.socket) -> dict[str, Any]:
    (n,) = struct.unpack("!I", _recv_exact(sock, 4))
    return json.loads(_recv_exact(sock, n))


# --- where a server lives -------------------------------------------------------------------

def _job_id(env: dict[str, str]) -> str | None:
    return env.get("PBS_JOBID") or env.get("SLURM_JOB_ID")


def scope(env: dict[str, str]) -> str:
    """The block this launch belongs to: one server per scope and node."""
    return env.get("CAMPAIGN_WARM_SCOPE") or _job_id(env) or socket.gethostname()


def launch_environment() -> dict[str, str]:
    """Scope and lifetime of the servers a launch from this process may start: the block (on
    a Parsl worker, its worker pool, which lives as long as the block; else this process), or
    the scope this process was handed (`driver_environment`: the local site's driver, which
    started the server before its block was up)."""
    host, job = socket.gethostname(), _job_id(dict(os.environ))
    handed, parent = os.environ.get("CAMPAIGN_WARM_SCOPE"), os.environ.get("CAMPAIGN_WARM_PARENT", "")
    # Only a driver on this host hands a scope down, and never into a scheduler's job (sbatch
    # exports the caller's environment: a compute node must not take a login node's scope).
    if handed and parent.rpartition(":")[0] == host and not job:
        return {"CAMPAIGN_WARM_SCOPE": handed, "CAMPAIGN_WARM_PARENT": parent}
    pool = os.environ.get("PARSL_WORKER_POOL_ID")
    owner = os.getppid() if pool else os.getpid()
    scope = job or f"{host}-{pool or 'driver'}-{owner}"
    return {"CAMPAIGN_WARM_SCOPE": scope, "CAMPAIGN_WARM_PARENT": f"{host}:{owner}"}


def driver_environment() -> dict[str, str]:
    """The scope of a driver whose block runs on its own host (the local site): the driver's
    blocks share one server per key, which drains when the driver is gone."""
    host = socket.gethostname()
    return {"CAMPAIGN_WARM_SCOPE": f"{host}-driver-{os.getpid()}", "CAMPAIGN_WARM_PARENT": f"{host}:{os.getpid()}"}


def prestart(env: dict[str, str]) -> subprocess.Popen[bytes] | None:
    """Start the server that a launch with `env` (the scope of `driver_environment` in it)
    will reach, and do not wait for it: its imports (5-7 s of torch, Dynamo and Inductor on a
    GPU host) then overlap the block's start instead of following it. The server's process
    (the caller reaps it), or None where a server already answers there or warm start is off
    (`CAMPAIGN_WARM=0`)."""
    if env.get("CAMPAIGN_WARM", "1") == "0":
        return None
    path = socket_path(server_key(sys.executable, env))
    sock = _connect(path)
    if sock is not None:
        sock.close()
        return None
    return _spawn_server(path, env)  # a client that comes before it listens waits for it (CONNECT_WAIT_S)


def server_key(executable: str, env: dict[str, str]) -> str:
    """The interpreter (its folder, so a venv's `python` and `python3` are one, and the file
    it resolves to), the environment read at import time (its import path included), the scope."""
    where = os.path.dirname(os.path.abspath(executable))
    parts = [where, os.path.realpath(executable), *(f"{k}={env.get(k, '')}" for k in IMPORT_TIME_ENV)]
    return hashlib.sha256("\0".join([*parts, scope(env)]).encode()).hexdigest()[:20]


def server_pid(sock: Path) -> int | None:
    """The pid of the server listening at `sock`, if it is running."""
    try:
        return int(sock.with_suffix(".pid").read_text())
    except (OSError, ValueError):
        return None


def socket_path(key: str) -> Path:
    # Node-local and short (a Unix socket path has ~107 bytes): the temp dir, per user.
    return Path(tempfile.gettempdir()) / f"campaign-warm-{os.getuid()}" / f"{key}.sock"


# --- the client -----------------------------------------------------------------------------

def _target(argv: list[str]) -> tuple[str, str] | None:
    """('module', name) or ('script', path) when argv is this interpreter running one."""
    if len(argv) < 2 or os.path.abspath(argv[0]) != os.path.abspath(sys.executable):
        return None
    if argv[1] == "-m" and len(argv) >= 3:
        return ("module", argv[2])
    if not argv[1].startswith("-"):
        return ("script", argv[1])
    return None


def _cold(argv: list[str], why: str | None) -> None:
    if why:
        print(f"campaign.executors.warm: {why}; starting cold", file=sys.stderr, flush=True)
    os.execvp(argv[0], argv)


def _connect(path: Path) -> socket.socket | None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(str(path))
        return s
    except OSError:
        s.close()
        return None


def server_environment(env: dict[str, str]) -> dict[str, str]:
    """The client's environment less what belongs to one launch (rank, run directory, device
    mask): the server outlives the launch, and tools that read /proc/PID/environ must not
    take it for that launch's rank. Each child gets its own client's environment whole."""
    return {k: v for k, v in env.items()
            if k.startswith("CAMPAIGN_WARM_") or not (k.startswith(PER_LAUNCH_PREFIXES) or k in PER_LAUNCH)}


def _spawn_server(path: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with open(path.with_suffix(".log"), "ab") as log:
        return subprocess.Popen([sys.executable, "-m", "campaign.executors.warm", "--serve", str(path)],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                close_fds=True, env=server_environment(dict(os.environ) if env is None else env),
                                cwd=path.parent)


def _reach_server(path: Path) -> socket.socket | None:
    sock = _connect(path)
    if sock is not None:
        return sock
    server = _spawn_server(path)  # several clients may race: the losers' servers exit 0 at once (flock)
    deadline = time.monotonic() + float(os.environ.get("CAMPAIGN_WARM_CONNECT_S", CONNECT_WAIT_S))
    while time.monotonic() < deadline:
        time.sleep(0.05)
        sock = _connect(path)
        if sock is not None:
            return sock
        if server.poll() not in (None, 0):  # it failed (not merely lost the race): do not wait on
            return None
    return None


def _request(argv: list[str]) -> dict[str, Any]:
    import resource

    return {"argv": argv, "env": dict(os.environ), "cwd": os.getcwd(),
            "affinity": sorted(os.sched_getaffinity(0)), "umask": os.umask(os.umask(0o022)),
            "rlimits": {name: resource.getrlimit(getattr(resource, name)) for name in RLIMITS}}


def client(argv: list[str]) -> int:
    """Run argv through the node's server; return (or die by) what the child did."""
    if os.environ.get("CAMPAIGN_WARM", "1") == "0":
        _cold(argv, None)
    if _target(argv) is None:
        _cold(argv, None)
    if os.environ.get("PMI_FD"):
        # MPICH's Hydra and `srun --mpi=pmi2` connect each rank to PMI through an inherited
        # descriptor; the server's child would hold a bad one (measured: EBADF).
        _cold(argv, f"PMI_FD={os.environ['PMI_FD']}: the launcher hands PMI to this process as an open file "
                    "descriptor (MPICH Hydra, srun --mpi=pmi2), which a child of the fork server cannot use")
    path = socket_path(server_key(sys.executable, dict(os.environ)))
    try:
        sock = _reach_server(path)
    except OSError as exc:  # no temp dir to put the server in, say
        _cold(argv, f"cannot start a server at {path} ({exc})")
    if sock is None:
        _cold(argv, f"no server at {path} (its log: {path.with_suffix('.log')})")
    child = -1
    pending: list[int] = []

    def forward(sig: int, _frame: Any) -> None:
        if child > 0:
            os.kill(child, sig)
        else:
            pending.append(sig)

    for sig in FORWARDED:
        signal.signal(sig, forward)
    try:
        # A server that accepted the connection but does not answer (stopped, deadlocked,
        # swapped out) would hold this rank forever: give it ACK_WAIT_S to fork the child,
        # else replace it (kill it: its socket and pid file go) and start this rank cold.
        wait = float(os.environ.get("CAMPAIGN_WARM_ACK_S", ACK_WAIT_S))
        sock.settimeout(wait)
        try:
            _send(sock, _request(argv), [0, 1, 2])
            child = int(_recv(sock)["pid"])
            _note_child(child)
        except TimeoutError:
            sock.close()
            _cold(argv, f"the server at {path} did not answer within {wait:.0f} s; "
                        f"{_replace_hung(path)}")
        sock.settimeout(None)  # the child may train for days
        for sig in pending:
            os.kill(child, sig)
        status = _recv(sock)
    except (EOFError, OSError) as exc:
        # The server went away: its children die with it (PR_SET_PDEATHSIG).
        print(f"campaign.executors.warm: lost the server ({exc}); the trainer was killed", file=sys.stderr, flush=True)
        status = {"signal": int(signal.SIGKILL)}
    if "signal" in status:
        _die_by(int(status["signal"]))
    return int(status["exit"])


def _replace_hung(path: Path) -> str:
    """Kill the server listening at `path` that did not answer, and remove its socket and pid
    file: the next launch on this node starts a new one. Says what was done."""
    pid = server_pid(path)
    cmdline = b""
    if pid:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            pass
    if pid and b"campaign.executors.warm" in cmdline and str(path).encode() in cmdline:
        try:
            os.kill(pid, signal.SIGKILL)  # its children die with it (PR_SET_PDEATHSIG)
        except (ProcessLookupError, PermissionError):
            pass
        killed = f"killed it (pid {pid})"
    else:
        killed = "its process is gone"
    for stale in (path, path.with_suffix(".pid")):
        stale.unlink(missing_ok=True)
    return f"{killed}; the next launch starts a new server"


def _note_child(child: int) -> None:
    """Write the child's pid where the supervisor asked (CAMPAIGN_RANK_PIDFILE, local launcher):
    the rank's real process, in its own process group, for `campaign inject` (a SIGSTOP sent
    to this client would stop only the client; it cannot be relayed). Best effort."""
    path = os.environ.get("CAMPAIGN_RANK_PIDFILE")
    if not path:
        return
    try:
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(f"{child}\n")
        os.replace(tmp, path)
    except OSError:
        pass


def _die_by(sig: int) -> None:
    """Exit as the child did: killed by `sig` (no core file of this small process)."""
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if sig not in (signal.SIGKILL, signal.SIGSTOP):
        signal.signal(sig, signal.SIG_DFL)
    sys.stdout.flush()
    os.kill(os.getpid(), sig)
    os._exit(128 + sig)  # a signal that does not kill by default


# --- the server -----------------------------------------------------------------------------

def serve(path: Path) -> int:
    """Import the trainer, then fork one child per request until idle or orphaned."""
    import fcntl
    import selectors

    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    lock = open(path.with_suffix(".lock"), "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return 0  # another server holds this key: the client connects to that one
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # stop cleanly: children killed, files removed
    t0 = time.monotonic()
    os.chdir(path.parent)  # not the first client's run directory, which may be removed
    _preload()
    opened = devices_opened()
    if opened:  # a child forked now could not use the device: serve nobody (clients start cold)
        print(f"campaign.executors.warm: not serving {path}: the imports opened {', '.join(opened)} "
              "(a device initialised before the fork is unusable in the forked trainer)", flush=True)
        return EXIT_DEVICE_OPEN
    path.unlink(missing_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(64)
    print(f"campaign.executors.warm: serving {path} (pid {os.getpid()}, imports {time.monotonic() - t0:.2f} s)",
          flush=True)
    pid_file = path.with_suffix(".pid")
    pid_file.write_text(f"{os.getpid()}\n")
    since = time.strftime("%H:%M:%S")
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    # A child's exit wakes the loop at once (its client relays it: the order of exits is evidence).
    wake_r, wake_w = socket.socketpair()
    wake_r.setblocking(False)
    wake_w.setblocking(False)
    signal.set_wakeup_fd(wake_w.fileno(), warn_on_full_buffer=False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    sel.register(wake_r, selectors.EVENT_READ)
    children: dict[int, socket.socket] = {}  # child pid -> its client's connection
    idle_s = float(os.environ.get("CAMPAIGN_WARM_IDLE_S", IDLE_S))
    parent = _parent()
    last_busy = time.monotonic()
    listening = True
    try:
        while True:
            for key, _ in sel.select(timeout=1.0):
                if key.fileobj is wake_r:
                    _drain(wake_r)
                elif key.fileobj is listener:
                    conn, _ = listener.accept()
                    pid = _fork_child(conn, [listener, lock, sel, wake_r, wake_w, *children.values()], since)
                    if pid:
                        children[pid] = conn
                        sel.register(conn, selectors.EVENT_READ, pid)
                elif _closed(key.fileobj):  # the client died: so does its child
                    _kill_group(key.data)
                    sel.unregister(key.fileobj)
            _reap(children, sel)
            if listening and not _alive(parent):
                # The block's process is gone: serve nobody new, but let running trainers finish
                # (a cold rank would outlive it too; a resumed driver adopts what it trained).
                sel.unregister(listener)
                listener.close()
                _remove(path, pid_file)
                lock.close()
                listening = False
            if children:
                last_busy = time.monotonic()
            elif not listening or time.monotonic() - last_busy > idle_s:
                return 0
    finally:
        for pid in list(children):
            _kill_group(pid)
        if listening:  # a drained server has removed its files already
            _remove(path, pid_file)


def _remove(path: Path, pid_file: Path) -> None:
    """The server's files, while it still holds the lock (no other server has them yet)."""
    for done in (path, pid_file, path.with_suffix(".log"), path.with_suffix(".lock")):
        done.unlink(missing_ok=True)


def _drain(sock: socket.socket) -> None:
    try:
        while sock.recv(4096):
            pass
    except BlockingIOError:
        pass


def _closed(conn: Any) -> bool:
    try:
        return conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def _preload() -> None:
    extra = [m for m in os.environ.get("CAMPAIGN_WARM_PRELOAD", "").split(",") if m]
    import importlib.util

    found = [m for m, pkg in PRELOAD_IF_FOUND.items() if importlib.util.find_spec(pkg) is not None]
    for name in (*PRELOAD, *found, *extra):
        try:
            importlib.import_module(name)
        except Exception as exc:  # the child meets the same error and exits as a cold start would
            print(f"campaign.executors.warm: cannot preload {name}: {exc!r}", flush=True)


def devices_opened(fd_dir: str = "/proc/self/fd", prefixes: tuple[str, ...] = DEVICE_FILES) -> list[str]:
    """The device files (DEVICE_FILES) this process holds open: none, unless something it
    imported initialised a GPU (e.g. a CUDA call at import). Also CUDA initialised by torch."""
    opened = set()
    try:
        names = os.listdir(fd_dir)
    except OSError:
        names = []
    for name in names:
        try:
            target = os.readlink(os.path.join(fd_dir, name))
        except OSError:
            continue
        if target.startswith(prefixes):
            opened.add(target)
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and getattr(cuda, "is_initialized", lambda: False)():
        opened.add("torch.cuda (initialised)")
    return sorted(opened)


def _parent() -> int | None:
    host, _, pid = os.environ.get("CAMPAIGN_WARM_PARENT", "").rpartition(":")
    return int(pid) if pid.isdigit() and host == socket.gethostname() else None


def _alive(pid: int | None) -> bool:
    if pid is None:
        return True
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _reap(children: dict[int, socket.socket], sel: Any) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is None:
            continue
        msg = ({"signal": os.WTERMSIG(status)} if os.WIFSIGNALED(status)
               else {"exit": os.waitstatus_to_exitcode(status)})
        try:
            sel.unregister(conn)
        except (KeyError, ValueError):
            pass
        try:
            _send(conn, msg)
        except OSError:
            pass
        conn.close()


def _fork_child(conn: socket.socket, close_in_child: list[Any], since: str) -> int:
    """Fork the child for one request; 0 if the request could not be read or answered."""
    try:
        conn.settimeout(10)
        # The length prefix, the request and the three fds come in one sendmsg.
        (n,) = struct.unpack("!I", conn.recv(4, socket.MSG_PEEK).ljust(4, b"\0"))
        data, fds, _, _ = socket.recv_fds(conn, 4 + n, 3)
        data = data[4:]
        while len(data) < n:
            more = conn.recv(n - len(data))
            if not more:
                raise EOFError("connection closed")
            data += more
        request = json.loads(data)
        if len(fds) != 3:
            raise ValueError(f"expected 3 file descriptors, got {len(fds)}")
        conn.settimeout(None)
    except (OSError, EOFError, ValueError) as exc:
        print(f"campaign.executors.warm: bad request: {exc!r}", flush=True)
        conn.close()
        return 0
    pid = os.fork()
    if pid == 0:  # the child: never returns into the server's loop
        for obj in close_in_child:
            obj.close()
        os._exit(_child(request, fds, conn, since))
    for fd in fds:
        os.close(fd)
    try:
        _send(conn, {"pid": pid})
    except OSError:  # the client is gone already
        _kill_group(pid)
    return pid


def _child(request: dict[str, Any], fds: list[int], conn: socket.socket, since: str) -> int:
    """Become the client's process (streams, environment, place, limits), then run its command."""
    try:
        signal.set_wakeup_fd(-1)
        os.setsid()  # its own process group, so the server can kill whatever it starts
        _die_with_parent()
        for target, fd in zip((0, 1, 2), fds):
            os.dup2(fd, target)
            os.close(fd)
        conn.close()
        _adopt(request)
        print(f"campaign.executors.warm: started warm (fork server pid {os.getppid()}, serving since {since})",
              file=sys.stderr, flush=True)
    except BaseException as exc:  # noqa: BLE001 - report, never return into the server's loop
        print(f"campaign.executors.warm: cannot start the trainer: {exc!r}", file=sys.__stderr__, flush=True)
        return 1
    return _run(request["argv"])


def _die_with_parent() -> None:
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _adopt(request: dict[str, Any]) -> None:
    import io
    import resource

    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    os.umask(int(request["umask"]))
    os.sched_setaffinity(0, request["affinity"])
    for name, (soft, hard) in request["rlimits"].items():
        try:
            resource.setrlimit(getattr(resource, name), (soft, hard))
        except (ValueError, OSError):
            pass
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
    for fd, name in ((1, "stdout"), (2, "stderr")):
        raw = io.FileIO(fd, "w", closefd=False)
        stream = io.TextIOWrapper(raw if unbuffered else io.BufferedWriter(raw), encoding="utf-8",
                                  errors="backslashreplace" if fd == 2 else "strict",
                                  write_through=unbuffered, line_buffering=fd == 2 or os.isatty(fd))
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)
    if os.environ.get("PYTHONFAULTHANDLER"):
        import faulthandler

        faulthandler.enable()
    _threads(request)


def _threads(request: dict[str, Any]) -> None:
    """OpenMP and MKL sized torch's pool from the server's environment at import: size it as
    a cold start would from the client's (OMP_NUM_THREADS, MKL_NUM_THREADS, else the physical
    cores of its CPU affinity, as mkl_get_max_threads counts them)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        want = os.environ.get(name, "").split(",")[0]
        if want.isdigit() and int(want) > 0:
            torch.set_num_threads(int(want))
            return
    torch.set_num_threads(physical_cores(request["affinity"]))


def physical_cores(cpus: list[int]) -> int:
    """Distinct (package, core) pairs among `cpus` (hyper-threads count once)."""
    cores = set()
    for cpu in cpus:
        topo = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            cores.add(((topo / "physical_package_id").read_text().strip(), (topo / "core_id").read_text().strip()))
        except OSError:
            cores.add(("cpu", str(cpu)))
    return max(1, len(cores))


def _run(argv: list[str]) -> int:
    import atexit
    import runpy
    import threading
    import traceback

    kind, name = _target(argv) or ("", "")
    code = 0
    try:
        if kind == "module":
            # Run it afresh, as `python -m` would (runpy warns about a preloaded copy).
            if not hasattr(sys.modules.get(name), "__path__"):
                sys.modules.pop(name, None)
            sys.modules.pop(f"{name}.__main__", None)
            sys.argv = [name, *argv[3:]]
            sys.path[0] = os.getcwd()  # as `python -m` puts it
            runpy.run_module(name, run_name="__main__", alter_sys=True)
        else:
            sys.argv = argv[1:]
            sys.path[0] = os.path.dirname(os.path.abspath(name))  # as `python script` puts it
            runpy.run_path(name, run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - as the interpreter would: traceback, exit 1
        traceback.print_exc()
        code = 1
    # What a cold interpreter does at exit: join non-daemon threads, then atexit.
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    return code


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) == 2 and args[0] == "--serve":
        return serve(Path(args[1]))
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        print("usage: python -m campaign.executors.warm -- PYTHON -m MODULE ARGS... | PYTHON SCRIPT ARGS...",
              file=sys.stderr)
        return 2
    return client(args)


if __name__ == "__main__":
    sys.exit(main())
