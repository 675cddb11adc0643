"""The campaign file: pydantic models, loading, and errors that name file, line and field.

    spec = load("examples/local.yaml")      # CampaignSpec, or SpecError listing every problem

A campaign file holds `name`, `site`, `model`, `data`, `trainer` and an ordered list of
`stages`; the stage and site kinds are discriminated unions over the modules in
`stages/` and `executors/`. Unknown keys are errors everywhere.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
import types
import typing
from pathlib import Path
from typing import Annotated, Any, Union

from pydantic import BaseModel, Field, ValidationError, model_validator

from campaign import executors as site_kinds
from campaign import stages as stage_kinds
from campaign import names, yamlfile
from campaign.errors import SpecError
from campaign.executors.aurora import AuroraSite
from campaign.executors.local import LocalSite
from campaign.executors.polaris import PolarisSite
from campaign.executors.slurm import SlurmSite
from campaign.observe.config import NotifyConfig, ObserveConfig
from campaign.stagebase import StageSpec, StrictModel
from campaign.train.config import DataConfig, ModelConfig, TrainConfig

FD_PMI_LAUNCHERS = ("mpich",)
"""Launchers that pass PMI to each rank by an inherited file descriptor (PMI_FD): no warm start."""

Site = Annotated[Union[LocalSite, AuroraSite, PolarisSite, SlurmSite], Field(discriminator="kind")]
Stage = Annotated[Union[tuple(stage_kinds.spec_class(kind) for kind in stage_kinds.KINDS)],  # type: ignore[misc]
                  Field(discriminator="kind")]
"""Any stage kind's spec class (each stage module defines one), told apart by `kind`."""


class CampaignSpec(StrictModel):
    """One campaign: what to train, where, and the stages that must pass, in order."""

    name: str = Field(pattern=names.PATTERN)
    """Campaign name (letters, digits, `.`, `_`, `-`); its identity in the ledger."""
    description: str = ""
    """One line on what this campaign is for."""
    site: Site = LocalSite()
    """Where the stages run (`kind: local | aurora | polaris | slurm`) and the site's options."""
    model: ModelConfig = ModelConfig()
    """The model to train."""
    data: DataConfig = DataConfig()
    """The training data."""
    trainer: TrainConfig = TrainConfig()
    """How to train (parallelism, batch, optimizer, checkpoints) or your own trainer command."""
    stages: list[Stage] = Field(min_length=1)
    """Stages, run in this order; a failed stage stops the campaign unless it says otherwise."""
    observe: ObserveConfig | None = None
    """TensorBoard and W&B, written by the driver as it ingests steps (docs/observe.md)."""
    notify: NotifyConfig | None = None
    """A command and/or a webhook told of stage results, relaunches, exclusions and the end (docs/observe.md)."""

    @model_validator(mode="after")
    def _unique_stage_names(self) -> CampaignSpec:
        seen: dict[str, int] = {}
        for i, stage in enumerate(self.stages):
            if stage.resolved_name in seen:
                raise ValueError(f"stages[{i}]: stage name {stage.resolved_name!r} is already used by stages[{seen[stage.resolved_name]}]")
            seen[stage.resolved_name] = i
        for i, stage in enumerate(self.stages):
            if stage.nodes is not None and stage.nodes > self.site.nodes:
                raise ValueError(f"stages[{i}].nodes: {stage.nodes} nodes asked, but the site has {self.site.nodes}")
            try:
                stage.check_in(self)
            except ValueError as e:  # "field: problem", or ": problem" of the stage as a whole
                raise ValueError(f"stages[{i}]{'' if str(e).startswith(':') else '.'}{e}") from None
        return self

    @model_validator(mode="after")
    def _warm_start_fits_the_launcher(self) -> CampaignSpec:
        if self.trainer.warm_start is True and self.site.launcher in FD_PMI_LAUNCHERS:
            raise ValueError(f"trainer.warm_start: the {self.site.launcher!r} launcher (MPICH's Hydra mpiexec) hands "
                             "each rank its PMI connection as an open file descriptor (PMI_FD), which a child of the "
                             "node's fork server does not have; set warm_start: auto or false (warm start is tested "
                             "with the local launcher; torchrun, PALS and srun --mpi=none|pmix lose no descriptor "
                             "but are untested; docs/launchers.md)")
        return self

    @model_validator(mode="after")
    def _backend_exists(self) -> CampaignSpec:
        if self.trainer.backend == "ccl":
            raise ValueError("trainer.backend: 'ccl' (oneCCL's bindings for PyTorch) is gone from ALCF's frameworks "
                             "module, whose page says \"the `backend` must be changed to `xccl` from `ccl`\" "
                             "(docs.alcf.anl.gov/aurora/data-science/frameworks/pytorch/), and the built-in trainer "
                             "never imports those bindings: set backend: xccl (or auto, which picks xccl on XPUs)")
        return self

    def stage(self, name: str) -> StageSpec:
        for s in self.stages:
            if s.resolved_name == name:
                return s
        raise KeyError(name)

    def canonical_json(self) -> str:
        """The resolved spec as canonical JSON: equal specs give equal text. `observe` and
        `notify` appear only when set, so a campaign stored before they existed keeps its digest."""
        unset = {k for k in ("observe", "notify") if getattr(self, k) is None}
        return json.dumps(self.model_dump(mode="json", exclude=unset), sort_keys=True, separators=(",", ":"))

    def digest(self) -> str:
        """SHA-256 of the resolved spec; same name + same digest = the same campaign."""
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()


