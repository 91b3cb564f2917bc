"""Read W&B offline run files (`run-*.wandb`) back: a LevelDB-style log of protobuf `Record`s.

File: 7-byte header (":W&B", magic 0xBEE1, version); then 32 KiB blocks of chunks, each with a 7-byte header
(crc32, length, type: 1 full, 2 first, 3 middle, 4 last); a block tail shorter than 7 bytes is padding.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

BLOCK = 32768


def records(path: Path) -> list:
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    pos, out, buf = 7, [], b""
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        payload = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 1:
            out.append(payload)
        elif kind == 2:
            buf = payload
        elif kind == 3:
            buf += payload
        elif kind == 4:
            out.append(buf + payload)
        elif kind == 0 and length == 0:
            pos += BLOCK - pos % BLOCK if pos % BLOCK else 0
    return [pb.Record.FromString(p) for p in out]


def _key(item) -> str:
    return item.key or "/".join(item.nested_key)


def read_run(run_dir: Path) -> dict:
    """{'history': [row dicts], 'summary': {...}, 'config': {...}, 'group': str, 'project': str}."""
    (path,) = list(run_dir.glob("run-*.wandb"))
    out = {"history": [], "summary": {}, "config": {}, "group": None, "project": None}
    for rec in records(path):
        kind = rec.WhichOneof("record_type")
        if kind == "history":
            out["history"].append({_key(i): json.loads(i.value_json) for i in rec.history.item})
        elif kind == "summary":
            out["summary"].update({_key(i): json.loads(i.value_json) for i in rec.summary.update})
        elif kind == "config":
            out["config"].update({_key(i): json.loads(i.value_json) for i in rec.config.update})
        elif kind == "run":
            out["group"], out["project"] = rec.run.run_group, rec.run.project
            out["config"].update({_key(i): json.loads(i.value_json) for i in rec.run.config.update})
    return out
