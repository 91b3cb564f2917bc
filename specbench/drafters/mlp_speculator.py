"""MLP speculator (IBM fms-extras): a chain of small MLP stages carrying a state vector from the target's
final-normed hidden state at the last accepted position; stage i embeds the token chosen before it and
predicts depth i+1. Drafts a chain of depth k <= n_predict (what vLLM drafts): greedy top-1, or, when
sampling, a token drawn from each stage's distribution q (carried in the tree, so verification is lossless).
fms' candidate tree (`top_k_tokens_per_head`, `n_candidates`) is not built yet: `method.tree` must be null.
"""

from __future__ import annotations

import torch

from specbench.core.sampling import SamplingParams, sample_from, target_probs
from specbench.core.types import BatchState, DraftTree
from specbench.drafters.base import FinalStateDrafter
from specbench.errors import UserError
from specbench.models.mlp_speculator import MLPSpeculator, load_mlp_speculator


class MLPSpeculatorDrafter(FinalStateDrafter):
    def __init__(self, path: str | None = None, tree=None, max_draft_len: int = 16, temperature: float | None = None,
                 model: MLPSpeculator | None = None) -> None:
        """path: an HF MLP speculator folder (config.json + safetensors). temperature: the draft's sampling
        temperature (null = the run's)."""
        if path is None and model is None:
            raise UserError("method=mlp_speculator needs method.drafter.path=<an MLP speculator folder>")
        if tree is not None:
            raise UserError("method.tree: the MLP speculator's candidate tree is not supported in this version; "
                            "valid: null (a chain of depth k)")
        self.path, self.max_draft_len, self.temperature, self.model = path, max_draft_len, temperature, model
        self.hidden_layers: tuple[int, ...] = ()

    def max_nodes(self, k: int) -> int:
        return k

    def setup(self, target, batch_size: int, max_len: int, k: int, params: SamplingParams, gen) -> None:
        if self.model is None:
            self.model = load_mlp_speculator(self.path, target)
        n = self.model.config.n_predict
        if k > n:
            raise UserError(f"k={k}: this MLP speculator has n_predict={n} stages, so k must be <= {n}")
        self.track(target, batch_size)
        t = params.temperature if self.temperature is None else self.temperature
        self.params, self.gen = SamplingParams(t, params.top_p), gen

    def describe(self) -> dict:
        c = self.model.config
        return {"path": self.path, "n_predict": c.n_predict, "emb_dim": c.emb_dim, "inner_dim": c.inner_dim,
                "tie_weights": c.tie_weights, "scale_input": c.scale_input, "shape": "chain"}

    def propose(self, state: BatchState) -> DraftTree:
        s, x = self.model.start(self.state), state.last[:, 0]
        toks, qs = [], []
        for i in range(state.k):
            s, logits = self.model.stage(i, s, x)
            if self.params.greedy:
                x, q = logits.argmax(-1), None
            else:
                q = target_probs(logits, self.params)
                x = sample_from(q, self.gen)
            toks.append(x)
            qs.append(q)
        probs = None if qs[0] is None else torch.stack(qs, 1)
        return DraftTree.chain(torch.stack(toks, 1), state.active * state.k, probs)
