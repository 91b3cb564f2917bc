"""The drafter interface every strategy implements (see DESIGN.md); the shared types live in `core.types`."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from specbench.core.sampling import SamplingParams
from specbench.core.types import Admitted, BatchState, DraftTree, Verdict
from specbench.models.transformer import TargetOutput


@runtime_checkable
class Drafter(Protocol):
    max_draft_len: int  # largest k this strategy supports
    hidden_layers: tuple[int, ...]  # target capture-before-layer ids it needs (empty = none)

    def max_nodes(self, k: int) -> int:
        """Most draft nodes one proposal of depth k can hold (k for a chain); sizes the cache headroom."""

    def setup(self, target, batch_size: int, max_len: int, k: int, params: SamplingParams,
              gen: torch.Generator) -> None:
        """Allocate per-run state (caches) for `batch_size` rows of up to `max_len` tokens; `params` and
        `gen` are the run's sampling settings and its per-row generators (`core.sampling.RowGenerators`:
        draw through `core.sampling.uniform / exponential / sample_from` with the batch as dim 0, a fixed
        amount per row per step, so each request's stream is independent of the others)."""

    def prefill(self, rows: list[int], admitted: Admitted, target_out: TargetOutput) -> None:
        """Requests were admitted into adjacent `rows`; target_out holds the target's prompt forward for them
        (hidden states of `hidden_layers`, [R, P, H]); admitted.state.last[rows] are their first tokens."""

    def propose(self, state: BatchState) -> DraftTree:
        """Draft up to state.k tokens per active row."""

    def commit(self, verdict: Verdict, state: BatchState, target_out: TargetOutput) -> None:
        """Verification is done; roll back / advance own state. `state` still holds the values from before
        this step (seq_lens, last); the new cache length is seq_lens + 1 + verdict.num_accepted and the new
        `last` is verdict.tokens[b, num_accepted[b]]. target_out: the verify forward's outputs."""
