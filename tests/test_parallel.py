"""Tensor and pipeline parallel decoding under torchrun (gloo, CPU): every method's output is the single-process
run's, token for token (greedy float32 and seeded sampling, chains and trees, batch 1 and 3, ragged acceptance,
refills); one rank writes results; bad input exits 2 on every rank; a rank that dies stops the others."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import make_eagle_head, make_hf_model, make_medusa_head, make_mlp_speculator
from specbench.errors import UserError

WORKER = Path(__file__).resolve().parent / "parallel_worker.py"
PROMPTS = [[5, 17, 99, 3, 250, 7, 8, 5, 17], [40, 41, 42], [300, 3, 9, 11, 12, 300, 3], [6, 7],
           [100, 101, 102, 103, 104, 105]]
TIMEOUT = 300  # seconds for one launch: a hang fails the test instead of CI


def _env() -> dict:
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")


def torchrun(nproc: int, *args: str, cwd: Path, log_dir: Path | None = None, timeout: int = TIMEOUT):
    extra = ["--log-dir", str(log_dir), "--redirects", "3"] if log_dir else []
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
           *extra, *args]
    return subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout)


def _perturbed_copy(src: Path, dst: Path, noise: float, seed: int = 1) -> None:
    """The target with noise on every matrix: a draft model that agrees with it often but not always."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    g = torch.Generator().manual_seed(seed)
    sd = load_file(str(dst / "model.safetensors"))
    for k, v in sd.items():
        if v.dim() == 2:
            sd[k] = v + torch.randn(v.shape, generator=g) * v.std() * noise
    save_file(sd, str(dst / "model.safetensors"), metadata={"format": "pt"})


