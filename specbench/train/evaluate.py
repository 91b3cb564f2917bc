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
