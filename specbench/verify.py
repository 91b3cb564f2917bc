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
- typical (Medusa's rule, opt-in, NOT lossless): a node passes if p(x) > min(epsilon, alpha * exp(-H(p))) at
  its parent (p = softmax(logits / T), H with log(p + 1e-5) as the reference); among the candidate paths the
  longest passing prefix wins, ties broken by the summed log p of its tokens (Medusa's `evaluate_posterior`);
  the extra token is sampled from p restricted to the tokens that pass (`get_typical_one_token`).
- synthetic (benchmarking only, NOT lossless; vLLM's `synthetic_acceptance_rates`): accept along the first
  child of each node at configured per-position rates whatever the target says, so loop and system costs can
  be measured on random-weight models of real shapes without a trained drafter.

Randomness: `draws` uniforms per row per step, indexed by node (node n's test uses u[b, n]), then one
exponential vector of the vocabulary's size for the extra token. With per-request generators each row's
stream advances by the same amount every step whatever the tree or the other rows look like.
"""

from __future__ import annotations

import torch
from torch import Tensor

from specbench.core.types import PAD_ID, DraftTree, Verdict
from specbench.core.sampling import Gen, SamplingParams, sample_from, select, target_probs, uniform


def _node_structure(tree: DraftTree) -> tuple[Tensor, Tensor, Tensor]:
    """valid [B, N] bool, parent forward index [B, N] (0 = root), children [B, 1+N, W] node ids (-1 pad)."""
    B, N = tree.tokens.shape
    dev = tree.tokens.device
    valid = torch.arange(N, device=dev)[None] < tree.lens[:, None]
    parent_fwd = (tree.parents + 1).clamp(min=0)
    W = max(tree.width, 1)
    if tree.is_chain:
        children = torch.full((B, N + 1, W), -1, dtype=torch.long, device=dev)
        children[:, :N, 0] = torch.arange(N, device=dev).expand(B, N).masked_fill(~valid, -1)
        return valid, parent_fwd, children
    # rank of a node among its siblings = earlier valid nodes with the same parent
    same = (tree.parents[:, :, None] == tree.parents[:, None, :]) & valid[:, None, :] & valid[:, :, None]
    earlier = torch.ones(N, N, dtype=torch.bool, device=dev).tril(-1)
    rank = (same & earlier).sum(-1)  # [B, N]
    ok = valid & (rank < W)
    # one scatter with fixed shapes (no boolean indexing, so no host sync): nodes that are not placed go to a
    # spare column W of their parent's row, dropped after
    spare = torch.full((B, N + 1, W + 1), -1, dtype=torch.long, device=dev)
    slot = parent_fwd * (W + 1) + torch.where(ok, rank, W)
    node = torch.arange(N, device=dev).expand(B, N)
    spare.view(B, -1).scatter_(1, slot, torch.where(ok, node, -1))
    children = spare[:, :, :W].contiguous()
    return valid, parent_fwd, children


def _finish(tree: DraftTree, path: Tensor, num_acc: Tensor, extra: Tensor) -> Verdict:
    """path [B, K] accepted node ids (-1 after), num_acc [B], extra [B] -> Verdict with tokens [B, K+1]."""
    B, K = path.shape
    acc_tok = torch.where(path >= 0, tree.tokens.gather(1, path.clamp(min=0)) if K else path, PAD_ID)
    tokens = torch.cat([acc_tok, torch.full((B, 1), PAD_ID, dtype=torch.long, device=path.device)], 1)
    tokens.scatter_(1, num_acc[:, None], extra[:, None])
    return Verdict(tokens=tokens, num_accepted=num_acc, accepted_nodes=path)


def _longest_path(tree: DraftTree, passes: Tensor, score_tb: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """The deepest node whose whole path passes. passes [B, N] bool per node (valid nodes only);
    score_tb [B, N] float: tie-break among equally deep nodes (higher wins; None = the first in node order).
    Returns path [B, K] (node ids by depth, -1 after), num_acc [B], forward index of the last kept node [B]."""
    B, N = tree.tokens.shape
    K = tree.depth
    dev = tree.tokens.device
    _, parent_fwd, _ = _node_structure(tree)
    ok = passes.clone()
    for _ in range(K - 1):  # a node is kept if it passes and its parent is kept (root is kept)
        parent_ok = torch.cat([torch.ones(B, 1, dtype=torch.bool, device=dev), ok], 1).gather(1, parent_fwd)
        ok = passes & parent_ok
    depth = tree.depths()
    if score_tb is None:
        score = torch.where(ok, depth, 0)
    else:  # depth first, then the path's summed score (squashed into (0, 0.5) so it never outweighs a level)
        path_s = score_tb.double()
        for _ in range(K - 1):  # sum over the path: add the parent's running sum, top-down
            par = torch.cat([torch.zeros(B, 1, dtype=path_s.dtype, device=dev), path_s], 1).gather(1, parent_fwd)
            path_s = score_tb.double() + par
        score = torch.where(ok, depth.double() + 0.5 * torch.sigmoid(path_s), 0.0)
    deepest = score.argmax(1)  # the first maximum on ties
    num_acc = torch.where(ok.any(1), depth.gather(1, deepest[:, None])[:, 0], 0)
    path = torch.full((B, K), -1, dtype=torch.long, device=dev)
    cur = torch.where(num_acc > 0, deepest, -1)
    for _ in range(K):  # walk up from the deepest kept node, writing each node at its depth - 1
        live = cur >= 0
        d = torch.where(live, depth.gather(1, cur.clamp(min=0)[:, None])[:, 0] - 1, 0)
        path.scatter_(1, d[:, None], torch.where(live, cur, path.gather(1, d[:, None])[:, 0])[:, None])
        cur = torch.where(live, tree.parents.gather(1, cur.clamp(min=0)[:, None])[:, 0], -1)
    last_fwd = torch.where(num_acc > 0, deepest + 1, 0)
    return path, num_acc, last_fwd


def _empty_path(tree: DraftTree, dev) -> tuple[Tensor, Tensor, Tensor]:
    B = tree.tokens.shape[0]
    z = torch.zeros(B, dtype=torch.long, device=dev)
    return torch.empty(B, 0, dtype=torch.long, device=dev), z, z


def verify_greedy(tree: DraftTree, logits: Tensor) -> Verdict:
    """Keep the longest path on which every draft equals the target's argmax at its parent."""
    argmax = logits.argmax(-1)  # [B, 1+N]
    if tree.num_nodes == 0:
        path, num_acc, last = _empty_path(tree, logits.device)
    else:
        valid, parent_fwd, _ = _node_structure(tree)
        path, num_acc, last = _longest_path(tree, valid & (tree.tokens == argmax.gather(1, parent_fwd)))
    return _finish(tree, path, num_acc, argmax.gather(1, last[:, None])[:, 0])


def _descend(tree: DraftTree, probs: Tensor, accept_fn, gen: Gen, lossless: bool, draws: int | None = None) -> Verdict:
    """Walk the tree from the root, trying children in order with `accept_fn` (the recursive rule).

    accept_fn(p [B, V], q [B, V] | None, x [B], u [B]) -> accepted [B] bool. `draws` (>= N): uniforms per
    row per step, fixed per run so every row's random stream advances the same way whatever the tree.
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
    if draws is not None and draws < N:
        raise ValueError(f"draws={draws} < {N} tree nodes: every node needs its own uniform")
    U = uniform((B, draws if draws is not None else N), gen, dev)  # node n is tested with U[b, n]
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
            u = U[rows, c]
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


def verify_sampling(tree: DraftTree, logits: Tensor, params: SamplingParams, gen: Gen, draws: int | None = None) -> Verdict:
    probs = target_probs(logits, params)  # [B, 1+N, V]

    def accept(p: Tensor, q: Tensor | None, x: Tensor, u: Tensor) -> Tensor:
        px = p.gather(1, x[:, None])[:, 0]
        qx = q.gather(1, x[:, None])[:, 0] if q is not None else torch.ones_like(px)
        return u * qx < px  # u < p/q without dividing by a zero q

    return _descend(tree, probs, accept, gen, lossless=True, draws=draws)


def typical_threshold(probs: Tensor, epsilon: float, alpha: float) -> Tensor:
    """[..., V] -> [...]: min(epsilon, alpha * exp(-H(p))), entropy with log(p + 1e-5) as Medusa's reference."""
    ent = -(probs * torch.log(probs + 1e-5)).sum(-1)
    return torch.minimum(torch.full_like(ent, epsilon), alpha * torch.exp(-ent))


def verify_typical(tree: DraftTree, logits: Tensor, params: SamplingParams, gen: Gen,
                   epsilon: float = 0.09, alpha: float = 0.3) -> Verdict:
    """Medusa's typical acceptance (not lossless): the longest candidate path whose every token passes
    p(x) > min(epsilon, alpha * exp(-H(p))) at its parent; ties by summed log p; the extra token is drawn from
    p restricted to the passing tokens. p = softmax(logits / T) (Medusa applies no top-p here)."""
    probs = torch.softmax(logits.float() / params.temperature, dim=-1)  # [B, 1+N, V]
    thr = typical_threshold(probs, epsilon, alpha)  # [B, 1+N]
    if tree.num_nodes == 0:
        path, num_acc, last = _empty_path(tree, logits.device)
    else:
        valid, parent_fwd, _ = _node_structure(tree)
        p_par = probs.gather(1, parent_fwd[..., None].expand(-1, -1, probs.shape[-1]))  # [B, N, V]
        px = p_par.gather(2, tree.tokens.clamp(min=0)[..., None])[..., 0]
        passes = valid & (px > thr.gather(1, parent_fwd))
        path, num_acc, last = _longest_path(tree, passes, torch.log(px.clamp(min=1e-30)))
    rows = torch.arange(probs.shape[0], device=probs.device)
    p = probs[rows, last]
    p = torch.where(p >= thr[rows, last][:, None], p, 0.0)  # get_typical_one_token: drop p < threshold
    extra = sample_from(p / p.sum(-1, keepdim=True), gen)
    return _finish(tree, path, num_acc, extra)


def synthetic_conditional(rates) -> list[float]:
    """Per-position acceptance rates as results.json's `per_position` reports them (the i-th draft accepted in
    that fraction of steps) -> the probability of accepting draft i given drafts < i were accepted."""
    out, prev = [], 1.0
    for r in rates:
        out.append(0.0 if prev == 0 else r / prev)
        prev = r
    return out


def verify_synthetic(tree: DraftTree, logits: Tensor, params: SamplingParams, gen: Gen, rates: list[float],
                     draws: int | None = None) -> Verdict:
    """acceptance=synthetic (for measuring loop and system costs, NOT lossless): the draft path along every
    node's first child is accepted to depth d with the configured unconditional rates (draft i kept with
    probability rates[i] / rates[i-1] once drafts < i were kept), whatever the target says; the extra token is
    the target's own pick at the last kept node (argmax at T = 0, else a sample). Randomness: `draws` uniforms
    per row per step (node order, as the lossless rule), then the extra token's draw."""
    B, N = tree.tokens.shape
    K = tree.depth
    dev = logits.device
    if len(rates) < K:
        raise ValueError(f"synthetic.rates has {len(rates)} entries; this step drafts to depth {K}")
    cond = torch.tensor(synthetic_conditional(rates[:K]) or [0.0], dtype=torch.float32, device=dev)
    U = uniform((B, max(draws if draws is not None else N, N)), gen, dev)
    path = torch.full((B, K), -1, dtype=torch.long, device=dev)
    num_acc = torch.zeros(B, dtype=torch.long, device=dev)
    last = torch.zeros(B, dtype=torch.long, device=dev)  # forward index of the last kept node (0 = root)
    if N:
        _, _, children = _node_structure(tree)
        rows = torch.arange(B, device=dev)
        alive = torch.ones(B, dtype=torch.bool, device=dev)
        for d in range(K):
            child = children[rows, last, 0]  # the first child of the current node
            acc = alive & (child >= 0) & (U[rows, child.clamp(min=0)] < cond[d])
            path[:, d] = torch.where(acc, child, -1)
            num_acc += acc.long()
            last = torch.where(acc, child + 1, last)
            alive &= acc
    extra = select(logits[torch.arange(B, device=dev), last], params, gen)  # the target's pick at the last kept node
    return _finish(tree, path, num_acc, extra)


RULES = ("auto", "greedy", "sampling", "typical", "synthetic")
LOSSLESS = {"auto": True, "greedy": True, "sampling": True, "typical": False, "synthetic": False}


def resolve_rule(rule: str, params: SamplingParams) -> str:
    """auto = greedy at temperature 0, lossless sampling above it. A rule that cannot serve the temperature is
    an error: sampling / typical need T > 0 (their distributions are softmax(logits / T)), greedy needs T = 0."""
    if rule not in RULES:
        raise ValueError(f"acceptance={rule!r}; valid: {', '.join(RULES)}")
    if rule == "auto":
        return "greedy" if params.greedy else "sampling"
    if rule in ("sampling", "typical") and params.greedy:
        raise ValueError(f"acceptance={rule} needs temperature > 0 (temperature=0 is greedy decoding: use "
                         "acceptance=auto or greedy)")
    if rule == "synthetic":
        return rule
    if rule == "greedy" and not params.greedy:
        raise ValueError(f"acceptance=greedy with temperature={params.temperature} would not sample from the "
                         "target distribution; use acceptance=auto or sampling")
    return rule


def verify(tree: DraftTree, logits: Tensor, params: SamplingParams, gen: Gen, rule: str = "auto",
           draws: int | None = None, **kw) -> Verdict:
    """Dispatch on the (resolved) rule; `draws`: uniforms per row per step for sampling (>= nodes; None = N)."""
    rule = resolve_rule(rule, params)
    if rule == "greedy":
        return verify_greedy(tree, logits)
    if rule == "sampling":
        return verify_sampling(tree, logits, params, gen, draws)
    if rule == "synthetic":
        return verify_synthetic(tree, logits, params, gen, list(kw["rates"]), draws)
    return verify_typical(tree, logits, params, gen, **kw)
