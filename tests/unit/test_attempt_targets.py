"""An attempt request carries its targets typed (`attempt.RunTargets`), and the ranks' CAMPAIGN_*
target variables are made from them in one place; a stage's overrides and the driver's changes
to a request are validated (`stagebase.validated_copy`), where pydantic's `model_copy(update=)`
would take any value."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from campaign.attempt import AttemptRequest, RunTargets, build_request, trainer_config
from campaign.spec import CampaignSpec
from campaign.stagebase import Targets, validated_copy

TARGET_VARIABLES = ("CAMPAIGN_MAX_STEPS", "CAMPAIGN_CHECKPOINT_DIR", "CAMPAIGN_CHECKPOINT_EVERY", "CAMPAIGN_RESUME",
                    "CAMPAIGN_SPEC_DIR", "CAMPAIGN_MAX_TOKENS", "CAMPAIGN_CHECKPOINT_AT", "CAMPAIGN_RESUME_FROM")


def _spec(trainer: dict[str, Any] | None = None) -> CampaignSpec:
    return CampaignSpec.model_validate({"name": "t", "site": {"kind": "local", "nodes": 2}, "trainer": trainer or {},
                                        "stages": [{"kind": "smoke"}]})


def _request(tmp_path: Path, targets: Targets, spec: CampaignSpec | None = None,
             resume_from: dict[str, Any] | None = None) -> AttemptRequest:
    spec = spec or _spec()
    config = trainer_config(spec, targets, stage_dir=tmp_path / "stage", attempt=3)
    return build_request(spec.site, config, run_dir=tmp_path / "stage" / "attempt-003", nodes=2, excluded=[],
                         timeout_s=60, master_port=None, spec_dir=tmp_path / "specs", resume_from=resume_from)


def test_the_request_carries_its_targets_typed_and_the_environment_is_made_from_them(tmp_path: Path) -> None:
    req = _request(tmp_path, Targets(steps=40, resume=True, max_tokens=9000, checkpoint_at=(7, 9),
                                     train={"checkpoint_every": 10}),
                   resume_from={"path": tmp_path / "stage" / "checkpoints" / "step-00000020", "step": 20})
    ckpt, specs = tmp_path / "stage" / "checkpoints", str(tmp_path / "specs")
    assert req.targets == RunTargets(max_step=40, max_tokens=9000, checkpoint_dir=str(ckpt), checkpoint_every=10,
                                     checkpoint_at=[7, 9], resume=True, resume_from=str(ckpt / "step-00000020"),
                                     spec_dir=specs)
    made = {k: v for k, v in req.env.items() if k in TARGET_VARIABLES}
    assert made == req.targets.environment()
    assert made == {"CAMPAIGN_MAX_STEPS": "40", "CAMPAIGN_CHECKPOINT_DIR": str(ckpt), "CAMPAIGN_CHECKPOINT_EVERY": "10",
                    "CAMPAIGN_RESUME": "1", "CAMPAIGN_SPEC_DIR": specs, "CAMPAIGN_MAX_TOKENS": "9000",
                    "CAMPAIGN_CHECKPOINT_AT": "7,9", "CAMPAIGN_RESUME_FROM": str(ckpt / "step-00000020")}


def test_a_trainer_counting_from_0_is_told_its_own_last_step(tmp_path: Path) -> None:
    spec = _spec({"command": ["python", "t.py", "{max_steps}"], "first_step": 0})
    req = _request(tmp_path, Targets(steps=40), spec)
    assert req.targets is not None
    assert (req.targets.max_step, req.targets.trainers_max_step) == (40, 39)
    assert req.env["CAMPAIGN_MAX_STEPS"] == "39" and req.argv[-1] == "39"


def test_a_drill_keeps_the_targets_and_moves_only_where_it_writes(tmp_path: Path) -> None:
    req = _request(tmp_path, Targets(steps=5))
    drill = req.for_drill(tmp_path / "drill", 4242)
    assert drill.targets == req.targets
    changed = {k for k in req.env.keys() | drill.env.keys() if req.env.get(k) != drill.env.get(k)}
    assert changed == {"CAMPAIGN_RUN_DIR", "CAMPAIGN_HOSTFILE"}
    assert drill.env["CAMPAIGN_HOSTFILE"] == str(tmp_path / "drill" / "hostfile")


@pytest.mark.parametrize(("override", "said"), [
    ({"checkpoint_every": -1}, "TrainConfig.checkpoint_every: Input should be greater than or equal to 0 (got -1)"),
    ({"checkpoint_every": "often"}, "TrainConfig.checkpoint_every: Input should be a valid integer"),
    ({"checkpoint_evry": 5}, "TrainConfig.checkpoint_evry: Extra inputs are not permitted (got 5)"),
])
def test_a_bad_stage_override_is_refused_naming_the_field(tmp_path: Path, override: dict[str, Any], said: str) -> None:
    with pytest.raises(ValueError) as e:
        trainer_config(_spec(), Targets(steps=3, train=override), stage_dir=tmp_path, attempt=1)
    assert str(e.value).startswith(said) and "\n" not in str(e.value)


def test_a_bad_change_to_a_request_is_refused_naming_the_field(tmp_path: Path) -> None:
    req = _request(tmp_path, Targets(steps=5))
    with pytest.raises(ValueError, match=r"^AttemptRequest\.rotate: Input should be greater than or equal to 0"):
        validated_copy(req, rotate=-1)
    with pytest.raises(ValueError, match=r"^AttemptRequest\.measured_step_s\.0: Input should be a valid number"):
        validated_copy(req, measured_step_s=["slow"])
    assert validated_copy(req, rotate=1).rotate == 1


def test_a_validated_copy_keeps_which_fields_were_set() -> None:
    """As `model_copy` does: a field left at its default stays unset (`contract.stdout_tokens_per_step`
    asks whether `micro_batch_size` was given), the replaced ones count as set."""
    trainer = _spec().trainer
    copy = validated_copy(trainer, checkpoint_every=5)
    assert copy.model_fields_set == trainer.model_fields_set | {"checkpoint_every"}
    assert "micro_batch_size" not in copy.model_fields_set
    assert copy == trainer.model_copy(update={"checkpoint_every": 5})