def check_faults_allowed(spec: CampaignSpec, source: str) -> None:
    """Fault injection is for tests and drills: refuse it unless CAMPAIGN_ALLOW_FAULTS=1."""
    import os

    if os.environ.get("CAMPAIGN_ALLOW_FAULTS") == "1":
        return
    problems = [f"stages[{i}].faults: fault injection is for tests and drills; set CAMPAIGN_ALLOW_FAULTS=1 to run it"
                for i, st in enumerate(spec.stages) if st.injected_faults()]
    if problems:
        raise SpecError(source, problems)


def load(path: str | Path) -> CampaignSpec:
    """Load and validate a campaign file; raise SpecError naming file, line and field."""
    data, lines = yamlfile.load(path)
    return parse(data, str(path), lines)


def loads(text: str, name: str) -> CampaignSpec:
    """Validate campaign text, e.g. the copy the ledger keeps for `campaign resume`."""
    data, lines = yamlfile.loads(text, name)
    return parse(data, name, lines)


def reread_digest(source: str, name: str) -> str | None:
    """The digest this release gives a campaign file the ledger stored (an older release may
    have stored it); None if it no longer validates."""
    try:
        return loads(source, name).digest()
    except Exception:  # noqa: BLE001 - a file an older release accepted: not the same spec
        return None


def parse(data: Any, source: str = "<spec>", lines: yamlfile.Lines | None = None) -> CampaignSpec:
    """Validate already-parsed data (e.g. from a remote call) into a CampaignSpec."""
    try:
        return CampaignSpec.model_validate(data)
    except ValidationError as e:
        raise SpecError(source, [_problem(err, source, lines or {}) for err in _merge_union_members(e.errors())]) from None


_MEMBER = re.compile(r"^(?:bool|int|float|str|literal\[.*\])$")
"""The last part of a location pydantic adds for each member of a union (`bool | Literal['auto']`)."""


def _merge_union_members(errors: list[Any]) -> list[Any]:
    """One error per field for a value no member of its union takes (`trainer.warm_start: must
    be true or false or one of 'auto', got 'maybe'`), not one per member under its type's name."""
    out: list[Any] = []
    merged: dict[tuple[Any, ...], dict[str, Any]] = {}
    for err in errors:
        loc = err["loc"]
        if not (loc and isinstance(loc[-1], str) and _MEMBER.match(loc[-1])):
            out.append(err)
            continue
        want = re.split(r"[,;] got ", _explain(err, _data_path(loc[:-1]))[1])[0].removeprefix("must be ")
        if loc[:-1] in merged:
            merged[loc[:-1]]["wants"].append(want)
            continue
        merged[loc[:-1]] = {**err, "loc": loc[:-1], "type": "union_members", "wants": [want]}
        out.append(merged[loc[:-1]])
    return out


def _problem(err: Any, source: str, lines: yamlfile.Lines) -> str:
    """One pydantic error as `field: message (file, line N)`, in words a user can act on."""
    loc = _data_path(err["loc"])
    msg = err["msg"].removeprefix("Value error, ")
    own = _OWN_FIELD.match(msg) if err["type"] == "value_error" else None
    if own:  # a validator that names its own field: "stages[1]: ..." or "data.path is required ..."
        loc, msg = yamlfile.parse_dotted(own["field"]), msg[own.end():]
    else:
        loc, msg = _explain(err, loc)
    return yamlfile.problem(source, loc, msg, _line(loc, lines))


