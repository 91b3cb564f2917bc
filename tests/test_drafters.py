"""Contract test over every conf/method/*.yaml with a drafter: proposals have the documented shapes and
dtypes, stay within max_nodes / depth k, and a full run is token-identical to target-only decoding."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import make_eagle_head, make_medusa_head, make_mlp_speculator
from specbench.cli import group_options
from specbench.core.types import DraftTree
from specbench.engine.loop import Engine, StopCriteria
from specbench.core.request import Request
from specbench.core.sampling import SamplingParams
from specbench.models.loading import load_model
from test_cli import _compose

CPU = torch.device("cpu")
METHODS = [m for m in group_options("method") if m != "none"]
PROMPTS = [[5, 17, 99, 3, 250, 7, 8, 5, 17], [40, 41, 42], [300, 3, 9, 11, 12, 300, 3]]


def _drafter(method: str, tiny_dir, tmp_path):
    """Each method's config, instantiated; methods that load weights get ones built for the tiny target. A
    `_lookup` suffix adds prompt lookup grafted onto the drafter's tree (method.lookup); `_deeplookup` with the
    drafter 2 deep and lookup's path up to k (method.lookup.drafter_k)."""
    from specbench.run import build_drafter

    lookup = ["method.lookup.max_n=3", "method.lookup.min_n=1"] if method.endswith("lookup") else []
    if method.endswith("_deeplookup"):  # the drafter drafts 2 deep, lookup's path up to k = 3
        lookup.append("method.lookup.drafter_k=2")
    method = method.removesuffix("_lookup").removesuffix("_deeplookup")
    extra = []
    if method.startswith("draft_model"):
        shape = {"draft_model_tree": ["method.drafter.tree=[2,2,1]"],
                 "draft_model_dynamic": ["method.tree.topk=2", "method.tree.num_draft_tokens=5"]}
        extra = [f"method.drafter.path={tiny_dir}", *shape.get(method, [])]
        method = "draft_model"
    elif method in ("eagle", "eagle3"):
        tcfg = json.loads((tiny_dir / "config.json").read_text())
        make_eagle_head(tmp_path / method, tcfg, version=1 if method == "eagle" else 3, draft_vocab=300,
                        aux_ids=[0, 1, 2], fmt="specforge")
        extra = [f"method.drafter.path={tmp_path / method}"]
    elif method == "medusa":
        tcfg = json.loads((tiny_dir / "config.json").read_text())
        make_medusa_head(tmp_path / method, tcfg, heads=3, layout="vllm", lm_head="own")
        extra = [f"method.drafter.path={tmp_path / method}", "method.tree=cpu_12"]
    elif method == "mlp_speculator":
        make_mlp_speculator(tmp_path / method, json.loads((tiny_dir / "config.json").read_text()), n_predict=3)
        extra = [f"method.drafter.path={tmp_path / method}"]
    cfg = _compose([f"method={method}", *extra, *lookup, "k=3"])
    return build_drafter(cfg)


class Spy:
    """Wraps a drafter and checks every proposal against the DraftTree contract."""

    def __init__(self, inner, k: int) -> None:
        self.inner, self.k, self.calls = inner, k, 0
        self.max_draft_len = inner.max_draft_len

    @property
    def hidden_layers(self):  # read after setup (EAGLE-3 resolves its layers from the target there)
        return self.inner.hidden_layers

    def max_nodes(self, k):
        return self.inner.max_nodes(k)

    def setup(self, *a):
        self.inner.setup(*a)

    def prefill(self, *a):
        self.inner.prefill(*a)

    def commit(self, *a):
        self.inner.commit(*a)

    def propose(self, state) -> DraftTree:
        t = self.inner.propose(state)
        B, N = t.tokens.shape
        assert t.tokens.dtype == torch.long and t.parents.dtype == torch.long and t.lens.dtype == torch.long
        assert t.contract_errors(self.k, self.inner.max_nodes(self.k)) == []
        assert (t.lens * (1 - state.active) == 0).all()  # idle rows propose nothing
        if t.probs is not None:
            assert t.probs.shape == (B, N, state_vocab(state)) and t.probs.dtype == torch.float32
        self.calls += 1
        return t


def state_vocab(state) -> int:
    return Spy.vocab  # set by the test: the target's vocabulary


LOOKUP = ["draft_model_dynamic_lookup", "draft_model_tree_lookup", "eagle3_lookup", "medusa_lookup",
          "mlp_speculator_lookup", "draft_model_tree_deeplookup", "eagle3_deeplookup", "medusa_deeplookup",
          "mlp_speculator_deeplookup"]


