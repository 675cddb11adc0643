"""What the PBS Pro sites (`aurora`, `polaris`) share: the job's directives and the Parsl
`PBSProProvider`. A PBS site module subclasses `PBSSite` with its `kind`, defaults,
`launch_options()` and four class constants: `CPUS_PER_NODE` (PBS `ncpus`),
`SELECT_OPTIONS` (extra `select` resources such as `ngpus=4`), `DRY_RUN_JOB_ID` and
`COLLECTIVE_ENV` (the collective library's environment ALCF documents for the machine).
"""

from __future__ import annotations

import functools
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, ClassVar, Literal

from pydantic import Field, model_validator

from campaign.executors import batch, queues

if TYPE_CHECKING:
    from parsl.config import Config
    from parsl.providers import PBSProProvider


class PBSSite(batch.BatchSite):
    """Fields every PBS Pro site has."""

    CPUS_PER_NODE: ClassVar[int]
    SELECT_OPTIONS: ClassVar[str] = ""
    DRY_RUN_JOB_ID: ClassVar[str]
    COLLECTIVE_ENV: ClassVar[tuple[tuple[str, str], ...]] = ()
    COLLECTIVE_JOB_LINES: ClassVar[tuple[str, ...]] = ()
    """The part of the collective environment that needs the job's shell (`$VAR`, `unset`)."""

    def scheduler_commands(self) -> tuple[str, ...]:
        """What Parsl's PBSProProvider runs: qsub (submit), qstat (status), qdel (cancel)."""
        return ("qsub", "qstat", "qdel")

    def rank_env(self, *base: dict[str, str]) -> dict[str, str]:
        """Every rank's environment: `base`, the collective environment (unless
        `collective_env: false`), then the user's `env`, which wins."""
        merged: dict[str, str] = {}
        for part in base:
            merged.update(part)
        if self.collective_env:
            merged.update(self.COLLECTIVE_ENV)
        return {**merged, **self.env}

    account: str = Field(min_length=1)
    """ALCF project charged for the blocks (qsub -A)."""
    queue: str = "debug"
    """PBS queue: debug, debug-scaling, prod (a routing queue), ...; the block (nodes + spares,
    walltime) must fit its limits (executors/queues.py). `debug` takes the default block
    (2 nodes, 1 h) on Aurora and Polaris; a larger block names the queues that take it."""
    filesystems: str = "home:flare"
    """Filesystems the job needs (-l filesystems=)."""
    place: str = "scatter"
    """Chunk placement (-l place=)."""
    launcher: Literal["pals", "mpich"] = "pals"
    """`pals` on the machine; `mpich` (mpiexec -launcher fork) is the single-machine test stand-in."""
    tmpdir: str | None = "/tmp"
    """TMPDIR for the Parsl worker and everything it starts (null: PBS's per-job directory).
    Python's multiprocessing binds AF_UNIX sockets under TMPDIR, whose path may not exceed
    107 bytes; PBS's per-job TMPDIR (/var/tmp/pbs.<job id>) uses most of that (docs/sites.md)."""
    mail: str = Field(default="n", pattern=r"^(n|[abe]{1,3})$")
    """When PBS mails about the block's job (`#PBS -m`): `n` never, else any of `a` (aborted),
    `b` (began), `e` (ended), e.g. `ae`; to the job's owner, or to `mail_to`."""
    mail_to: list[Annotated[str, Field(pattern=r"^[^\s,@#]+@[^\s,@#]+$")]] = []
    """Addresses PBS mails (`#PBS -M`), e.g. [you@example.org]; default: the job's owner."""
    collective_env: bool = True
    """Set the collective library's environment that ALCF documents for the machine on every
    rank (the site's `COLLECTIVE_ENV`: oneCCL on Aurora, NCCL/libfabric on Polaris; sources
    in the site module and docs/sites.md). A variable in `env` overrides one of them; false
    leaves the environment as your modules set it."""

    def job_environment(self) -> list[str]:
        """`cd` to the directory the job was submitted from (PBS Pro starts a job in $HOME;
        ALCF's job scripts `cd ${PBS_O_WORKDIR}`), then `COLLECTIVE_JOB_LINES` unless
        `collective_env: false`."""
        return [CD_SUBMIT_DIR, *(self.COLLECTIVE_JOB_LINES if self.collective_env else ())]

    def provider(self, cls: type | None = None, submit_dir: Path | None = None) -> PBSProProvider:
        """The site's PBSProProvider (`cls`: a subclass, for the dry run) that runs `qsub` in
        `submit_dir` (None: where the caller runs)."""
        provider = (cls or submitting_provider())(account=self.account, queue=self.queue, cpus_per_node=self.CPUS_PER_NODE,
                                                  select_options=self.SELECT_OPTIONS, scheduler_options=directives(self),
                                                  **batch.provider_kwargs(self))
        provider.template_string = with_mail(login_shell(provider.template_string), self.mail, self.mail_to)
        provider.submit_dir = None if submit_dir is None else str(submit_dir)  # type: ignore[attr-defined]
        return provider

    def parsl_config(self, run_dir: Path) -> Config:
        """A fresh Config whose blocks are submitted from `run_dir` (the campaign's Parsl run
        directory, under the work directory), not from wherever `campaign submit` was typed:
        ALCF: "Jobs should be submitted only from your allocated project directory and not from
        your home directory" (docs/sites.md)."""
        return batch.parsl_config(self, self.provider(submit_dir=run_dir), run_dir)

    def dry_run(self, script_dir: Path) -> tuple[str, list[str]] | None:
        """The first block's script and `qsub` line, run in the Parsl run directory
        (`script_dir` is RUN_DIR/000/submit_scripts, Parsl's layout)."""
        return batch.dry_run_block(lambda cls: self.provider(cls, submit_dir=script_dir.parent.parent),
                                   type(self.provider()), self, script_dir, self.dry_run_job_output)

    @property
    def dry_run_job_output(self) -> str:
        return self.DRY_RUN_JOB_ID

    @model_validator(mode="after")
    def _queue_takes_the_block(self) -> PBSSite:
        table = queues.TABLES.get(str(getattr(self, "kind")))
        if table is not None:
            problems, _ = queues.check(table, self.queue, self.block_nodes, self.walltime_s)
            if problems:
                raise ValueError("site.queue: " + "; ".join(problems))
        return self

    def queue_warnings(self) -> list[str]:
        """What the queue table cannot vouch for: by-request or preemptable queues, ALCF's
        approximate largest sizes, queues not in the table."""
        table = queues.TABLES.get(str(getattr(self, "kind")))
        return queues.check(table, self.queue, self.block_nodes, self.walltime_s)[1] if table else []


