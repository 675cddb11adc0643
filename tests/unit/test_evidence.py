"""campaign.evidence: blame a node only with evidence (pure decisions, table-driven)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from campaign import evidence as ev
from campaign import exits
from campaign.evidence import Primary, RankExit, Suspect, assess, confirm, exclusion_budget

# --- the signature tables, line by line ---------------------------------------------------
HARDWARE_LINES = [
    ("[Mon Nov 30 10:02:11 2026] NVRM: Xid (PCI:0000:07:00): 79, pid=0, name=python, GPU has fallen off the bus.",
     "nvidia_xid", "local"),
    ("NVRM: Xid (PCI:0000:bd:00): 48, pid=12345, name=python3, An uncorrectable double bit error (DBE) has been "
     "detected on GPU in the framebuffer at partition 6, subpartition 0.", "nvidia_xid", "local"),
    ("NVRM: Xid (PCI:0000:4e:00): 94, pid=3451, name=python, Contained: SM (0x1). RST: No, D-RST: No",
     "nvidia_xid", "local"),
    ("NVRM: Xid (PCI:0000:4e:00): 74, pid=3451, name=python, NVLink: fatal error detected on link 3(0x10000, 0x0)",
     "nvidia_xid", "local"),
    ("NVRM: Xid (PCI:0000:4e:00): 119, pid=1, name=nvidia-smi, Timeout after 6s of waiting for RPC response "
     "from GPU0 GSP!", "nvidia_xid", "local"),
    ("NVRM: GPU at PCI:0000:07:00: GPU-5e3f0b3c-1a2b-3c4d GPU has fallen off the bus.", "gpu_fallen_off_bus", "local"),
    ("RuntimeError: CUDA error: uncorrectable ECC error encountered", "cuda_ecc_uncorrectable", "local"),
    ("RuntimeError: CUDA error: uncorrectable NVLink error was detected during the execution",
     "cuda_nvlink_uncorrectable", "local"),
    ("[rank3]: RuntimeError: CUDA error: unspecified launch failure", "cuda_launch_failure", "local"),
    ("RuntimeError: level_zero backend failed with error: 20 (UR_RESULT_ERROR_DEVICE_LOST)",
     "level_zero_device_lost", "local"),
    ("terminate called after throwing an instance of 'sycl::_V1::runtime_error' what(): Native API failed. "
     "Native API returns: ZE_RESULT_ERROR_DEVICE_LOST", "level_zero_device_lost", "local"),
    ("/var/spool/pbs/mom_priv/jobs/8123.aurora-pbs.sh: line 4: 4242 Bus error (core dumped) python train.py",
     "bus_error", "local"),
    ("mce: [Hardware Error]: Machine check events logged", "machine_check", "local"),
    ("[Hardware Error]: CPU 12: Machine Check: 0 Bank 7: cc00008000010090", "machine_check", "local"),
    ("EDAC MC0: 1 UE memory read error on CPU_SrcID#0_Ha#0_Chan#1_DIMM#0", "edac_uncorrected", "local"),
    ("cxi_core 0000:21:00.0: cxi0[hsn0]: link down", "cxi_link_down", "local"),
    ("CXI_EVENT_LINK_DOWN received on cxi1", "cxi_link_down", "local"),
    ("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, "
     "remote process exited or there was a network error, NCCL version 2.20.5", "nccl_remote_error", "fabric"),
    ("n12:4021:4090 [1] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion from peer 10.1.2.3<43712> with "
     "status=12 opcode=0 len=0 vendor err 129 (Recv)", "nccl_ib_completion", "fabric"),
    ("n12:4021:4090 [1] NCCL WARN NET/IB : Got completion with error 12, opcode 1, len 32478, vendor err 129",
     "nccl_ib_completion", "fabric"),
    ("[rank7]:[E1130 10:02:11.123 ProcessGroupNCCL.cpp:616] [Rank 7] Watchdog caught collective operation timeout: "
     "WorkNCCL(SeqNum=1234, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600003 milliseconds before timing out.",
     "nccl_watchdog_timeout", "fabric"),
    ("RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
     "[127.0.0.1]:45473: Connection reset by peer", "gloo_peer_lost", "fabric"),
    # DDP's comm hook callback (parallelize.py) when the peer's process is gone (torch 2.13, gloo):
    ("RuntimeError: Got the following error when running the callback: RuntimeError: [/__w/pytorch/pytorch/"
     "third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:17575. This is "
     "typically caused by a remote worker crashing.", "gloo_peer_lost", "fabric"),
    ("libfabric:98765:1701234567::cxi:core:cxip_cq_eq_progress():531<warn> x4102c5s3b0n0: TXC (0x1234:0): "
     "PCIe error", "libfabric_error", "fabric"),
    ("MPICH ERROR: fi_cq_readerr: Input/output error", "libfabric_error", "fabric"),
    ("2026:11:30-10:02:11:(4242) |CCL_ERROR| atl_ofi_comm.cpp:301 init_transport: atl_ofi init failed",
     "ccl_atl_error", "fabric"),
    ("cxip_ep.c:420: cxi: RDMA operation timed out to nid001234", "cxi_error", "fabric"),
]

SOFTWARE_LINES = [
    ("usage: train.py [-h] [--config CONFIG]", "cli_usage"),
    ("train.py: error: unrecognized arguments: --lerning-rate 3e-4", "cli_usage"),
    ("train.py: error: the following arguments are required: --config", "cli_usage"),
    ("/usr/bin/python3: can't open file '/home/u/runs/x/train.py': [Errno 2] No such file or directory",
     "script_not_found"),
    ("ModuleNotFoundError: No module named 'flash_attn'", "module_not_found"),
    ("ImportError: libcudart.so.12: cannot open shared object file: No such file or directory", "module_not_found"),
    ("bash: torchrun: command not found", "command_not_found"),
    ("OSError: [Errno 28] No space left on device: '/lus/flare/projects/x/checkpoints/step-00000100/__0_0.distcp'",
     "no_space"),
    ("write error: ENOSPC", "no_space"),
    ("[rank1]: RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598", "short_write"),
    ("RuntimeError: [enforce fail at inline_container.cc:626] . PytorchStreamWriter failed writing file data/3: file "
     "write failed", "short_write"),
    ("RuntimeError: Error(s) in loading state_dict for GPT:", "state_dict_mismatch"),
    ('\tMissing key(s) in state_dict: "blocks.0.attn.qkv.weight".', "state_dict_mismatch"),
    ("\tsize mismatch for wte.weight: copying a param with shape torch.Size([50304, 768]) from checkpoint, the shape "
     "in current model is torch.Size([32000, 768]).", "state_dict_mismatch"),
    ("RuntimeError: Missing key in checkpoint state_dict: model.blocks.0.mlp.w1.weight.", "dcp_load_error"),
    ("torch.distributed.checkpoint.api.CheckpointException: CheckpointException ranks:dict_keys([0, 1])",
     "dcp_load_error"),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.10 GiB",
     "device_out_of_memory"),
    ("RuntimeError: UR_RESULT_ERROR_OUT_OF_DEVICE_MEMORY", "device_out_of_memory"),
    ("FileNotFoundError: [Errno 2] No such file or directory: 'data/tokens.bin'", "file_not_found"),
    ("PermissionError: [Errno 13] Permission denied: '/lus/flare/projects/other'", "permission_denied"),
    ("python: ../nptl/pthread_mutex_lock.c:81: __pthread_mutex_lock: Assertion `mutex->__data.__owner == 0' failed.",
     "c_assertion"),
    ("KeyError: 'optimizer'", "python_exception"),
    ("[rank0]: ValueError: tokens file has 12 tokens, need 1025", "python_exception"),
    ("torch.distributed.elastic.multiprocessing.errors.ChildFailedError:", "python_exception"),
]

NOT_A_SIGNATURE = [
    "step 120 | loss 3.214 | 1.2e5 tok/s",
    # Xid 13 and 31 are usually the application's own bad address, not the hardware.
    "NVRM: Xid (PCI:0000:07:00): 13, pid=1234, name=python, Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0)",
    "NVRM: Xid (PCI:0000:07:00): 31, pid=1234, name=python, Ch 00000010, intr 10000000. MMU Fault",
    "n1:1:1 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:10.0.0.1<0>",
    "EDAC MC0: 1 CE memory read error on CPU_SrcID#0_Ha#0_Chan#1_DIMM#0",
    "loading checkpoint step-00000100 (no errors)",
]


@pytest.mark.parametrize(("line", "name", "scope"), HARDWARE_LINES)
def test_hardware_signatures(line: str, name: str, scope: str) -> None:
    sig = ev.match(line, ev.HARDWARE)
    assert sig is not None and (sig.name, sig.scope) == (name, scope)
    assert ev.match(line).name == name  # hardware wins over a Python exception on the same line


@pytest.mark.parametrize(("line", "name"), SOFTWARE_LINES)
def test_software_signatures(line: str, name: str) -> None:
    assert ev.match(line, ev.HARDWARE) is None
    sig = ev.match(line, ev.SOFTWARE)
    assert sig is not None and sig.name == name and sig.scope == "software"


@pytest.mark.parametrize("line", NOT_A_SIGNATURE)
def test_lines_that_are_no_signature(line: str) -> None:
    assert ev.match(line) is None


def test_every_signature_is_tested_and_documented() -> None:
    tested = {n for _, n, _ in HARDWARE_LINES} | {n for _, n in SOFTWARE_LINES}
    assert tested == {s.name for s in (*ev.HARDWARE, *ev.SOFTWARE)}
    assert all(s.source for s in (*ev.HARDWARE, *ev.SOFTWARE))


# --- log helpers --------------------------------------------------------------------------
def test_last_error_line_prefers_a_signature_then_an_error_else_none() -> None:
    tb = ["step 3", "Traceback (most recent call last):", '  File "train.py", line 9, in <module>',
          "KeyError: 'optimizer'", "[W socket.cpp] cleanup"]
    assert ev.last_error_line(tb) == "KeyError: 'optimizer'"
    assert ev.last_error_line(["step 3", "fatal: something odd", "bye"]) == "fatal: something odd"
    assert ev.last_error_line(["step 3", "bye", "  "]) is None  # no line looks like an error: none is quoted
    assert ev.last_error_line([]) is None
    assert ev.last_error_line(["campaign.train: fault crash at step 25", "bye"]) == "campaign.train: fault crash at step 25"


def test_a_crash_quote_skips_warning_lines() -> None:
    """Issue 27 item 4: nanoGPT's FutureWarning (and the source line under it) is no crash."""
    log = ["iter 3: loss 3.4650, time 1.00ms, mfu 0.00%", "Traceback (most recent call last):",
           '  File "train.py", line 9, in <module>', "RuntimeError: shapes do not match",
           "/x/train.py:196: FutureWarning: `torch.cuda.amp.GradScaler(args...)` is deprecated. Please use "
           "`torch.amp.GradScaler('cuda', args...)` instead.",
           "  scaler = torch.cuda.amp.GradScaler(enabled=(dtype == 'float16'))",
           "[W1205 06:50:01.123 ProcessGroupGloo.cpp:123] Warning: failed to do something harmless"]
    assert ev.last_error_line(log) == "RuntimeError: shapes do not match"
    assert ev.last_error_line(log[4:6] + ["bye"]) is None


