"""Speculative decoding end to end on tiny models: greedy identity for every drafter and k, cache state
after every step, and losslessness of sampling (chain and tree) against the exact target distribution."""

from __future__ import annotations

import math

import pytest
import torch

from conftest import make_hf_model
from spec_helpers import TableTreeDrafter
from specbench.drafters.draft_model import DraftModelDrafter
from specbench.drafters.ngram import NgramDrafter, lookup
from specbench.engine.loop import Engine, StopCriteria
from specbench.engine.request import Request
from specbench.core.sampling import SamplingParams
from specbench.models.loading import load_model

CPU = torch.device("cpu")
PROMPTS = [[5, 17, 99, 3, 250, 7, 8, 5, 17], [40, 41, 42], [300, 3, 9, 11, 12, 300, 3], [6, 7],
           [100, 101, 102, 103, 104, 105]]


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    return load_model(str(tiny_dir), torch.float32, CPU)


@pytest.fixture(scope="module")
def tiny_draft(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny_draft")
    make_hf_model(d, seed=7, layers=1)
    return load_model(str(d), torch.float32, CPU)


def _requests(prompts=PROMPTS) -> list[Request]:
    return [Request(id=str(i), prompt=f"p{i}", prompt_ids=list(p)) for i, p in enumerate(prompts)]


def _run(lm, drafter=None, k=0, batch_size=1, max_new=16, params=SamplingParams(), seed=0, requests=None,
         engine_cls=Engine):
    e = engine_cls(lm.model, lm.tokenizer, batch_size=batch_size, stop=StopCriteria(frozenset(), max_new),
                   params=params, seed=seed, progress=False, drafter=drafter, k=k)
    return e, e.run(requests or _requests())


def _drafters(tiny, tiny_draft):
    V = tiny.model.config.vocab_size
    return {
        "ngram": lambda: NgramDrafter(min_n=1, max_n=3),
        "draft_model": lambda: DraftModelDrafter(model=tiny_draft.model),
        "draft_model_self": lambda: DraftModelDrafter(model=tiny.model),
        "tree": lambda: TableTreeDrafter(V, width=2),
    }


@pytest.mark.parametrize("name", ["ngram", "draft_model", "draft_model_self", "tree"])
@pytest.mark.parametrize("batch_size", [1, 3])
def test_greedy_is_token_identical(tiny, tiny_draft, name, batch_size):
    _, ref = _run(tiny, max_new=16)
    ref_ids = [r.output_ids for r in ref]
    make = _drafters(tiny, tiny_draft)[name]
    for k in range(1, 6):
        _, res = _run(tiny, make(), k=k, batch_size=batch_size, max_new=16)
        assert [r.output_ids for r in res] == ref_ids, (name, k)
        for r in res:
            assert sum(r.accepted_per_step) + len(r.accepted_per_step) + 1 >= r.num_new_tokens
            assert all(0 <= a <= d <= k for a, d in zip(r.accepted_per_step, r.draft_lens))


def test_self_draft_accepts_everything(tiny):
    """A draft model identical to the target has every draft accepted (greedy, float32)."""
    _, res = _run(tiny, DraftModelDrafter(model=tiny.model), k=4, max_new=21)
    for r in res:
        assert r.accepted_per_step[:-1] == [4] * (len(r.accepted_per_step) - 1)
        assert len(r.accepted_per_step) == 4  # 1 (prefill) + 4 steps of 5 tokens


def test_ngram_lookup():
    assert lookup([5, 6, 7, 8, 5, 6], 3, 1, 2) == [7, 8, 5]
    assert lookup([5, 6, 7, 8, 9, 6], 2, 2, 3) == []  # suffix [9, 6] never occurred
    assert lookup([5, 6, 7, 8, 9, 6], 2, 1, 3) == [7, 8]  # falls back to n = 1
    assert lookup([1, 2, 1, 2, 1, 2], 4, 2, 2) == [1, 2]  # most recent earlier occurrence
    assert lookup([3], 4, 1, 2) == []


class CheckingEngine(Engine):
    """After every step, each running row's target cache (and a draft model's cache) equals a fresh prefill
    of the accepted text."""

    checked = 0

    def _step(self, slots):
        out = super()._step(slots)
        st, m = self.state, self.target
        lens = st.seq_lens.tolist()
        d = self.drafter
        d_lens = d.cache.seq_lens.tolist() if isinstance(d, DraftModelDrafter) else None
        nacc = out[0].num_accepted.tolist()
        tok = out[0].tokens.tolist()
        for b, s in enumerate(slots):
            if s is None:
                continue
            text = st.history[b] + tok[b][: nacc[b]]  # history is extended after the sync
            n = lens[b]
            assert n == len(text)  # committed = everything but the new root
            fresh = m.new_cache(1, n + 1)
            m(torch.tensor([text]), fresh, kv_len=n)
            torch.testing.assert_close(self.cache.k[:, b, :, :n], fresh.k[:, 0, :, :n], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(self.cache.v[:, b, :, :n], fresh.v[:, 0, :, :n], atol=1e-5, rtol=1e-5)
            if d_lens is not None:
                dn = d_lens[b]
                assert 0 < dn <= n
                df = d.model.new_cache(1, dn + 1)
                d.model(torch.tensor([text[:dn]]), df, kv_len=dn)
                torch.testing.assert_close(d.cache.k[:, b, :, :dn], df.k[:, 0, :, :dn], atol=1e-5, rtol=1e-5)
            CheckingEngine.checked += 1
        return out


@pytest.mark.parametrize("name", ["draft_model", "tree"])
def test_caches_equal_fresh_prefill_after_every_step(tiny, tiny_draft, name):
    CheckingEngine.checked = 0
    drafter = _drafters(tiny, tiny_draft)[name]()
    _, res = _run(tiny, drafter, k=3, batch_size=2, max_new=12, engine_cls=CheckingEngine)
    assert CheckingEngine.checked > 10
    assert any(a < 3 for r in res for a in r.accepted_per_step)  # rejections happened


# ------------------------------------------------------------------------------------------ lossless
VOCAB = 8
PROMPT = [3, 5, 1, 6]


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    d = tmp_path_factory.mktemp("v8")
    make_hf_model(d, vocab=VOCAB, seed=3, layers=1, hidden=32, heads=2, kv_heads=1, scale=0.6)
    dd = tmp_path_factory.mktemp("v8d")
    make_hf_model(dd, vocab=VOCAB, seed=11, layers=1, hidden=32, heads=2, kv_heads=1, scale=0.6)
    return load_model(str(d), torch.float32, CPU), load_model(str(dd), torch.float32, CPU)


def _exact_two_token(lm, params: SamplingParams) -> torch.Tensor:
    """Exact target distribution of the first two sampled tokens after PROMPT: [V, V]."""
    from specbench.core.sampling import target_probs

    m = lm.model
    seqs = torch.tensor([PROMPT + [y] for y in range(VOCAB)])
    with torch.inference_mode():
        lg = m(seqs, m.new_cache(VOCAB, 8), kv_len=len(PROMPT) + 1).logits  # [V, P+1, V]
    p1 = target_probs(lg[0, len(PROMPT) - 1], params)  # [V]
    p2 = target_probs(lg[:, len(PROMPT)], params)  # [V, V]
    return p1[:, None] * p2


def _empirical(lm, drafter, k, params, n_runs=48, batch=64) -> torch.Tensor:
    counts = torch.zeros(VOCAB, VOCAB)
    for seed in range(n_runs):
        reqs = [Request(id=str(i), prompt="", prompt_ids=list(PROMPT)) for i in range(batch)]
        _, res = _run(lm, drafter, k=k, batch_size=batch, max_new=2, params=params, seed=seed, requests=reqs)
        for r in res:
            counts[r.output_ids[0], r.output_ids[1]] += 1
    return counts


def _chi2_stat(counts: torch.Tensor, p: torch.Tensor) -> tuple[float, int]:
    """Pearson chi-square over cells, pooling cells with expected count < 5 into one."""
    n = counts.sum()
    e, c = (p * n).flatten(), counts.flatten()
    assert c[e == 0].sum() == 0, "a token outside the target's support (top-p nucleus) was emitted"
    c, e = c[e > 0], e[e > 0]
    big = e >= 5
    stat = (((c[big] - e[big]) ** 2) / e[big]).sum().item()
    dof = int(big.sum().item()) - 1
    if (~big).any():
        es, cs = e[~big].sum(), c[~big].sum()
        stat += ((cs - es) ** 2 / es).item()
        dof += 1
    return stat, dof


def _chi2_critical(dof: int, z: float = 3.09) -> float:
    """Wilson-Hilferty approximation of the chi-square quantile (z = 3.09: p = 0.001)."""
    a = 2.0 / (9 * dof)
    return dof * (1 - a + z * math.sqrt(a)) ** 3


@pytest.mark.parametrize("kind", ["chain_draft_model", "tree", "ngram_point_mass"])
@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_sampling_is_lossless(small, kind, top_p):
    target, draft = small
    params = SamplingParams(temperature=0.9, top_p=top_p)
    drafter = {"chain_draft_model": lambda: DraftModelDrafter(model=draft.model),
               "tree": lambda: TableTreeDrafter(VOCAB, width=2, seed=5, sharpness=1.5),
               "ngram_point_mass": lambda: NgramDrafter(min_n=1, max_n=2)}[kind]()
    exact = _exact_two_token(target, params)
    counts = _empirical(target, drafter, 3, params)
    stat, dof = _chi2_stat(counts, exact)
    assert stat < _chi2_critical(dof), (stat, dof)


def test_chi2_detects_a_broken_rule(small, monkeypatch):
    """Control: recovering from p instead of the residual norm(max(p - q, 0)) is biased, and the test sees it."""
    import specbench.engine.loop as loop
    import specbench.verify as vf

    target, draft = small
    params = SamplingParams(temperature=0.9)

    def broken(tree, logits, params, gen, rule="auto", **kw):
        probs = vf.target_probs(logits, params)

        def accept(p, q, x, u):
            px, qx = p.gather(1, x[:, None])[:, 0], q.gather(1, x[:, None])[:, 0]
            return u * qx < px

        return vf._descend(tree, probs, accept, gen, lossless=False)

    monkeypatch.setattr(loop, "verify", broken)
    exact = _exact_two_token(target, params)
    counts = _empirical(target, DraftModelDrafter(model=draft.model), 3, params)
    stat, dof = _chi2_stat(counts, exact)
    assert stat > _chi2_critical(dof), (stat, dof)
