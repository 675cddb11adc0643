"""Claim: the supervisor and the ledger hold at Aurora size (10,624 nodes x 12 ranks), by simulation.

1. Heartbeats cost the shared filesystem's metadata servers (MDS) at most 1,000 operations/s
   at full machine (writers + the supervisor's reads), against ~117,000/s for one file per
   node rewritten by tmp + rename every second and listed + opened every 0.25 s poll.
   Operations are counted, not guessed: a `sys.addaudithook` counts what the package's own
   code asks of the filesystem under the run directory (an open counts 2: open + close
   RPCs; a rename 1; a directory listing 1; a mkdir or unlink 1; pwrite/read on an open file
   0: they go to the object servers, not the MDS) while a real `report.Reporter` beats and
   while `runfiles.read_heartbeats` reads N synthetic nodes. Writer ops/s = N x ops per beat /
   interval (1 s, the engine's CAMPAIGN_HEARTBEAT_INTERVAL); reader ops/s = ops per read x
   reads per second (one per supervisor poll, `supervisor.POLL_S`).
2. One supervisor poll stays under 1 s at 10,624 nodes and grows linearly: synthetic writers
   for N nodes on a local filesystem (heartbeats as the trainer writes them, metrics.jsonl,
   events.jsonl, a PALS launcher log with one line per rank), then the package's functions
   a poll calls, timed: read_metrics (offset), read_events_from (offset; the baseline
   read_events re-reads the whole file), read_heartbeats, watchdog.decide, and on a stall
   read_heartbeats + culprits + stragglers. Once per attempt: launchers.build_command +
   render for PALS mpiexec and the hostfile; supervisor.launcher_failure on the launcher log.
3. The team's ledger takes 50 campaigns driven at once on one Postgres: one thread per
   campaign (its own Ledger, as each driver process has) ingests steps through the ledger
   API while a separate process runs status (describe_campaign) and plot
   (sample_campaign_steps) queries; no row is lost (count per campaign == rows written)
   and status latency p50/p99 is compared with the same queries on the idle database.

    python benchmarks/scale.py                                  # 512, 2,048, 10,624 nodes; Postgres load
    python benchmarks/scale.py --nodes 64 512 --repeat 1 --no-postgres --ledger-seconds 5

Prints one table per part, ratios against the baselines measured in the same run, and as
its last line `nodes=N poll_ms=X fs_ops_per_s=Y` for the largest N.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import secrets
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import sqlalchemy as sa  # noqa: E402

from _target import Targets  # noqa: E402
from campaign import report, runfiles, supervisor, watchdog  # noqa: E402
from campaign.executors import aurora, launchers  # noqa: E402
from campaign.ledger import open_ledger  # noqa: E402
from campaign.ledger.models import Attempt, StageRun, StepMetric  # noqa: E402
# The ledger API this benchmark drives, imported in ONE place.
from campaign.ledger.reads import get_campaign, sample_campaign_steps  # noqa: E402
from campaign.summary import describe_campaign  # noqa: E402
from campaign.ledger.writes import (  # noqa: E402
    create_attempt, create_campaign, ensure_stage_runs, ingest_steps, set_campaign_state)

RANKS_PER_NODE = aurora.RANKS_PER_NODE
INTERVAL_S = 1.0  # the engine's CAMPAIGN_HEARTBEAT_INTERVAL
PG_ADMIN = os.environ.get("CAMPAIGN_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")


# --- counting metadata operations ------------------------------------------------------
class MdsCounter:
    """Counts filesystem operations under `root` through Python's audit events."""

    WEIGHTS = {"open": 2, "os.rename": 1, "os.scandir": 1, "os.listdir": 1, "os.mkdir": 1, "os.remove": 1,
               "os.rmdir": 1}

    def __init__(self) -> None:
        self.root: str | None = None
        self.ops = 0
        sys.addaudithook(self._hook)

    def _hook(self, event: str, args: tuple[Any, ...]) -> None:
        if self.root is None or event not in self.WEIGHTS or not args:
            return
        path = args[0]
        if isinstance(path, int):
            return  # an already open descriptor (os.fdopen, fd-relative scandir)
        if str(os.fspath(path)).startswith(self.root):
            self.ops += self.WEIGHTS[event]

    def count(self, root: Path, fn: Any) -> int:
        self.root, self.ops = str(root), 0
        try:
            fn()
        finally:
            self.root = None
        return self.ops


