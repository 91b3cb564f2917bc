"""Shared fixtures: tiny random Llama-family checkpoints in the HF format, with a real (tiny) tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

TINY_CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "speculative decoding drafts tokens and the target verifies them",
    "hello world, this is a tiny tokenizer for tests",
    "one two three four five six seven eight nine ten",
]
TINY_VOCAB = 384


def make_tokenizer(folder: Path):
    """A byte-level BPE tokenizer trained on a few sentences, saved as an HF fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=TINY_VOCAB, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(TINY_CORPUS, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.save_pretrained(str(folder))
    return fast


def make_word_tokenizer(folder: Path, vocab: int):
    """A word-level tokenizer over words w0..w{vocab-1} (w0 = <unk>, w2 = </s>), for small-vocabulary models."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {f"w{i}": i for i in range(vocab)}
    tok = Tokenizer(models.WordLevel(words, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="w0", eos_token="w2", bos_token="w1")
    fast.save_pretrained(str(folder))
    return fast


def make_hf_model(folder: Path, *, arch: str = "llama", seed: int = 0, tie: bool = False,
                  rope_scaling: dict | None = None, layers: int = 2, hidden: int = 64, heads: int = 4,
                  kv_heads: int = 2, max_pos: int = 256, shard: str | None = None, vocab: int = TINY_VOCAB,
                  scale: float = 1.0):
    """Save a random tiny HF model (+ tokenizer) to `folder` and return the HF module (float32, eval)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden + 16,
                  num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                  max_position_embeddings=max_pos, tie_word_embeddings=tie, rms_norm_eps=1e-5,
                  bos_token_id=1, eos_token_id=2)
    if arch == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(rope_theta=10000.0, **common))
    else:
        extra = {"rope_scaling": rope_scaling} if rope_scaling else {}
        model = LlamaForCausalLM(LlamaConfig(rope_theta=10000.0, **extra, **common))
    # random init has tiny norms; spread the weights so logits are far from ties
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n:
                p.uniform_(0.5, 1.5)
            elif p.dim() == 2:
                p.normal_(0, (0.08 if "embed" not in n else 1.0) * scale)
            else:
                p.normal_(0, 0.05)
    model.eval()
    kwargs = {"max_shard_size": shard} if shard else {}
    model.save_pretrained(str(folder), safe_serialization=True, **kwargs)
    if vocab == TINY_VOCAB:
        make_tokenizer(folder)
    else:
        make_word_tokenizer(folder, vocab)
    return model


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("tiny_llama")
    make_hf_model(d)
    return d


@pytest.fixture(scope="session")
def embedded():
    """The embedded SmolLM2-135M-Instruct in float32 (converted once into the cache)."""
    from specbench.models.loading import load_model

    return load_model(None, torch.float32, torch.device("cpu"))


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return path


