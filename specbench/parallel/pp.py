"""Pipeline parallelism as a transform: a `Transformer` cut to one stage's layers, and that stage's forward.

Layers split evenly into `pp` consecutive stages (the first `N mod pp` stages take one more). Stage 0 embeds;
every stage runs its layers; a non-last stage sends one packed tensor to the next: [B, T, H · (1 + a)], the
hidden state followed by the `a` requested captures (EAGLE-3's aux states, global layer ids) made by this or
an earlier stage, so the aux states of layers on any stage reach the drafter on the last stage with the
hidden state, in one message. Its shape follows from what every rank already knows (the step's input shape,
the hidden size, which capture ids each stage owns), so sender and receiver never negotiate sizes. The last
stage applies the final norm and the lm_head; other stages return no logits.

Memory: a stage keeps only its layers (and KV cache for them); the last stage keeps the embedding too,
because drafters on it read it (EAGLE, the draft-model-free heads); middle stages keep neither.
"""

from __future__ import annotations

import torch
from torch import nn

from specbench.errors import UserError
from specbench.models.transformer import TargetOutput
from specbench.parallel.topology import Topology


def stage_layers(num_layers: int, pp: int, stage: int) -> tuple[int, int]:
    """[lo, hi) of `stage`: e.g. 30 layers over 4 stages -> 8, 8, 7, 7."""
    if pp > num_layers:
        raise UserError(f"parallel.pp={pp}: the target has {num_layers} layers; valid: 1..{num_layers}")
    base, extra = divmod(num_layers, pp)
    lo = stage * base + min(stage, extra)
    return lo, lo + base + (1 if stage < extra else 0)


class StageModel:
    """One pipeline stage of a Transformer, called like the Transformer (same arguments, a TargetOutput);
    anything else (config, device, dtype, norm, output, tok_embeddings, new_cache, ...) is the model's."""

    def __init__(self, model, topo: Topology) -> None:
        cfg = model.config
        self.lo, self.hi = stage_layers(cfg.num_layers, topo.pp, topo.stage)
        model.layers = nn.ModuleList(list(model.layers)[self.lo:self.hi])
        model.layer_offset = self.lo
        if not topo.last_stage:
            model.norm = model.output = None
        if not (topo.first_stage or topo.last_stage):
            model.tok_embeddings = None
        self.model, self.topo = model, topo
        self.bounds = [stage_layers(cfg.num_layers, topo.pp, s) for s in range(topo.pp)]
        topo.layers = (self.lo, self.hi)

    def __getattr__(self, name):
        return getattr(self.__dict__["model"], name)

    def owner(self, layer_id: int) -> int:
        """The stage that captures `layer_id` (the state before that layer; N = the last layer's output)."""
        for s, (lo, hi) in enumerate(self.bounds):
            if lo <= layer_id < hi:
                return s
        return self.topo.pp - 1

    def __call__(self, input_ids, cache, *, kv_len=None, positions=None, tree_mask=None, logit_index=None,
                 hidden_layers=(), return_normed=False) -> TargetOutput:
        m, topo = self.model, self.topo
        H = m.config.hidden_size
        B, T = input_ids.shape
        wanted = sorted(set(hidden_layers))
        carried_in = [i for i in wanted if self.owner(i) < topo.stage]
        ctx = m.prepare(input_ids, cache, kv_len, positions, tree_mask)
        if topo.first_stage:
            x = m.tok_embeddings(input_ids)
            got: dict = {}
        else:
            buf = torch.empty(B, T, H * (1 + len(carried_in)), dtype=m.dtype, device=m.device)
            parts = topo.comm.recv(buf, topo.rank - topo.tp).split(H, dim=-1)
            x, got = parts[0], dict(zip(carried_in, parts[1:]))
        x, mine = m.run_layers(x, ctx, cache, {i for i in wanted if self.owner(i) == topo.stage})
        got.update(mine)
        if not topo.last_stage:
            out_ids = [i for i in wanted if self.owner(i) <= topo.stage]
            topo.comm.send(torch.cat([x] + [got[i] for i in out_ids], dim=-1), topo.rank + topo.tp)
            return TargetOutput(logits=None, hidden=[], normed=None)
        logits, normed = m.head(x, logit_index, return_normed)
        return TargetOutput(logits=logits, hidden=[got[i] for i in hidden_layers], normed=normed)
