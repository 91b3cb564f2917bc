"""Train Medusa-1 heads (frozen target) in the shared trainer: head i at position t learns the target's own
distribution over the token at t+2+i (self-distillation: soft-label CE against the target's next-token
distribution at position t+1+i, restricted to the head vocabulary and renormalised), on positions whose
token t+2+i is a response token of the head vocabulary; head i's loss is weighted `decay ** i` (Medusa's
`medusa_decay_coefficient`).

The heads project with the target's own lm_head (its rows of the head vocabulary, frozen), so only the
ResBlocks train: a few MB to ship. The blocks start at zero (each ResBlock the identity, as Medusa's
reference). Target states come from a target forward per step (`data.teacher=online`) or from the
target-state cache the EAGLE-3 trainer builds for the same data (`cached` / `states`): the final-normed
states are all Medusa needs, and the target's distribution is their lm_head product.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from specbench.drafters.medusa import MedusaDrafter
from specbench.errors import UserError
from specbench.models.medusa import MedusaConfig, MedusaHeads, save_medusa
from specbench.models.transformer import Transformer
from specbench.train.data import Tokenized
from specbench.train.eagle3 import draft_vocabulary
from specbench.train.evaluate import loop_acceptance


class MedusaMethod:
    name = "medusa"

    def __init__(self, target: Transformer, tokenizer, items: list[Tokenized], *, num_heads: int = 4,
                 num_layers: int = 1, head_vocab_size: int = 8192, decay: float = 0.8,
                 eval_prompts: list | None = None, eval_k: int = 3, eval_tree: str | list | None = None,
                 eval_max_new_tokens: int = 48) -> None:
        if num_heads < 1 or num_layers < 1:
            raise UserError(f"train.method.num_heads={num_heads}, num_layers={num_layers}: both must be >= 1")
        if not 1 <= eval_k <= num_heads:
            raise UserError(f"train.method.eval_k={eval_k}: must be in 1..num_heads={num_heads}")
        t = target.config
        self.target, self.tokenizer = target, tokenizer
        ids = draft_vocabulary(items, t.vocab_size, head_vocab_size, tuple(t.eos_token_id))
        full = len(ids) == t.vocab_size
        cfg = MedusaConfig(num_heads=num_heads, num_layers=num_layers, hidden_size=t.hidden_size,
                           vocab_size=t.vocab_size, lm_head="target", head_vocab_size=None if full else len(ids),
                           fc_bias=True)
        self.heads = MedusaHeads(cfg, None).float()
        with torch.no_grad():
            for blocks in self.heads.blocks:
                for lin in blocks:
                    lin.weight.zero_()
                    lin.bias.zero_()
            if self.heads.token_map is not None:
                self.heads.token_map.copy_(ids)
        self.rows = target.output.weight[ids].float()  # [Vh, H]: the frozen projection (the target's rows)
        self.in_vocab = torch.zeros(t.vocab_size, dtype=torch.bool).index_fill_(0, ids, True).to(target.device)
        self.heads.to(target.device)
        self.decay = decay
        self.eval_prompts, self.eval_k, self.eval_tree = eval_prompts or [], eval_k, eval_tree
        self.eval_max_new = eval_max_new_tokens
        self.states = None  # a TargetStates cache; None = target forward on the fly

    def parameters(self):
        return self.heads.parameters()

    def _normed(self, ids: Tensor, index: list[int] | None) -> Tensor:
        if self.states is not None:
            return self.states.get(index, ids.shape[1])[1].to(ids.device)
        with torch.no_grad():
            o = self.target(ids, None, return_normed=True,
                            logit_index=torch.zeros(ids.shape[0], 1, dtype=torch.long, device=ids.device))
        return o.normed.float()

    def loss(self, ids: Tensor, mask: Tensor, index: list[int] | None = None) -> tuple[Tensor, dict[str, float]]:
        normed = self._normed(ids, index)  # [B, T, H]
        B, T, H = normed.shape
        with torch.no_grad():
            t_logp = F.log_softmax(normed @ self.rows.T, dim=-1)  # [B, T, Vh]: the target at every position
            ok = mask.bool() & self.in_vocab[ids]  # [B, T] a response token the heads can name
        states = self.heads.states(normed)  # [B, T, heads, H]
        total = torch.zeros((), dtype=torch.float32, device=ids.device)
        stats: dict[str, float] = {}
        for i in range(self.heads.config.num_heads):
            s = 2 + i  # head i at t predicts token t+2+i; the target's distribution for it sits at t+1+i
            if T <= s:
                break
            valid = ok[:, s:].reshape(-1)  # positions t = 0..T-1-s
            sel = valid.nonzero().squeeze(1)
            if not sel.numel():
                continue
            y = states[:, : T - s, i].reshape(-1, H)[sel]
            lp = F.log_softmax((y @ self.rows.T).float(), dim=-1)
            tgt = t_logp[:, s - 1: T - 1].reshape(-1, t_logp.shape[-1])[sel]
            loss_i = -(tgt.exp() * lp).sum(-1).mean()
            total = total + self.decay ** i * loss_i
            with torch.no_grad():
                stats[f"kl_{i}"] = float(loss_i + (tgt.exp() * tgt).sum(-1).mean())
                stats[f"acc_{i}"] = float((lp.argmax(-1) == tgt.argmax(-1)).float().mean())
        return total, stats

    def state_dict(self) -> dict[str, Tensor]:
        return self.heads.state_dict()

    def load_state_dict(self, sd: dict[str, Tensor]) -> None:
        self.heads.load_state_dict(sd)

    def inference_copy(self) -> MedusaHeads:
        out = MedusaHeads(self.heads.config, self.target.output)
        out.load_state_dict(self.heads.state_dict())
        return out.to(self.target.device, self.target.dtype).eval().requires_grad_(False)

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Greedy acceptance of the current heads (chain of depth eval_k, or eval_tree) with the decode loop."""
        drafter = MedusaDrafter(model=self.inference_copy(), tree=self.eval_tree)
        return loop_acceptance(self.target, self.tokenizer, self.eval_prompts, drafter, self.eval_k, self.eval_max_new)

    def export(self, out_dir: Path) -> None:
        """vLLM's layout, bf16, with the target's lm_head rows stored (serves unchanged elsewhere), and the
        compact form shipped here (the lm_head left to the target) in `<out_dir>/compact`."""
        save_medusa(self.inference_copy(), out_dir, layout="vllm")
        save_medusa(self.inference_copy(), Path(out_dir) / "compact", layout="vllm", store_target_head=False)
