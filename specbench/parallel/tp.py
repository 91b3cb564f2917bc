"""Tensor parallelism as a transform of a loaded `Transformer` (the model code knows nothing of ranks).

Per layer (Megatron's split, as gpt-fast's tp.py): the fused q/k/v matrix is column-parallel, split segment
by segment (rank r keeps its q heads, then its k heads, then its v heads, so a rank's q heads and the KV
heads they read stay together under GQA); the output projection is row-parallel (the input columns of those
heads). The fused gate/up matrix keeps rank r's slice of the gate rows and the same slice of the up rows;
the down projection keeps the matching input columns. Each row-parallel output is a partial sum, so a
forward hook all-reduces the attention output and the MLP output over the stage's tp group: two all-reduces
per layer. Each rank's KV cache holds its own KV heads (the model sizes its cache from the heads it holds).

Embeddings and the lm_head are replicated, not vocab-parallel: every rank then holds the full logits, the
acceptance rule and sampling need no gather, and the logits are bitwise those of the local lm_head. The
price is memory (Llama-3.1-8B: 2 × 0.5 GB per rank in bf16); a vocab-parallel head would trade it for an
all-gather of [B, 1+N, V] logits every step.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from specbench.errors import UserError
from specbench.parallel.topology import Comm


def check_divisible(cfg, tp: int, what: str = "the target") -> None:
    """Heads, KV heads and the MLP width must split evenly over tp ranks."""
    for name, v in (("num_attention_heads", cfg.num_heads), ("num_key_value_heads", cfg.num_kv_heads),
                    ("intermediate_size", cfg.intermediate_size)):
        if v % tp:
            valid = [d for d in range(1, v + 1) if cfg.num_heads % d == 0 and cfg.num_kv_heads % d == 0
                     and cfg.intermediate_size % d == 0]
            raise UserError(f"parallel.tp={tp}: {what} has {name}={v}, not divisible by {tp}; "
                            f"valid tp for it: {', '.join(map(str, valid))}")


def _keep_rows(lin: nn.Linear, pieces: list[tuple[int, int]]) -> None:
    """Keep the output rows [lo, hi) of each piece, concatenated (a column-parallel shard)."""
    w = torch.cat([lin.weight.data[lo:hi] for lo, hi in pieces]).contiguous()
    lin.weight = nn.Parameter(w, requires_grad=False)
    if lin.bias is not None:
        lin.bias = nn.Parameter(torch.cat([lin.bias.data[lo:hi] for lo, hi in pieces]).contiguous(),
                                requires_grad=False)
    lin.out_features = w.shape[0]


def _keep_cols(lin: nn.Linear, lo: int, hi: int, keep_bias: bool) -> None:
    """Keep input columns [lo, hi) (a row-parallel shard); the bias stays on one rank so the sum adds it once."""
    lin.weight = nn.Parameter(lin.weight.data[:, lo:hi].contiguous(), requires_grad=False)
    if lin.bias is not None and not keep_bias:
        lin.bias = None
    lin.in_features = hi - lo


def _all_reduce_hook(comm: Comm, group):
    def hook(module: nn.Module, inputs, output: Tensor) -> Tensor:
        return comm.all_reduce(output, group)
    return hook


def shard(model, rank: int, tp: int, comm: Comm, group):
    """Shard every layer of `model` (a Transformer) for rank `rank` of `tp`, in place; returns the model."""
    check_divisible(model.config, tp)
    for block in model.layers:
        a = block.attn
        H, K, D = a.n_heads, a.n_kv, a.head_dim
        h, kv = H // tp, K // tp
        q0, k0, v0 = 0, H * D, (H + K) * D
        _keep_rows(a.wqkv, [(q0 + rank * h * D, q0 + (rank + 1) * h * D),
                            (k0 + rank * kv * D, k0 + (rank + 1) * kv * D),
                            (v0 + rank * kv * D, v0 + (rank + 1) * kv * D)])
        _keep_cols(a.wo, rank * h * D, (rank + 1) * h * D, keep_bias=rank == 0)
        a.n_heads, a.n_kv = h, kv
        a.split = ((h + kv) * D, kv * D)
        m = block.mlp
        I = m.w_down.in_features
        i = I // tp
        _keep_rows(m.w_gate_up, [(rank * i, (rank + 1) * i), (I + rank * i, I + (rank + 1) * i)])
        _keep_cols(m.w_down, rank * i, (rank + 1) * i, keep_bias=rank == 0)
        a.register_forward_hook(_all_reduce_hook(comm, group))
        m.register_forward_hook(_all_reduce_hook(comm, group))
    model.tp_size = tp
    return model
