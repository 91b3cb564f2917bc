"""Distil a small Llama-family draft model from the target: KL(target || draft) on the response tokens.

The student is initialised from a subset of the target's layers (embedding, the chosen layers, final norm,
head) or from scratch with the same width; it is exported in the standard HF format (config.json +
model.safetensors in bf16 + tokenizer), so `method=draft_model method.drafter.path=<dir>` and any HF loader
read it.

With `target_tables` the student uses the target's embedding and lm_head, frozen: they are neither trained nor
checkpointed, and the export is the compact form of `models/shared_draft.py` (layers and norm only) plus the
complete HF model in `<out>/full`. `draft_vocab_size` then restricts the head to the most frequent response
tokens (EAGLE-3's d2t): the student scores only those rows of the target's lm_head, and it learns the target's
distribution renormalised over them.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from specbench.drafters.draft_model import DraftModelDrafter
from specbench.errors import UserError
from specbench.models.loading import hf_state_dict
from specbench.models.shared_draft import FLAG, OWN_TABLES, compact_state_dict, restrict_head
from specbench.models.transformer import Transformer, rope_inv_freq
from specbench.train.evaluate import loop_acceptance


def student_from_target(target: Transformer, layers: list[int] | None, num_layers: int | None = None,
                        width: dict | None = None) -> Transformer:
    """A float32 copy of the target with only `layers` (init=target_layers), or `num_layers` random layers
    (init=scratch) of the target's shape with `width` overrides (hidden_size, intermediate_size, num_heads,
    num_kv_heads) — a narrower draft keeps the tokenizer but not the target's embedding size."""
    cfg = copy.deepcopy(target.config)
    if width:
        if layers is not None:
            raise UserError("train.method width overrides need init=scratch (target layers have the target's width)")
        for key, val in width.items():
            if val is not None:
                setattr(cfg, key, int(val))
        if cfg.hidden_size % cfg.num_heads or cfg.num_heads % cfg.num_kv_heads:
            raise UserError(f"train.method: hidden_size {cfg.hidden_size}, num_heads {cfg.num_heads}, num_kv_heads "
                            f"{cfg.num_kv_heads}: heads must divide hidden_size and kv heads must divide heads")
        cfg.head_dim = cfg.hidden_size // cfg.num_heads
    if layers is not None:
        bad = [i for i in layers if not 0 <= i < cfg.num_layers]
        if bad or not layers:
            raise UserError(f"train.method.layers={layers}: need ids in 0..{cfg.num_layers - 1}")
        cfg.num_layers = len(layers)
    else:
        cfg.num_layers = int(num_layers or 2)
    student = Transformer(cfg)
    if layers is not None:
        sd = target.state_dict()
        own = {}
        for k, v in sd.items():
            if k.startswith("layers."):
                i, rest = k.split(".", 2)[1:]
                if int(i) in layers:
                    own[f"layers.{layers.index(int(i))}.{rest}"] = v.float().clone()
            else:
                own[k] = v.float().clone()
        student.load_state_dict(own, strict=False)
    if cfg.tie_word_embeddings:
        student.output.weight = student.tok_embeddings.weight
    student.rotary.reset(rope_inv_freq(cfg))
    return student.float()


def read_start(path: str, target: Transformer) -> tuple[dict[str, Tensor], Tensor | None]:
    """Weights to continue from, in the trainer's names, float32, and the reduced head's target ids (or None):
    a training run's folder (its checkpoint) or an exported draft — compact (`models/shared_draft.py`, the
    target's tables put in and left out again) or a complete HF model (with its own tables)."""
    from safetensors.torch import load_file

    from specbench.models.loading import load_model
    from specbench.models.shared_draft import is_compact, load_compact

    p = Path(path).expanduser()
    cpu = torch.device("cpu")
    if (p / "checkpoint" / "model.safetensors").is_file():
        sd = {k: v.float() if v.is_floating_point() else v
              for k, v in load_file(str(p / "checkpoint" / "model.safetensors")).items()}
        return sd, sd.pop("vocab_ids", None)
    if not (p / "config.json").is_file():
        raise UserError(f"train.method.init_from={path}: no checkpoint/model.safetensors or config.json there; "
                        "valid: a training run's folder or an exported draft model")
    if is_compact(p):
        model, ids = load_compact(p, target, torch.float32, cpu)
        return {k: v for k, v in model.state_dict().items() if k not in OWN_TABLES}, ids
    return dict(load_model(str(p), torch.float32, cpu).model.state_dict()), None


def _num_layers(sd: dict[str, Tensor]) -> int:
    return len({k.split(".")[1] for k in sd if k.startswith("layers.")})


