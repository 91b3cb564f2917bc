"""What the CPU can do, read once from /proc/cpuinfo (flags and model name), for kernel and dtype choices."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path


def cache_root(cache_dir: str | None = None) -> Path:
    """Where converted checkpoints, built kernels and measured kernel choices live."""
    return Path(cache_dir or os.environ.get("SPECBENCH_CACHE") or Path.home() / ".cache" / "specbench")


@lru_cache(maxsize=1)
def cpu_info() -> dict:
    """{model: str, flags: set[str]} of the first CPU; empty on systems without /proc/cpuinfo."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {"model": "", "flags": frozenset()}
    model, flags = "", frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not model:
            model = value.strip()
        elif key in ("flags", "Features") and not flags:
            flags = frozenset(value.split())
    return {"model": model, "flags": flags}


def has_flags(*names: str) -> bool:
    return all(n in cpu_info()["flags"] for n in names)


def cpu_has_fast_bf16() -> bool:
    """AVX512-BF16 or AMX: oneDNN runs bf16 GEMMs natively (about 2x fp32 for a weight-bound decode)."""
    return has_flags("avx512_bf16") or has_flags("amx_bf16")


def cpu_summary() -> dict:
    """For results.json: the CPU model and the flags that decide kernel choices."""
    keys = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "avx512_vnni", "avx_vnni", "neon", "asimd")
    info = cpu_info()
    return {"model": info["model"], "flags": sorted(k for k in keys if k in info["flags"])}
