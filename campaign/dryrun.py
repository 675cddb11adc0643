"""`campaign submit --dry-run`: what each stage would launch, with nothing submitted and
nothing written (no ledger, no run directories, no submit scripts).

For a batch site it prints the block's batch script as the site's Parsl provider renders
it (its own template, launcher and job config, through its `submit()` with the scheduler
calls captured) and the `qsub`/`sbatch` line; for every stage, the exact launch command
(`launchers.render`). Node names exist only inside the job: placeholders stand in.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from campaign import rundir, stages
from campaign.attempt import AttemptRequest, build_request, trainer_config, version_root
from campaign.spec import CampaignSpec
from campaign.stagebase import StageSpec


def render_dry_run(spec: CampaignSpec, workdir: Path, spec_dir: Path | None = None, version: int = 1) -> str:
    """Text for a human to check before spending an allocation. `version`: the campaign
    version the submission would run as (`commands.planned_version`)."""
    site = spec.site
    campaign_dir = workdir.resolve() / spec.name
    root = version_root(campaign_dir, version)
    out = [f"# campaign {spec.name} on site {site.kind}: {len(spec.stages)} stage(s); dry run, nothing submitted",
           f"# run directories under {root}" + (f" (version {version})" if version > 1 else "")]
    block = site.dry_run(campaign_dir / "parsl" / "000" / "submit_scripts")
    if block is not None:
        script, commands = block
        wall = int(site.block_walltime_s() or 0)
        out.append(f"\n## block: {site.nodes} active + {site.block_nodes - site.nodes} spare node(s), walltime "
                   f"{wall // 3600:02d}:{wall % 3600 // 60:02d}:{wall % 60:02d}; one block serves every stage "
                   "(a new one starts if it ends first)")
        out += [f"$ {c}" for c in commands]
        out.append(script.rstrip())
    for i, stage in enumerate(spec.stages, 1):
        counts = stage.attempt_nodes(site.nodes)
        out.append(f"\n## stage {i}/{len(spec.stages)} {stage.resolved_name} ({stage.kind}): "
                   f"{'/'.join(map(str, counts))} node(s) x {site.ranks_per_node} rank(s), timeout {stage.timeout_s:g} s")
        for number, n in enumerate(counts, 1):
            out.append(launch_text(spec, stage, n, root / stage.resolved_name, number, spec_dir))
    return "\n".join(out)


def launch_text(spec: CampaignSpec, stage: StageSpec, n: int, stage_dir: Path, attempt: int = 1,
                spec_dir: Path | None = None) -> str:
    """The launch command of one attempt on `n` nodes: the supervisor's own launch plan
    (`AttemptRequest.launch_plan`), rendered; `python` stands for the worker's interpreter
    and the rendezvous port is the launcher's default (the supervisor picks a free one)."""
    from campaign.executors import launchers

    request = _request(spec, stage, n, stage_dir, attempt, spec_dir)
    return launchers.render(spec.site.launcher, request.launch_plan(spec.site.example_nodes(n)[:n], python="python"))


def _request(spec: CampaignSpec, stage: StageSpec, n: int, stage_dir: Path, attempt: int,
             spec_dir: Path | None) -> AttemptRequest:
    """The request of the stage's attempt `attempt` at `n` nodes, with the targets its stage
    module gives the attempt (`first_targets`), as the engine builds it."""
    from campaign.executors import launchers

    targets = stages.module(stage.kind).first_targets(stage, spec, n)
    config = trainer_config(spec, targets, stage_dir=stage_dir, attempt=attempt,
                            faults=stage.injected_faults(), spec_dir=(spec_dir or Path.cwd()).resolve())
    return build_request(spec.site, config, run_dir=rundir.attempt_dir(stage_dir, attempt), nodes=n, excluded=[],
                         timeout_s=stage.timeout_s, master_port=launchers.DEFAULT_MASTER_PORT,
                         spec_dir=(spec_dir or Path.cwd()).resolve())


def dry_run_document(spec: CampaignSpec, workdir: Path, spec_dir: Path | None = None,
                     version: int = 1) -> dict[str, Any]:
    """`campaign submit FILE --dry-run --json`: the same facts as the text, as data. Each
    stage's `launch.placement` lists, for the first node, every local rank's CPUs, visible
    devices, device, rank and the world size it computes from the variables its launcher
    gives it, by the function the trainer itself runs at start-up (`campaign.train.placement`)."""
    from campaign.executors import launchers
    from campaign.train.placement import PlacementError, launch_placement

    site = spec.site
    campaign_dir = workdir.resolve() / spec.name
    root = version_root(campaign_dir, version)
    block = site.dry_run(campaign_dir / "parsl" / "000" / "submit_scripts")
    device_type, per_node = site.devices()
    stages = []
    for stage in spec.stages:
        counts = stage.attempt_nodes(site.nodes)
        attempts = []
        for number, n in enumerate(counts, 1):
            run_dir = rundir.attempt_dir(root / stage.resolved_name, number)
            request = _request(spec, stage, n, root / stage.resolved_name, number, spec_dir)
            plan = request.launch_plan(site.example_nodes(n)[:n], python="python")
            attempts.append({"nodes": n, "run_dir": str(run_dir), "command": launchers.render(site.launcher, plan),
                             "env": dict(plan.env)})
        try:
            placement: list[dict[str, Any]] | dict[str, str] = launch_placement(
                _request(spec, stage, counts[0], root / stage.resolved_name, 1, spec_dir), site.ranks_per_node, device_type,
                per_node, rank_env=site.rank_variables, nodes=counts[0])
        except PlacementError as e:
            placement = {"error": str(e)}
        stages.append({"name": stage.resolved_name, "kind": stage.kind, "node_counts": counts, "timeout_s": stage.timeout_s,
                       "launch": {"launcher": site.launcher, "ranks_per_node": site.ranks_per_node,
                                  "device_type": device_type, "placement": placement, "attempts": attempts}})
    return {"campaign": spec.name, "site": site.kind, "version": version, "run_root": str(root),
            "block": None if block is None else {"nodes": site.block_nodes, "active": site.nodes,
                                                 "walltime_s": site.block_walltime_s(), "submit": block[1],
                                                 "script": block[0]},
            "stages": stages}