def test_normalise_removes_what_differs_between_ranks() -> None:
    a = ev.normalise("[rank0]: RuntimeError: rank 0 on n1 failed at 0x7f00ab", ["n1", "n2"])
    b = ev.normalise("[rank5]: RuntimeError: rank 5 on n2 failed at 0x7f11cd", ["n1", "n2"])
    assert a == b == "RuntimeError: rank # on <node> failed at <hex>"
    assert ev.normalise(None) == ""


def test_split_by_rank_understands_launcher_and_torch_prefixes() -> None:
    out = ev.split_by_rank(["[rank3]: KeyError: 'x'", "3: step 1", "[12] boom", "srun: error: n2: task 3: Killed"])
    assert out == {3: ["KeyError: 'x'", "step 1"], 12: ["boom"], None: ["srun: error: n2: task 3: Killed"]}


def test_read_tail(tmp_path: Path) -> None:
    log = tmp_path / "rank-0.log"
    log.write_bytes(b"".join(f"line {i}\n".encode() for i in range(200)) + b"\xff bad utf8\r\n")
    tail = ev.read_tail(log, lines=3)
    assert tail == ("line 198", "line 199", "\ufffd bad utf8")
    assert ev.read_tail(log, lines=50, max_bytes=30)[0].startswith("line 19")  # a cut first line is dropped
    assert ev.read_tail(tmp_path / "missing.log") == ()


