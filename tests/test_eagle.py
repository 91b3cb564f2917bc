"""EAGLE-1 / EAGLE-3: public checkpoint formats (load, export, one-line errors), aux-layer conventions, greedy
identity for chains and dynamic trees, an oracle head that is always accepted, the head's cache against a fresh
recompute after every step, and lossless tree sampling against the exact target distribution."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import make_eagle_head, make_hf_model
from specbench.drafters.eagle import EagleDrafter
from specbench.engine.loop import Engine, StopCriteria
from specbench.core.request import Request
from specbench.core.sampling import SamplingParams
from specbench.errors import UserError
from specbench.models.attention import AttnMeta
from specbench.models.cache import KVCache
from specbench.models.eagle import EagleConfig, load_eagle, resolve_aux_layers, save_eagle
from specbench.models.loading import load_model
from specbench.models.transformer import build_mask

CPU = torch.device("cpu")
PROMPTS = [[5, 17, 99, 3, 250, 7, 8, 5, 17], [40, 41, 42], [300, 3, 9, 11, 12, 300, 3], [6, 7], [9],
           [100, 101, 102, 103, 104, 105]]
TREE = {"topk": 3, "num_draft_tokens": 10}


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("t6")
    make_hf_model(d, layers=6, seed=1)
    return d


@pytest.fixture(scope="module")
def target(target_dir):
    return load_model(str(target_dir), torch.float32, CPU)


@pytest.fixture(scope="module")
def tcfg(target_dir):
    return json.loads((target_dir / "config.json").read_text())


@pytest.fixture(scope="module")
def head3(tmp_path_factory, tcfg):
    d = tmp_path_factory.mktemp("e3")
    make_eagle_head(d, tcfg, draft_vocab=200, aux_ids=[2, 3, 4], fmt="specforge")
    return d


def _reqs(prompts=PROMPTS):
    return [Request(id=str(i), prompt="", prompt_ids=list(p)) for i, p in enumerate(prompts)]


def _run(lm, drafter=None, k=0, batch_size=1, max_new=16, params=SamplingParams(), seed=0, reqs=None, cls=Engine):
    e = cls(lm.model, lm.tokenizer, batch_size=batch_size, stop=StopCriteria(frozenset(), max_new), params=params,
            seed=seed, progress=False, drafter=drafter, k=k)
    return e, e.run(reqs or _reqs())


# ------------------------------------------------------------------------------------------- formats
@pytest.mark.parametrize("fmt", ["reference", "specforge", "speculators"])
def test_public_formats_load(tmp_path, target, tcfg, fmt):
    aux = None if fmt == "reference" else [2, 3, 4]
    sd = make_eagle_head(tmp_path, tcfg, draft_vocab=100, aux_ids=aux, fmt=fmt)
    head = load_eagle(tmp_path, target.model)
    c = head.config
    assert (c.version, c.draft_vocab_size, c.hidden_size) == (3, 100, tcfg["hidden_size"])
    assert c.rope_theta == 10000.0  # the draft's own RoPE (the reference config has no rope_theta)
    assert c.aux_layers == aux
    ids = torch.arange(100) + sd["d2t"]
    assert torch.equal(head.draft_ids, ids) and torch.equal(head.t2d, sd["t2d"])
    assert torch.equal(head.lm_head.weight, sd["lm_head.weight"])
    assert head.embed is target.model.tok_embeddings  # no embedding in the file: the target's
    assert "embed_tokens.weight" not in head.state_dict()


def test_eagle1_format_and_bias_from_keys(tmp_path, target, tcfg):
    make_eagle_head(tmp_path / "b", tcfg, version=1, fc_bias=True)
    make_eagle_head(tmp_path / "n", tcfg, version=1, fc_bias=False)
    with_bias, without = load_eagle(tmp_path / "b", target.model), load_eagle(tmp_path / "n", target.model)
    assert with_bias.config.version == 1 and with_bias.fc.bias is not None and without.fc.bias is None
    assert with_bias.embed is target.model.tok_embeddings  # the file's copy of the embedding is not used
    assert with_bias.logits(torch.randn(2, tcfg["hidden_size"])).shape == (2, tcfg["vocab_size"])


def test_missing_d2t_is_identity_and_own_embedding_is_used(tmp_path, target, tcfg):
    sd = make_eagle_head(tmp_path, tcfg, aux_ids=[2, 3, 4], fmt="specforge", embed=True)
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in sd.items() if k not in ("d2t", "t2d")}, str(tmp_path / "model.safetensors"))
    head = load_eagle(tmp_path, target.model)
    assert torch.equal(head.draft_ids, torch.arange(tcfg["vocab_size"])) and bool(head.t2d.all())
    assert head.embed is not target.model.tok_embeddings
    assert torch.equal(head.embed.weight, sd["embed_tokens.weight"])


@pytest.mark.parametrize("break_it, message", [
    ("hidden", "fc.weight takes"),
    ("vocab", "vocab_size"),
    ("missing", "missing tensor 'midlayer.mlp.up_proj.weight'"),
    ("extra", "unexpected tensor 'input_norm.weight'"),
    ("d2t", "d2t maps draft ids"),
    ("empty", "no *.safetensors"),
    ("json", "not valid JSON"),
])
def test_mismatches_are_one_line_errors(tmp_path, target, tcfg, break_it, message):
    from safetensors.torch import save_file

    cfg = dict(tcfg)
    if break_it == "hidden":
        cfg = {**tcfg, "hidden_size": 32, "intermediate_size": 48, "num_attention_heads": 2, "num_key_value_heads": 1}
    if break_it == "vocab":
        cfg["vocab_size"] = tcfg["vocab_size"] + 1
    sd = make_eagle_head(tmp_path, cfg, draft_vocab=50, aux_ids=[2, 3, 4], fmt="specforge")
    if break_it == "missing":
        sd.pop("midlayer.mlp.up_proj.weight")
    if break_it == "extra":
        sd["input_norm.weight"] = torch.ones(3 * tcfg["hidden_size"])
    if break_it == "d2t":
        sd["d2t"] = sd["d2t"].clone()
        sd["d2t"][-1] = tcfg["vocab_size"]
    save_file({k: v.contiguous() for k, v in sd.items()}, str(tmp_path / "model.safetensors"))
    if break_it == "empty":
        (tmp_path / "model.safetensors").unlink()
    if break_it == "json":
        (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(UserError) as e:
        load_eagle(tmp_path, target.model)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_export_round_trips_bit_exactly_in_the_public_format(tmp_path, target, head3):
    head = load_eagle(head3, target.model)
    head.config.aux_layers = [2, 3, 4]
    save_eagle(head, tmp_path / "out", dtype=torch.bfloat16)
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["num_hidden_layers"] == 1
    assert cfg["draft_vocab_size"] == 200 and cfg["eagle_aux_hidden_state_layer_ids"] == [2, 3, 4]
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 3, 4] and "rope_theta" in cfg
    from safetensors.torch import load_file

    sd = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert sd["d2t"].dtype == torch.int64 and sd["t2d"].dtype == torch.bool
    assert sd["fc.weight"].dtype == torch.bfloat16 and "embed_tokens.weight" not in sd
    assert set(sd) == {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"} | {
        f"midlayer.{n}.weight" for n in ("input_layernorm", "hidden_norm", "post_attention_layernorm",
                                         "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                         "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")}
    again = load_eagle(tmp_path / "out", target.model)
    save_eagle(again, tmp_path / "out2", dtype=torch.bfloat16)
    sd2 = load_file(str(tmp_path / "out2" / "model.safetensors"))
    assert all(torch.equal(sd[k], sd2[k]) for k in sd)


def test_aux_layer_conventions(capsys):
    cfg = EagleConfig(version=3, hidden_size=8, intermediate_size=8, num_heads=2, num_kv_heads=2, head_dim=4,
                      vocab_size=10, draft_vocab_size=10, target_hidden_size=8)
    r = resolve_aux_layers(cfg, 32)
    assert r == {"layers": [2, 16, 29], "source": "default", "convention": "capture_before"}
    assert "WARNING" in capsys.readouterr().err  # the silent failure made loud
    cfg.aux_layers = [2, 16, 29]
    assert resolve_aux_layers(cfg, 32)["layers"] == [2, 16, 29]
    cfg.aux_layers = [1, 15, 28]  # SpecForge's output-of-layer ids: the same physical states
    r = resolve_aux_layers(cfg, 32)
    assert r["layers"] == [2, 16, 29] and r["convention"] == "layer_output"
    assert resolve_aux_layers(cfg, 32, convention="capture_before")["layers"] == [1, 15, 28]
    assert resolve_aux_layers(cfg, 32, override=[3, 4, 5])["source"] == "override"
    with pytest.raises(UserError, match="need 3 ids"):
        resolve_aux_layers(cfg, 32, override=[3, 40, 5])
    with pytest.raises(UserError, match="aux_convention"):
        resolve_aux_layers(cfg, 32, convention="sideways")


# ----------------------------------------------------------------------------------------- decoding
STOP = 0.65  # near the median draft probability of both test heads: chains of every length occur


@pytest.mark.parametrize("tree, stop", [(None, None), (TREE, None), (None, STOP)], ids=["chain", "tree", "chain_stop"])
@pytest.mark.parametrize("batch_size", [1, 3])
def test_greedy_is_token_identical(target, head3, tree, stop, batch_size):
    _, ref = _run(target, max_new=16)
    ref_ids = [r.output_ids for r in ref]
    for k in (1, 2, 3, 5):
        d = EagleDrafter(path=str(head3), tree=tree, stop_below=stop)
        _, res = _run(target, d, k=k, batch_size=batch_size)
        assert [r.output_ids for r in res] == ref_ids, k
        assert d.hidden_layers == (2, 3, 4)


def test_fc_norm_head_eagle_3_1(tmp_path, target, tcfg):
    """EAGLE-3.1 (`"fc_norm": true`): each captured state is RMS-normalised with its own weight before fc,
    computed here by hand; the export keeps the flag and the three norms; greedy stays token-identical."""
    sd = make_eagle_head(tmp_path / "h", tcfg, draft_vocab=200, aux_ids=[2, 3, 4], fmt="specforge", fc_norm=True)
    head = load_eagle(tmp_path / "h", target.model)
    assert head.config.fc_norm and len(head.fc_norm) == 3
    H = tcfg["hidden_size"]
    states = torch.randn(2, 5, 3 * H) * torch.tensor([0.1, 3.0, 40.0]).repeat_interleave(H)  # very unequal scales
    want = []
    for i in range(3):
        x = states[..., i * H:(i + 1) * H]
        want.append(x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-5) * sd[f"fc_norm.{i}.weight"])
    torch.testing.assert_close(head.project(states), torch.cat(want, -1) @ sd["fc.weight"].T, atol=1e-5, rtol=1e-5)
    save_eagle(head, tmp_path / "out", dtype=torch.float32)
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    from safetensors.torch import load_file

    assert cfg["fc_norm"] is True and {f"fc_norm.{i}.weight" for i in range(3)} <= set(load_file(
        str(tmp_path / "out" / "model.safetensors")))
    plain = json.loads((tmp_path / "h" / "config.json").read_text())
    plain.pop("fc_norm")
    (tmp_path / "h" / "config.json").write_text(json.dumps(plain))  # the weights alone say so too
    assert load_eagle(tmp_path / "h", target.model).config.fc_norm
    _, ref = _run(target, max_new=16)
    for tree in (None, TREE):
        _, res = _run(target, EagleDrafter(path=str(tmp_path / "out"), tree=tree), k=3, batch_size=2)
        assert [r.output_ids for r in res] == [r.output_ids for r in ref]


def test_proposals_are_in_the_draft_vocabulary(target, head3):
    d = EagleDrafter(path=str(head3), tree=TREE)
    trees = []
    orig = d.propose
    d.propose = lambda st: trees.append(orig(st)) or trees[-1]
    _run(target, d, k=3, batch_size=2, max_new=8)
    allowed = d.model.t2d
    assert trees and all(bool(allowed[t.tokens[t.tokens >= 0]].all()) for t in trees)
    t = trees[0]
    assert t.tokens.shape[1] == 10 and t.width == 3 and not t.is_chain
    assert (t.depths() <= 3).all() and (t.parents < torch.arange(10)).all()


@pytest.fixture(scope="module")
def per_token(tmp_path_factory):
    """A 1-layer target whose attention output is zero (each token's logits depend on that token alone) and an
    EAGLE-1 head that computes exactly its next feature: the head's drafts are always the target's argmax."""
    from safetensors.torch import save_file

    d = tmp_path_factory.mktemp("pertoken")
    hf = make_hf_model(d, layers=1, seed=4, heads=2, kv_heads=2)
    with torch.no_grad():
        hf.model.layers[0].self_attn.o_proj.weight.zero_()
        hf.model.norm.weight.fill_(1.0)
        hf.model.embed_tokens.weight.mul_(10.0)  # sharp draft distributions: the tree keeps the argmax path
    hf.save_pretrained(str(d), safe_serialization=True)
    H = hf.config.hidden_size
    layer = hf.model.layers[0]
    sd = {"fc.weight": torch.cat([torch.eye(H), torch.zeros(H, H)], 1), "fc.bias": torch.zeros(H),
          "layers.0.post_attention_layernorm.weight": layer.post_attention_layernorm.weight.detach().clone()}
    for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
        w = getattr(layer.self_attn, n).weight.detach().clone()
        sd[f"layers.0.self_attn.{n}.weight"] = w.zero_() if n == "o_proj" else w
    for n in ("gate_proj", "up_proj", "down_proj"):
        sd[f"layers.0.mlp.{n}.weight"] = getattr(layer.mlp, n).weight.detach().clone()
    h = d / "head"
    h.mkdir()
    save_file(sd, str(h / "model.safetensors"))
    cfg = {k: v for k, v in json.loads((d / "config.json").read_text()).items()}
    (h / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 1, "bias": True}))
    return load_model(str(d), torch.float32, CPU), h


@pytest.mark.parametrize("tree", [None, {"topk": 3, "num_draft_tokens": None}], ids=["chain", "tree"])
def test_oracle_head_is_always_accepted(per_token, tree):
    """(The tree keeps every candidate: with fewer nodes EAGLE-2's selection may rightly prefer shallow siblings
    to the deep end of the argmax path.)"""
    lm, head = per_token
    _, ref = _run(lm, max_new=25)
    k = 4
    _, res = _run(lm, EagleDrafter(path=str(head), version=1, tree=tree), k=k, batch_size=2, max_new=25)
    assert [r.output_ids for r in res] == [r.output_ids for r in ref]
    for r in res:  # 1 token from the prefill, then k+1 per step (the last step may be cut by max_new)
        assert r.accepted_per_step[:-1] == [k] * (len(r.accepted_per_step) - 1)


@pytest.mark.parametrize("batch_size", [1, 2])
def test_oracle_head_dynamic_chain_length(per_token, batch_size):
    """stop_below on the always-accepted head: each step accepts exactly the length its row drafted, lengths
    1..k all occur, a row's lengths do not depend on its batch-mates, and the head's state stays exact."""
    lm, head = per_token
    _, ref = _run(lm, max_new=25)
    _, alone = _run(lm, EagleDrafter(path=str(head), version=1, stop_below=STOP), k=4, max_new=25)
    CheckingEngine.checked = 0  # the head's cache and pending pairs after every step, too
    _, res = _run(lm, EagleDrafter(path=str(head), version=1, stop_below=STOP), k=4, batch_size=batch_size,
                  max_new=25, cls=CheckingEngine)
    assert CheckingEngine.checked > 5
    assert [r.output_ids for r in res] == [r.output_ids for r in ref]
    lens = [n for r in res for n in r.draft_lens]
    assert {lens.count(n) > 0 for n in range(1, 5)} == {True}, lens
    for r, a in zip(res, alone):
        assert r.accepted_per_step[:-1] == r.draft_lens[:-1]
        assert r.draft_lens == a.draft_lens


def test_stop_below_needs_a_chain(head3):
    with pytest.raises(UserError, match=r"stop_below=0.5 applies to chains"):
        EagleDrafter(path=str(head3), tree=TREE, stop_below=0.5)
    with pytest.raises(UserError, match=r"stop_below=2: must be in \(0, 1\)"):
        EagleDrafter(path=str(head3), stop_below=2)


class CheckingEngine(Engine):
    """After every step, the head's cached K/V and its pending pairs equal a fresh recompute over the committed
    text: pairs (target states at j, token j+1) for every cached slot j."""

    checked = 0

    def _step(self, slots):
        out = super()._step(slots)
        verdict = out[0]
        st, d, m = self.state, self.drafter, self.target
        lens, d_lens = st.seq_lens.tolist(), d.cache.seq_lens.tolist()
        nacc, tok = verdict.num_accepted.tolist(), verdict.tokens.tolist()
        for b, s in enumerate(slots):
            if s is None:
                continue
            text = s.request.prompt_ids + s.output_ids + tok[b][: nacc[b]]
            n, dn = lens[b], d_lens[b]
            assert n == len(text) and dn == n - 1 - nacc[b]  # head cached + pending = target cached
            fresh = m(torch.tensor([text]), None, hidden_layers=d.hidden_layers)
            feats = d._features(fresh.hidden)  # [1, n, 3H] (EAGLE-3) or [1, n, H] (EAGLE-1)
            cache = KVCache(1, 1, d.model.config.num_kv_heads, n + 1, d.model.config.head_dim, torch.float32)
            nxt = torch.tensor([text[1:dn + 1]])
            slots_ = torch.arange(dn)[None]
            if dn:
                d.model.step(nxt, feats[:, :dn], slots_, cache, (torch.zeros_like(slots_), slots_),
                             AttnMeta(dn, build_mask(cache.seq_lens, dn, dn, None)), from_target=True)
            torch.testing.assert_close(d.cache.k[0, b, :, :dn], cache.k[0, 0, :, :dn], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(d.cache.v[0, b, :, :dn], cache.v[0, 0, :, :dn], atol=1e-5, rtol=1e-5)
            npend = nacc[b] + 1
            torch.testing.assert_close(d.pend_hid[b, :npend], feats[0, dn:n], atol=1e-5, rtol=1e-5)
            assert d.pend_tok[b, :npend].tolist() == (text + [tok[b][nacc[b]]])[dn + 1: n + 1]
            CheckingEngine.checked += 1
        return out


@pytest.mark.parametrize("tree, stop", [(None, None), (TREE, None), (None, STOP)], ids=["chain", "tree", "chain_stop"])
def test_head_state_equals_fresh_recompute_after_every_step(target, head3, tree, stop):
    CheckingEngine.checked = 0
    _run(target, EagleDrafter(path=str(head3), tree=tree, stop_below=stop), k=3, batch_size=2, max_new=12,
         cls=CheckingEngine)
    assert CheckingEngine.checked > 10


def test_oracle_state_after_accepts(per_token):
    """The same recompute check where every draft is accepted (the pending pairs are then k+1 long)."""
    lm, head = per_token
    CheckingEngine.checked = 0
    d = EagleDrafter(path=str(head), version=1)
    _, res = _run(lm, d, k=3, batch_size=2, max_new=16, cls=CheckingEngine)
    assert all(a == 3 for r in res for a in r.accepted_per_step[:-1]) and d.hidden_layers == (1,)
    assert CheckingEngine.checked > 4


@torch.no_grad()
def test_chain_equals_a_manual_greedy_unroll(target, tcfg, tmp_path):
    """The drafter's chain is the head's own greedy unroll: pairs 0..p-1 from target states, then each step
    embeds the previous draft's *target* id (d2t-mapped, not its draft-vocabulary index) with the previous
    output as hidden, one position further. Regression: feeding draft indices to the embedding."""
    from specbench.core.types import Admitted, BatchState

    k = 4
    make_eagle_head(tmp_path, tcfg, draft_vocab=200, aux_ids=[2, 3, 4], fmt="specforge", scale=0.3, seed=7)
    d = EagleDrafter(path=str(tmp_path))
    d.setup(target.model, 1, 64, k, SamplingParams(), torch.Generator())
    ids = torch.tensor([PROMPTS[0] + PROMPTS[2]])
    p = ids.shape[1] - 1
    out = target.model(ids, None, hidden_layers=d.hidden_layers)
    feats = torch.cat(out.hidden, -1)
    st = BatchState(seq_lens=torch.tensor([p]), last=ids[:, p:], active=torch.ones(1, dtype=torch.long),
                    len_bound=p, k=k)
    d.prefill([0], Admitted(st, ids[:, :p], [p]), type(out)(logits=out.logits, hidden=[h[:, :p] for h in out.hidden]))
    chain = d.propose(st).tokens[0].tolist()
    head = d.model
    cache = KVCache(1, 1, head.config.num_kv_heads, 64, head.config.head_dim, torch.float32)
    slots = torch.arange(p)[None]  # pairs (state j, token j+1), j < p; the last token is the sampled one
    o = head.step(ids[:, 1:], feats[:, :p], slots, cache, (torch.zeros_like(slots), slots),
                  AttnMeta(p, build_mask(cache.seq_lens, p, p, None)), from_target=True)[:, -1:]
    cache.seq_lens.fill_(p)
    want = []
    for j in range(k):
        want.append(int(head.draft_ids[head.logits(o[0, 0]).argmax()]))
        s = torch.tensor([[p + j]])
        o = head.step(torch.tensor([[want[-1]]]), o, s, cache, (torch.zeros_like(s), s),
                      AttnMeta(p + 1 + j, build_mask(cache.seq_lens, 1, p + 1 + j, None)), from_target=False)
        cache.seq_lens += 1
    assert chain == want and len(set(want)) > 2  # the drafts depend on the fed-back token
    assert not torch.equal(head.draft_ids, torch.arange(len(head.draft_ids)))  # d2t is not the identity here
