"""Claim: the ledger stays fast at a million steps. `campaign status` reads counters, not
step rows, so it costs the same at 1,000,000 rows as at 1,000 (target <= 1.5x); the
progress plot's query downsamples in SQL; ingestion keeps up (target >= 100,000 rows/s
on SQLite, through `writes.ingest_steps` in batches, as the engine calls it).

    python benchmarks/ledger_scale.py                       # SQLite and Postgres, 1k and 1M rows
    python benchmarks/ledger_scale.py --rows 1000 100000 --no-postgres

Each run builds one campaign with a long-run stage of 100 attempts (relaunches) holding
the rows, in a fresh SQLite file and a throwaway Postgres database (created and dropped;
CAMPAIGN_TEST_PG, default postgresql://postgres@127.0.0.1:5432/postgres). Timings are
medians of `--repeat` runs, in process (interpreter start-up left out).
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from click.testing import CliRunner  # noqa: E402

from _target import Targets  # noqa: E402
from campaign.cli import main  # noqa: E402
from campaign.ledger import Ledger, open_ledger  # noqa: E402
from campaign.ledger import reads, writes  # noqa: E402
from campaign.ledger.models import Attempt, StageRun  # noqa: E402

ATTEMPTS = 100
PG_ADMIN = os.environ.get("CAMPAIGN_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


def build(led: Ledger, rows: int, batch: int) -> float:
    """One campaign, `rows` step rows over ATTEMPTS attempts; returns ingestion rows/s."""
    per = rows // ATTEMPTS
    with led.session() as s:
        c = writes.create_campaign(s, name="bench", digest="b" * 64, spec_json={"name": "bench"}, source="", site="bench",
                                   workdir="/tmp/bench")
        (run,) = writes.ensure_stage_runs(s, c, [("long-run", "long_run")])
        writes.set_campaign_state(s, c, "running")
        run_id = run.id
    spent = 0.0
    for n in range(ATTEMPTS):
        first = n * per + 1
        data = [{"step": i, "tokens": 4096 * i, "loss": 8.0 / (1 + i * 1e-4), "step_time_s": 0.5, "tokens_per_s": 8192.0,
                 "comm_time_s": 0.05, "mem_peak_gib": 40.0, "lr": 3e-4} for i in range(first, first + per)]
        with led.session() as s:
            run = s.get(StageRun, run_id)
            a = writes.create_attempt(s, run, nodes=[f"x{n:04d}", f"x{n + 1:04d}"], ranks_per_node=12, run_dir=f"/tmp/a{n}")
            attempt_id = a.id
        t = time.perf_counter()
        for b in range(0, per, batch):
            with led.session() as s:
                writes.ingest_steps(s, s.get(Attempt, attempt_id), data[b:b + batch])
        spent += time.perf_counter() - t
        with led.session() as s:
            a = s.get(Attempt, attempt_id)
            writes.finish_attempt(s, a, state="stalled" if n < ATTEMPTS - 1 else "running", exit_code=124, suspects=[],
                                  summary={})
    return rows / spent


def timed(fn: Callable[[], Any], repeat: int) -> float:
    fn()  # warm: imports, caches, the first connection
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def measure(url: str, rows: int, batch: int, repeat: int) -> dict[str, float]:
    led = open_ledger(url)
    try:
        rate = build(led, rows, batch)
    finally:
        led.close()
    runner = CliRunner()

    def status(*extra: str) -> None:
        result = runner.invoke(main, ["status", "bench", "--db", url, *extra], catch_exceptions=False)
        assert result.exit_code == 0, result.output

    def plot_query() -> None:
        led = open_ledger(url)
        try:
            with led.session() as s:
                series = reads.sample_campaign_steps(s, reads.get_campaign(s, "bench"), max_points=4000)
                assert sum(len(x["steps"]) for x in series) <= 4000 + 2 * ATTEMPTS
        finally:
            led.close()

    return {"ingest": rate, "status": timed(status, repeat), "json": timed(lambda: status("--json"), repeat),
            "plot": timed(plot_query, repeat)}


def pg_database() -> tuple[str, Callable[[], None]]:
    import psycopg
    import sqlalchemy as sa

    name = f"campaign_bench_{secrets.token_hex(4)}"
    admin = psycopg.connect(PG_ADMIN, autocommit=True)
    admin.execute(f'CREATE DATABASE "{name}"')

    def drop() -> None:
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))
        admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        admin.close()

    url = sa.engine.make_url(PG_ADMIN).set(drivername="postgresql+psycopg", database=name)
    return url.render_as_string(hide_password=False), drop


def main_() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1_000, 1_000_000])
    ap.add_argument("--batch", type=int, default=5_000, help="Rows per ingest_steps call (one transaction each).")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-postgres", action="store_true")
    args = ap.parse_args()
    results: dict[tuple[str, int], dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for rows in args.rows:
            results[("sqlite", rows)] = measure(f"sqlite:///{tmp}/ledger-{rows}.db", rows, args.batch, args.repeat)
            if not args.no_postgres:
                url, drop = pg_database()
                try:
                    results[("postgres", rows)] = measure(url, rows, args.batch, args.repeat)
                finally:
                    drop()
    print(f"{'database':<9} {'rows':>10} {'ingest rows/s':>14} {'status ms':>10} {'--json ms':>10} {'plot query ms':>14}")
    for (db, rows), r in results.items():
        print(f"{db:<9} {rows:>10,} {r['ingest']:>14,.0f} {1000 * r['status']:>10.1f} {1000 * r['json']:>10.1f} "
              f"{1000 * r['plot']:>14.1f}")
    lo, hi = min(args.rows), max(args.rows)
    targets = Targets("ledger_scale")
    for db in ("sqlite", "postgres"):
        if (db, lo) in results and (db, hi) in results and lo != hi:
            a, b = results[(db, lo)], results[(db, hi)]
            print(f"{db}: --json {b['json'] / a['json']:.2f}x; plot query {b['plot'] / a['plot']:.2f}x")
            targets.check(f"{db} status at {hi:,} / at {lo:,} rows", b["status"] / a["status"], "<=", 1.5, "x")
    if ("sqlite", hi) in results:
        targets.check(f"sqlite ingestion at {hi:,} rows", results[("sqlite", hi)]["ingest"], ">=", 100_000, " rows/s")
    targets.exit()


if __name__ == "__main__":
    main_()
