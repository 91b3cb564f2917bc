"""Train an EAGLE-3 head with the training-time test (TTT): the head is unrolled on its own outputs for
`ttt_steps` steps, so it learns to draft from the hidden states it will really see at depth > 1.

Step j (0-based) at sequence index i is the draft node at depth j+1 of a proposal whose last real pair is i:
its hidden input is fc(target states at i) for j = 0, else the head's own output o_{j-1} at i; its token is
x_{i+1+j} (teacher forcing); it sits at position i+j; it attends to the step-0 keys of indices <= i (the
committed prefix) and to its own chain's keys of steps 1..j at index i (EAGLE-3's "diagonal" attention, the
same keys a chain draft sees at inference). Its target is the target's next-token distribution at position
i+1+j restricted to the draft vocabulary (soft labels); positions whose next token lies outside the draft
vocabulary are masked, as in the reference. Step j's loss is weighted 0.8**j.

HASS's harmonised objective (`topk` = K > 0): each step's loss adds `topk_weight` times the soft-label CE
restricted to the target's K most likely draft-vocabulary tokens, -sum_{x in topK(p)} p(x) log q(x). The
draft only ever proposes its top tokens, so this spends more of the gradient where acceptance is decided. (HASS's
other half, training on the draft's own earlier outputs, is the training-time test above.)

The draft vocabulary is the `draft_vocab_size` (default 8192) most frequent tokens of the training responses (by id:
d2t[i] = id_i - i). The head starts from the target where shapes allow it: its lm_head rows are the target's
head rows of the draft vocabulary, its final norm the target's, and fc reads the high state.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from specbench.drafters.eagle import EagleDrafter
from specbench.errors import UserError
from specbench.models.eagle import EagleConfig, EagleDraft, default_aux_layers, save_eagle
from specbench.models.transformer import Transformer, apply_rope
from specbench.train.data import Tokenized
from specbench.train.evaluate import loop_acceptance

DRAFT_VOCAB = 8192  # draft vocabulary of a new head when draft_vocab_size is null


def draft_vocabulary(items: list[Tokenized], vocab_size: int, size: int, always: tuple[int, ...] = ()) -> Tensor:
    """The `size` most frequent response tokens (ties by id), plus `always` (e.g. EOS), sorted by id."""
    if not 1 <= size <= vocab_size:
        raise UserError(f"train.method.draft_vocab_size={size}: must be in 1..{vocab_size}")
    counts: Counter[int] = Counter()
    for x in items:
        counts.update(t for t, m in zip(x.ids, x.loss_mask) if m)
    keep = set(always)
    for tok, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        if len(keep) >= size:
            break
        keep.add(tok)
    for tok in range(vocab_size):  # rare case: fewer distinct tokens than `size`
        if len(keep) >= size:
            break
        keep.add(tok)
    return torch.tensor(sorted(keep)[:size], dtype=torch.long)


def new_head(target: Transformer, draft_ids: Tensor, aux_layers: list[int], fc_norm: bool = False) -> EagleDraft:
    t = target.config
    cfg = EagleConfig(version=3, hidden_size=t.hidden_size, intermediate_size=t.intermediate_size,
                      num_heads=t.num_heads, num_kv_heads=t.num_kv_heads, head_dim=t.head_dim,
                      vocab_size=t.vocab_size, draft_vocab_size=len(draft_ids), target_hidden_size=t.hidden_size,
                      rms_norm_eps=t.rms_norm_eps, rope_theta=t.rope_theta, rope_scaling=t.rope_scaling,
                      max_position_embeddings=t.max_position_embeddings, aux_layers=list(aux_layers),
                      fc_norm=fc_norm,
                      extra={"bos_token_id": t.bos_token_id, "eos_token_id": (t.eos_token_id or [None])[0]})
    torch.manual_seed(0)
    head = EagleDraft(cfg, target.tok_embeddings).float()
    H = t.hidden_size
    with torch.no_grad():
        head.d2t.copy_(draft_ids - torch.arange(len(draft_ids)))
        head.t2d.zero_().index_fill_(0, draft_ids, True)
        head.lm_head.weight.copy_(target.output.weight[draft_ids].float())
        head.norm.weight.copy_(target.norm.weight.float())
        head.fc.weight.mul_(0.1)
        head.fc.weight[:, 2 * H:] += torch.eye(H)  # start from the high state (closest to the output space)
    return head


def _read_start(path: str) -> dict[str, Tensor]:
    """Weights to start from: a training run's folder (its checkpoint, fp32) or an exported head folder."""
    from safetensors.torch import load_file

    p = Path(path).expanduser()
    for f in (p / "checkpoint" / "model.safetensors", p / "model.safetensors", p):
        if f.is_file():
            return load_file(str(f))
    raise UserError(f"train.method.init_from={path}: no checkpoint/model.safetensors or model.safetensors there")


