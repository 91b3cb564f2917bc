"""Linear layers on the CPU: which matmul formulation a decode / verify step uses.

- bfloat16 on a CPU without native bf16 dot products (no AVX512-BF16 / AMX; e.g. AVX2-only machines): PyTorch's
  bf16 matmul cost grows linearly with the token count there, so a 4-token verify costs twice a decode step
  and speculation cannot pay. `csrc/linear_bf16.cpp` (AVX2 + FMA) keeps small-M products memory-bound (and is
  4-6x faster than PyTorch's for prefills too, so it serves every M); it is
  compiled on first use into the cache dir (~1 minute, needs a C++ compiler and ninja) and used when it builds.
- float32 with 2..64 rows: `(W @ x^T)^T` instead of `x @ W^T`: MKL then streams W instead of packing it per
  call (measured 1.5-2.5x faster for 2-16 rows on an AVX2 machine; the same at 1 row).
- everything else: `F.linear`.

`set_mode("torch")` (config `model.linear=torch`) turns both off.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from specbench.log import log

_SRC = Path(__file__).resolve().parent / "csrc" / "linear_bf16.cpp"
_state: dict = {"mode": "auto", "ext": None, "tried": False}
MODES = ("auto", "torch")


def set_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"model.linear={mode!r}; valid: {', '.join(MODES)}")
    _state["mode"] = mode


def cpu_has_native_bf16() -> bool:
    from specbench.run import cpu_has_fast_bf16

    return cpu_has_fast_bf16()


def _cpu_flags() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def bf16_kernel():
    """The compiled extension, or None (not needed, not buildable); built once per process and cached on disk."""
    if _state["tried"]:
        return _state["ext"]
    _state["tried"] = True
    flags = _cpu_flags()
    if cpu_has_native_bf16() or " avx2" not in flags or " fma" not in flags:
        return None
    try:
        from torch.utils.cpp_extension import load

        from specbench.models.loading import cache_root

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


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """F.linear(x, weight, bias) with the formulation chosen above."""
    if _state["mode"] == "torch" or x.device.type != "cpu" or torch.is_grad_enabled():
        return F.linear(x, weight, bias)
    K = x.shape[-1]
    M = x.numel() // K
    if x.dtype == torch.bfloat16 and weight.dtype == torch.bfloat16 and K % 8 == 0:
        ext = bf16_kernel()
        if ext is not None and weight.is_contiguous():
            y = ext.linear_bf16(x.reshape(M, K), weight)
            if bias is not None:
                y = y + bias
            return y.view(*x.shape[:-1], weight.shape[0])
    elif x.dtype == torch.float32 and 1 < M <= 64:
        y = (weight @ x.reshape(M, K).T).T
        if bias is not None:
            y = y + bias
        return y.reshape(*x.shape[:-1], weight.shape[0])
    return F.linear(x, weight, bias)


class Linear(torch.nn.Linear):
    """nn.Linear whose forward goes through `linear` (same parameters, same state-dict names)."""

    def forward(self, x: Tensor) -> Tensor:
        return linear(x, self.weight, self.bias)
