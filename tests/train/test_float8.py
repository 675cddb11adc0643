"""Issue 44 item 2: `precision: float8` (torchao's float8 training, rowwise scaling). On CPU
(this machine) the trainer refuses it with a clear line and exit 93; the conversion itself
runs only on an NVIDIA GPU of compute capability 8.9+ with torchao (the last test)."""

from __future__ import annotations

import pytest
import torch

from campaign import report
from campaign.train import flops, float8
from campaign.train.config import TrainConfig
from train_helpers import tiny_config


def test_the_config_accepts_float8_and_names_the_choices_on_a_typo() -> None:
    assert TrainConfig(precision="float8").precision == "float8"
    with pytest.raises(ValueError, match="precision") as e:
        TrainConfig(precision="fp8")
    assert "float8" in str(e.value)


def test_float8_on_cpu_is_refused_before_any_step_with_exit_93(launch, tmp_path) -> None:
    run = launch(tiny_config(tmp_path / "ck", train={"precision": "float8", "device": "cpu"},
                             run={"max_steps": 3}), world=1)
    assert run.wait() == [report.EXIT_BAD_CONFIG], run.logs()
    assert "precision: float8 needs an NVIDIA GPU of compute capability 8.9 or newer" in run.logs()
    assert "this rank's device is cpu: use precision: bf16" in run.logs()
    assert run.metrics() == []


def test_only_the_blocks_linear_layers_are_eligible_not_the_head() -> None:
    head = torch.nn.Linear(64, 50304, bias=False)
    assert not float8._eligible(head, "head")
    assert float8._eligible(torch.nn.Linear(64, 192), "blocks.0.attn.qkv")
    assert not float8._eligible(torch.nn.Linear(60, 192), "blocks.0.attn.qkv")  # not a multiple of 16
    assert not float8._eligible(torch.nn.LayerNorm(64), "blocks.0.norm")


def test_mfu_against_the_float8_peak_is_half_the_bf16_figure_on_hopper() -> None:
    assert flops.mfu(1e9, 1e5, "NVIDIA H100 80GB HBM3") == pytest.approx(1e14 / 989e12)
    assert flops.mfu(1e9, 1e5, "NVIDIA H100 80GB HBM3", float8=True) == pytest.approx(1e14 / 1979e12)
    assert flops.mfu(1e9, 1e5, "NVIDIA A100-SXM4-80GB", float8=True) is None  # no float8 matmuls there


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
                    reason="needs an NVIDIA GPU of compute capability 8.9+ (run on the H100/H200)")
def test_float8_converts_the_blocks_and_trains_on_hopper() -> None:
    pytest.importorskip("torchao")
    from campaign.train.model import GPT, shape_for
    from campaign.train.config import ModelConfig

    dev = torch.device("cuda")
    assert float8.unsupported(dev) is None
    with torch.device(dev):
        model = GPT(shape_for(ModelConfig(size="tiny", d_model=256, n_layer=2, n_head=4, seq_len=128)))
    assert float8.convert(model) == 2 * 4  # qkv, proj, up, proj per block
    x = torch.randint(0, 256, (4, 128), device=dev)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(x, x)
    loss.backward()
    assert torch.isfinite(loss)


def test_a_campaign_asking_float8_on_cpu_fails_its_smoke_test_quoting_the_refusal(tmp_path) -> None:
    """What a user sees: the smoke verdict quotes the trainer's one line (not only "never reported")."""
    import subprocess
    import sys

    import yaml

    spec = {"name": "f8", "site": {"kind": "local", "nodes": 1},
            "trainer": {"precision": "float8"}, "stages": [{"name": "smoke", "kind": "smoke", "timeout_s": 120}]}
    (tmp_path / "f8.yaml").write_text(yaml.safe_dump(spec))
    run = subprocess.run([sys.executable, "-m", "campaign.cli", "submit", "f8.yaml", "--workdir", "wd"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 1, run.stdout + run.stderr
    status = subprocess.run([sys.executable, "-m", "campaign.cli", "status", "f8", "--json", "--workdir", "wd"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=60)
    import json

    verdict = json.loads(status.stdout)["stages"][0]["verdict"]
    assert "precision: float8 needs an NVIDIA GPU of compute capability 8.9 or newer" in verdict, verdict
