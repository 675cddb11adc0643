"""Claim: on one GPU, through the real `campaign submit`, a compiled bf16 model trains at the
bare trainer's speed (per step <= 1.02x, fixed overhead <= 5 s beyond the bare trainer's own
start), and a relaunch after a fault costs little: at 1b, relaunch-to-first-step with the
compile caches <= 1/3 of a cold relaunch, and <= 15 s lost per fault (kill and hang) (issue 41).

For each `--sizes` shape (default gpt2-124m and 1b; bf16, torch.compile, async checkpoints
every N steps (SHAPES), one rank on the `local` site, one virtual node bound to the GPU), in
this order, in one run:

- **ours** (campaign `relaunch-SIZE`): the defaults: warm start (fork server), the compile
  caches in the campaign's folder (`trainer.compile_cache`), relaunch on the same node. First
  stage a `long_run` (so its first launch compiles from nothing, as the bare trainer does) in
  which rank 0 is SIGKILLed at the start of a step (attempt 1) and hangs at a later one
  (attempt 2); then, for the `--stages-at` shapes, `smoke`, `loss_check` and (not 1b: its
  ~16 GB checkpoints make it too long for the device time) `resume_test`;
- **blind retry** (campaign `relaunch-SIZE-blind`): the same long run and faults (at 1b the
  kill only: BLIND_FAULTS) with every cut off: goodput.py's blind-retry stall budget, cold
  interpreters (`warm_start: false`), no compile cache (`compile_cache: false`), no rescue;
- **bare**: the trainer.json of ours' first attempt run alone (`python -m campaign.train`:
  no CLI, ledger, Parsl or supervisor), compiling from nothing, without its faults, for the
  steps before the long run's first checkpoint (and none saved);
- with `--cuts` (default gpt2-124m): **no cache** (ours with `compile_cache: false`) and
  **cold start** (ours with `warm_start: false`), each cut off alone.
The budget (`--budget-s`) cancels a campaign that runs out of time; what did not run is listed.

Per relaunch, the breakdown (s): fault -> detected -> ranks stopped -> new ranks started
(ledger, launcher, fork or exec) -> interpreter -> imports -> process group (+ the first
collectives) -> model built -> checkpoint loaded -> compiled -> first step, from the ledger
(attempt rows, the supervisor's report) and the trainer's `startup` event (campaign.train.marks);
and the seconds lost per fault (the last step before the fault to the same step reached again,
less one step time: goodput.py's measure). Per step: the median gap between metrics rows of
ours' first attempt, steps 4 to the one before the first checkpoint, against the bare run's
same steps. Fixed overhead at the start: CLI start to ours' first step, less the bare run's
start to its first step (both compile from nothing), split into CLI -> attempt start ->
trainer process -> first step. Targets: per step <= 1.02x; fixed <= 5 s; relaunch start-up
(stopped -> first step) with the caches <= 1/3 of `no cache` (else of blind retry); at 1b
<= 15 s lost per fault.

    python benchmarks/gpu_relaunch.py                              # one GPU: gpt2-124m and 1b
    python benchmarks/gpu_relaunch.py --sizes 1b --budget-s 560
    python benchmarks/gpu_relaunch.py --rehearsal                  # tiny model on CPU (gloo), not compiled
    python benchmarks/gpu_relaunch.py --rehearsal --compile on     # ... compiled (minutes per cold compile)
    python benchmarks/gpu_relaunch.py --project summary.json       # only the projection, from a run's results
    python benchmarks/gpu_relaunch.py --plot breakdown.csv out.png # the stacked-bar figure of a breakdown

Writes summary.md, summary.json, breakdown.csv (and steps.csv, attempts.csv, runs.tar.gz) to
--out (default $OUT). The projection of ETTR at Llama 3's rate to 10,624 nodes from the
measured seconds per fault: `projection` (its assumptions are listed beside it). Section:
docs/performance.md, "Relaunch on one GPU".
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import _gpu_harness as h
from _gpu_harness import fmt
from gpu_hang_drill import killed_at, ledger_attempts

SHAPES = {  # micro-batch, steps, checkpoint every, kill step, hang step
    "tiny": (4, 24, 8, 10, 19),
    "gpt2-124m": (8, 120, 20, 45, 95),
    "1b": (4, 40, 20, 25, 35),
}
"""Per shape: faults a few steps after a checkpoint (the relaunch recomputes those steps). At 1b
a checkpoint (model and AdamW state) holds ~16 GB: few of them, and blind retry meets only the
kill (`BLIND_FAULTS`), so that all of it fits one 10-minute device command."""
BARE_S = {"tiny": 40, "gpt2-124m": 70, "1b": 110}
"""What the bare trainer's run takes (a cold start and a few steps; measured on an H100 at
gpt2-124m, 46 s to the first step), left to it when blind retry runs before it."""
BLIND_FAULTS = {"1b": 1}
"""Faults of blind retry's long run where fewer than both (the first: the kill)."""
SKIP = 3
"""Steps of each attempt left out of the per-step median (the compile, allocation)."""
PER_STEP_MAX, FIXED_MAX_S = 1.02, 5.0
CACHE_RATIO_MAX, LOST_MAX_S = 1 / 3, 15.0
PHASES = ("detected", "stopped", "new ranks", "interpreter", "imports", "process group", "model built",
          "checkpoint loaded", "compiled", "first step")
