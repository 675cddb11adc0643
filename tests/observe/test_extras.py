"""The observers' packages are extras: a campaign that asks for none imports none of them,
and one that asks for a missing one is refused in one line before anything runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def _run(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, timeout=120)


def test_without_observe_the_driver_imports_neither_tensorboard_nor_wandb(tmp_path: Path) -> None:
    code = f"""
import sys
from pathlib import Path
from campaign import observe, spec
s = spec.load({str(REPO / 'examples' / 'local.yaml')!r})
assert type(observe.for_campaign(s, Path('c'), Path('.'), warn=print)) is observe.Observer
import campaign.engine, campaign.stagecontext, campaign.commands
print(sorted(m for m in sys.modules if m.split('.')[0] in ('tensorboard', 'wandb')))
"""
    done = _run(code, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_a_spec_asking_for_a_missing_extra_is_refused_in_one_line(tmp_path: Path) -> None:
    spec = yaml.safe_load((REPO / "examples" / "local.yaml").read_text())
    spec["observe"] = {"tensorboard": "tb", "wandb": {"project": "p"}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(spec))
    # The stand-in for "not installed": the import system refuses both packages (sys.modules[...] = None).
    code = f"""
import sys
sys.modules['tensorboard'] = sys.modules['wandb'] = None
from campaign.cli import main
main(['submit', 'c.yaml', '--workdir', {str(tmp_path / 'wd')!r}])
"""
    done = _run(code, tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert "observe.tensorboard: needs the `tensorboard` package: pip install 'campaign[tensorboard]'" in done.stderr
    assert "observe.wandb: needs the `wandb` package: pip install 'campaign[wandb]'" in done.stderr
    assert not (tmp_path / "wd").exists(), "refused before the ledger was made"
