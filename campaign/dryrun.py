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

from campaign.spec import CampaignSpec
from campaign.stagebase import StageSpec


def render_dry_run(spec: CampaignSpec, workdir: Path) -> str:
    """Text for a human to check before spending an allocation."""
    from campaign import executors

    site = spec.site
    campaign_dir = workdir.resolve() / spec.name
    out = [f"# campaign {spec.name} on site {site.kind}: {len(spec.stages)} stage(s); dry run, nothing submitted",
           f"# run directories under {campaign_dir}"]
    dry_run = getattr(executors.module(site.kind), "dry_run", None)
    if dry_run is not None:
        script, commands = dry_run(site, campaign_dir / "parsl" / "000" / "submit_scripts")
        out.append(f"\n## block: {site.nodes} active + {site.spares} spare node(s), walltime {site.walltime}; "
                   "one block serves every stage (a new one starts if it ends first)")
        out += [f"$ {c}" for c in commands]
        out.append(script.rstrip())
    for i, stage in enumerate(spec.stages, 1):
        counts = getattr(stage, "node_counts", None) or [stage.nodes or site.nodes]
        out.append(f"\n## stage {i}/{len(spec.stages)} {stage.label} ({stage.kind}): "
                   f"{'/'.join(map(str, counts))} node(s) x {site.ranks_per_node} rank(s), timeout {stage.timeout_s:g} s")
        for number, n in enumerate(counts, 1):
            out.append(launch_text(spec, stage, n, campaign_dir / stage.label / f"attempt-{number:03d}"))
    return "\n".join(out)


def launch_text(spec: CampaignSpec, stage: StageSpec, n: int, run_dir: Path) -> str:
    """The launch command of one attempt on `n` nodes, as the supervisor would build it."""
    from campaign.executors import launchers

    site = spec.site
    names = site.node_names()
    hosts = tuple(names[:n]) if names else tuple(site.example_nodes(n))
    options: dict[str, Any] = dict(site.launch_options())
    env = {"CAMPAIGN_RUN_DIR": str(run_dir), "CAMPAIGN_HOSTFILE": str(run_dir / "hostfile"),
           **options.pop("env", {})}
    command = [("python" if a == "{python}" else a) for a in (spec.trainer.command or ["python", "-m", "campaign.train"])]
    plan = launchers.LaunchPlan(
        hosts=hosts, ranks_per_node=site.ranks_per_node, argv=(*command, "--config", str(run_dir / "trainer.json")),
        env=env, hostfile=str(run_dir / "hostfile"),
        master_port=None if site.launcher == "local" else launchers.DEFAULT_MASTER_PORT,
        cpu_bind=options.get("cpu_bind"), gpu_bind=options.get("gpu_bind"), depth=options.get("depth"),
        wrapper=tuple(options.get("wrapper") or ()),
    )
    return launchers.render(site.launcher, plan)
