"""What `campaign submit` shows while it works.

On a terminal: one Rich progress bar per stage (steps of the running attempt against its
target, ETA), with the attempt number, tokens, current loss, tokens/s and step time beside
it; stage, attempt and watchdog events (stalls, exclusions, relaunches) print above the
bars as they happen. In a plain log (not a TTY): the same events, one line each, and at
most one progress line per stage every `interval` seconds, with no control characters:

    long-run #2: step 120/157 (76%)  tokens 61.4K  loss 1.4321  5,120 tok/s  41 ms/step  eta 0:00:05

The engine calls the methods below; each may take more keyword arguments later.
"""

from __future__ import annotations

import atexit
import datetime as dt
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
from rich.progress import Progress as RichProgress

from campaign.exits import ExitClass

HEADERS = {"step_time_s": "step s", "tokens_per_s": "tok/s", "comm_time_s": "comm s", "comm_share": "comm %",
           "mem_peak_gib": "mem GiB", "loss": "loss", "efficiency": "eff"}
"""Short column names for the tables printed during a run."""
LOG_PERIOD_S = 10.0
"""Plain logs get at most one progress line per stage per this many seconds."""


class Progress:
    """Receives engine events and renders them; `quiet=True` renders nothing.

    `interval`: seconds between progress lines in a plain log; `clock`: a monotonic clock
    (tests pass a fake one, as Rich's `Progress(get_time=...)`)."""

    def __init__(self, file: TextIO | None = None, *, quiet: bool = False, force_terminal: bool | None = None,
                 interval: float = LOG_PERIOD_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.console = Console(file=file or sys.stdout, force_terminal=force_terminal, highlight=False)
        if not self.console.is_terminal:
            self.console = Console(file=file or sys.stdout, highlight=False, width=120)
        self.quiet, self.interval, self.clock = quiet, interval, clock
        self._bars: RichProgress | None = None
        self._tasks: dict[str, Any] = {}
        self._attempt: dict[str, int] = {}
        self._last_line: dict[str, float] = {}
        self._rate_origin: dict[str, tuple[float, int]] = {}
        self._started = 0.0

    @property
    def live(self) -> bool:
        """Bars drawn in place (a terminal), rather than lines in a log."""
        return self.console.is_terminal and not self.quiet

    def _print(self, text: str) -> None:
        if not self.quiet:
            self.console.print(text)

    def _start_bars(self) -> RichProgress:
        if self._bars is None:
            self._bars = RichProgress(TextColumn("  {task.description}"), BarColumn(bar_width=30), MofNCompleteColumn(),
                                      TimeRemainingColumn(), TextColumn("{task.fields[info]}"), console=self.console,
                                      get_time=self.clock)
            self._bars.start()
            atexit.register(self.close)
        return self._bars

    def close(self) -> None:
        """Stop drawing bars (idempotent); the engine's last call does it too."""
        if self._bars is not None:
            self._bars.stop()
            self._bars = None
            self._tasks.clear()

    def campaign_started(self, name: str, ledger_url: str, n_stages: int, **_: Any) -> None:
        self._print(f"[bold]campaign {escape(name)}[/]: {n_stages} stage(s); ledger {escape(ledger_url)}")

    def stage_started(self, name: str, kind: str, position: int, total: int, **_: Any) -> None:
        self._started = self.clock()
        self._print(f"[bold cyan]stage {position + 1}/{total} {escape(name)}[/] ({kind}) started")
        if self.live:
            self._tasks[name] = self._start_bars().add_task(escape(name), total=None, info="")

    def stage_skipped(self, name: str, why: str, **_: Any) -> None:
        self._print(f"stage {escape(name)}: skipped ({escape(why)})")

    def attempt_started(self, stage: str, number: int, nodes: int | list[str], steps: int, label: str = "",
                        **_: Any) -> None:
        """`nodes`: how many active nodes (or their names); which ones the supervisor picks
        is reported in attempt_finished."""
        count = nodes if isinstance(nodes, int) else len(nodes)
        self._attempt[stage] = number
        self._last_line.pop(stage, None)
        self._rate_origin.pop(stage, None)
        self._print(f"  attempt {number}{' (' + escape(label) + ')' if label else ''}: {steps} steps on {count} node(s)")
        if self.live:
            bars = self._start_bars()
            desc = escape(f"{stage} #{number}" + (f" {label}" if label else ""))
            if stage in self._tasks:
                bars.reset(self._tasks[stage], total=steps, description=desc, info="starting")
            else:
                self._tasks[stage] = bars.add_task(desc, total=steps, info="starting")

    def steps(self, stage: str, row: dict[str, Any], target: int, **_: Any) -> None:
        """The newest step row of the running attempt of `stage` (called about once a second)."""
        now, step = self.clock(), int(row["step"])
        origin = self._rate_origin.setdefault(stage, (now, step))
        if self.live and stage in self._tasks and self._bars is not None:
            self._bars.update(self._tasks[stage], completed=step, total=target, info=escape(step_info(row)))
            return
        last = self._last_line.get(stage)
        if last is not None and now - last < self.interval and step < target:  # the last step always shows
            return
        self._last_line[stage] = now
        self._print(escape(progress_line(stage, self._attempt.get(stage), row, target, eta_s(origin, now, step, target))))

    def attempt_finished(self, stage: str, number: int, report: dict[str, Any], **_: Any) -> None:
        cls = report.get("exit_class")
        colour = "green" if cls == ExitClass.SUCCEEDED else "red"
        extra = ""
        if report.get("suspects"):
            extra = "; suspects: " + ", ".join(f"{s['node']} ({s['reason']})" for s in report["suspects"])
        if report.get("error"):
            extra += f"; {report['error']}"
        nodes = report.get("nodes") or []
        shown = ", ".join(nodes[:6]) + (" ..." if len(nodes) > 6 else "")
        self._print(f"  attempt {number}: [{colour}]{cls}[/] (exit {report.get('exit_code')}) in "
                    f"{report.get('duration_s', 0):.1f} s on \\[{escape(shown)}], last step "
                    f"{report.get('last_step')}{escape(extra)}")

    def table(self, title: str, rows: list[dict[str, Any]], columns: list[str], **_: Any) -> None:
        if self.quiet or not rows:
            return
        from campaign.views import rows_table

        self.console.print(rows_table(title, rows, columns, HEADERS))

    def event(self, message: str, **_: Any) -> None:
        """A watchdog action, an exclusion, a relaunch: always printed, one line."""
        self._print(f"  [yellow]![/] {escape(message)}")

    def note(self, text: str, **_: Any) -> None:
        """A line to copy (a command such as `wandb sync ...`): printed whole, never wrapped."""
        if not self.quiet:
            self.console.print(escape(text), soft_wrap=True)

    def stage_finished(self, name: str, verdict: Any, **_: Any) -> None:
        took = self.clock() - self._started
        task = self._tasks.pop(name, None)
        if task is not None and self._bars is not None:
            self._bars.remove_task(task)
        mark = "[green]passed[/]" if verdict.passed else "[red]failed[/]"
        self._print(f"stage {escape(name)}: {mark} in {took:.1f} s: {escape(verdict.reason)}")

    def campaign_finished(self, summary: dict[str, Any], **_: Any) -> None:
        self.close()
        if self.quiet:
            return
        from campaign.views import campaign_table

        self.console.print(campaign_table(summary))
        colour = "green" if summary["state"] == "succeeded" else "red"
        self._print(f"campaign {escape(summary['name'])}: [{colour}]{summary['state']}[/]")


def step_info(row: dict[str, Any]) -> str:
    """`tokens 61.4K  loss 1.4321  5,120 tok/s  41 ms/step` from a step row (what it has)."""
    from campaign.views import fmt_tokens

    parts = []
    if row.get("tokens") is not None:
        parts.append(f"tokens {fmt_tokens(int(row['tokens']))}")
    if row.get("loss") is not None:
        parts.append(f"loss {row['loss']:.4f}")
    if row.get("tokens_per_s"):
        parts.append(f"{row['tokens_per_s']:,.0f} tok/s")
    if row.get("step_time_s"):
        parts.append(f"{row['step_time_s'] * 1000:.0f} ms/step")
    return "  ".join(parts)


def eta_s(origin: tuple[float, int], now: float, step: int, target: int) -> float | None:
    """Seconds to `target` at the rate seen since `origin` (time, step); None before any progress."""
    t0, s0 = origin
    if step <= s0 or now <= t0:
        return None
    return max(0.0, (target - step) * (now - t0) / (step - s0))


def progress_line(stage: str, attempt: int | None, row: dict[str, Any], target: int, eta: float | None) -> str:
    """One plain-log progress line (no markup, no control characters)."""
    step = int(row["step"])
    pct = f" ({100 * step // target}%)" if target else ""
    name = f"{stage} #{attempt}" if attempt else stage
    eta_text = f"  eta {dt.timedelta(seconds=round(eta))}" if eta is not None else ""
    return f"  {name}: step {step}/{target}{pct}  {step_info(row)}{eta_text}"
