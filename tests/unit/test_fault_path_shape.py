"""The fault path's shape (issue 43), kept as tests: the supervisor is a package of modules of
one idea each, no function in it or in `campaign.evidence` is over 60 lines, its watch loop and
`evidence.assess` are ordered tuples of named rules, and the reasons a launch is stopped are
one enum whose values are the strings the report and the ledger store."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FAULT_PATH = sorted((REPO / "campaign" / "supervisor").glob("*.py")) + [REPO / "campaign" / "evidence.py"]
MAX_FUNCTION_LINES = 60
MAX_MODULE_LINES = 260
""""No module over ~250 lines" (a docstring's worth of slack)."""


def _functions(path: Path) -> list[tuple[str, int, int]]:
    tree = ast.parse(path.read_text(), str(path))
    return [(node.name, node.lineno, node.end_lineno - node.lineno + 1) for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno is not None]


def test_the_supervisor_is_a_package() -> None:
    assert not (REPO / "campaign" / "supervisor.py").exists()
    assert {p.stem for p in FAULT_PATH} >= {"__init__", "launch", "reading", "rules", "bisection", "rescue"}


@pytest.mark.parametrize("path", FAULT_PATH, ids=lambda p: str(p.relative_to(REPO)))
def test_no_function_in_the_fault_path_is_over_60_lines(path: Path) -> None:
    long = [f"{name} (line {line}): {n} lines" for name, line, n in _functions(path) if n > MAX_FUNCTION_LINES]
    assert long == []


@pytest.mark.parametrize("path", FAULT_PATH[:-1], ids=lambda p: str(p.relative_to(REPO)))
def test_no_supervisor_module_is_over_about_250_lines(path: Path) -> None:
    assert len(path.read_text().splitlines()) <= MAX_MODULE_LINES


def test_the_watch_loop_and_assess_are_ordered_named_rules() -> None:
    from campaign import evidence
    from campaign.supervisor import rules

    assert [r.__name__ for r in rules.WATCH_RULES] == [
        "run_dir_lost", "launch_ended", "observe", "stop_file", "interrupt_at_step", "interrupt_given_up",
        "first_failure", "rescue_after_crash", "failed_rank", "judge", "exit_hung", "stalled_or_timeout"]
    # Named as `Finding.rule` records them.
    assert [r.__name__ for r in evidence.ASSESS_RULES] == [
        "stall", "no_failure", "contract_exit", "hardware_signature", "signal", "same_failure", "software_signature",
        "fabric_error", "insufficient"]


def test_stop_reasons_are_the_stored_strings() -> None:
    from campaign.exits import StopReason

    assert [r.value for r in StopReason] == ["stop", "interrupt", "rundir_lost", "exit_hung", "stalled", "timeout"]
    assert StopReason.STALLED == "stalled" and f"{StopReason.TIMEOUT}" == "timeout"
