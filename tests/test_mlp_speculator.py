"""MLP speculator: the forward against a direct transcription of the fms equations (tied / untied, scale_input
on / off), the HF layout in and out (prefixed or not, sharded, tied tensors stored once or repeated), one-line
errors for misfits, and greedy identity of the chain at batch 1 and 3 for k = 1..n_predict."""

from __future__ import annotations

import json
import math

import pytest
import torch

from conftest import make_mlp_speculator
from specbench.core.request import Request
from specbench.core.sampling import SamplingParams
from specbench.drafters.mlp_speculator import MLPSpeculatorDrafter
from specbench.engine.loop import Engine, StopCriteria
from specbench.errors import UserError
from specbench.models.mlp_speculator import load_mlp_speculator, save_mlp_speculator

PROMPTS = [[5, 17, 99, 3, 250, 7, 8, 5, 17], [40, 41, 42], [300, 3, 9, 11, 12, 300, 3], [6, 7], [9]]


@pytest.fixture(scope="module")
def tcfg(tiny_dir):
    return json.loads((tiny_dir / "config.json").read_text())


def fms_reference(sd: dict, s: torch.Tensor, x: torch.Tensor, n: int, inner: int, scale_input: bool) -> list:
    """The equations, written out: w_s = 0.5^(0.5/n), w_e = sqrt((1 - w_s^2) * inner / 2);
    s = proj_i s + (w_e / w_s) emb_i[x]; s = GELU(rms(s) * g + b); logits = head_i s; x = argmax."""
    ws = 0.5 ** (0.5 / n)
    we = math.sqrt((1 - ws * ws) * inner / 2)
    if scale_input:
        s = s / torch.sqrt((s * s).mean(-1, keepdim=True) + 1e-6) / math.sqrt(2)
    out = []
    for i in range(n):
        s = s @ sd[f"proj.{i}.weight"].T + (we / ws) * sd[f"emb.{i}.weight"][x]
        s = s / torch.sqrt((s * s).mean(-1, keepdim=True) + 1e-6) * sd[f"ln.{i}.weight"] + sd[f"ln.{i}.bias"]
        s = 0.5 * s * (1 + torch.erf(s / math.sqrt(2)))
        logits = s @ sd[f"head.{i}.weight"].T
        out.append(logits)
        x = logits.argmax(-1)
    return out


@pytest.mark.parametrize("tie", [False, True])
@pytest.mark.parametrize("scale_input", [False, True])
def test_forward_is_the_fms_equations(tiny_lm, tcfg, tmp_path, tie, scale_input):
    sd = make_mlp_speculator(tmp_path / "m", tcfg, n_predict=3, inner_dim=48, tie=tie, scale_input=scale_input)
    m = load_mlp_speculator(tmp_path / "m", tiny_lm.model)
    g = torch.Generator().manual_seed(2)
    s0, x = torch.randn(4, tcfg["hidden_size"], generator=g) * 3, torch.randint(0, 384, (4,), generator=g)
    want = fms_reference(sd, s0, x, 3, 48, scale_input)
    s, xi = m.start(s0), x
    for i in range(3):
        s, logits = m.stage(i, s, xi)
        torch.testing.assert_close(logits, want[i], atol=1e-4, rtol=1e-4)
        xi = logits.argmax(-1)
    if tie:
        assert m.emb[2].weight is m.emb[0].weight and m.proj[2].weight is m.proj[1].weight
        assert m.proj[1].weight is not m.proj[0].weight


@pytest.mark.parametrize("kw", [dict(prefix=""), dict(shards=True), dict(tie=True, store_tied_once=True),
                                dict(tie=True), dict(inner_dim=0)], ids=["no_prefix", "sharded", "tied_once",
                                                                         "tied_repeated", "inner_eq_emb"])
def test_layouts_load_and_round_trip(tiny_lm, tcfg, tmp_path, kw):
    make_mlp_speculator(tmp_path / "m", tcfg, inner_dim=kw.pop("inner_dim", 40), **kw)
    m = load_mlp_speculator(tmp_path / "m", tiny_lm.model)
    out = save_mlp_speculator(m, tmp_path / "out", dtype=torch.float32)
    back = load_mlp_speculator(out, tiny_lm.model)
    s, x = torch.randn(2, tcfg["hidden_size"]), torch.tensor([3, 4])
    torch.testing.assert_close(back.stage(0, back.start(s), x)[1], m.stage(0, m.start(s), x)[1])
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "mlp_speculator" and cfg["n_predict"] == 3


