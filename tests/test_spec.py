"""Speculative decoding end to end on tiny models: greedy identity for every drafter and k, an oracle tree with
planned ragged acceptance, cache state after every step (losslessness of sampling: test_lossless.py)."""

from __future__ import annotations

import pytest
import torch

from conftest import make_hf_model
from spec_helpers import OracleTreeDrafter, TableTreeDrafter
from specbench.drafters.draft_model import DraftModelDrafter
from specbench.drafters.ngram import NgramDrafter, lookup
from specbench.engine.loop import Engine, StopCriteria
from specbench.core.request import Request
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
        # dynamic draft length: thresholds near the median draft probability of these random models (~0.013 /
        # ~0.016 over a 384-token vocabulary), so steps draft 1..k tokens
        "draft_model_stop": lambda: DraftModelDrafter(model=tiny_draft.model, stop_below=0.013),
        "draft_model_self_stop": lambda: DraftModelDrafter(model=tiny.model, stop_below=0.016),
        # static token trees: two siblings at depths 1 and 2 (5 depths: k up to 5)
        "draft_model_tree": lambda: DraftModelDrafter(model=tiny_draft.model, tree=[2, 2, 1, 1, 1]),
        "draft_model_self_tree": lambda: DraftModelDrafter(model=tiny.model, tree=[2, 2, 1, 1, 1]),
        # EAGLE-2 dynamic trees: 6 of the 2 + 4(k-1) candidates (k = 1: 2 of 2), and all of them (these flat random
        # models' best 6 never reach depth 3; with all, the self-draft's greedy path is kept unless a depth-1
        # runner-up's children outrank it at depth 2)
        "draft_model_dynamic": lambda: DraftModelDrafter(model=tiny_draft.model, dynamic={"topk": 2, "num_draft_tokens": 6}),
        "draft_model_self_dynamic": lambda: DraftModelDrafter(model=tiny.model, dynamic={"topk": 2, "num_draft_tokens": None}),
        "tree": lambda: TableTreeDrafter(V, width=2),
    }


@pytest.mark.parametrize("name", ["ngram", "draft_model", "draft_model_self", "draft_model_stop",
                                  "draft_model_self_stop", "draft_model_tree", "draft_model_self_tree",
                                  "draft_model_dynamic", "draft_model_self_dynamic", "tree"])
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


@pytest.mark.parametrize("batch_size", [1, 3])
def test_dynamic_draft_length(tiny, batch_size):
    """stop_below with the target as its own draft: every drafted token is accepted, so each step accepts exactly
    the length its row drafted; lengths 1..4 all occur, a row's lengths do not depend on its batch-mates, and the
    output is token-identical to target-only decoding."""
    _, ref = _run(tiny, max_new=21)
    _, alone = _run(tiny, DraftModelDrafter(model=tiny.model, stop_below=0.016), k=4, max_new=21)
    _, res = _run(tiny, DraftModelDrafter(model=tiny.model, stop_below=0.016), k=4, batch_size=batch_size,
                  max_new=21)
    assert [r.output_ids for r in res] == [r.output_ids for r in ref]
    lens = [n for r in res for n in r.draft_lens]
    assert {lens.count(n) > 0 for n in range(1, 5)} == {True}, lens
    for r, a in zip(res, alone):
        assert r.accepted_per_step[:-1] == r.draft_lens[:-1]  # the last step may stop at the length budget
        assert r.draft_lens == a.draft_lens  # batch-invariant
    _, fixed = _run(tiny, DraftModelDrafter(model=tiny.model), k=4, max_new=21)
    assert sum(len(r.draft_lens) for r in fixed) < len(lens)  # shorter drafts: more steps for the same text


def test_stop_below_is_validated():
    from specbench.errors import UserError

    for bad in (0, 1, 1.5, -0.1, "high"):
        with pytest.raises(UserError, match=r"method.drafter.stop_below=.*must be in \(0, 1\)"):
            DraftModelDrafter(model=object(), stop_below=bad)


