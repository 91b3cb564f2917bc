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

A step is split in two: the device step (`_launch`: propose -> verify -> commit, on device tensors with shapes
the host knows, ending in one packed copy of the step's tokens and counts) and the host bookkeeping of the
finished step (`_book`: output tokens, stop conditions, detokenisation, metrics; it touches no device state).
Synchronous (`async_scheduling=False`): launch, read, book, free the stopped rows, refill, next step.
Asynchronous (vLLM's async scheduling): step n+1 is launched before step n is booked, and the bookkeeping
of step n runs on a worker thread while step n+1 computes (CUDA: step n's results come back through pinned
memory with a non-blocking copy and an event, so the host never waits inside a step; CPU: torch releases the
GIL inside its kernels, so the worker's Python runs beside the forward). The step in flight is launched
optimistically: a request that stopped in step n still runs in step n+1, whose tokens for it are discarded;
its row is freed and refilled one step later than in the synchronous loop. On CUDA the lengths the host
needs to size a step (`len_bound`, the attention length) are upper bounds that assume the step in flight
accepted everything, corrected when its bookkeeping is in; on the CPU the step has run when its launch
returns, so its accepted counts are read at once (B integers) and the lengths are exact, as in the sync loop.
Each request's output and metrics are those of the synchronous loop: its computation never depends on what
shares the batch (per-row caches, lengths and random streams; in float32 exactly, in bf16 up to the attention
kernels' rounding when the batch around it or the attention length differs).

Host syncs: one per step (the packed read, which with async scheduling happens off the critical path) and
one per admission round (the first tokens of the new requests). Only n-gram lookup keeps token histories on
the host, inside that drafter.

Stop conditions are applied token by token to each step's accepted chunk, in the order target-only decoding
meets them (EOS, the length budget, a stop string), so a speculative run keeps exactly the tokens a
target-only run would, and every count (new tokens, tokens/s, TPOT) is over the kept tokens only.

Sampling: each request draws from its own generator, seeded from (seed, request id) when it is admitted, and
every draw takes a fixed amount from that stream per step, so its output does not depend on the batch.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from specbench.core.types import Admitted, BatchState, DraftTree, Verdict
from specbench.drafters.base import Drafter
from specbench.core.request import Request, RequestResult
from specbench.core.sampling import RowGenerators, SamplingParams, request_seed, select
from specbench.errors import UserError
from specbench.models.transformer import Transformer
from specbench.parallel import LOCAL, Topology, share_outcome, share_tokens, share_tree, share_verdict
from specbench.verify import resolve_rule, verify


@dataclass
class StepRecord:
    """One target step, as the metric sinks see it (after the step's host sync)."""

    step: int
    t: float  # seconds since the run started
    num_active: int  # requests in the batch this step
    num_draft_tokens: int  # summed over requests: draft nodes scored by the target (chain: its length)
    num_draft_depth: int  # summed over requests: depth of the deepest draft node (= num_draft_tokens for chains)
    num_accepted_tokens: int
    accepted_per_pos: list[int]  # [i] = requests whose i-th draft was accepted this step (length k)
    draft_ms: float  # host time in drafter.propose (on CUDA: launch time unless the drafter syncs)
    verify_ms: float  # target forward + acceptance rule + cache commit + drafter.commit
    step_ms: float  # the whole step including the host sync


@dataclass
class StopCriteria:
    eos_ids: frozenset[int]
    max_new_tokens: int
    stop_strings: tuple[str, ...] = ()


STOP_WINDOW = 16  # tokens decoded before the newest one when looking for a stop string


@dataclass
class Launched:
    """A device step whose results the host has not read yet: the packed [B, K+4] int64 tensor (accepted tokens
    and extra, accepted count, draft nodes, draft depth per row), on CUDA a pinned host copy and its event."""

    packed: Tensor
    event: object | None  # torch.cuda.Event recorded after the copy (None on CPU: the tensor is ready)
    step: int
    t_step: float  # perf_counter when the step was launched
    t_draft: float  # seconds in drafter.propose (host time)
    t_done: float  # perf_counter when the launch returned (CPU: the step has run; CUDA: it is queued)
    slots: list  # the request in each row when the step was launched (None = free row)
    exact: bool = False  # the host's lengths were already corrected at launch (CPU: the step has run)

    def wait(self) -> None:
        """CUDA: until the step's results are in host memory (the device's time, not the host's)."""
        if self.event is not None:
            self.event.synchronize()
            self.t_done = time.perf_counter()


class Engine:
    """Target-only or speculative decoding of a list of requests with one target (and optionally a drafter)."""

    # CPU: read each step's accepted counts at launch (free there) so host lengths are exact; False runs the
    # CUDA path's upper bounds on the CPU too (tests)
    exact_lens_on_cpu: bool = True

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
        topology: Topology = LOCAL,
        async_scheduling: bool = False,
    ) -> None:
        if batch_size < 1:
            raise UserError(f"batch_size={batch_size}: must be >= 1")
        try:
            self.rule = resolve_rule(acceptance, params)
        except ValueError as e:
            raise UserError(str(e)) from None
        self.target, self.tokenizer = target, tokenizer
        self.batch_size, self.stop, self.params = batch_size, stop, params
        self.seed, self.progress = seed, progress
        self.drafter, self.k = drafter, (k if drafter is not None else 0)
        kw = dict(acceptance_kw or {})
        if self.rule == "typical":
            self.acceptance_kw = {n: kw[n] for n in ("epsilon", "alpha") if n in kw}
        elif self.rule == "synthetic":
            self.acceptance_kw = {"rates": check_synthetic_rates(kw.get("rates"), self.k)}
        else:
            self.acceptance_kw = {}
        self.async_ = bool(async_scheduling)
        self.context = target.config.max_position_embeddings
        self.device = target.device
        self.hidden_layers = tuple(drafter.hidden_layers) if drafter is not None else ()
        self.on_step = on_step
        self.topo = topology  # under tp / pp: the leader verifies and drafts, every rank follows its messages

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
        """Admit waiting requests into free rows, step the batch, book each step's tokens; until all stop."""
        self.check(requests)
        self._setup(requests)
        slots: list[RequestResult | None] = [None] * self.cache.seq_lens.shape[0]
        pending = deque(zip(requests, _seeds(requests, self.seed)))
        results: dict[int, RequestResult] = {}  # by id(request): ids in a dataset need not be unique
        self._bar = _progress(len(requests), self.progress)
        self._n_first, self._n_booked, self._t0 = 0, 0, time.perf_counter()
        if self.async_:
            self._run_async(pending, slots, results)
        else:
            while pending or any(s is not None for s in slots):
                self._admit_waiting(pending, slots, results)
                if any(s is not None for s in slots):
                    launched = self._launch(slots)
                    self._apply(self._timed_book(launched), launched, slots, results, wait_s=None)
        if self._bar is not None:
            self._bar.close()
        t = self.timing
        t["host_overlap_s"] = t["host_s"] - t["host_critical_s"]
        return [results[id(r)] for r in requests]

    def _run_async(self, pending: deque, slots: list, results: dict) -> None:
        """Launch step n+1, then collect the bookkeeping of step n that a worker thread did meanwhile."""
        inflight = None  # the launched step whose bookkeeping the worker has
        worker = _Worker(self._timed_book)
        try:
            while pending or any(s is not None for s in slots):
                self._admit_waiting(pending, slots, results)
                launched = self._launch(slots) if any(s is not None for s in slots) else None
                if inflight is not None:
                    self._collect(worker, inflight, slots, results)
                t = time.perf_counter()
                if launched is not None:
                    worker.submit(launched)
                inflight = launched
                self.timing["host_handoff_s"] += time.perf_counter() - t
            if inflight is not None:
                self._collect(worker, inflight, slots, results)
        finally:
            worker.close()

    def _collect(self, worker: "_Worker", launched: Launched, slots: list, results: dict) -> None:
        ready = worker.ready()  # the worker finished while this thread ran the next step: nothing was waited for
        t = time.perf_counter()
        booked = worker.result()
        self._apply(booked, launched, slots, results, wait_s=time.perf_counter() - t, ready=ready)

    def _timed_book(self, launched: Launched) -> tuple[list[int], list[int], float]:
        launched.wait()  # note: the one host sync per step (off the critical path when async)
        t = time.perf_counter()
        packed = launched.packed.tolist()
        done = self._book(packed, launched)
        return done, [row[-3] for row in packed], time.perf_counter() - t

    def _apply(self, booked, launched: Launched, slots: list, results: dict, wait_s: float | None,
               ready: bool = False) -> None:
        """On the main thread, after a step was booked: exact lengths for its rows, free the rows that stopped.
        wait_s: how long the main thread spent collecting the bookkeeping (None: it did it itself); ready: the
        bookkeeping had finished before the main thread came for it."""
        done, n_acc, host_s = booked
        self.timing["host_s"] += host_s
        # on the critical path: all of it when the main thread booked itself; none when it was done before the
        # main thread came for it; else the part it waited for (the stall can exceed the bookkeeping itself when
        # the worker was descheduled or held off the GIL: that, and handing steps over, is `host_handoff_s`)
        self.timing["host_critical_s"] += host_s if wait_s is None else 0.0 if ready else min(wait_s, host_s)
        if wait_s is not None:  # the price of overlapping: the main thread's wait for the worker + hand-offs
            self.timing["host_handoff_s"] += wait_s
        if not launched.exact:
            self._correct_lens(launched, n_acc, slots)
        for b in done:
            assert slots[b] is launched.slots[b], "a stopped request's row was freed before its bookkeeping"
            res = self._free(b, slots)
            results[id(res.request)] = res

    # ---------------------------------------------------------------------------------------- pieces
    def _setup(self, requests: list[Request]) -> None:
        """Size the cache for the longest request plus one step's draft nodes; reset per-run state."""
        B = min(self.batch_size, len(requests)) or 1
        longest = max((len(r.prompt_ids) for r in requests), default=1)
        self.max_nodes = self.drafter.max_nodes(self.k) if self.drafter is not None else 0
        max_len = min(self.context, longest + self.stop.max_new_tokens + 1) + self.max_nodes + 2
        if self.async_:  # a stopped request runs one more step, and the host's lengths are bounds
            max_len += self.k + 2
        self.cache = self.target.new_cache(B, max_len)
        self.gen = RowGenerators(B, self.device)  # one stream per row, seated per request at admission
        # per row: an upper bound of cache.seq_lens known without syncing (exact once every launched step
        # is booked: the launch adds 1 + the draft depth, the bookkeeping takes back the rejected drafts)
        self.host_lens = [0] * B
        self.state = BatchState(
            seq_lens=self.cache.seq_lens,
            last=torch.zeros(B, 1, dtype=torch.long, device=self.device),
            active=torch.zeros(B, dtype=torch.long, device=self.device),
            len_bound=0,
            k=self.k,
        )
        if self.drafter is not None:  # capture layers may depend on the target (EAGLE-3's aux layers)
            error, layers = None, None
            if self.topo.runs_drafter:
                try:
                    self.drafter.setup(self.target, B, max_len, self.k, self.params, self.gen)
                    layers = tuple(self.drafter.hidden_layers)
                except UserError as e:
                    error = str(e)
            self.hidden_layers = share_outcome(self.topo, error, layers)
        self.num_steps = 0  # target forwards after the prefills
        self.discarded_rows = 0  # (row, step) pairs computed for a request that had already stopped (async)
        self.timing = {"prefill_s": 0.0, "draft_s": 0.0, "verify_s": 0.0, "step_s": 0.0,
                       "host_s": 0.0, "host_critical_s": 0.0, "host_overlap_s": 0.0, "host_handoff_s": 0.0}
        self._pinned: list[Tensor] = []  # CUDA: two pinned buffers for the packed results, used in turn

    def _admit_waiting(self, pending: deque, slots: list, results: dict) -> None:
        """Prefill waiting requests into free rows, together; a request done after its first token leaves."""
        free = [b for b, s in enumerate(slots) if s is None]
        while free and pending:
            batch = [(b, *pending.popleft()) for b in free[: len(pending)]]
            free = free[len(batch):]
            for b, res in self._admit(batch):
                self._n_first += 1
                slots[b] = res
                if self._finished(res, 1):
                    self._finalize(res)
                    results[id(res.request)] = self._free(b, slots)  # (res is slots[b])
                    free.append(b)
            free.sort()

    def _book(self, packed: list[list[int]], launched: Launched) -> list[int]:
        """Host bookkeeping of a finished step: outputs, stop conditions, per-step metrics, detokenisation of
        the requests that stopped. Touches no device or row state (it may run on a worker thread while the next
        step computes); a request that already stopped (its row ran one step past it) is skipped. Returns the
        rows whose request stopped in this step."""
        now, t_step, t_draft = launched.t_done, launched.t_step, launched.t_draft
        k = self.k
        rec = StepRecord(launched.step + 1, now - self._t0, 0, 0, 0, 0, [0] * k, t_draft * 1e3,
                         (now - t_step - t_draft) * 1e3, (now - t_step) * 1e3)
        self.timing["step_s"] += now - t_step
        self.timing["draft_s"] += t_draft
        self.timing["verify_s"] += now - t_step - t_draft
        done = []
        for b, res in enumerate(launched.slots):
            if res is None:
                continue
            if res.finish_reason:  # stopped in the step before (async): this step ran for it optimistically
                self.discarded_rows += 1
                continue
            row = packed[b]
            n_acc, nodes, depth = row[-3], row[-2], row[-1]
            rec.num_active += 1
            rec.num_draft_tokens += nodes
            rec.num_draft_depth += depth
            rec.num_accepted_tokens += n_acc
            for i in range(n_acc):
                rec.accepted_per_pos[i] += 1
            new = row[: n_acc + 1]
            res.accepted_per_step.append(n_acc)
            res.draft_lens.append(depth)
            res.draft_nodes.append(nodes)
            before = len(res.output_ids)
            res.output_ids.extend(new)
            stopped = self._finished(res, len(new))  # trims the chunk at the first stop condition
            kept = len(res.output_ids) - before
            res.chunk_times.append(now)
            res.chunk_sizes.append(kept)
            self._n_booked += kept
            if stopped:
                self._finalize(res)
                done.append(b)
        if self.on_step is not None and rec.num_active:
            self.on_step(rec)
        if self._bar is not None:
            n = self._n_first + self._n_booked
            self._bar.set_postfix(tok_s=f"{n / (time.perf_counter() - self._t0):.1f}", refresh=False)
        return done

    def _admit(self, batch: list[tuple[int, Request, int]]) -> list[tuple[int, RequestResult]]:
        """Prefill requests into their cache rows (one right-padded forward per run of adjacent rows) and
        pick each one's first token; the drafter sees the same prompt outputs. batch: (row, request, seed)."""
        out: list[tuple[int, RequestResult]] = []
        firsts: list[Tensor] = []
        st = self.state
        for b, _, seed in batch:
            self.gen.seat(b, seed)
        for run in _adjacent_runs([(b, req) for b, req, _ in batch]):
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
            tok = select(tout.logits, self.params, self.gen.rows(lo, hi)) if self.topo.runs_drafter else None
            tok = share_tokens(self.topo, tok, hi - lo, self.device)  # [R, 1]
            rows.seq_lens.copy_(last[:, 0] + 1)
            st.last[lo:hi] = tok
            st.active[lo:hi] = 1
            self.host_lens[lo:hi] = lens
            if self.drafter is not None and self.topo.runs_drafter:
                self.drafter.prefill(list(range(lo, hi)), Admitted(st, ids, lens), tout)
            firsts.append(tok[:, 0])
            out += [(b, RequestResult(request=req, t_admit=t_admit)) for b, req in run]
        first_ids = torch.cat(firsts).tolist()  # note: host sync, once per admission round
        now = time.perf_counter()
        self.timing["prefill_s"] += now - out[0][1].t_admit
        for (b, res), tok in zip(out, first_ids):
            res.t_first = now
            res.output_ids.append(tok)
        return out

    def _launch(self, slots: list[RequestResult | None]) -> Launched:
        """Run (on CUDA: queue) one device step and start bringing its packed results to the host."""
        t_step = time.perf_counter()
        step = self.num_steps
        verdict, nodes, depth = self._step(slots)
        packed = torch.cat([verdict.tokens, verdict.num_accepted[:, None], nodes[:, None], depth[:, None]], 1)
        event = None
        if packed.device.type == "cuda":  # non-blocking copy into pinned memory; the host waits on the event
            if not self._pinned or self._pinned[0].shape[0] != packed.shape[0] or \
                    self._pinned[0].shape[1] < packed.shape[1]:
                self._pinned = [torch.empty(packed.shape[0], self.max_nodes + 4, dtype=torch.long,
                                            pin_memory=True) for _ in range(2)]
            host = self._pinned[step % 2][:, : packed.shape[1]]
            host.copy_(packed, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            packed = host
        launched = Launched(packed, event, step, t_step, self._t_draft, time.perf_counter(), list(slots))
        if event is None and self.exact_lens_on_cpu:  # CPU: the step has run, reading its accepted counts costs
            self._correct_lens(launched, packed[:, -3].tolist(), slots)  # nothing: exact lengths, as the sync loop
            launched.exact = True
        return launched

    def _correct_lens(self, launched: Launched, n_acc: list[int], slots: list) -> None:
        """Replace the launch's bound (every draft accepted) by the accepted length, for rows still seated."""
        K = launched.packed.shape[1] - 4  # the step's draft depth
        for b, res in enumerate(launched.slots):
            if res is not None and slots[b] is res:
                self.host_lens[b] -= K - n_acc[b]

    def _step(self, slots: list[RequestResult | None]) -> tuple[Verdict, Tensor, Tensor]:
        """Propose, verify in one target forward, commit. Returns the verdict and each row's draft nodes and
        draft depth (equal for chains)."""
        st = self.state
        st.len_bound = max(self.host_lens)
        t = time.perf_counter()
        B, topo = len(slots), self.topo
        if self.drafter is None:
            tree = DraftTree.empty(B, self.device)
        else:  # drafted on the leader (and a sharded drafter's peers), sent to every rank
            tree = share_tree(topo, self.drafter.propose(st) if topo.runs_drafter else None, B, self.max_nodes,
                              self.device)
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
        for b, s in enumerate(slots):  # bound until this step is booked: every draft accepted
            if s is not None:
                self.host_lens[b] += 1 + tree.depth
        verdict = verify(tree, out.logits, self.params, self.gen, self.rule, draws=self.max_nodes,
                         **self.acceptance_kw) if topo.runs_drafter else None
        verdict = share_verdict(topo, verdict, B, tree.depth, self.device)  # every stage commits the same
        if not tree.is_chain and tree.depth > 0:  # move the accepted path right after the root
            dst0 = st.seq_lens + 1
            own = dst0[:, None] + torch.arange(tree.depth, device=self.device)
            src = torch.where(verdict.accepted_nodes >= 0, dst0[:, None] + verdict.accepted_nodes, own)
            self.cache.compact(src, dst0)
        if self.drafter is not None and topo.runs_drafter:
            self.drafter.commit(verdict, st, out)
        st.seq_lens += (1 + verdict.num_accepted) * st.active  # commit root + accepted drafts
        st.last.copy_(verdict.tokens.gather(1, verdict.num_accepted[:, None]))
        return verdict, tree.lens, depth

    def _finished(self, res: RequestResult, n_new: int) -> bool:
        """Apply the stop conditions token by token to the newest `n_new` tokens, in the order target-only
        decoding meets them: EOS, the length budget, a stop string (decoded over the token and the
        STOP_WINDOW tokens before it). Everything after the first stopping token is dropped."""
        ids, stop = res.output_ids, self.stop
        budget = min(stop.max_new_tokens, self.context - len(res.request.prompt_ids))
        for i in range(len(ids) - n_new, len(ids)):
            if ids[i] in stop.eos_ids:
                reason = "eos"
            elif i + 1 >= budget:
                reason = "length"
            elif stop.stop_strings and self._has_stop_string(ids[max(0, i - STOP_WINDOW): i + 1]):
                reason = "stop"
            else:
                continue
            del ids[i + 1:]
            res.finish_reason = reason
            return True
        return False

    def _has_stop_string(self, ids: list[int]) -> bool:
        tail = self.tokenizer.decode(ids, skip_special_tokens=False)
        return any(s in tail for s in self.stop.stop_strings)

    def _finalize(self, res: RequestResult) -> None:
        """The stopped request's text (host work: may run on the bookkeeping thread)."""
        text = self.tokenizer.decode(res.output_ids, skip_special_tokens=True)
        for s in self.stop.stop_strings:
            if res.finish_reason == "stop" and s in text:
                text = text[: text.index(s)]
        res.text = text
        if self._bar is not None:
            self._bar.update(1)

    def _free(self, b: int, slots: list) -> RequestResult:
        """Give row b back (main thread, between steps): its request stopped and was booked."""
        res = slots[b]
        slots[b] = None
        self.gen.release(b)
        self.state.active[b] = 0
        self.state.seq_lens[b] = 0  # an idle row still takes part in the forward: keep its writes in bounds
        self.host_lens[b] = 0
        return res


class _Worker:
    """One thread that runs `fn` on each submitted item in order; `result()` returns the oldest result (or
    raises its exception). Two plain queues, not an executor: handing a step over costs one thread wake-up
    (~40 us on a small VM, against ~70 us through concurrent.futures), which on the CPU is more than the
    bookkeeping it moves."""

    def __init__(self, fn) -> None:
        self.fn, self.todo, self.done = fn, queue.SimpleQueue(), queue.SimpleQueue()
        self.thread = threading.Thread(target=self._loop, name="specbench-book", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while (item := self.todo.get()) is not None:
            try:
                self.done.put((True, self.fn(item)))
            except BaseException as e:  # noqa: BLE001 - handed to the main thread, raised there
                self.done.put((False, e))

    def submit(self, item) -> None:
        self.todo.put(item)

    def ready(self) -> bool:
        return not self.done.empty()

    def result(self):
        ok, value = self.done.get()
        if not ok:
            raise value
        return value

    def close(self) -> None:
        self.todo.put(None)
        self.thread.join()


def check_synthetic_rates(rates, k: int) -> list[float]:
    """acceptance=synthetic's per-position rates: at least k of them, each in [0, 1], non-increasing (the i-th
    draft cannot be accepted more often than the one before it)."""
    try:
        r = [float(x) for x in rates]
    except (TypeError, ValueError):
        raise UserError(f"synthetic.rates={rates!r}: a list of per-position acceptance rates in [0, 1], "
                        "e.g. [0.8, 0.6, 0.4]") from None
    if len(r) < k:
        raise UserError(f"synthetic.rates={r}: {len(r)} entries, k={k} needs at least {k}")
    if any(not 0.0 <= x <= 1.0 for x in r) or any(b > a for a, b in zip(r, r[1:])):
        raise UserError(f"synthetic.rates={r}: each in [0, 1] and non-increasing (rates[i] = share of steps "
                        "whose i-th draft is accepted)")
    return r


def _seeds(requests: list[Request], seed: int) -> list[int]:
    """Each request's stream seed from (seed, id, n-th request with that id): independent of batch and order. A
    later turn of a conversation (dataset.turns) has its own stream."""
    seen: dict[str, int] = {}
    out = []
    for r in requests:
        key = r.id if r.turn == 1 else f"{r.id}\x00turn {r.turn}"
        n = seen.get(key, 0)
        seen[key] = n + 1
        out.append(request_seed(seed, key, n))
    return out


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
