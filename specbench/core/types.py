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

    def contract_errors(self, k: int, max_nodes: int) -> list[str]:
        """What breaks the contract verification relies on (host syncs: for tests and debugging, not the hot
        path). `depth` and `width` are trusted host ints: an under-reported width drops children from
        verification while the target still scores them, an under-reported depth cuts paths short."""
        errs: list[str] = []
        B, N = self.tokens.shape
        if self.parents.shape != (B, N) or self.lens.shape != (B,):
            return [f"shapes: tokens {tuple(self.tokens.shape)}, parents {tuple(self.parents.shape)}, "
                    f"lens {tuple(self.lens.shape)}"]
        if N > max_nodes:
            errs.append(f"{N} nodes > max_nodes({k}) = {max_nodes}")
        if not ((self.lens >= 0) & (self.lens <= N)).all():
            errs.append(f"lens {self.lens.tolist()} outside 0..{N}")
        valid = torch.arange(N, device=self.tokens.device)[None] < self.lens[:, None]
        if not ((self.parents >= -1) & (self.parents < torch.arange(N, device=self.parents.device))).all():
            errs.append("a parent is not an earlier node (or -1)")
            return errs
        if (self.tokens[~valid] != PAD_ID).any() or (self.tokens[valid] < 0).any():
            errs.append("tokens must be >= 0 on valid nodes and PAD_ID past lens")
        if (valid & ~valid.gather(1, self.parents.clamp(min=0)) & (self.parents >= 0)).any():
            errs.append("a valid node has a padded parent")
        if self.is_chain and N and not (self.parents == torch.arange(N, device=self.parents.device) - 1).all():
            errs.append("is_chain=True but a node's parent is not the previous node")
        if N:
            d = DraftTree(self.tokens, self.parents, self.lens, None, False, N, 1).depths()  # depth N: exact
            real_depth = int(torch.where(valid, d, 0).max())
            if real_depth > self.depth or self.depth > k:
                errs.append(f"depth={self.depth} but the deepest valid node is at {real_depth} (k={k})")
            kids = torch.zeros(B, N + 1, dtype=torch.long, device=self.parents.device)
            kids.scatter_add_(1, (self.parents + 1).clamp(min=0), valid.long())
            if int(kids.max()) > self.width:
                errs.append(f"width={self.width} but a node has {int(kids.max())} valid children")
        return errs

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
    len_bound: int  # host int >= every row's seq_lens (exact in the sync loop; with async scheduling it
    #   assumes the step in flight accepted everything): sizes attention without reading seq_lens back
    k: int  # max draft depth this run


@dataclass
class Admitted:
    """What a drafter's prefill sees: the batch state plus the admitted rows' prompts."""

    state: BatchState
    prompt_ids: Tensor  # [R, P] int64, right padded
    prompt_lens: list[int]  # [R] host ints
