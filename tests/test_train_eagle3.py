"""EAGLE-3 training on a tiny target: the training-time test computes exactly what the drafter computes at
inference, training lowers the loss and raises acceptance, cached target states match the online ones, the
exported head loads back bit-exactly in the public format, and the CLI trains and exports end to end."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from conftest import TINY_CORPUS
from specbench.data.prompts import Prompt
from specbench.models.attention import AttnMeta
from specbench.models.cache import KVCache
from specbench.models.eagle import load_eagle
from specbench.models.transformer import build_mask
from specbench.core.sampling import SamplingParams
from specbench.data.prompts import to_requests
from specbench.drafters.eagle import EagleDrafter
from specbench.engine.loop import Engine, StopCriteria
from specbench.train.eagle3 import Eagle3Method, draft_vocabulary, inference_copy
from specbench.train.evaluate import chain_walk, paired_walks
from specbench.train.trainer import Trainer, TrainSettings

CPU = torch.device("cpu")
AUX = [0, 1, 2]  # the tiny target has 2 layers


@pytest.fixture(scope="module")
def tiny(tiny_lm):
    return tiny_lm


@pytest.fixture(scope="module")
def items(regen_items):
    return regen_items


def _method(tiny, items, **kw):
    words = " ".join(TINY_CORPUS).split()
    prompts = [Prompt(id=str(i), prompt=" ".join(words[i + 1:i + 4])) for i in range(0, 36, 6)]
    return Eagle3Method(tiny.model, tiny.tokenizer, items, **{"draft_vocab_size": 200, "ttt_steps": 3, "aux_layers": AUX,
                        "eval_prompts": prompts, "eval_k": 3, "eval_max_new_tokens": 16, **kw})


def _settings(**kw):
    base = dict(steps=60, batch_size=4, lr=1e-2, warmup=3, eval_every=0, save_every=20, log_every=5, bf16=False)
    return TrainSettings(**{**base, **kw})


def test_draft_vocabulary_is_the_most_frequent_response_tokens(items):
    ids = draft_vocabulary(items, 384, 10, always=(2,))
    assert len(ids) == 10 and 2 in ids.tolist() and ids.tolist() == sorted(ids.tolist())
    from collections import Counter

    c = Counter(t for x in items for t, m in zip(x.ids, x.loss_mask) if m)
    top = {t for t, _ in sorted(c.items(), key=lambda kv: (-kv[1], kv[0]))[:9]}
    assert top <= set(ids.tolist())


@torch.no_grad()
@pytest.mark.parametrize("fc_norm", [False, True], ids=["eagle3", "eagle3.1_fc_norm"])
def test_training_time_test_is_the_inference_computation(tiny, items, fc_norm):
    """o_j at index i from the unrolled training forward == the chain drafter's depth-(j+1) forward after the
    pairs 0..i were cached: the same pairs, positions and attention (prefix + own chain)."""
    m = _method(tiny, items, ttt_steps=4, fc_norm=fc_norm)
    head = m.head
    if fc_norm:  # trained norms: not all ones
        for n in head.fc_norm:
            n.weight.uniform_(0.5, 1.5)
    ids = torch.tensor([items[0].ids[:20]])
    aux = torch.cat(tiny.model(ids, None, hidden_layers=AUX).hidden, -1)
    outs = dict(m.unroll(ids, aux))
    for i in (0, 5, 11):
        cache = KVCache(1, 1, head.config.num_kv_heads, 40, head.config.head_dim, torch.float32)
        slots = torch.arange(i + 1)[None]
        o = head.step(ids[:, 1:i + 2], aux[:, :i + 1], slots, cache, (torch.zeros_like(slots), slots),
                      AttnMeta(i + 1, build_mask(cache.seq_lens, i + 1, i + 1, None)), from_target=True)
        torch.testing.assert_close(o[0, i], outs[0][0, i], atol=1e-5, rtol=1e-5)
        cache.seq_lens.fill_(i + 1)
        h = o[:, i:i + 1]
        for j in range(1, 4):  # feed the head's own output with the next (teacher-forced) token
            s = torch.tensor([[i + j]])
            h = head.step(ids[:, i + 1 + j: i + 2 + j], h, s, cache, (torch.zeros_like(s), s),
                          AttnMeta(i + j + 1, build_mask(cache.seq_lens, 1, i + j + 1, None)), from_target=False)
            cache.seq_lens += 1
            torch.testing.assert_close(h[0, 0], outs[j][0, i], atol=1e-5, rtol=1e-5)


def test_unused_indices_are_skipped_exactly(tiny, items):
    """Counted by hand, ttt_steps 3, every token in the draft vocabulary. Sequence A: 10 tokens, mask at 6-9
    (positions whose next token is trained); step j (s = j+1) trains index i where i+s is masked and
    i+s+1 < 10 (that next token exists): j=0 {5,6,7}, j=1 {4,5,6}, j=2 {3,4,5}; an index is needed at step j if trained there or later:
    {3..7}, {3..6}, {3,4,5}. Sequence B: 7 tokens, mask at 2-6, padded to 10 (padding in the vocabulary):
    j=0 {1..5}, j=1 {0..4}, j=2 {0..3}; needed {0..5}, {0..4}, {0..3}. The packed unroll computes only those
    (11, 9, 7 of 20 indices) and gives the full unroll's outputs and gradients there."""
    m = _method(tiny, items, draft_vocab_size=384)
    ids = torch.tensor([items[0].ids[:10], items[1].ids[:7] + [0, 0, 0]])
    mask = torch.zeros(2, 10)
    mask[0, 6:], mask[1, 2:7] = 1, 1
    valid, need = m.trained_indices(ids, mask)
    idx = lambda t: [t[b].nonzero().squeeze(1).tolist() for b in range(2)]  # noqa: E731
    assert [idx(v) for v in valid] == [[[5, 6, 7], [1, 2, 3, 4, 5]], [[4, 5, 6], [0, 1, 2, 3, 4]],
                                       [[3, 4, 5], [0, 1, 2, 3]]]
    assert [idx(v) for v in need] == [[[3, 4, 5, 6, 7], [0, 1, 2, 3, 4, 5]], [[3, 4, 5, 6], [0, 1, 2, 3, 4]],
                                      [[3, 4, 5], [0, 1, 2, 3]]]
    aux = torch.cat(tiny.model(ids, None, hidden_layers=AUX).hidden, -1)
    w = torch.randn(3, 2, 10, m.head.config.hidden_size)
    grads = []
    for packed in (False, True):
        m.head.zero_grad()
        total = torch.zeros(())
        if packed:
            outs = list(m.unroll_rows(ids, aux, need))
            assert [len(rows) for _, rows, _ in outs] == [11, 9, 7]
            for j, rows, o in outs:
                assert rows.tolist() == need[j].reshape(-1).nonzero().squeeze(1).tolist()
                torch.testing.assert_close(o, full[j].reshape(20, -1)[rows], atol=1e-6, rtol=1e-6)
                total = total + (o * w[j].reshape(20, -1)[rows]).sum()
        else:
            full = {j: o for j, o in m.unroll(ids, aux)}
            total = sum((o * w[j] * need[j][..., None]).sum() for j, o in full.items())
            full = {j: o.detach() for j, o in full.items()}
        total.backward()
        grads.append({k: p.grad.clone() for k, p in m.head.named_parameters() if p.grad is not None})
    assert set(grads[0]) == set(grads[1]) and "fc.weight" in grads[0]
    for k in grads[0]:
        torch.testing.assert_close(grads[1][k], grads[0][k], atol=1e-5, rtol=1e-4)
    assert grads[1]["midlayer.mlp.down_proj.weight"].abs().sum() > 0


