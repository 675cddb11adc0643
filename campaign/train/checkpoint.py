"""Checkpoints: `<checkpoint_dir>/step-NNNNNNNN/`, written with torch.distributed.checkpoint.

A checkpoint holds: DCP shards of the model and optimizer (`*.distcp`, `.metadata`); one
`rank-RRRRR.pt` per rank with its RNG states (torch, CUDA/XPU, python) and LR scheduler;
`meta.json` (step, tokens, data_position, time, world_size, and the size of every file);
and `.complete`, written last by rank 0 once every file is durable (fsynced).

`Saver` writes them synchronously (DCP `save`, training waits for the disk) or
asynchronously (DCP `async_save`): the state is staged into CPU memory (pinned, on a side
stream, on CUDA, as torchtitan's `async_with_pinned_mem`), training goes on, and a
background thread writes the shards over a gloo group of its own (so its collectives never
interleave with the training's). Rank 0 writes `meta.json` and `.complete` only after
DCP's save returned on rank 0, which happens after every rank's shards are written and
fsynced (DCP gathers every rank's write results before it writes `.metadata`); a process
killed mid-save leaves a checkpoint without `.complete`, which loading ignores. At most one
save is in flight: a new save, the final one and a stop wait for the previous.

Loading picks the newest complete checkpoint whose files match the sizes in meta.json and
that DCP reads without error (agreed by all ranks); otherwise it warns on stderr and falls
back to the previous one.
"""

from __future__ import annotations

import json
import random
import shutil
import sys
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from campaign import report


def _rng_state(device: torch.device) -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    elif device.type == "xpu":
        state["xpu"] = torch.xpu.get_rng_state(device)
    return state


def _set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)
    if "xpu" in state and device.type == "xpu":
        torch.xpu.set_rng_state(state["xpu"], device)


def _warn(msg: str) -> None:
    print(f"campaign.train: WARNING: {msg}", file=sys.stderr, flush=True)


def mark_complete(root: str, path: Path, *, step: int, tokens: int, data_position: int,
                  world_size: int, keep_last: int, **extra: Any) -> None:
    """Rank 0, once every rank's files are durable: meta.json (with `extra`), then `.complete`
    (the helper a trainer of your own calls too), then prune."""
    report.complete_checkpoint(path, step=step, tokens=tokens, rank=0, data_position=data_position,
                               world_size=world_size, **extra)
    prune(root, keep_last)


def rank_state(device: torch.device, sched) -> bytes:
    """A rank's `rank-RRRRR.pt`: its RNG states and the LR scheduler (the CUDA generator's
    state is a host-side seed and offset: reading it waits for no stream)."""
    return _torch_bytes({"rng": _rng_state(device), "scheduler": sched.state_dict()})


class _Writer(FileSystemWriter):
    """DCP's file writer (fsync on) that first calls `before_write` (a fault's hook)."""

    def __init__(self, path: Path, before_write: Callable[[], None], *, keep_staged: bool = False) -> None:
        super().__init__(path, sync_files=True, cache_staged_state_dict=keep_staged)
        self._before_write = before_write

    def aim(self, before_write: Callable[[], None]) -> _Writer:
        """The same writer (its pinned staging buffers kept) for the next save's hook."""
        self._before_write = before_write
        return self

    def write_data(self, plan, planner):
        """Write this rank's shards, then checksum them (`report.write_rank_checksums`): each
        rank reads back only its own files while they are in its page cache, in parallel with
        the other ranks, so rank 0's `complete_checkpoint` does not read the whole checkpoint."""
        self._before_write()
        fut = super().write_data(plan, planner)
        results = fut.wait()  # FileSystemWriter writes before it returns: the future is done
        names = sorted({r.storage_data.relative_path for r in results})
        report.write_rank_checksums(self.path, dist.get_rank() if dist.is_initialized() else 0, names)
        return fut


@dataclass
class Saved:
    """One finished save, as the `checkpoint_saved` event reports it."""

    step: int
    tokens: int
    path: str
    seconds: float
    """From the start of the save until `.complete` (data durable)."""
    stall_s: float
    """How long training was blocked by this save (staging, and any wait for it)."""
    asynchronous: bool


@dataclass
class _InFlight:
    saved: Saved
    started: float
    staging: Future | None
    """CUDA: the pinned-memory copy, running on a side stream (None when staged already)."""
    done: Future
    """The upload, then (rank 0) meta.json and `.complete`; its result is the time it ended."""