def test_bad_checkpoints(tiny_lm, tcfg, tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        load_mlp_speculator(tmp_path / "none", tiny_lm.model)
    make_mlp_speculator(tmp_path / "wide", dict(tcfg, hidden_size=96))
    with pytest.raises(UserError, match="emb_dim 96 != the target's hidden size 64"):
        load_mlp_speculator(tmp_path / "wide", tiny_lm.model)
    make_mlp_speculator(tmp_path / "voc", dict(tcfg, vocab_size=100))
    with pytest.raises(UserError, match="vocab_size 100 != the target's 384"):
        load_mlp_speculator(tmp_path / "voc", tiny_lm.model)
    make_mlp_speculator(tmp_path / "once", tcfg, store_tied_once=True, tie=False)
    from safetensors.torch import load_file, save_file

    sd = load_file(str(tmp_path / "once" / "model.safetensors"))
    del sd["speculator.head.2.weight"]
    save_file(sd, str(tmp_path / "once" / "model.safetensors"))
    with pytest.raises(UserError, match="missing tensor 'head.2.weight'"):
        load_mlp_speculator(tmp_path / "once", tiny_lm.model)
    with pytest.raises(UserError, match=r"method.tree='cpu': null \(a chain\)"):
        MLPSpeculatorDrafter(path="x", tree="cpu")


def _node_paths(tree, b: int) -> set[tuple[int, ...]]:
    """Every node of row b as the token path from the root to it."""
    toks, par = tree.tokens[b].tolist(), tree.parents[b].tolist()
    out = set()
    for n in range(int(tree.lens[b])):
        path, m = [], n
        while m >= 0:
            path.insert(0, toks[m])
            m = par[m]
        out.add(tuple(path))
    return out


def test_candidate_tree_is_fms_generate_suffixes(tiny_lm, tcfg, tmp_path):
    """Reference on the host: every path of the per-stage top-k tokens, the best n by summed log-probability,
    each candidate's prefixes as nodes (shared ones once)."""
    make_mlp_speculator(tmp_path / "m", tcfg, n_predict=3, inner_dim=40, seed=3)
    d = MLPSpeculatorDrafter(path=str(tmp_path / "m"), tree={"top_k": [3, 2, 2], "n_candidates": 5})
    from specbench.core.sampling import RowGenerators
    from specbench.core.types import BatchState

    d.setup(tiny_lm.model, 2, 64, 3, SamplingParams(), RowGenerators(2, torch.device("cpu")))
    d.state = torch.randn(2, tcfg["hidden_size"], generator=torch.Generator().manual_seed(4)) * 2
    st = BatchState(seq_lens=torch.tensor([5, 5]), last=torch.tensor([[7], [9]]), active=torch.tensor([1, 1]),
                    len_bound=5, k=3)
    tree = d.propose(st)
    assert tree.contract_errors(3, d.max_nodes(3)) == [] and d.max_nodes(3) == 15
    m = d.model
    for b in range(2):
        paths = [((), 0.0, m.start(d.state[b]), int(st.last[b, 0]))]
        for i, t in enumerate([3, 2, 2]):
            nxt = []
            for toks, lp, s, x in paths:
                s2, logits = m.stage(i, s, torch.tensor(x))
                v, idx = torch.log_softmax(logits, -1).topk(t)
                nxt += [(toks + (int(j),), lp + float(w), s2, int(j)) for w, j in zip(v, idx)]
            paths = nxt
        best = sorted(paths, key=lambda p: -p[1])[:5]
        want = {c[0][:L] for c in best for L in range(1, 4)}
        assert _node_paths(tree, b) == want and int(tree.lens[b]) == len(want) < 15  # prefixes were shared


@pytest.mark.parametrize("tree", [None, {"top_k": [3, 2, 2, 1], "n_candidates": 4}], ids=["chain", "tree"])
@pytest.mark.parametrize("batch_size", [1, 3])
def test_greedy_is_token_identical(tiny_lm, tcfg, tmp_path, batch_size, tree):
    make_mlp_speculator(tmp_path / "m", tcfg, n_predict=4, inner_dim=40)
    reqs = [Request(id=str(i), prompt="", prompt_ids=list(p)) for i, p in enumerate(PROMPTS)]

    def run(d, k):
        e = Engine(tiny_lm.model, tiny_lm.tokenizer, batch_size=batch_size, stop=StopCriteria(frozenset(), 16),
                   params=SamplingParams(), progress=False, drafter=d, k=k)
        return [r.output_ids for r in e.run(reqs)]

    ref = run(None, 0)
    for k in range(1, 5):
        assert run(MLPSpeculatorDrafter(path=str(tmp_path / "m"), tree=tree), k) == ref, k
    with pytest.raises(UserError, match="k=5: this MLP speculator has n_predict=4"):
        run(MLPSpeculatorDrafter(path=str(tmp_path / "m")), 5)


def test_compact_form_uses_the_targets_tables(tiny_lm, tcfg, tmp_path):
    """specbench_target_tables: proj / ln stored, emb / head the target's own; the full export writes them in and
    loads in the plain public layout with the same outputs; a compact file whose inner_dim is not the target's
    hidden size is a one-line error."""
    from safetensors.torch import load_file

    from specbench.models.mlp_speculator import MLPSpeculator, MLPSpeculatorConfig, target_tables

    t = tiny_lm.model
    H, V = tcfg["hidden_size"], tcfg["vocab_size"]
    cfg = MLPSpeculatorConfig(emb_dim=H, inner_dim=H, vocab_size=V, n_predict=3, scale_input=True, target_tables=True)
    m = MLPSpeculator(cfg, target_tables(t))
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.2)
    assert not any(k.startswith(("emb.", "head.")) for k in m.state_dict())
    s, x = torch.randn(2, H), torch.tensor([3, 4])
    st, want = m.stage(0, m.start(s), x)
    # the equations by hand with the target's tables
    e = t.tok_embeddings.weight[x]
    z = m.proj[0](m.start(s)) + (m.emb_weight / m.state_weight) * e
    z = z * torch.rsqrt(z.pow(2).mean(-1, keepdim=True) + 1e-6) * m.ln[0].weight + m.ln[0].bias
    torch.testing.assert_close(want, torch.nn.functional.gelu(z) @ t.output.weight.T)

    save_mlp_speculator(m, tmp_path / "compact", dtype=torch.float32, compact=True)
    save_mlp_speculator(m, tmp_path / "full", dtype=torch.float32)
    raw = json.loads((tmp_path / "compact" / "config.json").read_text())
    assert raw["specbench_target_tables"] is True
    assert not any(".emb." in k or ".head." in k for k in load_file(str(tmp_path / "compact" / "model.safetensors")))
    full = json.loads((tmp_path / "full" / "config.json").read_text())
    assert "specbench_target_tables" not in full
    sd = load_file(str(tmp_path / "full" / "model.safetensors"))
    assert {f"speculator.head.{i}.weight" for i in range(3)} <= set(sd)
    for folder in ("compact", "full"):
        back = load_mlp_speculator(tmp_path / folder, t)
        assert (back.tables is not None) == (folder == "compact")
        torch.testing.assert_close(back.stage(0, back.start(s), x)[1], want)
    raw["inner_dim"] = H // 2
    (tmp_path / "compact" / "config.json").write_text(json.dumps(raw))
    with pytest.raises(UserError, match=f"needs inner_dim {H // 2} = the target's hidden size {H}"):
        load_mlp_speculator(tmp_path / "compact", t)


def test_shipped_speculator_is_the_default(tiny_lm):
    """path=null loads the speculator shipped for the embedded target; on another target that is a one-line
    error naming the fix."""
    from specbench.drafters.mlp_speculator import SHIPPED

    d = MLPSpeculatorDrafter()
    assert d.path == str(SHIPPED) and (SHIPPED / "config.json").is_file()
    with pytest.raises(UserError, match=r"shipped speculator is for the embedded SmolLM2-135M-Instruct; give "
                                        r"method.drafter.path=\.\.\."):
        d.setup(tiny_lm.model, 1, 64, 3, SamplingParams(), None)