def test_training_lowers_loss_and_raises_acceptance(tiny, items, tmp_path):
    """The loss is soft-label CE, dominated here by the random target's own entropy; the part training can
    remove (KL to the target) must fall, and greedy acceptance with the decode loop must rise."""
    method = _method(tiny, items, draft_vocab_size=384)
    before = method.evaluate()["eval/mean_acceptance_length"]
    hist = Trainer(method, items, _settings(), tmp_path, progress=False).fit()
    logged = [h for h in hist if "loss" in h]
    assert logged[-1]["loss"] < logged[0]["loss"] and logged[-1]["kl_0"] < 0.5 * logged[0]["kl_0"]
    after = hist[-1]
    assert after["eval/mean_acceptance_length"] > before, (before, after)
    assert "eval/per_position_0" in after and "acc_0" in logged[0]


@pytest.mark.slow
def test_teacher_forced_walk_replays_the_loop(embedded):
    """The shipped head on the embedded target (float32): its teacher-forced drafts (the training unroll) over
    the loop's own output, walked like the loop, give the loop's accepted count at every step — training's
    features and positions are the decode loop's, full chains and rejections alike."""
    from specbench.data.prompts import builtin_prompts

    tok = embedded.tokenizer
    reqs = to_requests([builtin_prompts()[i] for i in (0, 3, 6)], tok)
    eng = Engine(embedded.model, tok, batch_size=2, params=SamplingParams(), progress=False,
                 stop=StopCriteria(frozenset({tok.eos_token_id}), 64), drafter=EagleDrafter(), k=3)
    method = Eagle3Method(embedded.model, tok, [], init_from=EagleDrafter().path, ttt_steps=3)
    loop = []
    for req, res in zip(reqs, eng.run(reqs)):
        ids = list(req.prompt_ids) + list(res.output_ids)
        walked, tested = chain_walk(method.greedy_drafts(ids), ids, len(req.prompt_ids), 3)
        assert len(walked) == len(res.accepted_per_step) and walked[:-1] == res.accepted_per_step[:-1]
        assert tested[0] == len(req.prompt_ids) + 1  # the first draft predicts the token after the first sample
        loop += res.accepted_per_step[:-1]  # the last step may be cut by the token budget
    assert loop.count(3) >= 3 and loop.count(0) >= 10, loop  # full chains and rejections were both replayed