def soft_label_loss(t_logp: Tensor, lp: Tensor, topk: int = 0, topk_weight: float = 1.0) -> tuple[Tensor, Tensor]:
    """Mean soft-label CE of the draft's log-probs `lp` against the target's `t_logp` (both [N, V]), plus, when
    topk > 0, HASS's term: topk_weight * mean of -sum over the target's top-`topk` tokens of p log q.
    -> (loss, the CE alone)."""
    p = t_logp.exp()
    ce = -(p * lp).sum(-1).mean()
    if topk <= 0:
        return ce, ce
    top = t_logp.topk(min(topk, t_logp.shape[-1]), dim=-1).indices
    return ce + topk_weight * -(p.gather(-1, top) * lp.gather(-1, top)).sum(-1).mean(), ce


def inference_copy(head: EagleDraft, target: Transformer) -> EagleDraft:
    """A frozen copy in the target's dtype sharing the target's embedding (for evaluation with the loop)."""
    out = EagleDraft(head.config, target.tok_embeddings)
    out.load_state_dict(head.state_dict())
    return out.to(target.device, target.dtype).eval().requires_grad_(False)


def row_of(rows: Tensor, n: int) -> Tensor:
    """[n]: the position of each flat index in `rows` (1-D, distinct; entries of other indices are unset)."""
    return torch.empty(n, dtype=torch.long, device=rows.device).index_copy_(
        0, rows, torch.arange(len(rows), device=rows.device))


def ttt_attention(q: Tensor, ks: list[Tensor], vs: list[Tensor]) -> Tensor:
    """q [B, T, Hq, D]; ks / vs: per unroll step [B, T, Hkv, D]. Query i sees step-0 keys <= i and the keys of
    steps 1.. at its own index i. -> [B, T, Hq·D]."""
    B, T, Hq, D = q.shape
    Hkv = ks[0].shape[2]
    G = Hq // Hkv
    qg = q.reshape(B, T, Hkv, G, D).permute(0, 2, 3, 1, 4)  # [B, Hkv, G, T, D]
    k0, v0 = ks[0].permute(0, 2, 1, 3)[:, :, None], vs[0].permute(0, 2, 1, 3)[:, :, None]  # [B, Hkv, 1, T, D]
    scale = D ** -0.5
    s0 = (qg @ k0.transpose(-1, -2)) * scale  # [B, Hkv, G, T, T]
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    s0 = s0.masked_fill(~causal, float("-inf"))
    kd = [k.permute(0, 2, 1, 3)[:, :, None] for k in ks[1:]]  # [B, Hkv, 1, T, D]
    vd = [v.permute(0, 2, 1, 3)[:, :, None] for v in vs[1:]]
    s = torch.cat([s0] + [((qg * k).sum(-1) * scale)[..., None] for k in kd], dim=-1)
    p = torch.softmax(s.float(), dim=-1).to(q.dtype)
    out = p[..., :T] @ v0
    for j, v in enumerate(vd):
        out = out + p[..., T + j, None] * v
    return out.permute(0, 3, 1, 2, 4).reshape(B, T, Hq * D)


