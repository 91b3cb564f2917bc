"""Medusa: both public layouts in (own / shared / target lm_head, L = 2, more heads than the config says, with
and without bias, reduced vocabulary) and out, the forward against the ResBlock equations, one-line errors,
proposals = the heads' own top-k picks, greedy identity for chain and static trees at batch 1 and 3."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import make_medusa_head
from specbench.core.request import Request
from specbench.core.sampling import SamplingParams
from specbench.drafters.medusa import CPU_12, MC_SIM_7B_63, MedusaDrafter, tree_layout
from specbench.engine.loop import Engine, StopCriteria
from specbench.errors import UserError
from specbench.models.loading import load_model
from specbench.models.medusa import load_medusa, save_medusa

CPU = torch.device("cpu")
PROMPTS = [[5, 17, 99, 3, 250, 7, 8, 5, 17], [40, 41, 42], [300, 3, 9, 11, 12, 300, 3], [6, 7], [9],
           [100, 101, 102, 103, 104, 105]]


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    return load_model(str(tiny_dir), torch.float32, CPU)


@pytest.fixture(scope="module")
def tcfg(tiny_dir):
    return json.loads((tiny_dir / "config.json").read_text())


def reference_logits(ref: dict, x: torch.Tensor, heads: int, layers: int, target_head: torch.Tensor,
                     token_map: list[int] | None = None) -> torch.Tensor:
    """Medusa's forward transcribed from the paper / reference: y = x; y = y + SiLU(W y + b) per block;
    logits = lm_head(y) (the head's own, or the base model's)."""
    out = []
    for h in range(heads):
        y = x
        for l in range(layers):
            w, b = ref[f"{h}.{l}.linear.weight"], ref.get(f"{h}.{l}.linear.bias")
            z = y @ w.T + (b if b is not None else 0)
            y = y + z * torch.sigmoid(z)
        head = ref.get(f"{h}.{layers}.weight")
        if head is None:
            head = target_head if token_map is None else target_head[token_map]
        out.append(y @ head.T)
    return torch.stack(out, -2)


CASES = {
    "vllm_own": dict(layout="vllm", lm_head="own"),
    "vllm_shared_L2": dict(layout="vllm", lm_head="shared", layers=2),
    "vllm_no_bias": dict(layout="vllm", lm_head="own", bias=False),
    "vllm_token_map": dict(layout="vllm", lm_head="own", token_map=[2, 5, 7, 11, 40, 41, 42, 99, 300, 301]),
    "fd_own_pt": dict(layout="faster_decoding", lm_head="own", fmt="pt"),
    "fd_target_head_v2": dict(layout="faster_decoding", lm_head="target"),
    "fd_more_heads_than_config": dict(layout="faster_decoding", lm_head="own", heads=5, config_heads=2),
    "fd_L2_no_bias": dict(layout="faster_decoding", lm_head="own", layers=2, bias=False),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_load_public_layouts(tiny, tcfg, tmp_path, case):
    kw = CASES[case]
    ref = make_medusa_head(tmp_path / case, tcfg, **kw)
    heads = load_medusa(tmp_path / case, tiny.model)
    n, L = kw.get("heads", 3), kw.get("layers", 1)
    assert heads.config.num_heads == n and heads.config.num_layers == L
    x = torch.randn(4, tcfg["hidden_size"], generator=torch.Generator().manual_seed(1))
    want = reference_logits(ref, x, n, L, tiny.model.output.weight, kw.get("token_map"))
    torch.testing.assert_close(heads.logits(x), want, atol=1e-5, rtol=1e-5)
    if kw.get("token_map"):
        assert heads.token_ids.tolist() == kw["token_map"]


@pytest.mark.parametrize("kind", ["own", "shared", "target"])
@pytest.mark.parametrize("layout", ["vllm", "faster_decoding"])
def test_export_round_trip(tiny, tcfg, tmp_path, kind, layout):
    src_layout = "vllm" if kind == "shared" else "faster_decoding"
    make_medusa_head(tmp_path / "src", tcfg, layout=src_layout, lm_head=kind, layers=2)
    heads = load_medusa(tmp_path / "src", tiny.model)
    out = save_medusa(heads, tmp_path / "out", layout=layout, dtype=torch.float32)
    back = load_medusa(out, tiny.model)
    x = torch.randn(3, tcfg["hidden_size"])
    torch.testing.assert_close(back.logits(x), heads.logits(x))
    cfg = json.loads((out / "config.json").read_text())
    if layout == "vllm":
        assert cfg["model_type"] == "medusa" and cfg["num_heads"] == 3 and cfg["num_hidden_layers"] == 2
        assert cfg["original_lm_head"] == (kind != "own")  # the target's head is stored as the shared one
    else:
        assert cfg["medusa_num_heads"] == 3 and cfg["medusa_num_layers"] == 2


def test_compact_export_keeps_the_target_head_out(tiny, tcfg, tmp_path):
    make_medusa_head(tmp_path / "src", tcfg, layout="faster_decoding", lm_head="target")
    heads = load_medusa(tmp_path / "src", tiny.model)
    out = save_medusa(heads, tmp_path / "compact", store_target_head=False, dtype=torch.float32)
    from safetensors.torch import load_file

    assert not any("lm_head" in k for k in load_file(str(out / "model.safetensors")))
    back = load_medusa(out, tiny.model)
    x = torch.randn(2, tcfg["hidden_size"])
    torch.testing.assert_close(back.logits(x), heads.logits(x))


def test_bad_checkpoints(tiny, tcfg, tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        load_medusa(tmp_path / "nothing", tiny.model)
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no medusa_lm_head.pt"):
        load_medusa(tmp_path / "empty", tiny.model)
    wide = dict(tcfg, hidden_size=tcfg["hidden_size"] * 2)
    make_medusa_head(tmp_path / "wide", wide, layout="faster_decoding")
    with pytest.raises(UserError, match=r"hidden size 128 != the target's 64"):
        load_medusa(tmp_path / "wide", tiny.model)
    other = dict(tcfg, vocab_size=100)
    make_medusa_head(tmp_path / "vocab", other, layout="vllm")
    with pytest.raises(UserError, match=r"vocabulary 100 != the target's 384"):
        load_medusa(tmp_path / "vocab", tiny.model)
    from safetensors.torch import load_file, save_file

    make_medusa_head(tmp_path / "missing", tcfg, layout="vllm")
    sd = load_file(str(tmp_path / "missing" / "model.safetensors"))
    del sd["lm_heads.1.weight"]
    save_file(sd, str(tmp_path / "missing" / "model.safetensors"))
    with pytest.raises(UserError, match="lm_heads"):
        load_medusa(tmp_path / "missing", tiny.model)
    sd = load_file(str(tmp_path / "missing" / "model.safetensors"))
    sd["blocks.0.extra.weight"] = torch.zeros(1)
    save_file(sd, str(tmp_path / "missing" / "model.safetensors"))
    with pytest.raises(UserError, match="unexpected tensor 'blocks.0.extra.weight'"):
        load_medusa(tmp_path / "missing", tiny.model)
    (tmp_path / "bad_pt").mkdir()
    (tmp_path / "bad_pt" / "medusa_lm_head.pt").write_bytes(b"not a pickle")
    with pytest.raises(UserError, match="cannot read"):
        load_medusa(tmp_path / "bad_pt", tiny.model)


def test_trees():
    paths, parents = tree_layout(MC_SIM_7B_63, 4)
    assert len(paths) == 63 and max(map(len, paths)) == 4 and max(p[-1] for p in paths) == 9
    assert paths[:3] == [(0,), (1,), (2,)] and all(parents[i] < i for i in range(63))
    assert len(tree_layout(MC_SIM_7B_63, 2)[0]) == 10 + 28  # counted by hand: 10 at depth 1, 28 at depth 2
    assert len(tree_layout(MC_SIM_7B_63, 3)[0]) == 61  # 23 at depth 3; the 2 at depth 4 go
    assert len(tree_layout(CPU_12, 4)[0]) == 12
    with pytest.raises(UserError, match=r"path \[0, 1\] has no parent path"):
        tree_layout([[1], [0, 1]], 3)
    with pytest.raises(UserError, match="valid presets"):
        MedusaDrafter(path="x", tree="huge")


def _run(lm, drafter=None, k=0, batch_size=1, max_new=16, params=SamplingParams(), prompts=PROMPTS, seed=0):
    reqs = [Request(id=str(i), prompt="", prompt_ids=list(p)) for i, p in enumerate(prompts)]
    e = Engine(lm.model, lm.tokenizer, batch_size=batch_size, stop=StopCriteria(frozenset(), max_new),
               params=params, seed=seed, progress=False, drafter=drafter, k=k)
    return e, e.run(reqs)


@pytest.mark.parametrize("tree", [None, "cpu_12", [[0], [1], [0, 0], [1, 0], [0, 0, 0], [0, 1], [0, 0, 1]]],
                         ids=["chain", "cpu_12", "custom"])
@pytest.mark.parametrize("batch_size", [1, 3])
def test_greedy_is_token_identical(tiny, tcfg, tmp_path, tree, batch_size):
    make_medusa_head(tmp_path / "h", tcfg, heads=4, layout="faster_decoding", lm_head="target", scale=0.05)
    _, ref = _run(tiny)
    for k in range(1, 5):
        d = MedusaDrafter(path=str(tmp_path / "h"), tree=tree)
        e, res = _run(tiny, d, k=k, batch_size=batch_size)
        assert [r.output_ids for r in res] == [r.output_ids for r in ref], (tree, k)
        assert all(0 <= a <= min(k, 4) for r in res for a in r.accepted_per_step)


def test_proposals_are_the_heads_top_k(tiny, tcfg, tmp_path):
    """The tree's tokens are exactly the heads' own picks: node (r1, r2) = head 1's rank-r2 token."""
    make_medusa_head(tmp_path / "h", tcfg, heads=3, layout="vllm", lm_head="own")
    d = MedusaDrafter(path=str(tmp_path / "h"), tree=[[0], [2], [0, 1], [2, 0], [0, 1, 3]])
    from specbench.core.sampling import RowGenerators
    from specbench.core.types import BatchState

    d.setup(tiny.model, 2, 64, 3, SamplingParams(), RowGenerators(2, CPU))
    d.state = torch.randn(2, tcfg["hidden_size"], generator=torch.Generator().manual_seed(3))
    st = BatchState(seq_lens=torch.tensor([5, 5]), last=torch.zeros(2, 1, dtype=torch.long),
                    active=torch.tensor([1, 1]), len_bound=5, k=3)
    t = d.propose(st)
    order = d.model.logits(d.state).argsort(-1, descending=True)  # [B, heads, V] rows by rank
    for b in range(2):
        want = [order[b, 0, 0], order[b, 0, 2], order[b, 1, 1], order[b, 1, 0], order[b, 2, 3]]
        assert t.tokens[b].tolist() == [int(x) for x in want]
    assert t.parents[0].tolist() == [-1, -1, 0, 1, 2] and t.depth == 3 and t.width == 2
    assert t.contract_errors(3, d.max_nodes(3)) == []


