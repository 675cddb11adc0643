"""Model FLOPs utilisation (MFU), as nanoGPT's `estimate_mfu`.

flops per token = 6 N + 12 L H Q T (N parameters, L layers, H heads, Q head dim, T context);
MFU = flops per token x tokens/s per device / peak bf16 dense FLOPS of the device
(`precision: float8` runs also report `mfu_float8`, against the float8 dense peak).
"""

from __future__ import annotations

# bf16 dense peak per device as torch names it. Aurora's PVC: one device per tile
# (ZE_FLAT_DEVICE_HIERARCHY=FLAT), half of the 1550 card's 838.9 TFLOPS.
PEAK_FLOPS: dict[str, float] = {
    "NVIDIA H200": 989e12,
    "NVIDIA H100 80GB HBM3": 989e12,
    "NVIDIA H100": 989e12,
    "NVIDIA A100-SXM4-80GB": 312e12,
    "NVIDIA A100-SXM4-40GB": 312e12,
    "NVIDIA A100": 312e12,
    "Intel(R) Data Center GPU Max 1550": 419.4e12,
}


# float8 dense peak (no sparsity), for `precision: float8` runs: NVIDIA's H100 SXM / H200
# datasheets, 1,979 TFLOPS (twice the bf16 figure). Devices without float8 matmuls are absent.
PEAK_FLOPS_FLOAT8: dict[str, float] = {
    "NVIDIA H200": 1979e12,
    "NVIDIA H100 80GB HBM3": 1979e12,
    "NVIDIA H100": 1979e12,
}


def peak_flops(device_name: str | None, *, float8: bool = False) -> float | None:
    """Exact name first, then the longest table key the name starts with; None if unknown."""
    table = PEAK_FLOPS_FLOAT8 if float8 else PEAK_FLOPS
    if not device_name:
        return None
    if device_name in table:
        return table[device_name]
    hits = [k for k in table if device_name.startswith(k)]
    return table[max(hits, key=len)] if hits else None


def flops_per_token(n_params: int, n_layer: int, n_head: int, head_dim: int, seq_len: int) -> float:
    return 6 * n_params + 12 * n_layer * n_head * head_dim * seq_len


def mfu(flops_token: float, tokens_per_s_per_device: float, device_name: str | None, *,
        float8: bool = False) -> float | None:
    """Against the dense bf16 peak (nanoGPT's estimate), or with `float8` the float8 peak."""
    peak = peak_flops(device_name, float8=float8)
    return None if peak is None else flops_token * tokens_per_s_per_device / peak


def device_name(device) -> str | None:  # device: torch.device
    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "xpu":
        return torch.xpu.get_device_name(device)
    return None
