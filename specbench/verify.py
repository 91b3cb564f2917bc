"""Acceptance rules: which drafted tokens the target keeps, and the extra (bonus / recovered) token.

All rules take the draft tree and the target's logits for (root, node 0, ..., node N-1), i.e. logits
[B, 1+N, V] where position 0 predicts the root's children and position 1+n predicts node n's children,
and return a `Verdict` of fixed shape (no host sync).

- greedy: descend while a child equals the target argmax; the bonus is the argmax at the last kept node.
- sampling: lossless recursive rejection sampling (Leviathan et al. 2023 / Chen et al. 2023 for chains;
  for several children per node the multi-candidate generalisation of SpecInfer / EAGLE with candidates
  drawn without replacement): at a node with residual target distribution p, try its children in order;
  child x with draft distribution q (earlier siblings removed, renormalised) is accepted with probability
  min(1, p(x) / q(x)); on rejection p <- norm(max(p - q, 0)). If every child is rejected the recovered
  token is drawn from the residual p; after a leaf the bonus is drawn from the target distribution there.
  Point-mass drafts (probs None) use q = one-hot(x). The output distribution equals the target's exactly.
- typical (Medusa, opt-in, NOT lossless): accept x if p(x) > min(epsilon, alpha * exp(-H(p))).
"""

from __future__ import annotations

import torch
from torch import Tensor

from specbench.drafters.base import PAD_ID, DraftTree, Verdict
from specbench.engine.sampling import SamplingParams, sample_from, target_probs


def _node_structure(tree: DraftTree) -> tuple[Tensor, Tensor, Tensor]:
    """valid [B, N] bool, parent forward index [B, N] (0 = root), children [B, 1+N, W] node ids (-1 pad)."""
    B, N = tree.tokens.shape
    dev = tree.tokens.device
    valid = torch.arange(N, device=dev)[None] < tree.lens[:, None]
    parent_fwd = (tree.parents + 1).clamp(min=0)
    W = max(tree.width, 1)
    children = torch.full((B, N + 1, W), -1, dtype=torch.long, device=dev)
    if tree.is_chain:
        children[:, :N, 0] = torch.arange(N, device=dev).expand(B, N).masked_fill(~valid, -1)
        return valid, parent_fwd, children
    # rank of a node among its siblings = earlier valid nodes with the same parent
    same = (tree.parents[:, :, None] == tree.parents[:, None, :]) & valid[:, None, :] & valid[:, :, None]
    earlier = torch.ones(N, N, dtype=torch.bool, device=dev).tril(-1)
    rank = (same & earlier).sum(-1)  # [B, N]
    ok = valid & (rank < W)
    b_idx = torch.arange(B, device=dev)[:, None].expand(B, N)
    node = torch.arange(N, device=dev).expand(B, N)
    children[b_idx[ok], parent_fwd[ok], rank[ok]] = node[ok]
    return valid, parent_fwd, children


def _finish(tree: DraftTree, path: Tensor, num_acc: Tensor, extra: Tensor) -> Verdict:
    """path [B, K] accepted node ids (-1 after), num_acc [B], extra [B] -> Verdict with tokens [B, K+1]."""
    B, K = path.shape
    acc_tok = torch.where(path >= 0, tree.tokens.gather(1, path.clamp(min=0)) if K else path, PAD_ID)
    tokens = torch.cat([acc_tok, torch.full((B, 1), PAD_ID, dtype=torch.long, device=path.device)], 1)
    tokens.scatter_(1, num_acc[:, None], extra[:, None])
    return Verdict(tokens=tokens, num_accepted=num_acc, accepted_nodes=path)


def verify_greedy(tree: DraftTree, logits: Tensor) -> Verdict:
    """Keep the longest path on which every draft equals the target's argmax at its parent."""
    B, N = tree.tokens.shape
    K = tree.depth
    dev = logits.device
    argmax = logits.argmax(-1)  # [B, 1+N]
    if N == 0:
        return _finish(tree, torch.empty(B, 0, dtype=torch.long, device=dev), torch.zeros(B, dtype=torch.long, device=dev), argmax[:, 0])
    valid, parent_fwd, _ = _node_structure(tree)
    correct = valid & (tree.tokens == argmax.gather(1, parent_fwd))
    ok = correct.clone()
    for _ in range(K - 1):  # a node is kept if it is correct and its parent is kept (root is kept)
        parent_ok = torch.cat([torch.ones(B, 1, dtype=torch.bool, device=dev), ok], 1).gather(1, parent_fwd)
        ok = correct & parent_ok
    depth = tree.depths()
    score = torch.where(ok, depth, 0)
    num_acc, deepest = score.max(1)  # [B]; deepest node on the kept path (arbitrary when num_acc = 0)
    path = torch.full((B, K), -1, dtype=torch.long, device=dev)
    cur = torch.where(num_acc > 0, deepest, -1)
    for _ in range(K):  # walk up from the deepest kept node, writing each node at its depth - 1
        live = cur >= 0
        d = torch.where(live, depth.gather(1, cur.clamp(min=0)[:, None])[:, 0] - 1, 0)
        path.scatter_(1, d[:, None], torch.where(live, cur, path.gather(1, d[:, None])[:, 0])[:, None])
        cur = torch.where(live, tree.parents.gather(1, cur.clamp(min=0)[:, None])[:, 0], -1)
    extra = argmax.gather(1, torch.where(num_acc > 0, deepest + 1, 0)[:, None])[:, 0]
    return _finish(tree, path, num_acc, extra)


