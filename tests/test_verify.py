"""Acceptance rules on hand-made logits: named cases, trees, and shapes (no host syncs needed to build)."""

from __future__ import annotations

import torch

from specbench.core.types import PAD_ID, DraftTree
from specbench.core.sampling import SamplingParams
from specbench.verify import verify, verify_greedy

V = 10


def _logits_for(argmaxes: list[list[int]]) -> torch.Tensor:
    """logits [B, T, V] whose argmax at [b, t] is argmaxes[b][t]."""
    B, T = len(argmaxes), len(argmaxes[0])
    lg = torch.zeros(B, T, V)
    for b in range(B):
        for t in range(T):
            lg[b, t, argmaxes[b][t]] = 5.0
    return lg


def test_perfect_match():
    tree = DraftTree.chain(torch.tensor([[3, 4, 5]]), torch.tensor([3]))
    v = verify_greedy(tree, _logits_for([[3, 4, 5, 7]]))
    assert v.num_accepted.tolist() == [3] and v.tokens.tolist() == [[3, 4, 5, 7]]
    assert v.accepted_nodes.tolist() == [[0, 1, 2]]


def test_early_mismatch():
    tree = DraftTree.chain(torch.tensor([[3, 4, 5]]), torch.tensor([3]))
    v = verify_greedy(tree, _logits_for([[3, 9, 5, 7]]))  # second draft is wrong: target wants 9
    assert v.num_accepted.tolist() == [1] and v.tokens.tolist() == [[3, 9, PAD_ID, PAD_ID]]
    assert v.accepted_nodes.tolist() == [[0, -1, -1]]


def test_first_mismatch_and_later_match_is_not_accepted():
    tree = DraftTree.chain(torch.tensor([[1, 4, 5]]), torch.tensor([3]))
    v = verify_greedy(tree, _logits_for([[3, 4, 5, 7]]))
    assert v.num_accepted.tolist() == [0] and v.tokens.tolist() == [[3, PAD_ID, PAD_ID, PAD_ID]]


def test_empty_draft():
    tree = DraftTree.chain(torch.tensor([[3, 4]]), torch.tensor([0]))
    v = verify_greedy(tree, _logits_for([[6, 4, 5]]))
    assert v.num_accepted.tolist() == [0] and v.tokens[0, 0].item() == 6
    e = DraftTree.empty(2, torch.device("cpu"))
    v = verify_greedy(e, _logits_for([[6], [2]]))
    assert v.tokens.tolist() == [[6], [2]]


def test_batch_with_different_lengths():
    tree = DraftTree.chain(torch.tensor([[3, 4, 5], [1, 2, 0]]), torch.tensor([3, 2]))
    assert tree.tokens[1, 2].item() == PAD_ID  # padded past lens
    v = verify_greedy(tree, _logits_for([[3, 4, 0, 8], [1, 2, 6, 6]]))
    assert v.num_accepted.tolist() == [2, 2]
    assert v.tokens.tolist() == [[3, 4, 0, PAD_ID], [1, 2, 6, PAD_ID]]


def _tree():
    """root -> n0 (7), n1 (3); n0 -> n2 (8); n1 -> n3 (4), n3 -> n4 (5)."""
    return DraftTree(tokens=torch.tensor([[7, 3, 8, 4, 5]]), parents=torch.tensor([[-1, -1, 0, 1, 3]]),
                     lens=torch.tensor([5]), depth=3, width=2)


def test_tree_takes_the_matching_branch():
    # target argmax at root = 3 (n1), at n1 = 4 (n3), at n3 = 5 (n4), at n4 = 9 (bonus)
    lg = _logits_for([[3, 0, 4, 0, 5, 9]])  # forward positions: root, n0, n1, n2, n3, n4
    v = verify_greedy(_tree(), lg)
    assert v.num_accepted.tolist() == [3]
    assert v.accepted_nodes.tolist() == [[1, 3, 4]] and v.tokens.tolist() == [[3, 4, 5, 9]]


def test_tree_depths_and_mask():
    t = _tree()
    assert t.depths().tolist() == [[1, 1, 2, 2, 3]]
    m = t.attention_mask()[0].int().tolist()
    assert m[5] == [1, 0, 1, 0, 1, 1]  # n4 sees root, n1, n3, itself
    assert m[3] == [1, 1, 0, 1, 0, 0]  # n2 sees root, n0, itself


def test_sampling_with_point_mass_draft_accepts_a_certain_token():
    """A draft the target is certain of is always accepted; one it rules out never is."""
    tree = DraftTree.chain(torch.tensor([[3, 4]]), torch.tensor([2]))
    lg = torch.full((1, 3, V), -1e9)
    lg[0, 0, 3] = 0.0  # p(3) = 1 at the root
    lg[0, 1, 5] = 0.0  # p(5) = 1 after 3: draft 4 must be rejected, 5 recovered
    lg[0, 2, 0] = 0.0
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        v = verify(tree, lg, SamplingParams(temperature=1.0), gen)
        assert v.num_accepted.tolist() == [1] and v.tokens.tolist() == [[3, 5, PAD_ID]]


def test_sampling_rejection_avoids_the_rejected_token():
    """After rejecting x, the recovered token comes from norm(max(p - q, 0)): never x for a point mass."""
    tree = DraftTree.chain(torch.tensor([[2]]), torch.tensor([1]))
    lg = torch.log(torch.tensor([[[0.3, 0.3, 0.4] + [1e-12] * (V - 3), [0.1] * V]]))
    gen = torch.Generator().manual_seed(1)
    for _ in range(200):
        v = verify(tree, lg, SamplingParams(temperature=1.0), gen)
        if v.num_accepted.item() == 0:
            assert v.tokens[0, 0].item() in (0, 1)


