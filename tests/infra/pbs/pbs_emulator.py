"""PBS Pro EMULATOR: shared code of the `qsub`, `qstat` and `qdel` stand-ins in this folder.

This is a STAND-IN for PBS Pro, used because PBS Pro cannot run on the test machines
(one 2-core box, no PBS server/MoM). It emulates the command-line boundary that Parsl's
PBSProProvider and campaign's `aurora`/`polaris` sites touch, faithfully enough to catch
their mistakes, and runs every job locally:

* `qsub [options] [script]`: `#PBS` directives (read up to the first command line, as
  PBS Pro does) and command-line options (which win); prints a job id such as
  `1234.aurora-pbs-0001.hostmgmt.cm.aurora.alcf.anl.gov`; copies the script at submit
  time; runs it detached (its own session) with `-S` shell (default /bin/bash) in $HOME
  (PBS Pro starts jobs in the home directory, not in PBS_O_WORKDIR), with the PBS_*
  variables, a PBS_NODEFILE of Aurora-style host names (one per chunk of
  `-l select=N...`; a host is repeated `mpiprocs` times), output to -o/-e (or the PBS
  default `<name>.o<seq>` / `<name>.e<seq>` in PBS_O_WORKDIR; -j oe/eo joins), and the
  walltime enforced (SIGTERM, `kill_delay` seconds, SIGKILL; Exit_status -29 and the
  `=>> PBS: job killed: walltime ...` line in the error file).
* Without -V the job does NOT inherit the submitter's environment (only PBS_O_* copies,
  -v variables and a minimal login-like PATH), as with PBS Pro.
* `qstat [-x] [-f [-F json]] [ids]`: job_state Q/R/E/F, Exit_status (exit code, or 256+
  signal when killed by a signal, as PBS Pro reports), `qstat` without -x refuses
  finished jobs (rc 35), unknown ids rc 153, as PBS Pro.
* `qdel [-W force] [-x] ids`: SIGTERM to the job's process group (and any process that
  carries the job's PBS_JOBID, like PBS Pro's cgroup hook on Aurora), SIGKILL after
  kill_delay; the job ends in F with Exit_status 271 (256+SIGTERM) unless the script
  exits by itself first.

Not emulated: a scheduler (every job starts at once, after PBS_EMULATOR_QUEUE_DELAY
seconds; no node limits, no fair share), several hosts (all "hosts" are this machine:
nothing is started on them; mpiexec must be told to launch locally), job arrays (-J),
interactive jobs (-I), holds, dependencies (-W depend is accepted and ignored), email,
output staging (files are written directly, as with `-k doe`), accounting, and PALS.

Environment knobs:
  PBS_EMULATOR_STATE        state directory (default /tmp/pbs-emulator)
  PBS_EMULATOR_SERVER       server name (default aurora-pbs-0001.hostmgmt.cm.aurora.alcf.anl.gov)
  PBS_EMULATOR_QUEUE_DELAY  seconds a job stays Q before it runs (default 0)
  PBS_EMULATOR_KILL_DELAY   seconds between SIGTERM and SIGKILL (default 10, as PBS Pro)
  PBS_EMULATOR_REQUIRED     comma list of resources qsub requires (default "filesystems",
                            as on Aurora and Polaris; empty string: none)
  PBS_EMULATOR_DEFAULT_QUEUE  queue when -q is absent (default "workq")

Standard library only; works with any python3 >= 3.8.
"""

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time

try:
    import fcntl
except ImportError:  # pragma: no cover - Linux only
    fcntl = None

PBS_VERSION = "2022.1.5.20240308103637"
DEFAULT_SERVER = "aurora-pbs-0001.hostmgmt.cm.aurora.alcf.anl.gov"

# PBS Pro command exit codes (PBSE_* % 256)
RC_UNKNOWN_JOB = 153  # PBSE_UNKJOBID 15001
RC_HISTORY_JOB = 35  # PBSE_HISTJOBID 15139
RC_BAD_ATTR = 15  # generic qsub rejection
RC_USAGE = 2

EXIT_WALLTIME = -29  # JOB_EXEC_KILL_WALLTIME
SUBSTATE = {"Q": 10, "R": 42, "E": 51, "F": 92}


# ----------------------------------------------------------------------------- state

def state_dir():
    d = os.environ.get("PBS_EMULATOR_STATE") or "/tmp/pbs-emulator"
    os.makedirs(os.path.join(d, "jobs"), exist_ok=True)
    return d


def server_name():
    return os.environ.get("PBS_EMULATOR_SERVER") or DEFAULT_SERVER


def job_dir(seq):
    return os.path.join(state_dir(), "jobs", str(seq))


