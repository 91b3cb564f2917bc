"""KV cache bookkeeping: rollback after extra writes, compaction of a kept path, slot views."""

from __future__ import annotations

import torch

from specbench.models.loading import load_model

CPU = torch.device("cpu")


def _greedy(m, cache, first: torch.Tensor, n: int, start: list[int]) -> list[list[int]]:
    lens, tok, out = list(start), first, []
    for _ in range(n):
        logits = m(tok, cache, kv_len=max(lens) + 1).logits
        cache.seq_lens += 1
        lens = [x + 1 for x in lens]
        tok = logits.argmax(-1)
        out.append(tok[:, 0].tolist())
    return out


def test_rollback_after_extra_tokens_is_identical(tiny_dir):
    """Write k extra (rejected) tokens into the cache, roll back, decode: same as never writing them."""
    m = load_model(str(tiny_dir), torch.float32, CPU).model
    prompts = torch.tensor([[5, 17, 99, 3, 250], [40, 41, 42, 0, 0]])
    lens = [5, 3]

    def prefilled():
        c = m.new_cache(2, 64)
        out = m(prompts, c, kv_len=5, logit_index=torch.tensor([[4], [2]]))
        c.seq_lens.copy_(torch.tensor(lens))
        return c, out.logits.argmax(-1)

    clean, first = prefilled()
    ref = _greedy(m, clean, first, 6, lens)

    dirty, first2 = prefilled()
    k = 4
    junk = torch.tensor([[7, 8, 9, 10], [300, 301, 302, 303]])
    m(junk, dirty, kv_len=max(lens) + k)  # speculative tokens written at slots seq_lens .. seq_lens+k-1
    dirty.rollback(torch.tensor(lens))  # all rejected
    assert _greedy(m, dirty, first2, 6, lens) == ref

    # partial accept: keep 2 of the junk tokens in row 0 only, and compare with a fresh prefill of that text
    part, first3 = prefilled()
    m(junk, part, kv_len=max(lens) + k)
    part.rollback(torch.tensor([lens[0] + 2, lens[1]]))
    fresh = m.new_cache(1, 64)
    text = prompts[0].tolist() + junk[0, :2].tolist()
    m(torch.tensor([text]), fresh, kv_len=len(text))
    n = len(text)
    for layer in range(m.config.num_layers):
        torch.testing.assert_close(part.k[layer, 0, :, :n], fresh.k[layer, 0, :, :n], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(part.v[layer, 0, :, :n], fresh.v[layer, 0, :, :n], atol=1e-5, rtol=1e-5)


def test_compact_moves_kept_path():
    from specbench.models.cache import KVCache

    c = KVCache(2, 2, 1, 10, 3, torch.float32)
    c.k.copy_(torch.arange(c.k.numel(), dtype=torch.float32).view_as(c.k))
    before = c.k.clone()
    # row 0 keeps slots 6 and 8 -> 4, 5; row 1 keeps slot 3 -> 3 (pad with its own destination)
    c.compact(torch.tensor([[6, 8], [3, 4]]), torch.tensor([4, 3]))
    torch.testing.assert_close(c.k[:, 0, :, 4], before[:, 0, :, 6])
    torch.testing.assert_close(c.k[:, 0, :, 5], before[:, 0, :, 8])
    torch.testing.assert_close(c.k[:, 1, :, 3:5], before[:, 1, :, 3:5])
    torch.testing.assert_close(c.k[:, 0, :, :4], before[:, 0, :, :4])


def test_row_view_shares_storage():
    from specbench.models.cache import KVCache

    c = KVCache(1, 3, 1, 4, 2, torch.float32)
    v = c.rows(1, 2)
    v.k.fill_(1.0)
    v.seq_lens.fill_(3)
    assert c.k[:, 1].eq(1).all() and c.k[:, 0].eq(0).all() and c.seq_lens.tolist() == [0, 3, 0]
