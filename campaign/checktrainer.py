"""`campaign check-trainer FILE`: run a trainer briefly on this machine and list what the
trainer contract needs and is missing, with the fix for each (docs/trainer-contract.md).

    findings = check(Path("examples/own-trainer.yaml"))   # or a script: train.py
    print(render(findings))

FILE is a campaign file (its `trainer` section: command template, progress, checkpoints,
resume_args) or a script (run as `{python} FILE`). Two attempts on the local site, 2 virtual
nodes x 1 rank, through the real supervisor: the first to `steps` with a checkpoint every
`steps // 2` steps; the second resumes to `steps + steps // 2`. An attempt that fails without
evidence either way is run once more, as a stage would. No ledger is touched.
"""

from __future__ import annotations

import math
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from campaign import contract, exits, runfiles
from campaign.attempt import build_request, trainer_config
from campaign.exits import NextAction
from campaign.spec import CampaignSpec
from campaign.stagebase import Targets
from campaign.watchdog import WatchdogPolicy

NODES = 2
"""Virtual nodes (one rank each) of the check: enough for a real all-reduce."""


@dataclass(frozen=True)
class Finding:
    """One item of the contract: whether the trainer honours it, what was seen, and the fix."""

    item: str
    ok: bool
    seen: str
    fix: str = ""
    needed: bool = True
    """False: the stages work without it (and say they could not check it)."""


def spec_for(file: Path) -> tuple[CampaignSpec, Path]:
    """The spec to check with (the file's trainer section on a 2-node local site) and its folder."""
    from campaign import spec as spec_mod

    if file.suffix in (".yaml", ".yml"):
        loaded = spec_mod.load(file)
        data = loaded.model_dump(mode="json", exclude_unset=True)
    else:
        data = {"trainer": {"command": ["{python}", str(file.resolve())]}}
    data.update(name="check-trainer", site={"kind": "local", "nodes": NODES, "ranks_per_node": 1},
                stages=[{"kind": "smoke"}])
    return spec_mod.parse(data, str(file)), file.resolve().parent


