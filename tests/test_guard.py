"""Acceptance guards for the shipped drafters (like vLLM's acceptance-length test): a few prompts on the embedded
SmolLM2 target in float32, greedy; the mean acceptance length must stay within 5% (relative) of the value recorded
in tests/guards/*.json, each per-position rate within 5% (less two drafts of slack for near-tie flips of another
CPU's fp32 kernels), and the output must equal target-only decoding token for token.

Record again after a deliberate change (the command is in experiments/README.md):
    python tests/test_guard.py --record
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

GUARDS = Path(__file__).resolve().parent / "guards"
ROOT = Path(__file__).resolve().parents[1]
MT_BENCH = Path(os.environ.get("SPECBENCH_DATA", ROOT.parent / "shared" / "data")) / "mt_bench" / "question.jsonl"
TOLERANCE = 0.05


def _prompts(source: str):
    from specbench.data.prompts import builtin_prompts, load_prompts

    if source == "builtin":
        return [builtin_prompts()[i] for i in (0, 3, 6, 12)]
    return load_prompts("jsonl", str(MT_BENCH), per_category=1)[:4]


SHAPES = {"eagle3": (3, None), "draft_model": (4, None), "medusa": (4, "cpu_12"), "mlp_speculator": (3, None)}  # (k, tree) recorded per method


def measure(lm, method: str, source: str, k: int = 3, max_new: int = 96, tree=None) -> dict:
    from specbench.data.prompts import to_requests
    from specbench.drafters.draft_model import DraftModelDrafter
    from specbench.drafters.eagle import EagleDrafter
    from specbench.drafters.medusa import MedusaDrafter
    from specbench.drafters.mlp_speculator import MLPSpeculatorDrafter
    from specbench.engine.loop import Engine, StopCriteria
    from specbench.core.sampling import SamplingParams
    from specbench.metrics.results import AcceptanceStats

    tok = lm.tokenizer
    reqs = to_requests(_prompts(source), tok)
    drafter = {"eagle3": lambda: EagleDrafter(), "draft_model": lambda: DraftModelDrafter(),
               "medusa": lambda: MedusaDrafter(tree=tree), "mlp_speculator": lambda: MLPSpeculatorDrafter(tree=tree)}[method]()

    def run(d):
        e = Engine(lm.model, tok, batch_size=2, stop=StopCriteria(frozenset({tok.eos_token_id}), max_new),
                   params=SamplingParams(), progress=False, drafter=d, k=k if d else 0)
        return e.run(reqs)

    res, ref = run(drafter), run(None)
    acc = AcceptanceStats.from_results(res, k).summary()
    return {"method": method, "prompts": source, "k": k, "tree": tree, "max_new_tokens": max_new, "dtype": "float32",
            "mean_acceptance_length": acc["mean_acceptance_length"], "per_position": acc["per_position"],
            "num_drafts": acc["num_drafts"],
            "identical_to_target_only": [r.output_ids for r in res] == [r.output_ids for r in ref]}


def _cases():
    return sorted(GUARDS.glob("*.json")) if GUARDS.is_dir() else []


@pytest.mark.slow
@pytest.mark.parametrize("path", _cases(), ids=lambda p: p.stem)
def test_acceptance_guard(embedded, path):
    want = json.loads(path.read_text())
    if want["prompts"] == "mt_bench" and not MT_BENCH.is_file():
        pytest.skip(f"{MT_BENCH} is not here (set SPECBENCH_DATA); the builtin-prompt guard still runs")
    got = measure(embedded, want["method"], want["prompts"], want["k"], want["max_new_tokens"], want.get("tree"))
    assert got["identical_to_target_only"], "greedy speculative output differs from target-only (float32)"
    floor = (1 - TOLERANCE) * want["mean_acceptance_length"]
    assert got["mean_acceptance_length"] >= floor, (got["mean_acceptance_length"], want["mean_acceptance_length"])
    slack = 2 / want["num_drafts"]  # two drafts: a near-tie flip on another CPU's fp32 kernels, not a regression
    for i, (g, w) in enumerate(zip(got["per_position"], want["per_position"])):
        assert g >= (1 - TOLERANCE) * w - slack, f"position {i}: {g:.3f} < 95% of recorded {w:.3f}"


def test_guards_cover_the_shipped_drafters():
    names = {(json.loads(p.read_text())["method"], json.loads(p.read_text())["prompts"]) for p in _cases()}
    assert {(m, s) for m in SHAPES for s in ("builtin", "mt_bench")} <= names


if __name__ == "__main__" and "--record" in sys.argv:
    from specbench.models.loading import load_model

    lm = load_model(None, torch.float32, torch.device("cpu"))
    GUARDS.mkdir(exist_ok=True)
    methods = [a.split("=", 1)[1] for a in sys.argv if a.startswith("--method=")] or list(SHAPES)
    for method in methods:
        for source in ("builtin", "mt_bench"):
            doc = measure(lm, method, source, *SHAPES[method][:1], tree=SHAPES[method][1])
            (GUARDS / f"{method}_{source}.json").write_text(json.dumps(doc, indent=2) + "\n")
            print(json.dumps(doc))
