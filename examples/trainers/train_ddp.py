"""A plain PyTorch DDP training script, written the way most are: argparse, torchrun's
environment, a model, a loop that prints `iter N: loss X, time Yms` on rank 0, and a
`torch.save` checkpoint every `--ckpt_interval` iterations. It knows nothing of campaign.

    torchrun --nproc_per_node 2 train_ddp.py --max_iters 100 --out_dir out

The task: a small MLP learns to classify points labelled by a fixed random "teacher" network.
The batch of iteration i on rank r is drawn from a generator seeded with (seed, i, r), so a
run resumed from a checkpoint sees the same data as one that never stopped.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
parser.add_argument("--max_iters", type=int, default=100)
parser.add_argument("--batch_size", type=int, default=64)
parser.add_argument("--lr", type=float, default=3e-3)
parser.add_argument("--out_dir", default="out")
parser.add_argument("--ckpt_interval", type=int, default=0, help="0: no checkpoints")
parser.add_argument("--resume_from", default="", help="a checkpoint file to continue from")
parser.add_argument("--seed", type=int, default=1337)
args = parser.parse_args()

dist.init_process_group("gloo")
rank, world_size = dist.get_rank(), dist.get_world_size()
master = rank == 0
torch.manual_seed(args.seed)
torch.set_num_threads(1)

DIM, CLASSES = 32, 8
teacher = torch.nn.Linear(DIM, CLASSES)  # same weights on every rank (same seed)
model = torch.nn.Sequential(torch.nn.Linear(DIM, 128), torch.nn.GELU(), torch.nn.Linear(128, CLASSES))
optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
iter_num = 0
if args.resume_from:
    ckpt = torch.load(args.resume_from, map_location="cpu")
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    iter_num = ckpt["iter_num"]
    if master:
        print(f"resumed from {args.resume_from} at iter {iter_num}", flush=True)
model = DDP(model)


def get_batch(i):
    g = torch.Generator().manual_seed(args.seed * 1_000_003 + i * 1009 + rank)
    x = torch.randn(args.batch_size, DIM, generator=g)
    with torch.no_grad():
        y = teacher(x).argmax(dim=1)
    return x, y


os.makedirs(args.out_dir, exist_ok=True)
while iter_num < args.max_iters:
    iter_num += 1
    t0 = time.time()
    x, y = get_batch(iter_num)
    loss = F.cross_entropy(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    dt = time.time() - t0
    if master:
        print(f"iter {iter_num}: loss {loss.item():.4f}, time {dt * 1000:.2f}ms", flush=True)
    if args.ckpt_interval and iter_num % args.ckpt_interval == 0 and master:
        ckpt = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "iter_num": iter_num}
        torch.save(ckpt, os.path.join(args.out_dir, f"ckpt_{iter_num:06d}.pt"))

dist.barrier()  # every rank done before any tears gloo down (it may abort otherwise)
dist.destroy_process_group()