COUNTER = MdsCounter()


def writer_ops_per_beat(tmp: Path, layout: str, beats: int = 5) -> tuple[int, float]:
    """(startup ops, steady ops per beat) of one node's local rank 0, a real Reporter."""
    run = tmp / f"writer-{layout}"
    run.mkdir()
    slot = (300, "x4000c0s0b0n0.hsn.cm") if layout == "slots" else None
    holder: list[report.Reporter] = []
    startup = COUNTER.count(run, lambda: holder.append(report.Reporter(
        run, rank=0, local_rank=0, world_size=RANKS_PER_NODE, node="x4000c0s0b0n0",
        attempt=f"bench-{secrets.token_hex(4)}", interval=3600, slot=slot)))
    rep = holder[0]
    # One beat as the heartbeat thread does it (private: the thread's own body).
    steady = COUNTER.count(run, lambda: [rep._publish() for _ in range(beats)]) / beats
    startup += COUNTER.count(run, lambda: None)
    rep.close()
    return startup, steady


# --- synthetic run directories ---------------------------------------------------------
def host(i: int) -> str:
    return f"x{4000 + i // 64:04d}c{i // 8 % 8}s{i % 8}b0n0"


def node_doc(i: int, now: float, frozen: int, slow: int) -> dict[str, Any]:
    t = now - 60 if i == frozen else now - random.random()
    ranks = {}
    for lr in range(RANKS_PER_NODE):
        r = i * RANKS_PER_NODE + lr
        phase = "compute" if i == frozen else "collective"
        ranks[str(r)] = {"step": 1234, "phase": phase, "since": now - 2.5, "time": t,
                         "compute_s": round((1.8 if i == slow else 0.45) + 0.01 * random.random(), 4)}
    return {"node": host(i), "time": t, "ranks": ranks}


