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

Stop conditions are applied token by token to each step's accepted chunk, in the order target-only decoding
meets them (EOS, the length budget, a stop string), so a speculative run keeps exactly the tokens a
target-only run would, and every count (new tokens, tokens/s, TPOT) is over the kept tokens only.

Sampling: each request draws from its own generator, seeded from (seed, request id) when it is admitted, and
every draw takes a fixed amount from that stream per step, so its output does not depend on the batch.
"""

from __future__ import annotations

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
        topology: Topology = LOCAL,
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
        self.acceptance_kw = dict(acceptance_kw or {}) if self.rule == "typical" else {}
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
        self._n_tokens, self._t0 = 0, time.perf_counter()
        while pending or any(s is not None for s in slots):
            self._admit_waiting(pending, slots, results)
            if not any(s is not None for s in slots):
                continue
            t_step = time.perf_counter()
            verdict, nodes, depth = self._step(slots)
            # note: the one host sync per step (accepted tokens, counts and draft sizes together)
            packed = torch.cat([verdict.tokens, verdict.num_accepted[:, None], nodes[:, None], depth[:, None]],
                               1).tolist()
            self._book(packed, slots, results, t_step)
        if self._bar is not None:
            self._bar.close()
        return [results[id(r)] for r in requests]

    # ---------------------------------------------------------------------------------------- pieces
    def _setup(self, requests: list[Request]) -> None:
        """Size the cache for the longest request plus one step's draft nodes; reset per-run state."""
        B = min(self.batch_size, len(requests)) or 1
        longest = max((len(r.prompt_ids) for r in requests), default=1)
        self.max_nodes = self.drafter.max_nodes(self.k) if self.drafter is not None else 0
        max_len = min(self.context, longest + self.stop.max_new_tokens + 1) + self.max_nodes + 2
        self.cache = self.target.new_cache(B, max_len)
        self.gen = RowGenerators(B, self.device)  # one stream per row, seated per request at admission
        self.host_lens = [0] * B  # mirror of cache.seq_lens, known without syncing (updated in place)
        self.state = BatchState(
            seq_lens=self.cache.seq_lens,
            last=torch.zeros(B, 1, dtype=torch.long, device=self.device),
            active=torch.zeros(B, dtype=torch.long, device=self.device),
            history=[[] for _ in range(B)],
            host_lens=self.host_lens,
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
        self.timing = {"prefill_s": 0.0, "draft_s": 0.0, "verify_s": 0.0, "step_s": 0.0}

    def _admit_waiting(self, pending: deque, slots: list, results: dict) -> None:
        """Prefill waiting requests into free rows, together; a request done after its first token leaves."""
        free = [b for b, s in enumerate(slots) if s is None]
        while free and pending:
            batch = [(b, *pending.popleft()) for b in free[: len(pending)]]
            free = free[len(batch):]
            for b, res in self._admit(batch):
                self._n_tokens += 1
                if self._finished(res, 1):
                    results[id(res.request)] = self._release(b, res, slots)
                    free.append(b)
                else:
                    slots[b] = res
            free.sort()

    def _book(self, packed: list[list[int]], slots: list, results: dict, t_step: float) -> None:
        """Host bookkeeping of a finished step: outputs, stop conditions, per-step metrics, releases."""
        now = time.perf_counter()
        k = self.k
        rec = StepRecord(self.num_steps, now - self._t0, 0, 0, 0, 0, [0] * k, self._t_draft * 1e3,
                         (now - t_step - self._t_draft) * 1e3, (now - t_step) * 1e3)
        self.timing["step_s"] += now - t_step
        self.timing["draft_s"] += self._t_draft
        self.timing["verify_s"] += now - t_step - self._t_draft
        for b, res in enumerate(slots):
            if res is None:
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
            self.host_lens[b] += 1 + n_acc
            self.state.history[b].extend(new)
            res.accepted_per_step.append(n_acc)
            res.draft_lens.append(depth)
            res.draft_nodes.append(nodes)
            before = len(res.output_ids)
            res.output_ids.extend(new)
            done = self._finished(res, len(new))  # trims the chunk at the first stop condition
            kept = len(res.output_ids) - before
            res.chunk_times.append(now)
            res.chunk_sizes.append(kept)
            self._n_tokens += kept
            if done:
                results[id(res.request)] = self._release(b, res, slots)
        if self.on_step is not None:
            self.on_step(rec)
        if self._bar is not None:
            self._bar.set_postfix(tok_s=f"{self._n_tokens / (time.perf_counter() - self._t0):.1f}", refresh=False)

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
            st.history[b] = list(res.request.prompt_ids) + [tok]
        return out

    def _step(self, slots: list[RequestResult | None]) -> tuple[Verdict, Tensor, Tensor]:
        """Propose, verify in one target forward, commit. Returns the verdict and each row's draft nodes and
        draft depth (equal for chains)."""
        st = self.state
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

    def _release(self, b: int, res: RequestResult, slots: list) -> RequestResult:
        slots[b] = None
        self.gen.release(b)
        self.state.active[b] = 0
        self.state.seq_lens[b] = 0  # an idle row still takes part in the forward: keep its writes in bounds
        self.host_lens[b] = 0
        self.state.history[b] = []
        text = self.tokenizer.decode(res.output_ids, skip_special_tokens=True)
        for s in self.stop.stop_strings:
            if res.finish_reason == "stop" and s in text:
                text = text[: text.index(s)]
        res.text = text
        if self._bar is not None:
            self._bar.update(1)
        return res


def _seeds(requests: list[Request], seed: int) -> list[int]:
    """Each request's stream seed from (seed, id, n-th request with that id): independent of batch and order."""
    seen: dict[str, int] = {}
    out = []
    for r in requests:
        n = seen.get(r.id, 0)
        seen[r.id] = n + 1
        out.append(request_seed(seed, r.id, n))
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
