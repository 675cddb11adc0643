"""Rescue checkpoints: after a fault, one surviving DDP replica saves the last finished step.

Under DDP every rank holds the whole model, optimizer and scheduler, identical after each
step. When one rank crashes or hangs, the others still hold that state in memory: the work
since the last periodic checkpoint need not be recomputed (just-in-time checkpointing, Gupta
et al., EuroSys 2024). The flow:

1. The trainer says it can (`"rescue": true` in startup.json) and keeps, after every step,
   which step its state holds (`mark`), and a flag that is off while the optimizer changes it
   (`updating`).
2. On a crash or a stall the supervisor writes `rescue-request.json` into the run directory,
   naming one rank on a healthy node, and sends SIGUSR1 to the launch.
3. A rank whose collective failed (its peer crashed) does not exit at once: it lingers up to
   `run.rescue_linger_s` (20 s with the local launcher and srun, else 0:
   contract.LINGER_LAUNCHERS) for that signal. A rank blocked in a collective (its peer
   hangs) never returns to Python, so the signal's reader thread does the work.
4. The named rank saves, without any collective, a DCP checkpoint of the step its state
   holds (`step-NNNNNNNN/`, the same layout as a periodic one, one `rank-RRRRR.pt` per rank,
   `meta.json` with `"rescue": {"rank": R}`, `.complete` last, as `checkpoint.mark_complete`
   finishes every checkpoint). If the optimizer ran during the save (the rank was not
   stuck after all), the save is discarded. It writes `rescue.json` (saved or why not).
5. The supervisor waits for `rescue.json` (bounded), then stops the launch as before; the
   relaunch resumes from the newest complete checkpoint, now the rescued one.

Only where every rank holds the whole state: DDP, more than one rank, on the CPU or CUDA.
On CUDA the host queues the optimizer's kernels before it learns that a collective never
finished, so "the state holds step S" is kept on the device: `updating` records an event
on the compute stream just before the optimizer's kernels. While that event has not
completed, nothing queued after it has run, and the parameters and optimizer state in
device memory are still those of the step the loop last finished (it synchronizes after
every step). The save copies them on a stream of its own (the compute stream is stuck
behind the hung collective) and is kept only if the event is still pending afterwards.
This module imports torch only to save, so the supervisor can read its file names.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path
from typing import Any

from campaign import report
from campaign.rundir import RESCUE_REQUEST_FILE as REQUEST_FILE
from campaign.rundir import RESCUE_RESULT_FILE as RESULT_FILE


def supported(*, wrapper: str, world_size: int, device: Any) -> bool:
    """Whether every rank holds the whole state (DDP), where a save can tell whether it is
    the state of a finished step (CPU: updated synchronously; CUDA: the event guard)."""
    return wrapper == "ddp" and world_size > 1 and device.type in ("cpu", "cuda")


def peer_lost(exc: BaseException) -> bool:
    """Whether `exc` is a collective failing because a peer went away (gloo's "Connection
    closed by peer", NCCL's remote error, ...): this rank is a victim, its state intact. Its
    own errors (a bug, out of memory) are not: it must fail at once, as evidence."""
    from campaign import signatures

    lines = str(exc).splitlines() or [""]
    return any((sig := signatures.match(line)) is not None and sig.scope == "fabric" for line in lines)


class NoRescue:
    """The null rescue: the run cannot (FSDP, one rank, XPU) or was not asked to."""

    enabled = False

    def mark(self, step: int, tokens: int, data_position: int) -> None:
        pass

    def updating(self) -> None:
        pass

    def linger(self) -> None:
        pass


class Rescue:
    """One rank's side. `state()` returns (model, optim, sched) when a save is asked for."""

    enabled = True

    def __init__(self, *, run_dir: str, checkpoint_dir: str, rank: int, world_size: int,
                 keep_last: int, state: Any, cuda: bool = False, linger_s: float = 20.0,
                 before_write: Any = None) -> None:
        self.run_dir, self.root = Path(run_dir), Path(checkpoint_dir)
        self._before_write = before_write or (lambda step: None)  # a fault's hook (tests)
        self.rank, self.world_size, self.keep_last = rank, world_size, keep_last
        self._state, self.linger_s = state, linger_s
        self._lock = threading.Lock()
        self._held: tuple[int, int, int] | None = None  # (step, tokens, data_position) the state holds
        self._version = 0  # bumped whenever the optimizer starts changing the state
        self._update: Any = None  # CUDA: the event recorded just before the optimizer's kernels
        self._asked = threading.Event()
        self._finished = threading.Event()
        self._side = _side_stream(state) if cuda else None
        import torch.distributed.checkpoint  # noqa: F401 - 2.4 s on first import (H200 host): not during a rescue

    # --- the training loop's calls ---------------------------------------------------
    def mark(self, step: int, tokens: int, data_position: int) -> None:
        """The state now holds the end of `step` (the device finished it)."""
        with self._lock:
            self._held = (step, tokens, data_position)
            self._update = None

    def updating(self) -> None:
        """The optimizer is about to change the state. CPU: no save until the next `mark`.
        CUDA: the state on the device holds the last step until the event recorded here
        (before the optimizer's kernels are queued) completes."""
        with self._lock:
            self._version += 1
            if self._side is not None:
                import torch

                self._update = torch.cuda.Event()
                self._update.record()
            else:
                self._held = None

    def linger(self) -> None:
        """After a failed collective: wait for the supervisor's request (and, if this rank
        was asked, for its save) before the exception takes the process down."""
        if self._held is None:
            return
        if self._asked.wait(self.linger_s):
            self._finished.wait(self.linger_s + 600)  # a save that started is let finish (the supervisor bounds it)

    # --- the signal's side (the SIGUSR1 reader thread) -----------------------------------
    def on_signal(self) -> None:
        """SIGUSR1 (in the signal reader thread): answer in a thread of its own, so that a
        SIGTERM during the save is still handled."""
        threading.Thread(target=self._answer, name="campaign-rescue", daemon=True).start()

    def _answer(self) -> None:
        """Read the request; the named rank saves. Never raises."""
        try:
            request = json.loads((self.run_dir / REQUEST_FILE).read_text())
        except (OSError, ValueError):
            return  # not a rescue request (or not for this attempt): ignore
        with self._lock:
            if self._asked.is_set():
                return
            self._asked.set()
        try:
            if int(request.get("rank", -1)) == self.rank:
                result = self._save()
                report.write_json_atomic(self.run_dir / RESULT_FILE, {"rank": self.rank, **result})
        except Exception as exc:  # noqa: BLE001 - the supervisor must hear why, not a dead thread
            report.write_json_atomic(self.run_dir / RESULT_FILE,
                                     {"rank": self.rank, "saved": False, "why": f"{type(exc).__name__}: {exc}"})
        finally:
            self._finished.set()

    def _save(self) -> dict[str, Any]:
        t0 = time.perf_counter()
        with self._lock:
            held, version, update = self._held, self._version, self._update
        if held is None or (update is not None and update.query()):
            return {"saved": False, "why": "the state was being updated (mid optimizer step)"}
        step, tokens, position = held
        newest = [c["step"] for c in report.list_checkpoints(self.root) if c["complete"]]
        if step == 0 or (newest and newest[-1] >= step):
            return {"saved": False, "covered": True, "step": step,
                    "why": f"step {step} is already covered by a complete checkpoint"}
        from campaign.train.checkpoint import mark_complete

        path = self.root / report.checkpoint_name(step)
        shutil.rmtree(path, ignore_errors=True)  # an incomplete periodic save of the same step
        path.mkdir(parents=True)
        self._before_write(step)
        model, optim, sched = self._state()
        state = capture(model, optim, self._side)  # CUDA: copied to host; CPU: the live tensors
        # The optimizer began meanwhile (host: a new version; device: its event passed)?
        moved = self._version != version or (update is not None and update.query())
        if not moved:
            write_replica(path, state, sched, world_size=self.world_size, device=next(model.parameters()).device)
            moved = self._version != version  # on the CPU the write read the live tensors
        if moved:
            shutil.rmtree(path, ignore_errors=True)  # no `.complete`: nothing a resume would take
            return {"saved": False, "step": step, "why": "the optimizer ran during the save: discarded"}
        mark_complete(str(self.root), path, step=step, tokens=tokens, data_position=position,
                      world_size=self.world_size, keep_last=self.keep_last, rescue={"rank": self.rank})
        return {"saved": True, "step": step, "tokens": tokens, "path": str(path),
                "seconds": round(time.perf_counter() - t0, 3)}


def _side_stream(state: Any) -> Any:
    """A CUDA stream on the model's device (not the current device of whichever thread asks:
    that is per thread), made ready while the device is idle: on an H200 the first use of a
    new stream and the first pinned allocation waited for the compute stream."""
    import torch

    device = next(state()[0].parameters()).device
    side = torch.cuda.Stream(device=device)
    with torch.cuda.stream(side):
        torch.empty(1, pin_memory=True).copy_(torch.zeros(1, device=device), non_blocking=True)
    side.synchronize()
    return side


def capture(model, optim, side: Any = None) -> dict[str, Any]:
    """This rank's replica ({"model", "optim"}, `replica_state`). On CUDA (`side`, a stream of
    the model's device) copied into pinned host memory on that stream, finished on return:
    the compute stream may be stuck behind a collective, and neither the copy nor its wait
    may queue behind it. On the CPU the live tensors themselves."""
    import contextlib

    import torch

    with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
        state = _to_host(replica_state(model, optim))
    if side is not None:
        side.synchronize()
    return state


def write_replica(path: Path, state: dict[str, Any], sched, *, world_size: int, device: Any) -> None:
    """The captured replica as a checkpoint any world size loads: DCP shards written by one
    process (no collective), and the same RNG and scheduler state for every rank (DDP ranks
    share the seed and step in lockstep)."""
    import warnings

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter

    from campaign.train.checkpoint import rank_state

    with warnings.catch_warnings():  # "assuming the intent is to save in a single process": it is
        warnings.simplefilter("ignore", UserWarning)
        dcp.save(state, storage_writer=FileSystemWriter(path, sync_files=True), no_dist=True)
    buf = rank_state(device, sched)
    for r in range(world_size):
        report.write_durable(path / f"rank-{r:05d}.pt", buf)


def replica_state(model, optim) -> dict[str, Any]:
    """{"model", "optim"} in the layout of DCP's `get_state_dict` (the periodic checkpoints'
    and the loader's: names without DDP's leading `module.` nor compile's `_orig_mod.`,
    optimizer state and groups by name), built from references alone. `get_state_dict` itself
    waits for the device: on an H200 it returned only once a stuck compute stream had moved on."""

    def fqn(name: str) -> str:
        parts = [p for p in name.split(".") if p != "_orig_mod"]
        return ".".join(parts[1:] if parts[:1] == ["module"] else parts)

    names = {p: fqn(n) for n, p in model.named_parameters()}
    msd = {fqn(k): v for k, v in model.state_dict().items()}
    state = {names[p]: dict(optim.state[p]) for g in optim.param_groups for p in g["params"] if p in optim.state}
    groups = [{**{k: v for k, v in g.items() if k != "params"}, "params": [names[p] for p in g["params"]]}
              for g in optim.param_groups]
    return {"model": msd, "optim": {"state": state, "param_groups": groups}}


def _to_host(obj: Any) -> Any:
    """`obj` with every device tensor copied into pinned host memory without blocking, on the
    current stream (a plain `.to("cpu")` into pageable memory waited for the compute stream
    on the H200); host tensors as they are. Synchronize the stream before reading."""
    import torch

    if isinstance(obj, torch.Tensor):
        t = obj.detach()
        if t.device.type == "cpu":
            return t
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        return host.copy_(t, non_blocking=True)
    if isinstance(obj, dict):
        return {k: _to_host(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_host(v) for v in obj)
    return obj