# --- assess: the cases of issue 13 and around them ----------------------------------------
def x(rank: int, node: str, code: int, t: float = 10.0, *lines: str, stopped: bool = False) -> RankExit:
    return RankExit(rank, node, code, t, log_path=f"/run/logs/rank-{rank}.log", log_tail=tuple(lines),
                    stopped=stopped)


NODES = ("n1", "n2", "n3", "n4")
NCCL = "torch.distributed.DistBackendError: NCCL error: remote process exited or there was a network error"
XID = "NVRM: Xid (PCI:0000:07:00): 79, pid=0, name=python, GPU has fallen off the bus."
TB = ("Traceback (most recent call last):", '  File "train.py", line 40, in <module>')

CASES = [
    # (id, exits, first_step, kind, rule, suspects, retry)
    ("same startup error on 2 nodes", [x(0, "n1", 1, 10, *TB, "[rank0]: KeyError: 'optimizer'"),
                                       x(4, "n2", 1, 10, *TB, "[rank4]: KeyError: 'optimizer'")],
     False, "systemic", "same_failure", [], "stop"),
    ("same unknown startup error on 2 nodes", [x(0, "n1", 1, 10, "boom at init on n1"),
                                               x(4, "n2", 1, 11, "boom at init on n2")],
     False, "systemic", "same_failure", [], "stop"),
    ("typo'd flag everywhere", [x(r, n, 2, 10, "usage: train.py [-h]", "train.py: error: unrecognized arguments: --lr")
                                for r, n in enumerate(NODES)], False, "systemic", "contract_exit", [], "stop"),
    ("137 vs 1 in the same poll", [x(0, "n1", 1, 10, *TB, NCCL), x(5, "n2", 137, 10)],
     True, "node", "signal", ["n2"], "relaunch_elsewhere"),
    ("137 seen first, victims later", [x(5, "n2", 137, 10), x(0, "n1", 1, 10.25, NCCL), x(9, "n3", 1, 10.25, NCCL)],
     True, "node", "signal", ["n2"], "relaunch_elsewhere"),
    ("ENOSPC on one rank", [x(0, "n1", 1, 10, *TB, "OSError: [Errno 28] No space left on device: '/lus/x/ckpt'")],
     True, "systemic", "software_signature", [], "stop"),
    ("ENOSPC on two nodes", [x(0, "n1", 1, 10, "OSError: [Errno 28] No space left on device: '/lus/x/a'"),
                             x(4, "n2", 1, 10, "OSError: [Errno 28] No space left on device: '/lus/x/b'")],
     True, "systemic", "same_failure", [], "stop"),
    ("Xid in rank 3's log", [x(0, "n1", 1, 10, NCCL), x(3, "n4", 1, 12, XID, *TB, "RuntimeError: CUDA error")],
     True, "node", "hardware_signature", ["n4"], "relaunch_elsewhere"),
    ("NCCL error everywhere, one rank killed by signal", [x(0, "n1", 1, 10, NCCL), x(1, "n2", 1, 10, NCCL),
                                                          x(2, "n3", 137, 10, NCCL), x(3, "n4", 1, 10, NCCL)],
     True, "node", "signal", ["n3"], "relaunch_elsewhere"),
    ("NCCL error everywhere, no signal", [x(r, n, 1, 10, *TB, NCCL) for r, n in enumerate(NODES)],
     True, "unknown", "fabric_error", [], "confirm_once"),
    ("software error on one node after the first step", [x(2, "n3", 1, 10, *TB, "ValueError: bad batch")],
     True, "systemic", "software_signature", [], "stop"),
    ("software error with an ECC error behind it", [x(2, "n3", 1, 10, "RuntimeError: CUDA error: uncorrectable ECC "
                                                    "error encountered", *TB, "ValueError: bad batch")],
     True, "node", "hardware_signature", ["n3"], "relaunch_elsewhere"),
    ("missing key loading a checkpoint on rank 0", [x(0, "n1", 1, 10, *TB, "RuntimeError: Missing key in checkpoint "
                                                    "state_dict: model.wte.weight."), x(1, "n2", 143, 20, stopped=True)],
     False, "systemic", "software_signature", [], "stop"),
    ("relative script path not found", [x(0, "n1", 2, 10, "python3: can't open file '/x/train.py': [Errno 2] No such "
                                         "file or directory")], False, "systemic", "contract_exit", [], "stop"),
    ("broken environment", [x(0, "n1", 127, 10, "bash: torchrun: command not found")],
     False, "systemic", "contract_exit", [], "stop"),
    ("bad config", [x(0, "n1", 93, 10, "config error: steps must be > 0")], False, "systemic", "contract_exit", [],
     "stop"),
    ("diverged", [x(0, "n1", 94, 10, "loss is nan at step 40")], True, "systemic", "contract_exit", [], "stop"),
    ("SIGKILL on two nodes before the first step", [x(0, "n1", 137, 10), x(4, "n2", 137, 10)],
     False, "systemic", "signal_everywhere", [], "stop"),
    ("SIGKILL on two nodes mid-run", [x(0, "n1", 137, 10), x(4, "n2", 137, 10)],
     True, "unknown", "signal_everywhere", [], "confirm_once"),
    ("two ranks of one node OOM-killed", [x(4, "n2", 137, 10), x(5, "n2", 137, 10), x(0, "n1", 1, 11, NCCL)],
     True, "node", "signal", ["n2"], "relaunch_elsewhere"),
    ("SIGBUS on one node", [x(6, "n3", 135, 10, "Bus error (core dumped)")],
     True, "node", "hardware_signature", ["n3"], "relaunch_elsewhere"),
    ("SIGSEGV on one node", [x(6, "n3", 139, 10)], True, "node", "signal", ["n3"], "relaunch_elsewhere"),
    ("SIGABRT is not node evidence", [x(1, "n2", 134, 10, "terminate called after throwing an instance of "
                                        "'c10::Error'")], True, "unknown", "insufficient", [], "confirm_once"),
    ("SIGKILL on a single-node job", [x(0, "n1", 137, 10)], True, "unknown", "insufficient", [], "confirm_once"),
    ("a hardware error every node reports", [x(0, "n1", 1, 10, "CUDA error: unspecified launch failure"),
                                             x(4, "n2", 1, 10, "CUDA error: unspecified launch failure")],
     True, "unknown", "hardware_everywhere", [], "confirm_once"),
    ("a rank the supervisor killed is no evidence", [x(0, "n1", 1, 10, *TB, "KeyError: 'x'"),
                                                     x(5, "n2", 137, 20, stopped=True)],
     True, "systemic", "software_signature", [], "stop"),
    ("exit 1 with an empty log", [x(3, "n2", 1, 10)], True, "unknown", "insufficient", [], "confirm_once"),
    ("nothing failed", [x(0, "n1", 0), x(1, "n2", 143, stopped=True)], True, "unknown", "no_failure", [],
     "confirm_once"),
]