class Saver:
    """Saves checkpoints of one run into `root`; collective: every rank calls the same
    methods at the same steps. `on_saved` is called (in the training thread) once a save is
    durable. `before_write(step)` is a fault hook called in the thread that writes a shard."""

    def __init__(self, root: str, *, device: torch.device, keep_last: int, asynchronous: bool,
                 on_saved: Callable[[Saved], None],
                 before_write: Callable[[int], None] | None = None) -> None:
        self.root, self.device, self.keep_last = root, device, keep_last
        self.asynchronous, self.on_saved = asynchronous, on_saved
        self.before_write = before_write or (lambda step: None)
        self._inflight: _InFlight | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._group = self._stager = None
        self._pinned: _Writer | None = None
        if asynchronous:  # collective (every rank builds its Saver at start-up), not per save
            self._group = dist.new_group(backend="gloo")
            self._stager = _stager(device)

    @property
    def in_flight(self) -> bool:
        return self._inflight is not None

    def save(self, *, step: int, tokens: int, data_position: int, model, optim, sched) -> None:
        """Start a save of the current state (sync: finish it); waits for the previous one.
        The device must have finished the step (the loop waits for each step before it saves
        it): the staging copy runs on a stream of its own that does not wait for the compute
        stream. With overlapped steps the next step's forward and backward may run there
        meanwhile; they change no saved state (parameters and optimizer state change only in
        the update, which waits for the copy: `before_update`)."""
        self.wait()
        t0 = time.perf_counter()
        rank = dist.get_rank()
        path = Path(self.root) / report.checkpoint_name(step)
        if rank == 0:  # a stale (e.g. corrupted) checkpoint of the same step must not look complete
            (path / report.COMPLETE_MARKER).unlink(missing_ok=True)
            (path / report.META_FILE).unlink(missing_ok=True)
            path.mkdir(parents=True, exist_ok=True)
        dist.barrier()
        report.write_durable(path / f"rank-{rank:05d}.pt", rank_state(self.device, sched))  # checksummed by rank 0
        msd, osd = get_state_dict(model, optim)
        state = {"model": msd, "optim": osd}
        writer = self._writer(path, lambda: self.before_write(step))
        saved = Saved(step, tokens, str(path), 0.0, 0.0, self.asynchronous)
        finish = (path, step, tokens, data_position)
        if not self.asynchronous:
            dcp.save(state, storage_writer=writer)
            dist.barrier()
            if rank == 0:
                self._complete(*finish)
            saved.seconds = saved.stall_s = time.perf_counter() - t0
            self.on_saved(saved)
            return
        staging, upload = self._async_save(state, writer, path)
        done = self._threads().submit(self._finish_upload, upload, *finish)
        self._inflight = _InFlight(saved, t0, staging, done)
        saved.stall_s = time.perf_counter() - t0

    def _writer(self, path: Path, before_write: Callable[[], None]) -> _Writer:
        """A writer for `path`. Async on CUDA without DefaultStager (torch < 2.13): one writer
        kept across saves, staging into pinned CPU buffers it allocates once
        (`cache_staged_state_dict`, torchtitan's async_with_pinned_mem before DefaultStager);
        DCP's default allocates pageable CPU memory per save, which blocked training on the
        H200 about as long as a synchronous save (docs/performance.md, "Checkpoint stall", a history note)."""
        if not (self.asynchronous and self._stager is None and self.device.type == "cuda"):
            return _Writer(path, before_write)
        if self._pinned is None:
            self._pinned = _Writer(path, before_write, keep_staged=True)
        return self._pinned.aim(before_write)

    def _async_save(self, state: dict, writer: FileSystemWriter, path: Path) -> tuple[Future | None, Future]:
        stager = {"async_stager": self._stager} if self._stager is not None else {}
        resp = dcp.async_save(state, checkpoint_id=path, storage_writer=writer, process_group=self._group, **stager)
        # An AsyncSaveResponse when staging runs in the background (CUDA), else one Future.
        return getattr(resp, "staging_completion", None), getattr(resp, "upload_completion", resp)

    def _threads(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="campaign-checkpoint")
        return self._pool

    def _finish_upload(self, upload: Future, path: Path, step: int, tokens: int,
                       data_position: int) -> float:
        upload.result()  # on rank 0: every rank's shards are written and fsynced
        if dist.get_rank() == 0:
            self._complete(path, step, tokens, data_position)
        return time.perf_counter()

    def _complete(self, path: Path, step: int, tokens: int, data_position: int) -> None:
        mark_complete(self.root, path, step=step, tokens=tokens, data_position=data_position,
                      world_size=dist.get_world_size(), keep_last=self.keep_last)

    def before_update(self) -> None:
        """Call before the optimizer changes the state: the staging copy must be finished."""
        f = self._inflight
        if f is not None and f.staging is not None:
            t0 = time.perf_counter()
            f.staging.result()
            f.saved.stall_s += time.perf_counter() - t0
            f.staging = None

    def poll(self) -> None:
        """Report the save in flight if it has finished (never blocks)."""
        if self._inflight is not None and self._inflight.done.done():
            self.wait()

    def wait(self) -> None:
        """Block until the save in flight (if any) is durable, then report it."""
        f = self._inflight
        if f is None:
            return
        self.before_update()
        t0 = time.perf_counter()
        ended = f.done.result()  # a failed save raises here, in the training thread
        f.saved.stall_s += time.perf_counter() - t0
        f.saved.seconds = ended - f.started
        self._inflight = None
        self.on_saved(f.saved)

    def close(self) -> None:
        """Wait for the save in flight; release the staging memory and threads."""
        self.wait()
        if self._stager is not None:
            self._stager.close()
        if self._pool is not None:
            self._pool.shutdown()


