"""train_ddp.py with campaign's helpers (`campaign.report`): the lines marked `# campaign`
are all that changed. It takes its targets from the attempt (`report.run_config()`), writes
metrics, heartbeats and the start-up check, and checkpoints as `step-NNNNNNNN/` marked
complete last, so every stage can check it (docs/trainer-contract.md, "Helpers").

    torchrun --nproc_per_node 2 train_ddp_campaign.py --max_iters 100   # still runs without campaign

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

from campaign import report  # campaign

parser = argparse.ArgumentParser()
parser.add_argument("--max_iters", type=int, default=100)
parser.add_argument("--batch_size", type=int, default=64)
parser.add_argument("--lr", type=float, default=3e-3)
parser.add_argument("--out_dir", default="out")
parser.add_argument("--ckpt_interval", type=int, default=0, help="0: no checkpoints")
parser.add_argument("--resume_from", default="", help="a checkpoint file to continue from")
parser.add_argument("--seed", type=int, default=1337)
args = parser.parse_args()
run = report.run_config()  # campaign: the attempt's targets
if run:  # campaign
    args.max_iters, args.out_dir, args.ckpt_interval = run["max_steps"], run["checkpoint_dir"], run["checkpoint_every"]  # campaign
    latest = report.latest_complete_checkpoint(args.out_dir) if run["resume"] else None  # campaign
    args.resume_from = str(latest / "ckpt.pt") if latest else ""  # campaign

dist.init_process_group("gloo")
rank, world_size = dist.get_rank(), dist.get_world_size()
master = rank == 0
torch.manual_seed(args.seed)
torch.set_num_threads(1)
rep = report.Reporter.from_env(rank=rank, local_rank=int(os.environ.get("LOCAL_RANK", 0)), world_size=world_size)  # campaign
ranks = [None] * world_size  # campaign: the start-up check, from our own collectives
dist.all_gather_object(ranks, report.rank_identity(rank, int(os.environ.get("LOCAL_RANK", 0))))  # campaign
total = torch.tensor([report.allreduce_input(rank)])  # campaign
dist.all_reduce(total)  # campaign
report.startup_check(ranks, total.item(), rank=rank)  # campaign

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
    rep.phase("compute", iter_num)  # campaign
    x, y = get_batch(iter_num)
    loss = F.cross_entropy(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    rep.phase("collective", iter_num)  # campaign (DDP all-reduces in backward)
    loss.backward()
    optimizer.step()
    dt = time.time() - t0
    if master:
        print(f"iter {iter_num}: loss {loss.item():.4f}, time {dt * 1000:.2f}ms", flush=True)
    tokens = iter_num * args.batch_size * world_size  # campaign: samples stand for tokens here
    rep.step(step=iter_num, tokens=tokens, loss=loss.item(), step_time_s=dt, tokens_per_s=args.batch_size * world_size / dt)  # campaign
    at = run["checkpoint_at"] if run else []  # campaign
    if (args.ckpt_interval and iter_num % args.ckpt_interval == 0) or iter_num in at:  # campaign: every rank
        path = report.begin_checkpoint(args.out_dir, iter_num, rank=rank)  # campaign
        dist.barrier()  # campaign
        ckpt = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "iter_num": iter_num}
        if master:  # campaign
            torch.save(ckpt, path / "ckpt.pt")  # campaign
        dist.barrier()  # campaign
        report.complete_checkpoint(path, step=iter_num, tokens=tokens, rank=rank)  # campaign

rep.close()  # campaign
dist.destroy_process_group()