@pytest.mark.parametrize("batch_size", [1, 3])
def test_oracle_tree_ragged_acceptance(tiny, batch_size):
    """A top-2 tree from the target itself with planned breaks: greedy output is token-identical, every step
    accepts exactly the planned length, and at batch 3 rows accept different lengths in the same step,
    including full depth-k paths through the second sibling (scattered slots compacted in the cache)."""
    k = 4
    prompts = PROMPTS[:3] + [[7, 8, 9, 10], [250, 251]]  # 5 requests in 3 rows: refills mid-run
    _, ref = _run(tiny, max_new=30, requests=_requests(prompts))
    oracle = OracleTreeDrafter(tiny.model)
    _, res = _run(tiny, oracle, k=k, batch_size=batch_size, max_new=30, requests=_requests(prompts))
    assert [r.output_ids for r in res] == [r.output_ids for r in ref]
    assert len(oracle.plans) >= 20
    assert all(planned == acc for step in oracle.plans for planned, acc in step)
    accepted = [acc for step in oracle.plans for _, acc in step]
    assert set(accepted) == set(range(k + 1))  # every length 0..k occurred, k (a whole path) included
    if batch_size == 3:
        assert sum(len({acc for _, acc in step}) >= 3 for step in oracle.plans) >= 5  # ragged within a step


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
        d = getattr(self.drafter, "inner", self.drafter)  # under method.lookup, the drafter it wraps
        d_lens = d.cache.seq_lens.tolist() if isinstance(d, DraftModelDrafter) else None
        nacc = out[0].num_accepted.tolist()
        tok = out[0].tokens.tolist()
        for b, s in enumerate(slots):
            if s is None:
                continue
            text = s.request.prompt_ids + s.output_ids + tok[b][: nacc[b]]  # outputs are extended after the sync
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


@pytest.mark.parametrize("name", ["draft_model", "draft_model_self_stop", "draft_model_tree",
                                  "draft_model_self_tree", "draft_model_dynamic", "draft_model_self_dynamic", "tree"])
def test_caches_equal_fresh_prefill_after_every_step(tiny, tiny_draft, name):
    CheckingEngine.checked = 0
    drafter = _drafters(tiny, tiny_draft)[name]()
    _, res = _run(tiny, drafter, k=3, batch_size=2, max_new=12, engine_cls=CheckingEngine)
    assert CheckingEngine.checked > 10
    steps = [a for r in res for a in r.accepted_per_step[:-1]]
    if name == "draft_model_self_tree":  # the target drafting for itself: whole paths every step
        assert all(a == 3 for a in steps)
    elif name == "draft_model_self_dynamic":  # whole paths in most steps (14 of 15 when written)
        assert sum(a == 3 for a in steps) >= 0.8 * len(steps), steps
    else:
        assert any(a < 3 for r in res for a in r.accepted_per_step)  # rejections happened


# ------------------------------------------------------------------------------- stop conditions
def _stop_run(lm, drafter, k, **stop):
    e = Engine(lm.model, lm.tokenizer, batch_size=2, params=SamplingParams(), progress=False, drafter=drafter, k=k,
               stop=StopCriteria(frozenset(stop.get("eos", ())), stop.get("max_new", 24), tuple(stop.get("strings", ()))))
    return e.run(_requests())


def _same_as_target_only(spec, ref):
    for s, r in zip(spec, ref):
        assert (s.output_ids, s.text, s.finish_reason) == (r.output_ids, r.text, r.finish_reason)
        assert sum(s.chunk_sizes) == s.num_new_tokens - 1  # every kept token after the first, none past a stop


def test_stop_string_inside_an_accepted_chunk(tiny):
    """The self-draft accepts all k = 4 drafts, so chunks are output tokens 1-5, 6-10, ...; a stop string
    completed by output token 7 sits mid-chunk and everything after it must go, as target-only decoding does."""
    free = _stop_run(tiny, None, 0)[0]
    stop = tiny.tokenizer.decode(free.output_ids[:8])[-2:]
    ref = _stop_run(tiny, None, 0, strings=[stop])
    assert ref[0].finish_reason == "stop" and 1 < ref[0].num_new_tokens <= 8  # stops by token 7 at the latest
    spec = _stop_run(tiny, DraftModelDrafter(model=tiny.model), 4, strings=[stop])
    assert max(a for r in spec for a in r.accepted_per_step) == 4
    _same_as_target_only(spec, ref)


