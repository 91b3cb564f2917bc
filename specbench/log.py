"""Progress and status lines go to stderr so stdout stays for results; rank-0 only under torch.distributed."""

from __future__ import annotations

import os
import sys


def is_main_rank() -> bool:
    return os.environ.get("RANK", "0") == "0"


def log(msg: str) -> None:
    if is_main_rank():
        print(f"[specbench] {msg}", file=sys.stderr, flush=True)
