"""The Aurora endpoint template (executors/aurora_endpoint_template.yaml.j2), rendered
offline by the endpoint's own `globus-compute-endpoint render-user-config` (in a
temporary HOME, with the schema, user options sanitized as the endpoint does), then
read back by the endpoint's own config loader."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = REPO / "executors" / "aurora_endpoint_template.yaml.j2"
SCHEMA = REPO / "executors" / "aurora_endpoint_schema.json"
ENDPOINT_CLI = Path(sys.executable).parent / "globus-compute-endpoint"


def render(tmp_path: Path, options: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    opts = tmp_path / "options.json"
    opts.write_text(json.dumps(options))
    env = {**os.environ, "HOME": str(tmp_path), "GLOBUS_COMPUTE_USER_DIR": str(tmp_path / ".globus_compute")}
    return subprocess.run([str(ENDPOINT_CLI), "render-user-config", "-t", str(TEMPLATE), "-s", str(SCHEMA),
                           "-o", str(opts)], capture_output=True, text=True, env=env, cwd=tmp_path, check=False,
                          stdin=subprocess.DEVNULL, timeout=60)


def rendered(tmp_path: Path, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    p = render(tmp_path, options)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout, yaml.safe_load(p.stdout)


def test_default_is_a_login_node_endpoint_with_a_local_provider(tmp_path: Path) -> None:
    _, cfg = rendered(tmp_path, {})
    engine = cfg["engine"]
    assert engine["type"] == "GlobusComputeEngine"
    assert engine["provider"]["type"] == "LocalProvider"
    assert engine["address"] == "127.0.0.1" and engine["max_workers_per_node"] == 4
    assert engine["provider"]["worker_init"].splitlines() == ["module load frameworks",
                                                              "source $HOME/venvs/campaign/bin/activate"]


@pytest.mark.parametrize("walltime", [None, "01:30:00"])
def test_pbs_walltime_stays_a_quoted_string(tmp_path: Path, walltime: str | None) -> None:
    options = {"provider": "pbs", "account": "MyProj", "nodes": 2, **({"walltime": walltime} if walltime else {})}
    text, cfg = rendered(tmp_path, options)
    provider = cfg["engine"]["provider"]
    assert provider["type"] == "PBSProProvider" and provider["account"] == "MyProj"
    assert provider["walltime"] == (walltime or "01:00:00"), "unquoted, YAML would read H:MM:SS as seconds"
    assert f'walltime: "{walltime or "01:00:00"}"' in text
    assert provider["nodes_per_block"] == 2 and "filesystems=home:flare" in provider["scheduler_options"]


@pytest.mark.parametrize(("options", "why"), [({"worker_init": "rm -rf ~"}, "Additional properties"),
                                              ({"provider": "pbs"}, "'account' is a required property"),
                                              ({"provider": "pbs", "account": "P", "walltime": "1h"}, "does not match")])
def test_options_outside_the_schema_are_refused(tmp_path: Path, options: dict[str, Any], why: str) -> None:
    p = render(tmp_path, options)
    assert p.returncode != 0 and why in p.stdout + p.stderr


def test_the_endpoint_loads_what_the_template_renders(tmp_path: Path) -> None:
    local, _ = rendered(tmp_path, {})
    pbs, _ = rendered(tmp_path, {"provider": "pbs", "account": "MyProj", "walltime": "02:00:00"})
    code = """
import json, sys
from globus_compute_endpoint.endpoint.config.utils import load_config_yaml
out = []
for text in json.load(sys.stdin):
    engine = load_config_yaml(text).engine
    p = engine.executor.provider
    out.append([type(engine).__name__, type(p).__name__, getattr(p, "walltime", None)])
    engine.shutdown()
print(json.dumps(out))
"""
    p = subprocess.run([sys.executable, "-c", code], input=json.dumps([local, pbs]), capture_output=True, text=True,
                       env={**os.environ, "HOME": str(tmp_path)}, timeout=120, check=False)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout.splitlines()[-1]) == [["GlobusComputeEngine", "LocalProvider", None],
                                                     ["GlobusComputeEngine", "PBSProProvider", "02:00:00"]]
