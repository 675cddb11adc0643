"""What `campaign submit` shows while it works.

On a terminal: a Rich progress bar per running attempt (steps against the target, loss,
tokens/s, step time). In a plain log (not a TTY): one concise line per stage event and
at most one progress line per `LOG_PERIOD_S`, with no control characters.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
from rich.progress import Progress as RichProgress

HEADERS = {"step_time_s": "step s", "tokens_per_s": "tok/s", "comm_time_s": "comm s", "comm_share": "comm %",
           "mem_peak_gib": "mem GiB", "last_loss": "loss", "efficiency": "eff"}
"""Short column names for the tables printed during a run."""
LOG_PERIOD_S = 10.0
"""Plain logs get at most one progress line per attempt per this many seconds."""


class Progress:
    """Receives engine events and renders them; `quiet=True` renders nothing."""

    def __init__(self, file: TextIO | None = None, *, quiet: bool = False, force_terminal: bool | None = None) -> None:
        self.console = Console(file=file or sys.stdout, force_terminal=force_terminal, highlight=False)
        if not self.console.is_terminal:
            self.console = Console(file=file or sys.stdout, highlight=False, width=120)
        self.quiet = quiet
        self._bar: RichProgress | None = None
        self._task: Any = None
        self._last_line = 0.0
        self._started = 0.0

    def _print(self, text: str) -> None:
        if not self.quiet:
            self.console.print(text)

    def campaign_started(self, name: str, ledger_url: str, n_stages: int) -> None:
        self._print(f"[bold]campaign {escape(name)}[/]: {n_stages} stage(s); ledger {escape(ledger_url)}")

    def stage_started(self, name: str, kind: str, position: int, total: int) -> None:
        self._started = time.monotonic()
        self._print(f"[bold cyan]stage {position + 1}/{total} {escape(name)}[/] ({kind}) started")

    def stage_skipped(self, name: str, why: str) -> None:
        self._print(f"stage {escape(name)}: skipped ({escape(why)})")

    def attempt_started(self, stage: str, number: int, hosts: list[str], steps: int, label: str) -> None:
        shown = ", ".join(hosts[:6]) + (" ..." if len(hosts) > 6 else "")
        self._print(f"  attempt {number}{' ' + escape(label) if label else ''}: {steps} steps on {len(hosts)} node(s) "
                    f"\\[{escape(shown)}]")
        if self.console.is_terminal and not self.quiet:
            self._bar = RichProgress(TextColumn("  {task.description}"), BarColumn(), MofNCompleteColumn(),
                                     TextColumn("{task.fields[info]}"), TimeRemainingColumn(), console=self.console,
                                     transient=True)
            self._bar.start()
            self._task = self._bar.add_task(f"{stage} #{number}", total=steps, info="starting")
        self._last_line = time.monotonic()

    def steps(self, stage: str, row: dict[str, Any], target: int) -> None:
        info = _step_info(row)
        if self._bar is not None:
            self._bar.update(self._task, completed=int(row["step"]), info=info)
        elif time.monotonic() - self._last_line >= LOG_PERIOD_S:
            self._last_line = time.monotonic()
            self._print(f"  {escape(stage)}: step {row['step']}/{target} {escape(info)}")

    def attempt_finished(self, stage: str, number: int, report: dict[str, Any]) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
        cls = report.get("exit_class")
        colour = "green" if cls == "succeeded" else "red"
        extra = ""
        if report.get("suspects"):
            extra = "; suspects: " + ", ".join(f"{s['node']} ({s['reason']})" for s in report["suspects"])
        if report.get("error"):
            extra += f"; {report['error']}"
        self._print(f"  attempt {number}: [{colour}]{cls}[/] (exit {report.get('exit_code')}) in "
                    f"{report.get('duration_s', 0):.1f} s, last step {report.get('last_step')}{escape(extra)}")

    def table(self, title: str, rows: list[dict[str, Any]], columns: list[str]) -> None:
        if self.quiet or not rows:
            return
        from campaign.views import rows_table

        self.console.print(rows_table(title, rows, columns, HEADERS))

    def event(self, message: str) -> None:
        self._print(f"  [yellow]![/] {escape(message)}")

    def stage_finished(self, name: str, verdict: Any) -> None:
        took = time.monotonic() - self._started
        mark = "[green]passed[/]" if verdict.passed else "[red]failed[/]"
        self._print(f"stage {escape(name)}: {mark} in {took:.1f} s: {escape(verdict.reason)}")

    def campaign_finished(self, summary: dict[str, Any]) -> None:
        if self.quiet:
            return
        from campaign.views import campaign_table

        self.console.print(campaign_table(summary))
        colour = "green" if summary["state"] == "succeeded" else "red"
        self._print(f"campaign {escape(summary['name'])}: [{colour}]{summary['state']}[/]")


def _step_info(row: dict[str, Any]) -> str:
    parts = []
    if row.get("loss") is not None:
        parts.append(f"loss {row['loss']:.4f}")
    if row.get("tokens_per_s"):
        parts.append(f"{row['tokens_per_s']:,.0f} tok/s")
    if row.get("step_time_s"):
        parts.append(f"{row['step_time_s'] * 1000:.0f} ms/step")
    return "  ".join(parts)
