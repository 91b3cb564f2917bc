"""Medusa heads: H heads over the target's final-normed hidden state, each a stack of ResBlocks
`x + SiLU(W x + b)` and a vocabulary projection; head i predicts the token at offset t+2+i (the target's own
lm_head gives t+1). The public checkpoint layouts in and out.

Layouts (facts: ../shared/reference/checkpoint-formats.md, section 3):
- FasterDecoding (`medusa_lm_head.pt` read with `weights_only=True`, or `medusa_lm_head.safetensors`): keys
  `{h}.{l}.linear.weight/bias` for l < L and `{h}.{L}.weight` (the head's own lm_head). Without the
  `{h}.{L}.weight` keys ("version 2") every head uses the target's lm_head. The head count comes from the keys
  present, not from `medusa_num_heads` (the published Vicuna-7B file holds 5 heads, its config says 2).
  The reference builds the L blocks of a head as one ResBlock instance repeated L times; here each block has
  its own weights (identical when the file repeats them).
- vLLM (`config.json` with `num_heads`, `num_hidden_layers`, `hidden_size`, `vocab_size`,
  `truncated_vocab_size`, `medusa_fc_bias`, `original_lm_head`; `model.safetensors`): keys
  `blocks.{h}.layers.{l}.weight` (+ `.bias` when medusa_fc_bias), `lm_heads.{h}.weight` or, with
  original_lm_head, one shared `lm_head.weight` / `lm_heads.0.weight`; optional `token_map` [truncated] (head
  row -> target id); an optional `medusa_heads.` prefix is stripped.

Here a head set's vocabulary projection is one of: `own` (one lm_head per head), `shared` (one stored lm_head
for all heads) or `target` (the target's own lm_head, not stored: the shipped head for the embedded target).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor, nn

from specbench.errors import UserError
from specbench.models.cpu_kernels import Linear, linear
from specbench.models.loading import check_tensors

LM_HEADS = ("own", "shared", "target")
LAYOUTS = ("vllm", "faster_decoding")


@dataclass
class MedusaConfig:
    num_heads: int
    num_layers: int  # ResBlocks per head
    hidden_size: int
    vocab_size: int  # the target's vocabulary
    lm_head: str = "own"  # own | shared | target
    head_vocab_size: int | None = None  # rows of the projection (< vocab_size with a token_map); None = vocab
    fc_bias: bool = True
    extra: dict = field(default_factory=dict)  # other config fields, kept for export

    @property
    def rows(self) -> int:
        return self.head_vocab_size or self.vocab_size


class MedusaHeads(nn.Module):
    """`states(x)` -> [..., heads, H] (each head's ResBlock stack on the same input); `logits(x)` -> [..., heads,
    rows] over the head vocabulary; `token_ids` maps a row to a target token id."""

    def __init__(self, cfg: MedusaConfig, target_head: nn.Linear | None = None) -> None:
        super().__init__()
        self.config = cfg
        H = cfg.hidden_size
        self.blocks = nn.ModuleList(
            nn.ModuleList(Linear(H, H, bias=cfg.fc_bias) for _ in range(cfg.num_layers)) for _ in range(cfg.num_heads))
        if cfg.lm_head == "own":
            self.lm_heads = nn.ModuleList(Linear(H, cfg.rows, bias=False) for _ in range(cfg.num_heads))
        elif cfg.lm_head == "shared":
            self.lm_head = Linear(H, cfg.rows, bias=False)
        if cfg.head_vocab_size is not None and cfg.head_vocab_size < cfg.vocab_size:
            self.register_buffer("token_map", torch.arange(cfg.head_vocab_size))
        else:
            self.token_map = None
        self.target_head = target_head
        self._target_rows: Tensor | None = None

    def __setattr__(self, name, value):  # the target's lm_head belongs to the target: not a parameter here
        if name == "target_head":
            object.__setattr__(self, name, value)
        else:
            super().__setattr__(name, value)

    @property
    def token_ids(self) -> Tensor:
        dev = next(self.parameters()).device
        return self.token_map if self.token_map is not None else torch.arange(self.config.vocab_size, device=dev)

    def states(self, x: Tensor) -> Tensor:
        """x [..., H] -> [..., heads, H]: head h's ResBlocks x <- x + SiLU(W x + b), L times."""
        out = []
        for blocks in self.blocks:
            y = x
            for lin in blocks:
                y = y + torch.nn.functional.silu(lin(y))
            out.append(y)
        return torch.stack(out, dim=-2)

    def _shared_weight(self) -> Tensor:
        if self.config.lm_head == "shared":
            return self.lm_head.weight
        w = self.target_head.weight
        if self.token_map is None:
            return w
        if self._target_rows is None or self._target_rows.device != w.device or self._target_rows.dtype != w.dtype:
            self._target_rows = w[self.token_map].contiguous()  # the target's rows of the head vocabulary, once
        return self._target_rows

    def logits(self, x: Tensor) -> Tensor:
        """x [..., H] final-normed target state -> [..., heads, rows]."""
        s = self.states(x)
        if self.config.lm_head == "own":
            return torch.stack([head(s[..., i, :]) for i, head in enumerate(self.lm_heads)], dim=-2)
        return linear(s, self._shared_weight())  # one product for every head: the weight is read once