def check(file: Path, *, steps: int = 6, workdir: Path | None = None, timeout_s: float = 300) -> list[Finding]:
    """Run the two attempts in `workdir` (default: a new temporary folder) and judge them."""
    spec, spec_dir = spec_for(file)
    root = workdir or Path(tempfile.mkdtemp(prefix="campaign-check-"))
    every = max(1, steps // 2)
    first = _attempt(spec, spec_dir, root, 1, Targets(steps=steps, train={"checkpoint_every": every}), timeout_s)
    second = _attempt(spec, spec_dir, root, 2, Targets(steps=steps + every, resume=True,
                                                       train={"checkpoint_every": every}), timeout_s)
    return judge(spec, first, second, steps=steps, every=every)


def _attempt(spec: CampaignSpec, spec_dir: Path, root: Path, number: int, targets: Targets,
             timeout_s: float) -> dict[str, Any]:
    """One attempt; when it fails without evidence either way (`exits.CONFIRM_ONCE`: a one-off
    abort, say gloo's teardown), the one confirming rerun a stage would make, from the same
    checkpoint: its result counts, and says what the first run hit."""
    ckpt = root / targets.checkpoints
    resume_from = contract.newest_complete(spec.trainer.checkpoints, ckpt) if targets.resume else None
    first = _launch(spec, spec_dir, root, f"attempt-{number:03d}", number, targets, resume_from, timeout_s)
    if exits.follows(first["exit_class"]) is not NextAction.CONFIRM:
        return first
    since = resume_from["step"] if resume_from else 0
    for c in contract.list_checkpoints(spec.trainer.checkpoints, ckpt):  # our own scratch folder
        if c["step"] > since:
            path = Path(c["path"])
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()
    rerun = _launch(spec, spec_dir, root, f"attempt-{number:03d}-rerun", number, targets, resume_from, timeout_s)
    return {**rerun, "rerun_after": first.get("error") or f"exit {first['exit_code']} ({first['exit_class']})"}


def _launch(spec: CampaignSpec, spec_dir: Path, root: Path, name: str, number: int, targets: Targets,
            resume_from: dict[str, Any] | None, timeout_s: float) -> dict[str, Any]:
    from campaign.supervisor import free_port, supervise

    run_dir = root / name
    run_dir.mkdir(parents=True, exist_ok=True)
    config = trainer_config(spec, targets, stage_dir=root, attempt=number, spec_dir=spec_dir)
    ckpt = root / targets.checkpoints
    request = build_request(spec.site, config, run_dir=run_dir, nodes=NODES, excluded=[], timeout_s=timeout_s,
                            master_port=free_port(), spec_dir=spec_dir, resume_from=resume_from,
                            watchdog=WatchdogPolicy(drill_s=0))
    request.config_path.write_text(config.model_dump_json(indent=2))
    rep = supervise(request)
    return {**rep, "run_dir": str(run_dir), "metrics": runfiles.read_metrics(run_dir)[0],
            "startup": runfiles.read_startup(run_dir), "heartbeats": runfiles.read_heartbeats(run_dir),
            "checkpoints": contract.list_checkpoints(spec.trainer.checkpoints, ckpt), "resume_from": resume_from}


def judge(spec: CampaignSpec, first: dict[str, Any], second: dict[str, Any], *, steps: int,
          every: int) -> list[Finding]:
    """Pure: the findings of the two attempts' results."""
    stdout = spec.trainer.progress == "stdout"
    return [_exit(first), _metrics(first, steps, stdout), _stops(first, steps), _startup(first, stdout),
            _heartbeats(first, stdout), _checkpoints(first, every, spec), _resume(second, every)]


def _log(a: dict[str, Any]) -> str:
    return f"{a['run_dir']}/logs/rank-0.log"


def _exit(a: dict[str, Any]) -> Finding:
    ok = a["exit_code"] == 0
    seen = "exit 0 on every rank" if ok else f"exit {a['exit_code']} ({a['exit_class']}): {a.get('error') or _log(a)}"
    if a.get("rerun_after"):
        seen += f" (in a confirming rerun; the first run: {a['rerun_after']})"
    return Finding("exit codes", ok, seen, "exit 0 once the target step is reached; 93 for a bad config, 94 for a "
                   "non-finite loss (the table in docs/trainer-contract.md)")


def _metrics(a: dict[str, Any], steps: int, stdout: bool) -> Finding:
    rows = a["metrics"]
    bad = [m["step"] for m in rows if not math.isfinite(m["loss"])]
    ok = bool(rows) and not bad
    source = "rank 0's output (progress: stdout)" if stdout else "metrics.jsonl"
    seen = (f"{len(rows)} step(s) from {source}" + (f"; non-finite loss at step {bad[0]}" if bad else "")
            if rows else f"no step rows in {a['run_dir']}/metrics.jsonl")
    fix = ("make step_pattern match rank 0's loss lines (" + _log(a) + ")" if stdout else
           "rep.step(step=, tokens=, loss=, step_time_s=) on rank 0 (campaign.report.Reporter), or, for an "
           "unchanged script, trainer.progress: stdout with a step_pattern")
    return Finding("metrics", ok, seen, fix)


def _stops(a: dict[str, Any], steps: int) -> Finding:
    last = a["metrics"][-1]["step"] if a["metrics"] else None
    return Finding("max steps", last == steps, f"asked for {steps} steps, the last reported is {last}",
                   "stop at {max_steps} (CAMPAIGN_MAX_STEPS, report.run_config()['max_steps'])")


def _startup(a: dict[str, Any], stdout: bool) -> Finding:
    doc = a["startup"] or {}
    got, expected = (doc.get("allreduce") or {}).get("got"), (doc.get("allreduce") or {}).get("expected")
    ranks = len(doc.get("ranks") or [])
    ok = ranks == NODES and got is not None and got == expected
    seen = (f"startup.json: {ranks}/{NODES} ranks, all-reduce {got} (expected {expected})" if doc
            else "no startup.json")
    return Finding("start-up check", ok, seen, "report.startup_check(ranks, allreduce_got, rank=rank) after an "
                   "all_gather_object of report.rank_identity(...) and an all_reduce of report.allreduce_input(rank)",
                   needed=not stdout)


def _heartbeats(a: dict[str, Any], stdout: bool) -> Finding:
    nodes = sorted(a["heartbeats"])
    ok = len(nodes) == NODES
    seen = f"heartbeats from {len(nodes)}/{NODES} nodes" + (f" ({', '.join(nodes)})" if nodes else "")
    return Finding("heartbeats", ok, seen, "rep = report.Reporter.from_env(...) on every rank; rep.phase('compute', "
                   "step) before forward, rep.phase('collective', step) before the all-reduce (names a hung node)",
                   needed=not stdout)


def _checkpoints(a: dict[str, Any], every: int, spec: CampaignSpec) -> Finding:
    done = [c["step"] for c in a["checkpoints"] if c["complete"]]
    ok = every in done
    where = "trainer.checkpoints.glob" if spec.trainer.checkpoints else "step-NNNNNNNN/ with .complete"
    seen = f"complete checkpoints at steps {done} ({where})" if done else f"no complete checkpoint ({where})"
    fix = ("save every {checkpoint_every} steps (CAMPAIGN_CHECKPOINT_EVERY) into {checkpoint_dir}: "
           "report.begin_checkpoint / complete_checkpoint, or name your own files with trainer.checkpoints")
    return Finding("checkpoints", ok, seen, fix)


def _resume(a: dict[str, Any], every: int) -> Finding:
    rows = a["metrics"]
    start = a.get("resume_from")
    first = rows[0]["step"] if rows else None
    expected = (start["step"] + 1) if start else None
    ok = expected is not None and first == expected and a["exit_code"] == 0
    seen = (f"resumed run's first step {first}; newest complete checkpoint: step {start['step']}" if start
            else "nothing to resume from")
    return Finding("resume", ok, seen, "with {resume} = 1 (CAMPAIGN_RESUME), continue from the newest complete "
                   "checkpoint (report.latest_complete_checkpoint(), or trainer.resume_args with {resume_path})")


def render(findings: list[Finding], workdir: Path | None = None) -> str:
    """One line per item (`ok`, `MISSING`, or `not seen` for what the stages can do without),
    each missing one followed by its fix."""
    out = []
    for f in findings:
        mark = "ok" if f.ok else "MISSING" if f.needed else "not seen"
        out.append(f"{mark:8} {f.item}: {f.seen}")
        if not f.ok:
            out.append(f"{'':8}   fix: {f.fix}" if f.needed else
                       f"{'':8}   optional with progress: stdout (the stages say they could not check it); {f.fix}")
    missing = [f.item for f in findings if f.needed and not f.ok]
    optional = [f.item for f in findings if not f.needed and not f.ok]
    out.append(f"{sum(f.ok for f in findings)}/{len(findings)} honoured" +
               (f"; missing: {', '.join(missing)}" if missing else "") +
               (f"; not seen (optional): {', '.join(optional)}" if optional else "") +
               (f"; run directories under {workdir}" if workdir else ""))
    return "\n".join(out)


def main(file: Path, *, steps: int) -> int:
    """The command: 0 when nothing needed is missing, 1 otherwise."""
    workdir = Path(tempfile.mkdtemp(prefix="campaign-check-"))
    findings = check(file, steps=steps, workdir=workdir)
    print(render(findings, workdir))
    return 0 if all(f.ok or not f.needed for f in findings) else 1
