"""Decode a list of cases with every method, single process or under torchrun; each rank writes what it decoded.

    python tests/parallel_worker.py SPEC.json OUT               # single process: the reference
    torchrun --nproc-per-node 2 tests/parallel_worker.py SPEC.json OUT   # spec's tp / pp

SPEC: {"target": folder, "tp", "pp", "async", "bounds", "heads": {name: folder}, "eos": [ids], "prompts": [[ids]],
       "cases": [{"name", "method", "k", "batch", "max_new", "temperature", "seed", "tree", "draft_tp", "lookup", "drafter_k"}]}
OUT.rank<r>.json: {case name: {"ids": [[...]], "acc": [[...]], "plans": [[planned, accepted], ...] | null}}.
`fail_rank` / `fail_step` (optional): that rank exits with status 1 at that step of the first case (a rank that
dies mid-run, for the hang test).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from spec_helpers import OracleTreeDrafter  # noqa: E402

from specbench import parallel  # noqa: E402
from specbench.core.request import Request  # noqa: E402
from specbench.core.sampling import SamplingParams  # noqa: E402
from specbench.engine.loop import Engine, StopCriteria  # noqa: E402
from specbench.models.loading import load_model  # noqa: E402

CPU = torch.device("cpu")


def drafter_for(case: dict, spec: dict, full):
    d = _drafter(case, spec, full)
    if case.get("lookup"):  # method.lookup: prompt lookup grafted onto the drafter's tree
        from specbench.drafters.ngram import LookupUnion
        d = LookupUnion(d, 1, 3, drafter_k=case.get("drafter_k"))
    return d


def _drafter(case: dict, spec: dict, full):
    m, heads, tree = case["method"], spec["heads"], case.get("tree")
    if m == "none":
        return None
    if m == "ngram":
        from specbench.drafters.ngram import NgramDrafter
        return NgramDrafter(min_n=1, max_n=3)
    if m in ("draft_model", "draft_model_self"):
        from specbench.drafters.draft_model import DraftModelDrafter
        return DraftModelDrafter(path=heads["draft"] if m == "draft_model" else spec["target"],
                                 stop_below=case.get("stop_below"), tree=tree if isinstance(tree, list) else None,
                                 dynamic=tree if isinstance(tree, dict) else None)
    if m in ("eagle3", "eagle"):
        from specbench.drafters.eagle import EagleDrafter
        return EagleDrafter(path=heads[m], version=3 if m == "eagle3" else 1, tree=tree,
                            stop_below=case.get("stop_below"))
    if m == "medusa":
        from specbench.drafters.medusa import MedusaDrafter
        return MedusaDrafter(path=heads["medusa"], tree=tree)
    if m == "mlp_speculator":
        from specbench.drafters.mlp_speculator import MLPSpeculatorDrafter
        return MLPSpeculatorDrafter(path=heads["mlp_speculator"], tree=tree)
    if m == "oracle":
        return OracleTreeDrafter(full)
    raise ValueError(m)


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    out_base = sys.argv[2]
    torch.set_num_threads(1)
    tp, pp = (spec.get("tp", 1), spec.get("pp", 1)) if parallel.launched_world() else (1, 1)
    topo = parallel.init(tp, pp, 1, CPU, timeout_s=spec.get("timeout_s", 60), allreduce=spec.get("allreduce", "auto"))
    lm = load_model(spec["target"], torch.float32, CPU)
    full = load_model(spec["target"], torch.float32, CPU).model  # the oracle drafter reads the whole target
    target = parallel.apply(lm.model, topo)
    requests = [Request(id=str(i), prompt=f"p{i}", prompt_ids=list(p)) for i, p in enumerate(spec["prompts"])]
    fail_rank, fail_step = spec.get("fail_rank"), spec.get("fail_step")
    out = {}
    Engine.exact_lens_on_cpu = not spec.get("bounds", False)  # True: the CUDA path's length bounds
    for n, case in enumerate(spec["cases"]):
        t = dataclasses.replace(topo, draft_tp=case.get("draft_tp", 1) if topo.parallel else 1)
        drafter = drafter_for(case, spec, full)
        parallel.shard_drafter(drafter, t, case["method"])
        params = SamplingParams(case.get("temperature", 0.0))
        eng = Engine(target, lm.tokenizer, batch_size=case["batch"],
                     stop=StopCriteria(frozenset(spec.get("eos", [])), case["max_new"]), params=params,
                     seed=case.get("seed", 0), progress=False, drafter=drafter, k=case.get("k", 0), topology=t,
                     async_scheduling=spec.get("async", False))
        if n == 0 and fail_rank == topo.rank:
            step = eng._step

            def dying(*a, **kw):
                if eng.num_steps >= fail_step:
                    os._exit(1)
                return step(*a, **kw)

            eng._step = dying
        res = eng.run(requests)
        plans = drafter.plans if case["method"] == "oracle" and t.is_leader else None
        out[case["name"]] = {"ids": [r.output_ids for r in res], "acc": [r.accepted_per_step for r in res],
                             "plans": plans, "finish": [r.finish_reason for r in res],
                             "nodes": [r.draft_nodes for r in res], "discarded": eng.discarded_rows,
                             "steps": eng.num_steps, "timing": eng.timing}
    out["_allreduce"] = topo.extra.get("allreduce")
    Path(f"{out_base}.rank{topo.rank}.json").write_text(json.dumps(out))


if __name__ == "__main__":
    main()
    if parallel.launched_world():
        parallel.leave(0)
