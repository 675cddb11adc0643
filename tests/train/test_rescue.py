"""Rescue checkpoints (campaign.train.rescue): after a peer crashes or hangs, a surviving DDP
replica saves the last finished step, and a relaunch from it trains on exactly as the run
that never failed (real gloo ranks on the CPU; this test plays the supervisor's part: the
request file and SIGUSR1)."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from campaign import report
from campaign.train import rescue
from train_helpers import Launch, complete_steps, tiny_config

pytestmark = pytest.mark.slow


def _cfg(ck: Path, steps: int, faults: list | None = None, **run) -> dict:
    return tiny_config(ck, train={"checkpoint_every": 5}, run={"max_steps": steps, "rescue": True, **run},
                       faults=faults or [])


def _ask(run: Launch, rank: int, timeout: float = 30) -> dict:
    """What the supervisor does: name the rank, SIGUSR1 every rank still running, read the answer."""
    (run.run_dir / rescue.REQUEST_FILE).write_text(json.dumps({"rank": rank}))
    for p in run.procs:
        if p.poll() is None:
            p.send_signal(signal.SIGUSR1)
    result = run.run_dir / rescue.RESULT_FILE
    end = time.monotonic() + timeout
    while not result.exists() and time.monotonic() < end:
        time.sleep(0.05)
    assert result.exists(), run.logs()
    return json.loads(result.read_text())


def _wait_until(cond, timeout: float = 60) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "condition not met in time"
        time.sleep(0.05)


def _ranks(run: Launch) -> dict[int, dict]:
    return {int(r): s for d in report.read_heartbeats(run.run_dir).values() for r, s in d["ranks"].items()}


def _resume(launch, ck: Path, steps: int) -> Launch:
    run = launch(_cfg(ck, steps), name="relaunch", attempt=2)
    assert run.wait() == [0, 0], run.logs()
    return run


def test_after_a_peer_crashes_the_survivor_saves_the_last_step_and_the_relaunch_is_exact(launch, tmp_path,
                                                                                           reference_30):
    ck = tmp_path / "ck"
    run = launch(_cfg(ck, 10_000, [{"kind": "crash", "step": 8, "rank": 1, "attempt": 1}]))
    _wait_until(lambda: run.procs[1].poll() is not None)
    time.sleep(1.0)  # rank 0's collective has failed by now: it lingers instead of exiting
    assert run.procs[0].poll() is None, "the survivor exited before a rescue could be asked for"
    got = _ask(run, rank=0)
    assert got["saved"] and got["step"] == 7 and got["rank"] == 0, got
    assert run.wait(timeout=30)[0] == 1, "after the rescue the survivor fails as before (its peer is gone)"
    assert complete_steps(ck) == [5, 7]
    meta = json.loads((ck / "step-00000007" / report.META_FILE).read_text())
    assert meta["rescue"] == {"rank": 0} and meta["world_size"] == 2 and meta["tokens"] == got["tokens"]

    again = _resume(launch, ck, 12)
    assert ("checkpoint_loaded", 7) in [(e["event"], e["step"]) for e in again.events()]
    assert {s: again.losses()[s] for s in range(8, 13)} == {s: reference_30[s] for s in range(8, 13)}, "bit for bit"


def test_after_a_peer_hangs_the_rank_blocked_in_the_collective_saves_from_its_signal_thread(launch, tmp_path,
                                                                                              reference_30):
    ck = tmp_path / "ck"
    run = launch(_cfg(ck, 10_000, [{"kind": "hang", "step": 8, "rank": 1, "attempt": 1}]))
    _wait_until(lambda: _ranks(run).get(0, {}).get("phase") == "collective" and _ranks(run)[0]["step"] == 8)
    got = _ask(run, rank=0)
    assert got["saved"] and got["step"] == 7, got
    assert [p.poll() for p in run.procs] == [None, None], "asking kills nobody: the supervisor stops the launch"
    run.kill()
    run.wait()
    again = _resume(launch, ck, 12)
    assert {s: again.losses()[s] for s in range(8, 13)} == {s: reference_30[s] for s in range(8, 13)}, "bit for bit"


def test_a_step_already_checkpointed_is_not_saved_again(launch, tmp_path):
    ck = tmp_path / "ck"
    run = launch(_cfg(ck, 10_000, [{"kind": "hang", "step": 6, "rank": 1, "attempt": 1}]))
    _wait_until(lambda: _ranks(run).get(0, {}).get("phase") == "collective" and _ranks(run)[0]["step"] == 6)
    got = _ask(run, rank=0)
    assert not got["saved"] and got["covered"], got
    assert "step 5 is already covered by a complete checkpoint" in got["why"]
    run.kill()


def test_only_the_named_rank_saves_and_the_others_exit_once_asked(launch, tmp_path):
    ck = tmp_path / "ck"
    run = launch(_cfg(ck, 10_000, [{"kind": "crash", "step": 8, "rank": 2, "attempt": 1}]), world=3)
    _wait_until(lambda: run.procs[2].poll() is not None)
    time.sleep(1.0)
    got = _ask(run, rank=1)
    assert got["saved"] and got["rank"] == 1 and got["step"] == 7, got
    codes = run.wait(timeout=30)
    assert codes[0] == codes[1] == 1, run.logs()
    assert sorted(p.name for p in ck.iterdir()) == ["step-00000005", "step-00000007"], "one copy, no leftovers"


def test_without_rescue_sigusr1_neither_kills_nor_saves(launch, tmp_path):
    """FSDP shards the state (no rank holds all of it): no rescue, and the signal whose default
    action would end the process is ignored."""
    ck = tmp_path / "ck"
    cfg = tiny_config(ck, train={"parallelism": "fsdp", "checkpoint_every": 5}, run={"max_steps": 40, "rescue": True})
    run = launch(cfg)
    _wait_until(lambda: len(run.metrics()) >= 3)
    (run.run_dir / rescue.REQUEST_FILE).write_text(json.dumps({"rank": 0}))
    for p in run.procs:
        p.send_signal(signal.SIGUSR1)
    assert run.wait() == [0, 0], run.logs()
    assert not (run.run_dir / rescue.RESULT_FILE).exists()
    start = next(e for e in run.events() if e["event"] == "start")
    assert start["rescue"] is False


def test_peer_lost_tells_a_victim_from_a_rank_that_failed_by_itself() -> None:
    gloo = RuntimeError("Got the following error when running the callback: RuntimeError: [/pytorch/third_party/gloo/"
                        "gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:45717: Connection reset by peer.")
    assert rescue.peer_lost(gloo)
    assert rescue.peer_lost(RuntimeError("NCCL error: remote process exited or there was a network error"))
    assert not rescue.peer_lost(ValueError("shapes (4,8) and (3,8) not aligned"))
    assert not rescue.peer_lost(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))


def test_a_save_is_refused_mid_update_and_discarded_if_the_optimizer_ran_meanwhile(tmp_path) -> None:
    import torch

    model = torch.nn.Linear(4, 4)
    optim = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 4)).sum().backward()
    optim.step()
    sched = torch.optim.lr_scheduler.LambdaLR(optim, lambda e: 1.0)
    run_dir, ck = tmp_path / "run", tmp_path / "ck"
    run_dir.mkdir()
    (run_dir / rescue.REQUEST_FILE).write_text(json.dumps({"rank": 0}))

    def answer(res: rescue.Rescue) -> dict:
        res._answer()
        return json.loads((run_dir / rescue.RESULT_FILE).read_text())

    res = rescue.Rescue(run_dir=str(run_dir), checkpoint_dir=str(ck), rank=0, world_size=2, keep_last=2,
                        state=lambda: (model, optim, sched))
    res.mark(3, 300, 3)
    res.updating()
    got = answer(res)
    assert not got["saved"] and "mid optimizer step" in got["why"]

    def moving():  # the optimizer starts while the replica is being read: the rank was not stuck
        res.updating()
        return model, optim, sched

    res = rescue.Rescue(run_dir=str(run_dir), checkpoint_dir=str(ck), rank=0, world_size=2, keep_last=2,
                        state=moving)
    res.mark(3, 300, 3)
    got = answer(res)
    assert not got["saved"] and "discarded" in got["why"]
    assert not ck.exists() or not any(ck.iterdir()), "nothing left that a resume could pick up"


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.jit's, raised while torch.compile imports
def test_the_replica_state_has_the_layout_the_loader_expects(tmp_path) -> None:
    """What a rescue writes is read back by `checkpoint.load_latest`, which asks DCP's
    get_state_dict for names: the rescue builds the same dict itself (get_state_dict waits
    for the device), for a compiled model under DDP as the trainer builds it."""
    import os

    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from train_helpers import free_port

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        inner = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
        inner.register_buffer("table", torch.arange(3.0))
        # The eager backend: the same OptimizedModule wrapper (its `_orig_mod.` names are what the
        # layout is about) without Inductor's C++ compile, which took ~50 of this test's 52 s.
        model = torch.nn.parallel.DistributedDataParallel(torch.compile(inner, backend="eager"))
        decay = [p for p in model.parameters() if p.dim() >= 2]
        optim = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                   {"params": [p for p in model.parameters() if p.dim() < 2], "weight_decay": 0.0}])
        model(torch.ones(2, 4)).sum().backward()
        optim.step()
        msd, osd = get_state_dict(model, optim)
        got = rescue.replica_state(model, optim)
    finally:
        dist.destroy_process_group()
    assert list(got["model"]) == list(msd) == ["table", "0.weight", "0.bias", "1.weight", "1.bias"]
    assert all(got["model"][k] is msd[k] or torch.equal(got["model"][k], msd[k]) for k in msd)
    assert got["optim"]["param_groups"] == osd["param_groups"]
    assert list(got["optim"]["state"]) == list(osd["state"])
    for name, st in osd["state"].items():
        assert {k: v.tolist() for k, v in got["optim"]["state"][name].items()} == {k: v.tolist() for k, v in st.items()}
