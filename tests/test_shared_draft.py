"""A draft model that shares the target's embedding and lm_head (`train.method.target_tables=true`): the tables
are frozen and never saved, the export is the compact form plus the complete HF model, loading puts the
target's own tensors in place, and a reduced head (`draft_vocab_size`, EAGLE-3's d2t) drafts only its
vocabulary while the output stays the target's. Tied and untied targets."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from conftest import TINY_CORPUS, make_hf_model, write_jsonl
from specbench.core.request import Request
from specbench.core.sampling import SamplingParams
from specbench.data.prompts import Prompt
from specbench.drafters.draft_model import DraftModelDrafter
from specbench.engine.loop import Engine, StopCriteria
from specbench.errors import UserError
from specbench.models.loading import hf_state_dict, load_model
from specbench.models.shared_draft import FLAG, compact_state_dict
from specbench.train.data import load_examples, tokenize
from specbench.train.draft_model import DraftModelMethod, greedy_chain_drafts
from specbench.train.evaluate import chain_walk
from specbench.train.trainer import Trainer, TrainSettings

CPU = torch.device("cpu")
PROMPTS = [[5, 17, 99, 3, 250, 7, 8], [40, 41, 42], [300, 3, 9, 11, 12]]


@pytest.fixture(scope="module", params=["untied", "tied"])
def target(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(f"target_{request.param}")
    make_hf_model(d, tie=request.param == "tied")
    return load_model(str(d), torch.float32, CPU)


@pytest.fixture(scope="module")
def items(target, tmp_path_factory):
    recs = [{"instruction": TINY_CORPUS[i % 4].split()[0], "output": " ".join(TINY_CORPUS[i % 4].split()[1:] * 2)}
            for i in range(16)]
    return tokenize(load_examples(write_jsonl(tmp_path_factory.mktemp("data") / "d.jsonl", recs)), target.tokenizer, 48)


def _method(target, items, **kw):
    prompts = [Prompt(id="0", prompt="the quick brown")]
    return DraftModelMethod(target.model, target.tokenizer, target_tables=True, items=items, eval_prompts=prompts,
                            eval_k=3, eval_max_new_tokens=8, **{"layers": [0], **kw})


def _keys(path) -> set[str]:
    with safe_open(str(path), "pt") as f:
        return set(f.keys())


def test_tables_are_the_targets_frozen_and_not_saved(target, items, tmp_path):
    m = _method(target, items)
    trained = {n for n, p in m.student.named_parameters() if p.requires_grad}
    assert trained and not any(n.startswith(("tok_embeddings", "output")) for n in trained)
    emb0 = m.student.tok_embeddings.weight.detach().clone()
    layer0 = m.student.layers[0].attn.wqkv.weight.detach().clone()
    Trainer(m, items, TrainSettings(steps=4, batch_size=4, lr=1e-2, warmup=1, eval_every=0, save_every=2,
                                    log_every=2, bf16=False), tmp_path / "run", progress=False).fit()
    assert torch.equal(m.student.tok_embeddings.weight, emb0)  # frozen
    assert torch.equal(emb0, target.model.tok_embeddings.weight.float())
    assert not torch.equal(m.student.layers[0].attn.wqkv.weight, layer0)  # the layers did train
    assert not any(k.startswith(("tok_embeddings", "output")) for k in m.state_dict())
    saved = _keys(tmp_path / "run/checkpoint/model.safetensors")
    assert not any(k.startswith(("tok_embeddings", "output")) for k in saved)

    m.export(tmp_path / "model")
    cfg = json.loads((tmp_path / "model/config.json").read_text())
    assert cfg[FLAG] is True and "draft_vocab_size" not in cfg
    assert not (tmp_path / "model/tokenizer.json").exists() and (tmp_path / "model/full/tokenizer.json").is_file()
    keys = _keys(tmp_path / "model/model.safetensors")
    assert keys == {k for k in hf_state_dict(m.student) if k.startswith("model.layers.")} | {"model.norm.weight"}
    full = load_model(str(tmp_path / "model/full"), torch.float32, CPU).model  # the complete HF model
    assert full.config.num_layers == 1
    assert torch.equal(full.tok_embeddings.weight, target.model.tok_embeddings.weight.bfloat16().float())
    assert torch.equal(full.output.weight, target.model.output.weight.bfloat16().float())

    d = DraftModelDrafter(path=str(tmp_path / "model"))
    d.setup(target.model, 2, 64, 3, SamplingParams(), torch.Generator())
    assert d.model.tok_embeddings.weight.data_ptr() == target.model.tok_embeddings.weight.data_ptr()  # shared
    assert d.model.output.weight.data_ptr() == target.model.output.weight.data_ptr()
    assert d.vocab_ids is None
    for k, v in d.model.layers.state_dict().items():
        assert torch.equal(v, full.layers.state_dict()[k]), k


def _save_compact(method, folder, ids=None):
    """The compact folder in float32 (the trainer's export is bf16) so a copy of the target is exact."""
    folder.mkdir(parents=True)
    save_file(compact_state_dict(hf_state_dict(method.student), ids), str(folder / "model.safetensors"))
    cfg = {**method.student.config.to_hf(), FLAG: True}
    if ids is not None:
        cfg["draft_vocab_size"] = len(ids)
    (folder / "config.json").write_text(json.dumps(cfg))
    return str(folder)


class Recording(DraftModelDrafter):
    def __init__(self, **kw):
        super().__init__(**kw)
        self.drafted: list[int] = []

    def propose(self, state):
        tree = super().propose(state)
        self.drafted.extend(tree.tokens[state.active.bool()].flatten().tolist())
        return tree


def _run(target, drafter, k=3, max_new=20):
    e = Engine(target.model, target.tokenizer, batch_size=2, stop=StopCriteria(frozenset(), max_new),
               params=SamplingParams(), seed=0, progress=False, drafter=drafter, k=k)
    return e.run([Request(id=str(i), prompt="", prompt_ids=list(p)) for i, p in enumerate(PROMPTS)])


def test_self_draft_accepts_everything_and_a_reduced_head_only_its_vocabulary(target, items, tmp_path):
    """The target's own layers with its tables: every draft is accepted. With the head reduced to the
    reference output's tokens less one (X), the drafts stay in that vocabulary, X is never drafted, so every
    step whose next token is X rejects there, and the output is still the target's, token for token."""
    ref = _run(target, None, 0)
    m = _method(target, items, layers=[0, 1])
    full = Recording(path=_save_compact(m, tmp_path / "full"))
    out = _run(target, full)
    assert [r.output_ids for r in out] == [r.output_ids for r in ref]
    for r in out:  # k accepted at every step but the last, which the 20-token limit may cut short
        assert all(a == 3 for a in r.accepted_per_step[:-1]), r.accepted_per_step

    produced = [t for r in ref for t in r.output_ids]
    x = max(set(produced), key=produced.count)  # the most frequent output token leaves the vocabulary
    ids = torch.tensor(sorted(set(produced) - {x}))
    reduced = Recording(path=_save_compact(m, tmp_path / "reduced", ids))
    out = _run(target, reduced)
    assert [r.output_ids for r in out] == [r.output_ids for r in ref]
    assert reduced.vocab_ids.tolist() == ids.tolist()
    assert reduced.drafted and set(reduced.drafted) <= set(ids.tolist()) and x not in reduced.drafted
    accepted = sum(sum(r.accepted_per_step) for r in out)
    assert 0 < accepted < sum(sum(r.accepted_per_step) for r in _run(target, Recording(path=str(tmp_path / "full"))))


def test_reduced_head_sampling_puts_no_mass_outside(target, items, tmp_path):
    m = _method(target, items, layers=[0, 1])
    ids = torch.tensor([2, 5, 17, 40, 99])
    d = DraftModelDrafter(path=_save_compact(m, tmp_path / "r", ids), temperature=1.0, stop_below=0.5)
    d.setup(target.model, 1, 32, 2, SamplingParams(1.0), torch.Generator().manual_seed(0))
    x, q, conf = d._pick(torch.tensor([[0.0, 1.0, 2.0, 3.0, 4.0]]), torch.Generator().manual_seed(1))
    assert q.shape == (1, target.model.config.vocab_size) and int(x) in ids.tolist()
    assert float(conf) == float(q[0, x])  # stop_below reads the drawn token's draft probability
    torch.testing.assert_close(q[0, ids], torch.softmax(torch.arange(5.0), 0))
    assert float(q.sum()) == pytest.approx(1.0) and float(q[0].index_fill(0, ids, 0).abs().sum()) == 0


def test_reduced_loss_of_the_targets_own_layers_is_zero(target, items):
    """Student = target (all its layers, its tables): over the draft vocabulary both distributions are the
    target's renormalised, so the KL is 0 and the top-1 agreement 1."""
    batch = torch.nn.utils.rnn.pad_sequence([torch.tensor(x.ids) for x in items[:4]], batch_first=True)
    mask = torch.nn.utils.rnn.pad_sequence([torch.tensor(x.loss_mask, dtype=torch.float) for x in items[:4]],
                                           batch_first=True)
    for vocab in (None, 12):
        m = _method(target, items, layers=[0, 1], draft_vocab_size=vocab)
        assert vocab is None or len(m.vocab_ids) == 12
        loss, stats = m.loss(batch, mask)
        assert abs(float(loss.detach())) < 1e-4 and stats["top1_agreement"] == 1.0


def test_bad_settings_and_folders(target, items, tmp_path):
    with pytest.raises(UserError, match="draft_vocab_size=8: .* needs train.method.target_tables=true"):
        DraftModelMethod(target.model, target.tokenizer, draft_vocab_size=8)
    with pytest.raises(UserError, match="target_tables=true needs the target's width: hidden_size 32 != 64"):
        DraftModelMethod(target.model, target.tokenizer, init="scratch", width={"hidden_size": 32},
                         target_tables=True)
    m = _method(target, items)
    bad = tmp_path / "dup"
    _save_compact(m, bad, torch.tensor([3, 4, 5]))
    sd = {k: v for k, v in compact_state_dict(hf_state_dict(m.student), None).items()}
    save_file({**sd, "d2t": torch.tensor([3, 2, 1])}, str(bad / "model.safetensors"))  # ids 3, 3, 3
    with pytest.raises(UserError, match="d2t maps draft ids outside 0..383 or not increasing"):
        DraftModelDrafter(path=str(bad)).setup(target.model, 1, 32, 2, SamplingParams(), torch.Generator())
    save_file({**sd, "model.embed_tokens.weight": target.model.tok_embeddings.weight}, str(bad / "model.safetensors"))
    with pytest.raises(UserError, match="weights hold 'model.embed_tokens.weight'"):
        DraftModelDrafter(path=str(bad)).setup(target.model, 1, 32, 2, SamplingParams(), torch.Generator())
    other = tmp_path / "other_target"
    make_hf_model(other, hidden=32, heads=2, kv_heads=1)
    narrow = load_model(str(other), torch.float32, CPU).model
    with pytest.raises(UserError, match="needs the target's vocabulary and width"):
        DraftModelDrafter(path=_save_compact(m, tmp_path / "wide")).setup(narrow, 1, 32, 2, SamplingParams(),
                                                                         torch.Generator())


def test_train_cli_target_tables(tmp_path, tiny_dir):
    recs = [{"instruction": TINY_CORPUS[i % 4].split()[0], "output": " ".join(TINY_CORPUS[i % 4].split()[1:])}
            for i in range(12)]
    data = write_jsonl(tmp_path / "d.jsonl", recs)
    args = [sys.executable, "-m", "specbench.train", f"model.path={tiny_dir}", f"data.paths=[{data}]",
            "data.eval_prompts=2", "train.steps=2", "train.batch_size=2", "progress=false", "method.layers=[0]",
            "dtype=float32", f"hydra.run.dir={tmp_path / 'run'}", "method.target_tables=true",
            "method.draft_vocab_size=30"]
    p = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    cfg = json.loads((tmp_path / "run/model/config.json").read_text())
    assert cfg[FLAG] is True and cfg["draft_vocab_size"] == 30
    assert "d2t" in _keys(tmp_path / "run/model/model.safetensors")
    assert "model.embed_tokens.weight" in _keys(tmp_path / "run/model/full/model.safetensors")
    run = subprocess.run([sys.executable, "-m", "specbench", f"model.path={tiny_dir}", "method=draft_model",
                          f"method.drafter.path={tmp_path / 'run/model'}", "k=2", "dataset.limit=1",
                          "max_new_tokens=8", "dtype=float32", f"hydra.run.dir={tmp_path / 'dec'}"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    bad = subprocess.run([*args, "data.teacher=cached"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "draft_vocab_size=30 with data.teacher=cached" in bad.stderr


def test_init_from_continues_a_run_or_an_exported_draft(target, items, tmp_path):
    m = _method(target, items, draft_vocab_size=40)
    Trainer(m, items, TrainSettings(steps=2, batch_size=4, lr=1e-2, warmup=1, eval_every=0, save_every=2,
                                    log_every=2, bf16=False), tmp_path / "run", progress=False).fit()
    m.export(tmp_path / "model")
    trained = {k: v for k, v in m.student.state_dict().items() if k.startswith(("layers.", "norm."))}
    fresh = _method(target, items).student.state_dict()  # the target's layer 0, untrained
    assert any(not torch.equal(v, fresh[k]) for k, v in trained.items())

    run = _method(target, items, init_from=str(tmp_path / "run"))  # the checkpoint: fp32, exact
    assert torch.equal(run.vocab_ids, m.vocab_ids) and len(run.vocab_ids) == 40
    for k, v in trained.items():
        assert torch.equal(run.student.state_dict()[k], v), k
    compact = _method(target, items, init_from=str(tmp_path / "model"), draft_vocab_size=40)  # the bf16 export
    assert torch.equal(compact.vocab_ids, m.vocab_ids)
    for k, v in trained.items():
        assert torch.equal(compact.student.state_dict()[k], v.bfloat16().float()), k
    full = DraftModelMethod(target.model, target.tokenizer, layers=[0], init_from=str(tmp_path / "model/full"))
    assert full.vocab_ids is None and full.student.tok_embeddings.weight.requires_grad  # its own tables, trained
    assert torch.equal(full.student.layers[0].attn.wqkv.weight, compact.student.layers[0].attn.wqkv.weight)

    (tmp_path / "deep/checkpoint").mkdir(parents=True)  # a 2-layer start for a 1-layer draft
    save_file(_method(target, items, layers=[0, 1], draft_vocab_size=40).state_dict(),
              str(tmp_path / "deep/checkpoint/model.safetensors"))
    with pytest.raises(UserError, match="deep has 2 layers but the draft being trained has 1 .*valid: 2 or more"):
        _method(target, items, layers=[0], init_from=str(tmp_path / "deep"))
    bad = [({"draft_vocab_size": 50}, "draft_vocab_size=50 but .* has a 40-token draft vocabulary; valid: null or 40"),
           ({"init_from": str(tmp_path / "model/full")}, "has its own vocabulary tables but .*target_tables=true; "
                                                        "valid: target_tables=false"),
           ({"init_from": str(tmp_path / "nothing")}, "nothing: no checkpoint/model.safetensors or config.json")]
    for kw, msg in bad:
        with pytest.raises(UserError, match=msg):
            _method(target, items, **{"init_from": str(tmp_path / "run"), **kw})
    narrow = tmp_path / "narrow"  # a complete HF draft of another width: same names, other shapes
    make_hf_model(narrow, hidden=32, heads=2, kv_heads=1, layers=1)
    with pytest.raises(UserError, match="narrow: does not fit this draft .*size mismatch"):
        DraftModelMethod(target.model, target.tokenizer, layers=[0], init_from=str(narrow))


def test_init_from_a_shallower_start_grows_the_draft(target, items, tmp_path):
    """A 1-layer trained start into a 2-layer draft: layer 0 is the start's, layer 1 the target's layer 1 with
    its output projections zeroed, so the grown draft's logits equal the start's exactly; training then moves
    the new layer."""
    m = _method(target, items, layers=[0], draft_vocab_size=40)
    Trainer(m, items, TrainSettings(steps=2, batch_size=4, lr=1e-2, warmup=1, eval_every=0, save_every=2,
                                    log_every=2, bf16=False), tmp_path / "run", progress=False).fit()
    grown = _method(target, items, layers=[0, 1], init_from=str(tmp_path / "run"))
    assert grown.student.config.num_layers == 2 and torch.equal(grown.vocab_ids, m.vocab_ids)
    new, tgt = grown.student.layers[1], target.model.layers[1]
    assert torch.equal(grown.student.layers[0].attn.wqkv.weight, m.student.layers[0].attn.wqkv.weight)
    assert torch.equal(new.attn.wqkv.weight, tgt.attn.wqkv.weight.float())  # the target's layer, kept
    assert torch.equal(new.mlp.w_gate_up.weight, tgt.mlp.w_gate_up.weight.float())
    assert not new.attn.wo.weight.any() and not new.mlp.w_down.weight.any()
    assert tgt.attn.wo.weight.any() and tgt.mlp.w_down.weight.any()  # the target's own are not zero
    x = torch.tensor([[1, 5, 9, 3, 7, 2, 11, 4]], device=target.model.device)
    with torch.no_grad():
        assert torch.equal(grown.student(x, None).logits, m.student(x, None).logits)
    Trainer(grown, items, TrainSettings(steps=2, batch_size=4, lr=1e-2, warmup=1, eval_every=0, save_every=2,
                                        log_every=2, bf16=False), tmp_path / "grown", progress=False).fit()
    assert new.attn.wo.weight.abs().sum() > 0 and new.mlp.w_down.weight.abs().sum() > 0


@pytest.mark.parametrize("reduced", [False, True])
def test_teacher_forced_walk_replays_the_loop(target, items, tmp_path, reduced):
    """A one-layer draft of a two-layer target, full or reduced head: the chain walk over each finished
    sequence with `greedy_chain_drafts` accepts, step by step, what the decode loop accepted (float32; the
    last step only up to the end of the text)."""
    m = _method(target, items, layers=[0])
    ref = _run(target, None, 0, max_new=24)
    ids = None
    if reduced:
        produced = [t for r in ref for t in r.output_ids]
        ids = torch.tensor(sorted(set(produced) - {max(set(produced), key=produced.count)}))
    drafter = DraftModelDrafter(path=_save_compact(m, tmp_path / "d", ids))
    out = _run(target, drafter, k=3, max_new=24)
    steps = [a for r in out for a in r.accepted_per_step]
    if not target.model.config.tie_word_embeddings:  # the tied tiny target repeats one token: all accepted
        assert 0 in steps and any(a >= 2 for a in steps), steps  # partial acceptance: the walk has work to do
    for p, r in zip(PROMPTS, out):
        seq = list(p) + list(r.output_ids)
        drafts = greedy_chain_drafts(drafter.model, drafter.vocab_ids, seq, 3)
        acc, _ = chain_walk(drafts, seq, len(p), 3)
        loop = r.accepted_per_step  # its last step may have accepted past the 24-token limit that cut the text
        assert acc[:-1] == loop[:-1] and acc[-1] <= loop[-1] and len(acc) == len(loop), (acc, loop)
