"""End-to-end helpers: write a campaign file, run the real `campaign` CLI in a subprocess
(Parsl HTEX, the local site's virtual nodes, multi-process gloo training), read the ledger."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Run:
    code: int
    out: str
    err: str


class Workspace:
    """A temporary work directory with its own SQLite ledger."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.workdir = root / "campaigns"

    def write_spec(self, spec: dict[str, Any], name: str = "campaign.yaml") -> Path:
        path = self.root / name
        path.write_text(yaml.safe_dump(spec, sort_keys=False))
        return path

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CAMPAIGN_")}
        env.update(CAMPAIGN_WORKDIR=str(self.workdir), PYTHONUNBUFFERED="1", **extra)
        return env

    def cli(self, *args: str, timeout: float = 600, **env: str) -> Run:
        p = subprocess.run([sys.executable, "-m", "campaign.cli", *args], cwd=self.root, env=self.env(**env),
                           capture_output=True, text=True, timeout=timeout)
        return Run(p.returncode, p.stdout, p.stderr)

    def popen(self, *args: str, **env: str) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-m", "campaign.cli", *args], cwd=self.root, env=self.env(**env),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)

    def status(self, name: str) -> dict[str, Any]:
        r = self.cli("status", name, "--json")
        assert r.code == 0, r.err
        return json.loads(r.out)

    def ledger(self) -> Any:
        from campaign.ledger import open_ledger

        return open_ledger(f"sqlite:///{self.workdir / 'ledger.db'}", create=False)


def tiny_spec(name: str, stages: list[dict[str, Any]], *, nodes: int = 3, **site: Any) -> dict[str, Any]:
    """A campaign on the local site: `nodes` virtual nodes x 1 rank, the tiny model."""
    return {
        "name": name,
        "site": {"kind": "local", "nodes": nodes, "ranks_per_node": 1, **site},
        "model": {"size": "tiny"},
        "trainer": {"micro_batch_size": 2, "warmup_steps": 2},
        "stages": stages,
    }


def ledger_view(ws: Workspace, name: str) -> dict[str, Any]:
    """Attempts, exclusions and events of the campaign, read from the ledger."""
    from campaign.ledger import reads

    ledger = ws.ledger()
    try:
        with ledger.session() as s:
            c = reads.get_campaign(s, name)
            assert c is not None
            run = reads.current_stage_runs(s, c)[0]
            attempts = [{"state": a.state, "exit_code": a.exit_code, "nodes": a.nodes, "first_step": a.first_step,
                         "last_step": a.last_step, "suspects": a.suspects, "summary": a.summary, "run_dir": a.run_dir,
                         "steps": [(m.step, m.tokens) for m in reads.list_steps(s, a.id)]} for a in run.attempts]
            exclusions = [{"node": e.node, "reason": e.reason, "evidence": e.evidence, "expires": e.expires}
                          for e in reads.list_exclusions(s, "local")]
            events = [(e.kind, e.message) for e in reads.list_events(s, c)]
            return {"attempts": attempts, "exclusions": exclusions, "events": events, "stage": run.state,
                    "verdict": run.verdict, "tokens": run.tokens}
    finally:
        ledger.close()
