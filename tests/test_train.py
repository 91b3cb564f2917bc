"""The shared trainer with the draft-model method on a tiny target: loss falls and acceptance rises, resume
continues the same run bit-exactly, export round-trips, bad data files give one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from conftest import TINY_CORPUS, write_jsonl
from specbench.data.prompts import Prompt
from specbench.errors import UserError
from specbench.models.loading import load_model
from specbench.train.data import load_examples, tokenize
from specbench.train.draft_model import DraftModelMethod
from specbench.train.trainer import Trainer, TrainSettings

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    return load_model(str(tiny_dir), torch.float32, CPU)


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    recs = [{"instruction": TINY_CORPUS[i % 4].split()[0], "input": "", "output": " ".join(TINY_CORPUS[i % 4].split()[1:] * 2)}
            for i in range(24)]
    return write_jsonl(tmp_path_factory.mktemp("data") / "train.jsonl", recs)


def _method(tiny, **kw):
    words = " ".join(TINY_CORPUS).split()
    prompts = [Prompt(id=str(i), prompt=" ".join(words[i + 1:i + 4])) for i in range(0, 36, 6)]  # held out
    return DraftModelMethod(tiny.model, tiny.tokenizer, layers=[0], eval_prompts=prompts, eval_k=3,
                            eval_max_new_tokens=16, **kw)


def _settings(**kw):
    base = dict(steps=30, batch_size=4, lr=3e-3, warmup=3, eval_every=0, save_every=10, log_every=5, bf16=False)
    return TrainSettings(**{**base, **kw})


def test_no_cache_forward_matches_cached(tiny):
    ids = torch.tensor([[5, 17, 99, 3, 250, 7]])
    m = tiny.model
    a = m(ids, None).logits
    b = m(ids, m.new_cache(1, 8), kv_len=6).logits
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_training_lowers_loss_and_raises_acceptance(tiny, tmp_path):
    """Self-distillation: the target regenerates responses to training prompts; the draft learns them."""
    from specbench.train.__main__ import regenerate
    from specbench.train.data import Example

    words = " ".join(TINY_CORPUS).split()
    prompts = [Example(" ".join(words[i:i + 3]), "", f"p{i}") for i in range(0, 36)]
    examples = regenerate(tiny.model, tiny.tokenizer, prompts, 24, tmp_path / "regen.jsonl")
    assert all(e.response for e in examples) and (tmp_path / "regen.jsonl").is_file()
    again = regenerate(tiny.model, tiny.tokenizer, prompts, 24, tmp_path / "regen.jsonl")  # cached
    assert [e.response for e in again] == [e.response for e in examples]
    items = tokenize(examples, tiny.tokenizer, 64)
    method = _method(tiny)
    before = method.evaluate()["eval/mean_acceptance_length"]
    hist = Trainer(method, items, _settings(), tmp_path, progress=False).fit()
    losses = [h["loss"] for h in hist if "loss" in h]
    assert losses[-1] < 0.5 * losses[0]
    after = hist[-1]["eval/mean_acceptance_length"]
    assert after > before, (before, after)


def test_resume_continues_the_same_run(tiny, data_file, tmp_path):
    items = tokenize(load_examples(data_file), tiny.tokenizer, 64)
    straight = _method(tiny)
    Trainer(straight, items, _settings(steps=8, save_every=4), tmp_path / "a", progress=False).fit()
    first = _method(tiny)
    Trainer(first, items, _settings(steps=8, save_every=4), tmp_path / "b", progress=False).fit(stop_after=4)
    resumed = _method(tiny)  # a new process would rebuild everything from the config
    t = Trainer(resumed, items, _settings(steps=8, save_every=4), tmp_path / "b", progress=False)
    assert t.try_resume() and t.step == 4
    t.fit()
    for (k, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), k


def test_wall_budget_stops_checkpointed_and_the_rerun_finishes_the_same_run(tiny, data_file, tmp_path):
    items = tokenize(load_examples(data_file), tiny.tokenizer, 64)
    straight = _method(tiny)
    Trainer(straight, items, _settings(steps=6, save_every=4), tmp_path / "a", progress=False).fit()
    cut = _method(tiny)
    hist = Trainer(cut, items, _settings(steps=6, save_every=4, max_wall_s=1e-9), tmp_path / "b", progress=False).fit()
    assert not any("eval/mean_acceptance_length" in h for h in hist)  # stopped early: no final evaluation
    resumed = _method(tiny)
    t = Trainer(resumed, items, _settings(steps=6, save_every=4), tmp_path / "b", progress=False)
    assert t.try_resume() and t.step == 1  # one step, then the budget was spent and it checkpointed
    hist = t.fit()
    for (k, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), k
    # trained tokens are counted across the resume: the response tokens of the 6 x 4 sequences drawn
    drawn = [i for step in range(6) for i in t.batch(step, 0)[2]]
    assert hist[-1]["tokens"] == sum(sum(items[i].loss_mask) for i in drawn) and hist[-1]["wall_s"] > 0


def test_length_pool_batches_neighbours_from_the_same_draws(tiny, tmp_path):
    """16 sequences of lengths 1..16, batch 4: without pooling one epoch is 4 batches of whatever the permutation
    holds; with length_pool=4 the same 4 steps draw the same 16 sequences and every batch is 4 neighbours by
    length: {1-4}, {5-8}, {9-12}, {13-16}, padded to 4 + 8 + 12 + 16 = 40 columns of 4 (24 pad slots over
    136 tokens). grad_accum=2 with length_pool=2 deals the same groups, two per step."""
    from specbench.train.data import Tokenized

    items = [Tokenized(ids=[3] * n, loss_mask=[1] * n) for n in range(1, 17)]
    groups = {frozenset(range(i, i + 4)) for i in range(0, 16, 4)}
    plain = Trainer(_method(tiny), items, _settings(steps=8), tmp_path / "a", progress=False)
    pooled = Trainer(_method(tiny), items, _settings(steps=8, length_pool=4), tmp_path / "b", progress=False)
    for epoch in range(2):
        steps = range(4 * epoch, 4 * epoch + 4)
        a = [plain.batch(s, 0) for s in steps]
        b = [pooled.batch(s, 0) for s in steps]
        assert sorted(i for x in a for i in x[2]) == sorted(i for x in b for i in x[2]) == list(range(16))
        assert {frozenset(x[2]) for x in b} == groups
        assert sum(x[0].numel() for x in b) == 4 * 40 and sum(int((x[0] != 0).sum()) for x in b) == 136
        assert sum(x[0].numel() for x in a) > 4 * 40  # drawn in permutation order they pad more
    again = Trainer(_method(tiny), items, _settings(steps=8, length_pool=4), tmp_path / "c", progress=False)
    assert all(again.batch(s, 0)[2] == pooled.batch(s, 0)[2] for s in (6, 1, 5))  # a function of the step
    accum = Trainer(_method(tiny), items, _settings(steps=4, grad_accum=2, length_pool=2), tmp_path / "d",
                    progress=False)
    dealt = [frozenset(accum.batch(s, m)[2]) for s in (0, 1) for m in (0, 1)]
    assert set(dealt) == groups


def test_raising_steps_extends_a_finished_run(tiny, data_file, tmp_path):
    """A finished 4-step run rerun with steps=8 trains steps 4..7 on the batches an 8-step run draws there, at the
    8-step schedule's rates (warm-up 3, cosine from step 3 to 8, floor 0.1: step 4 -> cos(pi/5), counted by hand),
    the first resumed step included (the 4-step run had left the rate at its own floor)."""
    import math

    items = tokenize(load_examples(data_file), tiny.tokenizer, 64)
    short = _method(tiny)
    Trainer(short, items, _settings(steps=4, save_every=4, log_every=1), tmp_path / "run", progress=False).fit()
    longer = _method(tiny)
    t = Trainer(longer, items, _settings(steps=8, save_every=4, log_every=1), tmp_path / "run", progress=False)
    assert t.try_resume() and t.step == 4
    hist = t.fit()
    assert t.step == 8 and hist[-1]["step"] == 8
    rows = {h["step"]: h for h in hist if "lr" in h}
    for step in (4, 6):  # a row is logged after its step: row step+1 holds the rate step `step` used
        want = 3e-3 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - 3) / 5)))  # t = (step - 3) / (8 - 3)
        assert math.isclose(rows[step + 1]["lr"], want, rel_tol=1e-6), (step, rows[step + 1]["lr"], want)
    assert not torch.equal(next(iter(short.state_dict().values())), next(iter(longer.state_dict().values())))


def test_export_round_trips_bit_exactly(tiny, tmp_path):
    method = _method(tiny)
    method.export(tmp_path / "model")
    cfg = json.loads((tmp_path / "model" / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 1 and cfg["torch_dtype"] == "bfloat16"
    back = load_model(str(tmp_path / "model"), torch.bfloat16, CPU).model
    want = {k: v.to(torch.bfloat16) for k, v in method.student.state_dict().items()}
    for k, v in back.state_dict().items():
        assert torch.equal(v, want[k]), k


@pytest.mark.parametrize(
    "content, needle",
    [
        ('[{"instruction": "hi"}]', r"bad.json\[0\]: record has 'instruction' but no 'output'"),
        ("", "the file is empty"),
        ("[{oops", "not valid JSON"),
        ('{"instruction": "a", "output": "b"}', "expected a JSON array"),
        ('[{"instruction": "a", "output": "b"}, {"text": "x"}]', r"bad.json\[1\]: record has none of"),
    ],
)
def test_bad_data_files(tmp_path, content, needle):
    p = tmp_path / "bad.json"
    p.write_text(content)
    with pytest.raises(UserError, match=needle):
        load_examples(p)


def test_bad_jsonl_line_and_formats(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"question": "q", "answer": "a"}\n{broken\n')
    with pytest.raises(UserError, match=r"bad.jsonl:2: not valid JSON"):
        load_examples(p)
    p.write_text('{"messages": [{"role": "user", "content": "u"}], "response": "r"}\n{"question": "q", "answer": "a"}\n')
    ex = load_examples(p)
    assert [(e.prompt, e.response) for e in ex] == [("u", "r"), ("q", "a")]
    # a prompt-only chat record (for self_distill) and the regeneration cache's own shape
    p.write_text('{"messages": [{"role": "user", "content": "u"}]}\n{"prompt": "p", "response": "r"}\n')
    ex = load_examples(p)
    assert [(e.prompt, e.response) for e in ex] == [("u", None), ("p", "r")]
    with pytest.raises(UserError, match=r"bad.jsonl:1: a prompt without a response has nothing to learn"):
        tokenize(ex, None, 64)


def test_prepare_only_regenerates_and_trains_nothing(tmp_path, tiny_dir, tiny):
    """train.steps=0 with data.mode=self_distill: the target answers the prompt-only records (5 at a time), the
    answers land in regen.jsonl -- the same ones a batch of 8 gives -- and nothing is trained or exported;
    the cache then reads back as training data. Bad values are one-line errors, exit 2."""
    from specbench.train.__main__ import regenerate

    words = " ".join(TINY_CORPUS).split()
    texts = [" ".join(words[i:i + 3]) for i in range(0, 33, 3)]
    prompts = write_jsonl(tmp_path / "prompts.jsonl", [{"messages": [{"role": "user", "content": t}]} for t in texts])
    run = tmp_path / "run"
    args = [sys.executable, "-m", "specbench.train", f"model.path={tiny_dir}", f"data.paths=[{prompts}]",
            "data.mode=self_distill", "data.eval_prompts=0", "data.regen_max_new_tokens=12", "data.regen_batch_size=5",
            "train.steps=0", "progress=false", "method.layers=[0]", "dtype=float32", f"hydra.run.dir={run}"]
    p = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "train.steps=0: data prepared (11 sequences" in p.stderr + p.stdout
    cached = [json.loads(x) for x in (run / "regen.jsonl").read_text().splitlines()]
    assert sorted(r["prompt"] for r in cached) == sorted(texts)
    assert not (run / "model").exists() and not (run / "checkpoint").exists()
    ref = regenerate(tiny.model, tiny.tokenizer, load_examples(prompts), 12, tmp_path / "ref.jsonl", batch_size=8)
    assert {r["prompt"]: r["response"] for r in cached} == {e.prompt: e.response for e in ref}
    again = load_examples(run / "regen.jsonl")  # the cache is a data file
    assert len(tokenize(again, tiny.tokenizer, 64)) == 11
    for bad, needle in (("data.regen_batch_size=0", "data.regen_batch_size=0; valid: an integer >= 1"),
                        ("train.steps=-1", "train.steps=-1; valid: an integer >= 0"),
                        ("train.length_pool=0", "train.length_pool=0; valid: an integer >= 1")):
        b = subprocess.run([*args, bad], capture_output=True, text=True, timeout=300)
        assert b.returncode == 2 and needle in b.stderr, b.stderr[-1000:]


def test_train_cli(tmp_path, tiny_dir, data_file):
    args = [sys.executable, "-m", "specbench.train", f"model.path={tiny_dir}", f"data.paths=[{data_file}]",
            "data.eval_prompts=2", "train.steps=4", "train.batch_size=2", "train.save_every=2", "progress=false",
            "method.layers=[0]", "dtype=float32", f"hydra.run.dir={tmp_path / 'run'}", "data.teacher=cached",
            "data.teacher_topk=32", f"cache_dir={tmp_path / 'cache'}"]
    p = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert (tmp_path / "run" / "model" / "model.safetensors").is_file()
    assert (tmp_path / "run" / "checkpoint" / "trainer.pt").is_file()
    logged = [json.loads(x) for x in (tmp_path / "run" / "train_log.jsonl").read_text().splitlines()]
    assert logged[-1]["step"] == 4 and "eval/mean_acceptance_length" in logged[-1]
    assert list((tmp_path / "cache" / "teacher").glob("*/chunk_00000.safetensors"))
    bad = subprocess.run([*args[:4], "data.paths=[/no/such.jsonl]", *args[5:]], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "data file '/no/such.jsonl' does not exist" in bad.stderr
    bad = subprocess.run([*args, "data.teacher=maybe"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "data.teacher='maybe'" in bad.stderr


def test_cached_teacher_matches_online_and_is_reused(tiny, data_file, tmp_path):
    from specbench.train.features import TeacherTopK

    items = tokenize(load_examples(data_file), tiny.tokenizer, 64)
    method = _method(tiny)
    V = tiny.model.config.vocab_size
    t0 = Trainer(method, items, _settings(), tmp_path / "x", progress=False)
    ids, mask, index = t0.batch(0, 0)
    online, _ = method.loss(ids, mask, index)
    method.teacher = TeacherTopK(tiny.model, items, V, tmp_path / "cache", chunk=5, progress=False)
    full, _ = method.loss(ids, mask, index)
    torch.testing.assert_close(full, online, atol=1e-4, rtol=1e-4)  # k = V: the exact KL
    files = sorted((method.teacher.dir).glob("chunk_*.safetensors"))
    assert len(files) == (len(items) + 4) // 5
    stamp = [f.stat().st_mtime_ns for f in files]
    again = TeacherTopK(tiny.model, items, V, tmp_path / "cache", chunk=5, progress=False)
    assert again.dir == method.teacher.dir and [f.stat().st_mtime_ns for f in files] == stamp  # not rebuilt
    method.teacher = TeacherTopK(tiny.model, items, 16, tmp_path / "cache", chunk=5, progress=False)
    hist = Trainer(method, items, _settings(steps=12), tmp_path / "y", progress=False).fit()
    losses = [h["loss"] for h in hist if "loss" in h]
    assert losses[-1] < losses[0]


def test_narrow_scratch_draft(tiny, data_file, tmp_path):
    """init=scratch with a smaller width trains, exports and drafts for the target (shares the tokenizer)."""
    from specbench.drafters.draft_model import DraftModelDrafter
    from specbench.engine.loop import Engine, StopCriteria
    from specbench.core.request import Request
    from specbench.core.sampling import SamplingParams

    method = _method(tiny, init="scratch", num_layers=1,
                     width={"hidden_size": 32, "intermediate_size": 48, "num_heads": 2, "num_kv_heads": 1})
    assert method.student.config.hidden_size == 32 and method.student.config.head_dim == 16
    items = tokenize(load_examples(data_file), tiny.tokenizer, 64)
    Trainer(method, items, _settings(steps=4), tmp_path, progress=False).fit()
    method.export(tmp_path / "model")
    draft = load_model(str(tmp_path / "model"), torch.float32, CPU).model
    reqs = [Request(id="0", prompt="", prompt_ids=[5, 17, 99])]
    run = lambda d: Engine(tiny.model, tiny.tokenizer, batch_size=1, stop=StopCriteria(frozenset(), 10),  # noqa: E731
                           params=SamplingParams(), progress=False, drafter=d, k=3 if d else 0).run(reqs)[0].output_ids
    assert run(DraftModelDrafter(model=draft)) == run(None)
    with pytest.raises(UserError, match="heads must divide"):
        _method(tiny, init="scratch", width={"hidden_size": 30, "num_heads": 4})


def test_states_teacher_matches_online(tiny, data_file, tmp_path):
    """data.teacher=states: the full-vocabulary KL from cached final-normed states (bf16 on disk)."""
    from specbench.train.features import TargetStates

    items = tokenize(load_examples(data_file), tiny.tokenizer, 64)
    method = _method(tiny)
    ids, mask, index = Trainer(method, items, _settings(), tmp_path / "x", progress=False).batch(0, 0)
    online, _ = method.loss(ids, mask, index)
    method.states = TargetStates(tiny.model, items, (0, 1, 2), tmp_path / "cache", chunk=5, progress=False)
    cached, _ = method.loss(ids, mask, index)
    torch.testing.assert_close(cached, online, atol=3e-2, rtol=3e-2)


def test_svd_embedding_init(tiny):
    width = {"hidden_size": 32, "intermediate_size": 48, "num_heads": 2, "num_kv_heads": 1}
    method = _method(tiny, init="scratch", num_layers=1, width=width, embed_init="svd")
    E = tiny.model.tok_embeddings.weight.float()
    _, _, vh = torch.linalg.svd(E, full_matrices=False)
    want = E @ vh[:32].T
    got = method.student.tok_embeddings.weight
    assert got.shape == (E.shape[0], 32)
    torch.testing.assert_close(got / got.norm(), want / want.norm(), atol=1e-5, rtol=1e-4)
    head = method.student.output.weight  # the tiny target is untied: its head gets its own projection
    _, _, vh = torch.linalg.svd(tiny.model.output.weight.float(), full_matrices=False)
    ref = tiny.model.output.weight.float() @ vh[:32].T
    torch.testing.assert_close(head / head.norm(), ref / ref.norm(), atol=1e-5, rtol=1e-4)
    with pytest.raises(UserError, match="embed_init='svd' needs init=scratch"):
        _method(tiny, embed_init="svd")


def test_regeneration_resumes_after_the_last_finished_chunk(tiny, tmp_path, monkeypatch):
    """Regeneration in chunks of 4 prompts, killed during its third chunk: the cache holds the first 8
    responses; the rerun regenerates only the other 5 and ends where an uninterrupted run does."""
    from specbench.engine.loop import Engine
    from specbench.train import __main__ as tm
    from specbench.train.data import Example

    words = " ".join(TINY_CORPUS).split()
    prompts = [Example(" ".join(words[i:i + 3]), "", f"p{i}") for i in range(13)]
    monkeypatch.setattr(tm, "REGEN_CHUNK", 4)
    full = tm.regenerate(tiny.model, tiny.tokenizer, prompts, 12, tmp_path / "full.jsonl")
    calls, run = [], Engine.run

    def dies_third_time(self, reqs):
        calls.append(len(reqs))
        if len(calls) == 3:
            raise KeyboardInterrupt
        return run(self, reqs)

    monkeypatch.setattr(Engine, "run", dies_third_time)
    with pytest.raises(KeyboardInterrupt):
        tm.regenerate(tiny.model, tiny.tokenizer, prompts, 12, tmp_path / "r.jsonl")
    assert len((tmp_path / "r.jsonl").read_text().splitlines()) == 8
    calls.clear()
    monkeypatch.setattr(Engine, "run", lambda self, reqs: calls.append(len(reqs)) or run(self, reqs))
    again = tm.regenerate(tiny.model, tiny.tokenizer, prompts, 12, tmp_path / "r.jsonl")
    assert calls == [4, 1]  # 13 - 8 prompts left: a chunk of 4 and one of 1
    assert [e.response for e in again] == [e.response for e in full]
