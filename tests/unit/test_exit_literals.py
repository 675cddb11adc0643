"""Exit classes are named once: `campaign.exits` (`ExitClass`, and `POLICY`, the one table of
what follows each). Elsewhere a module says `ExitClass.STALLED`, never "stalled", and asks
`exits.follows(cls)` rather than keeping its own set of classes.

The check reads the source (ast): every string constant under campaign/, stages/ and
executors/ that equals an exit class's value is a finding, unless `NOT_EXIT_CLASSES` lists it
with its reason: the same words name campaign states ("succeeded", "cancelled"), a site's
`walltime` field and words of a message. An entry is keyed by file, scope (the enclosing
function or class, dotted; at module level the name assigned) and word, with how many
times the word occurs there, so a new exit-class literal beside an allowed one still fails.
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

from campaign import exits
from campaign.exits import ExitClass, NextAction

REPO = Path(__file__).resolve().parents[2]
ROOTS = ("campaign", "stages", "executors")
WORDS = frozenset(str(c) for c in ExitClass)

OWNER = "campaign/exits.py"
"""The one module that spells the classes."""

EXEMPT: tuple[str, ...] = ()
"""Paths (a file, or a folder ending in /) not checked: none since the supervisor package merged."""

NOT_EXIT_CLASSES: dict[tuple[str, str, str], tuple[int, str]] = {
    ("campaign/evidence.py", "_suspect", "stalled"):
        (1, "a suspect's reason (the watchdog's word for why a node is suspected), not an attempt's class"),
    ("campaign/commands.py", "cancel_without_driver", "cancelled"):
        (1, "the campaign's state (writes.set_campaign_state)"),
    ("campaign/engine.py", "Engine._finish_campaign", "cancelled"): (1, "the campaign's state"),
    ("campaign/engine.py", "Engine._finish_campaign", "succeeded"): (1, "the campaign's state"),
    ("campaign/ledger/writes.py", "import_reference", "succeeded"):
        (1, "the campaign's state (set_campaign_state); its attempts' state is ExitClass.SUCCEEDED"),
    ("campaign/observe/notify.py", "notification", "succeeded"): (1, "a campaign_state event's final state"),
    ("campaign/observe/notify.py", "notification", "cancelled"): (1, "a campaign_state event's final state"),
    ("campaign/progress.py", "Progress.campaign_finished", "succeeded"): (1, "the campaign's state in its summary"),
    ("campaign/htmlreport.py", "STATE_CLASS", "succeeded"):
        (1, "the CSS class of a state of any row: a campaign's state, or an attempt's with the same word"),
    ("campaign/htmlreport.py", "STATE_CLASS", "cancelled"):
        (1, "the CSS class of a state of any row: a campaign's state, or an attempt's with the same word"),
    ("campaign/views.py", "STATE_STYLE", "succeeded"):
        (1, "the colour of a state of any row: a campaign's state, or an attempt's with the same word"),
    ("campaign/views.py", "STATE_STYLE", "cancelled"):
        (1, "the colour of a state of any row: a campaign's state, or an attempt's with the same word"),
    ("campaign/views.py", "STATE_MARK", "cancelled"): (2, "a stage's or campaign's state and how it is shown"),
    ("stages/long_run.py", "CAUSES", "walltime"): (1, "the cause word printed for a relaunch after a walltime"),
    ("stages/smoke.py", "_stopped", "stalled"): (1, "a word of the verdict (`stalled after 30 s ...`)"),
    ("executors/batch.py", "BatchSite._walltime_format", "walltime"): (1, "the site's `walltime` field"),
    ("executors/batch.py", "provider_kwargs", "walltime"): (1, "the Parsl provider's `walltime` argument"),
}
"""(file, scope, word) -> (occurrences, why that string is not an exit class)."""


class _Literals(ast.NodeVisitor):
    """The exit-class words among a module's string constants, with their scope and line."""

    def __init__(self) -> None:
        self.scope: list[str] = []
        self.found: list[tuple[str, str, int]] = []  # (scope, word, line)

    def _within(self, name: str, node: ast.AST) -> None:
        self.scope.append(name)
        self.generic_visit(node)
        self.scope.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._within(node.name, node)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self._within(node.name, node)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._within(node.name, node)

    def visit_Assign(self, node: ast.Assign) -> None:
        self._assigned([*node.targets], node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._assigned([node.target], node)

    def _assigned(self, targets: list[ast.expr], node: ast.AST) -> None:
        """At module level a table's scope is its name (`STATE_STYLE`)."""
        names = [t.id for t in targets if isinstance(t, ast.Name)]
        if not self.scope and names:
            self._within(names[0], node)
        else:
            self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str) and node.value in WORDS:
            self.found.append((".".join(self.scope) or "<module>", node.value, node.lineno))


