"""Metric definitions against hand-counted expectations (DESIGN.md's results contract, vLLM's names)."""

from __future__ import annotations

import pytest
import torch

from spec_helpers import OracleTreeDrafter
from specbench.engine.loop import Engine, StopCriteria
from specbench.core.request import Request, RequestResult
from specbench.core.sampling import SamplingParams
from specbench.metrics.results import AcceptanceStats, build_results, latency
from specbench.models.loading import load_model


def _result(rid: str, out: list[int], accepted: list[int], depth: list[int], nodes: list[int] | None = None,
            t_first: float = 1.0, times: list[float] = (), sizes: list[int] = ()) -> RequestResult:
    r = RequestResult(request=Request(id=rid, prompt=rid, prompt_ids=[1, 2, 3]), output_ids=list(out))
    r.accepted_per_step, r.draft_lens, r.draft_nodes = list(accepted), list(depth), list(nodes or depth)
    r.t_admit, r.t_first, r.chunk_times, r.chunk_sizes = 0.5, t_first, list(times), list(sizes)
    return r


def test_per_position_keeps_trailing_zeros():
    """k = 4, two drafts that each accepted 1 token: positions 2-4 were never accepted, and still reported."""
    s = AcceptanceStats(4)
    s.record(4, 4, 1)
    s.record(4, 4, 1)
    a = s.summary()
    assert a["per_position"] == [1.0, 0.0, 0.0, 0.0] and a["histogram"] == [0, 2, 0, 0, 0]
    assert a["mean_acceptance_length"] == 2.0 and a["acceptance_rate"] == 0.25


def test_tree_counts_nodes_and_depth_separately():
    """Two tree drafts of 10 nodes, depth 4, accepting 3 and 1; one chain step that proposed nothing."""
    r = _result("a", [0] * 7, accepted=[3, 0, 1], depth=[4, 0, 4], nodes=[10, 0, 10])
    a = AcceptanceStats.from_results([r], k=4).summary()
    assert a["num_drafts"] == 2 and a["num_draft_tokens"] == 20 and a["num_draft_depth_tokens"] == 8
    assert a["num_accepted_tokens"] == 4 and a["mean_acceptance_length"] == 3.0
    assert a["acceptance_rate"] == 0.2 and a["depth_acceptance_rate"] == 0.5
    assert a["per_position"] == [1.0, 0.5, 0.5, 0.0]


def test_tpot_over_kept_tokens():
    """First token at t = 1 s; chunks at 2 s (5 kept) and 3 s (2 kept of 5: the stop trimmed 3): TPOT = 2 s / 7."""
    r = _result("a", [0] * 8, [4, 4], [4, 4], t_first=1.0, times=[2.0, 3.0], sizes=[5, 2])
    lat = latency([r])
    assert lat["tpot_ms"]["mean"] == pytest.approx(2000 / 7)
    assert lat["ttft_ms"]["mean"] == pytest.approx(500.0)
    assert [lat["itl_ms"]["p50"]] == [pytest.approx(1000.0)]


def test_speedup_and_identity_fields():
    """100 tokens in 2 s against a 25 tok/s baseline: speedup 2.0. Greedy: identity reported; T > 0: null."""
    spec = [_result("a", [1, 2, 3], [1], [2]), _result("b", [4, 5], [0], [2])]
    base = [_result("a", [1, 2, 3], [], []), _result("b", [4, 6], [], [])]
    baseline = {"tokens_per_s": 25.0, "wall_s": 4.0}
    cfg = {"temperature": 0.0, "k": 2, "drafter": {"name": "x"}}
    doc = build_results(cfg, spec, 2.0, 3, baseline, base)
    assert doc["totals"]["new_tokens"] == 5 and doc["speedup"] == pytest.approx(2.5 / 25.0)
    assert doc["outputs_match_baseline"] is False and doc["baseline_match_rate"] == 0.5
    assert [r["first_divergence"] for r in doc["requests"]] == [None, 1]
    hundred = [_result("a", [0] * 100, [1], [2])]
    assert build_results(cfg, hundred, 2.0, 3, baseline, hundred)["speedup"] == pytest.approx(2.0)
    sampled = build_results({**cfg, "temperature": 0.7}, spec, 2.0, 3, baseline, base)
    assert sampled["outputs_match_baseline"] is None and sampled["baseline_match_rate"] is None
    assert [r["first_divergence"] for r in sampled["requests"]] == [None, None]
    assert sampled["speedup"] == pytest.approx(0.1)  # the speed comparison still holds at T > 0


def test_engine_reports_tree_nodes_and_depth(tiny_dir):
    """The oracle proposes 8 nodes of depth 4 per step: num_draft_tokens = 8 x drafts, depth tokens = 4 x."""
    lm = load_model(str(tiny_dir), torch.float32, torch.device("cpu"))
    reqs = [Request(id=str(i), prompt="", prompt_ids=p) for i, p in enumerate([[5, 17, 99], [40, 41, 42, 43]])]
    oracle = OracleTreeDrafter(lm.model)
    e = Engine(lm.model, lm.tokenizer, batch_size=2, stop=StopCriteria(frozenset(), 20), params=SamplingParams(),
               progress=False, drafter=oracle, k=4)
    res = e.run(reqs)
    a = AcceptanceStats.from_results(res, 4).summary()
    steps = sum(len(step) for step in oracle.plans)
    assert a["num_drafts"] == steps and a["num_draft_tokens"] == 8 * steps and a["num_draft_depth_tokens"] == 4 * steps
    planned = [acc for step in oracle.plans for acc, _ in step]
    assert a["num_accepted_tokens"] == sum(planned)
    assert a["per_position"] == [sum(p > i for p in planned) / steps for i in range(4)]
