"""Build everything from a TrainerConfig, then the training loop, read top to bottom.

`train(cfg, env, rep, stop)` returns the exit code of the contract: 0 done, 143 SIGTERM or
deadline (after a checkpoint), 94 non-finite loss.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import resource
import sys
import time
import traceback
from dataclasses import dataclass

import torch
import torch.distributed as dist

from campaign import report
from campaign.train import checkpoint, flops, rescue, tokenfile
from campaign.train.config import RunConfig, TrainConfig, TrainerConfig
from campaign.train.data import Sampler, make_source
from campaign.train.dist import DistEnv
from campaign.train.faults import Faults
from campaign.train.marks import EVENT as STARTUP_EVENT
from campaign.train.marks import Marks
from campaign.train.model import GPT, shape_for
from campaign.train.parallelize import CommTimer, parallelize
from campaign.train.signals import StopFlag


def lr_factor(t: TrainConfig, step: int) -> float:
    """LR multiplier for optimizer step `step` (1-based): linear warm-up, then decay."""
    if t.warmup_steps and step <= t.warmup_steps:
        return step / t.warmup_steps
    if t.schedule == "constant":
        return 1.0
    frac = min(1.0, (step - t.warmup_steps) / max(1, t.schedule_steps - t.warmup_steps))
    decay = 0.5 * (1 + math.cos(math.pi * frac)) if t.schedule == "cosine" else 1 - frac
    return t.min_lr_ratio + (1 - t.min_lr_ratio) * decay


def use_bf16(t: TrainConfig, device: torch.device) -> bool:
    return t.precision in ("bf16", "float8") or (t.precision == "auto" and device.type != "cpu")


def exact(t: TrainConfig) -> bool:
    """Deterministic kernels: `auto` reaches the trainer only when it is run by hand (the
    stages resolve it), and then means exact, as resume comparisons need."""
    return t.deterministic is not False


def save_async(t: TrainConfig, device: torch.device) -> bool:
    """`auto`: on CUDA (measured there); on CPU the background writer would compete with
    training for the same cores, and tests want a checkpoint complete once it is reported."""
    return t.checkpoint_async is True or (t.checkpoint_async == "auto" and device.type == "cuda")


def seed_everything(t: TrainConfig, device: torch.device) -> None:
    if exact(t):
        if device.type == "cuda":
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        # On CPU and CUDA every op we use has a deterministic variant (on CUDA, SDPA then
        # avoids cuDNN attention's non-deterministic backward: measured on an H200, resumed
        # losses went from 0.1 off to bit-exact); elsewhere (XPU) warn instead of failing.
        torch.use_deterministic_algorithms(True, warn_only=device.type not in ("cpu", "cuda"))
    torch.manual_seed(t.seed)
    random.seed(t.seed)


@dataclass
class Trainer:
    """What the loop works with."""

    model: torch.nn.Module
    optim: torch.optim.Optimizer
    sched: torch.optim.lr_scheduler.LambdaLR
    sampler: Sampler
    comm: CommTimer
    autocast: bool
    """bf16 from torch.autocast (no wrapper, DDP) rather than FSDP2's mixed-precision policy."""
    flops_per_token: float
    device_name: str | None
    wrapper: str = "none"
    """What parallelize applied: "ddp", "fsdp" or "none" (one rank)."""