def _sources() -> list[str]:
    rels = [p.relative_to(REPO).as_posix() for root in ROOTS for p in sorted((REPO / root).rglob("*.py"))]
    return [r for r in rels if r != OWNER and not any(r == e or (e.endswith("/") and r.startswith(e)) for e in EXEMPT)]


def _literals() -> dict[tuple[str, str, str], list[int]]:
    """(file, scope, word) -> the lines where that word is a string constant."""
    out: dict[tuple[str, str, str], list[int]] = {}
    for rel in _sources():
        visitor = _Literals()
        visitor.visit(ast.parse((REPO / rel).read_text(), rel))
        for scope, word, line in visitor.found:
            out.setdefault((rel, scope, word), []).append(line)
    return out


def test_no_exit_class_literal_outside_exits() -> None:
    found = _literals()
    bad = []
    for key, lines in sorted(found.items()):
        allowed = NOT_EXIT_CLASSES.get(key, (0, ""))[0]
        if len(lines) != allowed:
            rel, scope, word = key
            where = ", ".join(f"{rel}:{n}" for n in lines)
            bad.append(f"{where}: {word!r} in {scope} ({len(lines)} here, {allowed} allowed): write "
                       f"ExitClass.{ExitClass(word).name}, or add {key!r} to NOT_EXIT_CLASSES with why it is not "
                       "an exit class")
    assert bad == [], "exit classes spelled outside campaign/exits.py:\n  " + "\n  ".join(bad)


def test_every_allowed_literal_is_still_there() -> None:
    """An entry of NOT_EXIT_CLASSES whose word is gone (converted, moved) is deleted with it."""
    found = _literals()
    stale = [key for key in NOT_EXIT_CLASSES if key not in found]
    assert stale == [], f"NOT_EXIT_CLASSES entries that match nothing (delete or update them): {stale}"


def test_policy_has_exactly_one_entry_per_exit_class() -> None:
    assert set(exits.POLICY) == set(ExitClass)
    assert all(isinstance(a, NextAction) for a in exits.POLICY.values())
    # a repeated key in the table's dict literal would silently keep only the last one
    tree = ast.parse((REPO / OWNER).read_text())
    keys: list[str] = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == "POLICY"
                and node.value is not None):
            keys = [ast.unparse(k) for d in ast.walk(node.value) if isinstance(d, ast.Dict) for k in d.keys if k]
    assert keys, "POLICY is no longer a dict literal in campaign/exits.py: check its entries another way"
    assert sorted(keys) == sorted(f"ExitClass.{c.name}" for c in ExitClass), Counter(keys)


def test_the_sets_callers_use_are_read_from_the_policy() -> None:
    """The names existing callers use keep their members (the values stored are unchanged)."""
    assert exits.RESUMABLE == {"stalled", "timed_out", "crashed_node", "walltime", "orphaned", "block_lost"}
    assert exits.CONFIRM_ONCE == {"crashed_unknown"}
    assert set(exits.CLASSES) == set(ExitClass)
    assert [str(c) for c in ExitClass] == [c.value for c in ExitClass]  # a member prints as the stored string
    assert f"{ExitClass.CRASHED_NODE}" == "crashed_node"


def test_follows_reads_strings_as_the_ledger_holds_them() -> None:
    assert exits.follows("crashed_unknown") is NextAction.CONFIRM
    assert exits.follows(ExitClass.STALLED) is NextAction.EXCLUDE_AND_RESUME
    assert exits.follows("crashed_systemic") is NextAction.RETRY_AFTER_BACKOFF
    assert exits.follows("succeeded") is NextAction.DONE
    assert exits.follows("running") is NextAction.STOP and exits.follows(None) is NextAction.STOP
