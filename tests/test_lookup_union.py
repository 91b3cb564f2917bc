"""Prompt lookup grafted onto a drafter's tree (`method.lookup`): the graft counted by hand, the union tree built
from a stub drafter's tree by hand, greedy identity and exact caches with the draft model's dynamic tree, and
grafted paths that the target accepts (losslessness of sampling: test_lossless.py's `*_lookup` cases)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from specbench.core.types import PAD_ID, BatchState, DraftTree, Verdict
from conftest import make_eagle_head
from specbench.drafters.draft_model import DraftModelDrafter
from specbench.drafters.eagle import EagleDrafter
from specbench.drafters.ngram import LookupUnion, graft
from specbench.errors import UserError
from test_spec import PROMPTS, CheckingEngine, _run, tiny, tiny_draft  # noqa: F401 - fixtures

CPU = torch.device("cpu")


def test_graft():
    # root -> 5 -> 7, root -> 6: the docstring's example, and the cases around it
    toks, pars = [5, 6, 7], [-1, -1, 0]
    assert graft(toks, pars, [5, 7, 9, 4]) == [(9, 2), (4, 3)]  # 5, 7 followed; 9 under node 2, 4 under new node 3
    assert graft(toks, pars, [5, 7]) == []  # already a path
    assert graft(toks, pars, [8, 1]) == [(8, -1), (1, 3)]  # from the root
    assert graft(toks, pars, [6, 6]) == [(6, 1)]  # under node 1 (6 was a sibling at depth 1, not 6's child)
    assert graft(toks, pars, [7]) == [(7, -1)]  # 7 exists only at depth 2
    assert graft([], [], [3, 4]) == [(3, -1), (4, 0)]
    assert graft(toks, pars, []) == []


class FixedTree:
    """A stub drafter proposing one fixed tree (with q) every step; it re-feeds any path (it keeps no state)."""

    refeeds_path, max_draft_len, hidden_layers = True, 8, ()

    def __init__(self, tree: DraftTree) -> None:
        self.tree = tree

    def max_nodes(self, k):
        return self.tree.num_nodes

    def setup(self, *a, **kw):
        self.setup_args = (a[3], kw)  # (k, path_len)

    def propose(self, state):
        self.proposed_k = state.k
        return self.tree

    def commit(self, *a):
        pass


def test_union_tree_by_hand():
    V = 12
    P = PAD_ID
    # row 0: 5 -> 7, and 6;  row 1: 8 -> 4, 8 -> 9;  row 2: 2 -> 3;  row 3: idle
    tokens = torch.tensor([[5, 6, 7], [8, 4, 9], [2, 3, P], [P, P, P]])
    parents = torch.tensor([[-1, -1, 0], [-1, 0, 0], [-1, 0, 1], [-1, 0, 1]])
    lens = torch.tensor([3, 3, 2, 0])
    probs = torch.rand(4, 3, V)
    inner = FixedTree(DraftTree(tokens, parents, lens, probs, False, depth=2, width=2))
    u = LookupUnion(inner, min_n=1, max_n=2)
    u.setup(SimpleNamespace(device=CPU), 4, 64, 3, None, None)
    assert u.max_nodes(3) == 3 + 3
    u.history.rows = [[1, 5, 7, 9, 4, 2, 1],  # suffix [2, 1] never seen; [1] at 0: lookup [5, 7, 9]
                      [3, 8, 3],  # [3] at 0: [8, 3] (only two tokens follow)
                      [9, 2, 3, 6, 9],  # [9] at 0: [2, 3, 6]; 2 -> 3 is in the tree, 6 is not
                      [1, 1]]  # idle
    state = SimpleNamespace(k=3, active=torch.tensor([1, 1, 1, 0]))
    t = u.propose(state)
    assert t.tokens.tolist() == [[5, 6, 7, 9], [8, 4, 9, 3], [2, 3, 6, P], [P, P, P, P]]
    assert t.parents.tolist()[:3] == [[-1, -1, 0, 2], [-1, 0, 0, 0], [-1, 0, 1, -1]]
    assert t.lens.tolist() == [4, 4, 3, 0]
    assert (t.depth, t.width, t.is_chain) == (3, 3, False)  # rows 0 and 2 grafted at depth 3; row 1's 8: 3 children
    assert t.contract_errors(3, u.max_nodes(3)) == []
    assert torch.equal(t.probs[:2, :3], probs[:2]) and torch.equal(t.probs[2, :2], probs[2, :2])  # q untouched
    assert t.probs[0, 3].tolist() == torch.nn.functional.one_hot(torch.tensor(9), V).float().tolist()
    assert t.probs[1, 3].argmax() == 3 and t.probs[1, 3].sum() == 1 and t.probs[2, 2].argmax() == 6
    assert u.stats == {"row_steps": 3, "matched": 3, "grafted": 3, "won": 0, "accepted_grafted": 0}
    # row 0 accepted 5, 7, 9 (9 grafted); row 1 accepted 8, 4 (the drafter's); row 2 accepted 2, 3, 6 (6 grafted)
    v = Verdict(tokens=torch.tensor([[5, 7, 9, 1], [8, 4, 0, P], [2, 3, 6, 5], [P, P, P, P]]),
                num_accepted=torch.tensor([3, 2, 3, 0]),
                accepted_nodes=torch.tensor([[0, 2, 3], [0, 1, -1], [0, 1, 2], [-1, -1, -1]]))
    u.commit(v, state, None)
    assert u.stats["won"] == 2 and u.stats["accepted_grafted"] == 2
    assert u.history.rows[0][-4:] == [5, 7, 9, 1] and u.history.rows[1][-3:] == [8, 4, 0]


def test_union_without_matches_is_the_drafters_tree():
    tree = DraftTree(torch.tensor([[5, 6]]), torch.tensor([[-1, 0]]), torch.tensor([2]), None, True, 2, 1)
    u = LookupUnion(FixedTree(tree), 2, 3)
    u.setup(SimpleNamespace(device=CPU), 1, 64, 2, None, None)
    u.history.rows = [[1, 2, 3, 4]]  # no suffix of length >= 2 repeats
    assert u.propose(SimpleNamespace(k=2, active=torch.tensor([1]))) is tree


def _union(model):
    return LookupUnion(DraftModelDrafter(model=model, dynamic={"topk": 2, "num_draft_tokens": 4}), 1, 3)


@pytest.mark.parametrize("batch_size", [1, 3])
def test_greedy_identical_with_grafts_accepted(tiny, tiny_draft, batch_size):  # noqa: F811
    """Token-identical to target-only decoding at k = 1..4, and grafted tokens accepted: the random target's
    greedy text repeats itself, so lookup wins steps the draft's tree loses (fewer target steps at k >= 2)."""
    _, ref = _run(tiny, max_new=24)
    won = 0
    for k in range(1, 5):
        u = _union(tiny_draft.model)
        _, res = _run(tiny, u, k=k, batch_size=batch_size, max_new=24)
        assert [r.output_ids for r in res] == [r.output_ids for r in ref], k
        _, alone = _run(tiny, DraftModelDrafter(model=tiny_draft.model, dynamic={"topk": 2, "num_draft_tokens": 4}),
                        k=k, batch_size=batch_size, max_new=24)
        steps = sum(len(r.accepted_per_step) for r in res)
        if k >= 2:
            assert steps < sum(len(r.accepted_per_step) for r in alone), k
        assert u.stats["accepted_grafted"] >= u.stats["won"]
        won += u.stats["won"]
    assert won >= 10


