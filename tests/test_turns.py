"""dataset.turns: MT-bench's second turns, asked after the run's own first answers through the chat template."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import write_jsonl
from test_cli import _compose
from specbench.errors import UserError

MT_BENCH = Path(__file__).resolve().parents[2] / "shared" / "data" / "mt_bench" / "question.jsonl"
# a template whose rendering is easy to write out by hand
TEMPLATE = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}</s>{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")


@pytest.fixture(scope="module")
def chat_dir(tiny_dir, tmp_path_factory) -> Path:
    """The tiny test model with a chat template in its tokenizer config."""
    d = tmp_path_factory.mktemp("tiny_chat")
    for f in tiny_dir.iterdir():
        shutil.copy(f, d / f.name)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["chat_template"] = TEMPLATE
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    return d


def test_loader_keeps_later_turns(tmp_path):
    from specbench.data.prompts import load_prompts

    data = write_jsonl(tmp_path / "q.jsonl", [
        {"question_id": 1, "category": "a", "turns": ["one", "two", "three"]},
        {"question_id": 2, "category": "a", "turns": ["only"]},
        {"id": 3, "prompt": "plain"},
    ])
    ps = load_prompts("jsonl", str(data))
    assert [(p.prompt, p.later) for p in ps] == [("one", ("two", "three")), ("only", ()), ("plain", ())]
    odd = write_jsonl(tmp_path / "odd.jsonl", [{"question_id": 1, "turns": ["one", None, "three"]}])
    assert load_prompts("jsonl", str(odd))[0].later == ()  # turns up to the first that is not a string
    if MT_BENCH.is_file():
        mt = load_prompts("jsonl", str(MT_BENCH))
        assert len(mt) == 80 and all(len(p.later) == 1 for p in mt)
        assert mt[0].later == ("Rewrite your previous response. Start every sentence with the letter A.",)


def test_next_turn_puts_the_conversation_in_front(chat_dir):
    from transformers import AutoTokenizer

    from specbench.data.prompts import Prompt, next_turns, to_requests

    tok = AutoTokenizer.from_pretrained(chat_dir)
    first = to_requests([Prompt("7", "one two", "c", ("three four", "five")), Prompt("8", "six", "c")], tok)
    assert first[0].prompt_ids == tok.encode("<user>one two</s><assistant>")
    second = next_turns(first, ["seven eight", "nine"], tok)
    assert len(second) == 1  # record 8 has one turn
    r = second[0]
    assert (r.id, r.turn, r.prompt, r.category, r.later) == ("7", 2, "three four", "c", ("five",))
    assert r.prompt_ids == tok.encode("<user>one two</s><assistant>seven eight</s><user>three four</s><assistant>")
    third = next_turns(second, ["ten"], tok, system_prompt="be brief")
    assert third[0].turn == 3 and third[0].prompt_ids == tok.encode(
        "<system>be brief</s><user>one two</s><assistant>seven eight</s><user>three four</s><assistant>ten</s>"
        "<user>five</s><assistant>")
    assert next_turns(third, ["eleven"], tok) == []


def test_second_turns_follow_the_runs_own_answers(tmp_path, chat_dir, monkeypatch):
    """Greedy float32, the target drafting for itself (every draft accepted): turn 2 of records 1 and 3 is asked
    after this run's turn-1 text; steps, tokens and the per-turn block count out by hand."""
    from transformers import AutoTokenizer

    from specbench.run import run

    data = write_jsonl(tmp_path / "q.jsonl", [
        {"question_id": 1, "category": "x", "turns": ["the quick brown fox", "one two three"]},
        {"question_id": 2, "category": "y", "turns": ["hello world"]},
        {"question_id": 3, "category": "y", "turns": ["four five six", "seven eight nine"]},
    ])
    cfg = _compose([f"model.path={chat_dir}", "method=draft_model", f"method.drafter.path={chat_dir}", "k=3",
                    "max_new_tokens=12", "batch_size=2", "dtype=float32", "progress=false", "dataset=jsonl",
                    f"dataset.path={data}", "dataset.turns=2", "logger=jsonl"])
    monkeypatch.chdir(tmp_path)
    doc = run(cfg)
    reqs = doc["requests"]
    assert [(r["id"], r["turn"]) for r in reqs] == [("1", 1), ("2", 1), ("3", 1), ("1", 2), ("3", 2)]
    assert [r["prompt"] for r in reqs[3:]] == ["one two three", "seven eight nine"]
    tok = AutoTokenizer.from_pretrained(chat_dir)
    for first, second in ((reqs[0], reqs[3]), (reqs[2], reqs[4])):
        text = (f"<user>{first['prompt']}</s><assistant>{first['text']}</s><user>{second['prompt']}</s>"
                f"<assistant>")
        assert second["prompt_tokens"] == len(tok.encode(text))
    assert all(r["new_tokens"] == 12 and r["first_divergence"] is None for r in reqs)
    assert doc["outputs_match_baseline"] is True
    # every request: 1 token from its prefill, then 3 steps of 4 (the last trimmed); turn 1 runs 2 rows then 1
    # (3 + 3 steps), turn 2 both rows together (3 steps); target-only takes 11 steps where the draft took 3
    assert doc["totals"]["target_steps"] == 9 and doc["baseline"]["target_steps"] == 33
    assert doc["totals"]["new_tokens"] == doc["baseline"]["new_tokens"] == 60
    pt = doc["per_turn"]
    assert list(pt) == ["1", "2"] and pt["1"]["requests"] == 3 and pt["2"]["requests"] == 2
    assert pt["2"]["acceptance"]["num_drafts"] == 6 and pt["2"]["acceptance"]["mean_acceptance_length"] == 4.0
    assert doc["per_category"]["x"]["requests"] == 2 and doc["per_category"]["y"]["requests"] == 3
    # each turn's categories: turn 1 holds x (record 1) and y (records 2, 3); turn 2 one row of each, 3 steps of 4
    assert {c: e["requests"] for c, e in pt["1"]["per_category"].items()} == {"x": 1, "y": 2}
    for c in "xy":
        e = pt["2"]["per_category"][c]
        assert (e["requests"], e["new_tokens"], e["acceptance"]["num_drafts"]) == (1, 12, 3)
        assert e["acceptance"]["mean_acceptance_length"] == 4.0
    # the step log runs on across turns: 9 steps numbered 1..9, times rising
    steps = [json.loads(line) for line in (tmp_path / "steps.jsonl").read_text().splitlines()]
    assert [r["step"] for r in steps] == list(range(1, 10))
    assert all(a["t"] <= b["t"] for a, b in zip(steps, steps[1:]))


