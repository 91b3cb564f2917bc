"""EAGLE draft heads (EAGLE-1 and EAGLE-3): one module, the public checkpoint format, load and export.

An EAGLE head is one decoder layer that runs beside the target. Each draft position pairs a *hidden* vector
with the embedding of the token that follows it and predicts the token after that:

    EAGLE-3:  h = fc(low ‖ mid ‖ high target states)  (first step; later steps feed the draft's own output o)
              (EAGLE-3.1, `"fc_norm": true`: each of the three states goes through its own RMSNorm first,
              `fc_norm.{0,1,2}.weight`, as vLLM / SGLang / speculators apply it)
              o = layer(input_layernorm(embed(x)) ‖ hidden_norm(h), residual h)       [2H attention input]
              logits = lm_head(norm(o))  over a reduced draft vocabulary; target id = i + d2t[i]
    EAGLE-1:  o = layer(fc(embed(x) ‖ f))  (f: the target's final-normed last hidden state, or o)
              logits = target lm_head(o)   (no norm, no own head, full vocabulary)

Parameter names are the public ones (SafeAILab/EAGLE `cnets.py` / `cnets1.py`, as vLLM and SGLang load
them): `fc`, `midlayer.*` (EAGLE-3) or `layers.0.*` (EAGLE-1), `norm`, `lm_head`, `d2t`, `t2d`. The token
embedding is the target's unless the checkpoint carries `embed_tokens.weight`. The draft's RoPE comes from
its own config (base 10000 when the config has no `rope_theta`, as the reference), not from the target's.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import Tensor, nn

from specbench.errors import UserError
from specbench.log import log
from specbench.models.attention import AttnMeta, cached_attention
from specbench.models.cache import KVCache
from specbench.models.config import ModelConfig
from specbench.models.cpu_kernels import Linear
from specbench.models.shared_draft import draft_ids
from specbench.models.transformer import RMSNorm, Rotary, apply_rope, rope_inv_freq, swiglu


@dataclass
class EagleConfig:
    version: int  # 3 (fused low/mid/high target states, own head over a draft vocabulary) or 1
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int  # the target's vocabulary
    draft_vocab_size: int  # = vocab_size for EAGLE-1 and for EAGLE-3 heads without d2t
    target_hidden_size: int  # width of each captured target state (fc input = 3x this for EAGLE-3)
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 2048
    aux_layers: list[int] | None = None  # eagle_aux_hidden_state_layer_ids as written in the config
    norm_before_residual: bool = False  # speculators-format flag: the residual is the normed hidden
    fc_bias: bool = False  # EAGLE-1: fc carries a bias (decided by the checkpoint's keys)
    fc_norm: bool = False  # EAGLE-3.1: an RMSNorm per captured state before fc (`fc_norm` in config.json)
    extra: dict = field(default_factory=dict)  # other config fields, kept for export

    @property
    def layer_config(self) -> ModelConfig:
        """The decoder layer's shape and RoPE as a ModelConfig (for rope_inv_freq)."""
        return ModelConfig(vocab_size=self.vocab_size, hidden_size=self.hidden_size,
                           intermediate_size=self.intermediate_size, num_layers=1, num_heads=self.num_heads,
                           num_kv_heads=self.num_kv_heads, head_dim=self.head_dim, rms_norm_eps=self.rms_norm_eps,
                           rope_theta=self.rope_theta, rope_scaling=self.rope_scaling,
                           max_position_embeddings=self.max_position_embeddings)

    @classmethod
    def from_hf(cls, raw: dict, keys: set[str], source: str) -> "EagleConfig":
        """Read any of the published config shapes: the EAGLE reference / SpecForge `LlamaForCausalLM(Eagle3)`
        config, the speculators format (`transformer_layer_config` + top-level draft fields), or an EAGLE-1
        Llama config. The version is decided by the weights (`midlayer.*` vs `layers.0.*`), not the file name."""
        layer = dict(raw.get("transformer_layer_config") or raw)  # speculators nests the Llama fields
        eagle_cfg = raw.get("eagle_config") or {}
        if any(k.startswith("midlayer.") for k in keys):
            version = 3
        elif any(k.startswith("layers.0.") for k in keys):
            version = 1
        else:
            raise UserError(f"{source}: not an EAGLE head (no 'midlayer.*' (EAGLE-3) or 'layers.0.*' (EAGLE-1) tensors)")
        try:
            hidden, heads = int(layer["hidden_size"]), int(layer["num_attention_heads"])
            vocab = int(layer.get("vocab_size", raw.get("vocab_size")))
            base = ModelConfig.from_hf({**layer, "num_hidden_layers": 1, "vocab_size": vocab,
                                        "model_type": "llama"}, source)
        except (KeyError, TypeError) as e:
            raise UserError(f"{source}: missing field {e.args[0] if e.args else 'vocab_size'!r}") from None
        aux = raw.get("eagle_aux_hidden_state_layer_ids", eagle_cfg.get("eagle_aux_hidden_state_layer_ids"))
        known = {"transformer_layer_config", "eagle_config", "eagle_aux_hidden_state_layer_ids", "draft_vocab_size",
                 "target_hidden_size", "norm_before_residual", "fc_norm"}
        return cls(
            version=version, hidden_size=hidden, intermediate_size=base.intermediate_size, num_heads=heads,
            num_kv_heads=base.num_kv_heads, head_dim=int(layer.get("head_dim") or hidden // heads), vocab_size=vocab,
            draft_vocab_size=int(raw.get("draft_vocab_size") or layer.get("draft_vocab_size") or vocab),
            target_hidden_size=int(raw.get("target_hidden_size") or layer.get("target_hidden_size") or hidden),
            rms_norm_eps=base.rms_norm_eps,
            # the reference EAGLE-3 config has no rope_theta: its RoPE then uses base 10000 (not the target's)
            rope_theta=base.rope_theta, rope_scaling=base.rope_scaling,
            max_position_embeddings=base.max_position_embeddings,
            aux_layers=[int(i) for i in aux] if aux else None,
            norm_before_residual=bool(raw.get("norm_before_residual", False)),
            fc_bias="fc.bias" in keys,
            fc_norm=version == 3 and (bool(raw.get("fc_norm", False)) or any(k.startswith("fc_norm.") for k in keys)),
            extra={k: v for k, v in raw.items() if k not in known},
        )

    def to_hf(self, dtype: str = "bfloat16") -> dict:
        """The config.json written on export: loads in vLLM (`Eagle3LlamaForCausalLM`) and SGLang
        (`LlamaForCausalLMEagle3`) unchanged; aux layer ids are capture-before ids starting at 2, which both
        read as they are."""
        d = {
            "architectures": ["LlamaForCausalLMEagle3" if self.version == 3 else "LlamaForCausalLM"],
            "model_type": "llama", "hidden_size": self.hidden_size, "intermediate_size": self.intermediate_size,
            "num_attention_heads": self.num_heads, "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim, "num_hidden_layers": 1, "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps, "rope_theta": self.rope_theta, "rope_scaling": self.rope_scaling,
            "max_position_embeddings": self.max_position_embeddings, "vocab_size": self.vocab_size,
            "tie_word_embeddings": False, "torch_dtype": dtype,
        }
        if self.version == 3:
            d.update(draft_vocab_size=self.draft_vocab_size, target_hidden_size=self.target_hidden_size)
            if self.fc_norm:
                d["fc_norm"] = True
            if self.aux_layers is not None:
                d["eagle_aux_hidden_state_layer_ids"] = list(self.aux_layers)
                d["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(self.aux_layers),
                                     "use_aux_hidden_state": True}
        else:
            d["bias"] = self.fc_bias
        for k in ("bos_token_id", "eos_token_id", "pad_token_id"):
            if k in self.extra:
                d[k] = self.extra[k]
        return d


class EagleAttention(nn.Module):
    def __init__(self, cfg: EagleConfig, in_dim: int) -> None:
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_proj = Linear(in_dim, cfg.num_heads * cfg.head_dim, bias=False)
        self.k_proj = Linear(in_dim, cfg.num_kv_heads * cfg.head_dim, bias=False)
        self.v_proj = Linear(in_dim, cfg.num_kv_heads * cfg.head_dim, bias=False)
        self.o_proj = Linear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias=False)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, cache: KVCache, slots: tuple[Tensor, Tensor],
                meta: AttnMeta) -> Tensor:
        B, T, _ = x.shape
        q = apply_rope(self.q_proj(x).view(B, T, self.n_heads, self.head_dim), cos, sin)
        k = apply_rope(self.k_proj(x).view(B, T, self.n_kv, self.head_dim), cos, sin)
        v = self.v_proj(x).view(B, T, self.n_kv, self.head_dim)
        return self.o_proj(cached_attention(q, k, v, cache, 0, slots, meta))


