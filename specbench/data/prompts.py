"""Prompt sets: the builtin set, MT-bench / Spec-Bench style question.jsonl files, HF datasets by name."""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from specbench.data.files import read_records
from specbench.core.request import Request
from specbench.errors import UserError


@dataclass
class Prompt:
    id: str
    prompt: str  # the (first) user message
    category: str | None = None
    later: tuple[str, ...] = ()  # the user turns after the first (MT-bench's second turn), asked in order


def builtin_prompts() -> list[Prompt]:
    text = resources.files("specbench.data").joinpath("builtin.jsonl").read_text()
    return [Prompt(**json.loads(line)) for line in text.splitlines() if line.strip()]


def _turns(rec: dict, where: str) -> list[str]:
    """The user turns of a record: MT-bench `turns` (up to the first that is not a string), or `prompt`, or
    `instruction` (+ `input`)."""
    turns = rec.get("turns")
    if isinstance(turns, list) and turns and isinstance(turns[0], str):
        n = next((i for i, t in enumerate(turns) if not isinstance(t, str)), len(turns))
        return list(turns[:n])
    if isinstance(rec.get("prompt"), str):
        return [rec["prompt"]]
    if isinstance(rec.get("instruction"), str):
        extra = rec.get("input") or ""
        return [rec["instruction"] + (f"\n\n{extra}" if extra else "")]
    raise UserError(f"{where}: record has no 'turns' (list of strings), 'prompt' or 'instruction' field")


def _prompt(rid, turns: list[str], category) -> Prompt:
    return Prompt(id=str(rid), prompt=turns[0], category=category, later=tuple(turns[1:]))


def jsonl_prompts(path: str) -> list[Prompt]:
    """MT-bench/Spec-Bench question.jsonl: {question_id, category, turns: [first, second, ...]}; every turn kept
    (`dataset.turns` says how many are decoded)."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise UserError(f"dataset.path={path!r}: no such file (expected a question.jsonl)")
    out: list[Prompt] = []
    for n, (where, rec) in enumerate(read_records(p), 1):
        if not isinstance(rec, dict):
            raise UserError(f"{where}: expected a JSON object per record")
        rid = rec.get("question_id", rec.get("id", n))
        out.append(_prompt(rid, _turns(rec, where), rec.get("category")))
    if not out:
        raise UserError(f"dataset.path={path!r}: the file holds no records")
    return out


def hf_prompts(name: str, split: str, field: str | None) -> list[Prompt]:
    """An HF dataset by name (needs `datasets` and a reachable hub or a local cache)."""
    try:
        import datasets
    except ImportError:
        raise UserError("dataset=hf needs the `datasets` package: pip install datasets") from None
    try:
        ds = datasets.load_dataset(name, split=split)
    except Exception as e:  # noqa: BLE001
        raise UserError(f"dataset.name={name!r}: cannot load ({type(e).__name__}: {str(e).splitlines()[0][:160]})") from None
    out = []
    for i, rec in enumerate(ds):
        turns = [rec[field]] if field else _turns(rec, f"{name}[{i}]")
        rid = next((rec[k] for k in ("question_id", "id") if rec.get(k) is not None), i)  # columns are unified
        out.append(_prompt(rid, turns, rec.get("category")))
    return out


def load_prompts(kind: str, path: str | None = None, limit: int | None = None, name: str | None = None,
                 split: str = "train", field: str | None = None, per_category: int | None = None) -> list[Prompt]:
    if kind == "builtin":
        prompts = builtin_prompts()
    elif kind == "jsonl":
        if not path:
            raise UserError("dataset=jsonl needs dataset.path=/path/to/question.jsonl")
        prompts = jsonl_prompts(path)
    elif kind == "hf":
        if not name:
            raise UserError("dataset=hf needs dataset.name=<hub dataset id>")
        prompts = hf_prompts(name, split, field)
    else:
        raise UserError(f"dataset kind {kind!r}; valid: builtin, jsonl, hf")
    if per_category is not None:  # the first N of each category, in file order (MT-bench is sorted by category)
        if per_category < 1:
            raise UserError(f"dataset.per_category={per_category}: must be >= 1 (or null for all)")
        seen: dict[str | None, int] = {}
        kept = []
        for p in prompts:
            seen[p.category] = seen.get(p.category, 0) + 1
            if seen[p.category] <= per_category:
                kept.append(p)
        prompts = kept
    if limit is not None:
        if limit < 1:
            raise UserError(f"dataset.limit={limit}: must be >= 1 (or null for all)")
        prompts = prompts[:limit]
    return prompts


_TEMPLATE = "the tokenizer's chat template (model.chat_template=true and a tokenizer that has one)"


def _templated(tokenizer, chat_template: bool) -> bool:
    return bool(chat_template and getattr(tokenizer, "chat_template", None))


def encode_prompt(tokenizer, text: str, chat_template: bool = True, system_prompt: str | None = None,
                  history: tuple[tuple[str, str], ...] = ()) -> list[int]:
    """Token ids of one user turn, wrapped in the tokenizer's chat template with the generation prompt.
    history: the (user, assistant) exchanges before it (a later turn of a conversation; needs the template)."""
    if _templated(tokenizer, chat_template):
        msgs = [{"role": "system", "content": system_prompt}] if system_prompt else []
        for user, answer in history:
            msgs += [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
        msgs.append({"role": "user", "content": text})
        ids = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False)
        return list(ids)
    if history:
        raise UserError(f"a later turn of a conversation needs {_TEMPLATE}")
    return tokenizer.encode(text)


def check_turns(prompts: list[Prompt], turns: int, tokenizer, chat_template: bool, source: str) -> None:
    """dataset.turns above 1: some record must have that many user turns, and the chat template must exist to
    put the conversation so far in front of a later turn."""
    if turns <= 1:
        return
    most = max((1 + len(p.later) for p in prompts), default=0)
    if most < turns:
        raise UserError(f"dataset.turns={turns}: no record of {source} has more than {most} user turn(s) "
                        f"(MT-bench's question.jsonl has 2)")
    if not _templated(tokenizer, chat_template):
        raise UserError(f"dataset.turns={turns} needs {_TEMPLATE}")


def to_requests(prompts: list[Prompt], tokenizer, chat_template: bool = True,
                system_prompt: str | None = None) -> list[Request]:
    """The first turns."""
    return [Request(id=p.id, prompt=p.prompt, category=p.category, later=p.later,
                    prompt_ids=encode_prompt(tokenizer, p.prompt, chat_template, system_prompt)) for p in prompts]


def next_turns(asked: list[Request], answers: list[str], tokenizer, chat_template: bool = True,
               system_prompt: str | None = None) -> list[Request]:
    """The next user turn of every conversation that has one, after the answers this run gave to `asked`."""
    out = []
    for req, answer in zip(asked, answers, strict=True):
        if req.later:
            history = (*req.history, (req.prompt, answer))
            text = req.later[0]
            out.append(Request(id=req.id, prompt=text, category=req.category, turn=req.turn + 1, history=history,
                               later=req.later[1:],
                               prompt_ids=encode_prompt(tokenizer, text, chat_template, system_prompt, history)))
    return out