def test_later_turns_have_their_own_stream():
    from specbench.core.request import Request
    from specbench.core.sampling import request_seed
    from specbench.engine.loop import _seeds

    reqs = [Request(id="1", prompt="a", prompt_ids=[1]), Request(id="1", prompt="b", prompt_ids=[1], turn=2),
            Request(id="1", prompt="c", prompt_ids=[1], turn=2)]
    s = _seeds(reqs, 7)
    assert s[0] == request_seed(7, "1", 0)  # first turns keep the seeds they always had
    assert len(set(s)) == 3


def test_a_turn_after_different_answers_counts_as_diverged():
    from specbench.core.request import Request, RequestResult
    from specbench.metrics.results import build_results

    def res(prompt_ids, out, turn):
        return RequestResult(Request(id="1", prompt="q", prompt_ids=prompt_ids, turn=turn), output_ids=out)

    spec = [res([1, 2], [5, 6], 1), res([1, 2, 5, 6, 3], [7, 8], 2)]
    base = [res([1, 2], [5, 9], 1), res([1, 2, 5, 9, 3], [7, 8], 2)]  # same turn-2 tokens, other history
    doc = build_results({"temperature": 0.0}, spec, 1.0, 2, {"tokens_per_s": 1.0}, base)
    assert [r["first_divergence"] for r in doc["requests"]] == [1, 0]
    assert doc["outputs_match_baseline"] is False and doc["baseline_match_rate"] == 0.0


