"""What the GPU campaign benchmarks share: their options, the campaign spec's site and
trainer, running the `campaign` CLI (submit, status --json, ledger export), the scaling
table, and writing the outputs (summary.md/.json, steps.csv, attempts.csv, runs.tar.gz).

Not run on its own. The scripts beside it import it (`python benchmarks/gpu_*.py` puts
benchmarks/ on sys.path): gpu_throughput_in_campaign.py, gpu_ddp_allreduce.py,
gpu_hang_drill.py, gpu_resume_exact.py, gpu_relaunch.py.

Every campaign runs on the `local` site with one virtual node per GPU (`bind_gpus: true`:
virtual node i sees only GPU i), so node counts can be scaled and a node, with its GPU,
excluded. Everything started here runs with NVLink multicast off (NO_MULTICAST).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path
from typing import Any, NoReturn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _target import Targets, skip  # noqa: E402

NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
NODE_COUNTS = (1, 2, 4, 8)


# --- options and campaign files ---------------------------------------------------------------

def parser(doc: str, size: str, micro_batch: int, budget_s: float,
           drill_names: bool = False) -> argparse.ArgumentParser:
    """The options every GPU benchmark takes. `drill_names` also accepts the old single
    script's names for the drill model (--drill-size, --drill-micro-batch)."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpus", type=int, default=None, help="GPUs to use (default: all that nvidia-smi lists)")
    p.add_argument("--out", type=Path, default=None, help="tables and logs (default: $OUT or ./gpu-campaign-out)")
    p.add_argument("--workdir", type=Path, default=None, help="ledger and run directories (default: a new /tmp dir)")
    p.add_argument("--size", *(["--drill-size"] if drill_names else []), default=size, help="model size")
    p.add_argument("--micro-batch", *(["--drill-micro-batch"] if drill_names else []), type=int,
                   default=micro_batch, help="sequences per GPU per step")
    p.add_argument("--budget-s", type=float, default=budget_s,
                   help="wall-clock budget: the campaign is cancelled (SIGINT) when it runs out")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--rehearsal", action="store_true", help="tiny model on CPU (gloo): checks the harness anywhere")
    p.add_argument("--write-specs", type=Path, default=None, metavar="DIR", help="write the campaign files and exit")
    return p


def finish_args(args: argparse.Namespace, rehearsal_micro_batch: int | None = None) -> argparse.Namespace:
    if args.rehearsal:
        args.device, args.size = "cpu", "tiny"
        args.micro_batch = rehearsal_micro_batch or args.micro_batch
    if args.gpus is None:
        args.gpus = max(1, gpu_count()) if args.device == "cuda" else 1
    return args


def parse_scaling(doc: str, budget_s: float, argv: list[str] | None) -> argparse.Namespace:
    """The options of the two scaling benchmarks: the `1b` shape, 8 sequences per GPU, --compile."""
    p = parser(doc, size="1b", micro_batch=8, budget_s=budget_s)
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    return finish_args(p.parse_args(argv), rehearsal_micro_batch=4)


def gpu_count() -> int:
    """GPUs nvidia-smi lists (no CUDA context is created in this process)."""
    if not shutil.which("nvidia-smi"):
        return 0
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False)
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def site(args: argparse.Namespace) -> dict[str, Any]:
    return {"kind": "local", "nodes": args.gpus, "ranks_per_node": 1, "bind_gpus": args.device == "cuda"}


def campaign_spec(args: argparse.Namespace, name: str, description: str, trainer: dict[str, Any],
                  stages: list[dict[str, Any]]) -> dict[str, Any]:
    """A campaign of --size on synthetic data, on the local site with one virtual node per GPU."""
    return {"name": name, "description": description, "site": site(args), "model": {"size": args.size},
            "data": {"source": "synthetic"}, "trainer": trainer, "stages": stages}


def trainer(args: argparse.Namespace, **over: Any) -> dict[str, Any]:
    gpu = args.device == "cuda"
    t = {"parallelism": "fsdp", "precision": "bf16" if gpu else "auto", "device": args.device,
         "backend": "nccl" if gpu else "gloo", "compile": False, "deterministic": True,
         "micro_batch_size": args.micro_batch, "lr": 6e-4, "warmup_steps": 10, "schedule_steps": 1000}
    t.update(over)
    return t


