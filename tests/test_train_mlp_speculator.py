"""MLP speculator training (fms-fsdp's two stages) on a tiny target: the loss of stage i at t is scored against
token t+2+i after feeding token t+1+i (checked by hand), training lowers it, stage 2 draws its batches from the
target's own samples at a tenth of the learning rate and resumes exactly across the switch, the samples obey
T / top-k, exports load back, and the CLI trains end to end."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from conftest import TINY_CORPUS
from specbench.data.prompts import Prompt
from specbench.models.mlp_speculator import load_mlp_speculator
from specbench.train.mlp_speculator import MLPSpeculatorMethod, sample_sequences
from specbench.train.trainer import Phase, Trainer, TrainSettings


def _method(tiny, **kw):
    words = " ".join(TINY_CORPUS).split()
    prompts = [Prompt(id=str(i), prompt=" ".join(words[i + 1:i + 4])) for i in range(0, 24, 6)]
    return MLPSpeculatorMethod(tiny.model, tiny.tokenizer, **{"n_predict": 3, "inner_dim": 32, "positions": 0,
                               "eval_prompts": prompts, "eval_k": 2, "eval_max_new_tokens": 12, **kw})


def _settings(**kw):
    base = dict(steps=40, batch_size=4, lr=1e-2, warmup=3, eval_every=0, save_every=10, log_every=5, bf16=False)
    return TrainSettings(**{**base, **kw})


@pytest.mark.parametrize("labels", ["tokens", "distribution"])
def test_stage_i_learns_token_t_plus_2_plus_i(tiny_lm, regen_items, labels):
    m = _method(tiny_lm, labels=labels)
    ids = torch.tensor([regen_items[0].ids[:16], regen_items[1].ids[:16]])
    mask = torch.ones_like(ids, dtype=torch.float32)
    _, stats = m.loss(ids, mask, [0, 1])
    with torch.no_grad():
        normed = tiny_lm.model(ids, None, return_normed=True).normed.float()
        spec = m.model
        for i in range(3):
            losses = []
            for b in range(2):
                for t in range(16 - 2 - i):  # token t+2+i must exist
                    s = spec.start(normed[b, t])
                    for j in range(i + 1):  # fed tokens t+1 .. t+1+i
                        s, logits = spec.stage(j, s, ids[b, t + 1 + j])
                    lp = F.log_softmax(logits, -1)
                    if labels == "tokens":
                        losses.append(-lp[ids[b, t + 2 + i]])
                    else:  # the target's distribution of token t+2+i sits at position t+1+i
                        p = F.softmax(tiny_lm.model.output(normed[b, t + 1 + i]), -1)
                        losses.append(-(p * lp).sum())
            assert stats[f"loss_{i}"] == pytest.approx(float(torch.stack(losses).mean()), rel=1e-4), i


@pytest.mark.parametrize("tables", ["own", "target"])
def test_training_lowers_the_loss(tiny_lm, regen_items, tmp_path, tables):
    m = _method(tiny_lm, tables=tables, tie_weights=tables == "own")
    t = Trainer(m, regen_items, _settings(), tmp_path, progress=False)
    ids, mask, index = t.batch(0, 0)
    _, before = m.loss(ids, mask, index)
    t.fit()
    _, after = m.loss(ids, mask, index)
    factor = 0.8 if tables == "own" else 0.93  # the tiny target's random, frozen tables leave less to learn
    for i in range(3):
        assert after[f"loss_{i}"] < factor * before[f"loss_{i}"], (i, before, after)
        assert after[f"acc_{i}"] > before[f"acc_{i}"] + 0.1, (i, before, after)


def test_positions_are_subsampled_deterministically(tiny_lm, regen_items):
    m = _method(tiny_lm, positions=7)
    ids = torch.tensor([regen_items[0].ids[:16], regen_items[1].ids[:16]])
    mask = torch.ones_like(ids, dtype=torch.float32)
    b, t = m._select(mask, [0, 1])
    assert len(b) == 7 and torch.equal(torch.stack([b, t]), torch.stack(m._select(mask, [0, 1])))
    assert not torch.equal(t, m._select(mask, [1, 0])[1])  # another batch, other positions


def test_stage_two_phase_draws_its_items_at_a_tenth_of_the_rate(tiny_lm, regen_items, tmp_path):
    n1 = len(regen_items) - 6
    phases = [Phase(0, 0, n1, 1.0, "stage1"), Phase(12, n1, len(regen_items), 0.1, "stage2")]
    s = _settings(steps=20, warmup=0, min_lr_ratio=1.0)  # a flat schedule: the ratio is the phase's alone
    full = Trainer(_method(tiny_lm), regen_items, s, tmp_path / "a", progress=False, phases=phases)
    assert all(i < n1 for st in range(12) for i in full.batch(st, 0)[2])
    assert all(n1 <= i for st in range(12, 20) for i in full.batch(st, 0)[2])
    history = full.fit()
    lrs = {r["phase"]: r["lr"] for r in history if "lr" in r}
    assert lrs["stage1"] == pytest.approx(1e-2) and lrs["stage2"] == pytest.approx(1e-3)
    # interrupted before the switch and resumed after it: the same weights as the uninterrupted run
    part = Trainer(_method(tiny_lm), regen_items, s, tmp_path / "b", progress=False, phases=phases)
    part.fit(stop_after=10)
    again = Trainer(_method(tiny_lm), regen_items, s, tmp_path / "b", progress=False, phases=phases)
    assert again.try_resume() and again.step == 10
    again.fit()
    for k, v in full.method.state_dict().items():
        torch.testing.assert_close(again.method.state_dict()[k], v, msg=k)


def test_stage_two_samples_are_top_k_and_cached(tiny_lm, tmp_path):
    prompts = ["alpha beta", "gamma delta", "epsilon"]
    kw = dict(new_tokens=10, temperature=1.0, top_k=3, batch_size=2, seed=5, cache=tmp_path / "s2.jsonl", progress=False)
    a = sample_sequences(tiny_lm.model, tiny_lm.tokenizer, prompts, **kw)
    lines = (tmp_path / "s2.jsonl").read_text().splitlines()
    b = sample_sequences(tiny_lm.model, tiny_lm.tokenizer, prompts, **kw)  # from the cache: nothing regenerated
    assert [x.ids for x in a] == [x.ids for x in b] and (tmp_path / "s2.jsonl").read_text().splitlines() == lines
    with torch.no_grad():
        for x in a:
            n_prompt = x.loss_mask.index(1)
            logits = tiny_lm.model(torch.tensor([x.ids]), None).logits[0]
            for p in range(n_prompt, len(x.ids)):
                top = set(logits[p - 1].topk(3).indices.tolist())
                assert x.ids[p] in top, (p, x.ids[p], top)
    c = sample_sequences(tiny_lm.model, tiny_lm.tokenizer, prompts, **{**kw, "seed": 6})
    assert [x.ids for x in c] != [x.ids for x in a]


@pytest.mark.parametrize("tables", ["own", "target"])
def test_export_loads_back(tiny_lm, regen_items, tmp_path, tables):
    m = _method(tiny_lm, tables=tables)
    Trainer(m, regen_items, _settings(steps=3), tmp_path, progress=False).fit()
    m.export(tmp_path / "spec")
    s, x = torch.randn(2, tiny_lm.model.config.hidden_size), torch.tensor([5, 6])
    ref = m.inference_copy()
    want = ref.stage(0, ref.start(s), x)[1]
    folders = ["spec"] + (["spec/full"] if tables == "target" else [])
    for folder in folders:
        back = load_mlp_speculator(tmp_path / folder, tiny_lm.model)
        torch.testing.assert_close(back.stage(0, back.start(s), x)[1], want, atol=0.15, rtol=0.05)  # bf16 files


def test_train_cli_mlp_speculator(tmp_path, tiny_dir):
    from conftest import write_jsonl

    recs = [{"instruction": TINY_CORPUS[i % 4].split()[0], "input": "", "output": " ".join(TINY_CORPUS[i % 4].split()[1:] * 2)}
            for i in range(12)]
    data = write_jsonl(tmp_path / "d.jsonl", recs)
    args = [sys.executable, "-m", "specbench.train", "method=mlp_speculator", f"model.path={tiny_dir}",
            f"data.paths=[{data}]", "data.eval_prompts=2", "train.steps=4", "train.batch_size=2", "progress=false",
            "dtype=float32", "method.n_predict=3", "method.tables=own", "method.inner_dim=16", "method.tie_weights=true", "method.eval_max_new_tokens=8",
            "method.stage2.start_fraction=0.5", "method.stage2.sequences=3", "method.stage2.new_tokens=6",
            "train.log_every=1", f"cache_dir={tmp_path / 'cache'}", "data.teacher=cached",
            f"hydra.run.dir={tmp_path / 'run'}"]
    p = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    cfg = json.loads((tmp_path / "run" / "model" / "config.json").read_text())
    assert cfg["model_type"] == "mlp_speculator" and cfg["n_predict"] == 3 and cfg["inner_dim"] == 16
    assert cfg["tie_weights"] is True and "specbench_target_tables" not in cfg
    rows = [json.loads(x) for x in (tmp_path / "run" / "train_log.jsonl").read_text().splitlines()]
    assert [r["phase"] for r in rows if "phase" in r] == ["stage1", "stage1", "stage2", "stage2"]
    assert len((tmp_path / "run" / "stage2.jsonl").read_text().splitlines()) == 3
    for bad, msg in (("method.stage2.start_fraction=0", "start_fraction=0.0: must be in (0, 1]"),
                     ("method.tables=mine", "train.method.tables='mine'; valid: own, target")):
        r = subprocess.run([*args, bad], capture_output=True, text=True, timeout=300)
        assert r.returncode == 2 and msg in r.stderr, r.stderr[-500:]
