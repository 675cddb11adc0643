"""The campaign file: pydantic models, loading, and errors that name file, line and field.

    spec = load("examples/local.yaml")      # CampaignSpec, or SpecError listing every problem

A campaign file holds `name`, `site`, `model`, `data`, `trainer` and an ordered list of
`stages`; the stage and site kinds are discriminated unions over the modules in
`stages/` and `executors/`. Unknown keys are errors everywhere.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Annotated, Any, Union

from pydantic import Field, ValidationError, model_validator

from campaign import yamlfile
from campaign.errors import SpecError
from campaign.executors.local import LocalSite
from campaign.stagebase import StageSpec, StrictModel
from campaign.stages.smoke import SmokeStage
from campaign.train.config import DataConfig, ModelConfig, TrainConfig

Site = Annotated[Union[LocalSite], Field(discriminator="kind")]
Stage = Annotated[Union[SmokeStage], Field(discriminator="kind")]


class CampaignSpec(StrictModel):
    """One campaign: what to train, where, and the stages that must pass, in order."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    """Campaign name (letters, digits, `.`, `_`, `-`); its identity in the ledger."""
    description: str = ""
    """One line on what this campaign is for."""
    site: Site = LocalSite()
    """Where the stages run (`kind: local | ...`) and the site's options."""
    model: ModelConfig = ModelConfig()
    """The model to train."""
    data: DataConfig = DataConfig()
    """The training data."""
    trainer: TrainConfig = TrainConfig()
    """How to train (parallelism, batch, optimizer, checkpoints) or your own trainer command."""
    stages: list[Stage] = Field(min_length=1)
    """Stages, run in this order; a failed stage stops the campaign unless it says otherwise."""

    @model_validator(mode="after")
    def _unique_stage_names(self) -> CampaignSpec:
        seen: dict[str, int] = {}
        for i, stage in enumerate(self.stages):
            if stage.label in seen:
                raise ValueError(f"stages[{i}]: stage name {stage.label!r} is already used by stages[{seen[stage.label]}]")
            seen[stage.label] = i
        for i, stage in enumerate(self.stages):
            if stage.nodes is not None and stage.nodes > self.site.nodes:
                raise ValueError(f"stages[{i}].nodes: {stage.nodes} nodes asked, but the site has {self.site.nodes}")
        return self

    def stage(self, name: str) -> StageSpec:
        for s in self.stages:
            if s.label == name:
                return s
        raise KeyError(name)

    def canonical_json(self) -> str:
        """The resolved spec as canonical JSON: equal specs give equal text."""
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))

    def digest(self) -> str:
        """SHA-256 of the resolved spec; same name + same digest = the same campaign."""
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()


def load(path: str | Path) -> CampaignSpec:
    """Load and validate a campaign file; raise SpecError naming file, line and field."""
    data, lines = yamlfile.load(path)
    return parse(data, str(path), lines)


def parse(data: Any, source: str = "<spec>", lines: yamlfile.Lines | None = None) -> CampaignSpec:
    """Validate already-parsed data (e.g. from a remote call) into a CampaignSpec."""
    try:
        return CampaignSpec.model_validate(data)
    except ValidationError as e:
        raise SpecError(source, [_problem(err, source, lines or {}) for err in e.errors()]) from None


def _problem(err: Any, source: str, lines: yamlfile.Lines) -> str:
    loc = _data_path(err["loc"])
    msg = err["msg"].removeprefix("Value error, ")
    if msg.startswith("stages[") and ":" in msg:  # a model validator that names its own field
        field, _, msg = msg.partition(": ")
        loc = _parse_dotted(field)
    elif err["type"] == "extra_forbidden":
        msg = "unknown key (check the spelling; `campaign validate --help` lists the fields)"
    elif err["type"] == "missing":
        msg = "required field is missing"
    line = _line(loc, lines)
    where = f"{Path(source).name}, line {line}" if line else Path(source).name
    return f"{yamlfile.dotted(loc) or '(top level)'}: {msg} ({where})"


def _data_path(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """Drop the discriminator tags pydantic inserts (`stages.2.smoke.nodes`)."""
    out: list[Any] = []
    for part in loc:
        if isinstance(part, str) and out and isinstance(out[-1], int) and part in _TAGS:
            continue
        if out == ["site"] and part in _SITE_TAGS:
            continue
        out.append(part)
    return tuple(out)


def _parse_dotted(text: str) -> tuple[Any, ...]:
    out: list[Any] = []
    for chunk in text.replace("]", "").replace("[", ".").split("."):
        if chunk:
            out.append(int(chunk) if chunk.isdigit() else chunk)
    return tuple(out)


def _line(loc: tuple[Any, ...], lines: yamlfile.Lines) -> int | None:
    for n in range(len(loc), -1, -1):
        if loc[:n] in lines:
            return lines[loc[:n]]
    return None


_TAGS = {"smoke"}
_SITE_TAGS = {"local"}