def build_run_dir(run: Path, n: int, layout: str, now: float, metrics_rows: int, events: int) -> None:
    beats = run / report.HEARTBEAT_DIR
    beats.mkdir(parents=True)
    frozen, slow = n // 3, n // 2
    if layout == "files":
        for i in range(n):
            report.write_json_atomic(beats / f"{host(i)}.json", node_doc(i, now, frozen, slow))
    else:
        fds: dict[str, int] = {}
        for i in range(n):
            name = report.heartbeat_group_file(i)
            if name not in fds:
                fds[name] = os.open(beats / name, os.O_RDWR | os.O_CREAT, 0o644)
            rec = report.encode_heartbeat_slot(node_doc(i, now, frozen, slow))
            assert rec is not None
            os.pwrite(fds[name], rec, report.heartbeat_slot_offset(i))
        for fd in fds.values():
            os.close(fd)
    with open(run / report.METRICS_FILE, "w") as f:
        for s in range(1, metrics_rows + 1):
            f.write(json.dumps({"step": s, "tokens": s * 4 * 2**20, "loss": 3.0, "step_time_s": 2.4,
                                "tokens_per_s": 1.7e6, "time": now - (metrics_rows - s) * 2.4}) + "\n")
    with open(run / report.EVENTS_FILE, "w") as f:
        f.write(json.dumps({"event": "start", "step": 0, "time": now}) + "\n")
        for e in range(events):
            f.write(json.dumps({"event": "checkpoint_saved", "step": 100 * e, "time": now, "seconds": 40.0,
                                "path": f"/lus/flare/ck/step-{100 * e:08d}", "tokens": e}) + "\n")
    (run / "logs").mkdir()
    with open(run / "logs" / "launcher.log", "w") as f:  # PALS: every rank stopped after rank 7 of n/2 died
        bad = (n // 2) * RANKS_PER_NODE + 7
        for r in range(n * RANKS_PER_NODE):
            if r == bad:
                f.write(f"{host(r // RANKS_PER_NODE)}: rank {r} died from signal 9\n")
            f.write(f"{host(r // RANKS_PER_NODE)}: rank {r} exited with code 143\n")


def rewrite_heartbeats(run: Path, n: int, layout: str, share: float, now: float) -> None:
    """Rewrite the heartbeats of a random `share` of the nodes, as their trainers would."""
    beats = run / report.HEARTBEAT_DIR
    frozen, slow = n // 3, n // 2
    fds: dict[str, int] = {}
    for i in random.sample(range(n), int(share * n)):
        if i == frozen:
            continue
        doc = node_doc(i, now, frozen, slow)
        if layout == "files":
            report.write_json_atomic(beats / f"{host(i)}.json", doc)
            continue
        name = report.heartbeat_group_file(i)
        if name not in fds:
            fds[name] = os.open(beats / name, os.O_RDWR)
        os.pwrite(fds[name], report.encode_heartbeat_slot(doc), report.heartbeat_slot_offset(i))
    for fd in fds.values():
        os.close(fd)


def median_ms(fn: Any, repeat: int) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return 1000 * statistics.median(times), out


def poll_parts(run: Path, n: int, layout: str, repeat: int, now: float) -> dict[str, float]:
    """Median ms of each thing one supervisor poll does, over `repeat` polls."""
    policy = watchdog.WatchdogPolicy()
    hosts = [host(i) for i in range(n)]
    w = watchdog.Watch(started=now - 3600)
    w.saw_steps([{"step": s, "step_time_s": 2.4} for s in range(1, 300)], now - 60)
    offsets = {"metrics": os.path.getsize(run / report.METRICS_FILE) - 200, "events": 0}
    offsets["metrics"] = (run / report.METRICS_FILE).read_bytes().rfind(b"\n", 0, offsets["metrics"]) + 1
    ev_offset = (run / report.EVENTS_FILE).stat().st_size
    step = [10**6]

    def metrics() -> Any:  # one new step per poll, read from the last offset
        step[0] += 1
        with open(run / report.METRICS_FILE, "a") as f:
            f.write(json.dumps({"step": step[0], "tokens": 1, "loss": 3.0, "step_time_s": 2.4}) + "\n")
        rows, offsets["metrics"] = runfiles.read_metrics(run, offsets["metrics"])
        return rows

    def events_new() -> Any:
        return runfiles.read_events_from(run, ev_offset)

    def events_old() -> Any:
        return runfiles.read_events(run)[-1:]

    def heartbeats() -> Any:  # what _observe does with them: the set of phases
        beats = runfiles.read_heartbeats(run)
        return {r.get("phase") for b in beats.values() for r in b.get("ranks", {}).values()}

    out: dict[str, float] = {}
    out["metrics"], _ = median_ms(metrics, repeat)
    out["events"], _ = median_ms(events_new if layout == "slots" else events_old, repeat)
    out["beats_cold"], phases = median_ms(heartbeats, 1)  # the first read of this run directory
    assert phases == {"compute", "collective"}, phases
    # Between two polls (POLL_S apart) a node rewrote its heartbeat with probability
    # POLL_S / interval: rewrite that share of the nodes (untimed), then time a poll's reads.
    share, fresh, hb_ms, cul_ms, found = supervisor.POLL_S / INTERVAL_S, None, [], [], []
    for _ in range(repeat):
        rewrite_heartbeats(run, n, layout, share, now)
        ms, fresh = median_ms(heartbeats, 1)
        hb_ms.append(ms)
        ms, found = median_ms(lambda: watchdog.culprits(runfiles.read_heartbeats(run), hosts, now, policy), 1)
        cul_ms.append(ms)
    out["heartbeats"], out["culprits"] = statistics.median(hb_ms), statistics.median(cul_ms)
    assert fresh == {"compute", "collective"}, fresh
    assert [c.node for c in found] == [host(n // 3)], found[:3]
    out["decide"], d = median_ms(lambda: watchdog.decide(w, policy, now), repeat)
    assert d.stalled
    beats = runfiles.read_heartbeats(run)
    out["stragglers"], slow = median_ms(lambda: watchdog.stragglers(beats, policy.straggler_ratio), repeat)
    assert [s["node"] for s in slow] == [host(n // 2)], slow[:3]
    out["poll"] = sum(out[k] for k in ("metrics", "events", "heartbeats", "decide", "culprits", "stragglers"))

    def launch() -> str:
        plan = launchers.LaunchPlan(
            hosts=tuple(hosts), ranks_per_node=RANKS_PER_NODE, argv=("python3", "-m", "campaign.train", "--config",
                                                                     str(run / "trainer.json")),
            env=(("CAMPAIGN_RUN_DIR", str(run)), ("CAMPAIGN_HOSTFILE", str(run / "hostfile"))),
            hostfile=str(run / "hostfile"), cpu_bind=aurora.CPU_BIND, gpu_bind=aurora.GPU_BIND,
            master_port=29500)
        cmd = launchers.build_command("pals", plan)
        assert cmd[2] == str(n * RANKS_PER_NODE)
        (run / "hostfile").write_text("".join(f"{h}\n" for h in hosts))
        return launchers.render("pals", plan)

    out["launch"], _ = median_ms(launch, max(1, repeat // 2))
    log = run / "logs" / "launcher.log"
    out["launcher_log"], failure = median_ms(lambda: supervisor.launcher_failure(log, supervisor.Failure(-1, 1, "", now)),
                                             max(1, repeat // 2))
    assert failure[:3] == ((n // 2) * RANKS_PER_NODE + 7, 137, host(n // 2)), failure
    return out


def reader_ops(run: Path) -> int:
    return COUNTER.count(run, lambda: runfiles.read_heartbeats(run))


def part_supervisor(args: argparse.Namespace, tmp: Path) -> dict[int, dict[str, Any]]:
    print("== 1+2. heartbeats and one supervisor poll (ms: median of "
          f"{args.repeat}; ops: MDS operations counted)")
    ws = {layout: writer_ops_per_beat(tmp, layout) for layout in ("files", "slots")}
    for layout, (startup, steady) in ws.items():
        print(f"writer ({layout}): {startup} ops at start, {steady:g} ops per beat")
    polls_per_s = 1.0 / supervisor.POLL_S
    results: dict[int, dict[str, Any]] = {}
    now = time.time()
    hdr = (f"{'nodes':>6} {'layout':<6} {'metrics':>7} {'events':>7} {'cold':>6} {'beats':>7} {'decide':>6} {'culprit':>7} "
           f"{'strag':>6} {'poll ms':>8} {'launch':>7} {'pals log':>8} {'w ops/s':>8} {'r ops/s':>8} {'fs ops/s':>9}")
    print(hdr)
    for n in args.nodes:
        for layout in ("files", "slots"):
            run = tmp / f"run-{n}-{layout}"
            random.seed(n)
            build_run_dir(run, n, layout, now, args.metrics_rows, args.events)
            parts = poll_parts(run, n, layout, args.repeat, now)
            w_ops = n * ws[layout][1] / INTERVAL_S
            r_ops = reader_ops(run) * polls_per_s
            parts.update(w_ops=w_ops, r_ops=r_ops, fs_ops=w_ops + r_ops)
            results.setdefault(n, {})[layout] = parts
            p = parts
            print(f"{n:>6} {layout:<6} {p['metrics']:>7.2f} {p['events']:>7.2f} {p['beats_cold']:>6.0f} "
                  f"{p['heartbeats']:>7.1f} "
                  f"{p['decide']:>6.2f} {p['culprits']:>7.1f} {p['stragglers']:>6.1f} {p['poll']:>8.1f} "
                  f"{p['launch']:>7.1f} {p['launcher_log']:>8.1f} {w_ops:>8,.0f} {r_ops:>8,.0f} {p['fs_ops']:>9,.0f}")
            shutil.rmtree(run)
    lo, hi = min(args.nodes), max(args.nodes)
    for n in args.nodes:
        b, s = results[n]["files"], results[n]["slots"]
        grow = f"; vs {lo} nodes: nodes x{n / lo:.1f}, poll x{s['poll'] / results[lo]['slots']['poll']:.2f}" \
            if n != lo else ""
        print(f"{n:>6} nodes: poll {s['poll']:.1f} ms vs baseline {b['poll']:.1f} ms ({b['poll'] / s['poll']:.2f}x "
              f"faster); fs ops/s {s['fs_ops']:,.0f} vs baseline {b['fs_ops']:,.0f} "
              f"({b['fs_ops'] / max(s['fs_ops'], 1e-9):.0f}x fewer){grow}")
    return results


# --- 3. the team ledger under load ---------------------------------------------------------
def pg_database() -> tuple[str, Any]:
    import psycopg

    name = f"campaign_scale_{secrets.token_hex(4)}"
    admin = psycopg.connect(PG_ADMIN, autocommit=True)
    admin.execute(f'CREATE DATABASE "{name}"')

    def drop() -> None:
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))
        admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        admin.close()

    url = sa.engine.make_url(PG_ADMIN).set(drivername="postgresql+psycopg", database=name)
    return url.render_as_string(hide_password=False), drop


def drive(url: str, name: str, seconds: float, batch: int, written: dict[str, int], errors: list[str]) -> None:
    """One campaign's driver: its own Ledger; ingests `batch` new steps about 10 times a second."""
    try:
        led = open_ledger(url)
        with led.session() as s:
            c = create_campaign(s, name=name, digest=secrets.token_hex(32), spec_json={"name": name}, source="",
                                site="aurora", workdir=f"/lus/flare/{name}")
            (run,) = ensure_stage_runs(s, c, [("long-run", "long_run")])
            set_campaign_state(s, c, "running")
            a = create_attempt(s, run, nodes=[host(i) for i in range(64)], ranks_per_node=12, run_dir=f"/tmp/{name}")
            attempt_id = a.id
        step, end = 0, time.monotonic() + seconds
        while time.monotonic() < end:
            rows = [{"step": step + i, "tokens": (step + i) * 4096, "loss": 3.0 + random.random(), "step_time_s": 2.4,
                     "tokens_per_s": 1.7e6, "lr": 3e-4, "time": time.time()} for i in range(1, batch + 1)]
            with led.session() as s:
                ingest_steps(s, s.get(Attempt, attempt_id), rows)
            step += batch
            written[name] = step
            time.sleep(0.1)
        led.close()
    except Exception as e:  # reported, and the run fails
        errors.append(f"{name}: {e!r}")


def query_loop(url: str, names: list[str], seconds: float, threads: int, queue: Any) -> None:
    """A separate process (as `campaign status` / `campaign plot` are): status and plot queries."""
    led = open_ledger(url, create=False)
    lat: dict[str, list[float]] = {"status": [], "plot": []}
    lock = threading.Lock()

    def loop(seed: int) -> None:
        rng, end = random.Random(seed), time.monotonic() + seconds
        while time.monotonic() < end:
            name = rng.choice(names)
            t = time.perf_counter()
            with led.session() as s:
                describe_campaign(s, get_campaign(s, name))
            t2 = time.perf_counter()
            with led.session() as s:
                sample_campaign_steps(s, get_campaign(s, name), max_points=4000)
            t3 = time.perf_counter()
            with lock:
                lat["status"].append(t2 - t)
                lat["plot"].append(t3 - t2)

    ts = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    led.close()
    queue.put(lat)


def pct(values: list[float], p: float) -> float:
    v = sorted(values)
    return 1000 * v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))]


def part_ledger(args: argparse.Namespace) -> dict[str, Any]:
    print(f"== 3. team ledger: {args.campaigns} campaigns driven at once on one Postgres, "
          f"{args.ledger_seconds:g} s, {args.query_threads} query threads in another process")
    url, drop = pg_database()
    try:
        open_ledger(url).close()  # create + migrate once, before the drivers race to
        names = [f"team-{i:02d}" for i in range(args.campaigns)]
        written: dict[str, int] = {}
        errors: list[str] = []
        ctx = mp.get_context("fork")
        # Baseline: the same queries on the idle database (campaigns exist, first rows in).
        drivers = [threading.Thread(target=drive, args=(url, n, 0.5, args.batch, written, errors)) for n in names]
        for t in drivers:
            t.start()
        for t in drivers:
            t.join()
        assert not errors, errors
        base_written = dict(written)
        results = {}
        for label, load in (("idle", False), ("loaded", True)):
            queue = ctx.Queue()
            proc = ctx.Process(target=query_loop, args=(url, names, args.ledger_seconds, args.query_threads, queue))
            if load:
                written.clear()
                drivers = [threading.Thread(target=drive, args=(url, n + "-b", args.ledger_seconds, args.batch, written,
                                                                errors)) for n in names]
                for t in drivers:
                    t.start()
            proc.start()
            lat = queue.get(timeout=args.ledger_seconds + 120)
            proc.join()
            if load:
                for t in drivers:
                    t.join()
            results[label] = lat
        assert not errors, errors
        led = open_ledger(url, create=False)
        lost = 0
        with led.session() as s:
            counts = dict(s.execute(
                sa.select(StageRun.campaign_id, sa.func.count(StepMetric.id))
                .join(Attempt, Attempt.stage_run_id == StageRun.id).join(StepMetric, StepMetric.attempt_id == Attempt.id)
                .group_by(StageRun.campaign_id)).all())
            for name, n in {**base_written, **{k: v for k, v in written.items()}}.items():
                got = counts.get(get_campaign(s, name).id, 0)
                if got != n:
                    lost += 1
                    print(f"  LOST ROWS: {name} wrote {n}, ledger holds {got}")
        led.close()
        total = sum(written.values())
        print(f"{'load':<7} {'queries':>7} {'status p50 ms':>13} {'status p99 ms':>13} {'plot p50 ms':>11} "
              f"{'plot p99 ms':>11} {'rows ingested/s':>15}")
        for label, lat in results.items():
            rate = total / args.ledger_seconds if label == "loaded" else 0
            print(f"{label:<7} {len(lat['status']):>7} {pct(lat['status'], 50):>13.1f} {pct(lat['status'], 99):>13.1f} "
                  f"{pct(lat['plot'], 50):>11.1f} {pct(lat['plot'], 99):>11.1f} {rate:>15,.0f}")
        i, ld = results["idle"]["status"], results["loaded"]["status"]
        print(f"status under load / idle: p50 {pct(ld, 50) / pct(i, 50):.2f}x, p99 {pct(ld, 99) / pct(i, 99):.2f}x; "
              f"campaigns with lost rows: {lost} of {2 * args.campaigns} "
              f"({sum(base_written.values()) + total:,} rows written, counted back per campaign)")
        return {"lost": lost}
    finally:
        drop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[512, 2048, 10624])
    ap.add_argument("--repeat", type=int, default=5, help="Polls timed per node count (median).")
    ap.add_argument("--metrics-rows", type=int, default=20_000, help="metrics.jsonl rows already written.")
    ap.add_argument("--events", type=int, default=1_000, help="events.jsonl lines already written.")
    ap.add_argument("--no-postgres", action="store_true")
    ap.add_argument("--campaigns", type=int, default=50)
    ap.add_argument("--ledger-seconds", type=float, default=20.0, help="How long the drivers ingest under load.")
    ap.add_argument("--batch", type=int, default=10, help="Steps per ingest call (about 10 calls/s per driver).")
    ap.add_argument("--query-threads", type=int, default=2)
    args = ap.parse_args()
    args.nodes = sorted(args.nodes)
    with tempfile.TemporaryDirectory(prefix="campaign-scale-") as tmp:
        results = part_supervisor(args, Path(tmp))
    ledger = None if args.no_postgres else part_ledger(args)
    hi = args.nodes[-1]
    s = results[hi]["slots"]
    print(f"nodes={hi} poll_ms={s['poll']:.1f} fs_ops_per_s={s['fs_ops']:.0f}")
    targets = Targets("scale")
    targets.check(f"one poll at {hi:,} nodes", s["poll"], "<", 1000, " ms")
    targets.check(f"heartbeat MDS operations at {hi:,} nodes", s["fs_ops"], "<=", 1000, "/s")
    if ledger:
        targets.check("ledger rows lost under load", ledger["lost"], "==", 0)
    targets.exit()


if __name__ == "__main__":
    main()
