"""Held-out acceptance of a drafter being trained, measured with the real decode loop (greedy)."""

from __future__ import annotations

from specbench.core.sampling import SamplingParams
from specbench.data.prompts import to_requests
from specbench.engine.loop import Engine, StopCriteria
from specbench.metrics.results import AcceptanceStats


def loop_acceptance(target, tokenizer, prompts: list, drafter, k: int, max_new: int) -> dict[str, float]:
    """eval/mean_acceptance_length, eval/acceptance_rate and eval/per_position_i of `drafter` at depth k."""
    if not prompts:
        return {}
    reqs = to_requests(prompts, tokenizer)
    eng = Engine(target, tokenizer, batch_size=min(4, len(reqs)), params=SamplingParams(), progress=False,
                 stop=StopCriteria(frozenset({tokenizer.eos_token_id}), max_new), drafter=drafter, k=k)
    acc = AcceptanceStats.from_results(eng.run(reqs), k).summary()
    out = {"eval/mean_acceptance_length": acc["mean_acceptance_length"] or 1.0,
           "eval/acceptance_rate": acc["acceptance_rate"] or 0.0}
    for i, p in enumerate(acc["per_position"]):
        out[f"eval/per_position_{i}"] = p
    return out


def chain_walk(drafts: list[list[int]], ids: list[int], start: int, k: int) -> tuple[list[int], list[int]]:
    """The decode loop's greedy chain walk replayed over a finished sequence `ids` (prompt = ids[:start]).

    drafts[i] are the depth-1..k greedy drafts of a proposal whose last real pair is i (target hidden i,
    token i+1), i.e. predictions of tokens i+2 .. i+1+k. The first proposal's last real pair is start-1 (the
    last prompt position with the first sampled token); after accepting a drafts the target's bonus token sits
    at i+2+a, so the next proposal's last real pair is i+a+1. Returns (drafts accepted at each step, the token
    index each step's depth-1 draft was tested at)."""
    i, accepted, tested = start - 1, [], []
    while i + 2 < len(ids):
        a = 0
        while a < k and i + 2 + a < len(ids) and drafts[i][a] == ids[i + 2 + a]:
            a += 1
        accepted.append(a)
        tested.append(i + 2)
        i += a + 1
    return accepted, tested


def paired_walks(ref: list[list[int]], other: list[list[int]]) -> dict[str, float]:
    """Paired comparison of two heads walked over the same sequences: `ref` / `other` hold (steps, drafts
    accepted) per sequence (acceptance_gap.py's `per_sequence_steps_accepted`). Per sequence τ = 1 +
    accepted / steps; returns the mean of other − ref, its standard error, and how many sequences improved.

    The per-sequence mean weights a 16-token answer like a 300-token one; `walk_diff` is the difference of the
    walks' own τ (accepted / steps summed over every sequence, what the loop reports), with its delta-method
    standard error `walk_se`: for a ratio r = X / S of sums over n sequences, r − r_true ≈ mean of n (x_i − r
    s_i) / S, so the paired difference's SE is sqrt(sum z_i² / (n (n − 1))) with z_i = n (xb_i − rb sb_i) / Sb
    − n (xa_i − ra sa_i) / Sa (the z_i sum to zero)."""
    if len(ref) != len(other) or len(ref) < 2:
        raise ValueError(f"paired walks need the same sequences, at least 2: got {len(ref)} and {len(other)}")
    d = []
    for (sa, xa), (sb, xb) in zip(ref, other):
        if abs((sa + xa) - (sb + xb)) > 1:  # each step covers accepted + 1 tokens; the last may overrun by one
            raise ValueError(f"paired walks cover different text: {sa}+{xa} vs {sb}+{xb} tokens")
        d.append(xb / sb - xa / sa)
    n = len(d)
    mean = sum(d) / n
    se = (sum((x - mean) ** 2 for x in d) / (n - 1) / n) ** 0.5
    (sa, xa), (sb, xb) = ([sum(c) for c in zip(*w)] for w in (ref, other))
    ra, rb = xa / sa, xb / sb
    z = [n * (b[1] - rb * b[0]) / sb - n * (a[1] - ra * a[0]) / sa for a, b in zip(ref, other)]
    return {"mean_diff": mean, "se": se, "better": sum(x > 0 for x in d), "worse": sum(x < 0 for x in d), "n": n,
            "walk_diff": rb - ra, "walk_se": (sum(x * x for x in z) / (n * (n - 1))) ** 0.5}