"""The breakdown's segments, each ending at its name (`detected`: fault -> detected)."""
STARTUP = PHASES[2:]
"""The segments from the ranks stopped to the first step: the relaunch's start-up."""


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = h.parser(__doc__, size="gpt2-124m", micro_batch=0, budget_s=560.0)
    p.add_argument("--sizes", default="gpt2-124m,1b", help="shapes, comma-separated (in this order)")
    p.add_argument("--compile-scope", default="auto", choices=["auto", "model", "blocks"],
                   help="trainer.compile_scope of every campaign and the bare run (auto: one rank compiles the whole model below 1e9 parameters, else the blocks)")
    p.add_argument("--cuts", default=None, help="shapes that also run `no cache` and `cold start`, comma-separated, "
                   "or none (default: gpt2-124m; tiny in the rehearsal)")
    p.add_argument("--stages-at", default="tiny,gpt2-124m,1b",
                   help="shapes whose `ours` campaign also runs smoke, loss_check and (not 1b) resume_test after its "
                        "long run, comma-separated (the others: the long run alone)")
    p.add_argument("--compile", default="auto", choices=["auto", "on", "off"],
                   help="torch.compile the model (auto: on a GPU; off in the rehearsal, where a cold compile of "
                        "even the tiny model takes minutes on 2 busy cores)")
    p.add_argument("--plot", type=Path, nargs=2, default=None, metavar=("BREAKDOWN_CSV", "PNG"),
                   help="draw the breakdown figure from a run's breakdown.csv and exit")
    p.add_argument("--title", default="Relaunch after a fault, by phase", help="the figure's title (with --plot)")
    p.add_argument("--project", type=Path, default=None, metavar="SUMMARY_JSON",
                   help="print the projection from a run's summary.json and exit")
    args = p.parse_args(argv)
    if args.project or args.plot:
        return args
    args = h.finish_args(args)
    args.sizes = ["tiny"] if args.rehearsal else [s for s in args.sizes.split(",") if s]
    bad = [s for s in args.sizes if s not in SHAPES]
    if bad:
        p.error(f"--sizes: unknown shape(s) {bad}; known: {', '.join(SHAPES)}")
    default_cuts = "tiny" if args.rehearsal else "gpt2-124m"
    args.cuts = [s for s in (default_cuts if args.cuts is None else args.cuts).split(",") if s and s != "none"]
    args.compile = args.compile == "on" or (args.compile == "auto" and args.device == "cuda")
    return args


# --- the campaigns -------------------------------------------------------------------------

def sized(args: argparse.Namespace, size: str) -> argparse.Namespace:
    a = argparse.Namespace(**vars(args))
    a.size, a.micro_batch = size, SHAPES[size][0]
    return a


def long_run(size: str, extra: dict[str, Any] | None = None, faults: int = 2) -> dict[str, Any]:
    _, steps, every, kill, hang = SHAPES[size]
    st = {"name": "long-run", "kind": "long_run", "nodes": 1, "steps": steps, "checkpoint_every": every,
          "max_attempts": faults + 1, "crash_loop": 3, "backoff_s": 0, "timeout_s": 900,
          "faults": [{"kind": "sigkill", "step": kill, "rank": 0, "attempt": 1},
                     {"kind": "hang", "step": hang, "rank": 0, "attempt": 2}][:faults],
          # The first launch compiles from nothing (1b: a minute or more); later steps: the defaults.
          "watchdog": {"startup_s": 600}, "continue_on_failure": True}
    for k, v in (extra or {}).items():
        st[k] = {**st.get(k, {}), **v} if isinstance(v, dict) else v
    return st