def scaling_stage(args: argparse.Namespace, steps: int, reference: str | None) -> dict[str, Any]:
    """Weak scaling over node counts [1, 2, 4, 8] up to --gpus (and --gpus itself)."""
    counts = [n for n in NODE_COUNTS if n <= args.gpus]
    counts += [] if args.gpus in counts else [args.gpus]
    st = {"name": "scaling", "kind": "scaling", "node_counts": counts, "batch": "weak",
          "steps": steps, "warmup_steps": 5, "min_efficiency": 0.8, "loss_tolerance": 0.15,
          "timeout_s": 600, "continue_on_failure": True}
    return {**st, "reference": {"stage_run": reference}} if reference else st


def write_spec(spec: dict[str, Any], path: Path) -> Path:
    import yaml

    path.parent.mkdir(parents=True, exist_ok=True)
    spec = json.loads(json.dumps(spec))  # plain types
    path.write_text(f"# written by benchmarks/{Path(sys.argv[0]).name}\n{yaml.safe_dump(spec, sort_keys=False)}")
    return path


def start(args: argparse.Namespace, title: str, specs: list[dict[str, Any]]) -> Run:
    """With --write-specs, write SPECS there and exit 0; else a Run, after checking that the
    machine has the GPUs asked for (exit 2 when it has fewer)."""
    if args.write_specs:
        for spec in specs:
            print(write_spec(spec, args.write_specs / f"{spec['name']}.yaml"))
        raise SystemExit(0)
    have = gpu_count()
    say(f"GPUs listed by nvidia-smi: {have}; using {args.gpus} on {args.device}")
    if args.device == "cuda" and have == 0:
        skip(Path(sys.argv[0]).stem, "no GPU (nvidia-smi lists none); --rehearsal runs the harness on CPU")
    if args.device == "cuda" and have < args.gpus:
        say(f"error: --gpus {args.gpus} but this machine has {have}")
        raise SystemExit(2)
    run = Run(args, title)
    say(f"workdir {run.workdir}; out {run.out}")
    run.result["environment"] = environment()
    return run


# --- running the CLI --------------------------------------------------------------------------

class Run:
    """The CLI, the clock, the output folder and the results of one benchmark run."""

    def __init__(self, args: argparse.Namespace, title: str) -> None:
        self.args, self.title = args, title
        self.out = (args.out or Path(os.environ.get("OUT") or "gpu-campaign-out")).resolve()
        self.workdir = (args.workdir or Path(f"/tmp/gpu-campaign-{time.strftime('%Y%m%d-%H%M%S')}")).resolve()
        self.out.mkdir(parents=True, exist_ok=True)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.campaigns = self.workdir / "campaigns"
        self.deadline = time.time() + args.budget_s
        self.env = {**os.environ, **NO_MULTICAST, "PYTHONUNBUFFERED": "1", "CAMPAIGN_ALLOW_FAULTS": "1"}
        self.env.pop("CAMPAIGN_DB_URL", None)
        self.env.pop("CAMPAIGN_WORKDIR", None)
        self.result: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()},
                                       "workdir": str(self.workdir)}

    def left(self) -> float:
        return self.deadline - time.time()

    def cli(self, *argv: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "campaign.cli", *argv]
        return subprocess.run(cmd, cwd=self.workdir, env=self.env, capture_output=True, text=True,
                              timeout=timeout, check=False)

    def submit(self, spec: dict[str, Any], timeout: float) -> dict[str, Any]:
        """`campaign submit FILE`, streamed to stdout; SIGINT (cancel) at the timeout."""
        path = write_spec(spec, self.workdir / "specs" / f"{spec['name']}.yaml")
        cmd = [sys.executable, "-m", "campaign.cli", "submit", str(path), "--workdir", str(self.campaigns)]
        say(f"$ {' '.join(cmd)}   (timeout {timeout:.0f} s)")
        t0 = time.time()
        proc = subprocess.Popen(cmd, cwd=self.workdir, env=self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        reader = threading.Thread(target=_pump, args=(proc.stdout, path.stem), daemon=True)
        reader.start()
        cancelled = False
        try:
            code = proc.wait(timeout=max(5.0, timeout))
        except subprocess.TimeoutExpired:
            cancelled = True
            say(f"{path.stem}: out of time; cancelling (SIGINT)")
            proc.send_signal(signal.SIGINT)
            try:
                code = proc.wait(timeout=45)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                code = proc.wait()
        reader.join(timeout=5)
        return {"exit_code": code, "wall_s": round(time.time() - t0, 1), "cancelled_for_time": cancelled}

    def status(self, name: str) -> dict[str, Any] | None:
        r = self.cli("status", name, "--json", "--workdir", str(self.campaigns))
        if r.returncode != 0:
            say(f"campaign status {name} failed: {r.stderr.strip()}")
            return None
        return json.loads(r.stdout)

    def export(self, name: str, what: str) -> list[dict[str, Any]]:
        path = self.workdir / f"{name}-{what}.json"
        r = self.cli("ledger", "export", name, "--what", what, "--format", "json", "--out", str(path),
                     "--workdir", str(self.campaigns))
        if r.returncode != 0:
            say(f"campaign ledger export {name} failed: {r.stderr.strip()}")
            return []
        return json.loads(path.read_text())

    def campaign(self, spec: dict[str, Any], reserve_s: float) -> dict[str, Any]:
        """Submit SPEC (leaving `reserve_s` of the budget), then read back its status, steps
        and attempts: {"submit", "status", "steps"}, kept in self.result under its name."""
        name = spec["name"]
        res = {"submit": self.submit(spec, timeout=self.left() - reserve_s), "status": self.status(name),
               "steps": self.export(name, "steps")}
        self.export(name, "attempts")
        self.result[name] = {k: v for k, v in res.items() if k != "steps"}
        return res


def _pump(stream: Any, tag: str) -> None:
    for line in stream:
        print(f"[{tag}] {line}", end="", flush=True)


def say(msg: str) -> None:
    print(f"== {time.strftime('%H:%M:%S')} {msg}", flush=True)


def environment() -> dict[str, Any]:
    env: dict[str, Any] = {"python": sys.version.split()[0]}
    r = subprocess.run([sys.executable, "-c", "import torch, parsl, pydantic, sqlalchemy; "
                        "print(torch.__version__, torch.version.cuda, parsl.__version__, pydantic.VERSION, "
                        "sqlalchemy.__version__)"], capture_output=True, text=True, check=False)
    env["versions"] = r.stdout.strip() or r.stderr.strip()[-300:]
    if shutil.which("nvidia-smi"):
        q = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, check=False)
        env["gpus"] = q.stdout.strip().splitlines()
    say(f"environment: {env}")
    return env


