"""Rotary embeddings as two Triton kernels, for CUDA (imported by `rotary.load_kernels` only).

Why: profiled at 1b on an H200 (a history note in docs/performance.md), Inductor's code for
the PyTorch rotary spent 13.1 ms a step in the backward (the rotation's gradient and the concatenation
of dq, dk, dv into the QKV projection's gradient, at a third of the memory bandwidth) and
3.8 ms in the forward. Here:

- forward: one pass reads q and k from the projection's output (B, T, 3, H, D) and writes
  them rotated, each (B, T, H, D) contiguous; v stays a view of the projection's output;
- backward: one pass reads dq, dk, dv and writes the projection's gradient (B, T, 3, H, D)
  directly: dq and dk rotated back, dv copied.

Math in fp32 with one rounding at the store; the tables are first rounded to the
activations' dtype, as `rotary.apply_rotary` does. Both kernels are `torch.library.triton_op`s,
so torch.compile sees them (no graph break) and eager runs them too; `RotaryQKV` is the
autograd.Function that pairs them. Under TRITON_INTERPRET=1 they run on CPU tensors (the
tests use that where no GPU is).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

_ELEMENTS = 4096
"""Elements of q (or k) one program handles: rows x head_dim."""


@triton.jit
def _rotate(src, dst, c, s, mask, HALF: tl.constexpr, BACKWARD: tl.constexpr):
    """One tile of rows: (x1, x2) -> (x1 c - x2 s, x1 s + x2 c), or its inverse."""
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32)
    if BACKWARD:
        y1 = x1 * c + x2 * s
        y2 = x2 * c - x1 * s
    else:
        y1 = x1 * c - x2 * s
        y2 = x1 * s + x2 * c
    tl.store(dst, y1.to(dst.dtype.element_ty), mask=mask)
    tl.store(dst + HALF, y2.to(dst.dtype.element_ty), mask=mask)


@triton.jit
def _tables(cos_ptr, sin_ptr, t, cols, mask, HALF: tl.constexpr, OUT_DTYPE: tl.constexpr):
    """cos and sin at positions t (one per row), rounded to the activations' dtype, in fp32."""
    at = t[:, None] * HALF + cols[None, :]
    c = tl.load(cos_ptr + at, mask=mask, other=0.0).to(OUT_DTYPE).to(tl.float32)
    s = tl.load(sin_ptr + at, mask=mask, other=0.0).to(OUT_DTYPE).to(tl.float32)
    return c, s