def _descend(tree: DraftTree, probs: Tensor, accept_fn, gen: torch.Generator | None, lossless: bool) -> Verdict:
    """Walk the tree from the root, trying children in order with `accept_fn`; shared by sampling/typical.

    accept_fn(p [B, V], q [B, V] | None, x [B], u [B]) -> accepted [B] bool.
    """
    B, N = tree.tokens.shape
    K, W = tree.depth, max(tree.width, 1)
    V = probs.shape[-1]
    dev = probs.device
    rows = torch.arange(B, device=dev)
    _, _, children = _node_structure(tree) if N else (None, None, torch.full((B, 1, W), -1, dtype=torch.long, device=dev))
    cur = torch.zeros(B, dtype=torch.long, device=dev)  # forward index of the current node (0 = root)
    alive = torch.ones(B, dtype=torch.bool, device=dev)  # still descending
    p = probs[:, 0].clone()  # residual target distribution at the current node
    removed = torch.zeros(B, V, dtype=torch.bool, device=dev)  # earlier siblings, out of q
    path = torch.full((B, K), -1, dtype=torch.long, device=dev)
    num_acc = torch.zeros(B, dtype=torch.long, device=dev)
    for depth in range(K):
        moved = torch.zeros(B, dtype=torch.bool, device=dev)
        for r in range(W):
            child = children[rows, cur, r]  # [B]
            has = alive & ~moved & (child >= 0)
            c = child.clamp(min=0)
            x = tree.tokens[rows, c].clamp(min=0)  # [B]
            if tree.probs is not None:
                q = tree.probs[rows, c].masked_fill(removed, 0.0)
                q = q / q.sum(-1, keepdim=True).clamp(min=1e-30)
            else:
                q = None
            u = torch.rand(B, generator=gen, device=dev)
            acc = has & accept_fn(p, q, x, u)
            rej = has & ~acc
            if lossless:  # residual p <- norm(max(p - q, 0)) on rejection
                q_full = q if q is not None else torch.nn.functional.one_hot(x, V).to(p.dtype)
                resid = (p - q_full).clamp(min=0.0)
                mass = resid.sum(-1, keepdim=True)
                resid = torch.where(mass > 0, resid / mass.clamp(min=1e-30), p)
                p = torch.where(rej[:, None], resid, p)
            removed[rows, x] |= rej
            path[:, depth] = torch.where(acc, c, path[:, depth])
            num_acc += acc.long()
            cur = torch.where(acc, c + 1, cur)
            moved |= acc
        # rows that moved continue from the child's full target distribution
        p = torch.where(moved[:, None], probs[rows, cur], p)
        removed &= ~moved[:, None]
        alive &= moved
    extra = sample_from(p, gen)  # recovered (after rejections), or bonus (leaf / all accepted)
    return _finish(tree, path, num_acc, extra)


def verify_sampling(tree: DraftTree, logits: Tensor, params: SamplingParams, gen: torch.Generator | None) -> Verdict:
    probs = target_probs(logits, params)  # [B, 1+N, V]

    def accept(p: Tensor, q: Tensor | None, x: Tensor, u: Tensor) -> Tensor:
        px = p.gather(1, x[:, None])[:, 0]
        qx = q.gather(1, x[:, None])[:, 0] if q is not None else torch.ones_like(px)
        return u * qx < px  # u < p/q without dividing by a zero q

    return _descend(tree, probs, accept, gen, lossless=True)


def verify_typical(tree: DraftTree, logits: Tensor, params: SamplingParams, gen: torch.Generator | None,
                   epsilon: float = 0.09, alpha: float = 0.3) -> Verdict:
    """Medusa's typical acceptance (not lossless): p(x) > min(epsilon, alpha * exp(-entropy(p)))."""
    probs = target_probs(logits, params)

    def accept(p: Tensor, q: Tensor | None, x: Tensor, u: Tensor) -> Tensor:
        ent = -(p * p.clamp(min=1e-30).log()).sum(-1)
        thr = torch.minimum(torch.full_like(ent, epsilon), alpha * torch.exp(-ent))
        return p.gather(1, x[:, None])[:, 0] > thr

    return _descend(tree, probs, accept, gen, lossless=False)


RULES = ("auto", "greedy", "sampling", "typical")


def verify(tree: DraftTree, logits: Tensor, params: SamplingParams, gen: torch.Generator | None,
           rule: str = "auto", **kw) -> Verdict:
    """Dispatch: auto = greedy at temperature 0, lossless sampling otherwise."""
    if rule == "auto":
        rule = "greedy" if params.greedy else "sampling"
    if rule == "greedy":
        return verify_greedy(tree, logits)
    if rule == "sampling":
        return verify_sampling(tree, logits, params, gen)
    if rule == "typical":
        return verify_typical(tree, logits, params, gen, **kw)
    raise ValueError(f"acceptance rule {rule!r}; valid: {', '.join(RULES)}")
