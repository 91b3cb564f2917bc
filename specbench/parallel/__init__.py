"""Tensor and pipeline parallelism on torch.distributed (gloo on CPU, NCCL on CUDA), launched by torchrun.

`topology` says which rank does what and times the collectives; `tp` and `pp` are transforms of a loaded
model (the model code knows nothing of ranks); `step` holds the messages that keep every rank's loop in
lockstep (the draft tree, the verdict, a prefill's first tokens), all broadcast from one rank.
"""

from specbench.parallel.step import agree, share_outcome, share_tokens, share_tree, share_verdict
from specbench.parallel.topology import (LOCAL, Comm, Topology, check_sizes, init, join, launched_world, leave,
                                         local_device)

__all__ = ["LOCAL", "Comm", "Topology", "agree", "check_sizes", "init", "join", "launched_world", "leave",
           "local_device", "share_outcome", "share_tokens", "share_tree", "share_verdict", "apply", "shard_drafter"]


def apply(model, topo: Topology):
    """Shard `model` (a loaded Transformer) for this rank: tensor parallel over its stage's tp group, then cut
    to its pipeline stage. Returns what the engine calls as the target (the model itself when pp = 1)."""
    from specbench.parallel import pp, tp

    if topo.tp > 1:
        tp.shard(model, topo.tp_rank, topo.tp, topo.comm, topo.tp_group)
    if topo.pp > 1:
        return pp.StageModel(model, topo)
    return model


def shard_drafter(drafter, topo: Topology, method: str) -> None:
    """draft_tp = tp: the drafter's model is sharded over the last stage's tp group like the target, once it
    is loaded (the drafter applies `drafter.transform`). Only drafters with their own transformer can be."""
    from specbench.errors import UserError

    if topo.draft_tp == 1 or drafter is None:
        return
    if not getattr(drafter, "shardable", False):
        raise UserError(f"parallel.draft_tp={topo.draft_tp}: method={method} has no draft transformer to shard "
                        f"(only method=draft_model does); valid: parallel.draft_tp=1")
    from specbench.parallel import tp

    drafter = getattr(drafter, "inner", drafter)  # under method.lookup, the drafter it wraps
    drafter.transform = lambda m: tp.shard(m, topo.tp_rank, topo.tp, topo.comm, topo.draft_group)
