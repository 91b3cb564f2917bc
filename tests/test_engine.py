"""The decode loop: greedy equals HF generate, batching changes nothing, stop conditions, sampling."""

from __future__ import annotations

import pytest
import torch

from specbench.engine.loop import Engine, StopCriteria
from specbench.core.request import Request
from specbench.core.sampling import SamplingParams, sample_from, target_probs
from specbench.errors import UserError
from specbench.models.loading import load_model

CPU = torch.device("cpu")
PROMPTS = [[5, 17, 99, 3, 250, 7, 8], [40, 41, 42], [300, 2 + 1, 9, 11, 12], [6, 7], [100, 101, 102, 103, 104, 105]]


def _requests(prompts=PROMPTS) -> list[Request]:
    return [Request(id=str(i), prompt=f"p{i}", prompt_ids=list(p)) for i, p in enumerate(prompts)]


def _engine(lm, batch_size=1, max_new=12, eos=(), stop=(), params=SamplingParams(), seed=0) -> Engine:
    return Engine(lm.model, lm.tokenizer, batch_size=batch_size,
                  stop=StopCriteria(frozenset(eos), max_new, tuple(stop)), params=params, seed=seed, progress=False)


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    return load_model(str(tiny_dir), torch.float32, CPU)


def _hf_greedy(folder, prompts, n, eos=None):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    outs = []
    for p in prompts:
        ids = torch.tensor([p])
        g = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                        eos_token_id=eos, pad_token_id=0)
        outs.append(g[0, len(p):].tolist())
    return outs


def test_greedy_matches_hf_generate(tiny, tiny_dir):
    res = _engine(tiny, max_new=12).run(_requests())
    assert [r.output_ids for r in res] == _hf_greedy(tiny_dir, PROMPTS, 12, eos=None)
    assert all(r.finish_reason == "length" and r.num_new_tokens == 12 for r in res)


@pytest.mark.parametrize("batch_size", [2, 3, 8])
def test_batching_is_invisible(tiny, batch_size):
    """Slot batching (rows at different lengths, refilled as requests finish) gives batch-1 outputs."""
    ref = [r.output_ids for r in _engine(tiny, 1, max_new=10).run(_requests())]
    got = [r.output_ids for r in _engine(tiny, batch_size, max_new=10).run(_requests())]
    assert got == ref


def test_eos_stops_and_frees_the_slot(tiny):
    free_run = _engine(tiny, max_new=12).run(_requests())
    eos = free_run[0].output_ids[4]  # a token request 0 emits at position 4
    res = _engine(tiny, 2, max_new=12, eos=[eos]).run(_requests())
    r0 = res[0]
    assert r0.finish_reason == "eos" and r0.output_ids == free_run[0].output_ids[: free_run[0].output_ids.index(eos) + 1]
    for r, ref in zip(res, free_run):  # every other request is unaffected or stops at its own eos
        cut = ref.output_ids.index(eos) + 1 if eos in ref.output_ids else len(ref.output_ids)
        assert r.output_ids == ref.output_ids[:cut]


def test_stop_string(tiny):
    free_run = _engine(tiny, max_new=12).run(_requests()[:1])[0]
    text = tiny.tokenizer.decode(free_run.output_ids[:6])
    stop = text[-3:] if len(text.strip()) >= 3 else text
    r = _engine(tiny, max_new=12, stop=[stop]).run(_requests()[:1])[0]
    assert r.finish_reason == "stop" and stop not in r.text and len(r.output_ids) <= 6


def test_prompt_longer_than_context(tiny):
    too_long = [Request(id="x", prompt="x", prompt_ids=[5] * tiny.model.config.max_position_embeddings)]
    with pytest.raises(UserError, match="context"):
        _engine(tiny).run(too_long)


def test_context_end_stops_generation(tiny):
    ctx = tiny.model.config.max_position_embeddings
    r = _engine(tiny, max_new=100).run([Request(id="x", prompt="x", prompt_ids=[5] * (ctx - 4))])[0]
    assert r.finish_reason == "length" and r.num_new_tokens == 4


def test_batch_size_must_be_positive(tiny):
    with pytest.raises(UserError, match="batch_size=0"):
        _engine(tiny, batch_size=0)


def test_sampling_is_seeded(tiny):
    p = SamplingParams(temperature=1.0, top_p=0.9)
    a = [r.output_ids for r in _engine(tiny, 2, params=p, seed=3).run(_requests())]
    b = [r.output_ids for r in _engine(tiny, 2, params=p, seed=3).run(_requests())]
    c = [r.output_ids for r in _engine(tiny, 2, params=p, seed=4).run(_requests())]
    assert a == b and a != c


def test_top_p_nucleus():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    p = target_probs(logits, SamplingParams(temperature=1.0, top_p=0.75))
    torch.testing.assert_close(p, torch.tensor([0.625, 0.375, 0.0, 0.0]))  # 0.5 + 0.3 crosses 0.75
    p = target_probs(logits, SamplingParams(temperature=1.0, top_p=0.5))
    torch.testing.assert_close(p, torch.tensor([1.0, 0.0, 0.0, 0.0]))


def test_top_k_then_top_p():
    logits = torch.log(torch.tensor([0.1, 0.4, 0.3, 0.2]))
    p = target_probs(logits, SamplingParams(temperature=1.0, top_k=2))
    torch.testing.assert_close(p, torch.tensor([0.0, 4 / 7, 3 / 7, 0.0]))  # 0.4 and 0.3 renormalised
    p = target_probs(logits, SamplingParams(temperature=1.0, top_k=3, top_p=0.5))  # 0.4/0.9 < 0.5: two kept
    torch.testing.assert_close(p, torch.tensor([0.0, 4 / 7, 3 / 7, 0.0]))
    p = target_probs(logits, SamplingParams(temperature=1.0, top_k=4))
    torch.testing.assert_close(p, torch.tensor([0.1, 0.4, 0.3, 0.2]))


def test_exponential_race_samples_the_distribution():
    """Chi-square goodness of fit of sample_from against the distribution it is given."""
    probs = torch.tensor([0.4, 0.25, 0.2, 0.1, 0.05])
    n = 40000
    gen = torch.Generator().manual_seed(0)
    draws = sample_from(probs.expand(n, -1).contiguous(), gen)
    counts = torch.bincount(draws, minlength=5).double()
    expected = probs.double() * n
    chi2 = ((counts - expected) ** 2 / expected).sum().item()
    assert chi2 < 18.5  # chi-square, 4 dof, p = 0.001
    skewed = torch.tensor([0.45, 0.2, 0.2, 0.1, 0.05]).double() * n  # the test detects a 5-point shift
    assert ((counts - skewed) ** 2 / skewed).sum().item() > 18.5


@pytest.mark.slow
def test_embedded_greedy_matches_hf_generate(embedded):
    from transformers import AutoModelForCausalLM

    from specbench.data.prompts import builtin_prompts, to_requests

    tok = embedded.tokenizer
    reqs = to_requests(builtin_prompts()[::5][:3], tok)
    n = 40
    res = Engine(embedded.model, tok, batch_size=2, stop=StopCriteria(frozenset({tok.eos_token_id}), n),
                 params=SamplingParams(), progress=False).run(reqs)
    hf = AutoModelForCausalLM.from_pretrained(embedded.path, dtype=torch.float32).eval()
    for req, r in zip(reqs, res):
        ids = torch.tensor([req.prompt_ids])
        g = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                        eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id)
        assert r.output_ids == g[0, ids.shape[1]:].tolist(), req.prompt
