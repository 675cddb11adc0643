"""The one rule for names that become ledger keys and file names: campaign names (spec
`name`, `ledger import-reference NAME`), stage names, and the NAME arguments of commands
that build a file path from them (`plot`). Standard library only (stage specs use it).

    check("../../tmp/x", "NAME")   # CampaignError: NAME: '../../tmp/x' is not a valid name: ...

A valid name cannot hold `/` or start with `.`, so it never leaves the folder it is put in,
and it fits the ledger's name columns (String(MAX_LENGTH)), so no database refuses it.
"""

from __future__ import annotations

import re
import unicodedata

from campaign.errors import CampaignError

MAX_LENGTH = 64
"""The ledger's campaign.name and stage_run.name columns are String(MAX_LENGTH)."""
PATTERN = rf"^[A-Za-z0-9][A-Za-z0-9._-]{{0,{MAX_LENGTH - 1}}}$"
"""A name: letters, digits, '.', '_' and '-', starting with a letter or digit."""
RULE = f"use letters, digits, '.', '_' and '-', starting with a letter or digit, at most {MAX_LENGTH} characters"
_NAME = re.compile(PATTERN)
_GLOB = re.compile(r"^[A-Za-z0-9*?\[][A-Za-z0-9._\-*?\[\]!]*$")
"""A NAME argument that may hold shell-style wildcards (`auroragpt-*`)."""


def problem(value: str) -> str | None:
    """Why `value` is not a valid name (one phrase), or None."""
    if _NAME.match(value):
        return None
    if len(value) > MAX_LENGTH and _NAME.match(value[:MAX_LENGTH]):
        return f"is {len(value)} characters long; the ledger keeps names of at most {MAX_LENGTH} characters"
    return f"is not a valid name: {RULE}"


def check(value: str, what: str) -> str:
    """`value` if it is a valid name; else CampaignError (exit 2) naming `what` (e.g. "NAME")."""
    why = problem(value)
    if why is not None:
        raise CampaignError(f"{what}: {value!r} {why}")
    return value


NODE_RULE = "a node name is one word: no control characters (newlines, tabs, escapes), spaces or commas"


def node_problem(value: str) -> str | None:
    """Why `value` cannot be a node name (one phrase), or None. Node names go into hostfiles
    (one per line), `srun --exclude` lists (comma-separated) and the ledger: a newline in one
    made `campaign nodes list` show two nodes."""
    if not value:
        return f"is empty: {NODE_RULE}"
    bad = sorted({c for c in value if unicodedata.category(c).startswith("C") or c.isspace() or c == ","})
    if bad:
        return f"holds {', '.join(repr(c) for c in bad)}: {NODE_RULE}"
    return None


def check_node(value: str, what: str) -> str:
    """`value` if it is a valid node name; else CampaignError (exit 2) naming `what` (e.g. "NODE")."""
    why = node_problem(value)
    if why is not None:
        raise CampaignError(f"{what}: {value!r} {why}")
    return value


def check_length(value: str, limit: int, what: str) -> str:
    """`value` if it fits a ledger column of `limit` characters; else CampaignError naming `what`."""
    if len(value) > limit:
        raise CampaignError(f"{what}: {value[:24]!r}... is {len(value)} characters long; the ledger keeps at most {limit}")
    return value


def check_pattern(value: str, what: str) -> str:
    """A name that may hold wildcards (`*`, `?`, `[...]`): the same characters, no path."""
    if _GLOB.match(value) and len(value) <= MAX_LENGTH:
        return value
    raise CampaignError(f"{what}: {value!r} is not a valid name or pattern: {RULE} (wildcards * ? [ ] allowed)")