@pytest.mark.parametrize(("case", "exits_seen", "first_step", "kind", "rule", "suspects", "retry"),
                         CASES, ids=[c[0] for c in CASES])
def test_assess(case: str, exits_seen: list[RankExit], first_step: bool, kind: str, rule: str, suspects: list[str],
                retry: str) -> None:
    nodes = {"SIGKILL on a single-node job": ("n1",), "a hardware error every node reports": ("n1", "n2")}
    f = assess(exits_seen, first_step=first_step, nodes=nodes.get(case, NODES))
    assert (f.kind, f.rule, [s.node for s in f.suspects], f.retry) == (kind, rule, suspects, retry), f.message
    assert "exclud" not in f.message  # a finding blames; only the stage excludes (and says so)
    if f.last_error_line:
        assert f'"{f.last_error_line}"' in f.message and str(f.log_path) in f.message
    json.dumps(f.to_dict())


def test_the_signal_killed_rank_wins_the_tie_not_the_lower_index() -> None:
    f = assess([x(0, "n1", 1, 10, NCCL), x(5, "n2", 137, 10)], first_step=True, nodes=NODES)
    assert f.primary == Primary(5, "n2", 137)
    s = f.suspects[0]
    assert s.evidence["rank"] == 5 and s.evidence["exit_code"] == 137 and s.evidence["signal"] == "SIGKILL"
    assert s.evidence["log_path"] == "/run/logs/rank-5.log"


