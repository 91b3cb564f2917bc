"""The cross-rank messages of one decode step. Every rank runs the same loop; these keep them in lockstep.

Each message goes from the leader (the first rank of the last stage, see topology.py) to every rank, with a
shape every receiver knows in advance (gloo and NCCL do not negotiate sizes; a mismatch deadlocks):

- the draft tree: [B + 1, 2M + 1] int64 with M = the drafter's max_nodes(k): tokens and parents padded to
  M, lens, and a header row (N, depth, width, is_chain), so stage 0 embeds the real draft ids;
- the verdict: [B, 2K + 2] int64 (accepted tokens + bonus, accepted count, accepted node ids; K = the tree's
  depth from the header): every stage commits each request's accepted count and new length from it, so no
  stage's positions drift by the rejected tokens;
- a prefill's first tokens [R, 1];
- the drafter's setup outcome (its capture layers, or the error every rank then raises).

With one process (`LOCAL`) each function returns its input: the single-process loop sends nothing.
"""

from __future__ import annotations

import torch

from specbench.core.types import DraftTree, Verdict
from specbench.errors import UserError
from specbench.parallel.topology import Topology


def share_tree(topo: Topology, tree: DraftTree | None, batch: int, max_nodes: int, device) -> DraftTree:
    if not topo.parallel:
        return tree
    M = max_nodes
    buf = torch.zeros(batch + 1, 2 * M + 1, dtype=torch.long, device=device)
    if topo.is_leader:
        N = tree.num_nodes
        if N > M:
            raise RuntimeError(f"the drafter proposed {N} nodes, more than its max_nodes {M}")
        buf[:batch, :N] = tree.tokens
        buf[:batch, M:M + N] = tree.parents
        buf[:batch, 2 * M] = tree.lens
        buf[batch, :4] = torch.tensor([N, tree.depth, tree.width, int(tree.is_chain)])
    topo.comm.broadcast(buf, topo.leader)
    if tree is not None:  # a rank that drafted keeps its own tree (with q, for its verify): the leader's twin
        return tree
    N, depth, width, chain = buf[batch, :4].tolist()
    return DraftTree(buf[:batch, :N].clone(), buf[:batch, M:M + N].clone(), buf[:batch, 2 * M].clone(), None,
                     bool(chain), depth, width)


def share_verdict(topo: Topology, verdict: Verdict | None, batch: int, depth: int, device) -> Verdict:
    """The leader's verdict, on every rank (the sharded drafter's peers verify too, only to draw the same random
    numbers as the leader and keep their generators in step with it; their own verdict is then replaced)."""
    if not topo.parallel:
        return verdict
    K = depth
    buf = torch.empty(batch, 2 * K + 2, dtype=torch.long, device=device)
    if topo.is_leader:
        buf[:, :K + 1] = verdict.tokens
        buf[:, K + 1] = verdict.num_accepted
        buf[:, K + 2:] = verdict.accepted_nodes
    topo.comm.broadcast(buf, topo.leader)
    if topo.is_leader:
        return verdict
    return Verdict(buf[:, :K + 1].clone(), buf[:, K + 1].clone(), buf[:, K + 2:].clone())


def share_tokens(topo: Topology, tokens: torch.Tensor | None, rows: int, device) -> torch.Tensor:
    """A prefill's first tokens [R, 1], picked on the leader (and, to stay in step, by the drafter's peers)."""
    if not topo.parallel:
        return tokens
    buf = tokens.contiguous() if topo.is_leader else torch.empty(rows, 1, dtype=torch.long, device=device)
    return topo.comm.broadcast(buf, topo.leader)


def share_outcome(topo: Topology, error: str | None, value=None):
    """The leader's outcome of a step only drafter ranks run (setup): its value, or its error on every rank."""
    if topo.parallel:
        error, value = topo.comm.broadcast_object((error, value), topo.leader)
    if error is not None:
        raise UserError(error)
    return value


def agree(topo: Topology | None, fn):
    """Run `fn` on every rank; if it raised a UserError on any rank, raise the first such error on all of them
    (a check that fails on one rank only would otherwise leave the others waiting in the next collective).
    topo None: over the whole process group when one is joined (checks made before the Topology exists)."""
    import torch.distributed as dist

    error, value = None, None
    try:
        value = fn()
    except UserError as e:
        error = str(e)
    if topo is not None and topo.parallel:
        errors = topo.comm.all_gather_object(error)
    elif topo is None and dist.is_initialized():
        errors = [None] * dist.get_world_size()
        dist.all_gather_object(errors, error)
    else:
        errors = [error]
    errors = [e for e in errors if e is not None]
    error = errors[0] if errors else None
    if error is not None:
        raise UserError(error)
    return value