def trainer(a: argparse.Namespace, **over: Any) -> dict[str, Any]:
    # overlap_steps off everywhere: the faults turn it off in the long run (`auto`), and the
    # bare run must train the same loop.
    return h.trainer(a, compile=a.compile, deterministic="auto", checkpoint_every=SHAPES[a.size][2], overlap_steps=False,
                     keep_last=1 if a.size == "1b" else 2, **({"compile_scope": a.compile_scope}
                                                             if a.compile_scope != "auto" else {}), **over)  # 1b: ~16 GB a checkpoint, 64 GB of disk


def ours_spec(a: argparse.Namespace, label: str, over: dict[str, Any], with_stages: bool) -> dict[str, Any]:
    name = f"relaunch-{a.size}" + ("" if label == "ours" else "-" + label.replace(" ", "-"))
    stages = [long_run(a.size)]
    if with_stages:
        stages += [{"name": "smoke", "kind": "smoke", "steps": 3, "timeout_s": 600},
                   {"name": "loss-check", "kind": "loss_check", "nodes": 1, "steps": 20, "window": 5,
                    "tolerance": 0.5, "reference": {"record": True}, "timeout_s": 600}]
        if a.size != "1b":
            stages.append({"name": "resume", "kind": "resume_test", "nodes": 1, "checkpoint_step": 10,
                           "interrupt_step": 12, "steps": 16, "signals": ["SIGKILL"], "timeout_s": 600})
    return h.campaign_spec(a, name, f"{label}: relaunch costs, {a.size}", trainer(a, **over), stages)


def blind_spec(a: argparse.Namespace) -> dict[str, Any]:
    from goodput import BASELINE

    return h.campaign_spec(a, f"relaunch-{a.size}-blind", f"blind retry: relaunch costs, {a.size}",
                           trainer(a, warm_start=False, rescue=False, compile_cache=False),
                           [long_run(a.size, BASELINE, faults=BLIND_FAULTS.get(a.size, 2))])


