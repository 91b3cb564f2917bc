"""Async scheduling (parallel.async=true) against the synchronous loop on tiny models: stop strings and EOS in
the middle of an accepted chunk, refills, sampling; and the synthetic acceptance rule (acceptance=synthetic):
per-position acceptance within binomial bounds, with a control that treats the rates as conditional.

Every method, chains and trees, and async x pipeline parallel run in tests/test_parallel.py (one shared set of
checkpoints in public layouts)."""

from __future__ import annotations

import math

import pytest
import torch

from specbench.core.request import Request
from specbench.core.sampling import SamplingParams
from specbench.core.types import DraftTree
from specbench.drafters.draft_model import DraftModelDrafter
from specbench.drafters.ngram import NgramDrafter
from specbench.engine.loop import Engine, StopCriteria
from specbench.errors import UserError
from specbench import verify as V

PROMPTS = [[5, 17, 99, 3, 250, 7, 8, 5, 17], [40, 41, 42], [300, 3, 9, 11, 12, 300, 3], [6, 7],
           [100, 101, 102, 103, 104, 105]]


def _requests() -> list[Request]:
    return [Request(id=str(i), prompt=f"p{i}", prompt_ids=list(p)) for i, p in enumerate(PROMPTS)]


def _engine(lm, drafter=None, k=0, batch=3, max_new=24, eos=(), stop=(), params=SamplingParams(), async_=False,
            acceptance="auto", kw=None) -> Engine:
    return Engine(lm.model, lm.tokenizer, batch_size=batch, stop=StopCriteria(frozenset(eos), max_new, tuple(stop)),
                  params=params, seed=3, progress=False, drafter=drafter, k=k, acceptance=acceptance,
                  acceptance_kw=kw, async_scheduling=async_)


def _same(a, b) -> None:
    for x, y in zip(a, b):
        assert (x.output_ids, x.text, x.finish_reason) == (y.output_ids, y.text, y.finish_reason)
        assert (x.accepted_per_step, x.draft_lens, x.chunk_sizes) == (y.accepted_per_step, y.draft_lens, y.chunk_sizes)


@pytest.fixture(params=["exact", "bounds"])
def lens_mode(request, monkeypatch):
    """exact: the CPU reads each step's accepted counts at launch; bounds: the CUDA path's upper bounds."""
    monkeypatch.setattr(Engine, "exact_lens_on_cpu", request.param == "exact")
    return request.param


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_stop_string_and_eos_mid_chunk(tiny_lm, temperature, lens_mode):
    """A self-draft accepts whole chunks, so a stop string and an EOS land inside them; 5 requests in 3 rows
    (refills one step later when async). Outputs, texts, finish reasons, per-step counts and kept chunk sizes
    equal the sync loop's; the async run stepped rows past their stop and discarded those tokens."""
    params = SamplingParams(temperature)
    for make, k in ((lambda: DraftModelDrafter(model=tiny_lm.model), 4), (lambda: NgramDrafter(1, 3), 3)):
        ref = _engine(tiny_lm, make(), k, params=params).run(_requests())  # where the stops can come from
        ids = ref[2].output_ids
        eos = next(t for t in ids[5:15] if t not in ids[:5] and all(t not in r.output_ids for r in ref[:2]))
        stop = tiny_lm.tokenizer.decode(ref[0].output_ids[9:11])
        assert stop.strip() and stop not in tiny_lm.tokenizer.decode(ref[0].output_ids[:9])
        runs = {}
        for async_ in (False, True):
            e = _engine(tiny_lm, make(), k, eos=[eos], stop=[stop], params=params, async_=async_)
            runs[async_] = (e, e.run(_requests()))
        _same(runs[False][1], runs[True][1])
        res = runs[True][1]
        assert {r.finish_reason for r in res} == {"eos", "stop", "length"}
        assert runs[True][0].discarded_rows >= len(PROMPTS) and runs[False][0].discarded_rows == 0
    if temperature == 0:  # the self-draft accepted a whole chunk in which the EOS / stop string was trimmed
        assert any(sum(r.chunk_sizes) < sum(a + 1 for a in r.accepted_per_step) for r in res)