CHAIN3 = dict(k=3)
CASES = [
    *[dict(name=f"{m}_b{b}", method=m, batch=b, **CHAIN3)
      for m in ("none", "ngram", "draft_model", "draft_model_self", "eagle3", "eagle", "medusa", "mlp_speculator")
      for b in (1, 3)],
    dict(name="eagle3_tree_b3", method="eagle3", batch=3, k=3, tree={"topk": 2, "num_draft_tokens": 6}),
    dict(name="eagle_tree_b1", method="eagle", batch=1, k=3, tree={"topk": 2, "num_draft_tokens": 5}),
    dict(name="medusa_tree_b3", method="medusa", batch=3, k=3, tree=[[0], [1], [0, 0], [1, 0], [0, 0, 0]]),
    dict(name="mlp_tree_b3", method="mlp_speculator", batch=3, k=3, tree={"top_k": [2, 2, 1], "n_candidates": 3}),
    dict(name="oracle_b1", method="oracle", batch=1, k=4),
    dict(name="oracle_b3", method="oracle", batch=3, k=4),
    dict(name="sample_draft_b3", method="draft_model", batch=3, k=3, temperature=0.8, seed=3),
    dict(name="sample_eagle3_tree_b3", method="eagle3", batch=3, k=3, temperature=0.8, seed=5,
         tree={"topk": 2, "num_draft_tokens": 6}),
    dict(name="sample_none_b1", method="none", batch=1, temperature=0.8, seed=4),
    dict(name="draft_tp_b3", method="draft_model", batch=3, k=3, draft_tp=2),
    dict(name="draft_tp_self_b1", method="draft_model_self", batch=1, k=4, draft_tp=2),
    dict(name="sample_draft_tp_b3", method="draft_model", batch=3, k=3, temperature=0.8, seed=3, draft_tp=2),
    # dynamic draft length: every rank must stop drafting at the same token (thresholds near the median)
    dict(name="stop_draft_tp_b3", method="draft_model", batch=3, k=4, draft_tp=2, stop_below=0.015),
    dict(name="stop_eagle3_b3", method="eagle3", batch=3, k=4, stop_below=0.65),
    dict(name="tree_draft_tp_b3", method="draft_model", batch=3, k=3, draft_tp=2, tree=[2, 2, 1]),  # a draft tree
    dict(name="sample_tree_draft_b3", method="draft_model", batch=3, k=3, temperature=0.8, seed=3, tree=[2, 1, 1]),
    dict(name="dyn_tree_draft_tp_b3", method="draft_model", batch=3, k=3, draft_tp=2,  # EAGLE-2 selection
         tree={"topk": 2, "num_draft_tokens": 5}),
    # prompt lookup grafted onto a sharded draft's dynamic tree (every drafting rank keeps the histories; the
    # lookup path runs 4 deep, the draft's tree 2), and onto EAGLE-3's sampled chain
    dict(name="lookup_dyn_draft_tp_b3", method="draft_model", batch=3, k=4, draft_tp=2, lookup=True, drafter_k=2,
         tree={"topk": 2, "num_draft_tokens": 5}),
    dict(name="sample_lookup_eagle3_b3", method="eagle3", batch=3, k=3, temperature=0.8, seed=5, lookup=True),
]
for c in CASES:
    c.setdefault("max_new", 20)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    """A 4-layer target (4 heads, 2 KV heads: splits over 2 ranks), its drafters in their public layouts, the
    single-process reference outputs, and an EOS id the target emits mid-answer for one prompt."""
    from specbench.core.request import Request
    from specbench.engine.loop import Engine, StopCriteria
    from specbench.core.sampling import SamplingParams
    from specbench.models.loading import load_model

    d = tmp_path_factory.mktemp("par")
    make_hf_model(d / "target", layers=4)
    cfg = json.loads((d / "target" / "config.json").read_text())
    _perturbed_copy(d / "target", d / "draft", noise=0.1)
    make_eagle_head(d / "eagle3", cfg, aux_ids=[1, 2, 3], fmt="specforge")  # layer 1 on stage 0, 2 and 3 on 1
    make_eagle_head(d / "eagle", cfg, version=1)
    make_medusa_head(d / "medusa", cfg, heads=3)
    make_mlp_speculator(d / "mlp", cfg, n_predict=3)
    lm = load_model(str(d / "target"), torch.float32, torch.device("cpu"))
    reqs = [Request(id=str(i), prompt="", prompt_ids=p) for i, p in enumerate(PROMPTS)]
    outs = [r.output_ids for r in Engine(lm.model, lm.tokenizer, batch_size=1, stop=StopCriteria(frozenset(), 20),
                                         params=SamplingParams(), progress=False).run(reqs)]
    eos = next(t for i, o in enumerate(outs) for t in o[6:14]  # one request stops mid-answer, the others run on
               if t not in o[:6] and all(t not in p for j, p in enumerate(outs) if j != i))
    spec = {"target": str(d / "target"), "prompts": PROMPTS, "eos": [eos], "cases": CASES,
            "heads": {"draft": str(d / "draft"), "eagle3": str(d / "eagle3"), "eagle": str(d / "eagle"),
                      "medusa": str(d / "medusa"), "mlp_speculator": str(d / "mlp")}}
    (d / "spec.json").write_text(json.dumps(spec))
    r = subprocess.run([sys.executable, str(WORKER), str(d / "spec.json"), str(d / "ref")], env=_env(),
                       capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr[-3000:]
    return d, spec, json.loads((d / "ref.rank0.json").read_text())


def _launch(bundle, tag: str, nproc: int, names=None, **layout) -> list[dict]:
    d, spec, _ = bundle
    s = d / f"spec_{tag}.json"
    cases = [c for c in spec["cases"] if names is None or c["name"] in names]
    s.write_text(json.dumps({**spec, **layout, "cases": cases}))
    r = torchrun(nproc, str(WORKER), str(s), str(d / tag), cwd=d)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-4000:])
    return [json.loads((d / f"{tag}.rank{i}.json").read_text()) for i in range(nproc)]


def _check(bundle, ranks: list[dict], names=None) -> None:
    ref = bundle[2]
    for case in CASES:
        n = case["name"]
        if names is not None and n not in names:
            continue
        for rank, got in enumerate(ranks):
            assert got[n]["ids"] == ref[n]["ids"], (n, rank)
            assert got[n]["acc"] == ref[n]["acc"], (n, rank)
            assert got[n]["nodes"] == ref[n]["nodes"], (n, rank)  # the same draft lengths


