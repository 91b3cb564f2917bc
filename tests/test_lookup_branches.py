"""experiments/lookup_branches.py (section 38's offline bound for several lookup branches), counted by hand."""

from spec_helpers import experiment_script
from specbench.drafters.ngram import lookup

lb = experiment_script("lookup_branches")


def test_continuations_by_hand():
    h = [5, 6, 7, 8, 5, 6, 9, 5, 6]
    # suffix [5, 6] occurred at 4 (then 9, 5) and at 0 (then 7, 8); the one-token suffix [6] adds nothing new
    assert lb.continuations(h, 2, 1, 2, 3) == [[9, 5], [7, 8]]
    assert lb.continuations(h, 2, 1, 2, 1) == [[9, 5]] == [lookup(h, 2, 1, 2)]  # one branch: lookup's own
    assert lb.continuations([1, 2, 3], 2, 1, 2, 4) == []


def test_walk_by_hand():
    # prompt [1, 2, 3, 1, 2, 4]; output [1, 2, 3, 9]. Step 1 (history ..., 1): suffix [4, 1] unseen, [1] at 3
    # then at 0: one branch proposes [2, 4] (1 accepted: 2), two branches also [2, 3] (2 accepted: 2, 3).
    texts = [([1, 2, 3, 1, 2, 4], [1, 2, 3, 9])]
    one = lb.walk(texts, 2, 1, 2, 1)
    # one branch: step 1 accepts 2, the bonus 3 (i = 3); step 2 (history ..., 1, 2, 3): [2, 3] at 1 -> [1, 2],
    # 0 accepted against 9, bonus 9: two steps, 1 token accepted
    assert one == {"steps": 2, "matched": 1.0, "accepted_per_step": 0.5}
    two = lb.walk(texts, 2, 1, 2, 2)
    assert two == {"steps": 1, "matched": 1.0, "accepted_per_step": 2.0}  # 2, 3 accepted, bonus 9: done