def test_async_timing_recorded(tiny_lm):
    e = _engine(tiny_lm, DraftModelDrafter(model=tiny_lm.model), 3, async_=True)
    e.run(_requests())
    t = e.timing
    assert t["host_s"] > 0 and 0 <= t["host_critical_s"] <= t["host_s"]
    assert t["host_overlap_s"] == pytest.approx(t["host_s"] - t["host_critical_s"])
    s = _engine(tiny_lm, DraftModelDrafter(model=tiny_lm.model), 3)
    s.run(_requests())
    assert s.timing["host_critical_s"] == s.timing["host_s"] and s.timing["host_overlap_s"] == 0


def test_bookkeeping_leaves_the_critical_path(tiny_lm, monkeypatch):
    """A step that takes 10 ms outside the GIL (as a device step or a long kernel) and bookkeeping that takes
    6 ms (a slow metrics sink): synchronously every step pays both; with async scheduling the bookkeeping runs
    beside the next step, so almost none of it is on the critical path and a step is shorter by about it.
    Wall times are the best of three interleaved runs per mode (a shared 2-core machine is noisy)."""
    import time

    step = Engine._step

    def slow_step(self, slots):
        time.sleep(0.010)
        return step(self, slots)

    monkeypatch.setattr(Engine, "_step", slow_step)
    runs: dict = {}
    for _ in range(3):
        for async_ in (False, True):
            e = _engine(tiny_lm, DraftModelDrafter(model=tiny_lm.model), 3, async_=async_)
            e.on_step = lambda rec: time.sleep(0.006)
            t0 = time.perf_counter()
            res = e.run(_requests())
            per_step = (time.perf_counter() - t0) / e.num_steps
            if async_ not in runs or per_step < runs[async_][1]:
                runs[async_] = (e, per_step, [r.output_ids for r in res])
    (sync, sync_step, sync_ids), (asy, asy_step, asy_ids) = runs[False], runs[True]
    assert asy_ids == sync_ids
    assert sync.timing["host_critical_s"] == sync.timing["host_s"] >= 0.006 * sync.num_steps
    assert asy.timing["host_s"] > 0.9 * sync.timing["host_s"]  # the same bookkeeping, done elsewhere
    assert asy.timing["host_critical_s"] < 0.2 * asy.timing["host_s"]
    # per step (async runs a few more: refills one step later, a last step for requests already stopped)
    assert asy_step < sync_step - 0.0025


# ------------------------------------------------------------------------------------------- synthetic rule
def _chain(B: int, K: int) -> DraftTree:
    tokens = (torch.arange(K) + 10).expand(B, K).contiguous()
    return DraftTree.chain(tokens, torch.full((B,), K))


def _bounds(p: float, n: int, z: float = 5.0) -> tuple[float, float]:
    s = z * math.sqrt(p * (1 - p) / n)
    return p - s, p + s


def _shares(num_acc: torch.Tensor, K: int) -> list[float]:
    """Share of rows whose i-th draft was kept, counted from the accepted lengths."""
    return [(num_acc > i).double().mean().item() for i in range(K)]


def test_synthetic_rates_within_binomial_bounds():
    B, K, rates = 40_000, 3, [0.8, 0.5, 0.2]
    logits = torch.randn(B, K + 1, 50, generator=torch.Generator().manual_seed(0))
    v = V.verify_synthetic(_chain(B, K), logits, SamplingParams(), torch.Generator().manual_seed(1), rates, draws=K)
    for got, r in zip(_shares(v.num_accepted, K), rates):
        lo, hi = _bounds(r, B)
        assert lo < got < hi, (got, r)
    # the kept tokens are the drafts themselves; the extra token is the target's argmax at the last kept node
    n = v.num_accepted
    for b in range(20):
        assert v.tokens[b, : n[b]].tolist() == [10 + i for i in range(n[b])]
        assert v.tokens[b, n[b]] == logits[b, n[b]].argmax()


