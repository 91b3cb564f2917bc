"""The types every layer shares: the draft tree a strategy proposes, the verdict verification returns,
and what a drafter may read about the running batch.

A chain of k drafts is a tree whose every node has the previous one as parent, so one verification path
serves chains (draft model, n-gram, MLP speculator), static trees (Medusa) and dynamic trees (EAGLE-2/3).

Node 0 of the verify forward is the *root*: the last committed-but-not-cached token of each request. Draft
nodes are numbered 0..N-1 and sit at forward positions 1..N; `parents[b, n]` is a node index or -1 (the root).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

PAD_ID = -1


@dataclass
class DraftTree:
    tokens: Tensor  # [B, N] int64 draft tokens, PAD_ID past lens
    parents: Tensor  # [B, N] int64 parent node, -1 = root; parents[b, n] < n
    lens: Tensor  # [B] int64 valid nodes per request, 0..N
    probs: Tensor | None = None  # [B, N, V] float32: the draft distribution each node was drawn from
    #   (the distribution at its parent); None = point-mass drafts (n-gram). Siblings must be drawn
    #   without replacement in node order (verification removes earlier siblings from q).
    is_chain: bool = False  # every node's parent is the previous node (no cache compaction needed)
    depth: int = 0  # host int: max depth of any node (K of this step)
    width: int = 1  # host int: max children of any node

    @property
    def num_nodes(self) -> int:
        return self.tokens.shape[1]

    @staticmethod
    def chain(tokens: Tensor, lens: Tensor, probs: Tensor | None = None) -> "DraftTree":
        """A chain per request: tokens [B, K], lens [B]."""
        B, K = tokens.shape
        parents = (torch.arange(K, device=tokens.device) - 1).expand(B, K).contiguous()
        valid = torch.arange(K, device=tokens.device)[None] < lens[:, None]
        return DraftTree(tokens.masked_fill(~valid, PAD_ID), parents, lens, probs, is_chain=True, depth=K, width=1)

    @staticmethod
    def empty(batch_size: int, device: torch.device) -> "DraftTree":
        z = torch.zeros(batch_size, 0, dtype=torch.long, device=device)
        return DraftTree(z, z.clone(), torch.zeros(batch_size, dtype=torch.long, device=device), None, True, 0, 1)

    def depths(self) -> Tensor:
        """[B, N] depth of each node (1 = child of the root): one hop up the parents per tree level."""
        d = torch.ones_like(self.parents)
        cur = self.parents
        for _ in range(max(self.depth - 1, 0)):
            up = cur >= 0
            d += up.long()
            cur = torch.where(up, self.parents.gather(1, cur.clamp(min=0)), -1)
        return d

    def attention_mask(self) -> Tensor:
        """[B, 1+N, 1+N] bool over (root, nodes): each sees the root, its ancestors and itself (padded nodes
        are masked the same way; their outputs are ignored). One scatter per tree level."""
        B, N = self.parents.shape
        m = torch.zeros(B, N + 1, N + 1, dtype=torch.bool, device=self.parents.device)
        m[:, :, 0] = True
        m |= torch.eye(N + 1, dtype=torch.bool, device=m.device)
        cur = self.parents
        for _ in range(max(self.depth - 1, 0)):  # column 1+ancestor (the root's column 0 is already set)
            m[:, 1:].scatter_(2, (cur + 1)[..., None], True)
            cur = torch.where(cur >= 0, self.parents.gather(1, cur.clamp(min=0)), -1)
        return m


@dataclass
class Verdict:
    """What verification decided, per request; fixed shapes so no host sync is needed to build it."""

    tokens: Tensor  # [B, K+1] int64: accepted drafts then the bonus / recovered token, PAD_ID after
    num_accepted: Tensor  # [B] int64 accepted draft tokens (0..K); tokens[b, num_accepted[b]] is the extra one
    accepted_nodes: Tensor  # [B, K] int64 tree node index of each accepted token along the path, -1 after


@dataclass
class BatchState:
    """What a drafter may read about the running batch."""

    seq_lens: Tensor  # [B] tokens in the target cache per row (excludes `last`)
    last: Tensor  # [B, 1] the newest token per row (sampled, not yet in the target cache)
    active: Tensor  # [B] 1 where a request runs
    history: list[list[int]]  # per row: prompt + generated tokens including `last` (host copy)
    host_lens: list[int]  # per row: seq_lens as known on the host (exact after every step's sync)
    k: int  # max draft depth this run


@dataclass
class Admitted:
    """What a drafter's prefill sees: the batch state plus the admitted rows' prompts."""

    state: BatchState
    prompt_ids: Tensor  # [R, P] int64, right padded
    prompt_lens: list[int]  # [R] host ints
