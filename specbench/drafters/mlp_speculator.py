"""MLP speculator (IBM fms-extras): a chain of small MLP stages carrying a state vector from the target's
final-normed hidden state at the last accepted position; stage i embeds the token chosen before it and
predicts depth i+1.

- chain (`method.tree=null`, what vLLM drafts): depth k <= n_predict, greedy top-1, or, when sampling, a token
  drawn from each stage's distribution q (carried in the tree, so verification is lossless);
- candidate tree (`method.tree: {top_k, n_candidates}`, fms' `generate_suffixes`; null fields = the
  checkpoint's `top_k_tokens_per_head` / `n_candidates`): the top-k tokens of every stage expanded into all
  paths, the best n_candidates complete paths by summed log-probability, shared prefixes merged into one tree.
  Deterministic picks: point-mass candidates (greedy, lossless sampling and typical acceptance all apply).
"""

from __future__ import annotations

import torch

import json
from pathlib import Path

from specbench.core.sampling import SamplingParams, sample_from, target_probs
from specbench.core.types import BatchState, DraftTree
from specbench.drafters.base import FinalStateDrafter
from specbench.errors import UserError
from specbench.models.mlp_speculator import MLPSpeculator, load_mlp_speculator

SHIPPED = Path(__file__).resolve().parent.parent / "weights" / "smollm2-135m-mlp-speculator"


