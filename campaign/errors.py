"""The exceptions `campaign` raises on purpose. Each message says what to do next.

    CampaignError            root; the CLI prints it and exits with its `exit_code`
    ├── SpecError            the YAML file is malformed or invalid (exit 2)
    ├── LedgerError          the ledger cannot be used as asked (exit 2)
    │   ├── NoLedger         there is no ledger yet where one was to be read (exit 2)
    │   └── SchemaOutOfDate  the ledger's schema is older than this release (exit 2)
    ├── CampaignConflict     same name, different spec, or another driver holds it (exit 2)
    │   └── LeaseLost        another driver took this driver's lease: it stops, trainers untouched (exit 2)
    ├── SiteError            the site cannot provide what a stage asks for (exit 2)
    ├── WorkdirError         the work directory cannot be written (full, read-only) (exit 2)
    │   └── DiskFull         the ledger's or the work directory's file system is full (exit 2)
    ├── DataError            a token file, its sidecar, a tokenizer or a text corpus cannot be used (exit 2)
    └── RemoteError          a Globus Compute endpoint cannot be used: credentials, versions, reach (exit 2)
"""

from __future__ import annotations


class CampaignError(Exception):
    """Root of every error `campaign` raises on purpose."""

    exit_code = 2


class SpecError(CampaignError):
    """A campaign file that cannot be used; `problems` holds one line per problem."""

    def __init__(self, path: str, problems: list[str]) -> None:
        self.path = path
        self.problems = problems
        lines = "\n".join(f"  {p}" for p in problems)
        n = len(problems)
        super().__init__(f"{path}: {n} problem{'s' if n != 1 else ''}\n{lines}")


class LedgerError(CampaignError):
    """The ledger cannot be opened, read or written as asked."""


class NoLedger(LedgerError):
    """No ledger exists where one was to be read (a SQLite file not made yet)."""


class SchemaOutOfDate(LedgerError):
    """The ledger's schema is older (or newer) than this release of `campaign`."""


class CampaignConflict(CampaignError):
    """The request conflicts with what the ledger already holds."""


class LeaseLost(CampaignConflict):
    """Another driver took over this driver's lease (it judged it stale): this one stops at
    once, writes nothing more to the ledger and leaves the trainers to the new holder."""


class SiteError(CampaignError):
    """The site cannot provide what a stage asks for."""


class DataError(CampaignError):
    """Training data that cannot be used: a tokenizer file that is not one, an empty corpus,
    a token file that its sidecar does not describe, a spec that contradicts the sidecar."""


class WorkdirError(CampaignError):
    """The driver cannot write in the work directory (ENOSPC, read-only): nothing a stage did
    wrong; the campaign stays resumable once there is room."""


class DiskFull(WorkdirError):
    """The file system of the ledger (SQLite) or of the run directories is full (ENOSPC,
    EDQUOT): the driver stops its launch, records the stop with the ledger's reserve
    (`Ledger.keep_reserve`) and exits; `campaign resume` continues once there is room."""


class RemoteError(CampaignError):
    """A Globus Compute endpoint cannot be used as asked (`--endpoint`): no credentials,
    other versions there, no answer, or the remote call failed."""
