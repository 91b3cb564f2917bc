"""The one decode loop: admit requests into batch slots (prefill), step until every request stops.

Batching is slot-based: the KV cache has `batch_size` rows; a request occupies one row from its prefill
until it stops, and the freed row takes the next waiting request (so short answers do not hold the batch
back and no request is padded to another's length). Every row has its own length, so rows are at
different positions all the time.

Host syncs: one per step (`tokens.tolist()`, marked below) to update outputs and stop conditions, and one
per admission (the first token of the new request).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

import torch
from torch import Tensor

from specbench.engine.request import Request, RequestResult
from specbench.engine.sampling import SamplingParams, select
from specbench.errors import UserError
from specbench.models.transformer import Transformer


@dataclass
class StopCriteria:
    eos_ids: frozenset[int]
    max_new_tokens: int
    stop_strings: tuple[str, ...] = ()


class Engine:
    """Target-only decoding (and, with a drafter, the shared speculative loop)."""

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
    ) -> None:
        if batch_size < 1:
            raise UserError(f"batch_size={batch_size}: must be >= 1")
        self.target, self.tokenizer = target, tokenizer
        self.batch_size, self.stop, self.params = batch_size, stop, params
        self.seed, self.progress = seed, progress
        self.context = target.config.max_position_embeddings
        self.device = target.device

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
        max_len = min(self.context, longest + self.stop.max_new_tokens + 1)
        self.cache = self.target.new_cache(B, max_len)
        self.gen = torch.Generator(device=self.device).manual_seed(self.seed)
        self.last = torch.zeros(B, 1, dtype=torch.long, device=self.device)  # [B, 1] token to feed next
        self.active = torch.zeros(B, dtype=torch.long, device=self.device)  # [B] 1 where a request runs
        self.host_lens = [0] * B  # mirror of cache.seq_lens, known without syncing
        self.num_steps = 0  # target forwards after the prefills
        slots: list[RequestResult | None] = [None] * B
        pending = deque(requests)
        results: dict[str, RequestResult] = {}
        bar = _progress(len(requests), self.progress)
        n_tokens, t0 = 0, time.perf_counter()
        while pending or any(s is not None for s in slots):
            free = [b for b, s in enumerate(slots) if s is None]
            while free and pending:
                b, req = free.pop(0), pending.popleft()
                res = self._admit(b, req)
                n_tokens += 1
                if self._finished(res):
                    results[req.id] = self._release(b, res, slots, bar)
                    free.insert(0, b)
                else:
                    slots[b] = res
            if not any(s is not None for s in slots):
                continue
            tokens = self._step(slots)  # [B, 1]
            now = time.perf_counter()
            rows = tokens.tolist()  # note: the one host sync per step
            for b, res in enumerate(slots):
                if res is None:
                    continue
                self._append(res, rows[b], now)
                n_tokens += res.chunk_sizes[-1]
                if self._finished(res):
                    results[res.request.id] = self._release(b, res, slots, bar)
            if bar is not None:
                bar.set_postfix(tok_s=f"{n_tokens / (time.perf_counter() - t0):.1f}", refresh=False)
        if bar is not None:
            bar.close()
        return [results[r.id] for r in requests]

    # ---------------------------------------------------------------------------------------- pieces
    def _admit(self, b: int, req: Request) -> RequestResult:
        """Prefill request `req` into cache row b and pick its first token."""
        res = RequestResult(request=req, t_admit=time.perf_counter())
        ids = torch.tensor([req.prompt_ids], dtype=torch.long, device=self.device)  # [1, P]
        row = self.cache.rows(b, b + 1)
        row.seq_lens.zero_()
        n = ids.shape[1]
        out = self.target(ids, row, kv_len=n, logit_index=torch.full((1, 1), n - 1, device=self.device))
        tok = select(out.logits[:, -1], self.params, self.gen)  # [1]
        row.seq_lens.fill_(n)
        self.last[b, 0] = tok[0]
        self.active[b] = 1
        self.host_lens[b] = n
        first = int(tok[0])  # note: host sync, once per admitted request
        res.t_first = time.perf_counter()
        res.output_ids.append(first)
        return res

    def _step(self, slots: list[RequestResult | None]) -> Tensor:
        """One target forward for every row: feed the last token, commit it, select the next. [B, 1]."""
        kv_len = max(n for n, s in zip(self.host_lens, slots) if s is not None) + 1
        out = self.target(self.last, self.cache, kv_len=kv_len)
        self.num_steps += 1
        self.cache.seq_lens += self.active  # commit the fed token (idle rows stay at their length)
        self.host_lens = [n + (s is not None) for n, s in zip(self.host_lens, slots)]
        tok = select(out.logits, self.params, self.gen)  # [B, 1]
        self.last.copy_(tok)
        return tok

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
        self.active[b] = 0
        text = self.tokenizer.decode(res.output_ids, skip_special_tokens=True)
        for s in self.stop.stop_strings:
            if res.finish_reason == "stop" and s in text:
                text = text[: text.index(s)]
        res.text = text
        if bar is not None:
            bar.update(1)
        return res


def _progress(total: int, enabled: bool):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="requests", unit="req", dynamic_ncols=True, leave=False)
