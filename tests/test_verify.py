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