def nvidia_smi_text() -> str:
    if not shutil.which("nvidia-smi"):
        return "(no nvidia-smi)"
    r = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv"],
                       capture_output=True, text=True, check=False)
    return (r.stdout + r.stderr).strip()


# --- tables -------------------------------------------------------------------------------------

def fmt(v: Any, spec: str = "") -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and spec:
        return format(v, spec)
    return str(v)


def pct(v: float | None, spec: str) -> str:
    return "-" if v is None else f"{100 * v:{spec}}%"


def md_table(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def stage_lines(run: Run, name: str) -> list[str]:
    """The campaign's state, its submit's exit code and one line per stage with its verdict."""
    res = run.result.get(name) or {}
    st, sub = res.get("status"), res.get("submit") or {}
    if not st:
        return [f"## {name}: no status (campaign submit exit {sub.get('exit_code')})"]
    lines = [f"## {name}: {st['state']} (campaign submit exit {sub.get('exit_code')}, {sub.get('wall_s')} s)", ""]
    return lines + [f"- {s['name']} ({s['kind']}): **{s['state']}**: {s['verdict']}" for s in st["stages"]]


def scaling_rows(status: dict[str, Any] | None, steps: list[dict[str, Any]], warmup: int = 5) -> list[dict[str, Any]]:
    """The scaling stage's table (from the ledger) plus the median MFU per attempt (from the steps)."""
    if not status or not status.get("scaling"):
        return []
    rows = [dict(r) for r in status["scaling"][0]["rows"]]
    for r in rows:
        mfu = [m["mfu"] for m in steps if m.get("stage") == "scaling" and m.get("attempt") == r.get("attempt")
               and m["step"] > warmup and m.get("mfu") is not None]
        r["mfu"] = statistics.median(mfu) if mfu else None
    return rows


def scaling_table(rows: list[dict[str, Any]]) -> str:
    return md_table(
        ["GPUs", "step (s)", "tokens/s", "tokens/s/GPU", "MFU", "collective (s)", "coll. share", "peak mem (GiB)",
         "last loss", "efficiency"],
        [[fmt(r["nodes"]), fmt(r.get("step_time_s"), ".4f"), fmt(r.get("tokens_per_s"), ",.0f"),
          fmt(r["tokens_per_s"] / r["nodes"] if r.get("tokens_per_s") else None, ",.0f"),
          pct(r.get("mfu"), ".1f"), fmt(r.get("comm_time_s"), ".4f"), pct(r.get("comm_share"), ".2f"),
          fmt(r.get("mem_peak_gib"), ".1f"), fmt(r.get("last_loss"), ".4f"), fmt(r.get("efficiency"), ".3f")]
         for r in rows])


def vs_one_gpu(rows: list[dict[str, Any]], key: str, label: str, per_gpu: bool) -> list[str]:
    """`key` at every node count as a ratio to the 1-GPU row of the same stage (the baseline)."""
    def value(r: dict[str, Any]) -> float | None:
        v = r.get(key)
        return v / r["nodes"] if v is not None and per_gpu else v

    base = next((value(r) for r in rows if r["nodes"] == 1), None)
    if not base:
        return [f"{label}: no 1-GPU baseline measured"]
    more = [r for r in rows if r["nodes"] > 1]
    if not more:
        return [f"{label}: only the 1-GPU baseline ran (ratio 1.000x by definition; run with --gpus >= 2)"]
    return [f"{label} at {r['nodes']} GPUs: " + ("-" if value(r) is None else f"{value(r) / base:.3f}x")
            for r in more]


def scaling_report(run: Run, name: str, res: dict[str, Any], heading: str,
                   ratios: list[tuple[str, str, bool]]) -> list[str]:
    """Stage verdicts, the scaling table and, for each (key, label, per GPU) in `ratios`, the
    ratio at every node count to the 1-GPU row of the same stage."""
    rows = scaling_rows(res["status"], res["steps"])
    run.result[name]["scaling"] = rows
    lines = [line for key, label, per_gpu in ratios for line in vs_one_gpu(rows, key, label, per_gpu)]
    return stage_lines(run, name) + ["", heading, "", scaling_table(rows), "",
                                     "Ratio vs baseline (the 1-GPU row of this stage): " + "; ".join(lines)]


# --- outputs -----------------------------------------------------------------------------------

def finish(run: Run, lines: list[str], targets: Targets) -> NoReturn:
    """Write summary.md/.json, steps.csv, attempts.csv and runs.tar.gz to --out; print the summary,
    then the targets' verdicts; exit 1 if one was missed."""
    run.result["nvidia_smi_final"] = nvidia_smi_text()
    head = [f"# {run.title} ({run.args.gpus} GPU(s), {run.args.device})", "",
            f"environment: {json.dumps(run.result.get('environment'))}", ""]
    text = "\n".join(head + lines + ["", "nvidia-smi at the end:", "```", run.result["nvidia_smi_final"], "```"]) + "\n"
    (run.out / "summary.md").write_text(text)
    (run.out / "summary.json").write_text(json.dumps(run.result, indent=1, default=str))
    _merge_exports(run.workdir, run.out)
    _tar_runs(run.workdir, run.out / "runs.tar.gz")
    print(text, flush=True)
    run.result["targets"] = [{"target": line, "met": met} for line, met in targets.verdicts]
    (run.out / "summary.json").write_text(json.dumps(run.result, indent=1, default=str))
    targets.exit()


def _merge_exports(workdir: Path, out: Path) -> None:
    for what in ("steps", "attempts"):
        rows = []
        for f in sorted(workdir.glob(f"*-{what}.json")):
            name = f.name[: -len(f"-{what}.json")]
            rows += [{"campaign": name, **r} for r in json.loads(f.read_text())]
        if not rows:
            continue
        cols = list(dict.fromkeys(k for r in rows for k in r))
        with open(out / f"{what}.csv", "w", newline="") as fh:
            w = csv.DictWriter(fh, cols)
            w.writeheader()
            for r in rows:
                w.writerow({k: (" ".join(map(str, v)) if isinstance(v, list) else v) for k, v in r.items()})


def _tar_runs(workdir: Path, dest: Path) -> None:
    """Run directories without checkpoints (rank logs, supervisor reports, metrics, events,
    heartbeats, Parsl logs) and the ledger, under 15 MB."""
    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        parts = Path(info.name).parts
        return None if any(p.startswith("checkpoints") for p in parts) else info

    for skip_parsl in (False, True):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            for p in sorted(workdir.iterdir()):
                if skip_parsl and p.name == "campaigns":
                    for q in sorted(p.rglob("*")):
                        if q.is_file() and "parsl" not in q.relative_to(p).parts[:2] \
                                and not any(x.startswith("checkpoints") for x in q.parts):
                            tar.add(q, arcname=str(q.relative_to(workdir)), recursive=False)
                else:
                    tar.add(p, arcname=p.name, filter=keep)
        if buf.tell() < 15 * 2**20:
            dest.write_bytes(buf.getvalue())
            return
    dest.write_bytes(buf.getvalue()[: 15 * 2**20])
