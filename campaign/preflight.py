"""Checks before anything is submitted or a ledger row is written.

    findings = preflight.check(spec, Source.read(path), ledger=LedgerView(db_url, workdir))
    preflight.refuse_if_any(findings, source)   # PreflightError (exit 2) listing every refusal

`campaign submit` runs them first and refuses (exit 2) when one fails; `campaign validate
--preflight` prints the same list and exits 2 on a refusal; `campaign submit --dry-run` prints
the list above the plan (it submits nothing, so it still shows the plan). A submission through
`--endpoint` runs them again on the endpoint's host before its driver starts
(`campaign.remote.start_driver`), where the paths and the scheduler are the ones that count.

Each finding is one line naming the field (and the file's line) and the fix. A refusal is
what would fail inside the job, after the allocation is spent: a reference that is not there,
a data file that does not exist, a placeholder left in, no scheduler command on PATH, a site
check of this host (`Site.preflight`). A warning is what only the machine can tell (the
walltime estimate, the work directory on the wrong filesystem, the site's own advice).
Node counts and walltimes outside a queue's limits and a stage asking for more nodes than the
site has are refused earlier, by the spec's own validation (`campaign validate`).
"""

from __future__ import annotations

import dataclasses
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from campaign import yamlfile
from campaign.contract import spec_path
from campaign.errors import CampaignError, LedgerError, NoLedger, SpecError

PLACEHOLDER = re.compile(r"\bYOUR_[A-Z0-9_]+\b|\bCHANGE_?ME\b|(?:^|(?<=[\s/=:'\"]))<[A-Za-z][\w .-]*>")
"""What the shipped examples and the facility's pages leave for a user to fill in:
`YOUR_PROJECT`, `CHANGE_ME`, `<project>`."""
NOT_CHECKED_FOR_PLACEHOLDERS = frozenset({"description"})
"""Free text a placeholder-like word may stand in (a campaign's one-line description)."""


@dataclass(frozen=True)
class Finding:
    """One preflight result: the dotted field, what is wrong and how to fix it."""

    field: str
    problem: str
    refuse: bool = True
    line: int | None = None

    def text(self, source: str | None = None) -> str:
        """"field: problem (source, line N)"; under a heading that names the file, `source=None`."""
        at = f" ({source + ', ' if source else ''}line {self.line})" if self.line else ""
        return f"{self.field}: {self.problem}{at}"


class PreflightError(CampaignError):
    """The preflight refused the submission (exit 2); nothing was submitted or written."""

    def __init__(self, source: str, refusals: list[Finding]) -> None:
        self.findings = refusals
        n = len(refusals)
        lines = "\n".join(f"  {f.text()}" for f in refusals)
        super().__init__(f"{source}: preflight refused the submission ({n} problem{'s' if n != 1 else ''}; nothing "
                         f"was submitted and the ledger was not touched)\n{lines}")


@dataclass(frozen=True)
class Source:
    """The campaign file as the user wrote it: its data (for placeholders), its lines (for
    line numbers) and its folder (relative paths are resolved against it)."""

    name: str
    data: Any
    lines: yamlfile.Lines
    folder: Path

    @classmethod
    def read(cls, path: Path) -> Source:
        data, lines = yamlfile.load(path)
        return cls(str(path), data, lines, path.resolve().parent)

    @classmethod
    def parse(cls, text: str, name: str, folder: Path) -> Source:
        data, lines = yamlfile.loads(text, name)
        return cls(name, data, lines, folder)

    def spec(self) -> Any:
        """The validated spec of this file (SpecError naming file, line and field): one read
        of the file serves the spec and the preflight."""
        from campaign import spec as spec_mod

        return spec_mod.parse(self.data, self.name, self.lines)

    def line(self, *at: Any) -> int | None:
        for n in range(len(at), -1, -1):
            if at[:n] in self.lines:
                return self.lines[at[:n]]
        return None