@triton.jit
def _rotary_fwd(qkv_ptr, cos_ptr, sin_ptr, q_ptr, k_ptr, n_rows, T, H,
                s_b, s_t, s_s, s_h,
                HALF: tl.constexpr, BLOCK: tl.constexpr, ROWS: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    mask = (rows < n_rows)[:, None] & (cols < HALF)[None, :]
    b = rows // (T * H)
    t = (rows // H) % T
    h = rows % H
    c, s = _tables(cos_ptr, sin_ptr, t, cols, mask, HALF, q_ptr.dtype.element_ty)
    src = (b.to(tl.int64) * s_b + t.to(tl.int64) * s_t + h.to(tl.int64) * s_h)[:, None] + cols[None, :]
    dst = rows.to(tl.int64)[:, None] * (2 * HALF) + cols[None, :]
    _rotate(qkv_ptr + src, q_ptr + dst, c, s, mask, HALF, False)
    _rotate(qkv_ptr + s_s + src, k_ptr + dst, c, s, mask, HALF, False)


@triton.jit
def _rotary_bwd(dq_ptr, dk_ptr, dv_ptr, cos_ptr, sin_ptr, dqkv_ptr, n_rows, T, H,
                q_b, q_t, q_h, k_b, k_t, k_h, v_b, v_t, v_h,
                HALF: tl.constexpr, BLOCK: tl.constexpr, ROWS: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    mask = (rows < n_rows)[:, None] & (cols < HALF)[None, :]
    b = (rows // (T * H)).to(tl.int64)
    t = (rows // H) % T
    h = (rows % H).to(tl.int64)
    c, s = _tables(cos_ptr, sin_ptr, t, cols, mask, HALF, dqkv_ptr.dtype.element_ty)
    t64 = t.to(tl.int64)
    # dqkv is (B, T, 3, H, D) contiguous: row (b, t, h) of section j starts at ((b T + t) 3 + j) H D + h D
    out = ((b * T + t64) * 3 * H + h) * (2 * HALF)
    out = out[:, None] + cols[None, :]
    section = H * 2 * HALF
    _rotate(dq_ptr + (b * q_b + t64 * q_t + h * q_h)[:, None] + cols[None, :], dqkv_ptr + out, c, s, mask, HALF, True)
    _rotate(dk_ptr + (b * k_b + t64 * k_t + h * k_h)[:, None] + cols[None, :], dqkv_ptr + section + out, c, s, mask,
            HALF, True)
    dv = dv_ptr + (b * v_b + t64 * v_t + h * v_h)[:, None] + cols[None, :]
    dv_out = dqkv_ptr + 2 * section + out
    tl.store(dv_out, tl.load(dv, mask=mask, other=0.0), mask=mask)
    tl.store(dv_out + HALF, tl.load(dv + HALF, mask=mask, other=0.0), mask=mask)


def _launch(n_rows: int, head_dim: int) -> tuple[tuple[int], dict[str, int]]:
    half = head_dim // 2
    block = triton.next_power_of_2(half)
    rows = max(1, min(64, _ELEMENTS // (2 * block)))
    return (triton.cdiv(n_rows, rows),), {"HALF": half, "BLOCK": block, "ROWS": rows}


def _rows_contiguous(x: torch.Tensor) -> torch.Tensor:
    """A (B, T, H, D) tensor whose last dimension is contiguous (the kernels index it by strides)."""
    return x if x.stride(-1) == 1 else x.contiguous()


@triton_op("campaign::rotary_fwd", mutates_args=())
def rotary_fwd(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """qkv (B, T, 3, H, D) -> q and k rotated, each (B, T, H, D) contiguous."""
    B, T, _, H, D = qkv.shape
    qkv = qkv if qkv.stride(-1) == 1 else qkv.contiguous()
    q = torch.empty((B, T, H, D), dtype=qkv.dtype, device=qkv.device)
    k = torch.empty_like(q)
    grid, meta = _launch(B * T * H, D)
    wrap_triton(_rotary_fwd)[grid](qkv, cos, sin, q, k, B * T * H, T, H,
                                   qkv.stride(0), qkv.stride(1), qkv.stride(2), qkv.stride(3), **meta)
    return q, k


@triton_op("campaign::rotary_bwd", mutates_args=())
def rotary_bwd(dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor, cos: torch.Tensor,
               sin: torch.Tensor) -> torch.Tensor:
    """Gradients of q, k (rotated) and v, each (B, T, H, D) -> the gradient of qkv (B, T, 3, H, D)."""
    B, T, H, D = dq.shape
    dq, dk, dv = _rows_contiguous(dq), _rows_contiguous(dk), _rows_contiguous(dv)
    dqkv = torch.empty((B, T, 3, H, D), dtype=dq.dtype, device=dq.device)
    grid, meta = _launch(B * T * H, D)
    wrap_triton(_rotary_bwd)[grid](dq, dk, dv, cos, sin, dqkv, B * T * H, T, H,
                                   dq.stride(0), dq.stride(1), dq.stride(2), dk.stride(0), dk.stride(1), dk.stride(2),
                                   dv.stride(0), dv.stride(1), dv.stride(2), **meta)
    return dqkv


class RotaryQKV(torch.autograd.Function):
    """(B, T, 3, H, D) -> (q rotated, k rotated, v): v is a view of the input, as unbind's is."""

    @staticmethod
    def forward(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
        q, k = rotary_fwd(qkv, cos, sin)
        return q, k, qkv.select(2, 2)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        _, cos, sin = inputs
        ctx.save_for_backward(cos, sin)

    @staticmethod
    def backward(ctx: Any, dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor) -> tuple[Any, ...]:
        cos, sin = ctx.saved_tensors
        return rotary_bwd(dq, dk, dv, cos, sin), None, None