@torch.no_grad()
def greedy_chain_drafts(model: Transformer, vocab_ids: Tensor | None, ids: list[int], k: int) -> list[list[int]]:
    """Teacher-forced over one finished sequence: for every pair index i, the depth-1..k greedy drafts (target
    ids) an autoregressive draft model proposes after the real prefix ids[:i+2] (`evaluate.chain_walk`'s
    layout). One forward suffices: the depth-j draft only counts when drafts 1..j-1 matched the text, and then
    the draft's own prefix *is* the text, so it is the teacher-forced prediction at position i+1+j-1.
    Positions past the end repeat the last prediction (the walk never tests them)."""
    x = torch.tensor([ids], device=model.device)
    top = model(x, None).logits[0].float().argmax(-1)  # [T]: the draft's guess for token p+1 after ids[:p+1]
    if vocab_ids is not None:  # a reduced head scores draft-vocabulary rows
        top = vocab_ids.to(top.device)[top]
    top = top.tolist()
    last = len(top) - 1
    return [[top[min(i + 1 + j, last)] for j in range(k)] for i in range(len(ids))]


class DraftModelMethod:
    name = "draft_model"

    def __init__(self, target: Transformer, tokenizer, *, init: str = "target_layers", layers: list[int] | None = None,
                 num_layers: int | None = None, width: dict | None = None, eval_prompts: list | None = None,
                 eval_k: int = 4, eval_max_new_tokens: int = 48, embed_init: str = "random",
                 target_tables: bool = False, draft_vocab_size: int | None = None, items: list | None = None,
                 init_from: str | None = None) -> None:
        if init not in ("target_layers", "scratch"):
            raise UserError(f"train.method.init={init!r}; valid: target_layers, scratch")
        if embed_init not in ("random", "svd"):
            raise UserError(f"train.method.embed_init={embed_init!r}; valid: random, svd")
        self.target, self.tokenizer = target, tokenizer
        keep = (layers or [0, 1]) if init == "target_layers" else None
        self.student = student_from_target(target, keep, num_layers, width)  # the CPU until moved below
        if init == "scratch":
            torch.manual_seed(0)
            for n, p in self.student.named_parameters():
                if p.dim() == 2:
                    torch.nn.init.normal_(p, std=0.02)
            if embed_init == "svd":
                self._svd_embedding()
        elif embed_init != "random":
            raise UserError(f"train.method.embed_init={embed_init!r} needs init=scratch")
        self.student.to(target.device).train().requires_grad_(True)
        self.eval_prompts, self.eval_k, self.eval_max_new = eval_prompts or [], eval_k, eval_max_new_tokens
        self.target_tables, self.vocab_ids = bool(target_tables), None
        if draft_vocab_size is not None and not self.target_tables:
            raise UserError(f"train.method.draft_vocab_size={draft_vocab_size}: a reduced head is made of the "
                            "target's lm_head rows; it needs train.method.target_tables=true")
        start, start_ids = read_start(init_from, target) if init_from else (None, None)
        if start is not None:
            self._check_start(init_from, start, start_ids, draft_vocab_size)
        if self.target_tables:
            self._share_tables()
            if start_ids is not None:  # a continuation keeps its vocabulary
                self.vocab_ids = start_ids.to(target.device)
            elif draft_vocab_size is not None:
                from specbench.train.eagle3 import draft_vocabulary

                V = target.config.vocab_size
                self.vocab_ids = draft_vocabulary(items or [], V, int(draft_vocab_size),
                                                  tuple(target.config.eos_token_id))
                self.vocab_ids = self.vocab_ids.to(target.device)
        if start is not None:
            try:
                self.load_state_dict(start if start_ids is None else {**start, "vocab_ids": start_ids})
            except RuntimeError as e:  # same names, other shapes (another width)
                raise UserError(f"train.method.init_from={init_from}: does not fit this draft "
                                f"({str(e).splitlines()[-1].strip()[:160]})") from None
            self._grow_from(start)
        self.teacher = None  # a TeacherTopK to train from cached target top-k log-probs instead of on the fly
        self.states = None  # or a TargetStates cache (full-vocabulary KL from the cached final-normed states)

    def _check_start(self, init_from: str, start: dict[str, Tensor], ids: Tensor | None,
                     draft_vocab_size: int | None) -> None:
        """The start must fit this draft: at most its layers (fewer grow it), the same tables (own or the
        target's), the same vocabulary."""
        own = {k for k in self.student.state_dict() if k not in OWN_TABLES}
        n_start = _num_layers(start)
        if n_start > self.student.config.num_layers:
            raise UserError(f"train.method.init_from={init_from} has {n_start} layers but the draft being trained "
                            f"has {self.student.config.num_layers} (train.method.layers / num_layers); valid: "
                            f"{n_start} or more (the start's weights fill the first layers)")
        own = {k for k in own if not k.startswith("layers.") or int(k.split(".")[1]) < n_start}
        has_tables = "tok_embeddings.weight" in start
        if has_tables == self.target_tables:
            raise UserError(f"train.method.init_from={init_from} {'has its own' if has_tables else 'has no'} "
                            f"vocabulary tables but train.method.target_tables={str(self.target_tables).lower()}; "
                            f"valid: target_tables={str(not has_tables).lower()}")
        if ids is not None and draft_vocab_size is not None and draft_vocab_size != len(ids):
            raise UserError(f"train.method.draft_vocab_size={draft_vocab_size} but train.method.init_from="
                            f"{init_from} has a {len(ids)}-token draft vocabulary; valid: null or {len(ids)} "
                            "(a continuation keeps its vocabulary)")
        if ids is None and draft_vocab_size is not None:
            raise UserError(f"train.method.draft_vocab_size={draft_vocab_size} but train.method.init_from="
                            f"{init_from} has a full-vocabulary head; valid: null (a continuation keeps it)")
        missing = sorted(own - set(start))
        if missing:
            raise UserError(f"train.method.init_from={init_from}: does not fit this target (missing {missing[0]})")

    @torch.no_grad()
    def _grow_from(self, start: dict[str, Tensor]) -> None:
        """A start with fewer layers than this draft fills its first layers; each layer after them keeps the
        weights it was initialised with (a target layer, or random with init=scratch) but with its attention
        and MLP output projections zeroed, so it adds nothing to the residual stream and the grown draft
        computes exactly what the start did (LLaMA Pro's block expansion) until training moves them."""
        for block in self.student.layers[_num_layers(start):]:
            for lin in (block.attn.wo, block.mlp.w_down):
                lin.weight.zero_()
                if lin.bias is not None:
                    lin.bias.zero_()

    @property
    def head_rows(self) -> Tensor:
        """[Vd, H] the reduced head: the (frozen) target lm_head rows of the draft vocabulary."""
        return self.student.output.weight[self.vocab_ids]

    @torch.no_grad()
    def _share_tables(self) -> None:
        """The student's embedding and lm_head become the target's (fp32 copies, frozen, never saved)."""
        s, t = self.student, self.target
        if s.config.hidden_size != t.config.hidden_size:
            raise UserError(f"train.method.target_tables=true needs the target's width: hidden_size "
                            f"{s.config.hidden_size} != {t.config.hidden_size}")
        s.tok_embeddings.weight = torch.nn.Parameter(t.tok_embeddings.weight.float().clone(), requires_grad=False)
        s.config.tie_word_embeddings = t.config.tie_word_embeddings
        if t.config.tie_word_embeddings:
            s.output.weight = s.tok_embeddings.weight
        else:
            s.output.weight = torch.nn.Parameter(t.output.weight.float().clone(), requires_grad=False)

    @torch.no_grad()
    def _svd_embedding(self) -> None:
        """A narrow student's (tied) embedding starts as the target's projected on its top principal directions:
        E_r = E V_r, so logits h E_r^T approximate the target's for hidden states h V_r in that subspace."""
        r = self.student.config.hidden_size
        pairs = [(self.target.tok_embeddings.weight, self.student.tok_embeddings.weight)]
        if not self.student.config.tie_word_embeddings:  # an untied head gets its own projection
            pairs.append((self.target.output.weight, self.student.output.weight))
        for src, dst in pairs:
            E = src.float()
            if r > E.shape[1]:
                raise UserError(f"train.method.embed_init=svd: hidden_size {r} exceeds the target's {E.shape[1]}")
            _, _, vh = torch.linalg.svd(E, full_matrices=False)
            proj = E @ vh[:r].T  # [V, r]
            dst.copy_(proj)  # the target's scale: logits start at the target's temperature, not peaked

    def parameters(self):
        return self.student.parameters()

    def loss(self, ids: Tensor, mask: Tensor, index: list[int] | None = None) -> tuple[Tensor, dict[str, float]]:
        """Mean over trained positions of KL(p_target || p_draft): over the full vocabulary with the target
        computed on the fly or from cached final-normed states, or over the target's cached top-k tokens
        (renormalised) when `self.teacher` is set — with k = vocabulary size all three are the same number.

        Only the trained (response) positions go through the vocabulary-wide heads: on a 49k vocabulary the
        heads and softmaxes are most of a step."""
        B, T = ids.shape
        dummy = torch.zeros(B, 1, dtype=torch.long, device=ids.device)
        sel = mask.reshape(-1).nonzero().squeeze(1)  # [n] flat indices of trained positions
        h = self.student(ids, None, logit_index=dummy, return_normed=True).normed
        if self.vocab_ids is not None:  # a reduced head: the target's lm_head rows of the draft vocabulary
            s_logits = F.linear(h.reshape(B * T, -1)[sel], self.head_rows).float()  # [n, Vd]
        else:
            s_logits = self.student.output(h.reshape(B * T, -1)[sel]).float()  # [n, V]
        if self.teacher is not None:
            vals, tok = (x.to(ids.device) for x in self.teacher.get(index, T))  # [B, T, k]
            vals, tok = vals.reshape(B * T, -1)[sel], tok.reshape(B * T, -1)[sel]
            t_logp = vals - torch.logsumexp(vals, dim=-1, keepdim=True)  # renormalise over the top-k
            s_logp = F.log_softmax(s_logits, dim=-1)
            kl = (t_logp.exp() * (t_logp - s_logp.gather(-1, tok))).sum(-1)
            loss, t_top = kl.mean() if sel.numel() else s_logits.sum() * 0, tok[:, 0]
        else:
            with torch.no_grad():
                if self.states is not None:  # cached final-normed states: the target's logits are one matmul away
                    normed = self.states.get(index, T)[1].to(ids.device)
                else:
                    normed = self.target(ids, None, logit_index=dummy, return_normed=True).normed
                t_logits = self.target.output(normed.reshape(B * T, -1)[sel].to(self.target.dtype)).float()
                if self.vocab_ids is not None:  # the target renormalised over the draft vocabulary
                    t_logits = t_logits[:, self.vocab_ids]
                t_logp = F.log_softmax(t_logits, dim=-1)
                t_p = t_logp.exp()
                entropy = -(t_p * t_logp).sum(-1).mean() if sel.numel() else torch.zeros(())
            # KL = CE(p, q) - H(p); the fused soft-label cross entropy has the same gradient, cheaper
            loss = F.cross_entropy(s_logits, t_p) - entropy if sel.numel() else s_logits.sum() * 0
            t_top = t_logits.argmax(-1)
        with torch.no_grad():
            top1 = (t_top == s_logits.argmax(-1)).float().mean() if sel.numel() else torch.zeros(())
        return loss, {"top1_agreement": float(top1)}

    def state_dict(self) -> dict[str, Tensor]:
        tied = self.student.config.tie_word_embeddings
        skip = OWN_TABLES if self.target_tables else ("output.weight",) if tied else ()
        out = {k: v for k, v in self.student.state_dict().items() if k not in skip}
        if self.vocab_ids is not None:  # the reduced head's vocabulary travels with the checkpoint
            out["vocab_ids"] = self.vocab_ids
        return out

    def load_state_dict(self, sd: dict[str, Tensor]) -> None:
        sd = dict(sd)
        ids = sd.pop("vocab_ids", None)
        if (ids is None) != (self.vocab_ids is None):
            raise UserError("train.method.draft_vocab_size does not match the checkpoint being resumed "
                            f"({'a reduced' if ids is not None else 'a full-vocabulary'} head)")
        if ids is not None:
            self.vocab_ids = ids.to(self.vocab_ids.device)
        self.student.load_state_dict(sd, strict=False)
        if self.student.config.tie_word_embeddings:
            self.student.output.weight = self.student.tok_embeddings.weight

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Greedy acceptance of the current student as a drafter, measured with the decode loop."""
        if not self.eval_prompts:
            return {}
        was_training = self.student.training
        self.student.eval()
        draft = copy.deepcopy(self.student).to(self.target.dtype).requires_grad_(False)
        if self.vocab_ids is not None:  # as `models.shared_draft.load_compact` builds it
            restrict_head(draft, draft.output.weight, self.vocab_ids)
        out = loop_acceptance(self.target, self.tokenizer, self.eval_prompts,
                              DraftModelDrafter(model=draft, vocab_ids=self.vocab_ids), self.eval_k, self.eval_max_new)
        self.student.train(was_training)
        return out

    def export(self, out_dir: Path) -> None:
        """HF format, bf16: config.json, model.safetensors, tokenizer files. With target_tables: the compact
        form (no vocabulary tables or tokenizer, `d2t` for a reduced head) there and the complete HF model with
        the tokenizer in `out_dir/full`."""
        from safetensors.torch import save_file

        sd = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in hf_state_dict(self.student).items()}
        cfg = self.student.config.to_hf()
        cfg["torch_dtype"] = "bfloat16"
        folders = [(out_dir, sd, cfg)]
        if self.target_tables:
            compact = {**cfg, FLAG: True}
            if self.vocab_ids is not None:
                compact["draft_vocab_size"] = len(self.vocab_ids)
            folders = [(out_dir, compact_state_dict(sd, self.vocab_ids), compact), (out_dir / "full", sd, cfg)]
        for folder, weights, config in folders:
            folder.mkdir(parents=True, exist_ok=True)
            save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
            (folder / "config.json").write_text(json.dumps(config, indent=2))
            if FLAG not in config:  # the compact form uses the target's tokenizer too (3.5 MB less for SmolLM2)
                self.tokenizer.save_pretrained(str(folder))