@pytest.mark.parametrize("method", METHODS + ["draft_model_tree", "draft_model_dynamic"] + LOOKUP)
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_method_contract(method, temperature, tiny_dir, tmp_path):
    lm = load_model(str(tiny_dir), torch.float32, CPU)
    Spy.vocab = lm.model.config.vocab_size
    k = 3
    params = SamplingParams(temperature=temperature)
    reqs = [Request(id=str(i), prompt="", prompt_ids=p) for i, p in enumerate(PROMPTS)]

    def run(drafter):
        e = Engine(lm.model, lm.tokenizer, batch_size=2, stop=StopCriteria(frozenset(), 10), params=params,
                   seed=1, progress=False, drafter=drafter, k=k if drafter else 0)
        return [r.output_ids for r in e.run(reqs)]

    spy = Spy(_drafter(method, tiny_dir, tmp_path), k)
    out = run(spy)
    assert spy.calls > 0 and all(len(o) == 10 for o in out)
    if method.endswith("lookup") and temperature == 0.0:  # lookup paths were grafted onto the trees, within the
        assert spy.inner.stats["grafted"] > 0, spy.inner.stats  # contract (sampled text here rarely repeats)
    if temperature == 0.0:
        assert out == run(None)


def test_contract_catches_misreported_trees():
    """root -> n0, n1, n2 (three children); n0 -> n3. The host ints width / depth must not under-report."""
    tokens, parents, lens = torch.tensor([[4, 5, 6, 7]]), torch.tensor([[-1, -1, -1, 0]]), torch.tensor([4])
    ok = DraftTree(tokens, parents, lens, depth=2, width=3)
    assert ok.contract_errors(k=3, max_nodes=4) == []
    assert DraftTree(tokens, parents, lens, depth=2, width=2).contract_errors(3, 4) == [
        "width=2 but a node has 3 valid children"]
    assert DraftTree(tokens, parents, lens, depth=1, width=3).contract_errors(3, 4) == [
        "depth=1 but the deepest valid node is at 2 (k=3)"]
    assert DraftTree(tokens, parents, lens, depth=2, width=3).contract_errors(3, 3) == ["4 nodes > max_nodes(3) = 3"]
    bad_pad = DraftTree(tokens, parents, torch.tensor([3]), depth=2, width=3)
    assert "tokens must be >= 0 on valid nodes and PAD_ID past lens" in bad_pad.contract_errors(3, 4)
    chain_lie = DraftTree(tokens, parents, lens, is_chain=True, depth=2, width=3)
    assert "is_chain=True but a node's parent is not the previous node" in chain_lie.contract_errors(3, 4)


def test_under_reported_width_would_drop_children():
    """Why the contract matters: with width=1 the third child (the one the target wants) is never tried."""
    from specbench.verify import verify_greedy

    lg = torch.zeros(1, 5, 10)
    lg[0, 0, 6] = 5.0  # the target wants n2 (token 6) at the root
    tree = dict(tokens=torch.tensor([[4, 5, 6, 7]]), parents=torch.tensor([[-1, -1, -1, 0]]), lens=torch.tensor([4]))
    assert verify_greedy(DraftTree(**tree, depth=2, width=3), lg).num_accepted.tolist() == [1]
    from specbench.verify import verify_sampling

    lies = DraftTree(**tree, depth=2, width=1)
    v = verify_sampling(lies, lg * 10, SamplingParams(1.0), torch.Generator().manual_seed(0))
    assert v.num_accepted.tolist() == [0]  # n2 was dropped: only a recovered token comes out


@pytest.mark.slow
def test_embedded_greedy_identity_every_drafter(embedded, tmp_path):
    """fp32, the embedded SmolLM2: ngram and a draft model (the target's first 2 layers) give exactly the
    target-only greedy output, batch 2."""
    from safetensors.torch import save_file

    import json
    from pathlib import Path

    from specbench.data.prompts import builtin_prompts, to_requests
    from specbench.drafters.draft_model import DraftModelDrafter
    from specbench.drafters.ngram import NgramDrafter
    from specbench.models.loading import hf_state_dict

    cfg = json.loads((Path(embedded.path) / "config.json").read_text())
    cfg["num_hidden_layers"] = 2
    sd = {k: v.contiguous() for k, v in hf_state_dict(embedded.model).items()
          if not k.startswith("model.layers.") or int(k.split(".")[2]) < 2}
    save_file(sd, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    embedded.tokenizer.save_pretrained(str(tmp_path))
    draft = load_model(str(tmp_path), torch.float32, CPU)
    tok = embedded.tokenizer
    reqs = to_requests([builtin_prompts()[i] for i in (3, 6, 12)], tok)

    def run(drafter, k):
        e = Engine(embedded.model, tok, batch_size=2, stop=StopCriteria(frozenset({tok.eos_token_id}), 40),
                   params=SamplingParams(), progress=False, drafter=drafter, k=k)
        return [r.output_ids for r in e.run(reqs)], e.num_steps

    ref, ref_steps = run(None, 0)
    for drafter in (NgramDrafter(min_n=1, max_n=3), DraftModelDrafter(model=draft.model)):
        out, steps = run(drafter, 3)
        assert out == ref, type(drafter).__name__
        assert steps < ref_steps  # some drafts were accepted