class LedgerView:
    """Read-only questions to the ledger the submission will use; it is opened only when a
    question needs it, never created or changed."""

    def __init__(self, db_url: str | None, workdir: Path) -> None:
        self.db_url, self.workdir = db_url, workdir

    def reference_problem(self, ref: str, check_steps: list[int] | None) -> str | None:
        """Why CAMPAIGN/STAGE cannot serve as a reference (None: it can)."""
        from campaign.commands import open_at
        from campaign.reference import from_ledger

        campaign = ref.split("/", 1)[0]
        record = (f"record it first (the same file with `name: {campaign}` and `reference: {{record: true}}`, run on "
                  "a known-good stack), or give `reference: {file: losses.csv}` (a step,loss CSV)")
        try:
            ledger = open_at(self.db_url, self.workdir, create=False)
        except NoLedger:
            return f"{ref} is not in the ledger (there is no ledger yet at {self.workdir / 'ledger.db'}); {record}"
        except LedgerError as e:
            return f"the ledger cannot be read to find {ref}: {' '.join(str(e).split())}"
        try:
            losses = from_ledger(ledger, ref)
        except SpecError:
            return f"{ref} is not in the ledger ({ledger.display_url}); {record}"
        finally:
            ledger.close()
        if not losses:
            return f"{ref} is in the ledger but recorded no loss; {record}"
        missing = [s for s in check_steps or [] if s not in losses]
        if missing:
            return (f"{ref} has no loss for step{'s' if len(missing) > 1 else ''} "
                    f"{missing[0]}{'-' + str(missing[-1]) if len(missing) > 1 else ''}, which this stage compares "
                    f"(it has steps {min(losses)}-{max(losses)}): record a reference that covers them, or compare "
                    "fewer steps")
        return None


def check(spec: Any, source: Source, *, ledger: LedgerView | None, workdir: Path | None = None,
          remote: bool = False, here: bool = True) -> list[Finding]:
    """Every finding for `spec` as written in `source`, refusals first.

    `ledger`: where loss references are looked up (None: not looked up). `workdir`: the work
    directory the run would use (its site's warnings). `remote`: the checks run on an endpoint's
    host for a file submitted from elsewhere (a relative path there names nothing). `here`: this
    host is where the driver will run (False on the submitting side of `--endpoint`: the paths,
    the scheduler and the ledger are checked on the endpoint's host instead)."""
    found = [*placeholders(source), *warnings(spec, source)]
    if workdir is not None:
        found += [_warning(w, source) for w in spec.site.workdir_warnings(workdir, remote=not here)]
    if here:
        held = {f.field for f in found if f.refuse}  # a placeholder says all there is to say of its field
        found += [f for f in (*references(spec, source, ledger, remote=remote), *data_paths(spec, source, remote=remote),
                              *scheduler(spec, source), *site_host(spec, source)) if f.field not in held]
    return sorted(found, key=lambda f: not f.refuse)


def refuse_if_any(findings: list[Finding], source: str) -> None:
    refusals = [f for f in findings if f.refuse]
    if refusals:
        raise PreflightError(source, refusals)


def render(findings: list[Finding], source: str) -> list[str]:
    """The lines `validate --preflight` and `submit --dry-run` print."""
    if not findings:
        return [f"preflight: {source}: every check passed"]
    refusals = sum(f.refuse for f in findings)
    head = (f"preflight: {source}: {refusals} refusal{'s' if refusals != 1 else ''}, "
            f"{len(findings) - refusals} warning{'s' if len(findings) - refusals != 1 else ''}")
    return [head, *(f"  {'refuse' if f.refuse else 'warn  '}  {f.text()}" for f in findings)]


# --- the checks ------------------------------------------------------------------------------------

def placeholders(source: Source) -> Iterator[Finding]:
    """String values that still hold an example's placeholder (`YOUR_PROJECT`, `<project>`)."""
    for at, value in _strings(source.data, ()):
        if at and (at[-1] in NOT_CHECKED_FOR_PLACEHOLDERS or str(at[-1]).endswith("_pattern")):  # a regex's (?P<name>)
            continue
        m = PLACEHOLDER.search(value)
        if m:
            yield Finding(yamlfile.dotted(at), f"{m.group(0)!r} is a placeholder: replace it with your own value",
                          line=source.line(*at))


def references(spec: Any, source: Source, ledger: LedgerView | None, *, remote: bool) -> Iterator[Finding]:
    """Each stage's loss reference: a file that exists and reads as `step,loss`; a stage run
    that an earlier stage of this campaign records, or the ledger holds with the losses the
    check compares."""
    from campaign.reference import Reference, read_csv

    earlier: set[str] = set()
    for i, stage in enumerate(spec.stages):
        ref = getattr(stage, "reference", None)
        at = ("stages", i, "reference")
        if isinstance(ref, Reference) and ref.file:
            path, problem = _resolve(ref.file, source.folder, remote=remote)
            if problem:
                yield Finding(yamlfile.dotted((*at, "file")), problem, line=source.line(*at, "file"))
            else:
                try:
                    losses = read_csv(path)
                except SpecError as e:
                    yield Finding(yamlfile.dotted((*at, "file")), f"{path}: {'; '.join(e.problems)}",
                                  line=source.line(*at, "file"))
                    continue
                missing = [s for s in stage.reference_check_steps() or [] if s not in losses]
                if missing:
                    have = f"steps {min(losses)}-{max(losses)}" if losses else "no rows"
                    yield Finding(yamlfile.dotted((*at, "file")), f"{path} has no loss for step(s) {missing[0]}-{missing[-1]}, "
                                  f"which this stage compares (it has {have})", line=source.line(*at, "file"))
        elif isinstance(ref, Reference) and ref.stage_run:
            campaign, stage_name = ref.stage_run.split("/", 1)
            if campaign == spec.name and stage_name in earlier:
                pass  # an earlier stage of this campaign writes it before this one reads it
            elif ledger is not None:
                why = ledger.reference_problem(ref.stage_run, stage.reference_check_steps())
                if why:
                    yield Finding(yamlfile.dotted((*at, "stage_run")), why, line=source.line(*at, "stage_run"))
        earlier.add(stage.resolved_name)


