"""Losslessness of speculative sampling over whole continuations, against the exact target distribution.

A 4-token vocabulary target, continuations of L = k + 2 = 5 tokens (the bonus token after a fully accepted
depth-3 chain lies inside the window), every one of the 4^5 sequences' exact probability enumerated from the
target. Pearson chi-square over the sequences (cells expected below 5 pooled), against the chi-square quantile
at p = 1e-6 (Wilson-Hilferty): a correct rule fails this test with probability below 1e-6 by construction.
Each drafter that supplies q (draft model, with a dynamic length too, EAGLE-3 chain and tree, MLP speculator chain) and point-mass ones (n-gram, a Medusa static
tree) is tested,
and for each a broken rule (recovering from p instead of the residual norm(max(p - q, 0))) must be caught.
"""

from __future__ import annotations

import itertools
import json
import math

import pytest
import torch

from conftest import make_eagle_head, make_hf_model, make_medusa_head, make_mlp_speculator
from spec_helpers import TableTreeDrafter
from specbench.core.sampling import SamplingParams, target_probs
from specbench.drafters.draft_model import DraftModelDrafter
from specbench.drafters.eagle import EagleDrafter
from specbench.drafters.medusa import MedusaDrafter
from specbench.drafters.mlp_speculator import MLPSpeculatorDrafter
from specbench.drafters.ngram import LookupUnion, NgramDrafter
from specbench.engine.loop import Engine, StopCriteria
from specbench.core.request import Request
from specbench.models.loading import load_model

CPU = torch.device("cpu")
V, K, L = 4, 3, 5  # vocabulary, draft depth, continuation length (= K + 2)
PROMPT = [3, 1, 0, 2, 1, 3, 1]
# for the `*_lookup` cases: the suffix [3, 3] recurs, so lookup proposes what this target is likely to say next
# (3s) and grafted nodes are accepted in 12-30 % of steps (`test_lookup_grafts_are_tried_under_sampling`)
LOOKUP_PROMPT = [0, 3, 3, 3, 1, 0, 3, 3]
RUNS, BATCH = 120, 256  # 30,720 sampled continuations per case
Z_1E6 = 4.753  # standard normal quantile for a one-sided p of 1e-6


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    t, d, h, m, s = (tmp_path_factory.mktemp(n) for n in ("v4t", "v4d", "v4h", "v4m", "v4s"))
    make_hf_model(t, vocab=V, seed=3, layers=1, hidden=32, heads=2, kv_heads=1, scale=1.5)
    make_hf_model(d, vocab=V, seed=11, layers=1, hidden=32, heads=2, kv_heads=1, scale=1.5)
    make_eagle_head(h, json.loads((t / "config.json").read_text()), version=3, aux_ids=[0, 1, 1], seed=4,
                    scale=0.5, fmt="specforge", draft_vocab=3)  # a reduced draft vocabulary: q lives on 3 of 4
    make_medusa_head(m, json.loads((t / "config.json").read_text()), heads=3, layout="vllm", lm_head="own", seed=2,
                     scale=1.0)
    make_mlp_speculator(s, json.loads((t / "config.json").read_text()), n_predict=3, inner_dim=24, seed=6, scale=1.5)
    return load_model(str(t), torch.float32, CPU), load_model(str(d), torch.float32, CPU), str(h), str(m), str(s)


def exact_distribution(lm, params: SamplingParams, prompt=PROMPT) -> torch.Tensor:
    """[V^L] probability of every continuation (lexicographic order), from one batched forward."""
    prefixes = torch.tensor(list(itertools.product(range(V), repeat=L - 1)))  # [V^(L-1), L-1]
    inp = torch.cat([torch.tensor(prompt).expand(len(prefixes), -1), prefixes], 1)
    with torch.inference_mode():
        probs = target_probs(lm.model(inp, None).logits[:, len(prompt) - 1:], params)  # [V^(L-1), L, V]
    seqs = torch.tensor(list(itertools.product(range(V), repeat=L)))  # [V^L, L]
    row = (seqs[:, : L - 1] * torch.tensor([V ** (L - 2 - i) for i in range(L - 1)])).sum(1)
    p = torch.ones(len(seqs), dtype=torch.float64)
    for t in range(L):
        p *= probs[row, t, seqs[:, t]].double()
    return p


def sampled_counts(lm, make_drafter, params: SamplingParams, prompt=PROMPT) -> torch.Tensor:
    counts = torch.zeros(V ** L, dtype=torch.float64)
    weights = torch.tensor([V ** (L - 1 - i) for i in range(L)])
    for seed in range(RUNS):
        reqs = [Request(id=str(i), prompt="", prompt_ids=list(prompt)) for i in range(BATCH)]
        e = Engine(lm.model, lm.tokenizer, batch_size=BATCH, stop=StopCriteria(frozenset(), L), params=params,
                   seed=seed, progress=False, drafter=make_drafter(), k=K)
        outs = torch.tensor([r.output_ids for r in e.run(reqs)])
        counts += torch.bincount((outs * weights).sum(1), minlength=V ** L).double()
    return counts