def test_caches_equal_fresh_prefill_with_grafts(tiny, tiny_draft):  # noqa: F811
    """The draft model's cache re-fed after steps whose accepted path was (partly) grafted."""
    CheckingEngine.checked = 0
    u = _union(tiny_draft.model)
    _run(tiny, u, k=3, batch_size=2, max_new=16, engine_cls=CheckingEngine)
    assert CheckingEngine.checked > 10 and u.stats["won"] >= 3


def test_lookup_is_validated(tiny_draft):  # noqa: F811
    chain = DraftModelDrafter(model=tiny_draft.model)
    with pytest.raises(UserError, match=r"method.lookup.max_n=4: method=draft_model cannot take tokens it did not "
                                        r"draft as a chain: give it a tree"):
        LookupUnion(chain, 2, 4, "draft_model")
    tree = DraftModelDrafter(model=tiny_draft.model, tree=[1, 1])
    with pytest.raises(UserError, match=r"method.lookup.min_n=3, max_n=2: need 1 <= min_n <= max_n"):
        LookupUnion(tree, 3, 2)
    with pytest.raises(UserError, match=r"method.lookup.max_n=True: an integer"):
        LookupUnion(tree, 1, True)
    assert LookupUnion(tree, 1, 2).max_nodes(2) == 2 + 2