def make_eagle_head(folder: Path, target_cfg: dict, *, version: int = 3, draft_vocab: int | None = None,
                    aux_ids: list[int] | None = None, seed: int = 0, scale: float = 0.08, fmt: str = "reference",
                    fc_bias: bool = True, embed: bool = False, dtype: torch.dtype = torch.float32,
                    fc_norm: bool = False) -> dict:
    """Save a random EAGLE head for a target (its HF config dict) in a public format; returns its state dict.

    fmt: `reference` (SafeAILab/EAGLE config: LlamaForCausalLM, no rope_theta, pytorch_model.bin),
    `specforge` (LlamaForCausalLMEagle3, eagle_config with aux ids, model.safetensors), `speculators`
    (Eagle3Speculator with transformer_layer_config). EAGLE-1: `layers.0.*` without input norm, fc over
    embedding ‖ feature (bias when fc_bias), a copy of the embedding, no norm / lm_head. fc_norm: EAGLE-3.1's
    per-state norms `fc_norm.{0,1,2}.weight` and `"fc_norm": true` at the config's top level.
    """
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    H, V = target_cfg["hidden_size"], target_cfg["vocab_size"]
    heads, kv = target_cfg["num_attention_heads"], target_cfg.get("num_key_value_heads", target_cfg["num_attention_heads"])
    D, I = H // heads, target_cfg["intermediate_size"]
    Vd = draft_vocab or V
    rnd = lambda *s: (torch.randn(*s, generator=g) * scale).to(dtype)  # noqa: E731
    ones = lambda n: (1 + 0.2 * torch.randn(n, generator=g)).to(dtype)  # noqa: E731
    sd: dict[str, torch.Tensor] = {}
    if version == 3:
        pre, a_in = "midlayer.", 2 * H
        sd["fc.weight"] = rnd(H, 3 * H)
        if fc_norm:
            for i in range(3):
                sd[f"fc_norm.{i}.weight"] = ones(H)
        sd[pre + "input_layernorm.weight"] = ones(H)
        sd[pre + "hidden_norm.weight"] = ones(H)
        sd["norm.weight"] = ones(H)
        sd["lm_head.weight"] = rnd(Vd, H) * 10
        used = torch.sort(torch.randperm(V, generator=g)[:Vd]).values
        sd["d2t"] = used - torch.arange(Vd)
        sd["t2d"] = torch.zeros(V, dtype=torch.bool).index_fill_(0, used, True)
        if embed:
            sd["embed_tokens.weight"] = rnd(V, H) * 10
    else:
        pre, a_in = "layers.0.", H
        sd["fc.weight"] = rnd(H, 2 * H)
        if fc_bias:
            sd["fc.bias"] = rnd(H)
        sd["embed_tokens.weight"] = rnd(V, H)
    sd[pre + "self_attn.q_proj.weight"] = rnd(heads * D, a_in)
    sd[pre + "self_attn.k_proj.weight"] = rnd(kv * D, a_in)
    sd[pre + "self_attn.v_proj.weight"] = rnd(kv * D, a_in)
    sd[pre + "self_attn.o_proj.weight"] = rnd(H, heads * D)
    sd[pre + "post_attention_layernorm.weight"] = ones(H)
    sd[pre + "mlp.gate_proj.weight"] = rnd(I, H)
    sd[pre + "mlp.up_proj.weight"] = rnd(I, H)
    sd[pre + "mlp.down_proj.weight"] = rnd(H, I)
    layer = {"hidden_size": H, "intermediate_size": I, "num_attention_heads": heads, "num_key_value_heads": kv,
             "num_hidden_layers": 1, "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "hidden_act": "silu",
             "vocab_size": V, "torch_dtype": "float32", "tie_word_embeddings": False, "model_type": "llama"}
    if version == 1:
        cfg = {**layer, "architectures": ["LlamaForCausalLM"], "rope_theta": 10000.0, "bias": fc_bias}
    elif fmt == "reference":
        cfg = {**layer, "architectures": ["LlamaForCausalLM"], "draft_vocab_size": Vd}
    elif fmt == "specforge":
        cfg = {**layer, "architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": Vd, "rope_theta": 10000.0,
               "eagle_config": {"eagle_aux_hidden_state_layer_ids": aux_ids, "use_aux_hidden_state": True}}
    else:
        cfg = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
               "transformer_layer_config": layer, "draft_vocab_size": Vd, "norm_before_residual": False,
               "target_hidden_size": H, "eagle_aux_hidden_state_layer_ids": aux_ids,
               "speculators_config": {"algorithm": "eagle3", "proposal_methods": [
                   {"proposal_type": "greedy", "speculative_tokens": 3}]}}
    if fc_norm:
        cfg["fc_norm"] = True
    if aux_ids is not None and fmt == "reference":
        cfg["eagle_aux_hidden_state_layer_ids"] = aux_ids
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    if fmt == "reference" or version == 1:
        torch.save(sd, folder / "pytorch_model.bin")
    else:
        save_file({k: v.contiguous() for k, v in sd.items()}, str(folder / "model.safetensors"))
    return sd


def make_medusa_head(folder: Path, target_cfg: dict, *, layout: str = "vllm", heads: int = 3, layers: int = 1,
                     lm_head: str = "own", bias: bool = True, config_heads: int | None = None,
                     token_map: list[int] | None = None, seed: int = 0, scale: float = 0.3,
                     fmt: str = "safetensors") -> dict:
    """Save random Medusa heads for a target (its HF config dict) in a public layout; returns the raw tensors
    in FasterDecoding's names ({h}.{l}.linear.*, {h}.{L}.weight) whatever the layout, for reference maths.

    lm_head: `own` (one per head), `shared` (vLLM original_lm_head: one stored head), `target` (no lm_head
    tensors: FasterDecoding's version 2 / the base model's head). config_heads: the head count the config
    claims (FasterDecoding's published file says 2 and holds 5). token_map: vLLM's reduced head vocabulary."""
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    H, V = target_cfg["hidden_size"], target_cfg["vocab_size"]
    rows = len(token_map) if token_map else V
    ref: dict[str, torch.Tensor] = {}
    shared = torch.randn(rows, H, generator=g) * scale * 3
    for h in range(heads):
        for l in range(layers):
            ref[f"{h}.{l}.linear.weight"] = torch.randn(H, H, generator=g) * scale / H ** 0.5
            if bias:
                ref[f"{h}.{l}.linear.bias"] = torch.randn(H, generator=g) * scale
        if lm_head == "own":
            ref[f"{h}.{layers}.weight"] = torch.randn(rows, H, generator=g) * scale * 3
        elif lm_head == "shared":
            ref[f"{h}.{layers}.weight"] = shared
    folder.mkdir(parents=True, exist_ok=True)
    if layout == "faster_decoding":
        cfg = {"base_model_name_or_path": "tiny", "medusa_num_heads": config_heads or heads,
               "medusa_num_layers": layers}
        (folder / "config.json").write_text(json.dumps(cfg))
        if fmt == "pt":
            torch.save(ref, folder / "medusa_lm_head.pt")
        else:
            save_file({k: v.contiguous() for k, v in ref.items()}, str(folder / "medusa_lm_head.safetensors"))
        return ref
    sd = {}
    for h in range(heads):
        for l in range(layers):
            sd[f"blocks.{h}.layers.{l}.weight"] = ref[f"{h}.{l}.linear.weight"]
            if bias:
                sd[f"blocks.{h}.layers.{l}.bias"] = ref[f"{h}.{l}.linear.bias"]
        if lm_head == "own":
            sd[f"lm_heads.{h}.weight"] = ref[f"{h}.{layers}.weight"]
    if lm_head == "shared":
        sd["lm_heads.0.weight"] = shared
    if token_map:
        sd["token_map"] = torch.tensor(token_map)
    cfg = {"model_type": "medusa", "hidden_size": H, "vocab_size": V, "num_heads": config_heads or heads,
           "num_hidden_layers": layers, "truncated_vocab_size": rows, "medusa_fc_bias": bias,
           "original_lm_head": lm_head == "shared"}
    (folder / "config.json").write_text(json.dumps(cfg))
    save_file({k: v.contiguous() for k, v in sd.items()}, str(folder / "model.safetensors"))
    return ref


