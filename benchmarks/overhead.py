"""Claim: `campaign submit` costs a long run little over the bare trainer: per step <= 1.02x,
and <= 5 s of fixed overhead for a 100-step run (issue 28).

    python benchmarks/overhead.py                        # 100 steps, 3 interleaved repeats: ~6 min on 2 cores
    python benchmarks/overhead.py --steps 20 --repeats 1 --d-model 128 --seq-len 64   # smoke: ~1 min

Each repeat, on this machine, in this order:
- **campaign**: `campaign submit` of a one-stage campaign (a `long_run` of `--steps` steps on
  the local site, 1 node x 1 rank, checkpoint every `--checkpoint-every`), its own ledger
  and work directory; timed from the CLI's start to its exit;
- **bare**: the same trainer config, the `trainer.json` that campaign's attempt was launched
  with (a fresh checkpoint directory), run as `python -m campaign.train --config FILE` by
  itself: no CLI, ledger, Parsl, supervisor or watchdog; timed from start to exit.
Repeats alternate which of the two runs first, so load on the machine hits both alike.

Per step: the median wall time between consecutive metrics rows (steps after the first 5;
the host's work between steps, heartbeats included, counts), campaign / bare. Fixed: the
wall time outside the steps (total minus first-to-last metrics row), campaign minus bare.
Where the campaign's fixed time goes comes from the ledger and the run directory: CLI start
to the attempt's start (imports, spec, ledger, Parsl, block), attempt start to the first
step, last step to the attempt's end, attempt's end to the CLI's exit. Targets are judged on
the median over repeats; the spread (min-max) is printed beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _target import Targets  # noqa: E402

PER_STEP_MAX = 1.02
"""campaign / bare median wall time per step."""
FIXED_MAX_S = 5.0
"""campaign minus bare wall time outside the steps, for a 100-step run."""
SKIP_STEPS = 5
"""Leading steps left out of the per-step median (warm-up, first allocation)."""


def campaign_spec(args: argparse.Namespace, name: str) -> dict[str, Any]:
    model = {"size": "tiny", "n_layer": args.n_layer, "d_model": args.d_model, "n_head": 4, "seq_len": args.seq_len}
    return {"name": name, "site": {"kind": "local", "nodes": 1, "ranks_per_node": 1}, "model": model,
            "trainer": {"micro_batch_size": args.micro_batch, "warmup_steps": 5,
                        **({} if args.warm_start == "auto" else {"warm_start": False})},
            "stages": [{"name": "long", "kind": "long_run", "nodes": 1, "steps": args.steps,
                        "checkpoint_every": args.checkpoint_every, "max_attempts": 1}]}


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return sorted({r["step"]: r for r in rows}.values(), key=lambda r: r["step"])


def step_stats(rows: list[dict[str, Any]]) -> dict[str, float]:
    gaps = [b["time"] - a["time"] for a, b in zip(rows, rows[1:]) if a["step"] >= SKIP_STEPS]
    return {"per_step_s": statistics.median(gaps), "own_step_s": statistics.median(
        r["step_time_s"] for r in rows if r["step"] > SKIP_STEPS), "first": rows[0]["time"], "last": rows[-1]["time"],
        "steps": len(rows)}


def run_campaign(args: argparse.Namespace, tmp: Path, i: int) -> dict[str, Any]:
    name = f"overhead-{i}"
    work = tmp / name
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(campaign_spec(args, name), sort_keys=False))
    env = {**os.environ, "CAMPAIGN_WORKDIR": str(work)}
    env.pop("CAMPAIGN_DB_URL", None)
    t0 = time.time()
    p = subprocess.run([sys.executable, "-m", "campaign.cli", "submit", str(path), "-q"], env=env,
                       capture_output=True, text=True)
    t1 = time.time()
    if p.returncode != 0:
        raise SystemExit(f"campaign submit exited {p.returncode}:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    from campaign.ledger import open_ledger, reads

    ledger = open_ledger(f"sqlite:///{work / 'ledger.db'}", create=False)
    try:
        with ledger.session() as s:
            [stage] = reads.current_stage_runs(s, reads.get_campaign(s, name))
            [a] = stage.attempts
            run_dir, started, finished = Path(a.run_dir), _epoch(a.started), _epoch(a.finished)
    finally:
        ledger.close()
    st = step_stats(metrics(run_dir))
    return {"wall_s": t1 - t0, **st, "run_dir": run_dir, "phases": {
        "cli start -> attempt start": started - t0, "attempt start -> first step": st["first"] - started,
        "steps (first -> last row)": st["last"] - st["first"], "last step -> attempt end": finished - st["last"],
        "attempt end -> cli exit": t1 - finished}}


def run_bare(config: Path, tmp: Path, i: int) -> dict[str, Any]:
    run_dir = tmp / f"bare-{i}"
    run_dir.mkdir()
    cfg = json.loads(config.read_text())
    cfg["run"]["checkpoint_dir"] = str(run_dir / "checkpoints")
    path = run_dir / "trainer.json"
    path.write_text(json.dumps(cfg))
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
    env.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", CAMPAIGN_RUN_DIR=str(run_dir),
               PYTHONUNBUFFERED="1")
    t0 = time.time()
    with open(run_dir / "trainer.log", "w") as log:
        code = subprocess.run([sys.executable, "-m", "campaign.train", "--config", str(path)], env=env,
                              stdout=log, stderr=subprocess.STDOUT).returncode
    t1 = time.time()
    if code != 0:
        raise SystemExit(f"the bare trainer exited {code}; see {run_dir / 'trainer.log'}")
    st = step_stats(metrics(run_dir))
    return {"wall_s": t1 - t0, **st, "phases": {"start -> first step": st["first"] - t0,
                                                 "last step -> exit": t1 - st["last"]}}


def _epoch(d: Any) -> float:
    import datetime as dt

    return d.replace(tzinfo=dt.timezone.utc).timestamp()


def spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):.3f} (min {min(xs):.3f}, max {max(xs):.3f}, n={len(xs)})"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=100, help="steps of the run (the target is stated for 100)")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved campaign/bare pairs")
    ap.add_argument("--checkpoint-every", type=int, default=50)
    ap.add_argument("--n-layer", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=512, help="width (512: ~0.4 s steps on 2 CPU cores)")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--warm-start", default="auto", choices=["auto", "false"],
                    help="the campaign's trainer.warm_start (auto: ranks forked from the node's fork server)")
    ap.add_argument("--keep", type=Path, default=None, help="keep the work directories here")
    args = ap.parse_args(argv)
    if args.steps <= SKIP_STEPS + 2 or args.repeats < 1:
        ap.error(f"--steps must be > {SKIP_STEPS + 2} and --repeats >= 1")
    tmp = args.keep or Path(tempfile.mkdtemp(prefix="campaign-overhead-"))
    tmp.mkdir(parents=True, exist_ok=True)
    pairs = []
    for i in range(args.repeats):
        if i % 2 == 0:
            c = run_campaign(args, tmp, i)
            b = run_bare(c["run_dir"] / "trainer.json", tmp, i)
        else:  # bare first: the config is the one the first campaign's attempt was launched with
            b = run_bare(pairs[0][0]["run_dir"] / "trainer.json", tmp, i)
            c = run_campaign(args, tmp, i)
        pairs.append((c, b))
        print(f"# repeat {i + 1}: campaign wall {c['wall_s']:.2f} s, {c['per_step_s']:.4f} s/step; "
              f"bare wall {b['wall_s']:.2f} s, {b['per_step_s']:.4f} s/step", file=sys.stderr, flush=True)
    print(f"model {campaign_spec(args, '-')['model']}, {args.steps} steps, checkpoint every {args.checkpoint_every}, "
          f"1 node x 1 rank, {os.cpu_count()} CPUs, {args.repeats} interleaved repeat(s)")
    print(f"{'rep':>3} {'side':<9} {'wall s':>8} {'steps s':>8} {'outside s':>9} {'s/step':>8} {'own s/step':>10}")
    for i, (c, b) in enumerate(pairs, 1):
        for side, r in (("campaign", c), ("bare", b)):
            print(f"{i:>3} {side:<9} {r['wall_s']:>8.2f} {r['last'] - r['first']:>8.2f} "
                  f"{r['wall_s'] - (r['last'] - r['first']):>9.2f} {r['per_step_s']:>8.4f} {r['own_step_s']:>10.4f}")
    ratios = [c["per_step_s"] / b["per_step_s"] for c, b in pairs]
    own = [c["own_step_s"] / b["own_step_s"] for c, b in pairs]
    fixed = [(c["wall_s"] - (c["last"] - c["first"])) - (b["wall_s"] - (b["last"] - b["first"])) for c, b in pairs]
    total = [c["wall_s"] - b["wall_s"] for c, b in pairs]
    print("\nwhere the campaign's wall time went (median over repeats, s):")
    for k in pairs[0][0]["phases"]:
        print(f"  {k:<30} {spread([c['phases'][k] for c, _ in pairs])}")
    print("the bare trainer's:")
    for k in pairs[0][1]["phases"]:
        print(f"  {k:<30} {spread([b['phases'][k] for _, b in pairs])}")
    print(f"\nper step, campaign/bare (wall between metrics rows): {spread(ratios)}")
    print(f"per step, campaign/bare (the trainer's own step_time_s): {spread(own)}")
    print(f"fixed overhead (wall outside the steps, campaign - bare), s: {spread(fixed)}")
    print(f"total wall, campaign - bare, s: {spread(total)}")
    targets = Targets("overhead")
    targets.check("per step, campaign/bare (median of repeats)", statistics.median(ratios), "<=", PER_STEP_MAX, "x")
    targets.check(f"fixed overhead of a {args.steps}-step run (median of repeats)", statistics.median(fixed), "<=",
                  FIXED_MAX_S, " s")
    targets.exit()


if __name__ == "__main__":
    main()
