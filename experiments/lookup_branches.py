"""An offline bound for prompt lookup with several branches (experiments section 38): walk the target's own
greedy text of a run step by step, proposing at each step either the continuation after the most recent
occurrence of the context's longest matching suffix (what `method=ngram` and `method.lookup` graft), or the best
of up to m distinct continuations (earlier occurrences too, longest suffix first, most recent first); a step
advances by the tokens the proposal shares with the text, plus one. Lookup alone: what the drafter's own tree
already covers is not subtracted, so the gain is an upper bound of what extra branches could add to a union.

The text is re-tokenized from results.json (its `prompt` through the chat template, its `text`), which can differ
from the generated ids at a few word boundaries.

    python experiments/lookup_branches.py experiments/results/lookup_deep/rounds/r1_1_eagle3_d3_k3/results.json 8
"""

from __future__ import annotations

import json
import sys

import numpy as np

from specbench.data.prompts import encode_prompt
from specbench.models.loading import load_tokenizer, resolve_folder


def continuations(history: list[int], k: int, min_n: int, max_n: int, m: int) -> list[list[int]]:
    """Up to m distinct continuations of up to k tokens: suffix length n from max_n down to min_n, and for each n
    the earlier occurrences from the most recent back (m = 1: exactly `drafters.ngram.lookup`'s proposal)."""
    h = np.asarray(history)
    L, out = len(h), []
    for n in range(min(max_n, L - 1), min_n - 1, -1):
        windows = np.lib.stride_tricks.sliding_window_view(h[: L - 1], n)
        for s in np.flatnonzero((windows == h[L - n:]).all(axis=1))[::-1]:
            c = h[s + n: s + n + k].tolist()
            if c and c not in out:
                out.append(c)
            if len(out) >= m:
                return out
    return out


def shared_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def walk(texts: list[tuple[list[int], list[int]]], k: int, min_n: int, max_n: int, m: int) -> dict:
    steps = accepted = matched = 0
    for prompt, out in texts:
        i = 1  # the first output token comes from the prefill
        while i < len(out):
            cs = continuations(prompt + out[:i], k, min_n, max_n, m)
            a = max((shared_prefix(c, out[i:]) for c in cs), default=0)
            steps, accepted, matched = steps + 1, accepted + a, matched + bool(cs)
            i += a + 1
    return {"steps": steps, "matched": matched / steps, "accepted_per_step": accepted / steps}


def main() -> None:
    doc = json.loads(open(sys.argv[1]).read())
    k = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    tok = load_tokenizer(resolve_folder(None)[0])  # the embedded target's tokenizer
    texts = [(encode_prompt(tok, r["prompt"]), tok.encode(r["text"], add_special_tokens=False))
             for r in doc["requests"]]
    print("| branches m | min_n | steps | lookup matched | accepted tokens per step |")
    print("|---:|---:|---:|---:|---:|")
    for m in (1, 2, 3, 4):
        for min_n in (2, 1):
            r = walk(texts, k, min_n, 4, m)
            print(f"| {m} | {min_n} | {r['steps']} | {r['matched']:.2f} | {r['accepted_per_step']:.3f} |")


if __name__ == "__main__":
    main()
