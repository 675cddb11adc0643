"""Goodput under a mixed fault schedule: our policy against a blind-retry baseline, the same faults.

    python benchmarks/goodput.py [--steps 300] [--mean-steps 100] [--repeats 3]   # ~50 min on 2 cores
    python benchmarks/goodput.py --d-model 256 --seq-len 128 --policies "ours,ours cold,no rescue,blind retry"
    python benchmarks/goodput.py --llama3-rate          # the fault rate Llama 3 met, scaled to these nodes
    python benchmarks/goodput.py --site slurm           # through srun on the Slurm test cluster (tests/infra)
    python benchmarks/goodput.py --site pbs             # through PBS (the emulator) and mpiexec (MPICH for PALS)

A long run on the local site (CPU, a small GPT, 2 active virtual nodes x 1 gloo rank + 3
spares) through `campaign submit`, under a seeded schedule of faults: after each launch, a
fault comes after an exponential number of training steps (mean `--mean-steps`), on a random
rank, its kind drawn from FAULT_MIX (compute hang, collective hang, crash with node evidence,
crash without, node lost). Fault k fires in attempt k, so every policy meets the same faults at
the same steps; that is checked, not assumed (each run's first len(faults) attempts must fail
and the next succeed: the run fails otherwise). `--repeats` runs the whole set again with the
next seeds, the policies' order alternating (a seed whose schedule draws no fault is redrawn:
skipped, not averaged in), and reports the mean ETTR with its spread, and the
seconds lost per fault kind (from the last step before the fault to the same step reached again,
less one step time). Each run has its own ledger (`--policies` picks which):

- **ours**: the long run's defaults: stall budget 3 x p99 step + 9 s from step progress, or
  3 x the slowest rank's compute time + 2 s when the heartbeats show one rank computing
  while its peers wait; culprits named and excluded, crashes judged by evidence, spares;
  ranks started warm from the node's fork server (`trainer.warm_start: auto`); after a
  crash or a hang one surviving replica saves the last finished step, so the relaunch
  recomputes nothing (`trainer.rescue: auto`);
- **ours cold**: the same with `warm_start: false` (the warm start's share);
- **no rescue**: ours with `rescue: false` (the rescue's share);
- **blind retry**: the same stall budget on step output (the full floor), relaunch on the same
  nodes: no culprit naming, no exclusion, no drill, no rescue, every launch a cold interpreter.
  It is NOT what ezpz does by default (EZPZ_DEFAULTS quotes that: no idle timeout unless
  --auto-retry, then 1800 s; 5-60 s back-off; a spare per failure): that second baseline is
  PROJECTED from blind retry's measured faults (`projection`), not run: a hang at its 1800 s
  timeout would hold one run for half an hour per fault.

After the runs: the ETTR table per run, the mean (min-max) per policy with the seconds lost per
fault kind, the detection time of each hang kind against 3 step times + 2 s, and ETTR projected
at Llama 3's per-node interruption rate for jobs of 2 to 10,624 nodes (from the measured seconds
lost per fault; start-up and checkpoint stalls left out).

`--site` picks the production path. `local` (default): the local launcher, where warm start
and rescue are on. `slurm`: the real Slurm test cluster of this machine
(tests/infra/slurm_cluster.sh, 5 virtual nodes: 2 active + 3 spares), the block an sbatch job
through Parsl's SlurmProvider, every attempt an `srun`. `pbs`: the `aurora` site through Parsl's
PBSProProvider against the PBS Pro emulator (tests/infra/pbs, a STAND-IN for PBS Pro), each
attempt MPICH's `mpiexec` standing in for PALS (`launcher: mpich`), 2 active + 3 spares. On
both, by the defaults (what their users get): no warm start (a launcher's ranks start cold),
rescue on (srun and Hydra pass SIGUSR1 on: `contract.RESCUE_LAUNCHERS`; PALS itself is not).

Every run checkpoints as a user would ask: `checkpoint_every: auto` with `mtbf_s` stated as
the schedule's mean time between faults, each run's ledger holding the calibration run as
its site history, so the first launch already uses Young/Daly for the measured save stall.
`--checkpoint-every N` fixes N steps for every run instead. ETTR and where the rest of the
wall time went come from the ledger (`campaign status --json`, campaign.goodput).
`--bad-node` replaces the random schedule with one node that hangs whenever it trains step
steps/3. `--llama3-rate` sets the mean time between faults to Llama 3's (LLAMA3), scaled to the
job's active nodes. Targets (issues 16, 28, 39): mean ETTR >= 0.9 at a fault every ~100 step
times, over seeds that draw faults; every collective hang of the first policy, and every hang of
it once the step was measured (a relaunch's first steps included; the first attempt's warm-up
left out and counted), detected within 3 step times + 2 s; exit 1 when one is missed or when the
policies did not meet the same faults.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _target import Targets  # noqa: E402

TARGET_ETTR = 0.9
"""ETTR of our policy at a fault every ~100 step times (issue 16, issue 28)."""

MODEL = {"size": "tiny", "n_layer": 4, "d_model": 512, "n_head": 4, "seq_len": 256}
"""A step of ~1.1 s on 2 CPU cores, most of it gloo's all-reduce: a step of a real run's order, so
a fault every 100 step times is one every ~2 minutes (`--d-model 256 --seq-len 128`: ~0.15 s
steps, a fault every ~15 s, where fixed per-fault costs dominate; --size another shape)."""

SPARES = 3
"""One per node the long run may exclude (its `exclusion_budget`): with fewer, random hangs
exclude healthy nodes until the allocation is too small (measured with 1: the stage stopped)."""

BATCH_SPARES = 3
"""Spares of the batch sites (`--site slurm|pbs`), as the local site has (SPARES): with 2, three
node faults in one run (seed 3) left the 4-node cluster 1 usable node. The Slurm cluster is
started with 2 + BATCH_SPARES virtual nodes."""
INFRA = Path(__file__).resolve().parents[1] / "tests" / "infra"


def site_section(site: str, nodes: int) -> dict[str, Any]:
    """The spec's `site` for `--site`: the local site's virtual nodes, or a batch block of
    `nodes` active nodes and BATCH_SPARES spares (as tests/hpc run them)."""
    if site == "local":
        return {"kind": "local", "nodes": nodes + SPARES, "ranks_per_node": 1}
    env = {"OMP_NUM_THREADS": "1"}
    if site == "slurm":
        return {"kind": "slurm", "partition": "debug", "nodes": nodes, "spares": BATCH_SPARES, "ranks_per_node": 1,
                "walltime": "01:00:00", "env": {"MASTER_ADDR": "127.0.0.1", **env}}
    return {"kind": "aurora", "account": "campaign", "queue": "debug-scaling", "nodes": nodes, "spares": BATCH_SPARES,
            "walltime": "01:00:00", "launcher": "mpich", "ranks_per_node": 1, "env": env}


@contextlib.contextmanager
def batch_site(site: str, tmp: Path) -> Iterator[None]:
    """Bring up what `--site` needs for the whole invocation: the Slurm test cluster (stopped
    again if this started it) or the PBS emulator on PATH with its own state directory."""
    if site == "local":
        yield
        return
    if site == "pbs":
        state = tmp / "pbs-state"
        state.mkdir(parents=True, exist_ok=True)
        saved = dict(os.environ)
        os.environ["PATH"] = f"{INFRA / 'pbs'}{os.pathsep}{os.environ.get('PATH', '')}"
        os.environ.update(PBS_EMULATOR_STATE=str(state), PBS_EMULATOR_KILL_DELAY="3")
        try:
            yield
        finally:
            listed = subprocess.run(["qstat", "-f", "-F", "json"], capture_output=True, text=True)
            live = list(json.loads(listed.stdout or "{}").get("Jobs", {})) if listed.returncode == 0 else []
            if live:  # qdel whatever block is still alive: the emulator's jobs are this machine's processes
                subprocess.run(["qdel", "-W", "force", *live], capture_output=True)
            os.environ.clear()  # the emulator off PATH again
            os.environ.update(saved)
        return
    script = ["bash", str(INFRA / "slurm_cluster.sh")]
    was_up = subprocess.run([*script, "status"], capture_output=True).returncode == 0
    up = subprocess.run([*script, "start", str(2 + BATCH_SPARES)], capture_output=True, text=True)
    if up.returncode != 0:
        raise SystemExit(f"the Slurm test cluster did not start:\n{up.stdout}\n{up.stderr}")
    env = subprocess.run([*script, "env"], capture_output=True, text=True, check=True).stdout
    os.environ["SLURM_CONF"] = env.strip().split("=", 1)[1].strip("'\"")
    try:
        yield
    finally:
        if not was_up:
            subprocess.run([*script, "stop"], capture_output=True)
BASELINE = {"exclude_suspects": False, "exclusion_budget": 0,
            "watchdog": {"heartbeat_stale_s": 1e9, "drill_s": 0, "confirmed_floor_s": 9.0}}
"""`blind retry`: our own stall budget on step output (the full 9 s floor: no heartbeat evidence
to shorten it), relaunch on the same nodes; no culprit named, nobody excluded, no drill, no
rescue, cold starts. Not ezpz: see EZPZ_DEFAULTS."""

EZPZ_DEFAULTS = {"idle_timeout_s": None, "idle_timeout_s_auto_retry": 1800, "backoff_s": (5, 10, 20, 40, 60),
                 "spare": "swap named hosts, else rotate one spare blindly, per failure"}
"""What `ezpz launch` does by default (saforem2/ezpz, src/ezpz/cli/flags.py at commit
05f8b6aefdd26e3d562f633310d47367f734976b): `--timeout` "Off by default, BUT defaults to 1800
(30 min) when --auto-retry is set"; `--retries` "Applies exponential backoff between attempts
(5s, 10s, 20s, ..., capped at 60s)"; `--auto-retry` "scrape the log for known bad-node
signatures ... and either swap the named hosts for spares or rotate one spare blindly". Not
run as a policy here (a hang would cost 1800 s of real time per fault, and the long run has no
per-failure back-off or blind rotation to configure it with): `projection` prices it from blind
retry's measured faults."""