class MLPSpeculatorDrafter(FinalStateDrafter):
    def __init__(self, path: str | None = None, tree: dict | None = None, max_draft_len: int = 16,
                 temperature: float | None = None, model: MLPSpeculator | None = None) -> None:
        """path: an HF MLP speculator folder (config.json + safetensors); null = the speculator shipped for the
        embedded target. tree: null = a chain; {top_k, n_candidates} = fms' candidate tree (null fields: the
        checkpoint's). temperature: the draft's sampling temperature (null = the run's)."""
        if path is None and model is None:
            if not SHIPPED.is_dir():
                raise UserError("method=mlp_speculator needs method.drafter.path=<an MLP speculator folder>")
            path = str(SHIPPED)
        self.path, self.max_draft_len, self.temperature, self.model = path, max_draft_len, temperature, model
        self.hidden_layers: tuple[int, ...] = ()
        self.topk: list[int] | None = None
        if tree is not None:
            if not hasattr(tree, "get"):
                raise UserError(f"method.tree={tree!r}: null (a chain) or {{top_k: [...], n_candidates: N}}")
            ckpt = model.config.__dict__ if model is not None else self._checkpoint_config(path)
            topk = tree.get("top_k") or ckpt.get("top_k_tokens_per_head") or [5, 4, 3]
            self.topk = [int(t) for t in topk]
            self.n_candidates = int(tree.get("n_candidates") or ckpt.get("n_candidates") or 5)
            if min(self.topk) < 1 or self.n_candidates < 1:
                raise UserError(f"method.tree: top_k={self.topk}, n_candidates={self.n_candidates}: need all >= 1")

    @staticmethod
    def _checkpoint_config(path: str) -> dict:
        try:
            return json.loads((Path(path).expanduser() / "config.json").read_text())
        except (OSError, ValueError):
            return {}  # a missing or bad checkpoint is reported by the loader at setup

    def max_nodes(self, k: int) -> int:
        return k if self.topk is None else self.n_candidates * k

    def setup(self, target, batch_size: int, max_len: int, k: int, params: SamplingParams, gen,
              path_len: int | None = None) -> None:
        """path_len (`method.lookup.drafter_k`: accepted paths deeper than k) needs no room here: commit reads
        the target's state at the last accepted node, at any depth."""
        if self.model is None:
            try:
                self.model = load_mlp_speculator(self.path, target)
            except UserError as e:
                hint = (" (the shipped speculator is for the embedded SmolLM2-135M-Instruct; give "
                        "method.drafter.path=...)" if self.path == str(SHIPPED) else "")
                raise UserError(f"{e}{hint}") from None
        n = self.model.config.n_predict
        if k > n:
            raise UserError(f"k={k}: this MLP speculator has n_predict={n} stages, so k must be <= {n}")
        if self.topk is not None and len(self.topk) < k:
            raise UserError(f"method.tree.top_k={self.topk}: needs one entry per stage, k={k}")
        self.track(target, batch_size)
        t = params.temperature if self.temperature is None else self.temperature
        self.params, self.gen = SamplingParams(t, params.top_p, params.top_k), gen

    def describe(self) -> dict:
        c = self.model.config
        return {"path": self.path, "n_predict": c.n_predict, "emb_dim": c.emb_dim, "inner_dim": c.inner_dim,
                "tie_weights": c.tie_weights, "scale_input": c.scale_input,
                "shape": "chain" if self.topk is None else "tree",
                "tree": None if self.topk is None else {"top_k": self.topk, "n_candidates": self.n_candidates}}

    def propose(self, state: BatchState) -> DraftTree:
        if self.topk is not None:
            return self._tree(state)
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

    def _tree(self, state: BatchState) -> DraftTree:
        """fms' candidate tree: top `top_k_tokens_per_head[i]` tokens per stage, every path expanded, the best
        `n_candidates` complete paths by summed log-probability, shared prefixes merged into one tree (all on
        device: merged nodes are compacted away and `lens` counts the rest)."""
        k, B = state.k, state.last.shape[0]
        s, x = self.model.start(self.state)[:, None], state.last  # [B, 1, E], [B, 1]
        paths = torch.zeros(B, 1, 0, dtype=torch.long, device=self.device)
        logp = torch.zeros(B, 1, device=self.device)
        for i in range(k):
            s, logits = self.model.stage(i, s, x)  # [B, P, I], [B, P, V]
            vals, preds = torch.log_softmax(logits.float(), -1).topk(self.topk[i], dim=-1)  # [B, P, t]
            t = self.topk[i]
            paths = torch.cat([paths[:, :, None].expand(-1, -1, t, -1), preds[..., None]], -1).flatten(1, 2)
            logp = (logp[:, :, None] + vals).flatten(1)
            s = s[:, :, None].expand(-1, -1, t, -1).flatten(1, 2)
            x = preds.flatten(1)
        n = min(self.n_candidates, paths.shape[1])
        cand = paths.gather(1, logp.topk(n, dim=1).indices[..., None].expand(-1, -1, k))  # [B, n, k]
        # node (j, d) = candidate j's prefix of length d+1; its canonical copy is the first j' with that prefix
        same = (cand[:, :, None] == cand[:, None]).long().cumprod(-1).bool()  # [B, n, n, k]: prefixes equal to d
        canon = same.int().argmax(2)  # [B, n, k] first equal candidate (itself at worst)
        j = torch.arange(n, device=self.device)
        keep = (canon == j[None, :, None]).transpose(1, 2).reshape(B, k * n)  # depth-major: flat = d * n + j
        tokens = cand.transpose(1, 2).reshape(B, k * n)
        parent_flat = torch.cat([torch.full((B, 1, n), -1, device=self.device, dtype=torch.long),
                                 (canon[:, :, :-1].transpose(1, 2) + (torch.arange(k - 1, device=self.device) * n)[None, :, None])],
                                1).reshape(B, k * n)
        new_index = keep.long().cumsum(1) - 1  # position of each kept node after compaction
        order = torch.argsort((~keep).int(), dim=1, stable=True)
        lens = keep.sum(1) * state.active
        tokens = tokens.gather(1, order)
        par = parent_flat.gather(1, order)
        par = torch.where(par >= 0, new_index.gather(1, par.clamp(min=0)), -1)
        valid = torch.arange(k * n, device=self.device)[None] < lens[:, None]
        return DraftTree(tokens=tokens.masked_fill(~valid, -1), parents=par.masked_fill(~valid, -1), lens=lens,
                         depth=k, width=max(min(t, n) for t in self.topk[:k]))
