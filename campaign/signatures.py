"""Known error lines: the signatures a failed rank's log is read for, as data (stdlib only).

    sig = match("NVRM: Xid (PCI:0000:3b:00): 79, ...")     # Signature(name="nvidia_xid", scope="local", ...)

`HARDWARE` (scope "local": points at the node whose log prints it; "fabric": a network error
the failing node and its victims print alike) and `SOFTWARE` (the trainer's or its
configuration's). `campaign.evidence` decides what they mean for an attempt; the trainer's
rescue asks only whether a collective failed on a fabric error (a peer went away), so it
reads this table, not the supervisor's evidence.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = ["HARDWARE", "SOFTWARE", "Signature", "match"]


@dataclass(frozen=True)
class Signature:
    """One known error line: `pattern` is searched (not matched) in a log line."""

    name: str
    pattern: re.Pattern[str]
    source: str
    scope: Literal["local", "fabric", "software"]
    """local: points at the node whose log prints it; fabric: a network error seen by a node
    or by its peers (never blames alone); software: the trainer's or its configuration's."""


def _sig(name: str, pattern: str, source: str, scope: Literal["local", "fabric", "software"],
         flags: int = 0) -> Signature:
    return Signature(name, re.compile(pattern, flags), source, scope)


_HW_XIDS = "48|61|62|63|64|74|79|92|94|95|119|120"
HARDWARE: tuple[Signature, ...] = (
    _sig("nvidia_xid", rf"NVRM: Xid \([^)]*\): (?:{_HW_XIDS})\b",
         "NVIDIA 'Xid Errors' (docs.nvidia.com/deploy/xid-errors): 48 DBE ECC, 61/62 internal micro-controller, "
         "63/64 row remapping, 74 NVLink, 79 fallen off the bus, 92 high SBE rate, 94/95 contained/uncontained ECC, "
         "119/120 GSP. Xid 13, 31, 43 are usually the application's own fault and are not listed", "local"),
    _sig("gpu_fallen_off_bus", r"GPU has fallen off the bus", "NVRM kernel message with Xid 79", "local"),
    _sig("cuda_ecc_uncorrectable", r"uncorrectable ECC error", "CUDA cudaErrorECCUncorrectable: "
         "'uncorrectable ECC error encountered'", "local", re.I),
    _sig("cuda_nvlink_uncorrectable", r"uncorrectable NVLink error", "CUDA cudaErrorNvlinkUncorrectable", "local"),
    _sig("cuda_launch_failure", r"CUDA error: unspecified launch failure",
         "CUDA cudaErrorLaunchFailure as PyTorch prints it; on one node it comes with an Xid", "local"),
    _sig("level_zero_device_lost", r"\b(?:ZE|UR)_RESULT_ERROR_DEVICE_LOST\b",
         "Level Zero ze_result_t / Unified Runtime ur_result_t: the Intel GPU was lost (reset, hang, PCIe)", "local"),
    _sig("bus_error", r"\bBus error\b|\bSIGBUS\b", "the shell's message for a process killed by SIGBUS", "local"),
    _sig("machine_check", r"\[Hardware Error\]|Machine [Cc]heck (?:Exception|Events? [Ll]ogged)|\bmce: ",
         "Linux MCE / APEI messages (arch/x86/kernel/cpu/mce) forwarded into the ranks' logs", "local"),
    _sig("edac_uncorrected", r"EDAC \S+: \d+ UE\b",
         "Linux EDAC memory controller: 'EDAC MC0: 1 UE ...' (uncorrected error)", "local"),
    _sig("cxi_link_down", r"\bcxi\S*\b.*\blink (?:is )?down\b|CXI_EVENT_LINK_DOWN|\bcxi\d+: .*[Ll]ink down",
         "HPE Slingshot CXI driver / libfabric cxi provider: the node's NIC lost its link", "local", re.I),
    # Network errors: printed by the failing node and by its peers alike.
    _sig("nccl_remote_error", r"remote process exited or there was a network error",
         "NCCL ncclRemoteError string (src/misc/utils / ncclGetErrorString)", "fabric"),
    _sig("nccl_ib_completion", r"NET/IB ?: .*Got completion (?:from peer \S+ )?with (?:error|status)",
         "NCCL net_ib.cc: 'NET/IB : Got completion from peer <addr> with error 12, opcode ..., vendor err 129'",
         "fabric"),
    _sig("gloo_peer_lost", r"gloo/transport/\S+\] (?:(?:Read|Write) error .*)?(?:Connection reset by peer|Connection closed by peer|Broken pipe)",
         "PyTorch gloo tcp pair.cc: a peer's socket closed under the collective (the peer died or the link did): "
         "what the survivors print when one rank fails ('Read error [...]: Connection reset by peer', or "
         "'pair.cc:553] Connection closed by peer [addr]:port' from a DDP comm hook's callback)", "fabric"),
    _sig("nccl_watchdog_timeout", r"Watchdog caught collective operation timeout",
         "PyTorch ProcessGroupNCCL watchdog: a collective did not finish (a peer hung or the network)", "fabric"),
    _sig("libfabric_error", r"\bfi_[a-z_]+(?:\(\))?(?: failed|: | returned)|\blibfabric:\d+:.*:(?:cxi|verbs|tcp|"
         r"efa):[^<]*<(?:warn|error)>",
         "libfabric: an fi_* call failed (fi_cq_readerr, fi_getinfo, ...) or a provider warning", "fabric"),
    _sig("ccl_atl_error", r"\|CCL_(?:ERROR|FATAL)\|.*\b(?:atl|ofi|fi_|cxi)|\bATL\b.*\b(?:error|failed)\b",
         "oneCCL: an ATL (transport layer: OFI/MPI) error, e.g. '|CCL_ERROR| atl_ofi.cpp:...'", "fabric", re.I),
    _sig("cxi_error", r"\bcxip?\b.*\b(?:error|timeout|timed out|failed)\b",
         "libfabric cxi provider / Slingshot NIC errors other than a link down", "fabric", re.I),
)
"""Hardware, driver and network signatures. Order matters only for which name is reported
when one line matches several."""

SOFTWARE: tuple[Signature, ...] = (
    _sig("cli_usage", r"^(?:\S*: )?usage: |error: unrecognized arguments|error: the following arguments are required"
         r"|error: argument \S+", "argparse: a typo'd or missing flag (exits 2)", "software"),
    _sig("script_not_found", r"can't open file .*No such file or directory",
         "python: the script path (e.g. a relative path from another cwd) does not exist", "software"),
    _sig("module_not_found", r"ModuleNotFoundError|ImportError: ", "python: the environment lacks a module",
         "software"),
    _sig("command_not_found", r"command not found|: not found$", "shell: a missing command (exits 127)", "software"),
    _sig("no_space", r"No space left on device|\bENOSPC\b|\[Errno 28\]",
         "errno 28 ENOSPC: the file system (shared: every node alike) is full", "software"),
    _sig("short_write", r"inline_container\.cc.*unexpected pos|PytorchStreamWriter failed writing",
         "PyTorch's checkpoint writer wrote less than it asked for (seen on a full tmpfs: 'unexpected pos 704 vs "
         "598'): a full file system or quota, as ENOSPC", "software"),
    _sig("state_dict_mismatch", r"Missing key\(s\) in state_dict|Unexpected key\(s\) in state_dict|"
         r"size mismatch for \S+|Error\(s\) in loading state_dict",
         "torch.nn.Module.load_state_dict: the checkpoint does not fit the model", "software"),
    _sig("dcp_load_error", r"Missing key in checkpoint state_dict|CheckpointException|"
         r"Size mismatch between saved|torch\.distributed\.checkpoint.*(?:Error|Exception)",
         "torch.distributed.checkpoint (DCP): load planner / CheckpointException", "software"),
    _sig("device_out_of_memory", r"(?:CUDA|XPU) out of memory|OutOfMemoryError|"
         r"(?:UR|ZE)_RESULT_ERROR_OUT_OF_DEVICE_MEMORY",
         "the model/batch does not fit the device: configuration, not the node", "software"),
    _sig("file_not_found", r"No such file or directory|FileNotFoundError", "a path that does not exist", "software"),
    _sig("permission_denied", r"Permission denied|PermissionError", "a path the trainer may not use", "software"),
    _sig("c_assertion", r"Assertion [`'].*' failed", "glibc assert()", "software"),
    _sig("python_exception", r"(?:^|[\s:\]>])(?:[A-Za-z_][\w]*\.)*[A-Z]\w*(?:Error|Exception|Interrupt)(?::|$)",
         "the last line of a Python traceback: 'XxxError: message'", "software"),
)
"""Known software/configuration signatures, most specific first (the first that matches names it)."""


def match(line: str, table: Sequence[Signature] | None = None) -> Signature | None:
    """The first signature of `table` (default: HARDWARE then SOFTWARE) found in `line`."""
    for sig in table if table is not None else (*HARDWARE, *SOFTWARE):
        if sig.pattern.search(line):
            return sig
    return None
