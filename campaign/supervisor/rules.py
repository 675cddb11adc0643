"""The watch loop as an ordered tuple of small named rules (`WATCH_RULES`), applied in order
on each poll; the first that returns a `WatchOutcome` ends the watch (it has stopped the
launch, or the launch ended by itself). A rule that returns None lets the next one look; some
only note what later rules read (the observation, the first failure, the watchdog's
decision).

    run_dir_lost        the run directory was deleted: SIGKILL the launch      rundir_lost
    launch_ended        every process exited                                   (interrupt)
    observe             read the trainer's files (or rank 0's output)
    stop_file           STOP in the run directory                              stop
    interrupt_at_step   the resume test's step (and checkpoint) reached       interrupt
    interrupt_given_up  no checkpoint by the give-up step                      interrupt
    first_failure       note the first rank that failed
    rescue_after_crash  ask a healthy replica for a rescue checkpoint
    failed_rank         the failed rank's grace is over: stop the rest         (None: the exit is the evidence)
    judge               the stall watchdog's decision (heartbeats confirm an early stall)
    exit_hung           the trainer finished but the launch does not exit      exit_hung
    stalled_or_timeout  a stall, or the hard timeout                           stalled, timeout
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from campaign import contract, report, rundir, runfiles, watchdog
from campaign.evidence import Suspect
from campaign.exits import StopReason
from campaign.rundir import STOP_FILE
from campaign.supervisor.launch import SECOND_TERM_S, Failure, _Launch, launcher_failure
from campaign.supervisor.reading import Observer, note_checkpoints
from campaign.supervisor.rescue import NOT_FAULTS, RescueResult, _rescue

if TYPE_CHECKING:
    from campaign.attempt import AttemptRequest, Interrupt

POLL_S = 0.25
"""How often the supervisor looks at the launch; cheap (a few small reads)."""
FAILED_RANK_GRACE_S = 10.0
"""After one rank failed, how long the others get to exit by themselves."""


@dataclass
class WatchOutcome:
    """How the watch ended: why the supervisor stopped the launch (None: it ended by itself or
    after a rank failed) and what it knows of a stall."""

    killed_by: StopReason | None = None
    final_event: str | None = None
    stall: str | None = None
    suspects: list[Suspect] = field(default_factory=list)
    detected_after_s: float | None = None
    rescue: RescueResult | None = None


@dataclass
class Watching:
    """What the rules share: the launch, what was read of it, and what earlier rules noted this poll."""

    launch: _Launch
    request: AttemptRequest
    active: list[str]
    start: float
    observer: Observer
    folder: tuple[int, int] | None
    now: float = 0.0
    rescued: RescueResult | None = None
    failure: Failure | None = None
    logged: Failure | None = None
    """The failure the launcher's log named while it runs (srun): the evidence, no grace needed."""
    decision: watchdog.Decision | None = None

    @property
    def run_dir(self) -> Path:
        return Path(self.request.run_dir)

    @property
    def watch(self) -> watchdog.Watch:
        return self.observer.watch


Rule = Callable[[Watching], WatchOutcome | None]


def run_dir_lost(w: Watching) -> WatchOutcome | None:
    if _identity(w.run_dir) == w.folder:
        return None
    # Deleted under the launch: its rows and heartbeats go nowhere now.
    (w.run_dir / rundir.LOGS_DIR).mkdir(parents=True, exist_ok=True)
    # SIGKILL, not SIGTERM: a save on SIGTERM would put steps whose rows went with the folder
    # behind the relaunch's checkpoint; from the last periodic one, the relaunch records them again.
    w.launch.signal(signal.SIGKILL)
    w.launch.wait(timeout=10.0)
    return WatchOutcome(killed_by=StopReason.RUNDIR_LOST, stall=f"the run directory {w.run_dir} was deleted under "
                        "the launch: made it again and killed the launch; the relaunch resumes from the newest "
                        "complete checkpoint")


def launch_ended(w: Watching) -> WatchOutcome | None:
    if not w.launch.done:
        return None
    interrupt = w.request.interrupt
    reached = interrupt is not None and w.watch.last_step >= interrupt.after_step
    return WatchOutcome(killed_by=StopReason.INTERRUPT if reached else None, rescue=w.rescued)


def observe(w: Watching) -> None:
    seen = w.observer.poll(w.now).seen
    if w.request.checkpoint_layout is not None:
        note_checkpoints(w.request, seen, w.start)


def stop_file(w: Watching) -> WatchOutcome | None:
    if not (w.run_dir / STOP_FILE).exists():
        return None
    w.launch.stop(time.time)
    return WatchOutcome(killed_by=StopReason.STOP)


def interrupt_at_step(w: Watching) -> WatchOutcome | None:
    i = w.request.interrupt
    if not (i and w.watch.last_step >= i.after_step and _checkpoint_ready(i, w.request, w.start)):
        return None
    w.launch.signal(getattr(signal, i.signal))
    w.launch.wait(timeout=30.0)
    return WatchOutcome(killed_by=StopReason.INTERRUPT)


def interrupt_given_up(w: Watching) -> WatchOutcome | None:
    i = w.request.interrupt
    if not (i and i.give_up_step and w.watch.last_step >= i.give_up_step):
        return None
    w.launch.stop(time.time)
    return WatchOutcome(killed_by=StopReason.INTERRUPT, stall=f"no complete checkpoint of step "
                        f"{i.checkpoint_step} or later by step {w.watch.last_step}")


def first_failure(w: Watching) -> None:
    w.logged = w.launch.logged_failure(w.now)
    w.failure = w.launch.first_failure() or w.logged