def test_ties_without_evidence_go_to_the_earliest_then_the_lowest_rank() -> None:
    f = assess([x(3, "n2", 1, 10, "error A"), x(1, "n1", 1, 10, "error B")], first_step=True, nodes=NODES)
    assert f.primary.rank == 1
    f = assess([x(3, "n2", 1, 9, "error A"), x(1, "n1", 1, 10, "error B")], first_step=True, nodes=NODES)
    assert f.primary.rank == 3 and f.last_error_line == "error A" and f.log_path == "/run/logs/rank-3.log"


def test_same_poll_window() -> None:
    seen = [x(0, "n1", 1, 10.0, "RuntimeError: boom"), x(5, "n2", 137, 10.2)]
    assert assess(seen, first_step=True, nodes=NODES).primary.rank == 0  # 137 came a poll later
    f = assess(seen, first_step=True, nodes=NODES, same_poll_s=0.5)
    assert f.kind == "node" and f.suspects[0].node == "n2"


GLOO_RESET = ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:29585: "
              "Connection reset by peer")
GLOO_CLOSED = ("RuntimeError: Got the following error when running the callback: RuntimeError: [/__w/pytorch/pytorch/"
               "third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:17575. This is "
               "typically caused by a remote worker crashing. Check the logs of the remote worker before reporting an "
               "error. GLHF!")


