"""Claim: the built-in trainer's parallel wrapper costs little against the plain model.

Measures tokens/s, MFU, step time, gradient-collective time and peak memory of the
built-in GPT under DDP or FSDP2 (`--parallelism`), and of a baseline measured in the same
run: the plain single-device model with the same settings (`--baseline single`), or the
other parallelism (`--baseline other`). Prints a table and a "ratio vs baseline" line.

    python benchmarks/train_throughput.py --size tiny --steps 5 --warmup 2          # CPU smoke
    python benchmarks/train_throughput.py --size 1b --batch 16 --parallelism fsdp --compile
    torchrun --nproc_per_node 4 benchmarks/train_throughput.py --size gpt2-124m --batch 12

Random tokens (the data path is not measured). Needs torch only (no pydantic), so it runs
in a bare PyTorch image. Rank 0 prints.
"""

from __future__ import annotations

import argparse
import functools
import gc
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _target import Targets, skip  # noqa: E402
import torch.distributed as tdist  # noqa: E402

from campaign.train import dist, flops  # noqa: E402
from campaign.train.model import GPT, SHAPES  # noqa: E402
from campaign.train.parallelize import parallelize  # noqa: E402

TARGET_RATIO = 0.9
"""The parallel wrapper keeps >= 90% of the baseline's tokens/s ("costs little")."""


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--size", default="tiny", choices=sorted(SHAPES))
    p.add_argument("--batch", type=int, default=4, help="sequences per rank per step")
    p.add_argument("--seq", type=int, default=None, help="context length (default: the size's)")
    p.add_argument("--activation", default=None, choices=["swiglu", "gelu"],
                   help="MLP (default: the size's; gelu with 4x width is nanoGPT's MLP)")
    p.add_argument("--parallelism", default="fsdp", choices=["ddp", "fsdp"])
    p.add_argument("--compile", action="store_true", help="torch.compile each block")
    p.add_argument("--ac", action="store_true", help="activation checkpointing")
    p.add_argument("--steps", type=int, default=10, help="timed steps")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    p.add_argument("--baseline", default="single", choices=["single", "other", "none"])
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda", "xpu"])
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="after the timed steps, profile N more steps and print where the time goes")
    return p.parse_args(argv)