CD_SUBMIT_DIR = 'if [ -n "${PBS_O_WORKDIR:-}" ]; then cd "$PBS_O_WORKDIR"; fi'
"""The job's first line after `worker_init`: work where the job was submitted from."""


def in_dir(folder: str | None, cmd: str) -> str:
    """`cmd` run in `folder` (a shell command line, as Parsl's `execute_wait` runs it)."""
    return f"cd {shlex.quote(folder)} && {cmd}" if folder else cmd


@functools.cache
def submitting_provider() -> type:
    """Parsl's PBSProProvider, whose `qsub` runs in its `submit_dir` (Parsl runs it wherever
    the driver was started, so PBS_O_WORKDIR would be that folder, e.g. $HOME)."""
    from parsl.providers import PBSProProvider

    class SubmitFromDir(PBSProProvider):  # type: ignore[misc]
        submit_dir: str | None = None

        def submit_command(self, cmd: str) -> str:
            return in_dir(self.submit_dir, cmd) if cmd.startswith("qsub") else cmd

        def execute_wait(self, cmd: str, timeout: float | None = None) -> tuple[int, str, str]:
            return super().execute_wait(self.submit_command(cmd), timeout)  # type: ignore[no-any-return]

    return SubmitFromDir


def directives(site: PBSSite) -> str:
    """The `#PBS` lines of a block: filesystems, placement, keep output, the user's extras."""
    lines = [f"#PBS -l filesystems={site.filesystems}", f"#PBS -l place={site.place}", "#PBS -k doe"]
    return "\n".join(lines + ([site.scheduler_options.strip()] if site.scheduler_options.strip() else []))


def with_mail(template: str, mail: str, to: list[str]) -> str:
    """Parsl's PBS Pro template with the site's `-m` in place of its fixed `#PBS -m n`, and a
    `#PBS -M` line when addresses are given (a second `-m` line would leave PBS to choose)."""
    lines = ["#PBS -m " + mail + (f"\n#PBS -M {','.join(to)}" if to else "") if line.strip() == "#PBS -m n" else line
             for line in template.split("\n")]
    return "\n".join(lines)


def login_shell(template: str) -> str:
    """Parsl's PBS Pro job template, started as ALCF's sample job scripts are: `#!/bin/bash -l`
    (a login shell, so `module` is defined for `worker_init`; Parsl issue 3538) and no
    `#PBS -S /bin/bash`, which names the shell without `-l`."""
    lines = template.split("\n")
    if lines and lines[0] == "#!/bin/bash":
        lines[0] = "#!/bin/bash -l"
    return "\n".join(line for line in lines if line.strip() != "#PBS -S /bin/bash")
