"""A draft model that shares the target's embedding and lm_head (same tokenizer), stored without them.

A Llama-family draft as wide as its target spends most of its bytes on the two vocabulary tables: for SmolLM2
(49,152 x 576) the embedding alone is 56 MB in bf16, while one decoder layer is 7 MB. When the draft was trained
with the target's tables frozen, its folder stores only what is its own (the compact form):

- `config.json`: the HF Llama config plus `"specbench_target_tables": true`, and `"draft_vocab_size": Vd` when
  the head is reduced;
- `model.safetensors`: `model.layers.*` and `model.norm.weight` only; with a reduced head also `d2t` [Vd] int64,
  EAGLE-3's mapping (draft index i is target token i + d2t[i]);
- no tokenizer: the target's is the draft's.

Loading puts the target's own tensors in place (shared, not copied) and, for a reduced head, takes the target's
lm_head rows of the draft vocabulary: the draft then scores Vd tokens per step instead of the whole vocabulary.
The trainer also writes the complete HF model (`<out>/model/full`: embedding and the full lm_head written in,
no vocabulary restriction) for loaders that know nothing of this form.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import Tensor

from specbench.errors import UserError
from specbench.models.config import ModelConfig
from specbench.models.cpu_kernels import Linear
from specbench.models.transformer import Transformer

FLAG = "specbench_target_tables"
OWN_TABLES = ("tok_embeddings.weight", "output.weight")  # native names of the tables the target provides


def is_compact(folder: Path) -> bool:
    cfg = folder / "config.json"
    try:
        return cfg.is_file() and bool(json.loads(cfg.read_text()).get(FLAG, False))
    except json.JSONDecodeError:
        return False  # the ordinary loader reports the bad JSON


def draft_ids(d2t: Tensor, vocab_size: int, source: str) -> Tensor:
    """d2t [Vd] offsets (EAGLE-3's: draft index i is target id i + d2t[i]) -> the target ids, which must be
    increasing and inside the target's vocabulary (EAGLE-3 heads and compact drafts share this check)."""
    ids = torch.arange(d2t.shape[0]) + d2t.long().cpu()
    if ids.numel() == 0 or int(ids.min()) < 0 or int(ids.max()) >= vocab_size or bool((ids.diff() <= 0).any()):
        raise UserError(f"{source}: d2t maps draft ids outside 0..{vocab_size - 1} or not increasing")
    return ids


def restrict_head(model: Transformer, head_weight: Tensor, ids: Tensor) -> Transformer:
    """Replace the model's lm_head by the rows `ids` of `head_weight` (a copy: Vd x H)."""
    H = head_weight.shape[1]
    out = Linear(H, len(ids), bias=False, device=head_weight.device, dtype=head_weight.dtype)
    with torch.no_grad():
        out.weight.copy_(head_weight[ids.to(head_weight.device)])
    model.output = out.requires_grad_(False)
    return model


def load_compact(folder: Path, target: Transformer, dtype: torch.dtype, device: torch.device,
                 attention: str = "auto") -> tuple[Transformer, Tensor | None]:
    """A compact draft folder with the target's tables put in place -> (model, draft vocabulary ids or None)."""
    from specbench.models.loading import build_model, read_weights

    raw = json.loads((folder / "config.json").read_text())
    cfg = ModelConfig.from_hf(raw, str(folder / "config.json"))
    t = target.config
    if cfg.vocab_size != t.vocab_size or cfg.hidden_size != t.hidden_size:
        raise UserError(f"draft model {folder}: {FLAG} needs the target's vocabulary and width; it has "
                        f"vocab_size {cfg.vocab_size}, hidden_size {cfg.hidden_size}, the target "
                        f"{t.vocab_size}, {t.hidden_size}")
    weights = read_weights(folder)
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        if name in weights:
            raise UserError(f"draft model {folder}: {FLAG} is set but the weights hold {name!r} "
                            f"(a compact draft stores no vocabulary tables)")
    d2t = weights.pop("d2t", None)
    cfg.tie_word_embeddings = t.tie_word_embeddings
    weights["model.embed_tokens.weight"] = target.tok_embeddings.weight
    if not t.tie_word_embeddings:
        weights["lm_head.weight"] = target.output.weight
    model = build_model(cfg, weights, dtype, device, str(folder), attention)
    if d2t is None:
        if raw.get("draft_vocab_size") not in (None, cfg.vocab_size):
            raise UserError(f"draft model {folder}: config says draft_vocab_size {raw['draft_vocab_size']} "
                            "but the weights hold no d2t")
        return model, None
    ids = draft_ids(d2t, cfg.vocab_size, str(folder))
    if raw.get("draft_vocab_size") not in (None, len(ids)):
        raise UserError(f"draft model {folder}: config says draft_vocab_size {raw['draft_vocab_size']} but d2t "
                        f"has {len(ids)} entries")
    return restrict_head(model, target.output.weight.to(dtype), ids), ids.to(device)


def compact_state_dict(hf_sd: dict[str, Tensor], ids: Tensor | None) -> dict[str, Tensor]:
    """An HF state dict of the whole draft -> what the compact folder stores."""
    out = {k: v for k, v in hf_sd.items() if k not in ("model.embed_tokens.weight", "lm_head.weight")}
    if ids is not None:
        out["d2t"] = (ids.cpu().long() - torch.arange(len(ids))).contiguous()
    return out
