"""Adding a stage kind touches its own module and nothing else.

A stage kind is one module in `stages/` (its spec class, `first_targets`, `run`, `judge`);
what the rest of the project asks of a stage is a `StageSpec` method
(`campaign.stagebase`). The first test adds a kind the project has never seen, as one module
in a folder of its own, and runs the spec, the dry run, the walltime check, the custom-trainer
warnings and the checkpoint-interval check on it: nothing else was edited. The second keeps
the modules that handle stage specs from telling kinds apart by name or by their fields.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

PROBE = '''
"""A stage kind for the test: two attempts, at 1 and 2 nodes, a token target."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from campaign.stagebase import StageSpec, Targets, Verdict


class ProbeStage(StageSpec):
    kind: Literal["probe"] = "probe"
    steps: int = Field(default=3, ge=1)
    tokens: int = 1000

    def attempt_nodes(self, site_nodes: int) -> list[int]:
        return [1, 2]

    def attempts_bound(self) -> int:
        return 2

    def token_target(self) -> int | None:
        return self.tokens


def first_targets(stage: ProbeStage, spec: Any, nodes: int) -> Targets:
    return Targets(steps=stage.steps)


def run(ctx: Any, stage: ProbeStage) -> Verdict:
    for n in stage.attempt_nodes(ctx.spec.site.nodes):
        outcome = ctx.launch(first_targets(stage, ctx.spec, n), nodes=n, timeout_s=stage.timeout_s,
                             label=f"{n} node(s)")
        if outcome.exit_code != 0:
            return Verdict(False, f"probe at {n} node(s): exit {outcome.exit_code}")
    return judge()


def judge() -> Verdict:
    return Verdict(True, "probe")
'''

SPEC = """
name: probe-campaign
site: {kind: slurm, nodes: 2, walltime: "00:10:00", account: a, partition: p}
trainer: {command: ["{python}", "my_train.py"], progress: stdout, step_pattern: 'step (?P<step>\\d+) loss (?P<loss>\\S+)'}
stages:
  - {kind: smoke}
  - {kind: probe, timeout_s: 400}
"""

RUN = """
import importlib.util, json, sys, pathlib
import campaign
# campaign.stages finds its kinds when imported: give it the probe's folder as well
spec = importlib.util.find_spec("campaign.stages")
spec.submodule_search_locations.append(sys.argv[1])
stages = importlib.util.module_from_spec(spec)
sys.modules["campaign.stages"] = stages
campaign.stages = stages
spec.loader.exec_module(stages)

from campaign import contract, dryrun, goodput, walltime
from campaign import spec as specs


s = specs.load(sys.argv[2])
probe = s.stages[1]
goodput.check_auto(lambda: None, s, sys.argv[2])
specs.check_faults_allowed(s, sys.argv[2])
doc = dryrun.dry_run_document(s, pathlib.Path(sys.argv[3]))
print(json.dumps({
    "kinds": list(stages.KINDS),
    "kind": probe.kind,
    "dry_run_text": dryrun.render_dry_run(s, pathlib.Path(sys.argv[3])),
    "doc_counts": [st["node_counts"] for st in doc["stages"]],
    "estimate": walltime.estimate(probe, None).total_s,
    "custom": contract.custom_trainer_warnings(s),
}))
"""


def test_a_new_stage_kind_needs_only_its_own_module(tmp_path: Path) -> None:
    kinds = tmp_path / "kinds"
    kinds.mkdir()
    (kinds / "probe.py").write_text(PROBE)
    spec = tmp_path / "probe.yaml"
    spec.write_text(SPEC)
    proc = subprocess.run([sys.executable, "-c", RUN, str(kinds), str(spec), str(tmp_path / "work")],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.splitlines()[-1])
    assert got["kinds"][-1] == "probe" and got["kind"] == "probe"
    assert "## stage 2/2 probe (probe): 1/2 node(s)" in got["dry_run_text"]
    assert got["doc_counts"] == [[2], [1, 2]]
    assert got["estimate"] == 800.0  # timeout_s x attempts_bound()
    assert any(w.startswith("stages[1].tokens: a token target") for w in got["custom"])


STAGE_SPEC_USERS = ("campaign/dryrun.py", "campaign/walltime.py", "campaign/spec.py", "campaign/contract.py",
                    "campaign/goodput.py", "campaign/engine.py", "campaign/stagecontext.py")
"""Modules that are handed stage specs (or stage runs) and ask them what they need."""


def test_stage_spec_users_neither_name_kinds_nor_reach_for_their_fields() -> None:
    from campaign import stages

    found = []
    for rel in STAGE_SPEC_USERS:
        tree = ast.parse((REPO / rel).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare):
                for part in (node.left, *node.comparators):
                    if isinstance(part, ast.Constant) and part.value in stages.KINDS:
                        found.append(f"{rel}:{node.lineno}: compares with the kind {part.value!r}")
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("campaign.stages."):
                found.append(f"{rel}:{node.lineno}: imports {node.module}")
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
                    and isinstance(node.args[0], ast.Name) and node.args[0].id in ("stage", "st")):
                found.append(f"{rel}:{node.lineno}: getattr({node.args[0].id}, ...)")
    assert found == [], textwrap.indent("\n".join(found), "  ")