def test_k_above_the_head_count_is_an_error(tiny, tcfg, tmp_path):
    make_medusa_head(tmp_path / "h", tcfg, heads=2)
    with pytest.raises(UserError, match=r"k=3: this Medusa head has 2 heads"):
        _run(tiny, MedusaDrafter(path=str(tmp_path / "h")), k=3)


def test_typical_run_is_flagged_lossy(tiny_dir, tcfg, tmp_path, monkeypatch):
    from specbench.run import run
    from test_cli import _compose

    make_medusa_head(tmp_path / "h", tcfg, heads=4, layout="faster_decoding", lm_head="target")
    cfg = _compose([f"model.path={tiny_dir}", "method=medusa", f"method.drafter.path={tmp_path / 'h'}",
                    "method.tree=cpu_12", "k=4", "acceptance=typical", "temperature=0.7", "max_new_tokens=8",
                    "dataset.limit=2", "progress=false", "dtype=float32"])
    monkeypatch.chdir(tmp_path)
    doc = run(cfg)
    assert doc["config"]["acceptance_rule"] == {"rule": "typical", "lossless": False}
    assert doc["outputs_match_baseline"] is None and doc["config"]["drafter"]["tree_nodes"] == 12
    assert len(doc["acceptance"]["per_position"]) in (0, 4)