def test_eos_and_budget_inside_an_accepted_chunk(tiny):
    """EOS at output token 7 (mid-chunk) and a 13-token budget (mid-chunk): trimmed exactly as target-only."""
    free = _stop_run(tiny, None, 0)
    eos = free[0].output_ids[7]
    for stop in ({"eos": [eos]}, {"max_new": 13}, {"eos": [eos], "max_new": 7}):
        ref = _stop_run(tiny, None, 0, **stop)
        spec = _stop_run(tiny, DraftModelDrafter(model=tiny.model), 4, **stop)
        _same_as_target_only(spec, ref)
        assert all(r.num_new_tokens <= stop.get("max_new", 24) for r in spec)


# ---------------------------------------------------------------------------- reproducibility
@pytest.mark.parametrize("name", ["ngram", "draft_model", "tree"])
def test_sampled_output_depends_on_the_request_only(tiny, tiny_draft, name):
    """Per-request generators: a request's sampled continuation is the same alone, in a batch of 3 and next
    to other requests (n-gram trees are as wide as the widest row, so a shared stream would shift)."""
    params = SamplingParams(temperature=0.8, top_p=0.95)
    make = _drafters(tiny, tiny_draft)[name]
    reqs = _requests()

    def outputs(requests, batch_size):
        _, res = _run(tiny, make(), k=3, batch_size=batch_size, max_new=16, params=params, seed=5, requests=requests)
        return {r.request.id: r.output_ids for r in res}

    alone = {r.id: outputs([r], 1)[r.id] for r in reqs[:3]}
    assert outputs(reqs, 3) == {**outputs(reqs, 1)} and {i: outputs(reqs, 3)[i] for i in alone} == alone
    assert outputs([reqs[4], reqs[0], reqs[3]], 2)["0"] == alone["0"]
    assert len({tuple(v) for v in alone.values()}) == 3  # different requests, different streams
    _, other_seed = _run(tiny, make(), k=3, batch_size=1, max_new=16, params=params, seed=6, requests=reqs[:1])
    assert other_seed[0].output_ids != alone["0"]


class SiblingEngine(Engine):
    """Counts steps whose accepted depth-1 node was not the draft's first choice (node 0)."""

    later = 0

    def _step(self, slots):
        out = super()._step(slots)
        SiblingEngine.later += int((out[0].accepted_nodes[:, 0] > 0).sum())
        return out


def test_draft_tree_accepts_through_later_siblings(tiny, tiny_draft):
    """Eight depth-1 siblings from a draft that mostly misses: some steps accept its 2nd-8th choice, and the tree
    accepts more per step than the chain over the same (greedy, identical) text."""
    _, chain = _run(tiny, DraftModelDrafter(model=tiny_draft.model), k=3, batch_size=2, max_new=30)
    SiblingEngine.later = 0
    _, tree = _run(tiny, DraftModelDrafter(model=tiny_draft.model, tree=[8, 1, 1]), k=3, batch_size=2, max_new=30,
                   engine_cls=SiblingEngine)
    assert [r.output_ids for r in tree] == [r.output_ids for r in chain]
    assert SiblingEngine.later >= 3

    def tau(res):
        return 1 + sum(sum(r.accepted_per_step) for r in res) / sum(len(r.accepted_per_step) for r in res)

    assert tau(tree) > tau(chain)


def test_tree_is_validated(tiny):
    from specbench.errors import UserError

    for bad in ([], [2, 0], [1.5], "wide"):
        with pytest.raises(UserError, match=r"method.drafter.tree=.*children per depth"):
            DraftModelDrafter(model=object(), tree=bad)
    with pytest.raises(UserError, match=r"stop_below=0.3 applies to chains"):
        DraftModelDrafter(model=object(), tree=[2, 1], stop_below=0.3)
    with pytest.raises(UserError, match=r"tree=\[2, 1\] has 2 depths; k=3 needs k"):
        _run(tiny, DraftModelDrafter(model=tiny.model, tree=[2, 1]), k=3)