class EagleMLP(nn.Module):
    def __init__(self, cfg: EagleConfig) -> None:
        super().__init__()
        self.gate_proj = Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(swiglu(self.gate_proj(x), self.up_proj(x)))


class EagleLayer(nn.Module):
    """EAGLE-3's `midlayer` (2H attention input: normed embedding ‖ normed hidden) or EAGLE-1's `layers.0`
    (H input, no input norm)."""

    def __init__(self, cfg: EagleConfig) -> None:
        super().__init__()
        H = cfg.hidden_size
        self.v3 = cfg.version == 3
        if self.v3:
            self.input_layernorm = RMSNorm(H, cfg.rms_norm_eps)
            self.hidden_norm = RMSNorm(H, cfg.rms_norm_eps)
        self.self_attn = EagleAttention(cfg, 2 * H if self.v3 else H)
        self.post_attention_layernorm = RMSNorm(H, cfg.rms_norm_eps)
        self.mlp = EagleMLP(cfg)
        self.norm_before_residual = cfg.norm_before_residual

    def attn_input(self, emb: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
        """-> (attention input [.., 2H or H], residual [.., H]); shared by inference and training."""
        if not self.v3:
            return h, h
        hn = self.hidden_norm(h)
        return torch.cat([self.input_layernorm(emb), hn], dim=-1), (hn if self.norm_before_residual else h)

    def finish(self, residual: Tensor, attn_out: Tensor) -> Tensor:
        h = residual + attn_out
        return h + self.mlp(self.post_attention_layernorm(h))

    def forward(self, emb: Tensor, h: Tensor, cos: Tensor, sin: Tensor, cache: KVCache,
                slots: tuple[Tensor, Tensor], meta: AttnMeta) -> Tensor:
        x, residual = self.attn_input(emb, h)
        return self.finish(residual, self.self_attn(x, cos, sin, cache, slots, meta))


class EagleDraft(nn.Module):
    """The draft head. `step` runs T positions against its own one-layer KV cache and returns the pre-norm
    output o [B, T, H] (fed back as the next step's hidden); `logits` maps o to draft-vocabulary logits."""

    def __init__(self, cfg: EagleConfig, embed: nn.Embedding, target_head: nn.Linear | None = None) -> None:
        super().__init__()
        self.config = cfg
        H, Ht = cfg.hidden_size, cfg.target_hidden_size
        if cfg.version == 3:
            self.fc = Linear(3 * Ht, H, bias=False)
            if cfg.fc_norm:
                self.fc_norm = nn.ModuleList([RMSNorm(Ht, cfg.rms_norm_eps) for _ in range(3)])
            self.midlayer = EagleLayer(cfg)
            self.norm = RMSNorm(H, cfg.rms_norm_eps)
            self.lm_head = Linear(H, cfg.draft_vocab_size, bias=False)
            self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))  # offsets
            self.register_buffer("t2d", torch.ones(cfg.vocab_size, dtype=torch.bool))
        else:
            self.fc = Linear(2 * Ht, H, bias=cfg.fc_bias)
            self.layers = nn.ModuleList([EagleLayer(cfg)])
        self.embed = embed  # the target's (or the checkpoint's own) token embedding; not a parameter here
        self.target_head = target_head  # EAGLE-1: logits come from the target's lm_head
        self.rotary = Rotary(rope_inv_freq(cfg.layer_config))

    # the embedding / target head belong to the target: keep them out of state_dict and parameters()
    def __setattr__(self, name, value):
        if name in ("embed", "target_head"):
            object.__setattr__(self, name, value)
        else:
            super().__setattr__(name, value)

    @property
    def layer(self) -> EagleLayer:
        return self.midlayer if self.config.version == 3 else self.layers[0]

    @property
    def draft_ids(self) -> Tensor:
        """[Vd] target token id of each draft-vocabulary entry (i + d2t[i])."""
        if self.config.version == 1:
            return torch.arange(self.config.vocab_size, device=self.fc.weight.device)
        return torch.arange(self.d2t.shape[0], device=self.d2t.device) + self.d2t

    def ensure_rope(self, n: int) -> None:
        """Grow the RoPE tables to cover positions < n; a host int, no sync."""
        self.rotary.ensure(n, self.fc.weight.dtype)

    def step(self, tokens: Tensor, hidden: Tensor, positions: Tensor, cache: KVCache, slots: tuple[Tensor, Tensor],
             meta: AttnMeta, from_target: bool) -> Tensor:
        """tokens [B, T], hidden [B, T, 3Ht] target states (from_target) or [B, T, H] draft outputs -> o [B, T, H].

        Pair t feeds hidden t (which saw tokens up to position p) with the token at p+1; o predicts p+2."""
        emb, h = self.inputs(tokens, hidden, from_target)
        cos, sin = self.rotary.at(positions)  # [B, T, 1, D]; tables sized by ensure_rope
        return self.layer(emb, h, cos, sin, cache, slots, meta)

    def inputs(self, tokens: Tensor, hidden: Tensor, from_target: bool) -> tuple[Tensor, Tensor]:
        """-> (token embedding, the layer's hidden input h), both [B, T, H]."""
        emb = self.embed(tokens).to(self.fc.weight.dtype)
        if self.config.version == 3:
            return emb, (self.project(hidden) if from_target else hidden)
        return emb, self.fc(torch.cat([emb, hidden], dim=-1))

    def project(self, states: Tensor) -> Tensor:
        """EAGLE-3: the target's low ‖ mid ‖ high states [..., 3Ht] -> the layer's hidden input [..., H]."""
        if self.config.fc_norm:
            states = torch.cat([n(c) for n, c in zip(self.fc_norm, states.chunk(3, dim=-1))], dim=-1)
        return self.fc(states)

    def logits(self, o: Tensor) -> Tensor:
        """o [..., H] -> draft-vocabulary logits [..., Vd] (the full vocabulary for EAGLE-1)."""
        if self.config.version == 3:
            return self.lm_head(self.norm(o))
        return self.target_head(o)


