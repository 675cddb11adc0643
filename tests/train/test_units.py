"""Pieces of the trainer that need no process group: env parsing, schedule, data, FLOPs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from campaign.train import data, dist, flops, loop, model, tokenfile
from campaign.train.config import DataConfig, ModelConfig, TrainConfig


@pytest.mark.parametrize("env, want", [
    ({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}, (3, 8, 1, 4)),
    ({"PMI_RANK": "13", "PMI_SIZE": "24", "PALS_LOCAL_RANKID": "1", "PALS_LOCAL_SIZE": "12"},
     (13, 24, 1, 12)),
    ({"PMI_RANK": "5", "PMI_SIZE": "8", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "4"},
     (5, 8, 1, 4)),
    ({"SLURM_PROCID": "6", "SLURM_NTASKS": "8", "SLURM_LOCALID": "2",
      "SLURM_NTASKS_PER_NODE": "4(x2)"}, (6, 8, 2, 4)),
    ({}, (0, 1, 0, 1)),
])
def test_read_ranks(env, want):
    assert dist.read_ranks(env) == want


def test_master_from_hostfile(tmp_path):
    hf = tmp_path / "hosts"
    hf.write_text("x1000c0s0b0n0\nx1000c0s0b0n1\n")
    assert dist.master_addr_port({"CAMPAIGN_HOSTFILE": str(hf)}) == ("x1000c0s0b0n0", "29500")
    assert dist.master_addr_port({"CAMPAIGN_HOSTFILE": str(hf), "MASTER_ADDR": "a",
                                  "CAMPAIGN_MASTER_PORT": "1234"}) == ("a", "1234")
    assert dist.master_addr_port({"MASTER_PORT": "9", "CAMPAIGN_MASTER_PORT": "1"})[1] == "9"


def test_lr_schedule():
    t = TrainConfig(lr=1.0, warmup_steps=10, schedule_steps=110, min_lr_ratio=0.1)
    assert loop.lr_factor(t, 5) == 0.5 and loop.lr_factor(t, 10) == 1.0
    assert loop.lr_factor(t, 60) == pytest.approx(0.55)
    assert loop.lr_factor(t, 110) == pytest.approx(0.1) == loop.lr_factor(t, 500)
    lin = TrainConfig(schedule="linear", warmup_steps=0, schedule_steps=100, min_lr_ratio=0.0)
    assert loop.lr_factor(lin, 50) == pytest.approx(0.5)


def test_synthetic_source_is_deterministic_and_follows_the_chain():
    src = data.MarkovSource(vocab=256, branching=4, seed=1)
    a, b = src.sample(7, 65), data.MarkovSource(256, 4, 1).sample(7, 65)
    assert np.array_equal(a, b) and not np.array_equal(a, src.sample(8, 65))
    for prev, nxt in zip(a[:-1], a[1:]):
        assert nxt in src.table[prev]
    assert data.entropy_floor(4) == math.log(4)


def test_sampler_slices_by_rank_and_micro_step():
    src = data.MarkovSource(64, 2, 0)
    s0 = data.Sampler(src, 8, 2, rank=0, world=2, grad_accum=2, device=torch.device("cpu"))
    s1 = data.Sampler(src, 8, 2, rank=1, world=2, grad_accum=2, device=torch.device("cpu"))
    one = data.Sampler(src, 8, 8, rank=0, world=1, grad_accum=1, device=torch.device("cpu"))
    x0, _ = s0.batch(0)
    x1, _ = s1.batch(0)
    x0b, _ = s0.batch(1)
    xs, ys = one.batch(0)
    assert torch.equal(torch.cat([x0, x1, x0b]), xs[:6]) and torch.equal(xs[:, 1:], ys[:, :-1])
    s0.advance()
    assert s0.position == 8


def test_file_source_and_prepare_text(tmp_path):
    (tmp_path / "a.txt").write_text("hello")
    (tmp_path / "b.txt").write_text("world!")
    info = tokenfile.prepare_text([tmp_path / "a.txt", tmp_path / "b.txt"], tmp_path / "t.bin", "uint16")
    assert info["tokens"] == 13 and info["documents"] == 2 and info["vocab_size"] == 257
    toks = np.fromfile(tmp_path / "t.bin", dtype=np.uint16)
    assert toks[5] == 0 and toks[-1] == 0 and toks[0] == ord("h") + 1
    src = data.make_source(DataConfig(source="file", path=str(tmp_path / "t.bin")))
    w = src.sample(3, 4)
    assert len(w) == 4 and np.array_equal(w, src.sample(3, 4))


def test_tiny_model_learns_toward_the_entropy_floor():
    """150 steps on one process bring the loss near ln(branching)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the machine's other cores run other tests
    torch.manual_seed(0)
    shape = model.shape_for(ModelConfig(size="tiny"))
    gpt = model.GPT(shape)
    src = data.MarkovSource(256, 4, 3)
    sampler = data.Sampler(src, 32, 16, 0, 1, 1, torch.device("cpu"))
    opt = torch.optim.AdamW(gpt.parameters(), lr=1e-2)
    for _ in range(150):
        x, y = sampler.batch(0)
        sampler.advance()
        loss = gpt(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    torch.set_num_threads(threads)
    floor = data.entropy_floor(4)
    assert math.log(256) - 1 > loss.item() > floor - 0.05
    assert loss.item() < floor + 0.5


def test_named_shapes_and_mfu():
    s = model.SHAPES["1b"]
    assert (s.n_layer, s.n_head, s.d_model, s.vocab_size, s.seq_len) == (24, 16, 2048, 50304, 2048)
    assert model.shape_for(ModelConfig(size="tiny", n_layer=3)).n_layer == 3
    assert flops.peak_flops("NVIDIA H200") == 989e12
    assert flops.peak_flops("Intel(R) Data Center GPU Max 1550") is not None
    assert flops.peak_flops("cpu") is None and flops.mfu(1.0, 1.0, None) is None
    # nanoGPT: 6N + 12 L H Q T
    assert flops.flops_per_token(100, 2, 3, 4, 5) == 600 + 12 * 2 * 3 * 4 * 5


@pytest.mark.parametrize("parallelism", ["ddp", "fsdp"])
def test_one_rank_trains_the_model_unwrapped_and_casts_by_autocast(parallelism):
    from campaign.train.model import GPT, SHAPES
    from campaign.train.parallelize import parallelize

    model = GPT(SHAPES["tiny"])
    par = parallelize(model, parallelism=parallelism, device=torch.device("cpu"), compile=False,
                      activation_checkpointing=False, bf16=True, world_size=1)
    assert par.model is model and par.wrapper == "none" and par.autocast
    assert par.comm.pop() == 0.0  # no gradient collective: none of the step is spent in one


@pytest.mark.parametrize("scope, world, whole", [("auto", 1, True), ("model", 1, True), ("blocks", 1, False),
                                                ("auto", 2, False)])
def test_compile_scope_picks_what_one_graph_covers(scope, world, whole):
    """`trainer.compile_scope`: the whole model in one graph, or each block and the output on
    their own (the form DDP and FSDP2 need; on one rank chosen for a shorter start). Nothing is
    compiled here (compile is lazy): what is wrapped is what a start compiles."""
    from campaign.train.model import GPT, SHAPES
    from campaign.train.parallelize import parallelize

    model = GPT(SHAPES["tiny"])
    if world == 1:
        parallelize(model, parallelism="ddp", device=torch.device("cpu"), compile=True,
                    activation_checkpointing=False, bf16=False, world_size=1, compile_scope=scope)
    else:  # the block-wise compile happens before DDP wraps the model: DDP stood in for (no process group)
        from campaign.train import parallelize as P

        class NoDDP:
            def __init__(self, module, **kw):
                self.module = module

            def register_comm_hook(self, *a):
                pass

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(P, "DDP", NoDDP)
            P.parallelize(model, parallelism="ddp", device=torch.device("cpu"), compile=True,
                          activation_checkpointing=False, bf16=False, world_size=world, compile_scope=scope)
    assert (model._compiled_call_impl is not None) is whole
    assert all((b._compiled_call_impl is None) is whole for b in model.blocks)
    assert ("output" not in vars(model)) is whole  # the blocks' form compiles the output (norm, head, loss) apart


def test_compile_scope_auto_takes_blocks_on_one_rank_from_a_billion_parameters(monkeypatch):
    """The tiny model stands in for a large one: the threshold is lowered below its size."""
    from campaign.train import parallelize as P
    from campaign.train.model import GPT, SHAPES

    monkeypatch.setattr(P, "BLOCKS_FROM_PARAMS", 1)
    model = GPT(SHAPES["tiny"])
    P.parallelize(model, parallelism="ddp", device=torch.device("cpu"), compile=True, activation_checkpointing=False,
                  bf16=False, world_size=1, compile_scope="auto")
    assert model._compiled_call_impl is None and all(b._compiled_call_impl is not None for b in model.blocks)


@pytest.mark.parametrize("size, whole", [("gpt2-124m", True), ("1b", False)])
def test_compile_scope_auto_at_the_measured_shapes(size, whole):
    """The real threshold (no patch): gpt2-124m keeps the whole model, 1b (1.3e9 parameters)
    compiles block by block, as measured on one H100 (docs/performance.md). Built on the meta
    device: nothing is allocated or compiled."""
    from campaign.train.model import GPT, SHAPES
    from campaign.train.parallelize import parallelize

    with torch.device("meta"):
        model = GPT(SHAPES[size])
    parallelize(model, parallelism="ddp", device=torch.device("meta"), compile=True, activation_checkpointing=True,
                bf16=True, world_size=1, compile_scope="auto")
    assert (model._compiled_call_impl is not None) is whole
    assert all((b._compiled_call_impl is None) is whole for b in model.blocks) and model.activation_checkpointing


def test_prefetched_batches_are_the_batches_a_step_would_read():
    src = data.MarkovSource(vocab=64, branching=4, seed=3)
    ahead = data.Sampler(src, 16, 2, rank=1, world=2, grad_accum=2, device=torch.device("cpu"))
    plain = data.Sampler(src, 16, 2, rank=1, world=2, grad_accum=2, device=torch.device("cpu"))
    for _ in range(3):
        for micro in range(2):
            got, want = ahead.batch(micro), plain.batch(micro)
            assert all(torch.equal(a, b) for a, b in zip(got, want))
            ahead.prefetch(micro)
        ahead.advance()
        plain.advance()
    ahead.position = 40  # a resume moves the position: the batch read ahead is not used
    plain.position = 40
    assert all(torch.equal(a, b) for a, b in zip(ahead.batch(0), plain.batch(0)))