FAULT_MIX = (
    ("compute hang", {"kind": "hang"}),
    ("collective hang", {"kind": "hang_in_collective"}),
    ("crash, evidence", {"kind": "crash", "exit_code": 135}),
    ("crash, no evidence", {"kind": "crash", "exit_code": 1}),
    ("node lost", {"kind": "sigkill"}),
)
"""The mixed set, drawn uniformly: a rank blocked in compute; a rank stuck inside a collective;
a rank dying as SIGBUS would (exit 135: one node's memory or local disk, node evidence); a rank
exiting 1 with nothing in its log (no evidence); a rank SIGKILLed at the start of a step (its
node gone; the peers fail in the next all-reduce). A node that keeps failing is `--bad-node`."""

LLAMA3 = {"interruptions": 466, "days": 54, "gpus": 16_384, "gpus_per_node": 8}
"""Llama 3 (arXiv 2407.21783, section 3.3.4): 466 job interruptions in a 54-day snapshot of
pre-training on 16,384 H100 GPUs, 8 per server."""


def llama3_mtbf_s(nodes: int) -> float:
    """Mean time between interruptions of a job on `nodes` nodes at Llama 3's per-node rate."""
    per_node_s = LLAMA3["days"] * 86400 / LLAMA3["interruptions"] * (LLAMA3["gpus"] / LLAMA3["gpus_per_node"])
    return per_node_s / nodes