def data_paths(spec: Any, source: Source, *, remote: bool) -> Iterator[Finding]:
    """The token file the built-in trainer reads, where the driver can see it."""
    if spec.data.source != "file" or not spec.data.path or spec.trainer.command:
        return
    path, problem = _resolve(spec.data.path, source.folder, remote=remote)
    if problem is None and not path.is_file():
        problem = f"{path} is a folder, not a token file"
    if problem is None:  # its sidecar (dtype, vocabulary: `campaign data prepare`) against the spec
        from campaign.train import tokenfile

        try:
            tokenfile.check_visible(spec.model, spec.data.model_copy(update={"path": str(path)}))
        except CampaignError as e:
            problem = " ".join(str(e).split())
    if problem:
        hint = "; `campaign data prepare TEXTS --out FILE` writes a token file" if problem.endswith("exist") else ""
        yield Finding("data.path", problem + hint, line=source.line("data", "path"))


def scheduler(spec: Any, source: Source) -> Iterator[Finding]:
    """The scheduler's commands the site's Parsl provider runs on this host."""
    commands = spec.site.scheduler_commands()
    missing = [c for c in commands if shutil.which(c) is None]
    if missing:
        names = ", ".join(f"`{c}`" for c in missing[:-1]) + (" and " if len(missing) > 1 else "") + f"`{missing[-1]}`"
        yield Finding("site.kind", f"{names} (which the {spec.site.kind} site's Parsl provider runs) "
                      f"{'is' if len(missing) == 1 else 'are'} not on PATH here: submit from the machine's login "
                      "node, or through `--endpoint UUID` of an endpoint there",
                      line=source.line("site", "kind"))


def site_host(spec: Any, source: Source) -> Iterator[Finding]:
    """What only the driver's host can tell about the site: `Site.preflight` refuses (a named
    network interface it lacks), `Site.preflight_warnings` advises (Copper, hsn0)."""
    try:
        spec.site.preflight()
    except CampaignError as e:
        yield dataclasses.replace(_warning(" ".join(str(e).split()), source), refuse=True)
    for line in spec.site.preflight_warnings():
        yield _warning(line, source)


def warnings(spec: Any, source: Source) -> Iterator[Finding]:
    """What the facility's advice or the walltime estimate says against the spec (never a refusal)."""
    from campaign import walltime
    from campaign.contract import custom_trainer_warnings

    for line in [*walltime.warnings(spec), *custom_trainer_warnings(spec)]:
        yield _warning(line, source)


def _warning(line: str, source: Source) -> Finding:
    """A warning line "field: problem" (a dotted field of the spec, or an option like `--workdir X`)."""
    field, sep, rest = line.partition(": ")
    if sep and re.fullmatch(r"[A-Za-z_][\w.\[\]]*", field):
        return Finding(field, rest, refuse=False, line=source.line(*yamlfile.parse_dotted(field)))
    if sep and field.startswith("--"):
        return Finding(field, rest, refuse=False)
    return Finding("spec", line, refuse=False)


# --- helpers ---------------------------------------------------------------------------------------

def _resolve(value: str, folder: Path, *, remote: bool) -> tuple[Path, str | None]:
    if remote and not Path(value).expanduser().is_absolute():
        return Path(value), (f"{value} is relative, and the file was submitted from another host: give the absolute "
                             "path on the endpoint's host")
    path = spec_path(value, folder)
    if not path.exists():
        shown = value if Path(value).is_absolute() else f"{value} (resolved against the campaign file's folder: {path})"
        return path, f"{shown} does not exist"
    return path, None


def _strings(node: Any, at: tuple[Any, ...]) -> Iterator[tuple[tuple[Any, ...], str]]:
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _strings(v, (*at, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _strings(v, (*at, i))
    elif isinstance(node, str):
        yield at, node