def _explain(err: Any, loc: tuple[Any, ...]) -> tuple[tuple[Any, ...], str]:
    """Rewrite pydantic's wording (`Input should be ...`) for the common error types."""
    kind, ctx, value = err["type"], err.get("ctx") or {}, err.get("input")
    what = "stage " if len(loc) == 2 and loc[0] == "stages" else "site " if loc == ("site",) else ""
    kinds = stage_kinds.KINDS if what == "stage " else site_kinds.KINDS if what == "site " else ()
    known = str(ctx.get("expected_tags") or ", ".join(kinds)).replace("'", "")
    if kind == "union_tag_invalid":
        return loc + ("kind",), f"unknown {what}kind {ctx.get('tag')!r}; known: {known}"
    if kind == "union_tag_not_found":
        return loc + ("kind",), f"required field is missing; known {what}kinds: {known}"
    if kind == "extra_forbidden":
        return loc, _unknown_key(err["loc"])
    if kind == "missing":
        return loc, "required field is missing"
    if kind in _BOUNDS:
        op, key = _BOUNDS[kind]
        return loc, f"must be {op} {ctx.get(key)}, got {_show(value)}"
    if kind == "string_pattern_mismatch" and names.PATTERN in str(ctx.get("pattern")) and isinstance(value, str):
        return loc, f"{_show(value)} {names.problem(value)}"
    if kind == "literal_error":
        return loc, f"must be one of {ctx.get('expected')}; got {_show(value)}"
    if kind == "union_members":
        return loc, f"must be {' or '.join(err['wants'])}, got {_show(value)}"
    if kind == "too_short":
        items = "stage" if loc == ("stages",) else "item"
        return loc, f"must list at least {ctx.get('min_length')} {items}, got {ctx.get('actual_length')}"
    if kind in _TYPES:
        return loc, f"must be {_TYPES[kind]}, got {_show(value)}"
    return loc, str(err["msg"]).removeprefix("Value error, ")


def _unknown_key(raw_loc: tuple[Any, ...]) -> str:
    model = _model_at(raw_loc[:-1])
    if model is None:
        return "unknown key"
    fields = list(model.model_fields)
    close = difflib.get_close_matches(str(raw_loc[-1]), fields, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown key{hint} (known here: {', '.join(fields)})"


def _model_at(raw_loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model class that holds the value at pydantic's `raw_loc` (tags included), if any."""
    tp: Any = CampaignSpec
    for part in raw_loc:
        tp = _unwrap(tp)
        if isinstance(part, int) and typing.get_origin(tp) is list:
            tp = typing.get_args(tp)[0]
        elif typing.get_origin(tp) is Union:  # a discriminated union: `part` is the tag
            tp = next((m for m in typing.get_args(tp) if _tag_of(m) == part), None)
        elif isinstance(tp, type) and issubclass(tp, BaseModel) and part == _tag_of(tp):
            continue  # a one-member union collapses to its model; pydantic still names the tag
        elif isinstance(tp, type) and issubclass(tp, BaseModel) and part in tp.model_fields:
            tp = tp.model_fields[part].annotation
        else:
            return None
    tp = _unwrap(tp)
    return tp if isinstance(tp, type) and issubclass(tp, BaseModel) else None


def _unwrap(tp: Any) -> Any:
    while typing.get_origin(tp) is Annotated:
        tp = typing.get_args(tp)[0]
    if typing.get_origin(tp) in (Union, types.UnionType):  # `X | None`: the X
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            tp = args[0]
        elif typing.get_origin(tp) is types.UnionType:
            tp = Union[tuple(args)]
    return tp


def _tag_of(model: Any) -> Any:
    field = getattr(model, "model_fields", {}).get("kind")
    return field.default if field is not None else None


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "nothing (null)"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return repr(value)


_OWN_FIELD = re.compile(r"^(?P<field>stages\[\d+\](?:\.\w+)*|[a-z_]+(?:\.\w+)+(?:\[\d+\])?)(?:: | is (?=required))")
_BOUNDS = {"greater_than_equal": (">=", "ge"), "greater_than": (">", "gt"),
           "less_than_equal": ("<=", "le"), "less_than": ("<", "lt")}
_TYPES = {
    "int_parsing": "a whole number", "int_type": "a whole number", "int_from_float": "a whole number",
    "float_parsing": "a number", "float_type": "a number", "bool_parsing": "true or false", "bool_type": "true or false",
    "string_type": "text", "list_type": "a list (one `- item` per line)",
    "model_type": "a mapping (`key: value` lines)", "dict_type": "a mapping (`key: value` lines)",
    "model_attributes_type": "a mapping (`key: value` lines)",
}


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


def _line(loc: tuple[Any, ...], lines: yamlfile.Lines) -> int | None:
    for n in range(len(loc), -1, -1):
        if loc[:n] in lines:
            return lines[loc[:n]]
    return None


_TAGS = set(stage_kinds.KINDS)
_SITE_TAGS = set(site_kinds.KINDS)
