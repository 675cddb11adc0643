"""`campaign submit --dry-run`: what each stage would launch, with nothing submitted and
nothing written (no ledger, no run directories)."""

from __future__ import annotations

from pathlib import Path

from campaign.spec import CampaignSpec


def render_dry_run(spec: CampaignSpec, workdir: Path) -> str:
    """Text for a human to check before spending an allocation."""
    from campaign.executors import launchers

    site = spec.site
    campaign_dir = workdir.resolve() / spec.name
    out = [f"# campaign {spec.name} on site {site.kind}: {len(spec.stages)} stage(s); dry run, nothing submitted",
           f"# run directories under {campaign_dir}"]
    for i, stage in enumerate(spec.stages, 1):
        n = stage.nodes or site.nodes
        hosts = tuple(site.node_names()[:n])
        run_dir = campaign_dir / stage.label / "attempt-001"
        command = spec.trainer.command or ["python", "-m", "campaign.train"]
        plan = launchers.LaunchPlan(hosts=hosts, ranks_per_node=site.ranks_per_node,
                                    argv=(*command, "--config", str(run_dir / "trainer.json")),
                                    env=(("CAMPAIGN_RUN_DIR", str(run_dir)),), hostfile=str(run_dir / "hostfile"))
        out.append(f"\n## stage {i}/{len(spec.stages)} {stage.label} ({stage.kind}): {n} node(s) x "
                   f"{site.ranks_per_node} rank(s), timeout {stage.timeout_s:g} s")
        out.append(launchers.render(site.launcher, plan))
    return "\n".join(out)
