"""IBM's MLP speculator (fms-extras `MLPSpeculator`) and its HF checkpoint layout, in and out.

The state starts as the target's final-normed hidden state s at the last accepted position (with
`scale_input`: a parameter-free RMS norm, / sqrt(2)); stage i embeds the token x chosen before it (stage 0:
the newest token, the one the target produced from s):

    s = proj_i(s) + (w_e / w_s) * emb_i(x);  s = GELU(LN_i(s));  logits_i = head_i(s)   (predicts t+2+i)

w_s = 0.5 ** (0.5 / n_predict), w_e = sqrt((1 - w_s^2) * inner_dim / 2); LN_i is RMS-style with weight and
bias, eps 1e-6. `tie_weights` shares every emb / head / ln with stage 0's and proj[2..] with proj[1].
Layout (facts: ../shared/reference/checkpoint-formats.md, section 4): `config.json` (`model_type
mlp_speculator`, `emb_dim`, `inner_dim` (0 = emb_dim), `n_predict`, `top_k_tokens_per_head`, `n_candidates`,
`tie_weights`, `scale_input`, `vocab_size`) and tensors `emb.i.weight`, `proj.i.weight`, `head.i.weight`,
`ln.i.weight`, `ln.i.bias`, with or without the `speculator.` prefix, in one safetensors file or shards with
an index. Tied checkpoints may store a tied tensor once (stage 0 / proj 1) or under every index; both load.

The compact form (`specbench_target_tables: true` in config.json, inner_dim = the target's hidden size): every
stage's `emb` and `head` are the target's own token embedding and lm_head, not stored; only `proj.i` and
`ln.i` are in the file (a few MB instead of ~56M parameters per stage for a 49k vocabulary). The full public
layout, with the target's tables written under every `emb.i` / `head.i`, is what `save_mlp_speculator` writes
for other engines.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specbench.errors import UserError
from specbench.models.cpu_kernels import Linear
from specbench.models.loading import check_tensors, read_weights


@dataclass
class MLPSpeculatorConfig:
    emb_dim: int
    inner_dim: int
    vocab_size: int
    n_predict: int
    top_k_tokens_per_head: list[int] = field(default_factory=lambda: [5, 4, 3])
    n_candidates: int = 5
    tie_weights: bool = False
    scale_input: bool = False
    target_tables: bool = False  # emb.i / head.i are the target's embedding / lm_head (the compact form)
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_hf(cls, raw: dict, src: str) -> "MLPSpeculatorConfig":
        try:
            emb = int(raw.get("emb_dim", raw.get("hidden_size")))
            n = int(raw["n_predict"])
            vocab = int(raw["vocab_size"])
        except (KeyError, TypeError) as e:
            raise UserError(f"MLP speculator {src}: config.json lacks {e.args[0] if e.args else 'emb_dim'!r}") from None
        inner = int(raw.get("inner_dim") or 0) or emb
        known = {"emb_dim", "hidden_size", "inner_dim", "vocab_size", "n_predict", "top_k_tokens_per_head",
                 "n_candidates", "tie_weights", "scale_input", "model_type", "architectures",
                 "specbench_target_tables", "torch_dtype"}
        cfg = cls(emb, inner, vocab, n, [int(k) for k in raw.get("top_k_tokens_per_head", [5, 4, 3])],
                  int(raw.get("n_candidates", 5)), bool(raw.get("tie_weights", False)),
                  bool(raw.get("scale_input", False)), bool(raw.get("specbench_target_tables", False)),
                  {k: v for k, v in raw.items() if k not in known})
        if cfg.tie_weights and n < 2:
            raise UserError(f"MLP speculator {src}: tie_weights needs n_predict >= 2, got {n}")
        return cfg

    def to_hf(self, dtype: str = "bfloat16", compact: bool = False) -> dict:
        flag = {"specbench_target_tables": True} if compact else {}
        return {"architectures": ["MLPSpeculatorPreTrainedModel"], "model_type": "mlp_speculator",
                "emb_dim": self.emb_dim, "inner_dim": self.inner_dim, "vocab_size": self.vocab_size,
                "n_predict": self.n_predict, "top_k_tokens_per_head": list(self.top_k_tokens_per_head),
                "n_candidates": self.n_candidates, "tie_weights": self.tie_weights,
                "scale_input": self.scale_input, "torch_dtype": dtype, **flag, **self.extra}


Tables = tuple[Tensor, Callable[[Tensor], Tensor], Tensor]  # (embedding weight, head, head weight)


class RMSNormAffine(nn.Module):
    """fms LayerNormParameterized(use_mean=False, elementwise_scale=True, elementwise_shift=True)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight, self.bias, self.eps = nn.Parameter(torch.ones(dim)), nn.Parameter(torch.zeros(dim)), eps

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y.to(x.dtype) * self.weight) + self.bias


