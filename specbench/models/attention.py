"""Attention backends over the static cache: PyTorch SDPA everywhere; flash-attn on CUDA when installed.

The cache layout is [B, Hkv, S, D]. SDPA reads slots [0, kv_len) with a boolean mask and handles GQA with
`enable_gqa` (no repeat of k/v). flash-attn's kv-cache kernel takes per-request lengths directly and a
bottom-right-aligned causal mask, which is exactly "query t sees slots < seq_lens + t + 1"; it cannot
express tree masks, so tree verification always goes through SDPA.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

try:  # optional extra `specbench[gpu]`
    from flash_attn import flash_attn_with_kvcache as _flash_kvcache  # type: ignore
except Exception:  # noqa: BLE001 - any import failure means "not available"
    _flash_kvcache = None

FLASH_AVAILABLE = _flash_kvcache is not None


@dataclass
class AttnMeta:
    kv_len: int  # host bound on the slots any query may see
    mask: Tensor | None  # [B, 1, T, kv_len] bool for SDPA; None when flash handles the mask
    flash_lens: Tensor | None = None  # [B] int32 = seq_lens + T, set only on the flash path


def choose_backend(name: str, device: torch.device) -> str:
    """'auto' = flash-attn when installed and on CUDA, else SDPA; 'sdpa' and 'flash' force one."""
    if name not in ("auto", "sdpa", "flash"):
        raise ValueError(f"attention={name!r}; valid: auto, sdpa, flash")
    usable = FLASH_AVAILABLE and device.type == "cuda"
    if name == "flash" and not usable:
        raise ValueError("attention=flash needs the flash-attn package (pip install specbench[gpu]) and CUDA")
    return "flash" if usable and name != "sdpa" else "sdpa"


def attend(q: Tensor, k_cache: Tensor, v_cache: Tensor, meta: AttnMeta) -> Tensor:
    """q [B, H, T, D], k/v cache [B, Hkv, S, D] (already holding the new tokens) -> [B, H, T, D]."""
    if meta.flash_lens is not None:
        out = _flash_kvcache(  # expects [B, T, H, D] / [B, S, Hkv, D]; strided views are fine (last dim contiguous)
            q.transpose(1, 2), k_cache.transpose(1, 2), v_cache.transpose(1, 2),
            cache_seqlens=meta.flash_lens, causal=True,
        )
        return out.transpose(1, 2)
    k, v = k_cache[:, :, : meta.kv_len], v_cache[:, :, : meta.kv_len]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=meta.mask, enable_gqa=k.shape[1] != q.shape[1])