@pytest.mark.parametrize("victim_line", [NCCL, GLOO_RESET])
def test_a_victim_that_dies_first_does_not_lead(victim_line: str) -> None:
    """Seen in CI: rank 1 exits 1 (its own error); rank 0 loses its peer, aborts (134) with
    gloo's 'Connection reset by peer' and is seen 1.5 s before rank 1's slower exit. The
    failure is rank 1's; the victim's earlier death must not make the finding about rank 0."""
    seen = [x(0, "n1", 134, 10.0, victim_line, "terminate called without an active exception"),
            x(1, "n2", 1, 11.5, "campaign.train: fault crash at step 25")]
    f = assess(seen, first_step=True, nodes=NODES, same_poll_s=1.0)
    assert f.primary == Primary(1, "n2", 1)
    assert f.last_error_line == "campaign.train: fault crash at step 25" and f.log_path == "/run/logs/rank-1.log"
    assert f.kind == "unknown" and f.suspects == ()  # one failure alone: one confirming retry, nobody blamed
    only_victims = assess(seen[:1], first_step=True, nodes=NODES, same_poll_s=1.0)
    assert only_victims.rule == "fabric_error" and only_victims.primary.rank == 0


def test_every_rank_aborting_the_same_way_after_training_gets_a_confirming_retry() -> None:
    """Seen in CI: both ranks of a plain DDP script that had reached its last step aborted in
    gloo's teardown ("terminate called without an active exception", 134). The same failure
    everywhere blames no node; after training started and matching no known error it is not
    yet systemic: one confirming retry (before: crashed_systemic, the loss check failed)."""
    line = "terminate called without an active exception"
    f = assess([x(0, "n1", 134, 10.0, line), x(1, "n2", 134, 10.0, line)], first_step=True, nodes=NODES)
    assert (f.kind, f.rule, f.retry, f.suspects) == ("unknown", "same_failure", "confirm_once", ())
    assert exits.classify_finding(134, f.kind) in exits.CONFIRM_ONCE
    before_training = assess([x(0, "n1", 134, 10.0, line), x(1, "n2", 134, 10.0, line)], first_step=False,
                             nodes=NODES)
    assert (before_training.kind, before_training.retry) == ("systemic", "stop")


def test_a_victim_exiting_1_in_the_same_poll_as_the_crashed_rank_does_not_make_it_systemic() -> None:
    """Seen with warm start: rank 1 crashes (exit 1, no error line), rank 0's DDP callback
    raises on gloo's 'Connection closed by peer' (exit 1), one poll sees both. Rank 0 is the
    victim: the failure is rank 1's, unknown (before: rank 0 led, its Python exception read
    as a software error: crashed_systemic, the long run stopped)."""
    seen = [x(0, "n1", 1, 10.0, GLOO_CLOSED), x(1, "n2", 1, 10.0, "campaign.train: fault crash at step 15")]
    f = assess(seen, first_step=True, nodes=NODES)
    assert f.primary == Primary(1, "n2", 1)
    assert (f.kind, f.retry, f.suspects) == ("unknown", "confirm_once", ())


@pytest.mark.parametrize("victim_line", [NCCL, GLOO_RESET, GLOO_CLOSED])
def test_a_victim_seen_in_the_same_poll_does_not_lead_by_its_abort_signal(victim_line: str) -> None:
    """Seen in CI: rank 1 exits 1 (its own error), rank 0 aborts (134, SIGABRT) on the lost
    peer, and one poll sees both. Death by a signal must not make the victim the primary."""
    seen = [x(0, "n1", 134, 10.0, victim_line, "terminate called after throwing an instance of 'gloo::IoException'"),
            x(1, "n2", 1, 10.0, "campaign.train: fault crash at step 25")]
    f = assess(seen, first_step=True, nodes=NODES)
    assert f.primary == Primary(1, "n2", 1) and f.log_path == "/run/logs/rank-1.log"
    assert f.kind == "unknown" and f.suspects == () and f.retry == "confirm_once"


def test_a_hardware_signature_names_its_evidence() -> None:
    f = assess([x(0, "n1", 1, 10, NCCL), x(3, "n4", 1, 12, XID, "RuntimeError: CUDA error")],
               first_step=True, nodes=NODES)
    s = f.suspects[0]
    assert s.evidence["signature"] == "nvidia_xid" and s.evidence["matched_line"] == XID
    assert s.evidence["rank"] == 3 and "nvidia_xid" in s.reason and f.signature == "nvidia_xid"
    assert s.to_dict() == {"node": "n4", "reason": s.reason, "evidence": s.evidence}