def test_chain_walk_counted_by_hand():
    """Prompt 10 11 12, then the target's 20 .. 28 (index 3 = the prefill's sample). Proposal after pair 2
    drafts indices 4-6: 21 22 ok, 99 != 23 -> 2 accepted, bonus 23 at 6. Next pair 5 drafts 7-9: all three ok,
    bonus 27 at 10. Next pair 9 drafts index 11: 0 != 28 -> none, bonus 28 ends the sequence."""
    ids = [10, 11, 12, 20, 21, 22, 23, 24, 25, 26, 27, 28]
    drafts = [[-1, -1, -1]] * len(ids)
    drafts[2], drafts[5], drafts[9] = [21, 22, 99], [24, 25, 26], [0, 28, 0]
    assert chain_walk(drafts, ids, 3, 3) == ([2, 3, 0], [4, 7, 11])
    # k = 1: 21 ok (skip to 6), -1 != 23, 24 ok (skip to 9), then 9, 10, 11 all missed
    assert chain_walk(drafts, ids, 3, 1) == ([1, 0, 1, 0, 0, 0], [4, 6, 7, 9, 10, 11])


def test_paired_walks_counted_by_hand():
    """Three sequences walked by two heads. Seq 1: 10 steps, 5 accepted (τ 1.5) vs 8 steps, 7 accepted (τ 1.875),
    both 15 tokens: +0.375. Seq 2: 4 + 4 vs 5 + 3 (8 tokens): 1 - 0.6 -> -0.4. Seq 3: identical: 0. Mean
    -0.025/3; deviations 0.38333, -0.39167, 0.00833; squares sum 0.30042; /2/3 -> SE 0.22376. Token-weighted: ref
    9 accepted / 20 steps = 0.45, other 10 / 19 = 0.526316: +0.076316. z_i = 3 (xb - 0.526316 sb) / 19 - 3 (xa -
    0.45 sa) / 20: seq 1 3 (2.789474) / 19 - 3 (0.5) / 20 = 0.440443 - 0.075 = 0.365443; seq 2 0.058172 - 0.33 =
    -0.271828; seq 3 -0.498615 + 0.405 = -0.093615; squares 0.133549 + 0.073890 + 0.008764 = 0.216203, /3/2 ->
    SE 0.189826."""
    d = paired_walks([[10, 5], [4, 4], [6, 0]], [[8, 7], [5, 3], [6, 0]])
    assert d["n"] == 3 and d["better"] == 1 and d["worse"] == 1
    assert d["mean_diff"] == pytest.approx(-0.025 / 3)
    assert d["se"] == pytest.approx(0.22376, abs=1e-5)
    assert d["walk_diff"] == pytest.approx(0.076316, abs=1e-6) and d["walk_se"] == pytest.approx(0.189826, abs=2e-6)
    with pytest.raises(ValueError, match="different text"):  # 15 tokens against 12
        paired_walks([[10, 5], [4, 4]], [[8, 4], [4, 4]])
    with pytest.raises(ValueError, match="same sequences"):
        paired_walks([[10, 5], [4, 4]], [[10, 5]])