def _write_json(path, data):
    tmp = "%s.tmp.%d" % (path, os.getpid())
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def load_job(seq):
    try:
        with open(os.path.join(job_dir(seq), "job.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def save_job(job):
    job["mtime"] = time.time()
    _write_json(os.path.join(job_dir(job["seq"]), "job.json"), job)


def next_seq():
    path = os.path.join(state_dir(), "seq")
    with open(path, "a+") as f:
        if fcntl:
            fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        text = f.read().strip()
        seq = int(text) + 1 if text else 1000
        f.seek(0)
        f.truncate()
        f.write(str(seq))
        f.flush()
    return seq


def all_seqs():
    out = []
    for name in os.listdir(os.path.join(state_dir(), "jobs")):
        if name.isdigit():
            out.append(int(name))
    return sorted(out)


def resolve(job_id):
    """'1234', '1234.aurora-pbs-0001' or the full id -> seq, or None."""
    head = job_id.split(".", 1)[0]
    if not head.isdigit():
        return None
    seq = int(head)
    job = load_job(seq)
    if job is None:
        return None
    if "." in job_id and not job["id"].startswith(job_id) and job_id.split(".", 1)[1] != server_name():
        return None
    return seq


def fmt_time(t):
    return time.strftime("%a %b %d %H:%M:%S %Y", time.localtime(t)) if t else None


def hms(seconds):
    seconds = max(0, int(seconds))
    return "%02d:%02d:%02d" % (seconds // 3600, seconds % 3600 // 60, seconds % 60)


def parse_walltime(text):
    parts = text.strip().split(":")
    try:
        nums = [float(p) for p in parts]
    except ValueError:
        raise ValueError("illegal walltime %r" % text)
    if len(nums) > 3:
        raise ValueError("illegal walltime %r" % text)
    secs = 0.0
    for n in nums:
        secs = secs * 60 + n
    return secs


# ----------------------------------------------------------------------------- hosts

def aurora_host(i):
    """Aurora-style node names: x4000c0s0b0n0, x4000c0s1b0n0, ... (8 slots per chassis,
    8 chassis per rack)."""
    return "x%dc%ds%db0n0" % (4000 + i // 64, (i // 8) % 8, i % 8)


def parse_select(select):
    """'2:ncpus=208:ngpus=6+1:ncpus=4' -> list of chunk dicts (one per chunk)."""
    chunks = []
    for spec in select.split("+"):
        parts = spec.split(":")
        count = 1
        res = {}
        if parts and parts[0].isdigit():
            count = int(parts.pop(0))
        for p in parts:
            if "=" not in p:
                raise ValueError("illegal select spec %r" % select)
            k, v = p.split("=", 1)
            res[k] = v
        if count < 1:
            raise ValueError("illegal select count in %r" % select)
        chunks.extend([dict(res) for _ in range(count)])
    return chunks


# ----------------------------------------------------------------------------- qsub

QSUB_USAGE = """usage: qsub [-a date_time] [-A account_string] [-c interval]
\t[-C directive_prefix] [-e path] [-f ] [-h ] [-I [-X]] [-j oe|eo] [-J X-Y[:Z]]
\t[-k keep] [-l resource_list] [-m mail_options] [-M user_list]
\t[-N jobname] [-o path] [-p priority] [-P project] [-q queue] [-r y|n]
\t[-R o|e|oe] [-S path] [-u user_list] [-W otherattributes=value...]
\t[-S path] [-u user_list] [-W otherattributes=value...]
\t[-v variable_list] [-V ] [-z] [script | -- command [arg1 ...]]
       qsub --version
(PBS Pro emulator: -I, -J, -h and `-- command` are not supported)"""

_WITH_ARG = set("aAcCeJklmMNopPqrRSuvWj")
_FLAGS = set("fhIVXz")


class QsubError(Exception):
    def __init__(self, msg, rc=RC_BAD_ATTR):
        Exception.__init__(self, msg)
        self.rc = rc


def _parse_opts(argv, opts, source):
    """Parse qsub options in argv into opts (a list of (flag, value)); returns the rest."""
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            raise QsubError("qsub: `-- command` jobs are not supported by the PBS emulator", RC_USAGE)
        if not a.startswith("-") or a == "-":
            return argv[i:]
        flag = a[1:2]
        rest = a[2:]
        if flag in _FLAGS and not rest:
            opts.append((flag, None))
            i += 1
            continue
        if flag in _WITH_ARG:
            if rest:
                val = rest
            else:
                i += 1
                if i >= len(argv):
                    raise QsubError("qsub: option requires an argument -- '%s'\n%s" % (flag, QSUB_USAGE), RC_USAGE)
                val = argv[i]
            opts.append((flag, val))
            i += 1
            continue
        raise QsubError("qsub: invalid option -- '%s' (%s)\n%s" % (a, source, QSUB_USAGE), RC_USAGE)
    return []


def _directives(script_text, prefix="#PBS"):
    """#PBS lines from the top of the script, stopping at the first command (PBS Pro rule)."""
    out = []
    for line in script_text.splitlines():
        s = line.strip()
        if not s:
            continue
        if s.startswith(prefix):
            body = s[len(prefix):]
            if body and not body[0].isspace():
                continue  # e.g. '#PBSX' is just a comment
            out.append(body.strip())
        elif s.startswith("#"):
            continue
        else:
            break
    return out


def _split_resources(text):
    """'-l select=2:ncpus=1,walltime=1:00:00' -> [('select','2:ncpus=1'), ('walltime','1:00:00')]"""
    out = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        if "=" not in item:
            raise QsubError("qsub: illegal -l value %r" % text)
        k, v = item.split("=", 1)
        out.append((k.strip(), v.strip()))
    return out


def _split_vars(text):
    """-v 'A=1,B,C="x,y"' -> [('A','1'), ('B', None), ('C', 'x,y')]"""
    out = []
    buf = ""
    quote = None
    items = []
    for ch in text:
        if quote:
            if ch == quote:
                quote = None
            else:
                buf += ch
        elif ch in "\"'":
            quote = ch
        elif ch == ",":
            items.append(buf)
            buf = ""
        else:
            buf += ch
    items.append(buf)
    for it in items:
        it = it.strip()
        if not it:
            continue
        if "=" in it:
            k, v = it.split("=", 1)
            out.append((k, v))
        else:
            out.append((it, None))
    return out


def qsub_main(argv):
    try:
        return _qsub(argv)
    except QsubError as e:
        sys.stderr.write(str(e).rstrip("\n") + "\n")
        return e.rc


def _qsub(argv):
    if argv == ["--version"]:
        print("pbs_version = %s (PBS Pro emulator)" % PBS_VERSION)
        return 0
    cli_opts = []
    rest = _parse_opts(list(argv), cli_opts, "command line")
    if len(rest) > 1:
        raise QsubError("qsub: only one script may be given\n" + QSUB_USAGE, RC_USAGE)
    if rest:
        script_path = os.path.abspath(rest[0])
        try:
            with open(script_path) as f:
                script_text = f.read()
        except OSError as e:
            raise QsubError("qsub: script file:: %s" % e.strerror, RC_USAGE)
        default_name = os.path.basename(script_path)
    else:
        script_text = sys.stdin.read()
        default_name = "STDIN"

    prefix = "#PBS"
    for f, v in cli_opts:
        if f == "C":
            prefix = v
    dir_opts = []
    for d in _directives(script_text, prefix):
        try:
            words = shlex.split(d, comments=False)
        except ValueError as e:
            raise QsubError("qsub: directive error: %s: %s" % (d, e))
        left = _parse_opts(words, dir_opts, "directive '%s %s'" % (prefix, d))
        if left:
            raise QsubError("qsub: directive error: %s %s" % (prefix, d))
    opts = dir_opts + cli_opts  # command line wins (applied last)

    for f, _ in opts:
        if f == "I":
            raise QsubError("qsub: interactive jobs (-I) are not supported by the PBS emulator", RC_USAGE)
        if f == "J":
            raise QsubError("qsub: job arrays (-J) are not supported by the PBS emulator", RC_USAGE)
        if f == "h":
            raise QsubError("qsub: held jobs (-h) are not supported by the PBS emulator", RC_USAGE)

    resources = {}
    attrs = {"queue": None, "account": None, "name": None, "out": None, "err": None,
             "join": "n", "shell": None, "export_all": False, "vars": [], "keep": "n",
             "mail": "a", "rerun": "True", "project": "_pbs_project_default",
             "priority": 0, "print_id": True, "W": []}
    for f, v in opts:
        if f == "l":
            for k, val in _split_resources(v):
                resources[k] = val
        elif f == "A":
            attrs["account"] = v
        elif f == "q":
            attrs["queue"] = v
        elif f == "N":
            if not v or len(v) > 236 or any(c.isspace() for c in v):
                raise QsubError("qsub: illegal -N value")
            attrs["name"] = v
        elif f == "o":
            attrs["out"] = v
        elif f == "e":
            attrs["err"] = v
        elif f == "j":
            if v not in ("oe", "eo", "n"):
                raise QsubError("qsub: illegal -j value")
            attrs["join"] = v
        elif f == "S":
            attrs["shell"] = v.split(",")[0].split("@")[0]
        elif f == "V":
            attrs["export_all"] = True
        elif f == "v":
            attrs["vars"].extend(_split_vars(v))
        elif f == "k":
            attrs["keep"] = v
        elif f == "m":
            attrs["mail"] = v
        elif f == "r":
            attrs["rerun"] = "True" if v == "y" else "False"
        elif f == "P":
            attrs["project"] = v
        elif f == "p":
            attrs["priority"] = int(v)
        elif f == "z":
            attrs["print_id"] = False
        elif f == "W":
            attrs["W"].append(v)
        # -a -c -C -M -R -u -X -f: accepted and ignored

    # resources
    select = resources.get("select")
    if select is None:
        if "nodes" in resources:
            raise QsubError("qsub: -l nodes= is Torque syntax; PBS Pro (this emulator) needs -l select=N")
        select = "1:ncpus=1"
    try:
        chunks = parse_select(select)
    except ValueError as e:
        raise QsubError("qsub: %s" % e)
    walltime = resources.get("walltime", "01:00:00")
    try:
        walltime_s = parse_walltime(walltime)
    except ValueError as e:
        raise QsubError("qsub: %s" % e)
    required = os.environ.get("PBS_EMULATOR_REQUIRED", "filesystems")
    for r in [x.strip() for x in required.split(",") if x.strip()]:
        if r not in resources:
            raise QsubError("qsub: Resource: %s is required to be set." % r)
    if "filesystems" in resources:
        fs = resources["filesystems"]
        if not fs or any(not p for p in fs.split(":")):
            raise QsubError("qsub: illegal filesystems value %r" % fs)
    place = resources.get("place", "free")
    place_kind = place.split(":")[0]
    if place_kind not in ("free", "pack", "scatter", "vscatter", "excl", "exclhost", "shared"):
        raise QsubError("qsub: illegal place value %r" % place)

    # hosts: one per chunk (place=pack: all chunks on one host)
    if place_kind == "pack":
        chunk_hosts = [aurora_host(0)] * len(chunks)
    else:
        chunk_hosts = [aurora_host(i) for i in range(len(chunks))]
    nodefile_lines = []
    for host, ch in zip(chunk_hosts, chunks):
        nodefile_lines.extend([host] * int(ch.get("mpiprocs", 1)))
    hosts = []
    for h in chunk_hosts:
        if h not in hosts:
            hosts.append(h)
    ncpus_total = sum(int(ch.get("ncpus", 1)) for ch in chunks)
    ngpus_total = sum(int(ch.get("ngpus", 0)) for ch in chunks)

    seq = next_seq()
    server = server_name()
    job_id = "%d.%s" % (seq, server)
    name = attrs["name"] or default_name
    workdir = os.getcwd()
    queue = attrs["queue"] or os.environ.get("PBS_EMULATOR_DEFAULT_QUEUE", "workq")
    submit_host = socket.gethostname()

    def out_path(p, letter):
        default = "%s.%s%d" % (name, letter, seq)
        if p is None:
            return os.path.join(workdir, default)
        if ":" in p and not p.startswith("/"):
            p = p.split(":", 1)[1]
        p = os.path.join(workdir, os.path.expanduser(p))
        if os.path.isdir(p):
            p = os.path.join(p, default)
        return p

    stdout_path = out_path(attrs["out"], "o")
    stderr_path = out_path(attrs["err"], "e")

    user = _user()
    var_list = {
        "PBS_O_HOME": os.environ.get("HOME", "/"),
        "PBS_O_LANG": os.environ.get("LANG", "C"),
        "PBS_O_LOGNAME": os.environ.get("LOGNAME", user),
        "PBS_O_PATH": os.environ.get("PATH", ""),
        "PBS_O_MAIL": os.environ.get("MAIL", "/var/mail/%s" % user),
        "PBS_O_SHELL": os.environ.get("SHELL", "/bin/bash"),
        "PBS_O_WORKDIR": workdir,
        "PBS_O_SYSTEM": os.uname()[0],
        "PBS_O_QUEUE": queue,
        "PBS_O_HOST": submit_host,
    }
    if attrs["export_all"]:
        for k, v in os.environ.items():
            var_list.setdefault(k, v)
    for k, v in attrs["vars"]:
        if v is None:
            v = os.environ.get(k, "")
        var_list[k] = v

    resource_list = {}
    for k, v in resources.items():
        resource_list[k] = v
    resource_list["select"] = select
    resource_list["walltime"] = hms(walltime_s)
    resource_list["place"] = place
    resource_list["nodect"] = len(chunks)
    resource_list["ncpus"] = ncpus_total
    if ngpus_total:
        resource_list["ngpus"] = ngpus_total
    for k in list(resource_list):
        v = resource_list[k]
        if isinstance(v, str) and v.isdigit() and k not in ("select", "walltime"):
            resource_list[k] = int(v)

    now = time.time()
    jd = job_dir(seq)
    os.makedirs(jd, exist_ok=True)
    with open(os.path.join(jd, "script"), "w") as f:
        f.write(script_text)
    with open(os.path.join(jd, "nodefile"), "w") as f:
        f.write("".join(h + "\n" for h in nodefile_lines))
    job = {
        "seq": seq, "id": job_id, "name": name, "owner": "%s@%s" % (user, submit_host),
        "user": user, "queue": queue, "account": attrs["account"], "project": attrs["project"],
        "state": "Q", "ctime": now, "qtime": now, "etime": now, "stime": None, "mtime": now,
        "obittime": None, "exit_status": None, "session_id": None, "runner_pid": None,
        "resource_list": resource_list, "chunks": chunks, "hosts": hosts, "chunk_hosts": chunk_hosts,
        "nodefile_lines": nodefile_lines, "walltime_s": walltime_s,
        "stdout_path": stdout_path, "stderr_path": stderr_path, "join": attrs["join"],
        "keep": attrs["keep"], "mail": attrs["mail"], "rerun": attrs["rerun"],
        "priority": attrs["priority"], "shell": attrs["shell"], "variable_list": var_list,
        "export_all": attrs["export_all"], "workdir": workdir, "submit_host": submit_host,
        "submit_args": " ".join(shlex.quote(a) for a in argv), "W": attrs["W"],
        "comment": "Not Running: Job is waiting for the emulator to start it",
        "deleted": False, "killed_walltime": False, "run_count": 0,
    }
    save_job(job)

    # the "MoM": a detached runner in its own session, outliving qsub
    runner = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "_run", str(seq)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=open(os.path.join(jd, "runner.log"), "w"),
        close_fds=True, start_new_session=True,
        # not tagged with an enclosing job's PBS_JOBID: qdel of that job must not kill it
        env=dict([(k, v) for k, v in os.environ.items() if k != "PBS_JOBID"], PBS_EMULATOR_STATE=state_dir()),
    )
    with open(os.path.join(jd, "runner.pid"), "w") as f:
        f.write(str(runner.pid))
    if attrs["print_id"]:
        print(job_id)
    return 0


def _user():
    try:
        import pwd
        return pwd.getpwuid(os.getuid()).pw_name
    except Exception:
        return os.environ.get("USER", "user")


# ----------------------------------------------------------------------------- runner ("MoM")

def _job_env(job, tmpdir):
    import pwd
    try:
        pw = pwd.getpwuid(os.getuid())
        home, login_shell = pw.pw_dir, pw.pw_shell
    except KeyError:
        home, login_shell = os.environ.get("HOME", "/"), "/bin/bash"
    # Variable_List holds PBS_O_* and -v variables (and, with -V, the whole submit env)
    env = dict(job["variable_list"])
    env.setdefault("HOME", home)
    env.setdefault("USER", job["user"])
    env.setdefault("LOGNAME", job["user"])
    env.setdefault("SHELL", job["shell"] or login_shell or "/bin/bash")
    env.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    first = job["chunks"][0] if job["chunks"] else {}
    ncpus = str(first.get("ncpus", 1))
    env.update({
        "PBS_JOBID": job["id"],
        "PBS_JOBNAME": job["name"],
        "PBS_QUEUE": job["queue"],
        "PBS_NODEFILE": os.path.join(job_dir(job["seq"]), "nodefile"),
        "PBS_ENVIRONMENT": "PBS_BATCH",
        "PBS_JOBDIR": home,
        "PBS_NODENUM": "0",
        "PBS_TASKNUM": "1",
        "PBS_MOMPORT": "15003",
        "PBS_JOBCOOKIE": "%032X" % (job["seq"] * 7919),
        "ENVIRONMENT": "BATCH",
        "NCPUS": ncpus,
        "OMP_NUM_THREADS": str(first.get("ompthreads", ncpus)),
        "TMPDIR": tmpdir,
        "PBS_EMULATOR": "1",
    })
    if job["account"]:
        env["PBS_ACCOUNT"] = job["account"]
    return env, home


def _tagged_pids(job_id):
    """pids of processes (other than us) whose environment has PBS_JOBID=job_id."""
    needle = ("PBS_JOBID=%s" % job_id).encode()
    me = os.getpid()
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open("/proc/%s/environ" % name, "rb") as f:
                if needle in f.read().split(b"\0"):
                    out.append(int(name))
        except OSError:
            pass
    return out


def _signal_job(job_id, pgid, sig):
    if pgid:
        try:
            os.killpg(pgid, sig)
        except OSError:
            pass
    for pid in _tagged_pids(job_id):
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def run_job(seq):
    job = load_job(seq)
    jd = job_dir(seq)
    delete_flag = os.path.join(jd, "delete")
    runner_log = sys.stderr

    def finish(state_comment, exit_status):
        job["state"] = "F"
        job["exit_status"] = exit_status
        job["obittime"] = time.time()
        job["comment"] = state_comment
        save_job(job)

    delay = float(os.environ.get("PBS_EMULATOR_QUEUE_DELAY", "0") or 0)
    t_end = time.time() + delay
    while time.time() < t_end:
        if os.path.exists(delete_flag):
            job["deleted"] = True
            finish("Job deleted before it ran", None)
            return 0
        time.sleep(0.05)
    if os.path.exists(delete_flag):
        job["deleted"] = True
        finish("Job deleted before it ran", None)
        return 0

    # As PBS Pro's mom does: a short per-job TMPDIR (/var/tmp/pbs.<jobid>); a long one breaks
    # AF_UNIX sockets (108-byte paths), which Python's multiprocessing puts there.
    tmpdir = os.path.join("/var/tmp", "pbs." + job["id"])
    os.makedirs(tmpdir, exist_ok=True)
    env, home = _job_env(job, tmpdir)
    shell = job["shell"] or "/bin/bash"
    script = os.path.join(jd, "script")

    def opener(path):
        d = os.path.dirname(path)
        if d and not os.path.isdir(d):
            os.makedirs(d, exist_ok=True)
        return open(path, "ab", buffering=0)

    join = job["join"]
    try:
        if join == "oe":
            out = opener(job["stdout_path"])
            err = out
        elif join == "eo":
            err = opener(job["stderr_path"])
            out = err
        else:
            out = opener(job["stdout_path"])
            err = opener(job["stderr_path"])
    except OSError as e:
        finish("job could not open its output files: %s" % e, -1)
        return 0

    try:
        proc = subprocess.Popen([shell, script], cwd=home if os.path.isdir(home) else "/",
                                env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                close_fds=True, start_new_session=True)
    except OSError as e:
        err.write(("=>> PBS: could not start job shell %s: %s\n" % (shell, e)).encode())
        finish("job exec failed", -1)  # JOB_EXEC_FAIL1
        return 0

    job["state"] = "R"
    job["stime"] = time.time()
    job["session_id"] = proc.pid
    job["run_count"] = 1
    job["comment"] = "Job run at %s on (%s)" % (
        time.strftime("%a %b %d at %H:%M", time.localtime(job["stime"])),
        "+".join("%s:ncpus=%s" % (h, c.get("ncpus", 1)) for h, c in zip(job["chunk_hosts"], job["chunks"])))
    save_job(job)

    kill_delay = float(os.environ.get("PBS_EMULATOR_KILL_DELAY", "10") or 10)
    deadline = job["stime"] + job["walltime_s"]
    term_sent_at = None
    reason = None
    rc = None
    while rc is None:
        try:
            rc = proc.wait(timeout=0.1)
            break
        except subprocess.TimeoutExpired:
            pass
        now = time.time()
        if term_sent_at is None:
            if os.path.exists(delete_flag):
                reason = "deleted"
            elif now >= deadline:
                reason = "walltime"
                err.write(("=>> PBS: job killed: walltime %d exceeded limit %d\n"
                           % (int(now - job["stime"]), int(job["walltime_s"]))).encode())
            if reason:
                job["state"] = "E"
                job["deleted"] = reason == "deleted"
                job["killed_walltime"] = reason == "walltime"
                save_job(job)
                _signal_job(job["id"], proc.pid, signal.SIGTERM)
                term_sent_at = now
        elif now - term_sent_at >= kill_delay:
            _signal_job(job["id"], proc.pid, signal.SIGKILL)
            term_sent_at = float("inf")  # KILL sent once; keep waiting
    # the job shell has exited: reap anything the job left behind in its session
    _signal_job(job["id"], proc.pid, signal.SIGKILL)
    shutil.rmtree(tmpdir, ignore_errors=True)  # PBS Pro removes the job's TMPDIR too
    used = time.time() - job["stime"]
    job["resources_used"] = {"walltime": hms(used), "cput": hms(used), "ncpus": job["resource_list"].get("ncpus", 1),
                             "mem": "0kb", "vmem": "0kb", "cpupercent": 0}
    exit_status = rc if rc >= 0 else 256 + (-rc)
    if reason == "walltime":
        exit_status = EXIT_WALLTIME
        comment = "job killed: walltime %d exceeded limit %d" % (int(used), int(job["walltime_s"]))
    elif reason == "deleted":
        comment = "Job deleted by qdel; job ran and was killed"
    else:
        comment = job["comment"] + " and finished"
    for f in {id(out): out, id(err): err}.values():
        try:
            f.close()
        except OSError:
            pass
    finish(comment, exit_status)
    runner_log.flush()
    return 0


# ----------------------------------------------------------------------------- qstat

def _pid_alive(pid):
    if not pid:
        return False
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("State:"):
                    return line.split()[1] not in ("Z", "X")
    except OSError:
        return False
    return True


def _runner_pid(seq):
    try:
        with open(os.path.join(job_dir(seq), "runner.pid")) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def _refresh(job):
    """A job whose runner died without recording the end is finished (like a MoM that lost it)."""
    if job["state"] != "F":
        pid = _runner_pid(job["seq"])
        if pid is not None and not _pid_alive(pid):
            job = load_job(job["seq"]) or job  # may have just finished
            if job["state"] != "F":
                job["state"] = "F"
                job["exit_status"] = job.get("exit_status") if job.get("exit_status") is not None else -3
                job["comment"] = "job lost: the emulator's runner process died"
                save_job(job)
    return job


def _full(job):
    st = job["state"]
    d = {
        "Job_Name": job["name"],
        "Job_Owner": job["owner"],
        "job_state": st,
        "queue": job["queue"],
        "server": server_name(),
        "Checkpoint": "u",
        "ctime": fmt_time(job["ctime"]),
        "Error_Path": "%s:%s" % (job["submit_host"], job["stderr_path"]),
        "Hold_Types": "n",
        "Join_Path": job["join"],
        "Keep_Files": job["keep"],
        "Mail_Points": job["mail"],
        "mtime": fmt_time(job["mtime"]),
        "Output_Path": "%s:%s" % (job["submit_host"], job["stdout_path"]),
        "Priority": job["priority"],
        "qtime": fmt_time(job["qtime"]),
        "Rerunable": job["rerun"],
        "Resource_List": job["resource_list"],
        "substate": SUBSTATE.get(st, 0),
        "Variable_List": job["variable_list"],
        "comment": job["comment"],
        "etime": fmt_time(job["etime"]),
        "Submit_arguments": job["submit_args"],
        "project": job["project"],
        "Submit_Host": job["submit_host"],
    }
    if job["account"]:
        d["Account_Name"] = job["account"]
    if job["stime"]:
        chunks = job["chunks"]
        hosts_per_chunk = job["chunk_hosts"]
        d["exec_host"] = "+".join("%s/0*%s" % (h, c.get("ncpus", 1)) for h, c in zip(hosts_per_chunk, chunks))
        d["exec_vnode"] = "+".join("(%s:ncpus=%s%s)" % (h, c.get("ncpus", 1), ":ngpus=%s" % c["ngpus"] if "ngpus" in c else "")
                                   for h, c in zip(hosts_per_chunk, chunks))
        d["stime"] = fmt_time(job["stime"])
        d["session_id"] = job["session_id"]
        d["jobdir"] = job["variable_list"].get("PBS_O_HOME", "/")
        d["run_count"] = job["run_count"]
        used = job.get("resources_used") or {
            "walltime": hms(time.time() - job["stime"]), "cput": "00:00:00",
            "ncpus": job["resource_list"].get("ncpus", 1), "mem": "0kb", "vmem": "0kb", "cpupercent": 0}
        d["resources_used"] = used
    if st == "F":
        if job["exit_status"] is not None:
            d["Exit_status"] = job["exit_status"]
        if job.get("obittime"):
            d["obittime"] = fmt_time(job["obittime"])
        d["history_timestamp"] = int(job.get("obittime") or job["mtime"])
    return d


def _print_full_text(jid, d):
    print("Job Id: %s" % jid)
    for k, v in d.items():
        if isinstance(v, dict):
            if k == "Variable_List":
                print("    %s = %s" % (k, ",".join("%s=%s" % kv for kv in v.items())))
            else:
                for k2, v2 in v.items():
                    print("    %s.%s = %s" % (k, k2, v2))
        else:
            print("    %s = %s" % (k, v))
    print()


def qstat_main(argv):
    history = False
    full = False
    fmt = None
    ids = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("-") and len(a) > 1:
            letters = a[1:]
            j = 0
            while j < len(letters):
                c = letters[j]
                if c == "x":
                    history = True
                elif c == "f":
                    full = True
                elif c == "w" or c == "t" or c == "a" or c == "1" or c == "n" or c == "s":
                    pass
                elif c == "H":
                    history = True
                elif c == "F":
                    val = letters[j + 1:]
                    if not val:
                        i += 1
                        if i >= len(argv):
                            sys.stderr.write("qstat: option requires an argument -- 'F'\n")
                            return RC_USAGE
                        val = argv[i]
                    fmt = val.lower()
                    break
                elif c == "u":
                    val = letters[j + 1:]
                    if not val:
                        i += 1
                    break  # single-user emulator: every job is the user's
                else:
                    sys.stderr.write("qstat: invalid option -- '%s' (PBS Pro emulator supports "
                                     "-x -H -f -F json|dsv -w -t -a -u)\n" % c)
                    return RC_USAGE
                j += 1
        else:
            ids.append(a)
        i += 1
    if fmt is not None and fmt not in ("json", "dsv"):
        sys.stderr.write("qstat: invalid format %r\n" % fmt)
        return RC_USAGE
    if fmt is not None and not full:
        sys.stderr.write("qstat: -F requires -f\n")
        return RC_USAGE

    rc = 0
    selected = []
    if ids:
        for jid in ids:
            seq = resolve(jid)
            if seq is None:
                sys.stderr.write("qstat: Unknown Job Id %s\n" % jid)
                rc = RC_UNKNOWN_JOB
                continue
            job = _refresh(load_job(seq))
            if job["state"] == "F" and not history:
                sys.stderr.write("qstat: %s Job has finished, use -x or -H to obtain historical job information\n" % job["id"])
                rc = RC_HISTORY_JOB
                continue
            selected.append(job)
    else:
        for seq in all_seqs():
            job = load_job(seq)
            if job is None:
                continue
            job = _refresh(job)
            if job["state"] == "F" and not history:
                continue
            selected.append(job)

    if full:
        if fmt == "json":
            out = {"timestamp": int(time.time()), "pbs_version": PBS_VERSION, "pbs_server": server_name()}
            if selected:
                out["Jobs"] = {job["id"]: _full(job) for job in selected}
            print(json.dumps(out, indent=4))
        elif fmt == "dsv":
            for job in selected:
                d = _full(job)
                flat = ["Job Id=%s" % job["id"]]
                for k, v in d.items():
                    if isinstance(v, dict):
                        flat.extend("%s.%s=%s" % (k, k2, v2) for k2, v2 in v.items())
                    else:
                        flat.append("%s=%s" % (k, v))
                print("|".join(flat))
        else:
            for job in selected:
                _print_full_text(job["id"], _full(job))
    elif selected:
        print("Job id            Name             User              Time Use S Queue")
        print("----------------  ---------------- ----------------  -------- - -----")
        for job in selected:
            jid = job["id"]
            if len(jid) > 16:
                jid = jid[:15] + "*"
            used = "00:00:00" if not job["stime"] else (job.get("resources_used") or {}).get("cput", "00:00:00")
            print("%-16s  %-16s %-16s  %8s %s %-5s" % (jid, job["name"][:16], job["user"][:16], used,
                                                      job["state"], job["queue"]))
    return rc


# ----------------------------------------------------------------------------- qdel

def qdel_main(argv):
    ids = []
    force = False
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "-W":
            i += 1
            force = i < len(argv) and argv[i] == "force"
        elif a.startswith("-W"):
            force = a[2:] == "force"
        elif a in ("-x", "-Wsuppress_email"):
            pass
        elif a.startswith("-"):
            sys.stderr.write("qdel: invalid option -- '%s'\nusage: qdel [-W force|suppress_email=X] [-x] job_identifier...\n" % a)
            return RC_USAGE
        else:
            ids.append(a)
        i += 1
    if not ids:
        sys.stderr.write("usage: qdel [-W force|suppress_email=X] [-x] job_identifier...\n")
        return RC_USAGE
    rc = 0
    for jid in ids:
        seq = resolve(jid)
        if seq is None:
            sys.stderr.write("qdel: Unknown Job Id %s\n" % jid)
            rc = RC_UNKNOWN_JOB
            continue
        job = _refresh(load_job(seq))
        if job["state"] == "F":
            sys.stderr.write("qdel: Job has finished %s\n" % job["id"])
            rc = RC_HISTORY_JOB
            continue
        with open(os.path.join(job_dir(seq), "delete"), "w") as f:
            f.write("force\n" if force else "\n")
        runner = _runner_pid(seq)
        if force or not _pid_alive(runner):
            # no MoM to do it (or -W force): kill now and record the end ourselves
            _signal_job(job["id"], job.get("session_id"), signal.SIGKILL)
            if runner and _pid_alive(runner):
                try:
                    os.kill(runner, signal.SIGKILL)
                except OSError:
                    pass
            job = load_job(seq)
            job["state"] = "F"
            job["deleted"] = True
            job["exit_status"] = 256 + signal.SIGKILL if job.get("stime") else None
            job["obittime"] = time.time()
            job["comment"] = "Job deleted by qdel -W force" if force else "Job deleted by qdel"
            save_job(job)
    return rc


def main(prog, argv):
    if prog == "qsub":
        return qsub_main(argv)
    if prog == "qstat":
        return qstat_main(argv)
    if prog == "qdel":
        return qdel_main(argv)
    sys.stderr.write("pbs_emulator: unknown command %s\n" % prog)
    return RC_USAGE


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "_run":
        sys.exit(run_job(int(sys.argv[2])))
    if len(sys.argv) >= 2:
        sys.exit(main(sys.argv[1], sys.argv[2:]))
    sys.stderr.write("usage: pbs_emulator.py qsub|qstat|qdel [args]\n")
    sys.exit(RC_USAGE)