def test_message_quotes_the_line_and_names_the_log() -> None:
    f = assess([x(0, "n1", 1, 10, *TB, "OSError: [Errno 28] No space left on device: '/lus/x/ckpt'")],
               first_step=True)
    assert f.message.startswith("rank 0 on n1 exited with 1: \"OSError: [Errno 28] No space left on device")
    assert "(log: /run/logs/rank-0.log)" in f.message and f.signature == "no_space"


def test_launcher_mode_with_the_rank_lines_of_the_launcher_log() -> None:
    log = ["[rank0]: step 10", "[rank3]: " + XID, "[rank3]: RuntimeError: CUDA error: unspecified launch failure",
           "srun: error: n2: task 3: Exited with exit code 1"]
    by_rank = ev.split_by_rank(log)
    f = assess([RankExit(3, "n2", 1, 10.0, "/run/logs/launcher.log", tuple(by_rank[3]))], first_step=True,
               nodes=("n1", "n2"))
    assert f.kind == "node" and f.suspects[0].node == "n2"


def test_stall_suspects_are_node_evidence() -> None:
    culprits = [{"node": "n3", "reason": "rank 6 heartbeat stopped 40 s ago at step 17", "evidence": {"rank": 6}}]
    f = assess([x(0, "n1", 143, 10, stopped=True)], first_step=True, nodes=NODES, stall_suspects=culprits)
    assert (f.kind, f.rule, f.retry) == ("node", "stall", "relaunch_elsewhere")
    assert f.suspects[0].to_dict() == culprits[0] and "heartbeat stopped" in f.message


def test_from_popen_normalises_signals() -> None:
    assert RankExit.from_popen(2, "n1", -9, 1.0).code == 137
    assert RankExit.from_popen(2, "n1", 1, 1.0).code == 1
    assert ev.signal_name(137) == "SIGKILL" and ev.signal_name(1) is None


def test_finding_round_trips_through_json() -> None:
    f = assess([x(0, "n1", 1, 10, NCCL), x(5, "n2", 137, 10)], first_step=True, nodes=NODES)
    stored = json.loads(json.dumps(f.to_dict()))  # what the report and the ledger hold: plain strings and dicts
    assert stored["retry"] == "relaunch_elsewhere" and stored["primary"] == {"rank": 5, "node": "n2", "exit_code": 137}
    back = ev.Finding.from_dict(stored)
    assert back == f and isinstance(back.primary, Primary) and back.retry is ev.Retry.RELAUNCH_ELSEWHERE


# --- confirm: the retry of an unknown finding ---------------------------------------------
def unknown(rank: int, node: str, line: str = "err") -> ev.Finding:
    f = assess([x(rank, node, 1, 10, line)], first_step=True, nodes=NODES)
    assert f.kind == "unknown"
    return f


@pytest.mark.parametrize(("first", "second", "kind", "rule", "suspects"), [
    ((0, "n1"), (4, "n1"), "node", "confirm_node", ["n1"]),        # followed the node across ranks
    ((0, "n1"), (0, "n2"), "systemic", "confirm_moved", []),       # followed the rank
    ((0, "n1"), (5, "n3"), "systemic", "confirm_moved", []),       # moved around
    ((0, "n1"), (0, "n1"), "unknown", "confirm_same_place", []),   # cannot tell rank from node
])
def test_confirm(first: tuple[int, str], second: tuple[int, str], kind: str, rule: str, suspects: list[str]) -> None:
    f = confirm(unknown(*first), unknown(*second))
    assert (f.kind, f.rule, [s.node for s in f.suspects]) == (kind, rule, suspects)
    assert f.retry == ("relaunch_elsewhere" if kind == "node" else "stop")


def test_confirm_a_launcher_that_names_the_node_but_no_rank_blames_the_node_the_ranks_rotated_over() -> None:
    """MPICH's banner names the node ("PID 2939 RUNNING AT n1 ... EXIT CODE: 9") and no rank:
    measured under the PBS emulator (goodput.py --site pbs), two node losses on one node were
    "the rank and the node did not move". The retry rotated the ranks: other ranks ran on n1
    the second time, so the failure followed the node. Without rotation it still cannot tell."""
    rotated = (["n1", "n2"], ["n2", "n1"])
    f = confirm(unknown(-1, "n1"), unknown(-1, "n1"), rotated)
    assert (f.kind, f.rule, [s.node for s in f.suspects]) == ("node", "confirm_node", ["n1"])
    assert "other ranks on it the second time (the launcher named no rank; the ranks rotated" in f.suspects[0].reason
    assert confirm(unknown(-1, "n1"), unknown(-1, "n1"), (["n1", "n2"], ["n1", "n2"])).rule == "confirm_same_place"
    assert confirm(unknown(-1, "n1"), unknown(-1, "n1")).rule == "confirm_same_place"
    assert confirm(unknown(-1, "n1"), unknown(-1, "n2"), rotated).rule == "confirm_moved"