def test_cached_states_match_online(tiny, items, tmp_path):
    from specbench.train.features import TargetStates

    method = _method(tiny, items)
    t = Trainer(method, items, _settings(), tmp_path / "x", progress=False)
    ids, mask, index = t.batch(0, 0)
    online, _ = method.loss(ids, mask, index)
    method.states = TargetStates(tiny.model, items, tuple(AUX), tmp_path / "cache", chunk=5, progress=False)
    cached, _ = method.loss(ids, mask, index)
    torch.testing.assert_close(cached, online, atol=2e-2, rtol=2e-2)  # states are stored in bfloat16
    files = sorted(method.states.dir.glob("chunk_*.safetensors"))
    assert len(files) == (len(items) + 4) // 5
    stamp = [f.stat().st_mtime_ns for f in files]
    again = TargetStates(tiny.model, items, tuple(AUX), tmp_path / "cache", chunk=5, progress=False)
    assert again.dir == method.states.dir and [f.stat().st_mtime_ns for f in files] == stamp  # reused


@pytest.mark.parametrize("fc_norm", [False, True], ids=["eagle3", "eagle3.1_fc_norm"])
def test_export_round_trips_bit_exactly(tiny, items, tmp_path, fc_norm):
    method = _method(tiny, items, fc_norm=fc_norm)
    Trainer(method, items, _settings(steps=3), tmp_path, progress=False).fit()
    method.export(tmp_path / "head")
    back = load_eagle(tmp_path / "head", tiny.model)  # float32 target: the bf16 file widened exactly
    assert back.config.aux_layers == AUX and back.config.draft_vocab_size == 200
    assert back.config.fc_norm == fc_norm == ("fc_norm" in json.loads((tmp_path / "head/config.json").read_text()))
    if fc_norm:  # the norms trained (they start at ones)
        assert not torch.equal(back.fc_norm[2].weight, torch.ones_like(back.fc_norm[2].weight))
    want = method.head.state_dict()
    for k, v in back.state_dict().items():
        w = want[k] if k in ("d2t", "t2d") else want[k].to(torch.bfloat16).float()
        assert torch.equal(v, w), k


def test_resume_continues_the_same_run(tiny, items, tmp_path):
    straight = _method(tiny, items)
    Trainer(straight, items, _settings(steps=6, save_every=3), tmp_path / "a", progress=False).fit()
    first = _method(tiny, items)
    Trainer(first, items, _settings(steps=6, save_every=3), tmp_path / "b", progress=False).fit(stop_after=3)
    resumed = _method(tiny, items)
    t = Trainer(resumed, items, _settings(steps=6, save_every=3), tmp_path / "b", progress=False)
    assert t.try_resume() and t.step == 3
    t.fit()
    for (k, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), k


