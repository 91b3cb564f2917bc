"""Run metrics and the results.json contract (schema specbench.results/v1, see DESIGN.md).

Names follow vLLM's spec-decode metrics. A *draft* is one request's proposal at one target step (steps
where a request proposed nothing do not count). Per draft:
- `num_draft_tokens`: draft nodes the target scored (a chain: its length; a tree: all its nodes);
- `num_draft_depth_tokens`: the depth of its deepest node (= num_draft_tokens for chains);
- `num_accepted_tokens`: drafts kept (the accepted path's length, <= depth).
mean acceptance length (tau) = 1 + accepted / drafts (the bonus token counts); acceptance_rate = accepted /
num_draft_tokens (what the target's extra work bought); depth_acceptance_rate = accepted / depth tokens;
per_position[i] (i < k) = fraction of drafts whose i-th token (depth i+1) was accepted, always k long.

Latency: TTFT is from the start of the request's prefill to its first token; TPOT is (last token time -
first token time) / (tokens after the first) per request, over the tokens kept after stop trimming; ITL
is the gap between successive chunks delivered to a request (a speculative step delivers several at once).
At temperature > 0 the same-run baseline samples other (equally distributed) tokens, so
`outputs_match_baseline`, `baseline_match_rate` and `first_divergence` are null there.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from specbench.core.request import RequestResult

SCHEMA = "specbench.results/v1"


def _stats(xs: list[float]) -> dict[str, float | None]:
    if not xs:
        return {"mean": None, "p50": None, "p99": None}
    a = np.asarray(xs, dtype=np.float64)
    return {"mean": float(a.mean()), "p50": float(np.percentile(a, 50)), "p99": float(np.percentile(a, 99))}


@dataclass
class AcceptanceStats:
    """Counters filled once per request step: drafts, draft nodes and depth, accepted tokens per position."""

    k: int = 0  # configured draft depth: per_position has k entries
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_draft_depth_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)  # [i] = drafts whose token i was accepted
    histogram: list[int] = field(default_factory=list)  # [j] = drafts that accepted exactly j tokens (j <= k)

    def __post_init__(self) -> None:
        self.accepted_per_pos = [0] * self.k
        self.histogram = [0] * (self.k + 1)

    def record(self, depth: int, nodes: int, accepted: int) -> None:
        if nodes == 0:
            return
        if not 0 <= accepted <= depth <= min(nodes, self.k):
            raise ValueError(f"a draft of depth {depth}, {nodes} nodes, {accepted} accepted, k={self.k}")
        self.num_drafts += 1
        self.num_draft_tokens += nodes
        self.num_draft_depth_tokens += depth
        self.num_accepted_tokens += accepted
        for i in range(accepted):
            self.accepted_per_pos[i] += 1
        self.histogram[accepted] += 1

    @classmethod
    def from_results(cls, results: list[RequestResult], k: int) -> "AcceptanceStats":
        s = cls(k)
        for r in results:
            for d, n, a in zip(r.draft_lens, r.draft_nodes, r.accepted_per_step):
                s.record(d, n, a)
        return s

    def summary(self) -> dict:
        drafts = self.num_drafts
        return {
            "num_drafts": drafts,
            "num_draft_tokens": self.num_draft_tokens,
            "num_draft_depth_tokens": self.num_draft_depth_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "mean_acceptance_length": 1.0 + self.num_accepted_tokens / drafts if drafts else None,
            "acceptance_rate": self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else None,
            "depth_acceptance_rate": (self.num_accepted_tokens / self.num_draft_depth_tokens
                                      if self.num_draft_depth_tokens else None),
            # vLLM divides by num_drafts at every position (a short draft counts as a miss there)
            "per_position": [a / drafts for a in self.accepted_per_pos] if drafts else [],
            "histogram": list(self.histogram) if drafts else [],
        }


def latency(results: list[RequestResult]) -> dict:
    ttft, tpot, itl = [], [], []
    for r in results:
        ttft.append((r.t_first - r.t_admit) * 1e3)
        if r.chunk_times:
            n_after = sum(r.chunk_sizes)
            if n_after > 0:
                tpot.append((r.chunk_times[-1] - r.t_first) * 1e3 / n_after)
            prev = r.t_first
            for t in r.chunk_times:
                itl.append((t - prev) * 1e3)
                prev = t
    return {"ttft_ms": _stats(ttft), "tpot_ms": _stats(tpot), "itl_ms": _stats(itl)}


def _request_wall(r: RequestResult) -> float:
    return (r.chunk_times[-1] if r.chunk_times else r.t_first) - r.t_admit


def _request_rate(rs: list[RequestResult]) -> float | None:
    wall = sum(_request_wall(r) for r in rs)
    return sum(r.num_new_tokens for r in rs) / wall if wall > 0 else None


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """Index of the first token where two outputs differ (a length difference counts); None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def build_results(config: dict, results: list[RequestResult], wall_s: float, target_steps: int,
                  baseline: dict | None = None, baseline_results: list[RequestResult] | None = None,
                  extra: dict | None = None) -> dict:
    """Assemble the results.json document. `baseline`: {tokens_per_s, wall_s} of target-only decoding."""
    new_tokens = sum(r.num_new_tokens for r in results)
    tps = new_tokens / wall_s if wall_s > 0 else 0.0
    k = int(config.get("k") or 0) if config.get("drafter") else 0
    div = [None] * len(results)
    match = rate = None
    greedy = float(config.get("temperature", 0.0)) == 0.0
    if baseline_results is not None and greedy:  # at T > 0 identity is not expected: nothing to report
        # a later turn asked after answers that differed from the baseline's (dataset.turns) differs from token 0
        div = [0 if r.request.prompt_ids != b.request.prompt_ids else first_divergence(r.output_ids, b.output_ids)
               for r, b in zip(results, baseline_results)]
        rate = sum(d is None for d in div) / len(div) if div else None
        match = all(d is None for d in div)
    cats: dict[str, list[int]] = {}
    turns: dict[str, dict[str, list[int]]] = {}  # turn -> category -> indices
    for i, r in enumerate(results):
        cat = r.request.category or "default"
        cats.setdefault(cat, []).append(i)
        turns.setdefault(str(r.request.turn), {}).setdefault(cat, []).append(i)

    def cat_entry(idx: list[int]) -> dict:
        rs = [results[i] for i in idx]
        entry = {"requests": len(rs), "new_tokens": sum(r.num_new_tokens for r in rs),
                 "acceptance": AcceptanceStats.from_results(rs, k).summary(),
                 "tokens_per_s": _request_rate(rs), "baseline_tokens_per_s": None, "speedup": None}
        if baseline_results is not None:
            entry["baseline_tokens_per_s"] = _request_rate([baseline_results[i] for i in idx])
            if entry["baseline_tokens_per_s"]:
                entry["speedup"] = entry["tokens_per_s"] / entry["baseline_tokens_per_s"]
        return entry

    doc = {
        "schema": SCHEMA,
        "config": config,
        "totals": {"new_tokens": new_tokens, "target_steps": target_steps, "wall_s": wall_s, "tokens_per_s": tps},
        "acceptance": AcceptanceStats.from_results(results, k).summary(),
        "latency": latency(results),
        "baseline": baseline,
        "speedup": tps / baseline["tokens_per_s"] if baseline and baseline.get("tokens_per_s") else None,
        "outputs_match_baseline": match,
        "baseline_match_rate": rate,
        # per category: tokens over the requests' own decode time (admission to last token); with
        # batch_size > 1 requests overlap, so these rates compare categories, not absolute throughput
        "per_category": {c: cat_entry(idx) for c, idx in sorted(cats.items())},
        "requests": [
            {
                "id": r.request.id,
                "turn": r.request.turn,
                "category": r.request.category,
                "prompt": r.request.prompt,
                "prompt_tokens": len(r.request.prompt_ids),
                "new_tokens": r.num_new_tokens,
                "wall_s": _request_wall(r),
                "accepted_per_step": list(r.accepted_per_step),
                "text": r.text,
                "finish_reason": r.finish_reason,
                "first_divergence": d,
            }
            for r, d in zip(results, div)
        ],
    }
    if len(turns) > 1:  # dataset.turns > 1: the same entries per user turn ("1", "2", ...), each with its categories
        doc["per_turn"] = {t: {**cat_entry(sorted(i for idx in tc.values() for i in idx)),
                               "per_category": {c: cat_entry(idx) for c, idx in sorted(tc.items())}}
                           for t, tc in sorted(turns.items(), key=lambda kv: int(kv[0]))}
    if extra:
        doc.update(extra)
    return doc
