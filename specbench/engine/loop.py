"""The one decode loop: admit requests into batch slots (prefill), step until every request stops.

    draft = drafter.propose(state)                    # DraftTree [B, N] (empty without a drafter)
    out = target(root + draft nodes, tree mask)       # logits [B, 1+N, V]
    verdict = verify(draft, out.logits, ...)          # tokens [B, K+1], num_accepted [B]
    cache.compact(accepted path); seq_lens += 1 + num_accepted
    drafter.commit(verdict, state, out)

Target-only decoding is the same step with an empty draft (N = 0): feed the last token, pick the next.

Batching is slot-based: the KV cache has `batch_size` rows; a request occupies one row from its prefill
until it stops, and the freed row takes the next waiting request, so short answers do not hold the batch
back and no request is padded to another's length. Every row has its own length.

Host syncs: one per step (marked below) to update outputs, metrics and stop conditions, and one per
admission round (the first tokens of the new requests).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from specbench.drafters.base import Admitted, BatchState, DraftTree, Drafter, Verdict
from specbench.engine.request import Request, RequestResult
from specbench.engine.sampling import SamplingParams, select
from specbench.errors import UserError
from specbench.models.transformer import Transformer
from specbench.verify import verify


@dataclass
class StepRecord:
    """One target step, as the metric sinks see it (after the step's host sync)."""

    step: int
    t: float  # seconds since the run started
    num_active: int  # requests in the batch this step
    num_draft_tokens: int  # summed over requests (tree: deepest draft per request)
    num_accepted_tokens: int
    accepted_per_pos: list[int]  # [i] = requests whose i-th draft was accepted this step
    draft_ms: float  # host time in drafter.propose (on CUDA: launch time unless the drafter syncs)
    verify_ms: float  # target forward + acceptance rule + cache commit + drafter.commit
    step_ms: float  # the whole step including the host sync


@dataclass
class StopCriteria:
    eos_ids: frozenset[int]
    max_new_tokens: int
    stop_strings: tuple[str, ...] = ()


class Engine:
    """Target-only or speculative decoding of a list of requests with one target (and optionally a drafter)."""

    def __init__(
        self,
        target: Transformer,
        tokenizer,
        *,
        batch_size: int,
        stop: StopCriteria,
        params: SamplingParams,
        seed: int = 0,
        progress: bool = True,
        drafter: Drafter | None = None,
        k: int = 0,
        acceptance: str = "auto",
        acceptance_kw: dict | None = None,
        on_step: Callable[[StepRecord], None] | None = None,
    ) -> None:
        if batch_size < 1:
            raise UserError(f"batch_size={batch_size}: must be >= 1")
        self.target, self.tokenizer = target, tokenizer
        self.batch_size, self.stop, self.params = batch_size, stop, params
        self.seed, self.progress = seed, progress
        self.drafter, self.k = drafter, (k if drafter is not None else 0)
        self.acceptance, self.acceptance_kw = acceptance, dict(acceptance_kw or {})
        self.context = target.config.max_position_embeddings
        self.device = target.device
        self.hidden_layers = tuple(drafter.hidden_layers) if drafter is not None else ()
        self.on_step = on_step

    # ------------------------------------------------------------------------------------------ checks
    def check(self, requests: list[Request]) -> None:
        for r in requests:
            if len(r.prompt_ids) >= self.context:
                raise UserError(
                    f"request {r.id!r}: prompt has {len(r.prompt_ids)} tokens, the model's context is "
                    f"{self.context} (max_position_embeddings); shorten it or drop it with dataset.limit"
                )
            if not r.prompt_ids:
                raise UserError(f"request {r.id!r}: empty prompt")

    # --------------------------------------------------------------------------------------------- run
    @torch.inference_mode()
    def run(self, requests: list[Request]) -> list[RequestResult]:
        self.check(requests)
        B = min(self.batch_size, len(requests)) or 1
        longest = max((len(r.prompt_ids) for r in requests), default=1)
        # headroom past the last committed token for one step's draft nodes
        nodes = self.drafter.max_nodes(self.k) if self.drafter is not None else 0
        max_len = min(self.context, longest + self.stop.max_new_tokens + 1) + nodes + 2
        self.cache = self.target.new_cache(B, max_len)
        self.gen = torch.Generator(device=self.device).manual_seed(self.seed)
        self.host_lens = [0] * B  # mirror of cache.seq_lens, known without syncing (updated in place)
        self.state = BatchState(
            seq_lens=self.cache.seq_lens,
            last=torch.zeros(B, 1, dtype=torch.long, device=self.device),
            active=torch.zeros(B, dtype=torch.long, device=self.device),
            history=[[] for _ in range(B)],
            host_lens=self.host_lens,
            k=self.k,
        )
        if self.drafter is not None:
            self.drafter.setup(self.target, B, max_len, self.k, self.params, self.gen)
            self.hidden_layers = tuple(self.drafter.hidden_layers)  # may depend on the target (EAGLE-3 aux layers)
        self.num_steps = 0  # target forwards after the prefills
        self.timing = {"prefill_s": 0.0, "draft_s": 0.0, "verify_s": 0.0, "step_s": 0.0}
        slots: list[RequestResult | None] = [None] * B
        pending = deque(requests)
        results: dict[int, RequestResult] = {}  # by id(request): ids in a dataset need not be unique
        bar = _progress(len(requests), self.progress)
        n_tokens, t0 = 0, time.perf_counter()
        while pending or any(s is not None for s in slots):
            free = [b for b, s in enumerate(slots) if s is None]
            while free and pending:  # admit: prefill waiting requests into free rows, together
                batch = [(b, pending.popleft()) for b in free[: len(pending)]]
                free = free[len(batch):]
                for b, res in self._admit(batch):
                    n_tokens += 1
                    if self._finished(res):
                        results[id(res.request)] = self._release(b, res, slots, bar)
                        free.append(b)
                    else:
                        slots[b] = res
                free.sort()
            if not any(s is not None for s in slots):
                continue
            t_step = time.perf_counter()
            verdict, draft_depth = self._step(slots)
            # note: the one host sync per step (accepted tokens, counts and draft depths together)
            packed = torch.cat([verdict.tokens, verdict.num_accepted[:, None], draft_depth[:, None]], 1).tolist()
            now = time.perf_counter()
            rec = StepRecord(self.num_steps, now - t0, 0, 0, 0, [], self._t_draft * 1e3,
                             (now - t_step - self._t_draft) * 1e3, (now - t_step) * 1e3)
            self.timing["step_s"] += now - t_step
            self.timing["draft_s"] += self._t_draft
            self.timing["verify_s"] += now - t_step - self._t_draft
            for b, res in enumerate(slots):
                if res is None:
                    continue
                row = packed[b]
                n_acc, depth = row[-2], row[-1]
                rec.num_active += 1
                rec.num_draft_tokens += depth
                rec.num_accepted_tokens += n_acc
                rec.accepted_per_pos.extend([0] * (n_acc - len(rec.accepted_per_pos)))
                for i in range(n_acc):
                    rec.accepted_per_pos[i] += 1
                new = row[: n_acc + 1]
                self.host_lens[b] += 1 + n_acc
                self.state.history[b].extend(new)
                res.accepted_per_step.append(n_acc)
                res.draft_lens.append(depth)
                self._append(res, new, now)
                n_tokens += len(new)
                if self._finished(res):
                    results[id(res.request)] = self._release(b, res, slots, bar)
            if self.on_step is not None:
                self.on_step(rec)
            if bar is not None:
                bar.set_postfix(tok_s=f"{n_tokens / (time.perf_counter() - t0):.1f}", refresh=False)
        if bar is not None:
            bar.close()
        return [results[id(r)] for r in requests]

    # ---------------------------------------------------------------------------------------- pieces
    def _admit(self, batch: list[tuple[int, Request]]) -> list[tuple[int, RequestResult]]:
        """Prefill requests into their cache rows (one right-padded forward per run of adjacent rows) and
        pick each one's first token; the drafter sees the same prompt outputs."""
        out: list[tuple[int, RequestResult]] = []
        firsts: list[Tensor] = []
        st = self.state
        for run in _adjacent_runs(batch):
            lo, hi = run[0][0], run[-1][0] + 1
            lens = [len(req.prompt_ids) for _, req in run]
            P = max(lens)
            ids = torch.tensor([req.prompt_ids + [0] * (P - n) for (_, req), n in zip(run, lens)],
                               dtype=torch.long, device=self.device)  # [R, P], right padding
            t_admit = time.perf_counter()
            rows = self.cache.rows(lo, hi)
            rows.seq_lens.zero_()
            last = torch.tensor(lens, device=self.device)[:, None] - 1  # [R, 1]
            tout = self.target(ids, rows, kv_len=P, logit_index=last, hidden_layers=self.hidden_layers)
            tok = select(tout.logits, self.params, self.gen)  # [R, 1]
            rows.seq_lens.copy_(last[:, 0] + 1)
            st.last[lo:hi] = tok
            st.active[lo:hi] = 1
            self.host_lens[lo:hi] = lens
            if self.drafter is not None:
                self.drafter.prefill(list(range(lo, hi)), Admitted(st, ids, lens), tout)
            firsts.append(tok[:, 0])
            out += [(b, RequestResult(request=req, t_admit=t_admit)) for b, req in run]
        first_ids = torch.cat(firsts).tolist()  # note: host sync, once per admission round
        now = time.perf_counter()
        self.timing["prefill_s"] += now - out[0][1].t_admit
        for (b, res), tok in zip(out, first_ids):
            res.t_first = now
            res.output_ids.append(tok)
            st.history[b] = list(res.request.prompt_ids) + [tok]
        return out

    def _step(self, slots: list[RequestResult | None]) -> tuple[Verdict, Tensor]:
        """Propose, verify in one target forward, commit. Returns the verdict and each row's draft depth."""
        st = self.state
        t = time.perf_counter()
        tree = self.drafter.propose(st) if self.drafter is not None else DraftTree.empty(len(slots), self.device)
        self._t_draft = time.perf_counter() - t
        N = tree.num_nodes
        inputs = torch.cat([st.last, tree.tokens.clamp(min=0)], 1)  # [B, 1+N]: root, then the nodes
        kv_len = max(n for n, s in zip(self.host_lens, slots) if s is not None) + 1 + N
        if tree.is_chain:  # causal order is the chain; padded nodes come after every real one
            positions, tree_mask, depth = None, None, tree.lens
        else:
            depths = tree.depths()
            positions = st.seq_lens[:, None] + torch.cat([torch.zeros_like(depths[:, :1]), depths], 1)
            tree_mask = tree.attention_mask()
            valid = torch.arange(N, device=self.device)[None] < tree.lens[:, None]
            depth = torch.where(valid, depths, 0).amax(1) if N else tree.lens
        out = self.target(inputs, self.cache, kv_len=kv_len, positions=positions, tree_mask=tree_mask,
                          hidden_layers=self.hidden_layers)
        self.num_steps += 1
        verdict = verify(tree, out.logits, self.params, self.gen, self.acceptance, **self.acceptance_kw)
        if not tree.is_chain and tree.depth > 0:  # move the accepted path right after the root
            dst0 = st.seq_lens + 1
            own = dst0[:, None] + torch.arange(tree.depth, device=self.device)
            src = torch.where(verdict.accepted_nodes >= 0, dst0[:, None] + verdict.accepted_nodes, own)
            self.cache.compact(src, dst0)
        if self.drafter is not None:
            self.drafter.commit(verdict, st, out)
        st.seq_lens += (1 + verdict.num_accepted) * st.active  # commit root + accepted drafts
        st.last.copy_(verdict.tokens.gather(1, verdict.num_accepted[:, None]))
        return verdict, depth

    def _append(self, res: RequestResult, new: list[int], now: float) -> None:
        res.output_ids.extend(new)
        res.chunk_times.append(now)
        res.chunk_sizes.append(len(new))

    def _finished(self, res: RequestResult) -> bool:
        """Apply the stop conditions to the tail; trims tokens past EOS / a stop string / the budget."""
        ids, stop = res.output_ids, self.stop
        start = len(ids) - (res.chunk_sizes[-1] if res.chunk_sizes else 1)
        for i in range(start, len(ids)):
            if ids[i] in stop.eos_ids:
                del ids[i + 1:]
                res.finish_reason = "eos"
                return True
        budget = min(stop.max_new_tokens, self.context - len(res.request.prompt_ids))
        if len(ids) >= budget:
            del ids[budget:]
            res.finish_reason = "length"
            return True
        if stop.stop_strings:
            tail = self.tokenizer.decode(ids[-(len(ids) - start + 16):], skip_special_tokens=False)
            if any(s in tail for s in stop.stop_strings):
                res.finish_reason = "stop"
                return True
        return False

    def _release(self, b: int, res: RequestResult, slots: list, bar) -> RequestResult:
        slots[b] = None
        self.state.active[b] = 0
        self.state.seq_lens[b] = 0  # an idle row still takes part in the forward: keep its writes in bounds
        self.host_lens[b] = 0
        self.state.history[b] = []
        text = self.tokenizer.decode(res.output_ids, skip_special_tokens=True)
        for s in self.stop.stop_strings:
            if res.finish_reason == "stop" and s in text:
                text = text[: text.index(s)]
        res.text = text
        if bar is not None:
            bar.update(1)
        return res


def _adjacent_runs(batch: list[tuple[int, Request]]) -> list[list[tuple[int, Request]]]:
    """Split (row, request) pairs, sorted by row, into runs of consecutive rows (each is one cache view)."""
    runs: list[list[tuple[int, Request]]] = []
    for item in sorted(batch, key=lambda x: x[0]):
        if runs and runs[-1][-1][0] + 1 == item[0]:
            runs[-1].append(item)
        else:
            runs.append([item])
    return runs


def _progress(total: int, enabled: bool):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="requests", unit="req", dynamic_ncols=True, leave=False)
