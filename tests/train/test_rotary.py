"""Rotary embeddings: the rotation itself, and the Triton kernels against the PyTorch path.

The kernel tests need Triton. On a machine without a GPU they run in Triton's interpreter
(TRITON_INTERPRET=1, CPU tensors): the boundary faked is the GPU's code generation, not
the kernels' indexing, masking or math, which the interpreter executes as written. On a
CUDA machine they compile for the device, and the compiled model is compared with the
PyTorch path as well. Without Triton (the CPU wheel of torch has none) they are skipped.
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from campaign.train import rotary
from campaign.train.rotary import apply_rotary, rotary_tables, rotate_qkv

CUDA = torch.cuda.is_available()
HAS_TRITON = importlib.util.find_spec("triton") is not None


def _qkv(B: int, T: int, H: int, D: int, dtype: torch.dtype = torch.float32, device: str = "cpu") -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randn(B, T, 3, H, D, generator=g, dtype=torch.float32).to(device=device, dtype=dtype)


def test_the_rotation_keeps_norms_leaves_position_0_and_scores_depend_on_distance_only() -> None:
    T, H, D = 16, 2, 8
    cos, sin = rotary_tables(T, D)
    qkv = _qkv(1, T, H, D, torch.float64)
    q, k, v = rotate_qkv(qkv, cos.double(), sin.double())
    assert torch.allclose(q.norm(dim=-1), qkv[:, :, 0].norm(dim=-1))
    assert torch.equal(q[:, 0], qkv[:, 0, 0]) and torch.equal(v, qkv[:, :, 2])
    # The same vectors placed at positions (m, n) and (m + 5, n + 5): equal attention scores.
    x = qkv[:, :1, 0].expand(1, T, H, D).contiguous()
    y = qkv[:, :1, 1].expand(1, T, H, D).contiguous()
    rx, ry = apply_rotary(x, cos.double(), sin.double()), apply_rotary(y, cos.double(), sin.double())
    s = torch.einsum("bmhd,bnhd->hmn", rx, ry)
    assert torch.allclose(s[:, 2, 7], s[:, 7, 12]) and torch.allclose(s[:, 3, 1], s[:, 10, 8])
    assert not torch.allclose(s[:, 2, 7], s[:, 2, 8])


def test_a_sequence_longer_than_the_tables_is_refused() -> None:
    cos, sin = rotary_tables(8, 4)
    with pytest.raises(ValueError, match="sequence of 9 tokens is longer than the rotary tables .8 positions"):
        rotate_qkv(_qkv(1, 9, 1, 4), cos, sin)


# --- the Triton kernels -------------------------------------------------------------------

@pytest.fixture(scope="module")
def kernels():  # type: ignore[no-untyped-def]
    if not HAS_TRITON:
        pytest.skip("Triton is not installed (CPU builds of torch come without it)")
    if not CUDA:
        os.environ["TRITON_INTERPRET"] = "1"  # read when the kernels are decorated, at import
    from campaign.train import rotary_triton
    return rotary_triton


DEVICE = "cuda" if CUDA else "cpu"
# (B, T, H, D): head_dim 12 is not a power of two (masked columns); 3 x 5 x 7 = 105 rows are
# not a multiple of any tile, so the last program is partly masked.
SHAPES = [(2, 16, 4, 8), (3, 5, 7, 12), (1, 33, 2, 64)]


@pytest.mark.parametrize("shape", SHAPES)
def test_forward_kernel_matches_the_pytorch_rotation(kernels, shape: tuple[int, ...]) -> None:  # type: ignore[no-untyped-def]
    B, T, H, D = shape
    cos, sin = (t.to(DEVICE) for t in rotary_tables(T + 3, D))  # tables longer than the sequence
    qkv = _qkv(B, T, H, D, device=DEVICE)
    q, k, v = kernels.RotaryQKV.apply(qkv, cos, sin)
    torch.testing.assert_close(q, apply_rotary(qkv[:, :, 0], cos, sin), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(k, apply_rotary(qkv[:, :, 1], cos, sin), rtol=1e-6, atol=1e-6)
    assert v.data_ptr() == qkv[:, :, 2].data_ptr() and torch.equal(v, qkv[:, :, 2]), "v is a view, not a copy"
    assert q.is_contiguous() and k.is_contiguous() and q.shape == (B, T, H, D)


@pytest.mark.parametrize("shape", SHAPES)
def test_backward_kernel_gives_the_pytorch_gradient_from_strided_gradients(kernels, shape: tuple[int, ...]) -> None:  # type: ignore[no-untyped-def]
    B, T, H, D = shape
    cos, sin = (t.to(DEVICE) for t in rotary_tables(T, D))
    qkv = _qkv(B, T, H, D, device=DEVICE).requires_grad_()
    ref = qkv.detach().clone().requires_grad_()
    # Upstream gradients as SDPA's backward hands them over: (B, H, T, D) storage seen as (B, T, H, D).
    g = [torch.randn(B, H, T, D, device=DEVICE).transpose(1, 2) for _ in range(3)]
    assert not g[0].is_contiguous()
    out = kernels.RotaryQKV.apply(qkv, cos, sin)
    torch.autograd.backward(out, g)
    q, k, v = ref.unbind(2)
    torch.autograd.backward([apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v], g)
    assert qkv.grad is not None and ref.grad is not None and qkv.grad.is_contiguous()
    torch.testing.assert_close(qkv.grad, ref.grad, rtol=1e-6, atol=1e-6)
    assert torch.equal(qkv.grad[:, :, 2], g[2]), "dv is copied, not rotated"


def test_bf16_rounds_once_from_fp32(kernels) -> None:  # type: ignore[no-untyped-def]
    """bf16 in and out, fp32 inside: on the GPU within half an ulp (one rounding to nearest)
    of the fp32 rotation of the same bf16 inputs and bf16-rounded tables, the gradient
    likewise. Triton's interpreter truncates where the GPU rounds to nearest, the tables'
    rounding included, so there the bound is an ulp of the result and of the inputs."""
    B, T, H, D = 2, 24, 3, 16
    cos, sin = (t.to(DEVICE) for t in rotary_tables(T, D))
    qkv = _qkv(B, T, H, D, torch.bfloat16, DEVICE).requires_grad_()

    def within(got: torch.Tensor, want: torch.Tensor, x: torch.Tensor) -> bool:
        scale = x[..., : D // 2].abs() + x[..., D // 2:].abs()  # |x1| + |x2|, each output's inputs
        scale = torch.cat([scale, scale], dim=-1)
        bound = want.abs() * 2 ** -8 + scale * 2 ** -20 if CUDA else (want.abs() + scale) * 2 ** -7
        return bool(((got.float() - want).abs() <= bound).all())

    q, k, _ = kernels.RotaryQKV.apply(qkv, cos, sin)
    x = qkv.detach()[:, :, 0].float()
    assert q.dtype == torch.bfloat16
    assert within(q, apply_rotary(x, cos.bfloat16().float(), sin.bfloat16().float()), x)
    gq = torch.randn(B, T, H, D, device=DEVICE, dtype=torch.bfloat16)
    torch.autograd.backward([q, k], [gq, torch.zeros_like(gq)])
    assert qkv.grad is not None
    c, s = cos.bfloat16().float()[:T, None], sin.bfloat16().float()[:T, None]
    g1, g2 = gq.float()[..., : D // 2], gq.float()[..., D // 2:]
    assert within(qkv.grad[:, :, 0], torch.cat([g1 * c + g2 * s, g2 * c - g1 * s], dim=-1), gq.float())
    assert torch.count_nonzero(qkv.grad[:, :, 1:]) == 0


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device (torch.compile of the kernels)")
# torch 2.11's Dynamo, tracing an autograd.Function, instantiates the base class itself (its
# own deprecation, seen on the H200; a warning outside pytest's warnings-as-errors).
@pytest.mark.filterwarnings("ignore:<class 'torch.autograd.function.Function'> should not be instantiated")
def test_the_compiled_model_with_the_kernels_matches_the_pytorch_path(kernels, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """One attention layer compiled as the trainer compiles it, bf16, forward and backward,
    against the same layer compiled on the PyTorch rotary: outputs and the QKV weight's
    gradient within bf16 rounding of each other (relative to their largest entries)."""
    from campaign.train.model import Attention
    from campaign.train.shapes import SHAPES

    s = SHAPES["tiny"]
    torch.manual_seed(0)
    layer = Attention(s).cuda().bfloat16()
    cos, sin = (t.cuda() for t in rotary_tables(s.seq_len, s.head_dim))
    x = torch.randn(4, s.seq_len, s.d_model, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4, s.seq_len, s.d_model, device="cuda")  # a loss whose gradient is O(1)

    def run() -> tuple[torch.Tensor, torch.Tensor]:
        layer.zero_grad()
        torch._dynamo.reset()
        y = torch.compile(layer)(x, cos, sin)
        (y.float() * w).sum().backward()
        assert layer.qkv.weight.grad is not None
        return y.detach().float(), layer.qkv.weight.grad.detach().float()

    assert rotary.load_kernels()
    y_kernel, g_kernel = run()
    monkeypatch.setattr(rotary, "_KERNELS", None)
    y_torch, g_torch = run()
    assert (y_kernel - y_torch).abs().max() <= 2 ** -6 * y_torch.abs().max()
    assert (g_kernel - g_torch).abs().max() <= 2 ** -6 * g_torch.abs().max()
    assert not torch.equal(g_kernel, torch.zeros_like(g_kernel))
