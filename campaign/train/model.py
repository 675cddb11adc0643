"""A GPT-style decoder, single-device code (parallelism is applied in parallelize.py).

RMSNorm, rotary position embeddings (rotary.py), SwiGLU or GELU MLP, optional tied embeddings, causal
`F.scaled_dot_product_attention`. Named shapes live in `SHAPES`; `shape_for` merges a
`ModelConfig`'s overrides. This module does not import the pydantic config, so the
benchmark can run where pydantic is absent.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from campaign.train.rotary import load_kernels, rotary_tables, rotate_qkv
from campaign.train.shapes import SHAPES, Shape, shape_for

__all__ = ["GPT", "SHAPES", "Shape", "shape_for"]


class Attention(nn.Module):
    def __init__(self, s: Shape) -> None:
        super().__init__()
        self.n_head = s.n_head
        self.qkv = nn.Linear(s.d_model, 3 * s.d_model, bias=False)
        self.proj = nn.Linear(s.d_model, s.d_model, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        # Rotary in the (B, T, H, D) layout the projection writes, then the heads moved forward
        # as views (nanoGPT's layout): SDPA's output takes q's layout, so it comes back as
        # (B, T, H, D) and the reshape below copies nothing, and in the backward the rotary
        # gradient fuses with the one write of dqkv. Rotated in (B, H, T, D) instead, q and k
        # were written transposed, the output copied back and the gradients transposed again
        # (measured on an H200: ~2% of a 1b step).
        # On CUDA the rotation is two Triton kernels (campaign/train/rotary_triton.py), the
        # backward writing dq, dk, dv straight into the projection's gradient.
        q, k, v = rotate_qkv(self.qkv(x).view(B, T, 3, self.n_head, C // self.n_head), cos, sin)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, s: Shape) -> None:
        super().__init__()
        self.swiglu = s.activation == "swiglu"
        self.up = nn.Linear(s.d_model, (2 if self.swiglu else 1) * s.ffn_hidden, bias=False)
        self.proj = nn.Linear(s.ffn_hidden, s.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.up(x)
        if self.swiglu:
            gate, val = h.chunk(2, dim=-1)
            return self.proj(F.silu(gate) * val)
        return self.proj(F.gelu(h, approximate="tanh"))


class Block(nn.Module):
    def __init__(self, s: Shape) -> None:
        super().__init__()
        self.norm1 = nn.RMSNorm(s.d_model, eps=1e-6)
        self.attn = Attention(s)
        self.norm2 = nn.RMSNorm(s.d_model, eps=1e-6)
        self.mlp = MLP(s)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cos, sin)
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    """`forward(idx, targets)` returns the mean cross-entropy loss (or logits if no targets)."""

    def __init__(self, shape: Shape) -> None:
        super().__init__()
        self.shape = shape
        self.activation_checkpointing = False  # set by parallelize(); recompute each block
        self.embed = nn.Embedding(shape.vocab_size, shape.d_model)
        self.blocks = nn.ModuleList(Block(shape) for _ in range(shape.n_layer))
        self.norm = nn.RMSNorm(shape.d_model, eps=1e-6)
        self.head = nn.Linear(shape.d_model, shape.vocab_size, bias=False)
        if shape.tie_embeddings:
            self.head.weight = self.embed.weight
        load_kernels()  # here, not under torch.compile: the forward only reads whether they loaded
        cos, sin = rotary_tables(shape.seq_len, shape.head_dim)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """GPT-2 init: N(0, 0.02), residual projections scaled by 1/sqrt(2 * n_layer)."""
        for name, p in self.named_parameters():
            if p.dim() == 1:
                nn.init.ones_(p)
            elif name.endswith("proj.weight"):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * self.shape.n_layer))
            else:
                nn.init.normal_(p, std=0.02)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        x = self.embed(idx)
        cos, sin = self.rope_cos, self.rope_sin
        for block in self.blocks:
            if self.activation_checkpointing and self.training:
                x = checkpoint(block, x, cos, sin, use_reentrant=False)
            else:
                x = block(x, cos, sin)
        return self.output(x, targets)

    def output(self, x: torch.Tensor, targets: torch.Tensor | None) -> torch.Tensor:
        """Final norm, head and loss: a method of its own so parallelize() can compile it
        (with a large vocabulary, fusing the fp32 cross-entropy saves a lot of traffic)."""
        logits = self.head(self.norm(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))
