"""GGUF conversion: a tiny llama GGUF written the way llama.cpp writes it converts to the same model."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from conftest import make_hf_model
from specbench.errors import UserError
from specbench.models.loading import convert_gguf, load_model, resolve_folder

CPU = torch.device("cpu")
NAMES = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
         "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
         "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf permutation of q/k rows."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path, hf, tokenizer_dir, arch: str = "llama") -> None:
    import gguf

    cfg = hf.config
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(10000.0)
    tok = json.loads((tokenizer_dir / "tokenizer.json").read_text())
    vocab = sorted(tok["model"]["vocab"].items(), key=lambda kv: kv[1])
    w.add_tokenizer_model("gpt2")
    w.add_token_list([t for t, _ in vocab])
    w.add_token_types([3 if t in ("<unk>", "<s>", "</s>") else 1 for t, _ in vocab])
    merges = tok["model"]["merges"]
    w.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in merges])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    for name, t in hf.state_dict().items():
        a = t.float().numpy()
        if name == "model.embed_tokens.weight":
            w.add_tensor("token_embd.weight", a)
        elif name == "model.norm.weight":
            w.add_tensor("output_norm.weight", a)
        elif name == "lm_head.weight":
            w.add_tensor("output.weight", a)
        else:
            _, _, i, rest = name.split(".", 3)
            mod, kind = rest.rsplit(".", 1)
            g = NAMES[mod]
            if g == "attn_q":
                a = _permute(a, cfg.num_attention_heads)
            elif g == "attn_k":
                a = _permute(a, cfg.num_key_value_heads)
            w.add_tensor(f"blk.{i}.{g}.{kind}", np.ascontiguousarray(a))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_gguf_converts_to_same_logits(tmp_path):
    src = tmp_path / "hf"
    hf = make_hf_model(src)
    path = tmp_path / "tiny.gguf"
    write_gguf(path, hf, src)
    lm = load_model(str(path), torch.float32, CPU, cache_dir=str(tmp_path / "cache"))
    ids = [5, 17, 99, 3, 250, 7]
    out = lm.model(torch.tensor([ids]), lm.model.new_cache(1, 16), kv_len=len(ids)).logits
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    assert lm.tokenizer.decode(lm.tokenizer.encode("the quick brown fox")) == "the quick brown fox"
    # the second load reuses the converted folder
    folder, _ = resolve_folder(str(path), str(tmp_path / "cache"))
    assert folder == type(folder)(lm.path) and (folder / "model.safetensors").is_file()


def test_gguf_unsupported_architecture(tmp_path):
    src = tmp_path / "hf"
    hf = make_hf_model(src)
    path = tmp_path / "gpt2.gguf"
    write_gguf(path, hf, src, arch="gpt2")
    with pytest.raises(UserError, match="architecture 'gpt2' is not supported"):
        convert_gguf(path, tmp_path / "out")


@pytest.mark.slow
def test_embedded_conversion_matches_transformers_gguf_loader(embedded):
    """Our dequantize + un-permute gives exactly the tensors transformers' own GGUF loader produces."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    from specbench.models.loading import embedded_gguf_path, hf_state_dict

    cfg = json.loads((type(embedded_gguf_path())(embedded.path) / "config.json").read_text())
    with torch.device("meta"):
        skeleton = LlamaForCausalLM(LlamaConfig(**cfg))
    ref = load_gguf_checkpoint(str(embedded_gguf_path()), return_tensors=True, model_to_load=skeleton)["tensors"]
    mine = hf_state_dict(embedded.model)
    assert set(mine) == set(ref) - {"lm_head.weight"}
    for k in mine:
        assert torch.equal(mine[k], torch.as_tensor(ref[k]).float()), k
