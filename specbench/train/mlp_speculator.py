"""Train an MLP speculator (frozen target) in the shared trainer, in fms-fsdp's two stages.

Stage i at position t starts from the target's final-normed state at t (the state whose logits give token
t+1), is fed the true token t+1+i (teacher forcing, as fms) and learns token t+2+i: against the token itself
(`labels=tokens`, fms) or the target's own distribution there (`labels=distribution`: soft-label CE against
softmax of the target's logits at t+1+i, self-distillation). The stage losses are summed with equal weight.

- stage 1: the training files (text / chat responses);
- stage 2 (from `stage2.start_fraction` of the steps on, at `stage2.lr_scale` times the learning rate): sequences
  the target samples itself from short prompts (fms: T = 1, top-k 10, 256 new tokens, a tenth of the rate),
  generated once before training and cached in the run folder (`stage2.jsonl`, token ids).

Size: a stage's `emb` and `head` are vocabulary x inner_dim tables (2 x 28M parameters for SmolLM2 at 576).
`tables=target` (default) uses the target's own embedding and lm_head, frozen (inner_dim = hidden size; only proj /
ln train: ~0.33M parameters per stage for SmolLM2, a few MB, exported compact + full); each proj starts as 4·I,
so stage 0 starts near GELU(the target's state)·lm_head. Its limit: the frozen lm_head reads a GELU output
(experiments README section 9). `tables=own` trains them at a small inner_dim, started as the target's
embedding on its top-inner_dim principal directions (with fms' `tie_weights`, SmolLM2 at inner_dim 96: ~9.5M
parameters, 19 MB bf16, the plain public layout). Positions are subsampled
(`positions` per micro-batch, deterministic): each stage's head is a full-vocabulary product. Target states come from a target forward per step (`data.teacher=online`) or a cache of final-normed
states built once (`cached` / `states`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from specbench.drafters.mlp_speculator import MLPSpeculatorDrafter
from specbench.errors import UserError
from specbench.models.mlp_speculator import MLPSpeculator, MLPSpeculatorConfig, save_mlp_speculator, target_tables
from specbench.models.transformer import Transformer
from specbench.train.data import Tokenized
from specbench.train.evaluate import loop_acceptance

LABELS = ("tokens", "distribution")
TABLES = ("own", "target")


class MLPSpeculatorMethod:
    name = "mlp_speculator"

    def __init__(self, target: Transformer, tokenizer, *, n_predict: int = 4, inner_dim: int = 96,
                 tables: str = "target", tie_weights: bool = False, scale_input: bool = True,
                 labels: str = "tokens", positions: int = 512, top_k_tokens_per_head: list[int] | None = None, n_candidates: int = 5,
                 eval_prompts: list | None = None, eval_k: int = 3, eval_tree: dict | None = None,
                 eval_max_new_tokens: int = 48, seed: int = 0) -> None:
        if n_predict < 1 or (tie_weights and n_predict < 2):
            raise UserError(f"train.method.n_predict={n_predict}: must be >= 1 (>= 2 with tie_weights)")
        if labels not in LABELS:
            raise UserError(f"train.method.labels={labels!r}; valid: {', '.join(LABELS)}")
        if tables not in TABLES:
            raise UserError(f"train.method.tables={tables!r}; valid: {', '.join(TABLES)}")
        if positions < 0:
            raise UserError(f"train.method.positions={positions}: must be >= 0 (0 = every position)")
        if not 1 <= eval_k <= n_predict:
            raise UserError(f"train.method.eval_k={eval_k}: must be in 1..n_predict={n_predict}")
        t = target.config
        inner = t.hidden_size if tables == "target" else int(inner_dim or t.hidden_size)
        if not 1 <= inner <= t.hidden_size:
            raise UserError(f"train.method.inner_dim={inner_dim}: must be in 1..{t.hidden_size} (the target's hidden size)")
        self.target, self.tokenizer = target, tokenizer
        topk = list(top_k_tokens_per_head or [4, 3, 2, 2][:n_predict] + [1] * max(0, n_predict - 4))
        cfg = MLPSpeculatorConfig(emb_dim=t.hidden_size, inner_dim=inner, vocab_size=t.vocab_size,
                                  n_predict=n_predict, top_k_tokens_per_head=topk, n_candidates=n_candidates,
                                  tie_weights=tie_weights, scale_input=scale_input, target_tables=tables == "target")
        emb_w = target.tok_embeddings.weight.detach().float()
        head_w = emb_w if target.output.weight is target.tok_embeddings.weight else target.output.weight.detach().float()
        self.head_w = head_w  # the target's lm_head: its distribution for labels=distribution
        own = tables == "own"
        self.model = MLPSpeculator(cfg, None if own else (emb_w, lambda s: F.linear(s, head_w), head_w)).float()
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():  # fms reset_parameters: linears ~ N(0, 1/inner_dim), norm biases 0; the norm
            for lin in self.model.proj:  # weights start as the target's final norm's (its lm_head's input scale)
                lin.weight.normal_(0.0, 1 / math.sqrt(inner), generator=g)
            for ln in self.model.ln:
                ln.weight.copy_(target.norm.weight.float()[:inner] if not own else torch.ones(inner))
            if not own:  # carry the state: proj = 4 I (the state outweighs the embedding term, which LN rescales),
                for lin in self.model.proj:  # so stage 0 starts near GELU(the target's normed state) . lm_head
                    lin.weight.copy_(4.0 * torch.eye(inner))
            if own:  # emb / head start as the target's tables on their top-`inner` principal directions
                basis = torch.linalg.svd(emb_w, full_matrices=False).Vh[:inner].T  # [H, inner]
                for e in self.model.emb:
                    e.weight.copy_(emb_w @ basis)
                for h in self.model.head:
                    h.weight.copy_(head_w @ basis)
        self.model.to(target.device)
        self.labels, self.positions, self.seed = labels, positions, seed
        self.eval_prompts, self.eval_k, self.eval_tree = eval_prompts or [], eval_k, eval_tree
        self.eval_max_new = eval_max_new_tokens
        self.states = None  # a TargetStates / StackedStates cache; None = target forward on the fly

    def parameters(self):
        return self.model.parameters()

    def _normed(self, ids: Tensor, index: list[int] | None) -> Tensor:
        if self.states is not None:
            return self.states.get(index, ids.shape[1])[1].to(ids.device)
        with torch.no_grad():
            o = self.target(ids, None, return_normed=True,
                            logit_index=torch.zeros(ids.shape[0], 1, dtype=torch.long, device=ids.device))
        return o.normed.float()

    def _select(self, mask: Tensor, index: list[int] | None) -> tuple[Tensor, Tensor]:
        """(rows, positions) t whose stage 0 trains (token t+2 is a response token), at most `positions`,
        drawn by a generator seeded from the batch's sequence indices (deterministic, resumable)."""
        ok = torch.zeros_like(mask, dtype=torch.bool)
        ok[:, :-1] = mask[:, 1:].bool()  # mask[t+1]: token t+2 is trained
        b, t = ok.nonzero(as_tuple=True)
        if self.positions and b.numel() > self.positions:
            g = torch.Generator().manual_seed(hash((self.seed, tuple(index or ()))) & ((1 << 62) - 1))
            keep = torch.randperm(b.numel(), generator=g)[: self.positions].sort().values
            b, t = b[keep], t[keep]
        return b, t

    def loss(self, ids: Tensor, mask: Tensor, index: list[int] | None = None) -> tuple[Tensor, dict[str, float]]:
        normed = self._normed(ids, index)  # [B, T, H]
        B, T = ids.shape
        b, t = self._select(mask, index)
        s = self.model.start(normed[b, t])  # [N, H]
        total = torch.zeros((), dtype=torch.float32, device=ids.device)
        stats: dict[str, float] = {}
        for i in range(self.model.config.n_predict):
            src, dst = t + 1 + i, t + 2 + i  # fed token t+1+i, learns token t+2+i
            live = dst < T
            valid = torch.zeros_like(live)
            valid[live] = mask[b[live], src[live]].bool()  # token t+2+i is a response token
            x = ids[b, src.clamp(max=T - 1)]
            s, logits = self.model.stage(i, s, x)
            if not valid.any():
                break
            lp = F.log_softmax(logits[valid].float(), dim=-1)
            with torch.no_grad():
                if self.labels == "tokens":
                    y = ids[b[valid], dst[valid]]
                    tgt_arg = y
                else:
                    tgt = F.log_softmax(normed[b[valid], src[valid]] @ self.head_w.T, dim=-1)
                    tgt_arg = tgt.argmax(-1)
            if self.labels == "tokens":
                loss_i = F.nll_loss(lp, y)
            else:
                loss_i = -(tgt.exp() * lp).sum(-1).mean()
            total = total + loss_i
            with torch.no_grad():
                stats[f"loss_{i}"] = float(loss_i)
                stats[f"acc_{i}"] = float((lp.argmax(-1) == tgt_arg).float().mean())
        return total, stats

    def state_dict(self) -> dict[str, Tensor]:
        return self.model.state_dict()

    def load_state_dict(self, sd: dict[str, Tensor]) -> None:
        self.model.load_state_dict(sd)

    def inference_copy(self) -> MLPSpeculator:
        c = self.model.config
        out = MLPSpeculator(c, target_tables(self.target) if c.target_tables else None)
        out.load_state_dict(self.model.state_dict())
        return out.to(self.target.device, self.target.dtype).eval().requires_grad_(False)

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Greedy acceptance of the current speculator (chain of depth eval_k, or eval_tree) with the decode loop."""
        drafter = MLPSpeculatorDrafter(model=self.inference_copy(), tree=self.eval_tree)
        return loop_acceptance(self.target, self.tokenizer, self.eval_prompts, drafter, self.eval_k, self.eval_max_new)

    def export(self, out_dir: Path) -> None:
        """The public HF layout, bf16, in `out_dir`. With tables=target: the compact form (proj / ln only, the
        tables left to the target) there, and the full layout (the target's tables written under every emb.i /
        head.i) in `out_dir/full`."""
        model = self.inference_copy()
        if model.tables is None:
            save_mlp_speculator(model, out_dir)
            return
        save_mlp_speculator(model, out_dir, compact=True)
        save_mlp_speculator(model, Path(out_dir) / "full")


def sample_sequences(target, tokenizer, prompts: list[str], *, new_tokens: int, temperature: float, top_k: int,
                     batch_size: int, seed: int, cache: Path, progress: bool = True) -> list[Tokenized]:
    """Stage-2 data: the target's own samples (T, top-k) of `new_tokens` tokens from each prompt, cached as JSONL
    of token ids (prompt, generated) so a resumed run trains on the same sequences."""
    from specbench.core.sampling import SamplingParams
    from specbench.data.prompts import Prompt, to_requests
    from specbench.engine.loop import Engine, StopCriteria

    key = {"temperature": temperature, "top_k": top_k, "new_tokens": new_tokens, "seed": seed}
    done: dict[str, dict] = {}
    if cache.is_file():
        for line in cache.read_text().splitlines():
            r = json.loads(line)
            if r["settings"] == key:
                done[r["prompt"]] = r
    todo = [p for p in dict.fromkeys(prompts) if p not in done]
    if todo:
        reqs = to_requests([Prompt(id=f"s2-{i}", prompt=p) for i, p in enumerate(todo)], tokenizer)
        eng = Engine(target, tokenizer, batch_size=batch_size, params=SamplingParams(temperature, 1.0, top_k),
                     stop=StopCriteria(frozenset({tokenizer.eos_token_id}), new_tokens), seed=seed,
                     progress=progress)
        with open(cache, "a") as f:
            for p, req, r in zip(todo, reqs, eng.run(reqs)):
                rec = {"prompt": p, "settings": key, "prompt_ids": list(req.prompt_ids), "output_ids": r.output_ids}
                done[p] = rec
                f.write(json.dumps(rec) + "\n")
    out = []
    for p in prompts:
        r = done[p]
        if r["output_ids"]:
            out.append(Tokenized(r["prompt_ids"] + r["output_ids"], [0] * len(r["prompt_ids"]) + [1] * len(r["output_ids"])))
    return out
