"""Linear layers on the CPU: which matmul formulation a decode / verify step uses, chosen by measurement.

Candidates for `linear(x, W)` with M = rows of x:
- `torch`: F.linear (x @ W^T).
- `wxt` (fp32): (W @ x^T)^T. MKL then streams W instead of packing it per call: measured 1.5-2.5x faster at
  2-16 rows on an AVX2 machine; how much, and for which shapes, depends on the CPU. (For bf16 it was measured
  in-model slower than oneDNN's native path on an AVX512-BF16 CPU at 16-24 rows although a micro-benchmark
  preferred it, so it is not a bf16 candidate.)
- `avx2` (bf16 only, CPUs without native bf16 dot products): `csrc/linear_bf16.cpp` (AVX2 + FMA), where
  PyTorch's bf16 matmul cost grows linearly with the token count. Compiled on first use into the cache dir
  (~1 minute, needs a C++ compiler and ninja); a candidate only where it builds.

`model.linear=auto` measures the candidates once per (dtype, K x N weight shape, M bucket) at first use
(interleaved rounds over weight copies that do not fit the caches, as a real step streams its weights; median;
a candidate replaces `torch` only when it is at least 5% faster) and caches the
choice on disk per CPU model, torch version and thread count, so a machine measures once. Weights under
64K elements always use F.linear (call overhead dominates there). `describe()` lists the choices made, for
results.json. `model.linear=torch` (`set_mode("torch")`) turns all of it off.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from specbench.core.hw import cache_root, cpu_has_fast_bf16, cpu_info, has_flags
from specbench.log import log

_SRC = Path(__file__).resolve().parent / "csrc" / "linear_bf16.cpp"
_state: dict = {"mode": "auto", "ext": None, "tried": False, "table": None, "memo": {}}
MODES = ("auto", "torch")
BUCKETS = (1, 2, 4, 8, 16, 32, 64, 256)  # M is measured at the smallest bucket >= M (prefills: 256)
MIN_WEIGHT = 1 << 16  # smaller weights: F.linear, no measurement
MARGIN = 0.95  # an alternative must take <= 95% of torch's time


def set_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"model.linear={mode!r}; valid: {', '.join(MODES)}")
    _state["mode"] = mode


def cpu_has_native_bf16() -> bool:
    return cpu_has_fast_bf16()


def bf16_kernel():
    """The compiled extension, or None (not needed, not buildable); built once per process and cached on disk."""
    if _state["tried"]:
        return _state["ext"]
    _state["tried"] = True
    if cpu_has_native_bf16() or not has_flags("avx2", "fma"):
        return None
    try:
        from torch.utils.cpp_extension import load

        tag = hashlib.sha256(_SRC.read_bytes() + torch.__version__.encode()).hexdigest()[:12]
        build = cache_root() / "ext" / f"linear_bf16-{tag}"
        build.mkdir(parents=True, exist_ok=True)
        if not (build / "specbench_linear_bf16.so").is_file():
            log("building the AVX2 bf16 linear kernel (first use only, ~1 min)")
        _state["ext"] = load(name="specbench_linear_bf16", sources=[str(_SRC)], build_directory=str(build),
                             extra_cflags=["-O3", "-mavx2", "-mfma", "-fopenmp"],
                             extra_ldflags=["-fopenmp"], verbose=False)
    except Exception as e:  # noqa: BLE001 - no compiler / ninja: fall back to torch, say so once
        log(f"WARNING: the AVX2 bf16 kernel did not build ({type(e).__name__}: {str(e).splitlines()[0][:160]}); "
            "bf16 matmuls use PyTorch's kernels, which are slow for multi-token steps on this CPU")
        _state["ext"] = None
    return _state["ext"]


def _bucket(M: int) -> int:
    return next((b for b in BUCKETS if M <= b), BUCKETS[-1])


def _table_path() -> Path:
    tag = hashlib.sha256(f"{cpu_info()['model']}|{sorted(cpu_info()['flags'])}|{torch.__version__}|"
                         f"{torch.get_num_threads()}".encode()).hexdigest()[:16]
    return cache_root() / "linear" / f"choices-{tag}.json"


def _table() -> dict:
    if _state["table"] is None:
        _state["memo"] = {}
        path = _table_path()
        try:
            _state["table"] = json.loads(path.read_text())
        except (OSError, ValueError):
            _state["table"] = {}
    return _state["table"]


def _run(name: str, x: Tensor, w: Tensor) -> Tensor:
    if name == "wxt":
        return (w @ x.T).T
    if name == "avx2":
        return bf16_kernel().linear_bf16(x, w)
    return F.linear(x, w)


def _measure(dtype: torch.dtype, K: int, N: int, M: int) -> str:
    """Time every candidate on random [M, K] x [N, K]^T in interleaved rounds; the fastest by median.

    A decode step streams its weights from memory (a model is larger than the caches), so the timing cycles
    through enough weight copies (~64 MB) that each call reads its weight from DRAM too, not from L2/L3."""
    names = ["torch", "wxt" if dtype == torch.float32 else "avx2"]
    if names[1] == "avx2" and (K % 8 or bf16_kernel() is None):
        return "torch"
    g = torch.Generator().manual_seed(0)
    x = torch.randn(M, K, generator=g).to(dtype)
    copies = max(2, min(64, (64 << 20) // (K * N * x.element_size())))
    ws = [torch.randn(N, K, generator=g).to(dtype) for _ in range(copies)]
    with torch.no_grad():
        for n in names:  # warm-up (first-call allocations, kernel packing)
            _run(n, x, ws[0])
        times: dict[str, list[float]] = {n: [] for n in names}
        for _ in range(5):
            for n in names:
                t0 = time.perf_counter()
                for w in ws:
                    _run(n, x, w)
                times[n].append(time.perf_counter() - t0)
    med = {n: statistics.median(t) for n, t in times.items()}
    best = min(med, key=med.get)
    return best if med[best] <= MARGIN * med["torch"] else "torch"


def choice(dtype: torch.dtype, K: int, N: int, M: int) -> str:
    """The formulation `linear` uses for [M, K] x [N, K]^T (measured once, cached on disk; every linear call of
    a step asks, so the answer is memoised per (dtype, K, N, M) in the process)."""
    table = _table()
    memo = _state["memo"]
    hit = memo.get((dtype, K, N, M))
    if hit is not None:
        return hit
    if K * N < MIN_WEIGHT or dtype not in (torch.float32, torch.bfloat16):
        memo[(dtype, K, N, M)] = "torch"
        return "torch"
    key = f"{str(dtype).removeprefix('torch.')}:{K}x{N}:{_bucket(M)}"
    if key not in table:
        table[key] = _measure(dtype, K, N, _bucket(M))
        path = _table_path()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(table, indent=1, sort_keys=True))
            tmp.replace(path)
        except OSError:  # a read-only cache only costs re-measuring next time
            pass
    memo[(dtype, K, N, M)] = table[key]
    return table[key]


def describe(dtype: torch.dtype | None = None) -> dict:
    """For results.json: the mode, where the choices are cached, and every choice measured (for `dtype`)."""
    prefix = "" if dtype is None else str(dtype).removeprefix("torch.") + ":"
    return {"mode": _state["mode"], "table": str(_table_path()),
            "choices": {k: v for k, v in sorted(_table().items()) if k.startswith(prefix)}}


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """F.linear(x, weight, bias) with the formulation measured fastest on this CPU for its shape."""
    if _state["mode"] == "torch" or x.device.type != "cpu" or torch.is_grad_enabled():
        return F.linear(x, weight, bias)
    K = x.shape[-1]
    M = x.numel() // K
    if x.dtype != weight.dtype or not weight.is_contiguous():
        return F.linear(x, weight, bias)
    how = choice(x.dtype, K, weight.shape[0], M)
    if how == "torch":
        return F.linear(x, weight, bias)
    y = _run(how, x.reshape(M, K), weight)
    if bias is not None:
        y = y + bias
    return y.view(*x.shape[:-1], weight.shape[0])
class Linear(torch.nn.Linear):
    """nn.Linear whose forward goes through `linear` (same parameters, same state-dict names)."""

    def forward(self, x: Tensor) -> Tensor:
        return linear(x, self.weight, self.bias)