def rescue_after_crash(w: Watching) -> None:
    failure = w.failure
    if failure is None or not w.watch.rescue or w.rescued is not None or failure.exit_code in NOT_FAULTS:
        return
    # A rank died: the survivors linger (their collective failed) for the rescue request.
    if failure.rank == -1:
        failure = launcher_failure(rundir.launcher_log(w.run_dir), failure)
    w.rescued = _rescue(w.launch, w.request, w.active, w.watch, runfiles.read_heartbeats(w.run_dir),
                        avoid_nodes={failure.node}, avoid_ranks={failure.rank})


def failed_rank(w: Watching) -> WatchOutcome | None:
    # The launcher's log line is the evidence: nothing more to wait for once the rescue (if
    # any) is over. Ranks of their own get a grace to report their own failure.
    failure = w.failure
    if failure is None or not (failure is w.logged or w.now - failure.seen > FAILED_RANK_GRACE_S):
        return None
    w.launch.stop(time.time)
    return WatchOutcome(killed_by=None, rescue=w.rescued)  # the failed rank's exit is the evidence


def judge(w: Watching) -> None:
    watch, policy, now = w.watch, w.request.watchdog, w.now
    w.decision = watchdog.decide(watch, policy, now)
    early = watchdog.early_budget(watch, policy)
    if w.decision.stalled or early is None or now - watch.last_progress <= early or w.failure is not None:
        return
    # Silent for longer than the confirmed budget: do the heartbeats show who hangs?
    beats = runfiles.read_heartbeats(w.run_dir)
    found = watchdog.culprits(beats, w.active, now, policy) if beats else []
    if watchdog.stall_pattern(found, watch, policy):
        w.decision = watchdog.decide(watch, policy, now, confirmed="compute")
    elif watchdog.collective_hang(beats, w.active, watch, policy):
        w.decision = watchdog.decide(watch, policy, now, confirmed="collective")


def exit_hung(w: Watching) -> WatchOutcome | None:
    decision = w.decision
    if decision is None or not decision.stalled or decision.phase != "exiting":
        return None
    # Every rank finished but the launch does not exit (e.g. srun waiting on a lost
    # socket): the training outcome is known; stop the launcher, do not call it a stall.
    left = [r for i, (r, _, _) in enumerate(w.launch.procs) if i not in w.launch.exits and r >= 0]
    w.launch.stop(time.time)
    what = (f"rank(s) {left} did not exit {decision.idle_s:.0f} s after rank 0 reported its last step "
            f"({w.watch.last_step}) and exited 0 (their output is not read: progress: stdout reads rank 0's); "
            "stopped them" if w.observer.stdout and left else
            f"the launch did not exit {decision.idle_s:.0f} s after the trainer finished; stopped it")
    return WatchOutcome(killed_by=StopReason.EXIT_HUNG, final_event=w.watch.final_event, stall=what)


def stalled_or_timeout(w: Watching) -> WatchOutcome | None:
    decision, watch, now, timeout = w.decision, w.watch, w.now, w.request.timeout_s
    stalled = decision is not None and decision.stalled
    if w.failure is not None or not (stalled or now - w.start > timeout):
        return None
    reason = (decision.reason if decision is not None and stalled else
              f"hard timeout of {timeout:g} s (the stage's timeout_s) at step {watch.last_step or 'none'}, "
              f"{now - watch.last_progress:.0f} s after the last progress")
    beats = runfiles.read_heartbeats(w.run_dir)
    # A trainer read through its output (progress: stdout) writes no heartbeats: their absence is no evidence.
    suspects = watchdog.culprits(beats, w.active, now, w.request.watchdog) if beats or not w.observer.stdout else []
    if watch.rescue:
        w.rescued = _rescue(w.launch, w.request, w.active, watch, beats, avoid_nodes={s.node for s in suspects},
                            avoid_ranks={s.evidence.get("rank") for s in suspects})
    # A hard timeout may meet a slow but working trainer: one SIGTERM, its stop at a step boundary.
    w.launch.stop(time.time, SECOND_TERM_S if stalled else None)
    return WatchOutcome(killed_by=StopReason.STALLED if stalled else StopReason.TIMEOUT, stall=reason,
                        suspects=suspects, detected_after_s=round(now - watch.last_progress, 2), rescue=w.rescued)


WATCH_RULES: tuple[Rule, ...] = (run_dir_lost, launch_ended, observe, stop_file, interrupt_at_step,
                                 interrupt_given_up, first_failure, rescue_after_crash, failed_rank, judge, exit_hung,
                                 stalled_or_timeout)
"""In order: the first that returns an outcome ends the watch."""


def watch_launch(launch: _Launch, request: AttemptRequest, active: list[str], start: float,
                 observer: Observer) -> WatchOutcome:
    """Wait for the launch; stop it on a stall, a failed rank, the hard timeout, STOP or an interrupt."""
    w = Watching(launch, request, active, start, observer, folder=_identity(Path(request.run_dir)))
    while True:
        w.now = time.time()
        launch.poll(w.now)
        for rule in WATCH_RULES:
            if (outcome := rule(w)) is not None:
                return outcome
        time.sleep(POLL_S)


def _identity(folder: Path) -> tuple[int, int] | None:
    """(device, inode) of `folder`, None when it is gone: a folder deleted and made again differs."""
    try:
        st = folder.stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _checkpoint_ready(interrupt: Interrupt, request: AttemptRequest, start: float) -> bool:
    if request.checkpoint_layout is not None and interrupt.checkpoint_step is not None:
        folder = request.targets.checkpoint_dir if request.targets is not None else request.env["CAMPAIGN_CHECKPOINT_DIR"]
        return contract.checkpoint_since(request.checkpoint_layout, folder,
                                         interrupt.checkpoint_step, start) is not None
    path = interrupt.after_checkpoint
    return path is None or (Path(path) / report.COMPLETE_MARKER).exists()
