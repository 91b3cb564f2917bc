"""Drafters used only by tests: a dynamic-tree drafter over a fixed random transition table."""

from __future__ import annotations

import torch

from specbench.core.sampling import uniform
from specbench.core.types import DraftTree


class TableTreeDrafter:
    """Draft tree from q(next | last token) = softmax(table[last]): `width` children of the root drawn without
    replacement (Gumbel top-k; top-k when greedy), then one chain child under each, depth k.

    Node order is by depth: [b0 d1, b1 d1, b0 d2, b1 d2, ...], so parents come before children.
    """

    hidden_layers: tuple[int, ...] = ()

    def __init__(self, vocab: int, width: int = 2, seed: int = 0, sharpness: float = 2.0, max_draft_len: int = 8):
        g = torch.Generator().manual_seed(seed)
        self.q = torch.softmax(torch.randn(vocab, vocab, generator=g) * sharpness, -1)  # [V, V]
        self.width, self.max_draft_len = width, max_draft_len

    def max_nodes(self, k: int) -> int:
        return k * self.width

    def setup(self, target, batch_size, max_len, k, params, gen) -> None:
        self.params, self.gen = params, gen

    def prefill(self, rows, admitted, target_out) -> None:
        pass

    def _children(self, q: torch.Tensor, n: int) -> torch.Tensor:
        if self.params.greedy:
            return q.topk(n, -1).indices
        gumbel = -torch.log(-torch.log(uniform(tuple(q.shape), self.gen, q.device).clamp(1e-20, 1 - 1e-7)))
        return (q.clamp(min=1e-30).log() + gumbel).topk(n, -1).indices  # sampling without replacement

    def propose(self, state) -> DraftTree:
        k, W = state.k, self.width
        B = state.last.shape[0]
        q_root = self.q[state.last[:, 0]]  # [B, V]
        first = self._children(q_root, W)  # [B, W]
        tokens, probs, parents = [first], [q_root[:, None].expand(B, W, -1)], [torch.full((B, W), -1)]
        cur = first
        for d in range(1, k):
            q = self.q[cur]  # [B, W, V]
            nxt = torch.stack([self._children(q[:, j], 1)[:, 0] for j in range(W)], 1)
            tokens.append(nxt)
            probs.append(q)
            parents.append(torch.arange(W).expand(B, W) + (d - 1) * W)
            cur = nxt
        lens = state.active * (k * W)
        return DraftTree(tokens=torch.cat(tokens, 1), parents=torch.cat(parents, 1).contiguous(), lens=lens,
                         probs=torch.cat(probs, 1), depth=k, width=W)

    def commit(self, verdict, state, target_out) -> None:
        pass