# ----------------------------------------------------------------------------------------- checkpoints
def _read_tensors(path: Path) -> dict[str, Tensor]:
    from safetensors.torch import load_file

    try:
        if path.suffix == ".safetensors":
            return load_file(str(path))
        sd = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - a corrupt file is bad input
        raise UserError(f"Medusa head {path}: cannot read ({type(e).__name__}: {str(e).splitlines()[0][:120]})") from None
    if not isinstance(sd, dict) or not all(isinstance(v, Tensor) for v in sd.values()):
        raise UserError(f"Medusa head {path}: not a state dict of tensors")
    return sd


def _faster_decoding(sd: dict[str, Tensor], raw: dict, src: str) -> tuple[MedusaConfig, dict[str, Tensor]]:
    """`{h}.{l}.linear.*` + optional `{h}.{L}.weight` -> (config, tensors in this module's names)."""
    heads: dict[int, dict[int, dict[str, Tensor]]] = {}
    lm: dict[int, Tensor] = {}
    for k, v in sd.items():
        parts = k.split(".")
        if len(parts) == 4 and parts[2] == "linear" and parts[0].isdigit() and parts[1].isdigit():
            heads.setdefault(int(parts[0]), {}).setdefault(int(parts[1]), {})[parts[3]] = v
        elif len(parts) == 3 and parts[2] == "weight" and parts[0].isdigit() and parts[1].isdigit():
            lm[int(parts[0])] = v
        else:
            raise UserError(f"Medusa head {src}: unexpected tensor {k!r} (FasterDecoding layout: "
                            "'{h}.{l}.linear.weight/bias', '{h}.{L}.weight')")
    if sorted(heads) != list(range(len(heads))) or not heads:
        raise UserError(f"Medusa head {src}: head indices {sorted(heads)} are not 0..H-1")
    L = len(heads[0])
    out: dict[str, Tensor] = {}
    for h, blocks in heads.items():
        if sorted(blocks) != list(range(L)):
            raise UserError(f"Medusa head {src}: head {h} has blocks {sorted(blocks)}, head 0 has 0..{L - 1}")
        for l, t in blocks.items():
            if "weight" not in t:
                raise UserError(f"Medusa head {src}: missing tensor '{h}.{l}.linear.weight'")
            out[f"blocks.{h}.{l}.weight"] = t["weight"]
            if "bias" in t:
                out[f"blocks.{h}.{l}.bias"] = t["bias"]
    bias = "blocks.0.0.bias" in out
    if any((f"blocks.{h}.{l}.bias" in out) != bias for h in heads for l in range(L)):
        raise UserError(f"Medusa head {src}: some ResBlocks have a bias and some do not")
    if lm and sorted(lm) != sorted(heads):
        raise UserError(f"Medusa head {src}: lm_heads for heads {sorted(lm)}, blocks for {sorted(heads)}")
    if lm and any(int(k.split(".")[1]) != L for k in sd if k.count(".") == 2):
        raise UserError(f"Medusa head {src}: the lm_head of each head must sit at index L = {L}")
    for h, w in lm.items():
        out[f"lm_heads.{h}.weight"] = w
    H = out["blocks.0.0.weight"].shape[1]
    V = next(iter(lm.values())).shape[0] if lm else int(raw.get("vocab_size") or 0)
    n_cfg = raw.get("medusa_num_heads")
    extra = {k: v for k, v in raw.items() if k not in ("medusa_num_heads", "medusa_num_layers")}
    if n_cfg is not None and int(n_cfg) != len(heads):
        extra["config_num_heads"] = int(n_cfg)  # the file is right, the config is not (as the published one)
    cfg = MedusaConfig(num_heads=len(heads), num_layers=L, hidden_size=H, vocab_size=V,
                       lm_head="own" if lm else "target", fc_bias=bias, extra=extra)
    return cfg, out