def test_synthetic_control_conditional_reading_is_caught(monkeypatch):
    """Reading the rates as conditional probabilities (the other convention) gives 0.8 / 0.4 / 0.08: far
    outside the bounds the test above uses."""
    B, K, rates = 40_000, 3, [0.8, 0.5, 0.2]
    monkeypatch.setattr(V, "synthetic_conditional", lambda r: list(r))
    logits = torch.zeros(B, K + 1, 50)
    v = V.verify_synthetic(_chain(B, K), logits, SamplingParams(), torch.Generator().manual_seed(1), rates, draws=K)
    got = _shares(v.num_accepted, K)
    assert not all(_bounds(r, B)[0] < g < _bounds(r, B)[1] for g, r in zip(got, rates))
    assert abs(got[2] - 0.08) < 0.01


def test_synthetic_tree_follows_first_children():
    """Nodes [a1, b1, a2, b2]: a2 under a1, b2 under b1. The kept path is a1 then a2, never a b node."""
    B = 20_000
    tree = DraftTree(tokens=torch.tensor([[1, 2, 3, 4]]).expand(B, 4).contiguous(),
                     parents=torch.tensor([[-1, -1, 0, 1]]).expand(B, 4).contiguous(),
                     lens=torch.full((B,), 4), depth=2, width=2)
    v = V.verify_synthetic(tree, torch.zeros(B, 5, 8), SamplingParams(), torch.Generator().manual_seed(2),
                           [0.7, 0.35], draws=4)
    paths = {tuple(p) for p in v.accepted_nodes.tolist()}
    assert paths == {(-1, -1), (0, -1), (0, 2)}
    for got, r in zip(_shares(v.num_accepted, 2), [0.7, 0.35]):
        lo, hi = _bounds(r, B)
        assert lo < got < hi


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_synthetic_in_the_loop(tiny_lm, temperature):
    """End to end (sync and async alike): per-position acceptance over the run within binomial bounds of the
    configured rates, whatever the (random) draft model proposes."""
    rates = [0.9, 0.6, 0.3]
    per = {}
    for async_ in (False, True):
        e = _engine(tiny_lm, DraftModelDrafter(model=tiny_lm.model), 3, max_new=120, async_=async_,
                    acceptance="synthetic", kw={"rates": rates}, params=SamplingParams(temperature))
        res = e.run(_requests())
        acc = [a for r in res for a in r.accepted_per_step]
        per[async_] = [r.accepted_per_step for r in res]
        assert len(acc) > 150
        for i, r in enumerate(rates):
            lo, hi = _bounds(r, len(acc))
            assert lo < sum(a > i for a in acc) / len(acc) < hi
    assert per[False] == per[True]


def test_synthetic_rates_checked(tiny_lm):
    for rates, needle in ((None, "synthetic.rates=None"), ([0.5], "1 entries, k=3 needs at least 3"),
                          ([0.5, 0.6, 0.1], "non-increasing"), ([0.9, 0.5, -0.1], "each in [0, 1]")):
        with pytest.raises(UserError, match=needle.replace("[", r"\[").replace("]", r"\]")):
            _engine(tiny_lm, NgramDrafter(), 3, acceptance="synthetic", kw={"rates": rates})


def test_worker_keeps_order_and_raises_in_the_caller():
    from specbench.engine.loop import _Worker

    w = _Worker(lambda x: 10 // x)
    for x in (1, 2, 0, 5):
        w.submit(x)
    assert [w.result(), w.result()] == [10, 5]
    with pytest.raises(ZeroDivisionError):
        w.result()
    assert w.result() == 2
    w.close()
    assert not w.thread.is_alive()
