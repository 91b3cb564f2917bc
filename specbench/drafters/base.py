"""The drafter interface every strategy implements (see DESIGN.md); the shared types live in `core.types`."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from specbench.core.sampling import SamplingParams
from specbench.core.types import Admitted, BatchState, DraftTree, Verdict
from specbench.errors import UserError
from specbench.models.transformer import TargetOutput


def check_stop_below(value) -> float | None:
    """`method.drafter.stop_below` (dynamic draft length): None, or a probability in (0, 1)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
        raise UserError(f"method.drafter.stop_below={value!r}: must be in (0, 1), or null to always draft k tokens")
    return float(value)


def dynamic_pool_layout(f: int, k: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """EAGLE-2's candidate pool for depth k and topk f: the root's f children, then per depth d+1 the f children of
    each of the depth-d frontier's f nodes. Per candidate [f + (k-1)·f²]: its depth, and which of the step's
    distributions it was drawn from (0 = the root's, 1 + (d-1)·f + j = depth-d frontier node j's)."""
    depth = [1] * f + [d + 1 for d in range(1, k) for _ in range(f * f)]
    qsrc = [0] * f + [1 + (d - 1) * f + j for d in range(1, k) for j in range(f) for _ in range(f)]
    return torch.tensor(depth, device=device), torch.tensor(qsrc, device=device)


def select_best(pool_prio: torch.Tensor, pool_par: torch.Tensor, pool_depth: torch.Tensor,
                n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """EAGLE-2's verified set: the n best candidates [B, Np] by priority, ties to the shallower, then the earlier
    candidate (so with priorities that never rise along a path the set is closed under ancestors). Returns their
    pool indices in pool order (parents before children) [B, n] and each one's parent among them (-1 = the root)."""
    B, Np = pool_prio.shape
    dev = pool_prio.device
    score = pool_prio.double() - 1e-4 * pool_depth[:Np] - 1e-9 * torch.arange(Np, device=dev)
    sel = score.topk(n, dim=-1).indices.sort(dim=-1).values
    inv = torch.full((B, Np), -1, dtype=torch.long, device=dev)
    inv.scatter_(1, sel, torch.arange(n, device=dev).expand(B, n))
    pp = pool_par.gather(1, sel)
    return sel, torch.where(pp >= 0, inv.gather(1, pp.clamp(min=0)), -1)


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
        amount per row per step, so each request's stream is independent of the others). A drafter with
        `refeeds_path` also takes `path_len` (> k): commit must then take accepted paths up to that long
        (`method.lookup.drafter_k` grafts paths deeper than the drafter's own k)."""

    def prefill(self, rows: list[int], admitted: Admitted, target_out: TargetOutput) -> None:
        """Requests were admitted into adjacent `rows`; target_out holds the target's prompt forward for them
        (hidden states of `hidden_layers`, [R, P, H]); admitted.state.last[rows] are their first tokens."""

    def propose(self, state: BatchState) -> DraftTree:
        """Draft up to state.k tokens per active row."""

    def commit(self, verdict: Verdict, state: BatchState, target_out: TargetOutput) -> None:
        """Verification is done; roll back / advance own state. `state` still holds the values from before
        this step (seq_lens, last); the new cache length is seq_lens + 1 + verdict.num_accepted and the new
        `last` is verdict.tokens[b, num_accepted[b]]. target_out: the verify forward's outputs."""


class FinalStateDrafter:
    """Shared by drafters that read only the target's final-normed hidden state at the last accepted position
    (Medusa, MLP speculator): `self.state` [B, H] is the state whose target logits produced the newest token.
    After the prefill it is the last prompt position's; after a verify step the state at the last accepted
    node (or the root). Subclasses call `track(target, batch_size)` in setup."""

    refeeds_path = True  # the state comes from the target at any accepted node (`method.lookup` may graft some)

    def track(self, target, batch_size: int) -> None:
        self.target, self.device = target, target.device
        self.hidden_layers = (target.config.num_layers,)  # the last layer's output; normed here
        self.state = torch.zeros(batch_size, target.config.hidden_size, dtype=target.dtype, device=self.device)

    def _normed(self, hidden: list) -> torch.Tensor:
        return self.target.norm(hidden[0])

    def prefill(self, rows: list[int], admitted: Admitted, target_out: TargetOutput) -> None:
        lo, hi = rows[0], rows[-1] + 1
        h = self._normed(target_out.hidden)  # [R, P, H]
        last = torch.tensor(admitted.prompt_lens, device=self.device) - 1
        self.state[lo:hi] = h[torch.arange(hi - lo, device=self.device), last]

    def commit(self, verdict: Verdict, state: BatchState, target_out: TargetOutput) -> None:
        h = self._normed(target_out.hidden)  # [B, 1+N, H]
        n = verdict.num_accepted
        last = torch.where(n > 0, verdict.accepted_nodes.gather(1, (n - 1).clamp(min=0)[:, None])[:, 0] + 1, 0)
        self.state = h[torch.arange(h.shape[0], device=self.device), last].to(self.state.dtype)