def _vllm(sd: dict[str, Tensor], raw: dict, src: str) -> tuple[MedusaConfig, dict[str, Tensor]]:
    sd = {k.removeprefix("medusa_heads."): v for k, v in sd.items()}
    out: dict[str, Tensor] = {}
    for k, v in sd.items():
        parts = k.split(".")
        if k.startswith("blocks.") and len(parts) == 5 and parts[2] == "layers":
            out[f"blocks.{parts[1]}.{parts[3]}.{parts[4]}"] = v
        elif k.startswith("lm_heads.") and len(parts) == 3 or k in ("lm_head.weight", "token_map"):
            out[k] = v
        else:
            raise UserError(f"Medusa head {src}: unexpected tensor {k!r} (vLLM layout: 'blocks.{{h}}.layers.{{l}}.*', "
                            "'lm_heads.{h}.weight', 'lm_head.weight', 'token_map')")

    def num(*keys, default=None):
        for key in keys:
            if key in raw:
                return int(raw[key])
        return default

    H_cfg = num("hidden_size")
    heads = sorted({int(k.split(".")[1]) for k in out if k.startswith("blocks.")})
    if not heads or heads != list(range(len(heads))):
        raise UserError(f"Medusa head {src}: no 'blocks.{{h}}.layers.{{l}}' tensors for heads 0..H-1")
    L = len({k.split(".")[2] for k in out if k.startswith("blocks.0.")})
    shared = bool(raw.get("original_lm_head", False))
    lm_keys = sorted(k for k in out if k.startswith("lm_heads.") or k == "lm_head.weight")
    if raw.get("specbench_lm_head") == "target" and not lm_keys:
        kind = "target"  # the compact form written here: the target's own lm_head, not stored
    elif shared:
        w = out.pop("lm_head.weight", None)
        w = out.pop("lm_heads.0.weight", w)
        if w is None:
            raise UserError(f"Medusa head {src}: original_lm_head is true but there is no 'lm_head.weight'")
        out["lm_head.weight"] = w
        kind = "shared"
    elif lm_keys:
        if lm_keys != sorted(f"lm_heads.{h}.weight" for h in heads):
            raise UserError(f"Medusa head {src}: lm_heads {lm_keys} do not match heads 0..{len(heads) - 1}")
        kind = "own"
    else:
        kind = "target"
    V = num("vocab_size", default=0)
    rows = None
    if "token_map" in out:
        out["token_map"] = out["token_map"].long()
        rows = out["token_map"].shape[0]
        if num("truncated_vocab_size", default=rows) != rows:
            raise UserError(f"Medusa head {src}: truncated_vocab_size {raw['truncated_vocab_size']} but the "
                            f"token_map has {rows} ids")
    H = out["blocks.0.0.weight"].shape[1]
    if H_cfg is not None and H_cfg != H:
        raise UserError(f"Medusa head {src}: config hidden_size {H_cfg} but the blocks are {H} wide")
    cfg = MedusaConfig(num_heads=len(heads), num_layers=L, hidden_size=H, vocab_size=V, lm_head=kind,
                       head_vocab_size=rows,
                       fc_bias="blocks.0.0.bias" in out,
                       extra={k: v for k, v in raw.items() if k not in (
                           "num_heads", "num_hidden_layers", "hidden_size", "vocab_size", "truncated_vocab_size",
                           "medusa_fc_bias", "original_lm_head", "model_type", "architectures", "specbench_lm_head",
                           "torch_dtype")})
    return cfg, out


def load_medusa(path: str | Path, target) -> MedusaHeads:
    """Load a Medusa head folder (either public layout) for `target` (a Transformer); one-line errors on misfits."""
    folder = Path(path).expanduser()
    if not folder.exists():
        raise UserError(f"Medusa head {str(path)!r} does not exist")
    if folder.is_file():
        folder = folder.parent
    raw = {}
    if (folder / "config.json").is_file():
        try:
            raw = json.loads((folder / "config.json").read_text())
        except ValueError as e:
            raise UserError(f"Medusa head {folder}/config.json: not valid JSON ({e})") from None
    fd = [folder / n for n in ("medusa_lm_head.safetensors", "medusa_lm_head.pt")]
    vl = [folder / n for n in ("model.safetensors", "pytorch_model.bin")]
    src = next((f for f in fd + vl if f.is_file()), None)
    if src is None:
        raise UserError(f"Medusa head {folder}: no medusa_lm_head.pt / .safetensors (FasterDecoding) or "
                        "model.safetensors / pytorch_model.bin (vLLM)")
    sd = _read_tensors(src)
    cfg, tensors = (_faster_decoding if src in fd else _vllm)(sd, raw, str(src))
    t = target.config
    if cfg.hidden_size != t.hidden_size:
        raise UserError(f"Medusa head {src}: hidden size {cfg.hidden_size} != the target's {t.hidden_size}")
    if cfg.vocab_size and cfg.vocab_size != t.vocab_size:
        raise UserError(f"Medusa head {src}: vocabulary {cfg.vocab_size} != the target's {t.vocab_size}")
    cfg.vocab_size = t.vocab_size
    if cfg.head_vocab_size is not None and cfg.head_vocab_size > t.vocab_size:
        raise UserError(f"Medusa head {src}: token_map of {cfg.head_vocab_size} ids > the target's vocabulary")
    heads = MedusaHeads(cfg, target.output)
    expected = dict(heads.state_dict())
    if "token_map" in tensors and heads.token_map is None:
        raise UserError(f"Medusa head {src}: a token_map but no truncated_vocab_size below the vocabulary")
    check_tensors(tensors, expected, f"Medusa head {src} (for a target of hidden {t.hidden_size}, "
                  f"head vocabulary {cfg.rows})")
    if heads.token_map is not None:
        tm = tensors["token_map"]
        if int(tm.min()) < 0 or int(tm.max()) >= t.vocab_size:
            raise UserError(f"Medusa head {src}: token_map ids outside 0..{t.vocab_size - 1}")
    dev, dt = target.device, target.dtype
    typed = {k: (v.to(dev) if k == "token_map" else v.to(dev, dt)) for k, v in tensors.items()}
    heads.load_state_dict(typed, strict=True, assign=True)
    heads.source = str(src)
    return heads.eval().requires_grad_(False)


