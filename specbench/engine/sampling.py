"""Token selection: greedy, or temperature + top-p sampling from an explicit generator, without host syncs."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def target_probs(logits: Tensor, params: SamplingParams) -> Tensor:
    """The distribution decoding samples from: softmax(logits / T) restricted to the top-p nucleus, float32.

    logits [..., V] -> probs [..., V]. The nucleus keeps the smallest prefix of tokens sorted by probability
    whose mass reaches top_p (the token that crosses the threshold is kept), as HF's TopPLogitsWarper does.
    """
    probs = torch.softmax(logits.float() / params.temperature, dim=-1)
    if params.top_p < 1.0:
        sorted_p, idx = probs.sort(dim=-1, descending=True)
        cum = sorted_p.cumsum(-1)
        drop = (cum - sorted_p) >= params.top_p  # mass before this token already reaches top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, idx, sorted_p)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample_from(probs: Tensor, gen: torch.Generator | None) -> Tensor:
    """Draw one token per row of probs [..., V] -> [...] int64.

    argmax(p / E) with E ~ Exp(1) is an exact sample from p (the exponential race, equivalent to the Gumbel
    trick) and needs no host sync, unlike torch.multinomial on CUDA.
    """
    e = torch.empty_like(probs).exponential_(1.0, generator=gen)
    return (probs / e).argmax(dim=-1)


def select(logits: Tensor, params: SamplingParams, gen: torch.Generator | None) -> Tensor:
    """logits [..., V] -> tokens [...]: argmax when greedy, else a sample from `target_probs`."""
    if params.greedy:
        return logits.argmax(dim=-1)
    return sample_from(target_probs(logits, params), gen)