class Eagle3Method:
    name = "eagle3"

    def __init__(self, target: Transformer, tokenizer, items: list[Tokenized], *, draft_vocab_size: int | None = None,
                 ttt_steps: int = 4, step_weight: float = 0.8, aux_layers: list[int] | None = None,
                 eval_prompts: list | None = None, eval_k: int = 3, eval_max_new_tokens: int = 48,
                 init_from: str | None = None, fc_norm: bool = False, topk: int = 0,
                 topk_weight: float = 1.0) -> None:
        if ttt_steps < 1:
            raise UserError(f"train.method.ttt_steps={ttt_steps}: must be >= 1")
        if topk < 0 or topk_weight < 0 or (topk == 0 and topk_weight != 1.0):
            raise UserError(f"train.method.topk={topk}, topk_weight={topk_weight}: both must be >= 0, and the "
                            "weight applies only with topk > 0 (topk 0 = plain soft-label CE; HASS uses topk=10, "
                            "topk_weight=1)")
        self.topk, self.topk_weight = int(topk), float(topk_weight)
        self.target, self.tokenizer = target, tokenizer
        N = target.config.num_layers
        self.aux_layers = list(aux_layers) if aux_layers else default_aux_layers(N)
        if len(self.aux_layers) != 3 or not all(0 <= i <= N for i in self.aux_layers):
            raise UserError(f"train.method.aux_layers={self.aux_layers}: need 3 capture-before ids in 0..{N}")
        eos = tuple(target.config.eos_token_id)
        start = _read_start(init_from) if init_from else None
        if start is not None:  # continue from earlier weights: keep their draft vocabulary
            ids = torch.arange(start["d2t"].shape[0]) + start["d2t"].long()
            if draft_vocab_size is not None and draft_vocab_size != len(ids):
                raise UserError(f"train.method.draft_vocab_size={draft_vocab_size} but train.method.init_from="
                                f"{init_from} has a {len(ids)}-token draft vocabulary; valid: null or {len(ids)} "
                                "(a continuation keeps its vocabulary)")
            has_norm = any(k.startswith("fc_norm.") for k in start)
            if fc_norm and not has_norm:
                raise UserError(f"train.method.fc_norm=true but train.method.init_from={init_from} has no fc_norm "
                                "(an EAGLE-3 head without EAGLE-3.1's norms); valid: fc_norm=false, or start anew")
            fc_norm = has_norm  # a head with the norms continues with them
        else:
            ids = draft_vocabulary(items, target.config.vocab_size, draft_vocab_size or DRAFT_VOCAB, eos)
        self.head = new_head(target, ids, self.aux_layers, fc_norm)  # on the CPU until moved below
        if start is not None:
            try:
                self.head.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in start.items()})
            except RuntimeError as e:
                raise UserError(f"train.method.init_from={init_from}: does not fit this target "
                                f"({str(e).splitlines()[-1].strip()[:160]})") from None
        self.head.to(target.device).train()
        self.ttt_steps, self.step_weight = ttt_steps, step_weight
        self.eval_prompts, self.eval_k, self.eval_max_new = eval_prompts or [], eval_k, eval_max_new_tokens
        self.states = None  # a TargetStates cache; None = target forward on the fly
        self.target_head = target.output.weight[ids].float()  # [Vd, H] for the target's restricted logits

    def parameters(self):
        return self.head.parameters()

    def _target_states(self, ids: Tensor, index: list[int] | None) -> tuple[Tensor, Tensor]:
        if self.states is not None:
            aux, normed = self.states.get(index, ids.shape[1])
            return aux.to(ids.device), normed.to(ids.device)
        with torch.no_grad():
            o = self.target(ids, None, hidden_layers=tuple(self.aux_layers), return_normed=True,
                            logit_index=torch.zeros(ids.shape[0], 1, dtype=torch.long, device=ids.device))
        return torch.cat(o.hidden, -1).float(), o.normed.float()

    def unroll(self, ids: Tensor, aux: Tensor):
        """The training-time test: yields (j, o_j [B, T, H]) for j < ttt_steps; o_j at index i is the head's
        output for the depth-(j+1) draft of a proposal whose last real pair is i (see the module docstring)."""
        B, T = ids.shape
        for j, _, o in self.unroll_rows(ids, aux):
            yield j, o.view(B, T, -1)

    def unroll_rows(self, ids: Tensor, aux: Tensor, need: Tensor | None = None):
        """`unroll` over the indices that matter: yields (j, rows [N_j], o_j [N_j, H]), rows being flat indices
        b·T + i into the batch. `need` [ttt_steps, B, T] bool (None: every index) marks the indices whose step-j
        output is used, by step j's loss or a later step's (so need[j+1] implies need[j]). The others (prompt
        and padding, mostly) are skipped at every step, except that step 0's keys and values cover every index:
        later indices attend to them. Exact: index i's output at step j depends only on the step-0 keys of
        indices <= i and on its own chain (ttt_attention)."""
        head, layer = self.head, self.head.midlayer
        attn = layer.self_attn
        B, T = ids.shape
        n, D = B * T, attn.head_dim
        head.ensure_rope(T + self.ttt_steps + 1)
        dt = head.fc.weight.dtype
        every = torch.arange(n, device=ids.device)

        def full(t: Tensor, rows: Tensor) -> Tensor:  # [N, ...] at rows -> [B, T, ...], zeros elsewhere
            if rows is not every:
                t = t.new_zeros(n, *t.shape[1:]).index_copy(0, rows, t)
            return t.view(B, T, *t.shape[1:])

        h = head.project(aux.to(dt)).reshape(n, -1)  # step 0's hidden input, every index
        at = every  # h's row of each flat index it holds
        ks, vs = [], []
        for j in range(self.ttt_steps):
            s = 1 + j
            rows = every if need is None else need[j].reshape(-1).nonzero().squeeze(1)
            tok = F.pad(ids[:, s:], (0, s)).reshape(n)  # token x_{i+1+j} at index i
            if j == 0:  # keys and values at every index, the rest at rows
                x, residual = layer.attn_input(head.embed(tok).to(dt), h)
                cos, sin = head.rotary.at((every % T)[None])
                rope = [c.view(B, T, 1, D) for c in (cos, sin)]
                ks.append(apply_rope(attn.k_proj(x).view(B, T, attn.n_kv, D), *rope))
                vs.append(attn.v_proj(x).view(B, T, attn.n_kv, D))
                if rows is not every:
                    x, residual, cos, sin = x[rows], residual[rows], cos[:, rows], sin[:, rows]
            else:
                x, residual = layer.attn_input(head.embed(tok[rows]).to(dt), h if rows is at else h[at[rows]])
                cos, sin = head.rotary.at((rows % T + j)[None])
                ks.append(full(apply_rope(attn.k_proj(x).view(1, -1, attn.n_kv, D), cos, sin)[0], rows))
                vs.append(full(attn.v_proj(x).view(-1, attn.n_kv, D), rows))
            q = full(apply_rope(attn.q_proj(x).view(1, -1, attn.n_heads, D), cos, sin)[0], rows)
            out = ttt_attention(q, ks, vs).reshape(n, -1)
            h = layer.finish(residual, attn.o_proj(out if rows is every else out[rows]))
            at = rows if rows is every else row_of(rows, n)
            yield j, rows, h

    @torch.no_grad()
    def trained_indices(self, ids: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        """-> (valid, need), both [ttt_steps, B, T] bool. valid[j]: the indices step j trains, on the target's
        next-token distribution at position i+1+j, where that next token is a response token in the draft
        vocabulary. need[j]: the indices whose step-j output is used, at step j or a later step."""
        in_vocab = self.head.t2d[ids].float()  # [B, T]
        valid = torch.stack([F.pad(mask[:, s:], (0, s)) * F.pad(in_vocab[:, s + 1:], (0, s + 1))
                             for s in range(1, self.ttt_steps + 1)]).bool()
        return valid, valid.flip(0).cumsum(0).flip(0) > 0

    def loss(self, ids: Tensor, mask: Tensor, index: list[int] | None = None) -> tuple[Tensor, dict[str, float]]:
        head = self.head
        aux, normed = self._target_states(ids, index)
        B, T = ids.shape
        n = B * T
        with torch.no_grad():
            valid, need = self.trained_indices(ids, mask)
            tpos = mask.reshape(-1).nonzero().squeeze(1)  # the positions any target is read at
            t_logp = F.log_softmax(normed.reshape(n, -1)[tpos] @ self.target_head.T, dim=-1)  # [P, Vd]
            t_row = row_of(tpos, n)
        total = torch.zeros((), dtype=torch.float32, device=ids.device)
        stats: dict[str, float] = {}
        for j, rows, o in self.unroll_rows(ids, aux, need):
            keep = valid[j].reshape(-1)[rows]  # of the computed indices, those step j trains
            if not keep.any():
                continue
            lp = F.log_softmax(head.lm_head(head.norm(o[keep])).float(), dim=-1)
            tgt = t_logp[t_row[rows[keep] + 1 + j]]
            loss_j, ce = soft_label_loss(tgt, lp, self.topk, self.topk_weight)
            total = total + self.step_weight ** j * loss_j
            with torch.no_grad():  # kl = CE - the target's own entropy (what training can remove)
                stats[f"kl_{j}"] = float(ce + (tgt.exp() * tgt).sum(-1).mean())
                stats[f"acc_{j}"] = float((lp.argmax(-1) == tgt.argmax(-1)).float().mean())
        return total, stats

    @torch.no_grad()
    def greedy_drafts(self, ids: list[int]) -> list[list[int]]:
        """Teacher-forced over one finished sequence: for every pair index i, the head's greedy depth-1..ttt_steps
        drafts (target ids) of a chain proposal whose last real pair is i — what the decode loop would draft
        there (`evaluate.chain_walk` replays the loop's acceptance from them)."""
        x = torch.tensor([ids], device=self.target.device)
        aux, _ = self._target_states(x, None)
        head, out = self.head, []
        with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=self.target.dtype == torch.bfloat16):
            for _, o in self.unroll(x, aux):
                out.append(head.draft_ids[head.logits(o[0]).float().argmax(-1)])
        return torch.stack(out, 1).tolist()

    def state_dict(self) -> dict[str, Tensor]:
        return self.head.state_dict()

    def load_state_dict(self, sd: dict[str, Tensor]) -> None:
        self.head.load_state_dict(sd)

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Greedy acceptance of the current head as a chain drafter (depth eval_k), with the decode loop."""
        drafter = EagleDrafter(model=inference_copy(self.head, self.target))
        return loop_acceptance(self.target, self.tokenizer, self.eval_prompts, drafter, self.eval_k, self.eval_max_new)

    def export(self, out_dir: Path) -> None:
        """The public EAGLE-3 format, bf16: config.json + model.safetensors (see models/eagle.py)."""
        save_eagle(self.head, out_dir)