def chi2(counts: torch.Tensor, p: torch.Tensor) -> tuple[float, float]:
    """(Pearson statistic, critical value at p = 1e-6), cells expected below 5 pooled into one."""
    n = counts.sum()
    e = p * n
    assert counts[p == 0].sum() == 0, "a continuation outside the target's support was emitted"
    counts, e = counts[p > 0], e[p > 0]
    big = e >= 5
    stat = float((((counts[big] - e[big]) ** 2) / e[big]).sum())
    dof = int(big.sum()) - 1
    if (~big).any():
        es, cs = float(e[~big].sum()), float(counts[~big].sum())
        stat += (cs - es) ** 2 / es
        dof += 1
    a = 2.0 / (9 * dof)
    return stat, dof * (1 - a + Z_1E6 * math.sqrt(a)) ** 3


REDUCED = torch.tensor([0, 1, 3])


def _reduced(model, ids):
    import copy

    from specbench.models.shared_draft import restrict_head

    m = copy.deepcopy(model)
    return restrict_head(m, m.output.weight, ids)


def _cases(models):
    target, draft, head, medusa, mlp = models
    return {
        "draft_model_chain": lambda: DraftModelDrafter(model=draft.model),
        # dynamic draft length: at 0.3 a third of the drafts stop at 1 token, a third run to k = 3
        "draft_model_stop": lambda: DraftModelDrafter(model=draft.model, stop_below=0.3),
        # a static tree from the draft model: 2 siblings at depths 1 and 2 (Gumbel top-2 without replacement)
        "draft_model_tree": lambda: DraftModelDrafter(model=draft.model, tree=[2, 2, 1]),
        "draft_model_reduced_tree": lambda: DraftModelDrafter(model=_reduced(draft.model, REDUCED), vocab_ids=REDUCED,
                                                              tree=[2, 1, 1]),
        # an EAGLE-2 dynamic tree from the draft model: 5 of the 2 + 2·4 candidates
        "draft_model_dynamic": lambda: DraftModelDrafter(model=draft.model, dynamic={"topk": 2, "num_draft_tokens": 5}),
        # a reduced head (the compact shared-table form's d2t): q lives on 3 of 4 tokens
        "draft_model_reduced": lambda: DraftModelDrafter(model=_reduced(draft.model, REDUCED), vocab_ids=REDUCED),
        "eagle3_chain": lambda: EagleDrafter(path=head),
        # this head is sharp: at 0.9 about a quarter of its chains stop before k = 3
        "eagle3_chain_stop": lambda: EagleDrafter(path=head, stop_below=0.9),
        "eagle3_tree": lambda: EagleDrafter(path=head, tree={"topk": 2, "num_draft_tokens": 5}),
        "ngram_point_mass": lambda: NgramDrafter(min_n=1, max_n=2),
        "table_tree": lambda: TableTreeDrafter(V, width=2, seed=5, sharpness=1.5),
        # a static tree of point-mass top-k picks: 2 children at depth 1 and 2, depth 3
        "mlp_speculator_chain": lambda: MLPSpeculatorDrafter(path=mlp),  # sampled stages carry q
        "mlp_speculator_tree": lambda: MLPSpeculatorDrafter(path=mlp, tree={"top_k": [2, 2, 1], "n_candidates": 3}),
        "medusa_tree": lambda: MedusaDrafter(path=medusa, tree=[[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]),
        # prompt lookup grafted (LOOKUP_PROMPT) onto trees with q, a point-mass node after its sampled siblings,
        # and onto a chain
        "draft_model_dynamic_lookup": lambda: LookupUnion(
            DraftModelDrafter(model=draft.model, dynamic={"topk": 2, "num_draft_tokens": 4}), 1, 2),
        "table_tree_lookup": lambda: LookupUnion(TableTreeDrafter(V, width=2, seed=5, sharpness=1.5), 1, 2),
        "eagle3_chain_lookup": lambda: LookupUnion(EagleDrafter(path=head), 1, 2),
        # lookup deeper than the drafter: the head drafts 1 token, lookup's chain K
        "eagle3_chain_deep_lookup": lambda: LookupUnion(EagleDrafter(path=head), 1, 2, drafter_k=1),
    }


def _broken_verify(tree, logits, params, gen, rule="auto", draws=None, **kw):
    """Accepts like the real rule, but after a rejection recovers from p instead of norm(max(p - q, 0))."""
    import specbench.verify as vf

    probs = vf.target_probs(logits, params)

    def accept(p, q, x, u):
        px = p.gather(1, x[:, None])[:, 0]
        qx = q.gather(1, x[:, None])[:, 0] if q is not None else torch.ones_like(px)
        return u * qx < px

    return vf._descend(tree, probs, accept, gen, lossless=False, draws=draws)


CASES = ["draft_model_chain", "draft_model_stop", "draft_model_tree", "draft_model_reduced_tree", "draft_model_dynamic",
         "draft_model_reduced", "eagle3_chain", "eagle3_chain_stop",
         "eagle3_tree", "ngram_point_mass", "table_tree", "medusa_tree", "mlp_speculator_chain", "mlp_speculator_tree",
         "draft_model_dynamic_lookup", "table_tree_lookup", "eagle3_chain_lookup", "eagle3_chain_deep_lookup"]


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_whole_continuations_are_lossless(models, case):
    target = models[0]
    params = SamplingParams(temperature=0.9)
    prompt = LOOKUP_PROMPT if case.endswith("_lookup") else PROMPT
    stat, crit = chi2(sampled_counts(target, _cases(models)[case], params, prompt),
                      exact_distribution(target, params, prompt))
    print(f"{case}: chi2 {stat:.0f} < {crit:.0f}")
    assert stat < crit, (case, stat, crit)


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_broken_rule_is_caught(models, case, monkeypatch):
    import specbench.engine.loop as loop

    monkeypatch.setattr(loop, "verify", _broken_verify)
    target = models[0]
    params = SamplingParams(temperature=0.9)
    prompt = LOOKUP_PROMPT if case.endswith("_lookup") else PROMPT
    stat, crit = chi2(sampled_counts(target, _cases(models)[case], params, prompt),
                      exact_distribution(target, params, prompt))
    print(f"{case} broken: chi2 {stat:.0f} > {crit:.0f}")
    assert stat > crit, (case, stat, crit)


def test_lookup_grafts_are_tried_under_sampling(models):
    """The `*_lookup` cases above test grafted nodes: on LOOKUP_PROMPT lookup grafts a path most steps and the
    target accepts grafted tokens in a good share of them (so the chi-square cases exercise the point-mass rule)."""
    params = SamplingParams(temperature=0.9)
    for case in ("draft_model_dynamic_lookup", "table_tree_lookup", "eagle3_chain_lookup", "eagle3_chain_deep_lookup"):
        u = _cases(models)[case]()
        reqs = [Request(id=str(i), prompt="", prompt_ids=list(LOOKUP_PROMPT)) for i in range(64)]
        Engine(models[0].model, models[0].tokenizer, batch_size=64, stop=StopCriteria(frozenset(), L), params=params,
               seed=0, progress=False, drafter=u, k=K).run(reqs)
        s = u.stats
        print(case, s)
        assert s["grafted"] > 0.3 * s["row_steps"] and s["won"] > 0.08 * s["row_steps"], (case, s)


def test_nucleus_chain_is_lossless(models):
    """top-p: the draft model's chain under a 0.8 nucleus (fewer samples; the nucleus shrinks the support)."""
    target, draft = models[:2]
    params = SamplingParams(temperature=0.9, top_p=0.8)
    stat, crit = chi2(sampled_counts(target, lambda: DraftModelDrafter(model=draft.model), params),
                      exact_distribution(target, params))
    assert stat < crit, (stat, crit)


def test_top_k_chains_are_lossless(models):
    """top-k 2 of V=4: the draft model's and the MLP speculator's sampled chains, and a static and a dynamic draft
    tree with 3 siblings per node (one more than q's support: the third is drawn from q's floor), against the exact top-k target
    (half the continuations get probability 0: a count there fails the test outright)."""
    target, draft = models[:2]
    params = SamplingParams(temperature=0.9, top_k=2)
    exact = exact_distribution(target, params)
    assert int((exact == 0).sum()) > V ** L // 2  # the restriction is real
    for make in (lambda: DraftModelDrafter(model=draft.model), _cases(models)["mlp_speculator_chain"],
                 lambda: DraftModelDrafter(model=draft.model, tree=[3, 1, 1]),
                 lambda: DraftModelDrafter(model=draft.model, dynamic={"topk": 3, "num_draft_tokens": 6})):
        counts = sampled_counts(target, make, params)
        assert float(counts[exact == 0].sum()) == 0
        stat, crit = chi2(counts, exact)
        assert stat < crit, (stat, crit)


def test_top_k_control_catches_a_verifier_that_ignores_it(models, monkeypatch):
    """Control: a verifier scoring against the untruncated distribution emits continuations top-k forbids."""
    import dataclasses

    import specbench.verify as vf

    real = vf.target_probs
    monkeypatch.setattr(vf, "target_probs", lambda logits, p: real(logits, dataclasses.replace(p, top_k=0)))
    target, draft = models[:2]
    params = SamplingParams(temperature=0.9, top_k=2)
    counts = sampled_counts(target, lambda: DraftModelDrafter(model=draft.model), params)
    assert float(counts[exact_distribution(target, params) == 0].sum()) > 100