def build(cfg: TrainerConfig, env: DistEnv) -> Trainer:
    cfg = tokenfile.resolve(cfg)  # a token file's dtype and vocabulary, from its sidecar
    t = cfg.train
    seed_everything(t, env.device)
    shape = shape_for(cfg.model)
    with torch.device(env.device):
        model = GPT(shape)
    n_params = model.num_params()
    if t.precision == "float8":  # before compile and data parallelism, as torchao asks (__main__ checked the device)
        from campaign.train import float8

        float8.convert(model)
    par = parallelize(model, parallelism=t.parallelism, device=env.device, compile=t.compile,
                      activation_checkpointing=t.activation_checkpointing,
                      bf16=use_bf16(t, env.device), world_size=env.world_size, compile_scope=t.compile_scope)
    model = par.model
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optim = torch.optim.AdamW(
        [{"params": decay, "weight_decay": t.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=t.lr, betas=(0.9, 0.95), fused=env.device.type == "cuda")
    sched = torch.optim.lr_scheduler.LambdaLR(optim, lambda e: lr_factor(t, e + 1))
    sampler = Sampler(make_source(cfg.data, shape.vocab_size), shape.seq_len, t.micro_batch_size, env.rank,
                      env.world_size, t.grad_accum, env.device)
    fpt = flops.flops_per_token(n_params, shape.n_layer, shape.n_head, shape.head_dim, shape.seq_len)
    return Trainer(model, optim, sched, sampler, par.comm, par.autocast, fpt, flops.device_name(env.device),
                   par.wrapper)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "xpu":
        torch.xpu.synchronize(device)


def mem_peak_gib(device: torch.device) -> float:
    """Accelerator: max allocated by torch. CPU: peak RSS of this process (ru_maxrss)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    if device.type == "xpu":
        return torch.xpu.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def _no_sync(model: torch.nn.Module, sync: bool):
    """Skip gradient reduction on all but the last micro-step (DDP no_sync / FSDP2 flag)."""
    if hasattr(model, "no_sync"):
        return contextlib.nullcontext() if sync else model.no_sync()
    if hasattr(model, "set_requires_gradient_sync"):
        model.set_requires_gradient_sync(sync)
    return contextlib.nullcontext()


def _sharded(x) -> bool:
    """A DTensor (FSDP2): reading it needs a collective."""
    return hasattr(x, "full_tensor")


def train(cfg: TrainerConfig, env: DistEnv, rep: report.Reporter, stop: StopFlag,
          marks: Marks | None = None, start: dict | None = None) -> int:
    """`marks`: the start-up marks so far (model_built, checkpoint_loaded and first_step are
    added here; rank 0 writes them with `start`'s fields as the `startup` event after the first step)."""
    marks = marks or Marks()
    tr = build(cfg, env)
    marks.mark("model_built")
    faults = Faults(cfg.faults, rank=env.rank, node=env.node, attempt=cfg.run.attempt, should_stop=stop)
    saves: list[checkpoint.Saved] = []

    def on_saved(s: checkpoint.Saved) -> None:
        saves.append(s)
        rep.event("checkpoint_saved", s.step, path=s.path, seconds=s.seconds, stall_s=s.stall_s,
                  asynchronous=s.asynchronous, tokens=s.tokens)

    saver = checkpoint.Saver(cfg.run.checkpoint_dir, device=env.device, keep_last=cfg.train.keep_last,
                             asynchronous=save_async(cfg.train, env.device), on_saved=on_saved,
                             before_write=faults.in_checkpoint)
    res = _rescue(cfg, env, rep, stop, tr, faults)
    try:
        code = _loop(cfg, env, rep, stop, tr, faults, saver, saves, res, marks, start or {})
    except BaseException as exc:
        if saver.in_flight:  # its writer thread may sit in a collective and keep us alive
            traceback.print_exc()
            sys.stderr.flush()
            os._exit(report.EXIT_SIGTERM if stop() else 1)
        if rescue.peer_lost(exc):  # a peer died under our collective: our replica may be saved
            res.linger()
        raise
    saver.close()
    return code


def _rescue(cfg: TrainerConfig, env: DistEnv, rep: report.Reporter, stop: StopFlag,
            tr: Trainer, faults: Faults) -> rescue.Rescue | rescue.NoRescue:
    """The rescue side of this rank (campaign.train.rescue), answering SIGUSR1, where the
    attempt asks for it and the state is replicated; else a null one."""
    if not (cfg.run.rescue and rescue.supported(wrapper=tr.wrapper, world_size=env.world_size, device=env.device)):
        return rescue.NoRescue()
    res = rescue.Rescue(run_dir=str(rep.run_dir), checkpoint_dir=cfg.run.checkpoint_dir, rank=env.rank,
                        world_size=env.world_size, keep_last=cfg.train.keep_last,
                        state=lambda: (tr.model, tr.optim, tr.sched), cuda=env.device.type == "cuda",
                        linger_s=cfg.run.rescue_linger_s, before_write=faults.in_rescue)
    stop.on_usr1 = res.on_signal
    return res


@dataclass
class _Queued:
    """A step whose update is queued on the device and whose results the host has not read."""

    step: int
    tokens: int
    data_position: int
    t0: float
    lr: float
    mem_peak: float
    flags: list[float]
    got: torch.Tensor
    """[mean loss, the reduced flags (several ranks), the gradient norm (a local one)]."""
    ready: torch.cuda.Event | None
    """Overlapped on CUDA: recorded after `got` was queued for the host; None: `got` is read
    as it is, which waits for the device."""
    grad_norm: torch.Tensor
    """A sharded one (FSDP2) is not in `got`: it needs a collective, read only when logged."""
    comm: CommTimer


def overlap_steps(t: TrainConfig, device: torch.device, faults: list) -> bool:
    return t.overlap_steps is True or (t.overlap_steps == "auto" and device.type == "cuda" and not faults)


def _loop(cfg: TrainerConfig, env: DistEnv, rep: report.Reporter, stop: StopFlag, tr: Trainer,
          faults: Faults, saver: checkpoint.Saver, saves: list[checkpoint.Saved],
          res: rescue.Rescue | rescue.NoRescue, marks: Marks, start: dict) -> int:
    """The steps, read top to bottom: forward and backward over the micro-steps, one small
    collective for the loss and the stop flags, clipping and the update queued, then the host
    reads the step's results (`_finish`: the one wait of the step), reports and checkpoints.
    With `overlap_steps` the read of step N comes after step N+1's forward and backward are
    queued, still before step N+1's update: the device runs while the host reports, and a
    non-finite loss or a stop still ends the run before anything more is updated or saved.

    Where the host waits for the device (or for other ranks) is marked SYNC below."""
    t, run = cfg.train, cfg.run
    autocast = (torch.autocast(env.device.type, dtype=torch.bfloat16)
                if use_bf16(t, env.device) and tr.autocast else contextlib.nullcontext())
    overlap = overlap_steps(t, env.device, cfg.faults)
    step, tokens = _resume(cfg, env, rep, tr, faults, res, overlap)
    marks.mark("checkpoint_loaded")
    first = step + 1  # the attempt's first step: its end is the last start-up mark

    def started(done: int) -> None:
        if done == first:
            marks.mark("first_step")
            rep.event(STARTUP_EVENT, done, **marks.document(**start))
    tokens_per_step = tr.sampler.samples_per_step * tr.sampler.seq_len
    queued: _Queued | None = None  # overlapped: the step whose results the host has not read yet
    step_s = 0.0  # the last step's time (the deadline margin and the slow-down fault use it)
    host_free = 0.0  # perf_counter when the host last finished a step (its report, its save)

    while step < run.max_steps and (run.max_tokens is None or tokens < run.max_tokens):
        step += 1
        t0 = time.perf_counter()
        _rebuild_ddp_buckets(tr, rep, step)
        rep.phase("compute", step)
        faults.step_start(step, rep)
        faults.slow(step, step_s)
        loss_sum = _forward_backward(t, rep, tr, faults, autocast, step)
        if faults.nonfinite(step):
            loss_sum = loss_sum * float("nan")
        comm = tr.comm.cut()
        if queued is not None:  # overlapped: the step before, read while this one's backward runs
            code, step_s = _finish(queued, cfg, env, rep, tr, saver, res, overlap, host_free)  # SYNC: step-1's results
            started(queued.step)
            if code is not None:
                return code
            host_free = time.perf_counter()
            queued = None
            rep.phase("collective", step)  # back in this step (a save moved it): its all-reduce, update
        deadline_near = _deadline_near(run, saves, step_s)
        flags = [float(stop()), float(deadline_near)]
        vec = _reduce_loss_and_flags(env, loss_sum, flags)
        # The update is queued before the loss is read, so the host waits once per step (at
        # the read) rather than idling the device between backward and optimizer. A
        # non-finite loss still ends the run before anything is saved or reported.
        grad_norm = torch.nn.utils.clip_grad_norm_(tr.model.parameters(), t.max_grad_norm or math.inf)
        lr = tr.optim.param_groups[0]["lr"]
        saver.before_update()  # SYNC (only while an async save copies the state): the copy must be finished
        res.updating()  # from here until the step is done the state is no replica to save
        tr.optim.step()
        tr.optim.zero_grad(set_to_none=True)
        tr.sched.step()
        # Host-side work that needs no result, done while the device still computes: the
        # allocator's peak already counts this step (allocations are made when launched).
        mem_peak = mem_peak_gib(env.device)
        got, ready = _results(env, vec, grad_norm, overlap)
        tr.sampler.advance()
        tokens += tokens_per_step
        queued = _Queued(step, tokens, tr.sampler.position, t0, lr, mem_peak, flags, got, ready,
                         grad_norm, comm)
        if not overlap:
            code, step_s = _finish(queued, cfg, env, rep, tr, saver, res, overlap, host_free)  # SYNC: this step's results
            started(queued.step)
            if code is not None:
                return code
            host_free = time.perf_counter()
            queued = None
    if queued is not None:  # overlapped: the last step is still unread
        code, step_s = _finish(queued, cfg, env, rep, tr, saver, res, overlap, host_free)  # SYNC
        started(queued.step)
        if code is not None:
            return code
    _drain(saver, rep, step)  # SYNC: the save in flight is durable before the exit
    rep.event("done", step, tokens=tokens)
    return report.EXIT_OK


def _resume(cfg: TrainerConfig, env: DistEnv, rep: report.Reporter, tr: Trainer, faults: Faults,
            res: rescue.Rescue | rescue.NoRescue, overlap: bool) -> tuple[int, int]:
    """Load the newest complete checkpoint when the attempt resumes; report the start. Returns
    the step and tokens to go on from (0, 0 for a fresh start)."""
    t, run, sampler = cfg.train, cfg.run, tr.sampler
    step, tokens = 0, 0
    meta = None
    skipped: list[dict[str, str]] = []  # newer checkpoints that failed their checksum or load
    if run.resume:
        rep.phase("checkpoint", 0)
        meta = checkpoint.load_latest(run.checkpoint_dir, model=tr.model, optim=tr.optim,
                                      sched=tr.sched, device=env.device, skipped=skipped)
    if meta:
        step, tokens = meta["step"], meta["tokens"]
        sampler.position = meta["data_position"] + faults.data_shift(step)
        if tr.sched.last_epoch != step:  # scheduler state missing (world size changed)
            tr.sched.last_epoch = step
            for g, base in zip(tr.optim.param_groups, tr.sched.base_lrs):
                g["lr"] = base * lr_factor(t, step + 1)
    res.mark(step, tokens, sampler.position)
    rep.event("start", step, world_size=env.world_size, resumed=bool(meta), rescue=res.enabled,
              overlap_steps=overlap)
    for sk in skipped:
        rep.event("checkpoint_skipped", step, path=sk["path"], why=sk["why"])
    if meta:
        rep.event("checkpoint_loaded", step, tokens=tokens, path=meta["path"])
    return step, tokens


def _rebuild_ddp_buckets(tr: Trainer, rep: report.Reporter, step: int) -> None:
    """DDP rebuilds its gradient buckets once, at the start of the first forward after a
    backward that all-reduced, with a broadcast from rank 0 (`Reducer._rebuild_buckets`): a
    collective hidden in the forward, so a rank waiting there for a hung peer said "compute"
    and the heartbeats showed every rank computing, no stall pattern (issue 39: a hang in a
    relaunch's second step waited the warm-up budget). Done here, between steps and in phase
    "collective", as DDP's own Join hook does; DDP's forward then finds it done."""
    ddp = tr.model
    if getattr(ddp, "_has_rebuilt_buckets", True) or getattr(ddp, "reducer", None) is None:
        return  # not DDP, or done
    rep.phase("collective", step, timed=False)  # SYNC: a broadcast from rank 0 (none before the first backward)
    if ddp.reducer._rebuild_buckets():
        ddp._has_rebuilt_buckets = True


def _forward_backward(t: TrainConfig, rep: report.Reporter, tr: Trainer, faults: Faults,
                      autocast: contextlib.AbstractContextManager, step: int) -> torch.Tensor:
    """Forward and backward over the step's micro-batches; the gradients are all-reduced by
    the last backward (DDP / FSDP2). Returns the sum of the micro-steps' losses (on the device)."""
    A = t.grad_accum
    loss_sum = None
    for micro in range(A):
        last = micro == A - 1
        x, y = tr.sampler.batch(micro)
        with _no_sync(tr.model, last):
            with autocast:
                loss = tr.model(x, y)
            if A > 1:  # x / 1 is x: one kernel (and autograd node) fewer per step
                loss = loss / A
            if last:
                faults.before_collective(step, rep)
                rep.phase("collective", step)  # the backward below all-reduces gradients
            loss.backward()
        tr.sampler.prefetch(micro)  # on an accelerator the backward still runs: read ahead
        # The first micro-step's loss as it is (0 + x is x: no zero-filled tensor to launch).
        loss_sum = loss.detach() if loss_sum is None else loss_sum + loss.detach()
    assert loss_sum is not None
    return loss_sum


def _deadline_near(run: RunConfig, saves: list[checkpoint.Saved], step_s: float) -> bool:
    """Whether the deadline comes before one more save could finish. Margin: 2 x the last
    save time (2 s assumed before the first save) + 2 step times."""
    last_save_s = saves[-1].seconds if saves else 2.0
    return (run.deadline_unix is not None
            and time.time() + 2 * last_save_s + 2 * step_s
            >= run.deadline_unix)


def _reduce_loss_and_flags(env: DistEnv, loss_sum: torch.Tensor, flags: list[float]) -> torch.Tensor:
    """[loss sum, flags summed over ranks]: with several ranks one small collective carries
    the loss and every rank's stop requests; one rank has nothing to reduce (its own flags
    are the answer, read from `flags`)."""
    vec = loss_sum.float().view(1)
    if env.world_size > 1:
        # From pinned memory without blocking: a plain copy to the device would make the
        # host wait here for the whole backward, the device then idle while the host
        # launched clipping and the optimizer.
        f = torch.tensor(flags)
        if env.device.type == "cuda":
            f = f.pin_memory()
        vec = torch.cat([vec, f.to(env.device, non_blocking=True)])
        dist.all_reduce(vec)  # SYNC on CPU (gloo runs it now); queued on an accelerator
    return vec


def _results(env: DistEnv, vec: torch.Tensor, grad_norm: torch.Tensor,
             overlap: bool) -> tuple[torch.Tensor, torch.cuda.Event | None]:
    """What the host will read of the step: the mean loss in float32, the flags and a local
    gradient norm in one copy (a DTensor's needs a collective: read only when logged).
    Overlapped on CUDA: copied to pinned host memory in stream order, with an event to wait on."""
    W = env.world_size
    got = torch.cat([vec / W] if _sharded(grad_norm) else [vec / W, grad_norm.float().view(1)])
    ready = None
    if overlap and env.device.type == "cuda":
        got = got.to("cpu", non_blocking=True)  # into pinned memory, in stream order
        ready = torch.cuda.Event()
        ready.record()
    return got, ready


def _finish(q: _Queued, cfg: TrainerConfig, env: DistEnv, rep: report.Reporter, tr: Trainer,
            saver: checkpoint.Saver, res: rescue.Rescue | rescue.NoRescue, overlap: bool,
            host_free: float) -> tuple[int | None, float]:
    """Read step q.step's results, report, checkpoint. Returns an exit code that ends the run
    (None: go on) and the step's time."""
    t, run, W = cfg.train, cfg.run, env.world_size
    if q.ready is not None:
        q.ready.synchronize()  # SYNC: step q.step only; the next step's work stays queued
    got = q.got.tolist()  # SYNC: waits for the device and the collectives (phase "collective")
    if q.ready is None:
        _sync(env.device)  # SYNC: the whole step (the update included) before it is timed
    loss_val = got[0]
    term_any, deadline_any = (got[1] > 0, got[2] > 0) if W > 1 else (q.flags[0] > 0, q.flags[1] > 0)
    # From the step's start or, overlapped, from when the host was done with the step
    # before (its device work ran on meanwhile): the device's time for this step.
    step_s = 0.0
    if not math.isfinite(loss_val):
        rep.event("nonfinite_loss", q.step, loss=loss_val)
        return report.EXIT_NONFINITE, step_s
    if not overlap:
        rep.phase("compute", q.step)
    res.mark(q.step, q.tokens, q.data_position)
    step_s = time.perf_counter() - max(q.t0, host_free)
    final = q.step >= run.max_steps or (run.max_tokens is not None and q.tokens >= run.max_tokens)
    if q.step % t.log_every == 0 or final or term_any or deadline_any:
        tps = tr.sampler.samples_per_step * tr.sampler.seq_len / step_s
        rep.step(step=q.step, tokens=q.tokens, loss=loss_val, step_time_s=step_s, lr=q.lr,
                 tokens_per_s=tps, mfu=flops.mfu(tr.flops_per_token, tps / W, tr.device_name),
                 **({"mfu_float8": flops.mfu(tr.flops_per_token, tps / W, tr.device_name, float8=True)}
                    if t.precision == "float8" else {}),
                 comm_time_s=q.comm.pop(), mem_peak_gib=q.mem_peak,
                 # SYNC (FSDP2, when logged): a sharded norm is gathered by a collective
                 grad_norm=float(q.grad_norm.full_tensor()) if _sharded(q.grad_norm) else got[-1],
                 time=time.time())
    if term_any:
        _drain(saver, rep, q.step)  # SYNC: the save in flight
        return report.EXIT_SIGTERM, step_s
    if ((final and run.checkpoint_final) or deadline_any or q.step in run.checkpoint_at
            or (t.checkpoint_every and q.step % t.checkpoint_every == 0)):
        rep.phase("checkpoint", q.step)
        saver.save(step=q.step, tokens=q.tokens, data_position=q.data_position, model=tr.model,
                   optim=tr.optim, sched=tr.sched)  # SYNC: a synchronous save; an async one copies the state
    saver.poll()
    if deadline_any:
        _drain(saver, rep, q.step)  # SYNC: the save in flight
        rep.event("deadline", q.step, deadline_unix=run.deadline_unix)
        return report.EXIT_SIGTERM, step_s
    return None, step_s


def _drain(saver: checkpoint.Saver, rep: report.Reporter, step: int) -> None:
    """Wait for the save in flight (its data durable, `.complete` written) before exiting."""
    if saver.in_flight:
        rep.phase("checkpoint", step)
        saver.wait()