# ----------------------------------------------------------------------------------------- checkpoints
def _read_head(folder: Path) -> tuple[dict, dict[str, Tensor]]:
    from specbench.models.loading import read_weights

    if not folder.is_dir():
        raise UserError(f"EAGLE head {str(folder)!r} does not exist (give a folder with config.json and weights)")
    cfg_path = folder / "config.json"
    if not cfg_path.is_file():
        raise UserError(f"EAGLE head {folder}: no config.json")
    try:
        raw = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as e:
        raise UserError(f"{cfg_path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    return raw, read_weights(folder)


def default_aux_layers(num_layers: int) -> list[int]:
    """EAGLE-3's default capture-before layers (2, N//2, N-3): the reference, vLLM and SGLang agree."""
    return [2, num_layers // 2, num_layers - 3]


def resolve_aux_layers(cfg: EagleConfig, num_layers: int, override: list[int] | None = None,
                       convention: str = "auto") -> dict:
    """Which target states feed the head, as capture-before-layer ids, and where that choice came from.

    convention: `capture_before` (ids are the residual stream entering layer i; vLLM's reading), `layer_output`
    (ids name the layer whose output is taken, SpecForge's; +1), or `auto`: capture-before, except a list
    starting at 1 is read as layer outputs (SGLang's rule since sglang#25454). A missing list falls back to
    the default with a loud warning: the wrong layers drop acceptance to ~1 without any error.
    """
    if convention not in ("auto", "capture_before", "layer_output"):
        raise UserError(f"method.drafter.aux_convention={convention!r}; valid: auto, capture_before, layer_output")
    if cfg.version == 1:
        return {"layers": [num_layers], "source": "eagle1", "convention": "final_normed"}
    ids, source = (list(override), "override") if override else (cfg.aux_layers, "checkpoint")
    if ids is None:
        ids = default_aux_layers(num_layers)
        log(f"WARNING: the EAGLE-3 head's config has no eagle_aux_hidden_state_layer_ids; using the default "
            f"capture-before layers {ids} for a {num_layers}-layer target. If the head was trained on other "
            "layers acceptance will be ~1.0: set method.drafter.aux_layers=[...]")
        return {"layers": ids, "source": "default", "convention": "capture_before"}
    used = convention
    if convention == "auto":
        used = "layer_output" if ids[0] == 1 else "capture_before"
    layers = [i + 1 for i in ids] if used == "layer_output" else list(ids)
    if len(layers) != 3 or not all(0 <= i <= num_layers for i in layers):
        raise UserError(f"EAGLE-3 aux layers {ids} ({used}) -> capture-before {layers}: need 3 ids in "
                        f"0..{num_layers} for this {num_layers}-layer target")
    return {"layers": layers, "source": source, "convention": used, "as_written": list(ids)}


def load_eagle(path: str | Path, target) -> EagleDraft:
    """Load an EAGLE-1/3 head for `target` (a Transformer) from a folder in the public format; one-line errors
    on anything that does not fit the target (hidden size, vocabulary, missing or unknown tensors)."""
    folder = Path(path).expanduser()
    raw, sd = _read_head(folder)
    cfg = EagleConfig.from_hf(raw, set(sd), str(folder / "config.json"))
    t = target.config
    src = str(folder)
    if cfg.vocab_size != t.vocab_size:
        raise UserError(f"EAGLE head {src}: vocab_size {cfg.vocab_size} != the target's {t.vocab_size}")
    fc = sd.get("fc.weight")
    if fc is None:
        raise UserError(f"EAGLE head {src}: missing tensor 'fc.weight'")
    n_in = 3 if cfg.version == 3 else 2
    if fc.shape[1] != n_in * t.hidden_size:
        raise UserError(f"EAGLE head {src}: fc.weight takes {fc.shape[1]} inputs, the target's hidden size "
                        f"{t.hidden_size} needs {n_in} x {t.hidden_size} = {n_in * t.hidden_size} (EAGLE-{cfg.version})")
    cfg.target_hidden_size = t.hidden_size
    cfg.max_position_embeddings = max(cfg.max_position_embeddings, t.max_position_embeddings)  # as vLLM does
    embed_w = sd.pop("embed_tokens.weight", None)
    if cfg.version == 1 and embed_w is not None:
        embed_w = None  # EAGLE-1 files carry a copy of the target's embedding; use the target's (as vLLM does)
    if cfg.version == 3 and "d2t" not in sd:
        if cfg.draft_vocab_size != cfg.vocab_size:
            raise UserError(f"EAGLE head {src}: draft_vocab_size {cfg.draft_vocab_size} < vocab_size but no 'd2t' tensor")
        sd["d2t"] = torch.zeros(cfg.draft_vocab_size, dtype=torch.long)  # identity mapping
    if cfg.version == 3 and "t2d" not in sd:
        sd["t2d"] = torch.zeros(cfg.vocab_size, dtype=torch.bool).index_fill_(
            0, torch.arange(cfg.draft_vocab_size) + sd["d2t"].long(), True)
    dev, dtype = target.device, target.dtype
    embed = target.tok_embeddings
    if embed_w is not None:
        if tuple(embed_w.shape) != (t.vocab_size, cfg.hidden_size):
            raise UserError(f"EAGLE head {src}: embed_tokens.weight has shape {tuple(embed_w.shape)}, "
                            f"expected ({t.vocab_size}, {cfg.hidden_size})")
        embed = nn.Embedding.from_pretrained(embed_w.to(dev, dtype), freeze=True)
    elif cfg.hidden_size != t.hidden_size:
        raise UserError(f"EAGLE head {src}: hidden_size {cfg.hidden_size} != the target's {t.hidden_size} and the "
                        "head has no embed_tokens.weight of its own")
    with torch.device("meta"):
        model = EagleDraft(cfg, embed, target.output if cfg.version == 1 else None)
    from specbench.models.loading import check_tensors

    # an unknown tensor (e.g. norm_before_fc heads' input_norm) is refused rather than silently dropped
    check_tensors(sd, model.state_dict(), f"EAGLE head {src}", f" (not part of the EAGLE-{cfg.version} format)")
    if cfg.version == 3:
        sd["d2t"] = sd["d2t"].long()
        draft_ids(sd["d2t"], cfg.vocab_size, f"EAGLE head {src}")
    typed = {k: (v.to(dev) if k in ("d2t", "t2d") else v.to(dev, dtype)) for k, v in sd.items()}
    model.load_state_dict(typed, strict=True, assign=True)
    model.rotary.reset(rope_inv_freq(cfg.layer_config).to(dev))
    model.source = src
    return model.eval().requires_grad_(False)


def save_eagle(model: EagleDraft, folder: str | Path, dtype: torch.dtype = torch.bfloat16,
               extra_files: dict[str, str] | None = None) -> Path:
    """Export in the public format: config.json + model.safetensors (`fc`, `midlayer.*`, `norm`, `lm_head`,
    `d2t` int64 offsets, `t2d` bool; no embedding) — what vLLM / SGLang load for an EAGLE-3 head."""
    from safetensors.torch import save_file

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    sd = {k: (v if k in ("d2t", "t2d") else v.to(dtype)).detach().contiguous().cpu()
          for k, v in model.state_dict().items()}
    save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
    name = str(dtype).removeprefix("torch.")
    (out / "config.json").write_text(json.dumps(model.config.to_hf(name), indent=2) + "\n")
    for fname, text in (extra_files or {}).items():
        (out / fname).write_text(text)
    return out


def config_dict(cfg: EagleConfig) -> dict:
    return {k: v for k, v in asdict(cfg).items() if k != "extra"}