def test_union_deeper_than_the_drafter_by_hand():
    """drafter_k=1 in a k=4 run: the drafter drafts depth 1 and is set up for accepted paths of 4; lookup's chain
    runs 4 deep below it."""
    tree = DraftTree(torch.tensor([[5, 6]]), torch.tensor([[-1, -1]]), torch.tensor([2]), None, False, 1, 2)
    inner = FixedTree(tree)
    u = LookupUnion(inner, 1, 2, drafter_k=1)
    assert u.max_nodes(4) == 2 + 4 and u.max_draft_len == 16
    u.setup(SimpleNamespace(device=CPU), 1, 64, 4, None, None)
    assert inner.setup_args == (1, {"path_len": 4})
    u.history.rows = [[3, 5, 8, 9, 4, 3]]  # [4, 3] unseen; [3] at 0: lookup [5, 8, 9, 4], 4 = k tokens
    t = u.propose(BatchState(torch.tensor([5]), torch.tensor([[3]]), torch.tensor([1]), 5, k=4))
    assert inner.proposed_k == 1
    # 5 is the drafter's node 0: 8, 9, 4 hang below it, down to depth 4 (> the drafter's 1, = k)
    assert t.tokens.tolist() == [[5, 6, 8, 9, 4]] and t.parents.tolist() == [[-1, -1, 0, 2, 3]]
    assert (t.depth, t.width, t.lens.tolist()) == (4, 2, [5])
    assert t.contract_errors(4, u.max_nodes(4)) == []


def _eagle(tiny_dir, tmp_path, drafter_k):
    make_eagle_head(tmp_path / "e3", json.loads((tiny_dir / "config.json").read_text()), draft_vocab=300,
                    aux_ids=[0, 1, 2], fmt="specforge")
    return LookupUnion(EagleDrafter(path=str(tmp_path / "e3")), 1, 3, drafter_k=drafter_k)


@pytest.mark.parametrize("batch_size", [1, 3])
def test_greedy_identical_with_lookup_deeper_than_the_drafter(tiny, tiny_dir, tiny_draft, tmp_path,  # noqa: F811
                                                              batch_size):
    """drafter_k=1 and 2 under k=5: EAGLE-3's chain and the draft model's dynamic tree draft 1-2 deep, lookup's
    chain 5 deep. Token-identical to target-only decoding, and steps accepted more tokens than the drafter
    drafts (only grafted paths reach there), with fewer target steps than the same union at k = drafter_k."""
    _, ref = _run(tiny, max_new=32)
    for make in (lambda d: _eagle(tiny_dir, tmp_path, d),
                 lambda d: LookupUnion(DraftModelDrafter(model=tiny_draft.model, dynamic={"topk": 2, "num_draft_tokens": 4}),
                                       1, 3, drafter_k=d)):
        for d in (1, 2):
            u = make(d)
            _, res = _run(tiny, u, k=5, batch_size=batch_size, max_new=32)
            assert [r.output_ids for r in res] == [r.output_ids for r in ref], d
            deep = sum(n > d for r in res for n in r.accepted_per_step)
            assert deep >= 3 and u.stats["won"] >= deep, (d, deep, u.stats)
            assert u.describe()["lookup"]["drafter_k"] == d
            _, shallow = _run(tiny, make(None), k=d, batch_size=batch_size, max_new=32)
            assert sum(len(r.accepted_per_step) for r in res) < sum(len(r.accepted_per_step) for r in shallow), d


def test_caches_equal_fresh_prefill_with_deeper_lookup(tiny, tiny_draft):  # noqa: F811
    """The draft model's cache re-fed after accepted paths deeper than its own tree (drafter_k=1, k=4)."""
    CheckingEngine.checked = 0
    u = LookupUnion(DraftModelDrafter(model=tiny_draft.model, dynamic={"topk": 2, "num_draft_tokens": 2}), 1, 3,
                    drafter_k=1)
    _, res = _run(tiny, u, k=4, batch_size=2, max_new=20, engine_cls=CheckingEngine)
    assert CheckingEngine.checked > 10 and sum(n > 1 for r in res for n in r.accepted_per_step) >= 3


def test_drafter_k_is_validated(tiny, tiny_draft):  # noqa: F811
    tree = DraftModelDrafter(model=tiny_draft.model, tree=[1, 1])
    with pytest.raises(UserError, match=r"method.lookup.drafter_k=0: an integer >= 1"):
        LookupUnion(tree, 1, 2, drafter_k=0)
    with pytest.raises(UserError, match=r"method.lookup.drafter_k=17: method=draft_model supports a depth <= 16"):
        LookupUnion(tree, 1, 2, "draft_model", drafter_k=17)
    u = LookupUnion(tree, 1, 2, drafter_k=3)
    with pytest.raises(UserError, match=r"method.lookup.drafter_k=3 > k=2"):
        u.setup(tiny.model, 1, 64, 2, None, None)
    # the static tree has 2 depths: drafter_k=3 is beyond it, said in the drafter_k's terms
    with pytest.raises(UserError, match=r"has 2 depths; k=3 needs k \(method.lookup.drafter_k=3: the drafter's own"):
        u.setup(tiny.model, 1, 64, 5, None, None)
    with pytest.raises(UserError, match=r"a draft-model chain re-feeds only its own drafts"):  # a direct caller
        DraftModelDrafter(model=tiny_draft.model).setup(tiny.model, 1, 64, 2, None, None, path_len=4)
