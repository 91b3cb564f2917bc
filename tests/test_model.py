"""The native model against HF transformers on the same weights: prefill and cached decode, batch > 1."""

from __future__ import annotations

import pytest
import torch

from conftest import make_hf_model
from specbench.models.loading import load_model

CPU = torch.device("cpu")


def _hf_logits(hf, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0].float()


def _check_parity(folder, hf, prompts: list[list[int]], decode: list[list[int]], atol: float = 1e-4) -> None:
    """Batched right-padded prefill, then cached decode steps per request, vs HF on each full sequence."""
    m = load_model(str(folder), torch.float32, CPU).model
    B, P = len(prompts), max(len(p) for p in prompts)
    cache = m.new_cache(B, 64)
    ids = torch.tensor([p + [0] * (P - len(p)) for p in prompts])
    out = m(ids, cache, kv_len=P)
    for b, p in enumerate(prompts):
        ref = _hf_logits(hf, p)
        torch.testing.assert_close(out.logits[b, : len(p)].float(), ref, atol=atol, rtol=1e-4)
    cache.seq_lens.copy_(torch.tensor([len(p) for p in prompts]))
    seqs = [list(p) for p in prompts]
    for step in range(len(decode[0])):
        toks = torch.tensor([[d[step]] for d in decode])
        kv = max(len(s) for s in seqs) + 1
        o = m(toks, cache, kv_len=kv)
        cache.seq_lens += 1
        for b in range(B):
            seqs[b].append(decode[b][step])
            torch.testing.assert_close(o.logits[b, 0].float(), _hf_logits(hf, seqs[b])[-1], atol=atol, rtol=1e-4)


PROMPTS = [[5, 17, 99, 3, 250, 7, 8], [40, 41, 42], [300, 2, 9, 11, 12]]
DECODE = [[10, 11, 12, 13], [200, 201, 202, 203], [1, 3, 5, 7]]


@pytest.mark.parametrize(
    "variant",
    [
        dict(),
        dict(tie=True),
        dict(arch="qwen2"),
        dict(rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                           "high_freq_factor": 4.0, "original_max_position_embeddings": 16}),
        dict(rope_scaling={"rope_type": "linear", "factor": 2.0}),
        dict(kv_heads=4),  # plain MHA
        dict(shard="20KB"),  # sharded safetensors with an index
    ],
    ids=["llama", "tied", "qwen2-bias", "llama3-rope", "linear-rope", "mha", "sharded"],
)
def test_logits_match_hf(tmp_path, variant):
    hf = make_hf_model(tmp_path, **variant)
    if variant.get("shard"):
        assert (tmp_path / "model.safetensors.index.json").is_file()
    _check_parity(tmp_path, hf, PROMPTS, DECODE)


def test_hidden_states_match_hf(tmp_path):
    hf = make_hf_model(tmp_path, layers=3)
    m = load_model(str(tmp_path), torch.float32, CPU).model
    ids = [5, 17, 99, 3, 250]
    out = m(torch.tensor([ids]), m.new_cache(1, 16), kv_len=5, hidden_layers=(0, 2, 3), return_normed=True)
    with torch.no_grad():
        ref = hf(torch.tensor([ids]), output_hidden_states=True)
    # HF hidden_states[i] is the input of layer i; its last entry is after the final norm
    torch.testing.assert_close(out.hidden[0], ref.hidden_states[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.hidden[1], ref.hidden_states[2], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.normed, ref.hidden_states[3], atol=1e-5, rtol=1e-5)
    assert out.hidden[2].shape == (1, 5, 64) and not torch.allclose(out.hidden[2], out.normed)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_close_to_fp32(tmp_path, dtype):
    make_hf_model(tmp_path)
    ids = torch.tensor([PROMPTS[0]])
    m32 = load_model(str(tmp_path), torch.float32, CPU).model
    ref = m32(ids, m32.new_cache(1, 16), kv_len=ids.shape[1]).logits
    m = load_model(str(tmp_path), dtype, CPU).model
    assert m.dtype == dtype and m.layers[0].attn.wqkv.weight.dtype == dtype
    out = m(ids, m.new_cache(1, 16), kv_len=ids.shape[1]).logits
    assert out.dtype == dtype
    assert (out.float() - ref).abs().max() < 0.1 * ref.abs().max()


def test_tree_mask_matches_separate_branches(tmp_path):
    """Two branches verified in one forward with a tree mask give the logits of each branch run alone."""
    make_hf_model(tmp_path)
    m = load_model(str(tmp_path), torch.float32, CPU).model
    prefix = [5, 17, 99, 3]
    a, b = [10, 11], [20]  # tree: root children a0 -> a1, and b0 (siblings a0, b0)
    cache = m.new_cache(1, 32)
    m(torch.tensor([prefix]), cache, kv_len=4)
    cache.seq_lens.fill_(4)
    nodes = torch.tensor([[a[0], a[1], b[0]]])
    tree = torch.tensor([[[1, 0, 0], [1, 1, 0], [0, 0, 1]]], dtype=torch.bool)
    pos = torch.tensor([[4, 5, 4]])
    out = m(nodes, cache, kv_len=7, positions=pos, tree_mask=tree).logits[0]
    ref = m(torch.tensor([prefix + a]), m.new_cache(1, 32), kv_len=6).logits[0]
    torch.testing.assert_close(out[:2], ref[4:6], atol=1e-5, rtol=1e-5)
    ref_b = m(torch.tensor([prefix + b]), m.new_cache(1, 32), kv_len=5).logits[0]
    torch.testing.assert_close(out[2], ref_b[4], atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_embedded_logits_match_hf(embedded):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(embedded.path, dtype=torch.float32).eval()
    tok = embedded.tokenizer
    p1 = tok.apply_chat_template([{"role": "user", "content": "Name three colours."}], add_generation_prompt=True,
                                 tokenize=True, return_dict=False)
    p2 = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France? Answer briefly."}],
                                 add_generation_prompt=True, tokenize=True, return_dict=False)
    _check_parity(embedded.path, hf, [list(p1), list(p2)], [[504, 3458, 314], [1345, 28, 1883]], atol=2e-4)