class TreeSpy(Engine):
    """Records each step's drafted tree with every row's text through the root (prompt + outputs so far)."""

    seen: list = []

    def _step(self, slots):
        texts = [None if s is None else s.request.prompt_ids + s.output_ids for s in slots]
        propose = self.drafter.propose

        def spy(state):
            tree = propose(state)
            TreeSpy.seen.append((texts, tree))
            return tree

        self.drafter.propose = spy
        try:
            return super()._step(slots)
        finally:
            del self.drafter.propose


def test_dynamic_tree_keeps_the_best_candidates(tiny, tiny_draft):
    """EAGLE-2's selection recomputed by brute force with plain causal forwards of every path (no tree mask, no
    scratch slots): each step's verified nodes are the 8 best of the 3 + 2·9 candidates by cumulative draft
    log-prob, frontiers the 3 best of each depth; with every candidate verified (these flat random models' best 8
    rarely reach depth 3) the depth-3 tokens check the frontier forwards' masks and positions. The same text as
    the chain's, with more accepted per step."""
    f, k = 3, 3

    def log_q(ids):
        return torch.log_softmax(tiny_draft.model(torch.tensor([ids]), None).logits[0, -1].float(), -1)

    def tau(res):
        return 1 + sum(sum(r.accepted_per_step) for r in res) / sum(len(r.accepted_per_step) for r in res)

    _, chain = _run(tiny, DraftModelDrafter(model=tiny_draft.model), k=k, batch_size=2, max_new=20)
    for N in (8, None):
        TreeSpy.seen = []
        _, dyn = _run(tiny, DraftModelDrafter(model=tiny_draft.model, dynamic={"topk": f, "num_draft_tokens": N}),
                      k=k, batch_size=2, max_new=20, engine_cls=TreeSpy)
        assert [r.output_ids for r in dyn] == [r.output_ids for r in chain]
        assert tau(dyn) > tau(chain)
        checked = 0
        with torch.inference_mode():
            for texts, tree in TreeSpy.seen:
                for b, text in enumerate(texts):
                    if text is None:
                        continue
                    v, x = log_q(text).topk(f)
                    front = [((t,), p) for t, p in zip(x.tolist(), v.tolist())]
                    pool = list(front)
                    for d in range(1, k):
                        kids = []
                        for path, p in front:
                            v, x = log_q(text + list(path)).topk(f)
                            kids += [(path + (t,), p + c) for t, c in zip(x.tolist(), v.tolist())]
                        pool += kids
                        front = sorted(kids, key=lambda c: -c[1])[:f]
                    ranked = sorted(pool, key=lambda c: (-c[1], len(c[0])))
                    n = N or len(pool)
                    if n < len(pool) and ranked[n - 1][1] - ranked[n][1] < 1e-4:
                        continue  # a near tie at the cut: either choice is right
                    toks, par = tree.tokens[b].tolist(), tree.parents[b].tolist()
                    paths = []
                    for i in range(n):
                        paths.append((paths[par[i]] if par[i] >= 0 else ()) + (toks[i],))
                    assert set(paths) == {c[0] for c in ranked[:n]}
                    checked += 1
        assert checked >= 10


def test_dynamic_tree_is_validated(tiny):
    from specbench.errors import UserError

    for bad in ({"topk": 0, "num_draft_tokens": 4}, {"topk": 2, "num_draft_tokens": 0}, {"topk": "2"}):
        with pytest.raises(UserError, match=r"method.tree=.*integers >= 1"):
            DraftModelDrafter(model=object(), dynamic=bad)
    with pytest.raises(UserError, match=r"method.drafter.tree=\[2, 1\] and the dynamic tree"):
        DraftModelDrafter(model=object(), tree=[2, 1], dynamic={"topk": 2, "num_draft_tokens": 4})
    with pytest.raises(UserError, match=r"stop_below=0.3 and the dynamic tree"):
        DraftModelDrafter(model=object(), stop_below=0.3, dynamic={"topk": 2, "num_draft_tokens": 4})
    d = DraftModelDrafter(model=object(), dynamic={"topk": None, "num_draft_tokens": None})  # the config default
    assert not d.is_tree and d.max_nodes(4) == 4
    assert DraftModelDrafter(model=object(), dynamic={"topk": 4, "num_draft_tokens": None}).max_nodes(4) == 4 + 3 * 16