def _check_acceptance(bundle) -> None:
    """The reference itself exercises what it should: long accepted paths, ragged rows, an early EOS."""
    ref = bundle[2]
    assert all(a == 4 for row in ref["draft_tp_self_b1"]["acc"] for a in row[:-1])  # self-draft: all accepted
    acc = [a for row in ref["draft_model_b3"]["acc"] for a in row]
    assert max(acc) == 3 and 0 in acc and 1 <= sum(acc) / len(acc) <= 2.5, acc  # ragged
    plans = [p for step in ref["oracle_b3"]["plans"] for p in step]
    assert all(planned == accepted for planned, accepted in plans) and max(p for p, _ in plans) == 4
    for n in ("stop_draft_tp_b3", "stop_eagle3_b3"):  # stop_below drafted every length 1..4
        nodes = {x for row in ref[n]["nodes"] for x in row}
        assert nodes >= {1, 2, 3, 4}, (n, nodes)
    lens = [len(x) for x in ref["none_b1"]["ids"]]
    assert min(lens) < 20 == max(lens), lens  # the EOS request stopped early; others ran to the budget


@pytest.mark.slow
@pytest.mark.parametrize("allreduce", ["shm", "gloo"])
def test_tp2_matches_single_process(bundle, allreduce):
    _check_acceptance(bundle)
    ranks = _launch(bundle, f"tp2_{allreduce}", 2, tp=2, allreduce=allreduce)
    assert [r["_allreduce"] for r in ranks] == [allreduce, allreduce]
    _check(bundle, ranks)


@pytest.mark.slow
def test_pp2_matches_single_process(bundle):
    names = [c["name"] for c in CASES if "draft_tp" not in c]  # draft_tp = tp = 1 here
    _check(bundle, _launch(bundle, "pp2", 2, names, pp=2), names)


@pytest.mark.slow
def test_tp2_pp2_matches_single_process(bundle):
    d, spec, _ = bundle
    names = ["ngram_b3", "eagle3_tree_b3", "oracle_b3", "sample_draft_b3", "draft_tp_b3", "medusa_tree_b3"]
    _check(bundle, _launch(bundle, "tp2pp2", 4, names, tp=2, pp=2), names)


@pytest.mark.slow
def test_dead_rank_stops_the_others(bundle):
    """Rank 1 exits mid-decode: rank 0, waiting in a collective, is stopped too, well within the limit."""
    d, spec, _ = bundle
    s = d / "spec_fail.json"
    s.write_text(json.dumps({**spec, "tp": 2, "fail_rank": 1, "fail_step": 3, "timeout_s": 20,
                             "cases": [c for c in CASES if c["name"] == "draft_model_b3"]}))
    import time

    t0 = time.perf_counter()
    r = torchrun(2, str(WORKER), str(s), str(d / "fail"), cwd=d, timeout=120)
    assert r.returncode != 0
    assert time.perf_counter() - t0 < 60
    assert not (d / "fail.rank0.json").exists()


# ---------------------------------------------------------------------------------------- async scheduling
def _check_async(bundle, got: dict, names) -> None:
    """Every case's outputs, accepted counts, finish reasons and draft sizes are the sync run's; the optimistic
    launch really happened (rows stepped after their request stopped, their tokens discarded) and the
    bookkeeping overlapped the next step."""
    ref = bundle[2]
    for n in names:
        for key in ("ids", "acc", "finish", "nodes"):
            assert got[n][key] == ref[n][key], (n, key)
        t = got[n]["timing"]
        assert 0 <= t["host_critical_s"] <= t["host_s"] and t["host_critical_s"] <= t["host_handoff_s"], n
        assert ref[n]["discarded"] == 0 and ref[n]["timing"]["host_overlap_s"] == 0, n
    # most of the bookkeeping ran beside the next step (a drafter that holds the GIL in Python loops, like the
    # oracle's host-side greedy search, can starve the worker thread: not every case need overlap)
    overlap = sum(got[n]["timing"]["host_overlap_s"] for n in names)
    assert overlap > 0.5 * sum(got[n]["timing"]["host_s"] for n in names)
    assert sum(got[n]["timing"]["host_overlap_s"] > 0 for n in names) >= 0.8 * len(names)
    # every request stops in some step and its row runs one more (discarded) step before it is refilled
    assert all(got[n]["discarded"] >= len(bundle[1]["prompts"]) for n in names), [got[n]["discarded"] for n in names]