def test_turns_need_a_chat_template(tmp_path, tiny_dir):
    from specbench.run import run

    data = write_jsonl(tmp_path / "q.jsonl", [{"question_id": 1, "turns": ["one", "two"]}])
    cfg = _compose([f"model.path={tiny_dir}", "dataset=jsonl", f"dataset.path={data}", "dataset.turns=2",
                    "progress=false"])
    with pytest.raises(UserError, match="dataset.turns=2 needs the tokenizer's chat template"):
        run(cfg)
    cfg = _compose([f"model.path={tiny_dir}", "dataset=jsonl", f"dataset.path={data}", "dataset.turns=3",
                    "progress=false"])
    with pytest.raises(UserError, match="dataset.turns=3: no record of dataset=jsonl has more than 2"):
        run(cfg)


@pytest.mark.skipif(not MT_BENCH.is_file(), reason="shared/data is not beside this checkout")
def test_mt_bench_second_turns_on_the_embedded_target(tmp_path, monkeypatch):
    """The embedded SmolLM2's own template: n-gram lookup over both turns of two MT-bench records, greedy
    float32, token-identical to target-only; the second turn's prompt holds the first answer."""
    from specbench.run import run

    cfg = _compose(["method=ngram", "k=3", "max_new_tokens=12", "dtype=float32", "progress=false",
                    "dataset=jsonl", f"dataset.path={MT_BENCH}", "dataset.limit=2", "dataset.turns=2"])
    monkeypatch.chdir(tmp_path)
    doc = run(cfg)
    reqs = doc["requests"]
    assert [(r["id"], r["turn"]) for r in reqs] == [("81", 1), ("82", 1), ("81", 2), ("82", 2)]
    assert doc["outputs_match_baseline"] is True
    for first, second in zip(reqs[:2], reqs[2:]):
        # the template's system prompt and the first exchange come before the second question
        assert second["prompt_tokens"] > first["prompt_tokens"] + first["new_tokens"] + 10
    assert doc["per_turn"]["2"]["new_tokens"] == sum(r["new_tokens"] for r in reqs[2:])


@pytest.mark.slow
def test_second_turns_under_pipeline_parallel(tmp_path, chat_dir):
    """torchrun, pp=2: every stage builds the second turns from the same booked answers; the one results.json
    equals the single-process run's, request for request."""
    from test_cli import cli
    from test_parallel import torchrun

    data = write_jsonl(tmp_path / "q.jsonl", [
        {"question_id": 1, "turns": ["the quick brown fox", "one two three"]},
        {"question_id": 2, "turns": ["four five six", "seven eight nine"]},
    ])
    args = [f"model.path={chat_dir}", "method=draft_model", f"method.drafter.path={chat_dir}", "k=3",
            "max_new_tokens=10", "batch_size=2", "dtype=float32", "progress=false", "dataset=jsonl",
            f"dataset.path={data}", "dataset.turns=2"]
    p = cli(*args, f"hydra.run.dir={tmp_path / 'one'}", cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    r = torchrun(2, "-m", "specbench", *args, "parallel.pp=2", f"hydra.run.dir={tmp_path / 'pp'}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    one, pp = (json.loads((tmp_path / n / "results.json").read_text()) for n in ("one", "pp"))
    assert pp["config"]["pp"] == 2 and pp["outputs_match_baseline"] is True
    keys = ("id", "turn", "prompt", "prompt_tokens", "text", "accepted_per_step")
    assert [[q[k] for k in keys] for q in pp["requests"]] == [[q[k] for k in keys] for q in one["requests"]]
    assert [q["turn"] for q in pp["requests"]] == [1, 1, 2, 2]
