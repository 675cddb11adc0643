"""Checkpoints: `<checkpoint_dir>/step-NNNNNNNN/`, written with torch.distributed.checkpoint.

A checkpoint holds: DCP shards of the model and optimizer (`*.distcp`, `.metadata`); one
`rank-RRRRR.pt` per rank with its RNG states (torch, CUDA/XPU, python) and LR scheduler;
`meta.json` (step, tokens, data_position, time, world_size, and the size of every file);
and `.complete`, written last by rank 0 after a barrier once every rank has finished.

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
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
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


def save(root: str, *, step: int, tokens: int, data_position: int, model, optim, sched,
         device: torch.device, keep_last: int) -> str:
    """Collective: every rank calls it. Returns the checkpoint's path."""
    rank = dist.get_rank()
    path = Path(root) / report.checkpoint_name(step)
    if rank == 0:  # a stale (e.g. corrupted) checkpoint of the same step must not look complete
        (path / report.COMPLETE_MARKER).unlink(missing_ok=True)
        (path / report.META_FILE).unlink(missing_ok=True)
        path.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    msd, osd = get_state_dict(model, optim)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(path))
    torch.save({"rng": _rng_state(device), "scheduler": sched.state_dict()},
               path / f"rank-{rank:05d}.pt")
    dist.barrier()
    if rank == 0:
        files = {f.name: f.stat().st_size for f in sorted(path.iterdir()) if f.is_file()
                 and f.name not in (report.META_FILE, report.COMPLETE_MARKER)}
        meta = {"step": step, "tokens": tokens, "data_position": data_position,
                "time": time.time(), "world_size": dist.get_world_size(), "files": files}
        report.write_json_atomic(path / report.META_FILE, meta)
        (path / report.COMPLETE_MARKER).write_text("")
        prune(root, keep_last)
    return str(path)


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
    """None if the checkpoint's files match meta.json; else what is wrong."""
    p = Path(path)
    try:
        meta = json.loads((p / report.META_FILE).read_text())
    except (OSError, ValueError) as exc:
        return f"unreadable {report.META_FILE}: {exc}"
    for name, size in meta.get("files", {}).items():
        f = p / name
        if not f.is_file():
            return f"missing file {name}"
        if f.stat().st_size != size:
            return f"{name} has {f.stat().st_size} bytes, expected {size} (truncated?)"
    return None


def _broadcast(obj: Any) -> Any:
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def load_latest(root: str, *, model, optim, sched, device: torch.device) -> dict | None:
    """Collective. Load the newest good complete checkpoint; returns its meta.json or None."""
    rank = dist.get_rank()
    candidates = [c["path"] for c in report.list_checkpoints(root) if c["complete"]]
    candidates = _broadcast(candidates[::-1] if rank == 0 else None)
    for path in candidates:
        problem = _broadcast(verify(path) if rank == 0 else None)
        if problem is None:
            problem = _try_load(path, model, optim, sched, device)
        if problem is None:
            return json.loads((Path(path) / report.META_FILE).read_text())
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