@pytest.mark.slow
def test_async_matches_sync_every_method(bundle):
    """parallel.async=true in one process: every method, chain and tree, batch 1 and 3 (5 requests in 3 rows:
    refills), greedy and seeded sampling, an EOS mid-answer -- identical to the synchronous loop. With the
    CUDA path's length bounds (the host never reads a step back before launching the next)."""
    d, spec, _ = bundle
    s = d / "spec_async.json"
    s.write_text(json.dumps({**spec, "async": True, "bounds": True}))
    r = subprocess.run([sys.executable, str(WORKER), str(s), str(d / "async")], env=_env(), capture_output=True,
                       text=True, timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads((d / "async.rank0.json").read_text())
    names = [c["name"] for c in CASES]
    assert {"eagle3_tree_b3", "medusa_tree_b3", "mlp_tree_b3", "oracle_b3", "sample_eagle3_tree_b3"} <= set(names)
    _check_async(bundle, got, names)


@pytest.mark.slow
def test_async_pp2_matches_sync(bundle):
    """async x pipeline parallel x speculation (the combination that corrupts outputs elsewhere): every stage
    commits the leader's verdict while the previous step is booked on a worker thread."""
    names = ["none_b3", "ngram_b3", "draft_model_b3", "eagle3_b3", "eagle3_tree_b3", "medusa_tree_b3",
             "mlp_tree_b3", "oracle_b3", "sample_draft_b3", "sample_eagle3_tree_b3"]
    ranks = _launch(bundle, "pp2_async", 2, names, pp=2, **{"async": True})
    for got in ranks:
        _check_async(bundle, got, names)


# ----------------------------------------------------------------------------------------------- the CLI
def _cli_args(model: Path, *extra: str) -> list[str]:
    return ["-m", "specbench", f"model.path={model}", "max_new_tokens=8", "dataset.limit=2", "dtype=float32",
            "progress=false", *extra]


@pytest.mark.slow
def test_cli_tp2_one_writer(bundle, tmp_path):
    """`torchrun -m specbench parallel.tp=2`: one results.json (tp, pp, draft_tp, world size, per-rank
    communication), a summary naming the layout, one JSONL metrics file, outputs equal to the baseline."""
    d = bundle[0]
    run = tmp_path / "run"
    r = torchrun(2, *_cli_args(d / "target", "method=draft_model", f"method.drafter.path={d / 'draft'}",
                               "parallel.tp=2", "parallel.draft_tp=2", "logger=jsonl", f"hydra.run.dir={run}"),
                 cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads((run / "results.json").read_text())
    c = doc["config"]
    assert (c["tp"], c["pp"], c["draft_tp"], c["world_size"]) == (2, 1, 2, 2)
    assert doc["outputs_match_baseline"] is True
    ranks = doc["parallel"]["ranks"]
    assert [x["rank"] for x in ranks] == [0, 1]
    assert all(x["comm"]["speculative"]["calls"]["all_reduce"] > 0 for x in ranks)
    assert "tp=2 pp=1 draft_tp=2 (world 2)" in r.stdout
    assert r.stdout.count("specbench summary") == 1
    assert sorted(p.name for p in run.iterdir() if p.suffix == ".jsonl") == ["steps.jsonl"]


def _per_rank_errors(log_dir: Path) -> list[str]:
    return [p.read_text() for p in sorted(log_dir.rglob("stderr.log"))]


BAD = [
    (["parallel.tp=1"], 2, "world size 2 (torchrun processes) != parallel.tp × parallel.pp = 1 × 1"),
    (["parallel.tp=2", "parallel.draft_tp=3"], 2, "parallel.draft_tp=3: valid: 1 or parallel.tp (2)"),
    (["parallel.tp=2", "parallel.draft_tp=2", "method=ngram"], 2, "method=ngram has no draft transformer"),
    (["parallel.tp=2", "model.path={heads3}"], 2, "num_attention_heads=3, not divisible by 2"),
    (["parallel.tp=2", "model.path={kv1}"], 2, "num_key_value_heads=1, not divisible by 2"),
    (["parallel.pp=2", "model.path={one_layer}"], 2, "parallel.pp=2: the target has 1 layers; valid: 1..1"),
    (["parallel.tp=2", "parallel.allreduce=mpi"], 2, "parallel.allreduce='mpi': valid: auto, gloo, shm"),
]


@pytest.fixture(scope="module")
def odd_models(tmp_path_factory):
    d = tmp_path_factory.mktemp("odd")
    make_hf_model(d / "heads3", heads=3, kv_heads=1, hidden=48)
    make_hf_model(d / "kv1", heads=4, kv_heads=1)
    make_hf_model(d / "one_layer", layers=1)
    return {k: str(d / k) for k in ("heads3", "kv1", "one_layer")}


@pytest.mark.slow
@pytest.mark.parametrize("args,nproc,needle", BAD)
def test_bad_parallel_input_exits_2_on_every_rank(bundle, odd_models, tmp_path, args, nproc, needle):
    d = bundle[0]
    args = [a.format(**odd_models) for a in args]
    r = torchrun(nproc, *_cli_args(d / "target", *args, f"hydra.run.dir={tmp_path / 'run'}"), cwd=tmp_path,
                 log_dir=tmp_path / "logs", timeout=120)
    assert r.returncode != 0
    errs = _per_rank_errors(tmp_path / "logs")
    assert len(errs) == nproc
    for e in errs:
        lines = [ln for ln in e.splitlines() if ln.startswith("error:")]
        assert len(lines) == 1 and needle in lines[0], e[-2000:]
        assert "Traceback" not in e
    codes = re.findall(r"^\s*exitcode\s+:\s*(\S+)", r.stderr, re.M)  # torchrun's summary: one per rank it saw fail
    assert codes and set(codes) == {"2"}, r.stderr[-2000:]
    assert not (tmp_path / "run" / "results.json").exists()


def test_tp_without_torchrun_exits_2(bundle, tmp_path):
    env = {k: v for k, v in _env().items() if k not in ("WORLD_SIZE", "RANK")}
    r = subprocess.run([sys.executable, *_cli_args(bundle[0] / "target", "parallel.tp=2")], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1] == ("error: parallel.tp=2 parallel.pp=1 need 2 processes: launch with "
                                                 "torchrun --nproc-per-node 2 -m specbench ...")


def test_check_divisible_names_each_size():
    from specbench.models.config import ModelConfig
    from specbench.parallel.tp import check_divisible

    base = dict(vocab_size=10, hidden_size=64, num_layers=2, num_heads=8, num_kv_heads=4, intermediate_size=96,
                head_dim=8)
    check_divisible(ModelConfig(**base), 4)
    for field, value, name in (("num_heads", 6, "num_attention_heads=6"), ("num_kv_heads", 2, "num_key_value_heads=2"),
                               ("intermediate_size", 90, "intermediate_size=90")):
        with pytest.raises(UserError, match=f"{name}, not divisible by 4; valid tp for it: 1, 2"):
            check_divisible(ModelConfig(**{**base, field: value}), 4)


def test_stage_layers_split():
    from specbench.parallel.pp import stage_layers

    assert [stage_layers(30, 4, s) for s in range(4)] == [(0, 8), (8, 16), (16, 23), (23, 30)]
    assert [stage_layers(30, 2, s) for s in range(2)] == [(0, 15), (15, 30)]
    with pytest.raises(UserError, match="parallel.pp=5: the target has 4 layers"):
        stage_layers(4, 5, 0)