class MLPSpeculator(nn.Module):
    def __init__(self, cfg: MLPSpeculatorConfig, tables: Tables | None = None) -> None:
        """tables: the target's (embedding weight [V, I], head: state -> logits, head weight [V, I]), shared by
        every stage (the compact form; not parameters of this module, so not in its state_dict)."""
        super().__init__()
        self.config = cfg
        n, E, I, V = cfg.n_predict, cfg.emb_dim, cfg.inner_dim, cfg.vocab_size
        if cfg.target_tables and tables is None:
            raise ValueError("a speculator with target_tables needs the target's (embedding, head)")
        if tables is not None and tuple(tables[0].shape) != (V, I):
            raise ValueError(f"target tables {tuple(tables[0].shape)} do not fit vocab_size {V} x inner_dim {I}")
        self.tables = tables
        if tables is None:
            self.emb = nn.ModuleList(nn.Embedding(V, I) for _ in range(n))
            self.head = nn.ModuleList(Linear(I, V, bias=False) for _ in range(n))
        self.proj = nn.ModuleList(Linear(E if i == 0 else I, I, bias=False) for i in range(n))
        self.ln = nn.ModuleList(RMSNormAffine(I) for _ in range(n))
        if cfg.tie_weights:
            for i in range(1, n):
                if tables is None:
                    self.emb[i].weight, self.head[i].weight = self.emb[0].weight, self.head[0].weight
                self.ln[i].weight, self.ln[i].bias = self.ln[0].weight, self.ln[0].bias
                if i >= 2:
                    self.proj[i].weight = self.proj[1].weight
        self.state_weight = 0.5 ** (0.5 / n)
        self.emb_weight = math.sqrt((1 - self.state_weight ** 2) * (I / 2))

    def start(self, s: Tensor) -> Tensor:
        """The target's final-normed state -> the stage-0 input (scale_input: parameter-free RMS norm / sqrt 2)."""
        if not self.config.scale_input:
            return s
        sf = s.float()
        return (sf * torch.rsqrt(sf.pow(2).mean(-1, keepdim=True) + 1e-6) / math.sqrt(2)).to(s.dtype)

    def stage(self, i: int, s: Tensor, x: Tensor) -> tuple[Tensor, Tensor]:
        """(state [..., E or I], token ids [...]) -> (new state [..., I], logits [..., V])."""
        e = self.emb[i](x) if self.tables is None else F.embedding(x, self.tables[0])
        s = self.proj[i](s) + (self.emb_weight / self.state_weight) * e.to(s.dtype)
        s = F.gelu(self.ln[i](s))
        return s, (self.head[i](s) if self.tables is None else self.tables[1](s))

    def full_state_dict(self) -> dict[str, Tensor]:
        """Every tensor of the public layout under its own name (the target's tables copied in when shared)."""
        sd = dict(self.state_dict())
        if self.tables is not None:
            for i in range(self.config.n_predict):
                sd[f"emb.{i}.weight"], sd[f"head.{i}.weight"] = self.tables[0], self.tables[2]
        return sd


def target_tables(target) -> Tables:
    """The target's (token embedding weight, lm_head, lm_head weight): a compact speculator's emb / head."""
    return target.tok_embeddings.weight, target.output, target.output.weight


def _strip(sd: dict[str, Tensor]) -> dict[str, Tensor]:
    return {k.removeprefix("speculator."): v for k, v in sd.items()}


def load_mlp_speculator(path: str | Path, target) -> MLPSpeculator:
    folder = Path(path).expanduser()
    if not (folder / "config.json").is_file():
        raise UserError(f"MLP speculator {str(path)!r} does not exist (no config.json there)")
    try:
        raw = json.loads((folder / "config.json").read_text())
    except ValueError as e:
        raise UserError(f"MLP speculator {folder}/config.json: not valid JSON ({e})") from None
    cfg = MLPSpeculatorConfig.from_hf(raw, str(folder))
    t = target.config
    if cfg.emb_dim != t.hidden_size:
        raise UserError(f"MLP speculator {folder}: emb_dim {cfg.emb_dim} != the target's hidden size {t.hidden_size}")
    if cfg.vocab_size != t.vocab_size:
        raise UserError(f"MLP speculator {folder}: vocab_size {cfg.vocab_size} != the target's {t.vocab_size}")
    if cfg.target_tables and cfg.inner_dim != t.hidden_size:
        raise UserError(f"MLP speculator {folder}: specbench_target_tables needs inner_dim {cfg.inner_dim} = the "
                        f"target's hidden size {t.hidden_size}")
    sd = _strip(read_weights(folder))
    model = MLPSpeculator(cfg, target_tables(target) if cfg.target_tables else None)
    expected = model.state_dict()
    if cfg.tie_weights:  # a tied tensor may be stored once: fill the shared names from their source
        for k in expected:
            if k not in sd:
                kind, i, name = k.split(".", 2)
                src = f"{kind}.{1 if kind == 'proj' else 0}.{name}"
                if src in sd and (kind != "proj" or int(i) >= 2):
                    sd[k] = sd[src]
    check_tensors(sd, expected, f"MLP speculator {folder}")
    model.load_state_dict({k: v.to(target.device, target.dtype) for k, v in sd.items()})
    return model.to(target.device, target.dtype).eval().requires_grad_(False)


def save_mlp_speculator(model: MLPSpeculator, folder: str | Path, dtype: torch.dtype = torch.bfloat16,
                        prefix: str = "speculator.", compact: bool = False) -> Path:
    """HF layout: config.json + model.safetensors, every tensor under its own name (tied ones copied; a
    speculator on the target's tables gets them written in). `compact=True` (a speculator on the target's
    tables only): proj / ln stored, `specbench_target_tables: true` in config.json."""
    from safetensors.torch import save_file

    if compact and model.tables is None:
        raise ValueError("compact=True needs a speculator on the target's tables")
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    src = model.state_dict() if compact else model.full_state_dict()
    sd = {prefix + k: v.detach().to("cpu", dtype).clone().contiguous() for k, v in src.items()}
    save_file(sd, str(out / "model.safetensors"))
    cfg = model.config.to_hf(str(dtype).removeprefix("torch."), compact=compact)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return out
