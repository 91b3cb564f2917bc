"""Architecture hyper-parameters of a Llama-family model, read from an HF `config.json` dict."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specbench.errors import UserError

# model_type -> defaults that differ from Llama. Qwen2 puts a bias on q/k/v.
SUPPORTED_MODEL_TYPES: dict[str, dict[str, Any]] = {
    "llama": {},
    "mistral": {},
    "qwen2": {"attention_bias": True},
}


@dataclass
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # {"rope_type": "llama3"|"linear", ...} or None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # bias on q/k/v (Qwen2); o_proj never has one here
    mlp_bias: bool = False
    bos_token_id: int | None = None
    eos_token_id: list[int] = field(default_factory=list)
    model_type: str = "llama"

    @classmethod
    def from_hf(cls, cfg: dict[str, Any], source: str = "config.json") -> "ModelConfig":
        model_type = cfg.get("model_type", "llama")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise UserError(
                f"{source}: model_type {model_type!r} is not supported; "
                f"valid: {', '.join(sorted(SUPPORTED_MODEL_TYPES))}"
            )
        defaults = SUPPORTED_MODEL_TYPES[model_type]
        try:
            hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
            # transformers >= 5 nests rope settings under rope_parameters
            rope = dict(cfg.get("rope_parameters") or {})
            scaling = cfg.get("rope_scaling") or None
            if scaling is None and rope.get("rope_type", "default") != "default":
                scaling = rope
            theta = cfg.get("rope_theta", rope.get("rope_theta", 10000.0))
            eos = cfg.get("eos_token_id")
            eos = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
            out = cls(
                vocab_size=int(cfg["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(cfg["intermediate_size"]),
                num_layers=int(cfg["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
                head_dim=int(cfg.get("head_dim") or hidden // heads),
                rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-5)),
                rope_theta=float(theta),
                rope_scaling=dict(scaling) if scaling else None,
                max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                attention_bias=bool(cfg.get("attention_bias", defaults.get("attention_bias", False))),
                mlp_bias=bool(cfg.get("mlp_bias", False)),
                bos_token_id=cfg.get("bos_token_id"),
                eos_token_id=eos,
                model_type=model_type,
            )
        except KeyError as e:
            raise UserError(f"{source}: missing field {e.args[0]!r}") from None
        if out.rope_scaling is not None:
            kind = out.rope_scaling.get("rope_type", out.rope_scaling.get("type"))
            if kind not in ("llama3", "linear", "default"):
                raise UserError(f"{source}: rope_scaling type {kind!r} is not supported; valid: llama3, linear")
            if kind == "default":
                out.rope_scaling = None
        if out.num_heads % out.num_kv_heads:
            raise UserError(f"{source}: num_attention_heads {out.num_heads} is not a multiple of num_key_value_heads {out.num_kv_heads}")
        return out

    def to_hf(self) -> dict[str, Any]:
        """An HF LlamaConfig-compatible dict (used for the conversion cache and HF parity tests)."""
        d = {
            "architectures": ["Qwen2ForCausalLM" if self.model_type == "qwen2" else "LlamaForCausalLM"],
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.attention_bias,
            "mlp_bias": self.mlp_bias,
            "hidden_act": "silu",
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id[0] if len(self.eos_token_id) == 1 else self.eos_token_id,
        }
        return d
