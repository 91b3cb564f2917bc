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


def cached_attention(q: Tensor, k: Tensor, v: Tensor, cache, layer: int, slots: tuple[Tensor, Tensor],
                     meta: AttnMeta) -> Tensor:
    """q [B, T, H, D], k / v [B, T, Hkv, D] (RoPE applied): store k / v at `slots` of `cache` layer `layer`,
    attend over the cache -> [B, T, H * D] (the output projection's input). Shared by the target and the heads."""
    cache.write(layer, k, v, slots)
    B, T = q.shape[:2]
    y = attend(q.transpose(1, 2), cache.k_layers[layer], cache.v_layers[layer], meta)
    return y.transpose(1, 2).reshape(B, T, -1)


def attend(q: Tensor, k_cache: Tensor, v_cache: Tensor, meta: AttnMeta) -> Tensor:
    """q [B, H, T, D], k/v cache [B, Hkv, S, D] (already holding the new tokens) -> [B, H, T, D]."""
    if meta.flash_lens is not None:
        out = _flash_kvcache(  # expects [B, T, H, D] / [B, S, Hkv, D]; strided views are fine (last dim contiguous)
            q.transpose(1, 2), k_cache.transpose(1, 2), v_cache.transpose(1, 2),
            cache_seqlens=meta.flash_lens, causal=True,
        )
        return out.transpose(1, 2)
    k, v = k_cache[:, :, : meta.kv_len], v_cache[:, :, : meta.kv_len]
    B, T = q.shape[0], q.shape[2]
    if q.device.type == "cpu" and B >= 4 and T <= 64 and meta.mask is not None:
        return _attend_grouped(q, k, v, meta.mask)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=meta.mask, enable_gqa=k.shape[1] != q.shape[1])


def _attend_grouped(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    """Batched decode / verify attention as two GEMMs over the GQA groups, softmax in float32.

    PyTorch's CPU flash kernel costs ~1.7 ms per layer at batch 32 with one query per row (measured here,
    bf16), about 4x this form; for one request or a long prefill SDPA is faster and is used instead.
    """
    B, H, T, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    G = H // Hkv
    scores = torch.matmul(q.reshape(B, Hkv, G * T, D), k.transpose(-1, -2)).view(B, Hkv, G, T, S)
    scores = torch.where(mask[:, :, None], scores.float() * D**-0.5, float("-inf"))  # mask [B, 1, T, S]
    p = torch.softmax(scores, dim=-1).to(q.dtype).view(B, Hkv, G * T, S)
    return torch.matmul(p, v).view(B, H, T, D)