def bare(run: h.Run, config: Path, name: str, steps: int) -> dict[str, Any]:
    """The campaign's first trainer.json, alone: no faults, a fresh checkpoint folder, no
    compile cache (it compiles from nothing, as that first launch did), `steps` steps and no
    checkpoint (the steps before the long run's first save: per step, both sides train alike)."""
    d = run.workdir / f"bare-{name}"
    d.mkdir(parents=True, exist_ok=True)
    cfg = json.loads(config.read_text())
    cfg["faults"] = []
    cfg["run"].update(checkpoint_dir=str(d / "checkpoints"), compile_cache_dir=None, resume=False, attempt=1,
                      rescue=False, max_steps=steps, checkpoint_final=False, checkpoint_at=[])
    path = d / "trainer.json"
    path.write_text(json.dumps(cfg))
    env = {k: v for k, v in run.env.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
    env.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", CAMPAIGN_RUN_DIR=str(d))
    h.say(f"bare trainer: {path}")
    t0 = time.time()
    with open(d / "trainer.log", "w") as log:
        code = subprocess.run([sys.executable, "-m", "campaign.train", "--config", str(path)], env=env, cwd=d,
                              stdout=log, stderr=subprocess.STDOUT, timeout=max(30.0, run.left() - 20)).returncode
    t1 = time.time()
    rows = metrics_rows(d)
    marks = startup_event(d)
    return {"exit_code": code, "t0": t0, "t1": t1, "rows": rows, "marks": marks, "run_dir": str(d)}


# --- reading what happened -----------------------------------------------------------------

def metrics_rows(run_dir: Path | str) -> list[dict[str, Any]]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return sorted({r["step"]: r for r in rows}.values(), key=lambda r: r["step"])


def startup_event(run_dir: Path | str) -> dict[str, Any] | None:
    path = Path(run_dir) / "events.jsonl"
    if not path.exists():
        return None
    for line in path.read_text().splitlines():
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if e.get("event") == "startup":
            return e
    return None


def gaps(rows: list[dict[str, Any]]) -> list[float]:
    """Wall time between consecutive rows, leaving out each attempt's first SKIP steps."""
    return [b["time"] - a["time"] for a, b in zip(rows, rows[1:])
            if b["step"] == a["step"] + 1 and a["step"] > SKIP]


def startup_segments(marks: dict[str, float], step_s: float) -> dict[str, float]:
    """The trainer's own start-up marks as segments: process created -> main (interpreter) ->
    imports -> process group (+ startup check) -> model built -> checkpoint loaded -> first step,
    the first step split into compiled (all but one steady step) and the step itself."""
    def seg(a: str, b: str) -> float | None:
        return marks[b] - marks[a] if a in marks and b in marks else None

    first = seg("checkpoint_loaded", "first_step")
    out = {"interpreter": seg("process", "main"), "imports": seg("main", "imports"),
           "process group": seg("imports", "startup_check"), "model built": seg("startup_check", "model_built"),
           "checkpoint loaded": seg("model_built", "checkpoint_loaded"),
           "compiled": None if first is None else max(0.0, first - step_s),
           "first step": None if first is None else min(first, step_s)}
    return {k: v for k, v in out.items() if v is not None}


def relaunch(failed: dict[str, Any], nxt: dict[str, Any], step_s: float) -> dict[str, Any]:
    """The breakdown of one relaunch, from the failed attempt and the next one."""
    sup = _supervisor(failed)
    t_fault = failed["steps"][-1][1] if failed["steps"] else failed["started"]  # the last step before the fault
    t_stopped = killed_at(failed)
    sup_start = t_stopped - (sup.get("duration_s") or 0.0) if sup else None
    if sup.get("detected_after_s") is not None:  # a stall: time without a new step when the watchdog fired
        t_detect = t_fault + sup["detected_after_s"]
    elif (sup.get("first_failure") or {}).get("after_s") is not None and sup_start is not None:
        t_detect = sup_start + sup["first_failure"]["after_s"]  # a rank's exit, seen
    else:
        t_detect = t_stopped
    t_detect = min(max(t_detect, t_fault), t_stopped)
    marks = (nxt.get("startup") or {}).get("marks") or {}
    seg = {"detected": t_detect - t_fault, "stopped": t_stopped - t_detect}
    if "process" in marks:
        seg["new ranks"] = marks["process"] - t_stopped
    seg.update(startup_segments(marks, step_s))
    before = failed["steps"][-1][0] if failed["steps"] else None
    again = next((t for s, t, _ in nxt["steps"] if before is not None and s >= before), None)
    lost = again - t_fault - step_s if again is not None else None
    resumed = nxt["steps"][0][0] - 1 if nxt["steps"] else None
    return {"attempt": failed["number"], "fault": failed["state"], "fault_step": (before or 0) + 1,
            "resumed_from": resumed, "segments": {k: round(v, 3) for k, v in seg.items()},
            "startup_s": round(sum(seg.get(k, 0.0) for k in STARTUP), 3),
            "to_first_step_s": round(sum(seg.values()), 3),
            "recompute_steps": None if before is None or resumed is None else before - resumed,
            "lost_s": None if lost is None else round(lost, 3),
            "warm": (nxt.get("startup") or {}).get("warm"),
            "compile_cache": ((nxt.get("startup") or {}).get("compile_cache") or {}).get("mode"),
            # How the failed rank ended: 137 for the kill fault or the supervisor's SIGKILL at the
            # grace, 143 for a hung rank's own exit after the SIGTERM; with `stopped`, it tells a
            # slow exit (143 late) from a rank that never exited (137 at the grace).
            "rank_exit": (sup.get("first_failure") or {}).get("exit_code")}


def _supervisor(a: dict[str, Any]) -> dict[str, Any]:
    try:
        return json.loads((Path(a["run_dir"]) / "supervisor.json").read_text())
    except (OSError, ValueError):
        return {}


SHAPES_EVERY: dict[str, int] = {}
"""Campaign name -> its checkpoint interval (set as the campaigns are made): attempt 1's steps
before the first save are the ones compared with the bare run's."""


def analyse(run: h.Run, name: str) -> dict[str, Any]:
    atts = [a for a in ledger_attempts(run.campaigns, name) if a["stage"] == "long-run"]
    for a in atts:
        a["startup"] = startup_event(a["run_dir"])
    rows = [{"step": s, "time": t} for a in atts for s, t, _ in a["steps"]]
    g = gaps(rows)
    step_s = statistics.median(g) if g else 0.0
    every = SHAPES_EVERY.get(name)
    g1 = gaps([{"step": s, "time": t} for s, t, _ in atts[0]["steps"] if every is None or s < every]) if atts else []
    out = {"attempts": [{k: a[k] for k in ("number", "state", "exit_code", "first_step", "last_step")} for a in atts],
           "step_s": step_s, "step_s_first": statistics.median(g1) if g1 else None, "relaunches": [], "first": None}
    for a, nxt in zip(atts, atts[1:]):
        if a["state"] != "succeeded":
            out["relaunches"].append(relaunch(a, nxt, step_s))
    if atts:
        first = atts[0]
        marks = (first.get("startup") or {}).get("marks") or {}
        out["first"] = {"segments": startup_segments(marks, step_s), "warm": (first.get("startup") or {}).get("warm"),
                        "started": first["started"], "first_step_time": first["steps"][0][1] if first["steps"] else None,
                        "process": marks.get("process")}
        out["last_step_time"] = atts[-1]["steps"][-1][1] if atts[-1]["steps"] else None
    out["finished"] = bool(atts and atts[-1]["state"] == "succeeded")
    return out


# --- tables --------------------------------------------------------------------------------

def breakdown_rows(size: str, label: str, an: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for r in an["relaunches"]:
        rows.append({"size": size, "policy": label, "attempt": r["attempt"], "fault": r["fault"],
                     **{p: r["segments"].get(p) for p in PHASES}, "startup_s": r["startup_s"],
                     "to_first_step_s": r["to_first_step_s"], "recompute_steps": r["recompute_steps"],
                     "lost_s": r["lost_s"], "warm": r["warm"], "compile_cache": r["compile_cache"],
                     "rank_exit": r.get("rank_exit")})
    return rows


def breakdown_table(rows: list[dict[str, Any]]) -> str:
    return h.md_table(["size", "policy", "fault", *PHASES, "start-up", "fault->1st step", "recomputed steps",
                       "lost s", "warm", "cache", "rank's exit"],
                      [[r["size"], r["policy"], r["fault"], *(fmt(r[p], ".2f") for p in PHASES), fmt(r["startup_s"], ".2f"),
                        fmt(r["to_first_step_s"], ".2f"), fmt(r["recompute_steps"]), fmt(r["lost_s"], ".1f"),
                        fmt(r["warm"]), fmt(r["compile_cache"]), fmt(r.get("rank_exit"))] for r in rows])


# --- projection ----------------------------------------------------------------------------

ASSUMPTIONS = (
    ("interruption rate", "Llama 3: 466 job interruptions in 54 days on 16,384 H100s, 8 per node (arXiv 2407.21783, "
     "section 3.3.4), per node, scaled linearly with the job's nodes (cited; linear scaling is an assumption)"),
    ("seconds per fault", "measured here on one GPU (mean of kill and hang) for each policy; the same at every size "
                          "(assumption: see the lines below for what it leaves out)"),
    ("scheduler", "no new job is queued: relaunch inside the running allocation, spares in hand (assumption; a "
                  "requeue on a busy machine costs minutes to hours)"),
    ("imports at scale", "`import torch` from Lustre: 58 s at 128 nodes, 1:45 at 256, 4:43 at 512 without a cache "
                         "(ALCF Copper, debug phase; cited in shared notes); the warm start pays it once per block, "
                         "blind retry on every relaunch: added to blind retry as 58 s at >= 128 nodes (assumption: "
                         "Copper-class caching caps it there)"),
    ("rendezvous", "process-group start grows with ranks; nvidia-resiliency-ext budgets a barrier at 0.5 s at 16k "
                   "ranks (cited); not added (assumption: small against the rest)"),
    ("compile", "the compile cache is per rank (pytorch issue 188332): every rank of a relaunch reads its own folder "
                "on the shared filesystem (assumption: the filesystem serves it as fast as here)"),
)


def llama3_mtbf_s(nodes: int) -> float:
    from goodput import llama3_mtbf_s as f

    return f(nodes)


def projection(lost: dict[str, float], import_storm_s: float = 58.0) -> tuple[str, list[dict[str, Any]]]:
    """ETTR = MTBF / (MTBF + seconds lost per fault) at Llama 3's per-node rate, for 2..10,624
    nodes, from each policy's measured seconds per fault (+ the import storm for cold starts
    at >= 128 nodes). Projected, not run."""
    from goodput import PROJECTED_NODES

    sizes = sorted(PROJECTED_NODES)
    rows = []
    for label, x in lost.items():
        cold = "blind" in label
        r = {"policy": label, "s_per_fault": round(x, 2)}
        for n in sizes:
            per = x + (import_storm_s if cold and n >= 128 else 0.0)
            r[str(n)] = round(llama3_mtbf_s(n) / (llama3_mtbf_s(n) + per), 5)
        rows.append(r)
    lines = ["ETTR projected at Llama 3's interruption rate (not run; restart costs only, checkpoint stalls and "
             "recomputation at scale as measured here):",
             h.md_table(["policy", "s / fault (here)", *(f"{n} nodes" for n in sizes)],
                        [["MTBF of the job (s)", "", *(f"{llama3_mtbf_s(n):,.0f}" for n in sizes)]]
                        + [[r["policy"], fmt(r["s_per_fault"], ".1f"), *(f"{r[str(n)]:.4f}" for n in sizes)]
                           for r in rows]),
             "", "Assumptions:"] + [f"- {k}: {v}" for k, v in ASSUMPTIONS]
    return "\n".join(lines), rows


def lost_by_policy(results: dict[str, Any], size: str) -> dict[str, float]:
    out = {}
    for label, an in (results.get(size) or {}).get("policies", {}).items():
        xs = [r["lost_s"] for r in an["relaunches"] if r["lost_s"] is not None]
        if xs:
            out[f"{label} ({size})"] = statistics.mean(xs)
    return out


# --- the figure ----------------------------------------------------------------------------

COLOURS = {"detected": "#d62728", "stopped": "#ff7f0e", "new ranks": "#8c564b", "interpreter": "#e377c2",
           "imports": "#bcbd22", "process group": "#17becf", "model built": "#7f7f7f", "checkpoint loaded": "#9467bd",
           "compiled": "#1f77b4", "first step": "#2ca02c"}


def plot(csv_path: Path, png: Path, title: str) -> None:
    """A stacked bar per (size, policy, fault) of breakdown.csv: fault -> first new step, by segment."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(csv_path) as f:
        rows = list(csv.DictReader(f))
    rows.sort(key=lambda r: (list(SHAPES).index(r["size"]) if r["size"] in SHAPES else 9, r["fault"], r["policy"]))
    labels = [f"{r['size']} {'kill' if r['fault'].startswith('crash') else 'hang' if r['fault'] == 'stalled' else r['fault']}"
              f"\n{r['policy']}" for r in rows]
    fig, ax = plt.subplots(figsize=(max(7.0, 0.9 * len(rows) + 3.5), 4.4), dpi=90)
    bottom = [0.0] * len(rows)
    for p in PHASES:
        vals = [float(r[p]) if r.get(p) not in (None, "") else 0.0 for r in rows]
        ax.bar(range(len(rows)), vals, bottom=bottom, color=COLOURS[p], label=p, width=0.7)
        bottom = [b + v for b, v in zip(bottom, vals)]
    for i, r in enumerate(rows):
        if r.get("lost_s") not in (None, ""):
            ax.text(i, bottom[i] + 0.5, f"lost {float(r['lost_s']):.0f} s", ha="center", fontsize=7)
    ax.set_xticks(range(len(rows)), labels, fontsize=7)
    ax.set_ylabel("s, fault (start: process) to first new step")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.set_ylim(0, max(bottom + [1.0]) * 1.12)
    fig.tight_layout()
    fig.savefig(png)
    plt.close(fig)


# --- main ------------------------------------------------------------------------------------

def run_size(run: h.Run, args: argparse.Namespace, size: str, reserve_s: float) -> dict[str, Any]:
    a = sized(args, size)
    res: dict[str, Any] = {"policies": {}}
    specs = [("ours", ours_spec(a, "ours", {}, with_stages=size in args.stages_at.split(",")))]
    specs.append(("blind retry", blind_spec(a)))
    if size in args.cuts:
        specs += [("no cache", ours_spec(a, "no cache", {"compile_cache": False}, False)),
                  ("cold start", ours_spec(a, "cold start", {"warm_start": False}, False))]
    every = SHAPES[size][2]
    for i, (label, spec) in enumerate(specs):
        SHAPES_EVERY[spec["name"]] = every
        if i == 2:  # after ours and blind retry: the bare trainer, then the cuts
            run_bare(run, res, specs[0][1]["name"], size, reserve_s)
        if run.left() < reserve_s:
            h.say(f"{size}: no time left for {label}")
            res.setdefault("not_run", []).append(label)
            continue
        t0 = time.time()
        # Blind retry leaves the bare trainer its time (its first start, a compile from nothing).
        out = run.campaign(spec, reserve_s=reserve_s + (BARE_S[size] if i == 1 else 0))
        t1 = time.time()
        an = analyse(run, spec["name"])
        an.update(cli_t0=t0, cli_t1=t1, exit_code=out["submit"]["exit_code"],
                  stages=[(s["name"], s["state"]) for s in (out["status"] or {}).get("stages", [])])
        res["policies"][label] = an
        drop_checkpoints(run.campaigns / spec["name"])
    run_bare(run, res, specs[0][1]["name"], size, reserve_s)  # (where no cut ran after it)
    return res


def run_bare(run: h.Run, res: dict[str, Any], ours: str, size: str, reserve_s: float) -> None:
    """The bare trainer (after ours and blind retry), with ours' first attempt's config."""
    if "bare" in res or "bare" in res.get("not_run", []):
        return
    atts = ledger_attempts(run.campaigns, ours)
    if not atts or run.left() < reserve_s + 30:
        h.say(f"{size}: no time left for the bare trainer")
        res.setdefault("not_run", []).append("bare")
        return
    res["bare"] = bare(run, Path(atts[0]["run_dir"]) / "trainer.json", size, SHAPES[size][2] - 1)
    drop_checkpoints(Path(res["bare"]["run_dir"]))


def drop_checkpoints(root: Path) -> None:
    """Remove a finished run's checkpoints (read nothing from them; 1b's are ~16 GB each, and the
    machine's disk holds a few): the tables come from the ledger, metrics and events."""
    import shutil

    for d in sorted(root.rglob("checkpoints*")) if root.exists() else []:
        if d.is_dir():
            shutil.rmtree(d, ignore_errors=True)


def overhead(res: dict[str, Any]) -> dict[str, Any] | None:
    ours, b = res["policies"].get("ours"), res.get("bare")
    if not ours or not b or not b["rows"] or not ours.get("first") or ours["first"].get("first_step_time") is None:
        return None
    bg = gaps(b["rows"])
    camp_step, bare_step = ours["step_s_first"], statistics.median(bg) if bg else None
    first = ours["first"]
    where = {"cli start -> attempt start": first["started"] - ours["cli_t0"],
             "attempt start -> trainer process": (first["process"] - first["started"]) if first.get("process") else None,
             "trainer process -> first step": (first["first_step_time"] - first["process"]) if first.get("process") else None}
    return {"campaign_step_s": camp_step, "bare_step_s": bare_step,
            "per_step": camp_step / bare_step if bare_step and camp_step else None,
            "campaign_start_s": first["first_step_time"] - ours["cli_t0"], "campaign_start": where,
            "bare_start_s": b["rows"][0]["time"] - b["t0"],
            "fixed_start_s": (first["first_step_time"] - ours["cli_t0"]) - (b["rows"][0]["time"] - b["t0"]),
            "bare_marks": startup_segments(((b["marks"] or {}).get("marks") or {}), bare_step or 0.0),
            "campaign_marks": first["segments"]}


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if args.plot:
        plot(args.plot[0], args.plot[1], args.title)
        return
    if args.project:
        saved = json.loads(args.project.read_text())
        lost = {k: v for size in saved.get("sizes", {}) for k, v in lost_by_policy(saved["sizes"], size).items()}
        print(projection(lost)[0])
        return
    if args.rehearsal and args.out is None and not os.environ.get("OUT"):  # not into the checkout
        import tempfile

        args.out = Path(tempfile.mkdtemp(prefix="gpu-relaunch-rehearsal-"))
    specs = [s for size in args.sizes for s in (ours_spec(sized(args, size), "ours", {}, True), blind_spec(sized(args, size)))]
    run = h.start(args, "Relaunch cost on one GPU", specs)
    results: dict[str, Any] = {}
    for i, size in enumerate(args.sizes):
        results[size] = run_size(run, args, size, reserve_s=25 if i == len(args.sizes) - 1 else 60)
    run.result["sizes"] = results
    lines: list[str] = []
    targets = h.Targets("gpu_relaunch")
    rows: list[dict[str, Any]] = []
    for size, res in results.items():
        for label, an in res["policies"].items():
            lines += [f"- {size} {label}: campaign submit exit {an['exit_code']}; stages {an['stages']}; "
                      f"long-run attempts " + "; ".join(f"{x['number']} {x['state']} steps {x['first_step']}-"
                                                        f"{x['last_step']}" for x in an["attempts"])]
            rows += breakdown_rows(size, label, an)
        ov = overhead(res)
        res["overhead"] = ov
        if ov:
            r2 = lambda d: json.dumps({k: None if v is None else round(v, 2) for k, v in d.items()})  # noqa: E731
            lines += [f"- {size} per step (attempt 1, steps {SKIP + 1}-{SHAPES[size][2] - 1}): campaign "
                      f"{fmt(ov['campaign_step_s'], '.4f')} s, bare {fmt(ov['bare_step_s'], '.4f')} s; start to first step: "
                      f"campaign {ov['campaign_start_s']:.2f} s {r2(ov['campaign_start'])}, trainer's marks "
                      f"{r2(ov['campaign_marks'])}; bare {ov['bare_start_s']:.2f} s, its marks {r2(ov['bare_marks'])}"]
            targets.check(f"{size}: per step, campaign/bare", ov["per_step"] or float("nan"), "<=", PER_STEP_MAX, "x")
            targets.check(f"{size}: fixed overhead at the start, campaign - bare", ov["fixed_start_s"], "<=",
                          FIXED_MAX_S, " s")
        else:
            targets.require(f"{size}: overhead measured (ours and bare ran)", False)
        ours = res["policies"].get("ours")
        targets.require(f"{size}: ours finished its long run after a kill and a hang",
                        bool(ours and ours["finished"] and len(ours["relaunches"]) == 2))
        if ours:
            targets.require(f"{size}: ours' campaign passed (every stage it ran)",
                            ours["exit_code"] == 0, f"exit {ours['exit_code']}")
        cold = res["policies"].get("no cache") or res["policies"].get("blind retry")
        if ours and cold and ours["relaunches"] and cold["relaunches"]:
            o = statistics.mean(r["startup_s"] for r in ours["relaunches"])
            c = statistics.mean(r["startup_s"] for r in cold["relaunches"])
            res["startup_ratio"] = {"ours_s": o, "cold_s": c, "ratio": o / c, "cold_policy": cold is res["policies"].get("no cache")}
            targets.check(
                f"{size}: relaunch start-up (stopped -> first step) with caches / without", o / c, "<=", CACHE_RATIO_MAX, "x")
        if size == "1b" or args.rehearsal:
            for r in (ours or {}).get("relaunches", []):
                targets.check(f"{size}: seconds lost by the {r['fault']} fault (ours)", r["lost_s"] if r["lost_s"] is not None
                              else float("nan"), "<=", LOST_MAX_S, " s")
    lost = {k: v for size in results for k, v in lost_by_policy(results, size).items()}
    proj, proj_rows = projection(lost)
    run.result["projection"] = proj_rows
    with open(run.out / "breakdown.csv", "w", newline="") as f:
        if rows:
            w = csv.DictWriter(f, list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    commit = os.environ.get("CAMPAIGN_COMMIT") or subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent,
        check=False).stdout.strip() or "?"
    body = [f"commit {commit}; command: python benchmarks/gpu_relaunch.py {' '.join(sys.argv[1:])}", "", *lines, "",
            "### Relaunch breakdown (s; each segment ends at its name)", "", breakdown_table(rows), "", proj]
    h.finish(run, body, targets)


if __name__ == "__main__":
    sys.exit(main())