def seeds_with_faults(first: int, repeats: int, steps: int, mean: float, every: int,
                      ranks: int) -> tuple[list[int], list[int]]:
    """`repeats` seeds from `first` on whose schedule draws at least one fault, and the seeds
    skipped because theirs drew none (issue 39: a fault-free draw measures the ceiling, not
    recovery; averaged in, it lifted the mean ETTR to the target: it is redrawn, not run)."""
    kept: list[int] = []
    skipped: list[int] = []
    seed = first
    while len(kept) < repeats:
        (kept if schedule(seed, steps, mean, every, ranks) else skipped).append(seed)
        seed += 1
        if len(skipped) > 100 * repeats:
            raise SystemExit(f"seeds {first}-{seed}: almost none draws a fault in {steps} steps (mean {mean} steps "
                             "between faults): use more --steps or fewer --mean-steps")
    return kept, skipped


def measured_hangs(out: dict[str, Any], faults: list[dict[str, Any]],
                   warmup_steps: int) -> tuple[list[tuple[str, float]], int]:
    """(kind, detection s) of each hang the watchdog met after the campaign had measured the
    step (any attempt after the first, or the first one past its warm-up steps), and how many
    hangs came before that (the first attempt's warm-up: no step time to judge by yet)."""
    kept, early = [], 0
    for k, ((kind, x), f) in enumerate(zip(out["detected_by_kind"], faults)):
        if kind not in ("compute hang", "collective hang") or x is None:
            continue
        if k == 0 and f["step"] <= warmup_steps + 1:
            early += 1
            continue
        kept.append((kind, x))
    return kept, early


