"""Apply parallelism to the single-device model, in one place and in a fixed order.

Order (as torchtitan's parallelize.py): 1. activation checkpointing, 2. torch.compile (in
place, so state-dict keys do not change), 3. data parallelism: DDP, or FSDP2 (`fully_shard`
per block, then the root) with a bf16 MixedPrecisionPolicy on accelerators.

One rank has no gradients to reduce: at world size 1 the model is not wrapped (neither DDP
nor FSDP2, whichever is configured), and bf16 comes from autocast. Below BLOCKS_FROM_PARAMS
it is compiled whole rather than block by block (one graph, fused across block boundaries,
one guard check per step instead of one per block: faster steps at gpt2-124m); from there on
block by block (`compile_scope: auto`), which compiles one block's graph for all of them: a
start, and each relaunch, compiles and loads far less at the same step time. Measured against nanoGPT on one H200 in
benchmarks/vs_nanogpt.py. With several ranks, blocks are compiled one by one: DDP overlaps
each bucket's all-reduce with the backward of the blocks before it only if each block's
backward is its own autograd node, and FSDP2 shards per block (torchtitan does the same).

Communication time (`CommTimer`): with DDP, a comm hook launches each gradient bucket's
all-reduce and records its duration: on NCCL from CUDA events (TORCH_NCCL_ENABLE_TIMING=1,
`Work._get_duration()`), elsewhere as host wall time from launch to the future's completion.
FSDP2 issues its collectives internally, so comm_time_s is None there.
"""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


class CommTimer:
    """Seconds spent in gradient collectives since the last `pop()`."""

    def __init__(self) -> None:
        self.host_s = 0.0
        self.works: list = []
        self.enabled = True

    def pop(self) -> float | None:
        if not self.enabled:
            return None
        total = self.host_s
        for w in self.works:
            try:
                total += w._get_duration() / 1000.0
            except RuntimeError:  # timing not enabled for this backend
                pass
        self.host_s, self.works = 0.0, []
        return total

    def cut(self) -> CommTimer:
        """What was recorded since the last cut, as a timer of its own, and this one from
        zero: with steps overlapped the next step's buckets are launched before this step's
        durations can be read (an NCCL duration needs its work finished), so each step's
        works are set aside when its backward is done and read (`pop()`) with its loss."""
        snap = CommTimer()
        snap.enabled, snap.host_s, snap.works = self.enabled, self.host_s, self.works
        self.host_s, self.works = 0.0, []
        return snap


def _timed_allreduce_hook(timer, bucket):  # no annotations: DDP checks them as real types
    buf = bucket.buffer()
    buf.div_(dist.get_world_size())
    t0 = time.perf_counter()
    work = dist.all_reduce(buf, async_op=True)
    if buf.is_cuda:
        timer.works.append(work)
        return work.get_future().then(lambda f: f.value()[0])

    def done(f: torch.futures.Future) -> torch.Tensor:
        timer.host_s += time.perf_counter() - t0
        return f.value()[0]

    return work.get_future().then(done)


BLOCKS_FROM_PARAMS = 1_000_000_000
"""`compile_scope: auto` on one rank compiles block by block from this many parameters, the whole
model below it. Measured on one H100 (docs/performance.md, "Start-up cuts"): at 1b (1.3 B
parameters) blocks stepped as fast as the whole model (0.993x) and started in 19.6 s instead of
44.0 s cold, 6.3 s instead of 21.9 s forked with the cache; at gpt2-124m blocks stepped 1.6%
slower (446,273 against 453,233 tokens/s), which a long run pays on every step."""


def compiles_whole(n_params: int, world: int, compile_scope: str) -> bool:
    """Whether `parallelize` compiles the model as one graph (else block by block)."""
    return world == 1 and (compile_scope == "model" or (compile_scope == "auto" and n_params < BLOCKS_FROM_PARAMS))


@dataclass
class Parallel:
    """The model as the loop runs it."""

    model: nn.Module
    comm: CommTimer
    wrapper: str
    """"none" (one rank), "ddp" or "fsdp"."""

    @property
    def autocast(self) -> bool:
        """Whether bf16 must come from torch.autocast (FSDP2's policy casts by itself)."""
        return self.wrapper != "fsdp"


def parallelize(model: nn.Module, *, parallelism: str, device: torch.device, compile: bool,
                activation_checkpointing: bool, bf16: bool, world_size: int | None = None,
                compile_scope: str = "auto") -> Parallel:
    """`model` must already be on `device`; `world_size` defaults to the process group's.
    `compile_scope` (TrainConfig's): "model" (one rank only: with several the blocks are always
    compiled apart), "blocks", or "auto" (one rank: model below BLOCKS_FROM_PARAMS, else blocks)."""
    timer = CommTimer()
    world = world_size if world_size is not None else dist.get_world_size()
    # 1. Activation checkpointing: each block's activations are recomputed in backward.
    if activation_checkpointing:
        model.activation_checkpointing = True
    # 2. Compile: the whole model (one rank, scope model/auto), or each block in place
    #    (nn.Module.compile keeps parameter names) and the output (norm, head, loss).
    whole = compiles_whole(sum(p.numel() for p in model.parameters()), world, compile_scope)
    if compile and whole:
        model.compile()
    elif compile:
        for block in model.blocks:
            block.compile()
        model.output = torch.compile(model.output)
    if world == 1:
        return Parallel(model, timer, "none")  # no gradient collective: its time is 0, known
    # 3. Data parallelism.
    if parallelism == "fsdp":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
              if bf16 else MixedPrecisionPolicy())
        for block in model.blocks:
            fully_shard(block, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
        timer.enabled = False
        return Parallel(model, timer, "fsdp")
    # The model's buffers (rotary tables) are constants: no per-forward buffer broadcast,
    # which would also be a collective hidden inside the forward pass.
    no_sync = ({"forward_sync_buffers": False}
               if "forward_sync_buffers" in inspect.signature(DDP.__init__).parameters
               else {"broadcast_buffers": False})
    ddp = DDP(model, device_ids=[device.index] if device.type != "cpu" else None,
              gradient_as_bucket_view=True, **no_sync)
    ddp.register_comm_hook(timer, _timed_allreduce_hook)
    return Parallel(ddp, timer, "ddp")
