"""Model shapes by name, without torch: the driver sizes runs (tokens per step) from
these, and `campaign.train.model` builds the network from them."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True)
class Shape:
    """The numbers that define a model."""

    n_layer: int
    n_head: int
    d_model: int
    vocab_size: int
    seq_len: int
    activation: str = "swiglu"
    tie_embeddings: bool = True

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    @property
    def ffn_hidden(self) -> int:
        if self.activation == "gelu":
            return 4 * self.d_model
        multiple = 256 if self.d_model >= 1024 else 32
        return multiple * math.ceil(int(8 * self.d_model / 3) / multiple)


SHAPES: dict[str, Shape] = {
    # Trains a step in a few ms on one CPU core: for tests.
    "tiny": Shape(n_layer=2, n_head=2, d_model=64, vocab_size=256, seq_len=64),
    # nanoGPT's "baby GPT" width with a GPT-2 vocabulary: CPU demos.
    "small": Shape(n_layer=6, n_head=6, d_model=384, vocab_size=50304, seq_len=256),
    "gpt2-124m": Shape(n_layer=12, n_head=12, d_model=768, vocab_size=50304, seq_len=1024),
    # nanoGPT's 1.31B comparison shape (its MFU benchmark on one GPU).
    "1b": Shape(n_layer=24, n_head=16, d_model=2048, vocab_size=50304, seq_len=2048),
    # ASSUMED: no public AuroraGPT-2B shape was found; this is a Llama-like 2B
    # (24 x 2560, 20 heads of 128, 32k vocabulary, 4k context; ~2.0B parameters).
    "auroragpt-2b": Shape(n_layer=24, n_head=20, d_model=2560, vocab_size=32000, seq_len=4096,
                          tie_embeddings=False),
}


def shape_for(cfg: Any) -> Shape:
    """The named shape of `cfg.size` with the non-null overrides of a ModelConfig applied."""
    base = SHAPES[cfg.size]
    over = {k: getattr(cfg, k) for k in ("n_layer", "n_head", "d_model", "vocab_size", "seq_len")
            if getattr(cfg, k) is not None}
    return replace(base, activation=cfg.activation, tie_embeddings=cfg.tie_embeddings, **over)
