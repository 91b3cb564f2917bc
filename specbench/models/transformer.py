"""Native Llama-family transformer (Llama 2/3/3.1, SmolLM2, Mistral, Qwen2-style q/k/v bias).

RMSNorm, RoPE (default, linear and llama3 scaling), GQA, SwiGLU, tied or untied embeddings. q/k/v and
gate/up are fused into one matrix each (one GEMM instead of three / two per layer, which matters on CPU
where a decode step is weight-streaming bound). The model reads and writes a static `KVCache`; it never
moves `cache.seq_lens` itself (the engine commits).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specbench.models.attention import AttnMeta, cached_attention
from specbench.models.cache import KVCache
from specbench.models.config import ModelConfig
from specbench.models.cpu_kernels import Linear


@dataclass
class TargetOutput:
    logits: Tensor  # [B, n, V]: the positions picked by `logit_index` (n = T when all)
    hidden: list[Tensor] = field(default_factory=list)  # per requested layer: [B, T, H], pre final norm
    normed: Tensor | None = None  # [B, T, H] final-normed hidden (what the lm_head sees), on request


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        # One fused op (statistics in float32 inside). In float32 it is bitwise HF's formula; in 16-bit HF
        # rounds twice (after normalising, then after the weight) and this rounds once, a <= 1-ulp difference
        # that buys 3 fewer ops per norm: a CPU decode step is ~1000 small ops, and op count is its overhead.
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def rope_inv_freq(cfg: ModelConfig) -> Tensor:
    """Inverse frequencies [D/2] for RoPE, with linear or llama3 (Llama 3.1) scaling."""
    dim = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    rs = cfg.rope_scaling
    if rs is None:
        return inv_freq
    kind = rs.get("rope_type", rs.get("type"))
    if kind == "linear":
        return inv_freq / float(rs["factor"])
    # llama3: long wavelengths are divided by `factor`, short ones kept, the band between interpolated
    factor, lo, hi = float(rs["factor"]), float(rs["low_freq_factor"]), float(rs["high_freq_factor"])
    old_ctx = float(rs["original_max_position_embeddings"])
    lo_wavelen, hi_wavelen = old_ctx / lo, old_ctx / hi
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > lo_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_ctx / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < hi_wavelen) * ~(wavelen > lo_wavelen)
    return torch.where(medium, smoothed, scaled)


class Rotary(nn.Module):
    """RoPE tables shared by the target and the draft heads: cos and sign-folded sin [n, D] for positions < n,
    fp32 angles (an outer product, bitwise equal to HF's matmul form) cast to the compute dtype once, grown on
    demand from a host int (no device sync). `at(pos [B, T])` -> (cos, sin) [B, T, 1, D] for `apply_rope`."""

    def __init__(self, inv_freq: Tensor) -> None:
        super().__init__()
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.register_buffer("cos_table", torch.empty(0), persistent=False)
        self.register_buffer("sin_table", torch.empty(0), persistent=False)
        self.length = 0

    def reset(self, inv_freq: Tensor) -> None:
        self.inv_freq, self.length = inv_freq, 0
        self.cos_table = self.sin_table = torch.empty(0, device=inv_freq.device)

    def ensure(self, n: int, dtype: torch.dtype) -> None:
        if n <= self.length and self.cos_table.dtype == dtype:
            return
        n = max(n, 2 * self.length)  # grow geometrically: a decode run asks for one more position at a time
        freqs = torch.arange(n, device=self.inv_freq.device, dtype=torch.float32)[:, None] * self.inv_freq.float()[None]
        emb = torch.cat((freqs, freqs), dim=-1)  # [n, D]
        half = emb.shape[-1] // 2
        sign = torch.cat((-torch.ones(half), torch.ones(half))).to(emb.device)
        self.cos_table, self.sin_table = emb.cos().to(dtype), (emb.sin() * sign).to(dtype)
        self.length = n

    def at(self, pos: Tensor) -> tuple[Tensor, Tensor]:
        return self.cos_table[pos][..., None, :], self.sin_table[pos][..., None, :]


def swiglu(gate: Tensor, up: Tensor) -> Tensor:
    return F.silu(gate) * up


def apply_rope(x: Tensor, cos: Tensor, signed_sin: Tensor) -> Tensor:
    """x * cos + rotate_half(x) * sin, with rotate_half folded into a roll and a sign on sin.

    rotate_half(x) = cat(-x2, x1) = roll(x, D/2) * [-1.., +1..]; the sign lives in `signed_sin` (exact, so the
    result is bitwise the HF formula) and the roll is one op instead of chunk + neg + cat.
    """
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        q_dim, kv_dim = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.wqkv = Linear(cfg.hidden_size, q_dim + 2 * kv_dim, bias=cfg.attention_bias)
        self.wo = Linear(q_dim, cfg.hidden_size, bias=False)
        self.split = (q_dim + kv_dim, kv_dim)  # q and k get RoPE together

    def forward(
        self, x: Tensor, cos: Tensor, sin: Tensor, cache: KVCache | None, layer: int,
        slots: tuple[Tensor, Tensor] | None, meta: AttnMeta | None,
    ) -> Tensor:
        B, T, _ = x.shape
        qk, v = self.wqkv(x).split(self.split, dim=-1)
        qk = qk.view(B, T, self.n_heads + self.n_kv, self.head_dim)
        qk = apply_rope(qk, cos, sin)  # cos / signed sin [B, T, 1, D]
        q, k = qk.split((self.n_heads, self.n_kv), dim=2)
        v = v.view(B, T, self.n_kv, self.head_dim)
        if cache is None:  # training / scoring whole sequences: plain causal attention, no cache
            y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                               is_causal=True, enable_gqa=self.n_kv != self.n_heads)
            return self.wo(y.transpose(1, 2).reshape(B, T, -1))
        return self.wo(cached_attention(q, k, v, cache, layer, slots, meta))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.w_gate_up = Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=cfg.mlp_bias)
        self.w_down = Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.w_gate_up(x).chunk(2, dim=-1)
        return self.w_down(swiglu(gate, up))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, cache: KVCache | None, layer: int,
                slots: tuple[Tensor, Tensor] | None, meta: AttnMeta | None) -> Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin, cache, layer, slots, meta)
        return x + self.mlp(self.mlp_norm(x))


def build_mask(seq_lens: Tensor, T: int, kv_len: int, tree_mask: Tensor | None) -> Tensor:
    """Boolean attention mask [B, 1, T, kv_len]: True = may attend.

    Query t of request b sits in slot seq_lens[b] + t. It sees the whole committed prefix (slots below
    seq_lens[b]) and, among the T new slots, those `tree_mask[b, t]` allows (causal when None). Slots at
    or beyond seq_lens[b] + T hold stale or other requests' padding and are never visible.
    """
    key = torch.arange(kv_len, device=seq_lens.device)  # [S]
    if tree_mask is None:
        q_slot = seq_lens[:, None] + torch.arange(T, device=seq_lens.device)  # [B, T]
        return (key[None, None, :] <= q_slot[:, :, None])[:, None]
    B = seq_lens.shape[0]
    rel = key[None, :] - seq_lens[:, None]  # [B, S] slot relative to the first new token
    in_new = (rel >= 0) & (rel < T)
    allowed = torch.gather(tree_mask, 2, rel.clamp(0, T - 1)[:, None, :].expand(B, T, kv_len))  # [B, T, S]
    return ((rel < 0)[:, None, :] | (in_new[:, None, :] & allowed))[:, None]


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.output = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.output.weight = self.tok_embeddings.weight
        self.attention = "sdpa"  # set by the loader via attention.choose_backend
        self.rotary = Rotary(rope_inv_freq(cfg))
        self.layer_offset = 0  # global id of self.layers[0]: a pipeline stage holds a slice of the layers

    @property
    def dtype(self) -> torch.dtype:
        return self.tok_embeddings.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.tok_embeddings.weight.device

    def new_cache(self, batch_size: int, max_len: int) -> KVCache:
        """A cache for the layers and KV heads this module holds (a pipeline stage or tensor-parallel shard
        holds fewer of either than the config describes)."""
        c = self.config
        self.rotary.ensure(max_len, self.dtype)
        n_kv = self.layers[0].attn.n_kv if len(self.layers) else c.num_kv_heads
        return KVCache(len(self.layers), batch_size, n_kv, max_len, c.head_dim, self.dtype, self.device)

    def forward(
        self,
        input_ids: Tensor,  # [B, T]
        cache: KVCache | None,  # None: score whole sequences from position 0 (training), causal, no cache
        *,
        kv_len: int | None = None,
        positions: Tensor | None = None,  # [B, T] RoPE positions; default seq_lens + arange(T)
        tree_mask: Tensor | None = None,  # [B, T, T] bool: node t may see new node u; None = causal
        logit_index: Tensor | None = None,  # [B, n] which of the T positions get logits; None = all
        hidden_layers: Sequence[int] = (),  # capture-before-layer ids in 0..N (N = last layer's output)
        return_normed: bool = False,
    ) -> TargetOutput:
        """Run T new tokens per request against the cache; write their k/v at slots seq_lens + arange(T).

        `kv_len` is a host-side upper bound on seq_lens.max() + T, known to the engine without a device
        sync; attention reads only that many slots. Example: prefill two prompts of lengths 5 and 3 with
        right padding: input_ids [2, 5], cache.seq_lens = [0, 0], kv_len = 5, logit_index = [[4], [2]].
        """
        ctx = self.prepare(input_ids, cache, kv_len, positions, tree_mask)
        x, got = self.run_layers(self.tok_embeddings(input_ids), ctx, cache, set(hidden_layers))
        logits, normed = self.head(x, logit_index, return_normed)
        return TargetOutput(logits=logits, hidden=[got[i] for i in hidden_layers], normed=normed)

    # The three pieces of a forward, so a pipeline stage (specbench.parallel) can run only its own part.
    def prepare(self, input_ids: Tensor, cache: KVCache | None, kv_len: int | None, positions: Tensor | None,
                tree_mask: Tensor | None) -> tuple:
        """RoPE tables, cache write slots and the attention mask shared by every layer of one forward."""
        B, T = input_ids.shape
        if cache is None:
            pos = torch.arange(T, device=input_ids.device).expand(B, T) if positions is None else positions
            self.rotary.ensure(T, self.dtype)
            write_at, meta = None, None
        else:
            kv_len = cache.max_len if kv_len is None else kv_len
            arange_t = torch.arange(T, device=input_ids.device)
            slots = cache.seq_lens[:, None] + arange_t  # [B, T]
            pos = slots if positions is None else positions
            self.rotary.ensure(int(kv_len), self.dtype)
            if self.attention == "flash" and tree_mask is None:
                meta = AttnMeta(kv_len, None, (cache.seq_lens + T).to(torch.int32))
            else:
                meta = AttnMeta(kv_len, build_mask(cache.seq_lens, T, kv_len, tree_mask))
            rows = torch.arange(B, device=input_ids.device)[:, None].expand(B, T)
            write_at = (rows, slots)  # cache.write's advanced index, built once for all layers
        cos, sin = self.rotary.at(pos)  # [B, T, 1, D]; sin with rotate_half's sign folded in
        return cos, sin, write_at, meta

    def run_layers(self, x: Tensor, ctx: tuple, cache: KVCache | None, capture: set[int]) -> tuple[Tensor, dict]:
        """Run the layers this module holds; -> (output, {layer id: state captured before that layer}).

        Ids are global (`layer_offset` is the id of self.layers[0]); id N (= num_layers) is the last layer's
        output, captured by whichever module holds the last layer. The cache is indexed by local layer."""
        cos, sin, write_at, meta = ctx
        got: dict[int, Tensor] = {}
        for i, layer in enumerate(self.layers):
            if self.layer_offset + i in capture:
                got[self.layer_offset + i] = x
            x = layer(x, cos, sin, cache, i, write_at, meta)
        end = self.layer_offset + len(self.layers)
        if end == self.config.num_layers and end in capture:
            got[end] = x
        return x, got

    def head(self, x: Tensor, logit_index: Tensor | None, return_normed: bool) -> tuple[Tensor, Tensor | None]:
        """Final norm and lm_head over the positions `logit_index` picks (all when None)."""
        h = self.norm(x)
        normed = h if return_normed else None
        if logit_index is not None:
            h = torch.gather(h, 1, logit_index[:, :, None].expand(-1, -1, h.shape[-1]))
        return self.output(h), normed
