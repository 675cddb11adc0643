"""Training tokens: a seeded synthetic Markov chain or a token file, read deterministically.

Sample j of the stream is a pure function of (seed, j), and the batch of (step, micro-step,
rank) is a fixed slice of consecutive sample indices, so the data position saved in a
checkpoint is just the number of samples consumed by all ranks.

Token files (their sidecar, the model's vocabulary, how `campaign data prepare` writes them)
are campaign.train.tokenfile's.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from campaign.train.tokenfile import check_window


def entropy_floor(branching: int) -> float:
    """The synthetic chain's entropy per token in nats: the best achievable mean loss."""
    return math.log(branching)


class MarkovSource:
    """Each token has `branching` distinct successors, chosen uniformly."""

    def __init__(self, vocab: int, branching: int, seed: int) -> None:
        rng = np.random.default_rng([seed, 0xC0FFEE])
        b = min(branching, vocab)
        self.table = np.stack([rng.permutation(vocab)[:b] for _ in range(vocab)])
        self.vocab, self.seed = vocab, seed

    def sample(self, index: int, length: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, index])
        picks = rng.integers(0, self.table.shape[1], size=length)
        out = np.empty(length, dtype=np.int64)
        tok = int(rng.integers(0, self.vocab))
        for i in range(length):
            out[i] = tok
            tok = int(self.table[tok, picks[i]])
        return out


class FileSource:
    """Random windows of a flat token file (np.memmap), the window of sample j seeded by j;
    with `vocab_size`, each window's ids are checked to be below it (a file without a
    sidecar may hold ids the model has no embedding for)."""

    def __init__(self, path: str, dtype: str, seed: int, vocab_size: int | None = None) -> None:
        self.tokens = np.memmap(path, dtype=np.dtype(dtype), mode="r")
        self.path, self.seed, self.vocab_size = path, seed, vocab_size

    def sample(self, index: int, length: int) -> np.ndarray:
        if len(self.tokens) <= length:
            raise ValueError(f"token file has {len(self.tokens)} tokens; need > {length}")
        start = int(np.random.default_rng([self.seed, index]).integers(0, len(self.tokens) - length))
        window = np.asarray(self.tokens[start:start + length], dtype=np.int64)
        if self.vocab_size is not None:
            check_window(window, self.vocab_size, self.path, start)
        return window


def make_source(cfg, vocab_size: int | None = None) -> MarkovSource | FileSource:  # cfg: config.DataConfig
    """The data source of a resolved config (tokenfile.resolve); `vocab_size`: the model's."""
    if cfg.source == "file":
        return FileSource(cfg.path, cfg.dtype or "uint16", cfg.seed, vocab_size)
    return MarkovSource(cfg.synthetic_vocab, cfg.synthetic_branching, cfg.seed)


class Sampler:
    """Batches by position: micro-step m of rank r starts at position + (m*W + r) * B.

    `prefetch(m)` reads the batch that follows micro-step m (the next micro-step's, or the
    next step's first) while the device still computes, as nanoGPT's train.py does; `batch`
    uses it when the position still matches, so what a step trains on never depends on it.
    """

    def __init__(self, source, seq_len: int, micro_batch: int, rank: int, world: int,
                 grad_accum: int, device: torch.device) -> None:
        self.source, self.seq_len, self.micro_batch = source, seq_len, micro_batch
        self.rank, self.world, self.grad_accum, self.device = rank, world, grad_accum, device
        self.position = 0
        """Samples consumed by all ranks so far (saved in checkpoints)."""
        self._ahead: tuple[tuple[int, int], torch.Tensor] | None = None

    @property
    def samples_per_step(self) -> int:
        return self.micro_batch * self.world * self.grad_accum

    def batch(self, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
        key = (self.position, micro)
        t = self._ahead[1] if self._ahead is not None and self._ahead[0] == key else self._read(*key)
        self._ahead = None
        return t[:, :-1], t[:, 1:]

    def prefetch(self, micro: int) -> None:
        """Read the batch after micro-step `micro` of the current step now."""
        key = ((self.position, micro + 1) if micro + 1 < self.grad_accum
               else (self.position + self.samples_per_step, 0))
        self._ahead = (key, self._read(*key))

    def _read(self, position: int, micro: int) -> torch.Tensor:
        first = position + (micro * self.world + self.rank) * self.micro_batch
        rows = [self.source.sample(first + i, self.seq_len + 1) for i in range(self.micro_batch)]
        t = torch.from_numpy(np.stack(rows))
        if self.device.type != "cpu":
            t = t.pin_memory().to(self.device, non_blocking=True)
        return t

    def advance(self) -> None:
        self.position += self.samples_per_step
