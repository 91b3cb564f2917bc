"""Static, position-indexed KV cache with a length per request.

Slots are positions in the cache: request b's tokens live in slots [0, seq_lens[b]). A forward pass writes
its T new tokens at slots seq_lens[b] .. seq_lens[b]+T-1 and leaves `seq_lens` alone; the engine then
*commits* by moving the length. Rolling back rejected tokens is only bookkeeping: later writes overwrite
the stale slots and the mask never lets a query see a slot at or beyond its own.
"""

from __future__ import annotations

import torch
from torch import Tensor


class KVCache:
    def __init__(
        self,
        num_layers: int,
        batch_size: int,
        num_kv_heads: int,
        max_len: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
    ) -> None:
        shape = (num_layers, batch_size, num_kv_heads, max_len, head_dim)
        self.k: Tensor = torch.zeros(shape, dtype=dtype, device=device)  # [L, B, Hkv, S, D]
        self.v: Tensor = torch.zeros(shape, dtype=dtype, device=device)  # [L, B, Hkv, S, D]
        self.seq_lens: Tensor = torch.zeros(batch_size, dtype=torch.long, device=device)  # [B]
        self._split()

    def _split(self) -> None:
        # per-layer views [B, Hkv, S, D], made once: indexing self.k[layer] is an op per call on the hot path
        self.k_layers, self.v_layers = self.k.unbind(0), self.v.unbind(0)

    @classmethod
    def _view(cls, k: Tensor, v: Tensor, seq_lens: Tensor) -> "KVCache":
        out = cls.__new__(cls)
        out.k, out.v, out.seq_lens = k, v, seq_lens
        out._split()
        return out

    @property
    def max_len(self) -> int:
        return self.k.shape[3]

    def rows(self, start: int, stop: int) -> "KVCache":
        """A view of requests [start, stop) sharing storage (used to prefill one slot of a running batch)."""
        return KVCache._view(self.k[:, start:stop], self.v[:, start:stop], self.seq_lens[start:stop])

    def write(self, layer: int, k: Tensor, v: Tensor, slots: tuple[Tensor, Tensor]) -> None:
        """Store k/v [B, T, Hkv, D] of the new tokens; slots = (rows [B, T], cache slots [B, T])."""
        rows, pos = slots
        # advanced indices on dims 0 and 2 of [B, Hkv, S, D] address a [B, T, Hkv, D] block
        self.k_layers[layer][rows, :, pos] = k
        self.v_layers[layer][rows, :, pos] = v

    def rollback(self, seq_lens: Tensor) -> None:
        """Keep slots [0, seq_lens[b]) of each request; everything after is stale."""
        self.seq_lens.copy_(seq_lens)

    def compact(self, src: Tensor, dst_start: Tensor) -> None:
        """Move kept tokens into contiguous slots: for each request b and j, slot src[b, j] -> dst_start[b] + j.

        Tree verification writes every node at the end of the cache; the accepted path is scattered among
        them, and this one gather/scatter per layer packs it right after the committed prefix. src [B, N]
        (pad with the destination slot itself to leave a slot unchanged), dst_start [B].
        """
        B, N = src.shape
        rows = torch.arange(B, device=src.device)[:, None].expand(B, N)
        dst = dst_start[:, None] + torch.arange(N, device=src.device)
        for kv in (self.k, self.v):
            moved = kv[:, rows, :, src]  # [B, N, L, Hkv, D] (non-adjacent advanced indices go first)
            kv[:, rows, :, dst] = moved
