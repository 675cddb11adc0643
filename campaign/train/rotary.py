"""Rotary position embeddings: the tables, the rotation, and the attention's use of both.

`rotate_qkv(qkv, cos, sin)` takes the QKV projection's output viewed as (B, T, 3, H, D) and
returns q and k rotated and v, each (B, T, H, D). On a CUDA tensor, where Triton imports,
it runs the two kernels of `rotary_triton` (one pass forward over q and k; one pass
backward that writes dq, dk and dv straight into the projection's gradient); anywhere else
it is `apply_rotary` on q and k, the PyTorch expression the CPU golden tests pin down.
The two compute the same rotation; the kernels keep it in fp32 and round once (as Inductor's
fused code does), so on the GPU they agree with the compiled PyTorch path to rounding, not
bit for bit. `CAMPAIGN_ROTARY=torch` forces the PyTorch path (to compare, or to step
around a Triton that misbehaves).
"""

from __future__ import annotations

import os
from typing import Any

import torch


def rotary_tables(seq_len: int, head_dim: int, base: float = 10000.0) -> tuple[torch.Tensor, ...]:
    """(cos, sin), each (seq_len, head_dim / 2) in fp32."""
    inv = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    freqs = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv)
    return freqs.cos(), freqs.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (B, T, H, D); rotate pairs (first half, second half) of the head dimension."""
    d = x.shape[-1] // 2
    x1, x2 = x[..., :d], x[..., d:]
    T = x.shape[1]
    cos, sin = cos[:T, None].to(x.dtype), sin[:T, None].to(x.dtype)  # (T, 1, D/2): every head
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


_KERNELS: Any = None
"""The Triton kernels' module once `load_kernels` found it; None until then, and for good
where Triton does not import (CPU builds of torch come without it) or CAMPAIGN_ROTARY=torch."""


def load_kernels() -> bool:
    """Import the Triton kernels if this host can run them (a CUDA device, Triton, and not
    CAMPAIGN_ROTARY=torch). Called when the model is built, outside any compiled region,
    so `rotate_qkv` only reads a global (which torch.compile guards on)."""
    global _KERNELS
    if _KERNELS is None and torch.cuda.is_available() and os.environ.get("CAMPAIGN_ROTARY", "").lower() != "torch":
        try:
            from campaign.train import rotary_triton
        except ImportError:
            return False
        _KERNELS = rotary_triton
    return _KERNELS is not None


def rotate_qkv(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """qkv: (B, T, 3, H, D) -> (q rotated, k rotated, v), each (B, T, H, D)."""
    if qkv.shape[1] > cos.shape[0]:
        raise ValueError(f"sequence of {qkv.shape[1]} tokens is longer than the rotary tables "
                         f"({cos.shape[0]} positions: the model's seq_len)")
    if qkv.is_cuda and _KERNELS is not None:
        return _KERNELS.RotaryQKV.apply(qkv, cos, sin)  # type: ignore[no-any-return]
    q, k, v = qkv.unbind(2)
    return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v