# ------------------------------------------------------------------------------------- typical
def _dist(*pairs, rest: float | None = None) -> torch.Tensor:
    """A distribution over V tokens: the (token, p) pairs given, the remaining mass spread over the others."""
    p = torch.zeros(V)
    for t, x in pairs:
        p[t] = x
    others = [i for i in range(V) if i not in dict(pairs)]
    p[others] = (1 - p.sum()) / len(others) if rest is None else rest
    return p


def _medusa_reference(tree: DraftTree, probs: torch.Tensor, eps: float, alpha: float) -> tuple[int, list[int]]:
    """Medusa's evaluate_posterior (typical), transcribed: one candidate per leaf (root-to-leaf node path),
    posterior mask cumprod, the longest accepted prefix, ties by summed log p of the accepted tokens."""
    N = int(tree.lens[0])
    parents, tokens = tree.parents[0].tolist(), tree.tokens[0].tolist()
    leaves = [n for n in range(N) if n not in parents[:N]]
    best_len, best_lik, best_path = 0, None, []
    for leaf in leaves:
        path = [leaf]
        while parents[path[0]] >= 0:
            path.insert(0, parents[path[0]])
        acc, lik = 0, 0.0
        for n in path:
            p = probs[parents[n] + 1]  # the distribution at the parent (forward index)
            ent = -(p * torch.log(p + 1e-5)).sum()
            if not p[tokens[n]] > min(eps, alpha * float(torch.exp(-ent))):
                break
            acc, lik = acc + 1, lik + float(torch.log(p[tokens[n]]))
        if acc > best_len or (acc == best_len and acc > 0 and lik > best_lik):
            best_len, best_lik, best_path = acc, lik, path[:acc]
    return best_len, best_path


def test_typical_takes_the_longest_path_not_the_first_passing_sibling():
    """root -> n0 (1), n1 (2); n0 -> n2 (3); n1 -> n3 (4) -> n4 (5). n0 passes at the root and comes first,
    but its child fails; the longest passing path is n1, n3, n4."""
    tree = DraftTree(tokens=torch.tensor([[1, 2, 3, 4, 5]]), parents=torch.tensor([[-1, -1, 0, 1, 3]]),
                     lens=torch.tensor([5]), depth=3, width=2)
    probs = torch.stack([_dist((1, 0.5), (2, 0.4)), _dist((3, 0.01)), _dist((4, 0.9)), _dist((0, 0.9)),
                         _dist((5, 0.9)), _dist((7, 0.97), rest=0.03 / 9)])[None]  # root, n0..n4
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        v = verify(tree, probs.log(), SamplingParams(temperature=1.0), gen, rule="typical")
        assert v.num_accepted.tolist() == [3] and v.accepted_nodes.tolist() == [[1, 3, 4]]
        assert v.tokens.tolist() == [[2, 4, 5, 7]]  # the extra token: only 7 passes the threshold at n4
    assert _medusa_reference(tree, probs[0], 0.09, 0.3) == (3, [1, 3, 4])


def test_typical_breaks_ties_by_likelihood():
    """Two one-token paths both pass; Medusa keeps the likelier (n1), not the first (n0)."""
    tree = DraftTree(tokens=torch.tensor([[1, 2]]), parents=torch.tensor([[-1, -1]]), lens=torch.tensor([2]),
                     depth=1, width=2)
    probs = torch.stack([_dist((1, 0.3), (2, 0.6)), _dist((0, 0.9)), _dist((0, 0.9))])[None]
    v = verify(tree, probs.log(), SamplingParams(temperature=1.0), torch.Generator().manual_seed(0), rule="typical")
    assert v.accepted_nodes.tolist() == [[1]] and v.tokens[0, 0].item() == 2


def test_typical_matches_medusa_reference_on_random_trees():
    g = torch.Generator().manual_seed(0)
    lengths = set()
    for trial in range(200):
        N = 6
        parents = [-1] + [int(torch.randint(-1, n, (1,), generator=g)) for n in range(1, N)]
        tree = DraftTree(tokens=torch.randperm(V, generator=g)[:N][None], parents=torch.tensor([parents]),  # siblings differ, as in Medusa
                         lens=torch.tensor([N]), depth=N, width=N)
        sharp = 0.5 + 3 * torch.rand(1, generator=g)
        logits = torch.randn(1, N + 1, V, generator=g) * sharp
        probs = torch.softmax(logits, -1)
        want_len, want_path = _medusa_reference(tree, probs[0], 0.09, 0.3)
        v = verify(tree, logits, SamplingParams(temperature=1.0), torch.Generator().manual_seed(trial), rule="typical")
        got = [n for n in v.accepted_nodes[0].tolist() if n >= 0]
        assert (v.num_accepted.item(), got) == (want_len, want_path), trial
        lengths.add(want_len)
    assert {0, 1, 2, 3} <= lengths  # the trials exercised several path lengths


def test_sampling_rules_refuse_temperature_zero():
    import pytest

    tree = DraftTree.chain(torch.tensor([[3]]), torch.tensor([1]))
    for rule in ("sampling", "typical"):
        with pytest.raises(ValueError, match=f"acceptance={rule} needs temperature > 0"):
            verify(tree, _logits_for([[3, 4]]), SamplingParams(temperature=0.0), None, rule=rule)
    with pytest.raises(ValueError, match="needs temperature > 0"):
        from specbench.core.sampling import target_probs

        target_probs(torch.zeros(4), SamplingParams(0.0))