@pytest.fixture(scope="session")
def tiny_lm(tiny_dir):
    """The tiny random Llama loaded in float32."""
    from specbench.models.loading import load_model

    return load_model(str(tiny_dir), torch.float32, torch.device("cpu"))


@pytest.fixture(scope="session")
def regen_items(tiny_lm, tmp_path_factory):
    """Self-distillation data for training tests: the tiny target's own greedy responses to word prompts."""
    from specbench.train.__main__ import regenerate
    from specbench.train.data import Example, tokenize

    words = " ".join(TINY_CORPUS).split()
    prompts = [Example(" ".join(words[i:i + 3]), "", f"p{i}") for i in range(0, 36)]
    examples = regenerate(tiny_lm.model, tiny_lm.tokenizer, prompts, 24, tmp_path_factory.mktemp("regen") / "r.jsonl")
    return tokenize(examples, tiny_lm.tokenizer, 64)


def make_mlp_speculator(folder: Path, target_cfg: dict, *, n_predict: int = 3, inner_dim: int = 0,
                        tie: bool = False, scale_input: bool = False, prefix: str = "speculator.",
                        shards: bool = False, store_tied_once: bool = False, seed: int = 0,
                        scale: float = 1.0) -> dict:
    """Save a random MLP speculator for a target in the HF layout; returns its tensors (unprefixed names, every
    stage listed, tied ones repeated). shards: two files + model.safetensors.index.json."""
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    E, V = target_cfg["hidden_size"], target_cfg["vocab_size"]
    I = inner_dim or E
    sd: dict[str, torch.Tensor] = {}
    for i in range(n_predict):
        src = 0 if tie else i
        p_src = (1 if i >= 2 else i) if tie else i
        sd[f"emb.{i}.weight"] = sd[f"emb.{src}.weight"] if src != i else torch.randn(V, I, generator=g) * scale * 0.3
        sd[f"proj.{i}.weight"] = sd[f"proj.{p_src}.weight"] if p_src != i else \
            torch.randn(I, E if i == 0 else I, generator=g) * scale / (E if i == 0 else I) ** 0.5
        sd[f"head.{i}.weight"] = sd[f"head.{src}.weight"] if src != i else torch.randn(V, I, generator=g) * scale * 0.3
        sd[f"ln.{i}.weight"] = sd[f"ln.{src}.weight"] if src != i else 1 + 0.2 * torch.randn(I, generator=g)
        sd[f"ln.{i}.bias"] = sd[f"ln.{src}.bias"] if src != i else 0.1 * torch.randn(I, generator=g)
    stored = {}
    for k, v in sd.items():
        kind, i, _ = k.split(".", 2)
        tied_copy = tie and int(i) > 0 and not (kind == "proj" and int(i) == 1)
        if store_tied_once and tied_copy:
            continue
        stored[prefix + k] = v.clone().contiguous()
    folder.mkdir(parents=True, exist_ok=True)
    cfg = {"architectures": ["MLPSpeculatorPreTrainedModel"], "model_type": "mlp_speculator", "emb_dim": E,
           "inner_dim": inner_dim, "vocab_size": V, "n_predict": n_predict, "top_k_tokens_per_head": [4, 3, 2][:n_predict],
           "n_candidates": 5, "tie_weights": tie, "scale_input": scale_input}
    (folder / "config.json").write_text(json.dumps(cfg))
    if shards:
        keys = sorted(stored)
        half = len(keys) // 2
        parts = {"model-00001-of-00002.safetensors": keys[:half], "model-00002-of-00002.safetensors": keys[half:]}
        for name, ks in parts.items():
            save_file({k: stored[k] for k in ks}, str(folder / name))
        (folder / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {}, "weight_map": {k: name for name, ks in parts.items() for k in ks}}))
    else:
        save_file(stored, str(folder / "model.safetensors"))
    return sd