def prune(root: str, keep_last: int) -> None:
    """Keep the newest `keep_last` complete checkpoints; drop older and stale incomplete ones."""
    cks = report.list_checkpoints(root)
    complete = [c for c in cks if c["complete"]]
    if not complete:
        return
    keep = {c["path"] for c in complete[-keep_last:]}
    newest = complete[-1]["step"]
    for c in cks:
        if c["path"] not in keep and c["step"] < newest:
            shutil.rmtree(c["path"], ignore_errors=True)


def verify(path: str) -> str | None:
    """None if the checkpoint's files match meta.json (sizes and checksums); else what is wrong."""
    return report.check_checkpoint_files(path)


def _broadcast(obj: Any) -> Any:
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def load_latest(root: str, *, model, optim, sched, device: torch.device,
                skipped: list[dict[str, str]] | None = None) -> dict | None:
    """Collective. Load the newest good complete checkpoint; returns its meta.json (with
    "path", the folder really loaded) or None. Each newer one that failed its checks or its
    load is appended to `skipped` ({"path", "why"}) and the previous one is tried."""
    rank = dist.get_rank()
    candidates = [c["path"] for c in report.list_checkpoints(root) if c["complete"]]
    candidates = _broadcast(candidates[::-1] if rank == 0 else None)
    for path in candidates:
        problem = _broadcast(verify(path) if rank == 0 else None)
        if problem is None:
            problem = _try_load(path, model, optim, sched, device)
        if problem is None:
            return {**json.loads((Path(path) / report.META_FILE).read_text()), "path": path}
        if skipped is not None:
            skipped.append({"path": path, "why": problem})
        if rank == 0:
            _warn(f"skipping checkpoint {path}: {problem}; trying the previous one")
    return None


def _try_load(path: str, model, optim, sched, device: torch.device) -> str | None:
    """Load on every rank; all ranks agree whether it worked."""
    problem = None
    try:
        msd, osd = get_state_dict(model, optim)
        state = {"model": msd, "optim": osd}
        dcp.load(state, checkpoint_id=path)
        set_state_dict(model, optim, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])
        extra = Path(path) / f"rank-{dist.get_rank():05d}.pt"
        if extra.exists():
            rank_state = torch.load(extra, weights_only=False)
            _set_rng_state(rank_state["rng"], device)
            sched.load_state_dict(rank_state["scheduler"])
        else:
            _warn(f"{extra.name} missing (world size changed?); RNG and scheduler not restored")
    except Exception as exc:  # noqa: BLE001 - any failure means: fall back to an older one
        problem = f"{type(exc).__name__}: {exc}"
    ok = torch.tensor([0.0 if problem else 1.0], device=device)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    if ok.item() < 1.0 and problem is None:
        problem = "another rank failed to load it"
    return problem


def _torch_bytes(obj: Any) -> bytes:
    import io

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _stager(device: torch.device):
    """Pinned memory and a side-stream copy on CUDA (as torchtitan's async_with_pinned_mem);
    a plain synchronous copy into CPU memory elsewhere. Reused across saves, so the staging
    buffers are allocated (and pinned) once. None before torch 2.13: DCP's writer then stages,
    in the training thread (2.9-2.12's DefaultStager cannot copy FSDP2's DTensor specs:
    `KeyError: <class 'type'>` in deepcopy_with_tensor_offload, seen on torch 2.11 + H200;
    2.13 copies classes atomically)."""
    import inspect

    if torch.__version__ < (2, 13):  # a TorchVersion: compares with tuples
        return None
    try:
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
    except ImportError:
        return None
    if "async_stager" not in inspect.signature(dcp.async_save).parameters:
        return None

    cuda = device.type == "cuda"
    return DefaultStager(StagingOptions(use_pinned_memory=cuda, use_shared_memory=False,
                                        use_async_staging=cuda, use_non_blocking_copy=cuda))
