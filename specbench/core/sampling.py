"""Token selection: greedy, or temperature + top-p sampling, without host syncs; per-request random streams.

Randomness comes either from one `torch.Generator` (training, tools) or from `RowGenerators`: one generator
per batch row, seated with the request's own seed when the request is admitted (as vLLM's per-request seed).
Every draw through `RowGenerators` takes a fixed number of values from each row's stream, independent of the
other rows, so a request's sampled output depends on (seed, request id) only, not on what shares its batch.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Union

import torch
from torch import Tensor


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off; else only the k most likely tokens (applied before top_p, as HF)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def request_seed(seed: int, request_id: str, occurrence: int = 0) -> int:
    """The seed of one request's stream: a hash of (run seed, request id, n-th request with that id)."""
    h = hashlib.sha256(f"{seed}\x00{request_id}\x00{occurrence}".encode()).digest()
    return int.from_bytes(h[:8], "little") & ((1 << 63) - 1)


class RowGenerators:
    """One generator per batch row. `seat(row, seed)` when a request takes the row, `release(row)` when it
    leaves; draws are [B, *shape] with row b's values from row b's own stream (free rows get a constant)."""

    def __init__(self, batch_size: int, device: torch.device, _gens: list | None = None) -> None:
        self.device = torch.device(device)
        self.gens: list[torch.Generator | None] = _gens if _gens is not None else [None] * batch_size

    def __len__(self) -> int:
        return len(self.gens)

    def seat(self, row: int, seed: int) -> None:
        self.gens[row] = torch.Generator(device=self.device).manual_seed(seed)

    def release(self, row: int) -> None:
        self.gens[row] = None

    def rows(self, lo: int, hi: int) -> "RowGenerators":
        """Rows [lo, hi) as their own RowGenerators (shares the generators)."""
        return RowGenerators(hi - lo, self.device, self.gens[lo:hi])

    def _draw(self, shape: tuple[int, ...], fill: float, op) -> Tensor:
        out = torch.full((len(self.gens), *shape), fill, dtype=torch.float32, device=self.device)
        if out.numel() == 0:  # nothing to draw (e.g. a verify without draft nodes): no per-row calls
            return out
        for b, g in enumerate(self.gens):
            if g is not None:
                op(out[b], g)
        return out

    def uniform(self, *shape: int) -> Tensor:
        return self._draw(shape, 0.5, lambda t, g: t.uniform_(0.0, 1.0, generator=g))

    def exponential(self, *shape: int) -> Tensor:
        return self._draw(shape, 1.0, lambda t, g: t.exponential_(1.0, generator=g))


Gen = Union[torch.Generator, RowGenerators, None]


def _check_rows(shape: tuple[int, ...], gen: RowGenerators) -> None:
    if shape[0] != len(gen):
        raise ValueError(f"a draw of shape {tuple(shape)} from {len(gen)} row generators: dim 0 must be the batch")


def uniform(shape: tuple[int, ...], gen: Gen, device: torch.device) -> Tensor:
    """U(0, 1) float32 of `shape`; with RowGenerators dim 0 is the batch row."""
    if isinstance(gen, RowGenerators):
        _check_rows(shape, gen)
        return gen.uniform(*shape[1:])
    return torch.rand(shape, generator=gen, device=device)


def exponential(shape: tuple[int, ...], gen: Gen, device: torch.device) -> Tensor:
    """Exp(1) float32 of `shape`; with RowGenerators dim 0 is the batch row."""
    if isinstance(gen, RowGenerators):
        _check_rows(shape, gen)
        return gen.exponential(*shape[1:])
    return torch.empty(shape, device=device).exponential_(1.0, generator=gen)


def target_probs(logits: Tensor, params: SamplingParams) -> Tensor:
    """The distribution decoding samples from: softmax(logits / T) restricted to the top-k tokens (when
    top_k > 0) and then to the top-p nucleus, float32.

    logits [..., V] -> probs [..., V]. Top-k keeps the k largest logits (ties at the k-th value kept, as HF's
    TopKLogitsWarper). The nucleus keeps the smallest prefix of tokens sorted by probability
    whose mass reaches top_p (the token that crosses the threshold is kept), as HF's TopPLogitsWarper does.
    Temperature 0 has no distribution (it is greedy decoding): asking for one is an error, not a division by 0.
    """
    if params.temperature <= 0:
        raise ValueError(f"target_probs needs temperature > 0, got {params.temperature} (0 = greedy: use argmax)")
    logits = logits.float()
    if 0 < params.top_k < logits.shape[-1]:
        kth = logits.topk(params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits / params.temperature, dim=-1)
    if params.top_p < 1.0:
        sorted_p, idx = probs.sort(dim=-1, descending=True)
        cum = sorted_p.cumsum(-1)
        drop = (cum - sorted_p) >= params.top_p  # mass before this token already reaches top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, idx, sorted_p)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample_from(probs: Tensor, gen: Gen) -> Tensor:
    """Draw one token per row of probs [..., V] -> [...] int64.

    argmax(p / E) with E ~ Exp(1) is an exact sample from p (the exponential race, equivalent to the Gumbel
    trick) and needs no host sync, unlike torch.multinomial on CUDA.
    """
    e = exponential(tuple(probs.shape), gen, probs.device)
    return (probs / e).argmax(dim=-1)


def select(logits: Tensor, params: SamplingParams, gen: Gen) -> Tensor:
    """logits [..., V] -> tokens [...]: argmax when greedy, else a sample from `target_probs`."""
    if params.greedy:
        return logits.argmax(dim=-1)
    return sample_from(target_probs(logits, params), gen)
