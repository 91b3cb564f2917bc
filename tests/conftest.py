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