def measure(args: argparse.Namespace, env: dist.DistEnv, parallelism: str | None) -> dict:
    """One configuration; parallelism None = the plain model, no wrapper."""
    dev = env.device
    bf16 = dev.type != "cpu"
    shape = replace(SHAPES[args.size], seq_len=args.seq or SHAPES[args.size].seq_len,
                    activation=args.activation or SHAPES[args.size].activation)
    torch.manual_seed(0)
    with torch.device(dev):
        model = GPT(shape)
    n_params = model.num_params()
    comm, wrapper = None, "none"
    if parallelism is None:
        model.activation_checkpointing = args.ac
        if args.compile:
            for block in model.blocks:
                block.compile()
            model.output = torch.compile(model.output)
    else:
        par = parallelize(model, parallelism=parallelism, device=dev, compile=args.compile,
                          activation_checkpointing=args.ac, bf16=bf16)
        model, comm, wrapper = par.model, par.comm, par.wrapper
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=dev.type == "cuda")
    autocast = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16 and wrapper != "fsdp")
    g = torch.Generator(device=dev).manual_seed(env.rank)
    tokens = torch.randint(0, shape.vocab_size, (args.batch, shape.seq_len + 1), device=dev,
                           generator=g)
    x, y = tokens[:, :-1], tokens[:, 1:]
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    times, comms = [], []
    for i in range(args.warmup + args.steps):
        sync(dev)
        t0 = time.perf_counter()
        loss = _step(model, opt, autocast, x, y)
        sync(dev)
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
            comms.append(comm.pop() if comm else None)
        elif comm:
            comm.pop()
    if args.profile and env.rank == 0:
        profile_steps(args.profile, functools.partial(_step, model, opt, autocast, x, y), dev)
    step_s = sorted(times)[len(times) // 2]
    tps = args.batch * shape.seq_len * env.world_size / step_s
    fpt = flops.flops_per_token(n_params, shape.n_layer, shape.n_head, shape.head_dim, shape.seq_len)
    comm_s = [c for c in comms if c is not None]
    # At world size 1 the trainer does not wrap the model (parallelize.py): say so.
    row = {"variant": variant_name(args, parallelism if wrapper != "none" else None), "params_m": n_params / 1e6,
           "tokens_per_s": tps, "mfu": flops.mfu(fpt, tps / env.world_size, flops.device_name(dev)),
           "step_s": step_s, "comm_s": sorted(comm_s)[len(comm_s) // 2] if comm_s else None,
           "mem_gib": torch.cuda.max_memory_allocated(dev) / 2**30 if dev.type == "cuda" else None,
           "loss": float(loss.detach())}
    del model, opt, loss, x, y, tokens
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return row


def variant_name(args: argparse.Namespace, parallelism: str | None) -> str:
    parts = [parallelism or "single"]
    parts += ["compile"] if args.compile else []
    parts += ["ac"] if args.ac else []
    return "+".join(parts)


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    elif dev.type == "xpu":
        torch.xpu.synchronize(dev)


def fmt(v, spec: str) -> str:
    if v is None:
        return format("-", spec.rstrip("f%").split(".")[0])
    return format(v, spec[:-1]) + "%" if spec.endswith("%") else format(v, spec)


def table(rows: list[dict]) -> str:
    head = f"{'variant':<22}{'params(M)':>10}{'tokens/s':>12}{'MFU':>8}{'step(s)':>10}{'comm(s)':>10}{'mem(GiB)':>10}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['variant']:<22}{r['params_m']:>10.1f}{r['tokens_per_s']:>12,.0f}"
                     f"{fmt(r['mfu'] and 100 * r['mfu'], '>7.1f%'):>8}{r['step_s']:>10.4f}"
                     f"{fmt(r['comm_s'], '>10.4f')}{fmt(r['mem_gib'], '>10.1f')}")
    return "\n".join(lines)


def _step(model, opt, autocast, x, y) -> torch.Tensor:
    """One training step (forward, backward, clip, AdamW); returns the loss."""
    with autocast:
        loss = model(x, y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


def profile_steps(n: int, step, dev: torch.device) -> None:
    """torch.profiler over n steps: the kernels that take the device's time, grouped."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with profile(activities=acts) as prof:
        for _ in range(n):
            step()
        sync(dev)
    key = "self_cuda_time_total" if dev.type == "cuda" else "self_cpu_time_total"
    print(prof.key_averages().table(sort_by=key, row_limit=25, max_name_column_width=70))


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    env = dist.init(args.device)
    if env.device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    targets = Targets("train_throughput")
    rows = [measure(args, env, args.parallelism)]
    base = {"single": None if env.world_size == 1 else "skip",
            "other": "ddp" if args.parallelism == "fsdp" else "fsdp", "none": "skip"}[args.baseline]
    if base != "skip":
        rows.append(measure(args, env, base))
    if env.rank == 0:
        name = flops.device_name(env.device) or "cpu"
        print(f"# {args.size} batch={args.batch}/rank seq={args.seq or SHAPES[args.size].seq_len} "
              f"world={env.world_size} device={name} torch={torch.__version__}")
        print(table(rows))
        if len(rows) == 2:
            ratio = rows[0]["tokens_per_s"] / rows[1]["tokens_per_s"]
            print(f"ratio vs baseline ({rows[1]['variant']}): {ratio:.3f}x tokens/s")
            if rows[0]["variant"] != rows[1]["variant"]:  # at one rank both train the model unwrapped
                targets.check(f"tokens/s of {rows[0]['variant']} / {rows[1]['variant']}", ratio, ">=", TARGET_RATIO, "x")
    tdist.barrier()
    dist.teardown()
    if env.rank != 0:
        return
    if not targets.verdicts:
        skip("train_throughput", f"no target judged: no baseline other than the variant itself in this run "
                                 f"(--baseline {args.baseline}, world size {env.world_size}: one rank trains the "
                                 f"model unwrapped, so the wrapper's cost needs torchrun with 2+ ranks)")
    targets.exit()


if __name__ == "__main__":
    main()