def save_medusa(heads: MedusaHeads, folder: str | Path, layout: str = "vllm", dtype: torch.dtype = torch.bfloat16,
                store_target_head: bool = True) -> Path:
    """Export in vLLM's layout (default) or FasterDecoding's. A head set on the target's lm_head is written with
    that lm_head stored (vLLM: `original_lm_head`, FasterDecoding: version 2, no lm_head keys: the reference
    reads the base model's) unless `store_target_head=False` (the compact form shipped here: a flag, no head)."""
    from safetensors.torch import save_file

    if layout not in LAYOUTS:
        raise UserError(f"medusa export layout={layout!r}; valid: {', '.join(LAYOUTS)}")
    cfg = heads.config
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    sd = {k: v.detach().to("cpu") for k, v in heads.state_dict().items()}
    cast = {k: (v if k == "token_map" else v.to(dtype)).contiguous() for k, v in sd.items()}
    if layout == "faster_decoding" and cfg.head_vocab_size is not None:
        raise UserError("FasterDecoding's layout has no reduced vocabulary (token_map); export layout=vllm")
    block = "{h}.{l}.linear." if layout == "faster_decoding" else "blocks.{h}.layers.{l}."
    t = {}
    for h in range(cfg.num_heads):
        for l in range(cfg.num_layers):
            for p in ("weight", "bias") if cfg.fc_bias else ("weight",):
                t[block.format(h=h, l=l) + p] = cast[f"blocks.{h}.{l}.{p}"]
    if layout == "faster_decoding":
        for h in range(cfg.num_heads):
            if cfg.lm_head == "own":
                t[f"{h}.{cfg.num_layers}.weight"] = cast[f"lm_heads.{h}.weight"]
            elif cfg.lm_head == "shared":  # FasterDecoding has one head per Medusa head: write copies
                t[f"{h}.{cfg.num_layers}.weight"] = cast["lm_head.weight"].clone()
        save_file(t, str(out / "medusa_lm_head.safetensors"))
        meta = {"medusa_num_heads": cfg.num_heads, "medusa_num_layers": cfg.num_layers,
                "hidden_size": cfg.hidden_size, "vocab_size": cfg.vocab_size, **cfg.extra}
        (out / "config.json").write_text(json.dumps(meta, indent=2))
        return out
    shared = cfg.lm_head in ("shared", "target")
    if cfg.lm_head == "own":
        for h in range(cfg.num_heads):
            t[f"lm_heads.{h}.weight"] = cast[f"lm_heads.{h}.weight"]
    elif cfg.lm_head == "shared":
        t["lm_head.weight"] = cast["lm_head.weight"]
    elif store_target_head:
        t["lm_head.weight"] = heads._shared_weight().detach().to("cpu", dtype).contiguous()
    if heads.token_map is not None:
        t["token_map"] = heads.token_map.detach().to("cpu").contiguous()
    save_file(t, str(out / "model.safetensors"))
    meta = {"architectures": ["MedusaModel"], "model_type": "medusa", "hidden_size": cfg.hidden_size,
            "vocab_size": cfg.vocab_size, "num_heads": cfg.num_heads, "num_hidden_layers": cfg.num_layers,
            "truncated_vocab_size": cfg.rows, "medusa_fc_bias": cfg.fc_bias, "original_lm_head": shared,
            "torch_dtype": str(dtype).removeprefix("torch."), **cfg.extra}
    if cfg.lm_head == "target" and not store_target_head:
        meta["specbench_lm_head"] = "target"  # the compact form: the lm_head is the target's, not in the file
    (out / "config.json").write_text(json.dumps(meta, indent=2))
    return out