def test_confirm_keeps_a_retry_that_found_evidence() -> None:
    hw = assess([x(3, "n4", 1, 12, XID)], first_step=True, nodes=NODES)
    assert confirm(unknown(0, "n1"), hw) is hw
    assert confirm(hw, unknown(0, "n1")).kind == "unknown"


# --- the exclusion budget -----------------------------------------------------------------
S = [Suspect(n, f"reason {n}") for n in ("n1", "n2", "n3")]


@pytest.mark.parametrize(("suspects", "already", "per_attempt", "per_chain", "exclude", "probe"), [
    ([], 0, 1, 3, [], []),
    (S[:1], 0, 1, 3, ["n1"], []),
    (S, 0, 1, 3, ["n1"], ["n2", "n3"]),
    (S, 0, 2, 3, ["n1", "n2"], ["n3"]),
    (S, 2, 2, 3, ["n1"], ["n2", "n3"]),
    (S[:1], 3, 1, 3, [], ["n1"]),
    (S[:1], 7, 1, 3, [], ["n1"]),
    ([S[0], S[1], Suspect("n1", "again")], 0, 2, 3, ["n1", "n2"], []),
])
def test_exclusion_budget(suspects: list[Suspect], already: int, per_attempt: int, per_chain: int,
                          exclude: list[str], probe: list[str]) -> None:
    b = exclusion_budget(suspects, already_excluded=already, per_attempt=per_attempt, per_chain=per_chain)
    assert ([s.node for s in b.exclude], [s.node for s in b.probe]) == (exclude, probe)
    assert b.reason


def test_exclusion_budget_takes_report_dicts() -> None:
    b = exclusion_budget([{"node": "n9", "reason": "r", "evidence": {"rank": 1}}], already_excluded=0)
    assert b.exclude == (Suspect("n9", "r", {"rank": 1}),) and b.reason == "excluding n9"


# --- exit classes of findings (campaign.exits) ---------------------------------------------
@pytest.mark.parametrize(("code", "kind", "cls"), [
    (1, "node", "crashed_node"), (137, "node", "crashed_node"), (1, "systemic", "crashed_systemic"),
    (1, "unknown", "crashed_unknown"), (127, "node", "crashed_systemic"), (93, "systemic", "config_error"),
    (94, "systemic", "diverged"), (124, "node", "stalled"), (143, "unknown", "walltime"), (0, "unknown", "succeeded"),
])
def test_classify_finding(code: int, kind: str, cls: str) -> None:
    from campaign import exits

    assert exits.classify_finding(code, kind) == cls and cls in exits.CLASSES
    assert "crashed_unknown" in exits.CONFIRM_ONCE and "crashed_unknown" not in exits.RESUMABLE



# What build-nanogpt and nanoGPT print before their first step (issue 39, item 5): no cause.
STARTUP_LINES = ("using device: cpu", "total desired batch size: 1024", "found vocab_size = 32 (inside data/meta.pkl)",
                 "number of parameters: 0.01M")


@pytest.mark.parametrize("code", [1, 137])
def test_a_crash_whose_log_shows_no_error_quotes_none_and_says_so(code: int) -> None:
    """Issue 39, item 5: the finding quoted the last line printed ("using device: cpu") as the
    cause; it quotes a line that looks like an error, or says the log shows none."""
    for tail in (STARTUP_LINES[:1], STARTUP_LINES):
        f = assess([x(0, "n1", code, 10, *tail)], first_step=False, nodes=NODES)
        assert f.last_error_line is None and not any(line in f.message for line in tail), f.message
        assert "its log (/run/logs/rank-0.log) shows no error line" in f.message, f.message
    f = assess([x(0, "n1", 1, 10, *STARTUP_LINES, "AssertionError: bad shape", "using device: cpu")], first_step=False,
               nodes=NODES)
    assert f.last_error_line == "AssertionError: bad shape" and '"AssertionError: bad shape"' in f.message
    broken = "campaign.train: broken environment: ImportError('libtorch_cpu.so: cannot open shared object file')"
    for line in (broken, "Unable to locate sufficient 2 gpus to run this example. Exiting.",
                 "python: can't open file '/x/train.py': [Errno 2] No such file or directory"):
        assert ev.last_error_line([*STARTUP_LINES, line, "using device: cpu"]) == line
