"""experiments/tree_walk.py: the static-tree walk over a finished text, counted by hand."""

import torch
from spec_helpers import experiment_script

tw = experiment_script("tree_walk")


def test_nodes_per_profile():
    from specbench.drafters.draft_model import tree_nodes

    assert tree_nodes([1, 1, 1, 1]) == 4
    assert tree_nodes([4, 1, 1, 1]) == 16  # 4 siblings, a chain of 3 under each
    assert tree_nodes([3, 2, 1, 1]) == 3 + 6 + 6 + 6
    assert tree_nodes([2, 2, 2, 2]) == 2 + 4 + 8 + 16


def test_walk_counts_by_hand():
    # a 10-token text, prompt = 2 tokens; ranks[p] = rank of token p+1 after ids[:p+1]
    ranks = [9, 0, 1, 0, 3, 0, 0, 0, 0]
    # chain k = 2: propose after position 1 (tests tokens 3, 4): rank 1 misses -> 0; after 2: token 4 hit, 5
    # (rank 3) misses -> 1; after 4: tokens 6, 7 hit -> 2; after 7: token 9 hits, the text ends -> 1
    assert tw.walk(ranks, 2, [1, 1]) == [0, 1, 2, 1]
    # two siblings at depth 1: token 3 (rank 1) is the second sibling, token 4 its chain child -> 2; then 2, 1
    assert tw.walk(ranks, 2, [2, 1]) == [2, 2, 1]
    # a wide depth 2: the first miss stays (0); after 2 tokens 4, 5 (rank 3 < 4) -> 2; after 5: 7, 8 -> 2; the
    # bonus token 9 ends the text, no proposal after it
    assert tw.walk(ranks, 2, [1, 4]) == [0, 2, 2]


def test_rank_breaks_ties_like_argmax():
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.5]] * 3)
    assert tw.rank_of(logits, torch.tensor([1, 2, 3])).tolist() == [0, 1, 3]  # argmax takes the first of a tie
    assert int(logits[0].argmax()) == 1