def test_train_cli_eagle3(tmp_path, tiny_dir):
    from conftest import write_jsonl

    recs = [{"instruction": TINY_CORPUS[i % 4].split()[0], "input": "", "output": " ".join(TINY_CORPUS[i % 4].split()[1:] * 2)}
            for i in range(12)]
    data = write_jsonl(tmp_path / "d.jsonl", recs)
    args = [sys.executable, "-m", "specbench.train", "method=eagle3", f"model.path={tiny_dir}", f"data.paths=[{data}]",
            "data.eval_prompts=2", "train.steps=3", "train.batch_size=2", "progress=false", "dtype=float32",
            "method.draft_vocab_size=100", "method.aux_layers=[0,1,2]", "method.eval_max_new_tokens=8",
            f"hydra.run.dir={tmp_path / 'run'}", "data.teacher=cached", f"cache_dir={tmp_path / 'cache'}"]
    p = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    cfg = json.loads((tmp_path / "run" / "model" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["draft_vocab_size"] == 100
    assert list((tmp_path / "cache" / "states").glob("*/chunk_00000.safetensors"))
    bad = subprocess.run([*args, "method.ttt_steps=0"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "train.method.ttt_steps=0" in bad.stderr
    bad = subprocess.run([*args, "method.aux_layers=[0,1,9]"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "train.method.aux_layers=[0, 1, 9]" in bad.stderr


def test_init_from_continues_earlier_weights(tiny, items, tmp_path):
    from specbench.errors import UserError

    first = _method(tiny, items, draft_vocab_size=150)
    Trainer(first, items, _settings(steps=3, save_every=3), tmp_path / "run", progress=False).fit()
    again = _method(tiny, items, init_from=str(tmp_path / "run"), draft_vocab_size=None)  # its checkpoint (fp32)
    for k, v in first.state_dict().items():
        assert torch.equal(again.state_dict()[k], v), k
    assert again.head.config.draft_vocab_size == 150  # the vocabulary comes with the weights
    assert _method(tiny, items, init_from=str(tmp_path / "run"), draft_vocab_size=150).head.config.draft_vocab_size == 150
    with pytest.raises(UserError, match="draft_vocab_size=200 but .* has a 150-token draft vocabulary; valid: null or 150"):
        _method(tiny, items, init_from=str(tmp_path / "run"))  # a size that would be ignored is an error
    with pytest.raises(UserError, match="init_from=.*no checkpoint"):
        _method(tiny, items, init_from=str(tmp_path / "nothing"))
    with pytest.raises(UserError, match="fc_norm=true but .* has no fc_norm"):  # norms cannot be bolted on
        _method(tiny, items, init_from=str(tmp_path / "run"), fc_norm=True, draft_vocab_size=None)
    # a head trained with EAGLE-3.1's norms continues with them without naming fc_norm again (the GPU
    # recipe's second stage does this)
    normed = _method(tiny, items, fc_norm=True)
    Trainer(normed, items, _settings(steps=3, save_every=3), tmp_path / "normed", progress=False).fit()
    later = _method(tiny, items, init_from=str(tmp_path / "normed"), draft_vocab_size=None)
    assert later.head.config.fc_norm and any(k.startswith("fc_norm.") for k in later.state_dict())
    for k, v in normed.state_dict().items():
        assert torch.equal(later.state_dict()[k], v), k


def test_hass_topk_term_counted_by_hand():
    """Target p = (0.5, 0.3, 0.2), draft q uniform over 3: CE = ln 3; the top-2 term adds (0.5 + 0.3) ln 3 times
    the weight; top-0 is plain CE; top-K beyond the vocabulary is all of it (CE twice at weight 1)."""
    import math

    from specbench.train.eagle3 import soft_label_loss

    t = torch.tensor([[0.5, 0.3, 0.2]]).log()
    q = torch.full((1, 3), 1 / 3).log()
    ln3 = math.log(3)
    for k, w, want in [(0, 1.0, ln3), (2, 1.0, ln3 + 0.8 * ln3), (2, 0.5, ln3 + 0.4 * ln3), (1, 2.0, ln3 + ln3),
                       (9, 1.0, 2 * ln3)]:
        loss, ce = soft_label_loss(t, q, k, w)
        assert math.isclose(float(loss), want, rel_tol=1e-6) and math.isclose(float(ce), ln3, rel_tol=1e-6), (k, w)
    # the gradient moves the draft toward the target's top tokens harder with the term than without it
    lq = torch.zeros(1, 3, requires_grad=True)
    soft_label_loss(t, torch.log_softmax(lq, -1), 1, 1.0)[0].backward()
    plain = torch.zeros(1, 3, requires_grad=True)
    soft_label_loss(t, torch.log_softmax(plain, -1), 0)[0].backward()
    assert lq.grad[0, 0] < plain.grad[0, 0] < 0


def test_hass_topk_trains_and_rejects_bad_settings(tiny, items, tmp_path):
    from specbench.errors import UserError

    plain, hass = _method(tiny, items), _method(tiny, items, topk=5, topk_weight=1.0)
    t = Trainer(plain, items, _settings(), tmp_path / "x", progress=False)
    ids, mask, index = t.batch(0, 0)
    lp, sp = plain.loss(ids, mask, index)
    lh, sh = hass.loss(ids, mask, index)
    assert float(lh.detach()) > float(lp.detach()) and sh["kl_0"] == pytest.approx(sp["kl_0"])  # same head: only the term differs
    hist = Trainer(hass, items, _settings(steps=30), tmp_path / "h", progress=False).fit()
    logged = [h for h in hist if "loss" in h]
    assert logged[-1]["kl_0"] < 0.7 * logged[0]["kl_0"]
    with pytest.raises(UserError, match="train.method.topk=-1"):
        _method(tiny, items, topk=-1)
    with pytest.raises(UserError, match="train.method.topk=0, topk_weight=2.0: .*only with topk > 0"):
        _method(tiny, items, topk_weight=2.0)  # a weight without the term would be accepted and ignored
