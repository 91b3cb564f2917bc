"""Reading record files: JSON Lines (one object per line) or a JSON array, with errors naming file and record."""

from __future__ import annotations

import json
from pathlib import Path

from specbench.errors import UserError


def read_records(p: Path) -> list[tuple[str, object]]:
    """[(where, record)] with where = "<file>:<line>" (JSONL) or "<file>[<index>]" (JSON array)."""
    text = p.read_text(encoding="utf-8")
    if not text.strip():
        raise UserError(f"{p}: the file is empty")
    if p.suffix == ".jsonl":
        out = []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    out.append((f"{p}:{n}", json.loads(line)))
                except json.JSONDecodeError as e:
                    raise UserError(f"{p}:{n}: not valid JSON ({e.msg})") from None
        return out
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"{p}: not valid JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(data, list):
        raise UserError(f"{p}: expected a JSON array of records")
    return [(f"{p}[{i}]", r) for i, r in enumerate(data)]