def schedule(seed: int, steps: int, mean: float, every: int, ranks: int) -> list[dict[str, Any]]:
    """Fault k in attempt k at (resume step of attempt k) + Exp(mean) steps; a fault at the
    start of step S leaves the checkpoint of every * floor((S - 1) / every) to resume from.
    Each fault comes after the one before (a relaunch that resumed from a rescue checkpoint,
    later than `every` would put it, must still meet it: every policy meets every fault)."""
    rng, out, resume = random.Random(seed), [], 0
    while True:
        at = resume + max(1, round(rng.expovariate(1.0 / mean)))
        at = max(at, out[-1]["step"] + 1) if out else at
        if at > steps:
            return out
        _, fault = FAULT_MIX[rng.randrange(len(FAULT_MIX))]
        out.append({**fault, "step": at, "rank": rng.randrange(ranks), "attempt": len(out) + 1})
        resume = every * ((at - 1) // every)


@dataclass(frozen=True)
class Setup:
    """What the campaigns of one invocation train on: model, active nodes, batch."""

    model: dict[str, Any]
    nodes: int = 2
    micro_batch: int = 4
    site: str = "local"
    """`--site`: local, slurm or pbs (site_section)."""


POLICIES = (("ours", {}, {}), ("ours cold", {}, {"warm_start": False}), ("no rescue", {}, {"rescue": False}),
            ("blind retry", BASELINE, {"warm_start": False, "rescue": False}))
"""(label, stage overrides, trainer overrides)."""


def spec(setup: Setup, name: str, steps: int, every: int | str, faults: list[dict[str, Any]], extra: dict[str, Any],
         trainer: dict[str, Any] | None = None, mtbf_s: float | None = None) -> dict[str, Any]:
    stage = {"name": "long", "kind": "long_run", "nodes": setup.nodes, "steps": steps, "checkpoint_every": every,
             **({"mtbf_s": mtbf_s} if mtbf_s else {}),
             "max_attempts": len(faults) + 2, "crash_loop": 3, "backoff_s": 0, "faults": faults,
             "watchdog": {"startup_s": 120}, **extra}
    if "watchdog" in extra:
        stage["watchdog"] = {"startup_s": 120, **extra["watchdog"]}
    return {"name": name, "site": site_section(setup.site, setup.nodes),
            "model": setup.model, "stages": [stage],
            "trainer": {"micro_batch_size": setup.micro_batch, "warmup_steps": 5, **(trainer or {})}}


def seed_history(tmp: Path, name: str) -> None:
    """Start `name`'s ledger as a copy of the calibration run's (its measured saves and steps)."""
    import sqlite3

    (tmp / name).mkdir(parents=True, exist_ok=True)
    src, dst = sqlite3.connect(tmp / "calibrate" / "ledger.db"), sqlite3.connect(tmp / name / "ledger.db")
    try:
        src.backup(dst)
    finally:
        src.close()
        dst.close()


def run(name: str, doc: dict[str, Any], tmp: Path) -> dict[str, Any]:
    """Submit the campaign in its own work directory; its long run's status (with goodput)."""
    path, work = tmp / f"{name}.yaml", tmp / name
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    env = {**os.environ, "CAMPAIGN_ALLOW_FAULTS": "1", "CAMPAIGN_WORKDIR": str(work)}
    env.pop("CAMPAIGN_DB_URL", None)
    p = subprocess.run([sys.executable, "-m", "campaign.cli", "submit", str(path), "-q"], env=env,
                       capture_output=True, text=True)
    st = subprocess.run([sys.executable, "-m", "campaign.cli", "status", name, "--json"], env=env,
                        capture_output=True, text=True, check=True)
    status = json.loads(st.stdout)
    stage = status["stages"][0]
    classes = [a["state"] for a in status["attempts_detail"]]
    return {"name": name, "passed": p.returncode == 0, "verdict": stage["verdict"], "goodput": stage["goodput"],
            "attempts": len(classes), "classes": classes, "detail": status["attempts_detail"]}


def met_all(out: dict[str, Any], faults: list[dict[str, Any]]) -> bool:
    """Fault k fires in attempt k: the run met every fault, and only those, when its first
    len(faults) attempts failed and attempt len(faults) + 1 finished the stage."""
    c = out["classes"]
    return (out["passed"] and len(c) == len(faults) + 1 and all(x != "succeeded" for x in c[:-1])
            and c[-1] == "succeeded")


def _step_times(run_dir: str | None) -> dict[int, float]:
    path = Path(run_dir or "/nonexistent") / "metrics.jsonl"
    if not path.exists():
        return {}
    rows = (json.loads(line) for line in path.read_text().splitlines() if line.strip())
    return {r["step"]: r["time"] for r in rows if "time" in r}


def lost_per_fault(out: dict[str, Any], faults: list[dict[str, Any]], step_s: float) -> list[float | None]:
    """Seconds each fault cost: from attempt k's last step before fault k (its start, if none) to
    the first later attempt's row of the fault's step, less one step time."""
    import datetime as dt

    det, lost = out["detail"], []
    for k, f in enumerate(faults):
        before = _step_times(det[k]["run_dir"]).get(f["step"] - 1) if k < len(det) else None
        if before is None and k < len(det) and det[k]["started"]:
            before = dt.datetime.fromisoformat(det[k]["started"]).replace(tzinfo=dt.timezone.utc).timestamp()
        again = next((t for a in det[k + 1:] if (t := _step_times(a["run_dir"]).get(f["step"])) is not None), None)
        lost.append(again - before - step_s if before is not None and again is not None else None)
    return lost


def calibrate(setup: Setup, tmp: Path, steps: int = 30) -> tuple[float, float]:
    """(median step s, checkpoint save stall s) of this model here, from a short fault-free run."""
    doc = spec(setup, "calibrate", steps, 10, [], {})
    out = run("calibrate", doc, tmp)
    if not out["passed"]:
        raise SystemExit(f"the calibration run failed: {out['verdict']}")
    from campaign import goodput
    from campaign.ledger import open_ledger

    ledger = open_ledger(f"sqlite:///{tmp / 'calibrate' / 'ledger.db'}", create=False)
    try:
        with ledger.session() as s:
            [(_, g)] = goodput.site_history(s, doc["site"]["kind"])
    finally:
        ledger.close()
    return float(g["step_s"]), float(g["save_s"] or 0.0)


def table(rows: list[dict[str, Any]]) -> str:
    keys = ("startup_s", "checkpoint_stall_s", "recomputed_s", "detection_s", "restart_s", "other_s")
    head = (f"{'policy':<12} {'rep':>3} {'done':>4} {'att':>3} {'wall s':>7} {'train s':>7} {'ETTR':>6} "
            + " ".join(f"{k[:-2][:10]:>10}" for k in keys))
    lines = [head]
    for r in rows:
        g = r["goodput"]
        lines.append(f"{r['label']:<12} {r.get('repeat', 1):>3} {'yes' if r['passed'] else 'NO':>4} {r['attempts']:>3} "
                     f"{g['wall_s']:>7.1f} "
                     f"{g['productive_s']:>7.1f} {g['ettr'] or 0:>6.3f} "
                     + " ".join(f"{g['lost'][k]:>10.1f}" for k in keys))
    return "\n".join(lines)


@contextlib.contextmanager
def _kept(path: Path) -> Iterator[str]:
    path.mkdir(parents=True, exist_ok=True)
    yield str(path.resolve())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300, help="Steps of the long run.")
    ap.add_argument("--mean-steps", type=float, default=100.0, help="Mean training steps between faults.")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--checkpoint-every", type=int, default=0,
                    help="fixed steps between checkpoints for every run (default 0: `auto`, Young/Daly as the long run "
                         "computes it, from the calibration run's save stall and the schedule's MTBF)")
    ap.add_argument("--bad-node", action="store_true",
                    help="instead of random faults: local-n1 hangs whenever it trains step steps/3 (a bad node)")
    ap.add_argument("--size", default=None, help="a named model shape (default: tiny, 4 x 256, seq 128)")
    ap.add_argument("--d-model", type=int, default=None, help="width (default 512; 256 for ~0.15 s steps)")
    ap.add_argument("--seq-len", type=int, default=None, help="context length")
    ap.add_argument("--nodes", type=int, default=2, help="active virtual nodes, one rank each (1 on one GPU)")
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--keep", type=Path, default=None, metavar="DIR",
                    help="keep every run's work directory (ledger, run directories) under DIR instead of a temporary one")
    ap.add_argument("--site", choices=("local", "slurm", "pbs"), default="local",
                    help="local launcher (default), srun on the Slurm test cluster, or mpiexec under the PBS emulator")
    ap.add_argument("--policies", default="ours,blind retry",
                    help="which runs, comma-separated, of: ours, ours cold, no rescue, blind retry (default: ours, "
                         "blind retry; the first and the last are compared)")
    ap.add_argument("--repeats", type=int, default=3, help="the whole set again with the next seed, order alternating")
    ap.add_argument("--llama3-rate", action="store_true",
                    help="mean time between faults from Llama 3's 466 interruptions in 54 days on 16,384 GPUs "
                         "(8 per node), scaled to --nodes (overrides --mean-steps)")
    args = ap.parse_args()
    wanted = [w.strip() for w in args.policies.split(",") if w.strip()]
    known = [p[0] for p in POLICIES]
    if not wanted or set(wanted) - set(known):
        ap.error(f"--policies {args.policies!r}: choose from {', '.join(known)} (comma-separated)")
    for name in ("steps", "nodes", "micro_batch", "repeats"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.checkpoint_every < 0:
        ap.error(f"--checkpoint-every must be >= 0 (0: auto), got {args.checkpoint_every}")
    from campaign import goodput
    from campaign.watchdog import WatchdogPolicy

    model = dict(MODEL) if args.size is None else {"size": args.size}
    model.update({k: v for k, v in (("d_model", args.d_model), ("seq_len", args.seq_len)) if v is not None})
    setup = Setup(model, args.nodes, args.micro_batch, args.site)
    if args.site != "local" and (args.bad_node or args.nodes != 2):
        ap.error(f"--site {args.site}: 2 active nodes (+ 3 spares) and no --bad-node")

    if args.keep is not None and args.keep.exists() and any(args.keep.iterdir()):
        ap.error(f"--keep {args.keep}: the directory is not empty")
    with (tempfile.TemporaryDirectory() if args.keep is None else _kept(args.keep)) as tmp_name:
        tmp = Path(tmp_name)
        with batch_site(args.site, tmp):
            step_s, save_s = calibrate(setup, tmp)
            if args.llama3_rate:
                mtbf = llama3_mtbf_s(setup.nodes)
                args.mean_steps = mtbf / step_s
                print(f"Llama 3's rate scaled to {setup.nodes} node(s): a fault every {mtbf:,.0f} s = "
                      f"{args.mean_steps:,.0f} steps of {step_s:.3f} s; expected faults in {args.steps} steps: "
                      f"{args.steps / args.mean_steps:.2g}")
            every = args.checkpoint_every or max(1, round(goodput.daly_interval(save_s, args.mean_steps * step_s) / step_s))
            seeds, skipped = ((list(range(args.seed, args.seed + args.repeats)), []) if args.bad_node else
                              seeds_with_faults(args.seed, args.repeats, args.steps, args.mean_steps, every,
                                                ranks=setup.nodes))
            faults = (schedule(seeds[0], args.steps, args.mean_steps, every, ranks=setup.nodes) if not args.bad_node
                      else [{"kind": "hang", "step": max(1, args.steps // 3), "node": "local-n1"}])
            print(f"site {args.site}: model {setup.model}, {setup.nodes} active node(s) x 1 rank, "
                  f"micro-batch {setup.micro_batch}")
            how = (f"checkpoint every {args.checkpoint_every} steps" if args.checkpoint_every else
                   f"checkpoint_every auto (mtbf_s {args.mean_steps * step_s:.0f}: {every} steps if no fault were rescued; "
                   "each long run recomputes it before each launch)")
            print(f"step {step_s:.3f} s, checkpoint save stall {save_s:.3f} s -> {how}; "
                  f"{len(faults)} faults: " + ", ".join(f"{f['kind']}@{f['step']}/{'r' + str(f['rank']) if 'rank' in f else f['node']}" for f in faults))
            print(f"seeds {', '.join(map(str, seeds))}" + (f" (redrawn: seed(s) {', '.join(map(str, skipped))} drew no "
                                                          f"fault within {args.steps} steps)" if skipped else ""))
            label_of = {tuple(sorted(v.items())): k for k, v in FAULT_MIX}
            kinds = [label_of.get(tuple(sorted((k, v) for k, v in f.items() if k not in ("step", "rank", "attempt",
                                                                                          "node"))), f["kind"])
                     for f in faults]
            runs: dict[str, list[dict[str, Any]]] = {label: [] for label in wanted}
            warmup_steps = WatchdogPolicy().warmup_steps  # the runs keep the watchdog's default
            for r in range(args.repeats):
                seed = seeds[r]
                if r:
                    faults = schedule(seed, args.steps, args.mean_steps, every, ranks=setup.nodes) if not args.bad_node \
                        else faults
                    kinds = [label_of.get(tuple(sorted((k, v) for k, v in f.items()
                                                       if k not in ("step", "rank", "attempt", "node"))), f["kind"])
                             for f in faults]
                    print(f"repeat {r + 1} (seed {seed}): {len(faults)} faults: "
                          + ", ".join(f"{k}@{f['step']}" for k, f in zip(kinds, faults)))
                order = [p for p in POLICIES if p[0] in wanted]
                for label, extra, trainer in (order if r % 2 == 0 else order[::-1]):
                    name = f"{label.replace(' ', '-')}-r{r + 1}"
                    if args.checkpoint_every:
                        doc = spec(setup, name, args.steps, args.checkpoint_every, faults, extra, trainer)
                    else:
                        seed_history(tmp, name)
                        doc = spec(setup, name, args.steps, "auto", faults, extra, trainer, mtbf_s=args.mean_steps * step_s)
                    out = run(name, doc, tmp)
                    out.update(label=label, repeat=r + 1, seed=seed, faults=len(faults), met=met_all(out, faults),
                               lost_by_kind=list(zip(kinds, lost_per_fault(out, faults, step_s))),
                               detected_by_kind=[(k, out["detail"][i].get("detected_after_s"))
                                                 for i, k in enumerate(kinds) if i < len(out["detail"])])
                    out["measured_hangs"], out["early_hangs"] = measured_hangs(out, faults, warmup_steps)
                    runs[label].append(out)
                    g = out["goodput"]
                    print(f"{label} (repeat {r + 1}): {out['verdict']} [{', '.join(out['classes'])}]; ETTR {g['ettr']}, "
                          f"wall {g['wall_s']} s, met all {len(faults)} faults: {out['met']}", flush=True)
    print()
    print(table([o for label in wanted for o in runs[label]]))
    print()
    print(summary(runs, kinds_order=[k for k, _ in FAULT_MIX]))
    print()
    print(detection(runs, step_s))
    print()
    print(projection(runs, step_s, setup.nodes))
    ettr = {label: [o["goodput"]["ettr"] or 0.0 for o in outs] for label, outs in runs.items()}
    first, last = wanted[0], wanted[-1]
    mean = {label: statistics.mean(v) for label, v in ettr.items()}
    print(f"ETTR {first} {mean[first]:.3f} / {last} {mean[last]:.3f} = "
          f"{mean[first] / mean[last] if mean[last] else float('inf'):.2f}x (means of {args.repeats} repeat(s), "
          f"seeds {', '.join(map(str, seeds))})")
    targets = Targets("goodput")
    bad = [f"{o['label']} repeat {o['repeat']}: {len(o['classes']) - 1} failed attempt(s) for {o['faults']} fault(s)"
           for outs in runs.values() for o in outs if not o["met"]]
    if not args.bad_node:  # a bad node fails every attempt that keeps it: met as often as a policy keeps it
        targets.require("every policy met the same faults, and finished", not bad, "; ".join(bad))
    targets.check(f"mean ETTR of {first} at a fault every ~{args.mean_steps:g} steps", mean[first], ">=", TARGET_ETTR)
    caught = [x for o in runs[first] for k, x in o["detected_by_kind"] if k == "collective hang" and x is not None]
    if caught:  # issue 28: a hang inside a collective detected within 3 step times + 2 s
        targets.check(f"{first}: slowest collective-hang detection (of {len(caught)}), s", max(caught), "<=",
                      round(3 * step_s + 2.0, 2))
    measured = [x for o in runs[first] for _, x in o.get("measured_hangs", [])]
    early = sum(o.get("early_hangs", 0) for o in runs[first])
    if measured:  # issue 39: every hang once the step was measured, a relaunch's first steps included
        targets.check(f"{first}: slowest hang detection once the step was measured (of {len(measured)}"
                      f"{f'; {early} in the first attempt warm-up left out' if early else ''}), s", max(measured), "<=",
                      round(3 * step_s + 2.0, 2))
    targets.exit()


def detection(runs: dict[str, list[dict[str, Any]]], step_s: float) -> str:
    """Per policy and hang kind: seconds from the last progress to the watchdog's call (the
    attempt's `detected_after_s`), mean and max, against 3 step times + 2 s."""
    lines = [f"{'policy':<12} {'hang kind':<16} {'n':>2} {'detect mean':>11} {'max':>6}   "
             f"(3 x step {step_s:.3f} s + 2 s = {3 * step_s + 2:.2f} s)"]
    for label, outs in runs.items():
        for kind in ("compute hang", "collective hang"):
            xs = [x for o in outs for k, x in o["detected_by_kind"] if k == kind and x is not None]
            if xs:
                lines.append(f"{label:<12} {kind:<16} {len(xs):>2} {statistics.mean(xs):>11.2f} {max(xs):>6.2f}")
    return "\n".join(lines)


PROJECTED_NODES = (2, 128, 1024, 10_624)
"""Job sizes of the projection: this benchmark's, and Aurora's debug-scaling top, a prod-medium
job and the whole machine."""


def projection(runs: dict[str, list[dict[str, Any]]], step_s: float, nodes: int) -> str:
    """ETTR at Llama 3's interruption rate (LLAMA3, per node) for several job sizes, PROJECTED,
    not run: each policy's mean seconds lost per fault as measured here (all kinds pooled), as
    if each fault cost the same at that size; start-up and checkpoint stalls left out. And
    ezpz's documented defaults (EZPZ_DEFAULTS) under `--auto-retry`: a hang costs its 1800 s
    timeout plus the restart, a crash a back-off (5 s first) plus the restart; the restart and
    the recomputed steps taken from `blind retry`'s measured faults, less its detection. With
    ezpz's plain default (no timeout) a hang holds the job until its walltime."""
    pooled = {label: [x for o in outs for _, x in o["lost_by_kind"] if x is not None] for label, outs in runs.items()}
    lost = {label: statistics.mean(xs) for label, xs in pooled.items() if xs}
    if "blind retry" in runs:
        hangs = ("compute hang", "collective hang")
        per = [(k, x, d) for o in runs["blind retry"] for (k, x), (_, d) in zip(o["lost_by_kind"], o["detected_by_kind"])
               if x is not None]
        ezpz = [(x - (d or 0.0)) + (EZPZ_DEFAULTS["idle_timeout_s_auto_retry"] if k in hangs
                                    else EZPZ_DEFAULTS["backoff_s"][0]) for k, x, d in per]
        if ezpz:
            lost["ezpz --auto-retry (projected)"] = statistics.mean(ezpz)
    sizes = sorted({nodes, *PROJECTED_NODES})
    head = f"{'policy':<30} {'s/fault':>8} " + " ".join(f"{f'{n} nodes':>12}" for n in sizes)
    lines = ["ETTR projected at Llama 3's rate (466 interruptions / 54 days / 2,048 nodes of 8 GPUs), not run: each "
             "fault priced at the seconds lost per fault measured here (a restart of thousands of nodes costs more); "
             "start-up and checkpoint stalls left out",
             f"{'MTBF of the job, s':<39} " + " ".join(f"{llama3_mtbf_s(n):>12,.0f}" for n in sizes), head]
    for label, x in lost.items():
        lines.append(f"{label:<30} {x:>8.1f} " + " ".join(f"{llama3_mtbf_s(n) / (llama3_mtbf_s(n) + x):>12.4f}"
                                                           for n in sizes))
    return "\n".join(lines)


def summary(runs: dict[str, list[dict[str, Any]]], kinds_order: list[str]) -> str:
    """Per policy: mean ETTR (min-max over repeats), and mean seconds lost per fault of each kind."""
    kinds = [k for k in kinds_order if any(k == kk for outs in runs.values() for o in outs for kk, _ in o["lost_by_kind"])]
    kinds += sorted({kk for outs in runs.values() for o in outs for kk, _ in o["lost_by_kind"]} - set(kinds))
    head = f"{'policy':<12} {'n':>2} {'ETTR mean':>9} {'min':>6} {'max':>6}  " + " ".join(f"{k[:16]:>16}" for k in kinds)
    lines = [head, " " * 38 + "mean seconds lost per fault (count)"]
    for label, outs in runs.items():
        e = [o["goodput"]["ettr"] or 0.0 for o in outs]
        cells = []
        for k in kinds:
            xs = [x for o in outs for kk, x in o["lost_by_kind"] if kk == k and x is not None]
            cells.append(f"{statistics.mean(xs):>11.1f} ({len(xs)})" if xs else f"{'-':>16}")
        lines.append(f"{label:<12} {len(e):>2} {statistics.mean(e):>9.3f} {min(e):>6.3f} {max(e):>6.3f}  " + " ".join(cells))
    return "\n".join(lines)


if __name__ == "__main__":
    main()
