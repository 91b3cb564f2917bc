"""A small causal LM sharing the target's tokenizer drafts k tokens autoregressively from its own KV cache.

Cache invariant (per row): draft cached tokens + pending tokens = target cached tokens + 1 (the root).
Pending is the root alone, or — after a step that accepted all k drafts — the k-th draft (never fed to
the draft model) and the root. The first draft forward always takes two slots ([pending..., pad]) so the
loop never needs to know on the host which rows have two pending tokens.

Dynamic draft length (`stop_below`), as Hugging Face's `assistant_confidence_threshold`: a row's draft ends at
its first token whose draft probability is below the threshold (that token kept: verifying it costs next to
nothing), and the step's drafting ends once every running row's has. A row's length depends on its own draft
tokens only (not on its batch-mates, not on the target), so verification stays lossless; the draft forwards
saved are the ones likely to be rejected.

Static token tree (`tree: [w1, ..., wk]`): every depth-(j-1) node gets the draft's w_j most likely next tokens as
children (drawn without replacement, Gumbel top-w, when sampling: verification's rule for siblings). After the
pending forward the nodes so far are forwarded together at each depth with a tree mask (ancestors-or-self; the
committed prefix is seen by all), into scratch slots past the root. `commit` keeps the prefix through the root and
makes the accepted path plus the bonus token the next step's pending tokens (up to k + 1).

Dynamic tree (`method.tree: {topk, num_draft_tokens}`, EAGLE-2's selection, the keys `method=eagle3` takes): the
root's `topk` most likely children start the frontier; each frontier node proposes its `topk` best children with
priority = parent priority + log q(child), and the `topk` best candidates of each depth become the next frontier
(forwarded with the frontiers before them and a tree mask, as the static tree's levels); the `num_draft_tokens`
best candidates of all depths form the verified tree. Priorities fall along every path, so the kept set is closed
under ancestors. Sampling as EAGLE's trees: children drawn without replacement (Gumbel top-k) from a floored q,
priorities from q's sorted values, so which sibling slots survive never depends on the tokens drawn into them.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from specbench.core.types import PAD_ID, Admitted, BatchState, DraftTree, Verdict
from specbench.core.sampling import SamplingParams, exponential, sample_from, target_probs
from specbench.drafters.base import check_stop_below, dynamic_pool_layout, select_best
from specbench.errors import UserError
from specbench.models.loading import load_model, resolve_folder
from specbench.models.shared_draft import is_compact, load_compact

SHIPPED = Path(__file__).resolve().parent.parent / "weights" / "smollm2-135m-draft"


def tree_nodes(widths: list[int]) -> int:
    """Nodes of the static tree whose depth-j nodes each have widths[j] children: w1 + w1·w2 + ..."""
    total, level = 0, 1
    for w in widths:
        level *= w
        total += level
    return total


class DraftModelDrafter:
    hidden_layers: tuple[int, ...] = ()
    shardable = True  # parallel.draft_tp = tp shards the draft model like the target (see `transform`)

    def __init__(self, path: str | None = None, max_draft_len: int = 16, temperature: float | None = None,
                 cache_dir: str | None = None, model=None, vocab_ids: Tensor | None = None,
                 stop_below: float | None = None, tree: list[int] | None = None,
                 dynamic: dict | None = None) -> None:
        """path: HF folder / .safetensors / .gguf of the draft model (null = the one shipped for the embedded
        SmolLM2 target, when present); a folder in the compact form (`models/shared_draft.py`) gets the
        target's embedding and lm_head at setup. temperature: the draft's sampling temperature (null = the
        run's); `model` passes an already built Transformer (tests, training), `vocab_ids` the target ids of its
        reduced head's rows (None = a full-vocabulary head). stop_below: a row's draft ends at its first token
        with draft probability < stop_below (null = always k; see the module docstring). tree: children per
        node at each depth, e.g. [3, 2, 1, 1] (null = a chain). dynamic: {topk, num_draft_tokens}, an EAGLE-2
        dynamic tree of depth k (`method.tree`; null or topk null = no dynamic tree)."""
        if path is None and model is None:
            if not (SHIPPED / "config.json").is_file():
                raise UserError("method=draft_model needs method.drafter.path=<HF folder, .safetensors or .gguf>")
            path = str(SHIPPED)  # the draft model shipped for the embedded SmolLM2 target
        self.path, self.max_draft_len, self.temperature = path, max_draft_len, temperature
        self.cache_dir, self.model, self.vocab_ids = cache_dir, model, vocab_ids
        self.stop_below = check_stop_below(stop_below)
        self.widths = None if tree is None else list(tree)
        if self.widths is not None:
            if not self.widths or not all(isinstance(w, int) and not isinstance(w, bool) and w >= 1
                                          for w in self.widths):
                raise UserError(f"method.drafter.tree={tree!r}: a list of children per depth, each >= 1 "
                                "(e.g. [3, 2, 1, 1]), or null for a chain")
            if self.stop_below is not None:
                raise UserError(f"method.drafter.stop_below={stop_below} applies to chains; "
                                f"method.drafter.tree={tree} is a static tree")
        self.topk, self.num_draft_tokens = None, None
        if dynamic is not None and dynamic.get("topk") is not None:
            topk, n = dynamic["topk"], dynamic.get("num_draft_tokens")
            count = lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1  # noqa: E731
            if not count(topk) or not (n is None or count(n)):
                raise UserError(f"method.tree={dict(dynamic)}: topk and num_draft_tokens must be integers >= 1 "
                                "(num_draft_tokens null = every candidate)")
            for other, val in (("method.drafter.tree", self.widths), ("method.drafter.stop_below", self.stop_below)):
                if val is not None:
                    raise UserError(f"{other}={val} and the dynamic tree method.tree={dict(dynamic)} exclude each "
                                    "other: give one")
            self.topk, self.num_draft_tokens = topk, n
        self.transform = None  # set by the run under parallel.draft_tp > 1: applied once to the loaded model

    # ------------------------------------------------------------------------------------------ setup
    @property
    def is_tree(self) -> bool:
        return self.widths is not None or self.topk is not None

    @property
    def refeeds_path(self) -> bool:
        """A tree's commit re-feeds the accepted path, whoever drafted it (`method.lookup`); a chain's assumes
        its own drafts are cached."""
        return self.is_tree

    def pool_size(self, k: int) -> int:
        """Candidates a dynamic tree of depth k chooses from: topk at depth 1, topk² below."""
        return self.topk + (k - 1) * self.topk * self.topk

    def max_nodes(self, k: int) -> int:
        if self.topk is not None:
            return min(self.num_draft_tokens or self.pool_size(k), self.pool_size(k))
        return k if self.widths is None else tree_nodes(self.widths[:k])

    def setup(self, target, batch_size: int, max_len: int, k: int, params: SamplingParams,
              gen: torch.Generator, path_len: int | None = None) -> None:
        """path_len: a tree's longest accepted path, re-fed by commit (default k; `method.lookup.drafter_k`
        grafts deeper paths than the draft's tree)."""
        if self.model is None:
            folder = resolve_folder(self.path, self.cache_dir)[0]
            if is_compact(folder):  # stored without the vocabulary tables: the target's are shared
                self.model, self.vocab_ids = load_compact(folder, target, target.dtype, target.device)
            else:
                self.model = load_model(self.path, target.dtype, target.device, self.cache_dir).model
        if self.transform is not None:
            self.model, self.transform = self.transform(self.model), None
        m, t = self.model.config, target.config
        if m.vocab_size != t.vocab_size:
            raise UserError(f"draft model {self.path}: vocab_size {m.vocab_size} != target's {t.vocab_size}; "
                            "a draft model must share the target's tokenizer")
        self.device, self.vocab_size = target.device, t.vocab_size
        rows = self.model.output.weight.shape[0]
        if self.vocab_ids is not None:
            if rows != len(self.vocab_ids):
                raise UserError(f"draft model {self.path}: its head has {rows} rows but {len(self.vocab_ids)} "
                                "vocabulary ids were given")
            self.vocab_ids = self.vocab_ids.to(self.device)
        elif rows != t.vocab_size:
            raise UserError(f"draft model {self.path}: its head has {rows} rows, the vocabulary {t.vocab_size}; a "
                            "reduced head needs its d2t (the compact form)")
        if self.widths is not None and len(self.widths) < k:
            raise UserError(f"method.drafter.tree={self.widths} has {len(self.widths)} depths; k={k} needs k")
        self.k = k
        if path_len is not None and path_len > k and not self.is_tree:
            raise UserError(f"a draft-model chain re-feeds only its own drafts; a path of {path_len} > k={k} "
                            "needs a tree")
        P = max(path_len or k, k) + 1 if self.is_tree else 2  # pending slots: a tree's accepted path + bonus
        scratch = self.max_nodes(k) if self.topk is None else max(self.max_nodes(k), (k - 1) * self.topk)
        self.cache = self.model.new_cache(batch_size, max_len + P + scratch)
        self.pending = torch.zeros(batch_size, P, dtype=torch.long, device=self.device)  # [B, P]
        self.num_pending = torch.ones(batch_size, dtype=torch.long, device=self.device)  # [B] 1 or 2
        if self.widths is not None:  # the static shape, once: node parents and depths (depth-major order), and
            parents, depth, level = [-1] * self.widths[0], [1] * self.widths[0], 0  # ancestors-or-self
            for d, w in enumerate(self.widths[1:k], 2):
                n = len(depth) - level
                parents += [p for p in range(level, level + n) for _ in range(w)]
                depth += [d] * (n * w)
                level += n
            par = torch.tensor(parents, device=self.device)
            self.tree_parents, self.tree_depth = par, torch.tensor(depth, device=self.device)
            self.tree_mask = DraftTree(par[None], par[None], par.new_zeros(1), None, False, k, 1).attention_mask()[0, 1:, 1:]
        if self.topk is not None:  # the dynamic tree's pool layout; the depth of each forwarded frontier slot
            self.pool_depth, self.pool_qsrc = dynamic_pool_layout(self.topk, k, self.device)
            self.front_depth = torch.arange((k - 1) * self.topk, device=self.device) // self.topk + 1
        t = params.temperature if self.temperature is None else self.temperature
        self.params, self.gen = SamplingParams(t, params.top_p, params.top_k), gen

    def describe(self) -> dict:
        """For results.json: the drafting shape (a static tree's widths and its node count)."""
        if self.topk is not None:
            return {"shape": "tree", "tree": {"topk": self.topk, "num_draft_tokens": self.max_nodes(self.k)}}
        if self.widths is None:
            return {"shape": "chain"}
        return {"shape": "tree", "tree": "x".join(map(str, self.widths[: self.k])), "tree_nodes": self.max_nodes(self.k)}

    # -------------------------------------------------------------------------------------------- run
    def prefill(self, rows: list[int], admitted: Admitted, target_out) -> None:
        lo, hi = rows[0], rows[-1] + 1
        view = self.cache.rows(lo, hi)
        view.seq_lens.zero_()
        P = admitted.prompt_ids.shape[1]
        self.model(admitted.prompt_ids, view, kv_len=P)  # prompt into the draft cache; logits unused
        view.seq_lens.copy_(torch.tensor(admitted.prompt_lens, device=self.device))
        self.pending[lo:hi, 0] = admitted.state.last[lo:hi, 0]
        self.num_pending[lo:hi] = 1

    def _pick(self, logits: Tensor, gen) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """logits [B, V] (or [B, Vd] from a reduced head) -> token [B], draft distribution [B, V] (None when
        greedy), the token's draft probability [B] (only under `stop_below`; greedy: the softmax's maximum). A
        reduced head's distribution is zero outside its vocabulary."""
        ids = self.vocab_ids
        if self.params.greedy:
            x = logits.argmax(-1)
            conf = None if self.stop_below is None else torch.softmax(logits.float(), -1).gather(1, x[:, None])[:, 0]
            return (x if ids is None else ids[x]), None, conf
        q = target_probs(logits, self.params)
        x = sample_from(q, gen)
        conf = None if self.stop_below is None else q.gather(1, x[:, None])[:, 0]
        if ids is None:
            return x, q, conf
        full = q.new_zeros(q.shape[0], self.vocab_size).index_copy_(1, ids, q)
        return ids[x], full, conf

    def _pending_forward(self, state: BatchState) -> Tensor:
        """The pending token(s) into the draft cache; the draft's logits after the last real one [B, Vd]."""
        P = self.pending.shape[1]
        inp = torch.where(torch.arange(P, device=self.device)[None] < self.num_pending[:, None], self.pending, 0)
        kv = state.len_bound + P  # draft cached <= target cached; + the pending slots
        logits = self.model(inp, self.cache, kv_len=kv, logit_index=(self.num_pending - 1)[:, None]).logits[:, 0]
        self.cache.seq_lens += self.num_pending * state.active
        return logits

    def _top(self, logits: Tensor, w: int, values: bool = False) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """logits [B, n, Vd] -> w children per row and node [B, n, w] (target ids; greedy: top-w, sampling:
        Gumbel top-w, draws without replacement), the distribution they came from [B, n, V] (None greedy) and,
        when `values`, the w largest log q per node, sorted [B, n, w] (a dynamic tree's priorities; greedy: of
        softmax(logits))."""
        ids = self.vocab_ids
        if self.params.greedy:
            lq = torch.log_softmax(logits.float(), dim=-1) if values else logits
            v, x = lq.topk(w, dim=-1)
            return (x if ids is None else ids[x]), None, (v if values else None)
        q = target_probs(logits, self.params)
        q = (q + 1e-9) / (1 + 1e-9 * q.shape[-1])  # floored: every sibling Gumbel top-w can draw has q > 0 (as
        lq = q.log()  # EAGLE's trees), and q is what it reports
        gumbel = -exponential(tuple(q.shape), self.gen, q.device).log()
        x = (lq + gumbel).topk(w, dim=-1).indices
        v = lq.topk(w, dim=-1).values if values else None
        if ids is not None:
            q = q.new_zeros(*q.shape[:-1], self.vocab_size).index_copy_(-1, ids, q)
            x = ids[x]
        return x, q, v

    def _propose_tree(self, state: BatchState) -> DraftTree:
        k, widths = state.k, self.widths[: state.k]
        B = state.last.shape[0]
        x, q, _ = self._top(self._pending_forward(state)[:, None], widths[0])  # depth-1 children [B, 1, w1]
        toks, qs = [x[:, 0]], ([] if q is None else [q.expand(B, widths[0], -1)])
        first, n = 0, widths[0]  # the deepest level's node range [first, first + n)
        pos = self.cache.seq_lens[:, None] + self.tree_depth - 1  # depth-1 nodes right after the root
        for w in widths[1:]:  # forward every node so far (a prefix of the static order) -> the next level
            tokens = torch.cat(toks, 1)
            N = tokens.shape[1]
            out = self.model(tokens, self.cache, kv_len=state.len_bound + 1 + N, positions=pos[:, :N],
                             tree_mask=self.tree_mask[:N, :N].expand(B, N, N),
                             logit_index=torch.arange(first, first + n, device=self.device).expand(B, n)).logits
            x, q, _ = self._top(out, w)  # [B, n, w]
            toks.append(x.reshape(B, n * w))
            if q is not None:
                qs.append(q.repeat_interleave(w, dim=1))
            first, n = N, n * w
        lens = state.active * self.tree_depth.shape[0]
        tokens = torch.cat(toks, 1).masked_fill((lens == 0)[:, None], PAD_ID)  # idle rows propose nothing
        parents = self.tree_parents.expand(B, -1).contiguous()
        return DraftTree(tokens, parents, lens, torch.cat(qs, 1) if qs else None, False, k, max(widths))

    def _propose_dynamic(self, state: BatchState) -> DraftTree:
        k, f = state.k, self.topk
        B, dev = state.last.shape[0], self.device
        x, q, v = self._top(self._pending_forward(state)[:, None], f, values=True)  # depth-1 candidates [B, 1, f]
        pool_tok, pool_prio = [x.view(B, f)], [v.view(B, f)]
        pool_par, qs = [torch.full((B, f), -1, device=dev)], [q]
        front_tok, front_prio, front_pool = x.view(B, f), v.view(B, f), torch.arange(f, device=dev).expand(B, f)
        M = (k - 1) * f  # forwarded frontier slots past the root: depth d's frontier at (d-1)·f ..
        front_anc = torch.zeros(B, f, M, dtype=torch.bool, device=dev)  # ancestors-or-self among them
        eye = torch.arange(f, device=dev)
        toks, ancs = [], []
        pos = self.cache.seq_lens[:, None] + self.front_depth - 1  # depth-1 nodes right after the root
        for d in range(1, k):  # forward the frontiers so far -> depth d+1 candidates of the depth-d frontier
            front_anc[:, eye, (d - 1) * f + eye] = True
            toks.append(front_tok)
            ancs.append(front_anc)
            T = d * f
            out = self.model(torch.cat(toks, 1), self.cache, kv_len=state.len_bound + 1 + T, positions=pos[:, :T],
                             tree_mask=torch.cat(ancs, 1)[:, :, :T],
                             logit_index=torch.arange(T - f, T, device=dev).expand(B, f)).logits
            x, q, v = self._top(out, f, values=True)  # [B, f, f]
            prio = (front_prio[..., None] + v).reshape(B, f * f)
            pool_tok.append(x.reshape(B, f * f))
            pool_prio.append(prio)
            pool_par.append(front_pool.repeat_interleave(f, dim=1))
            qs.append(q)
            if d < k - 1:  # the next frontier: the f best candidates of this depth
                sel = prio.topk(f, dim=-1).indices  # [B, f]
                par = sel // f
                front_tok, front_prio = x.reshape(B, -1).gather(1, sel), prio.gather(1, sel)
                front_anc = front_anc.gather(1, par[..., None].expand(B, f, M))
                front_pool = f + (d - 1) * f * f + sel
        pool_tok, pool_prio, pool_par = torch.cat(pool_tok, 1), torch.cat(pool_prio, 1), torch.cat(pool_par, 1)
        N = self.max_nodes(k)
        sel, parents = select_best(pool_prio, pool_par, self.pool_depth, N)  # pool order: parents first
        lens = state.active * N
        tokens = pool_tok.gather(1, sel).masked_fill((lens == 0)[:, None], PAD_ID)  # idle rows propose nothing
        probs = None
        if qs[0] is not None:  # each node's q: the distribution at its parent
            qa = torch.cat(qs, 1)  # [B, 1 + (k-1) f, V]
            probs = qa.gather(1, self.pool_qsrc[sel][..., None].expand(B, N, qa.shape[-1]))
        return DraftTree(tokens, parents, lens, probs, False, k, f)

    def propose(self, state: BatchState) -> DraftTree:
        if self.topk is not None:
            return self._propose_dynamic(state)
        if self.widths is not None:
            return self._propose_tree(state)
        k = state.k
        gen = self.gen
        c = self.cache
        kv = state.len_bound + 2  # draft cached <= target cached; +2 for the pending slots
        logits = self._pending_forward(state)
        toks, qs = [], []
        x, q, conf = self._pick(logits, gen)
        toks.append(x)
        qs.append(q)
        lens, alive = state.active.clone(), state.active > 0  # a row drafts on while its drafts are confident
        for i in range(1, k):
            if conf is not None:
                alive &= conf >= self.stop_below
                if not bool(alive.any()):  # one host sync per draft token, under stop_below only
                    break
            logits = self.model(x[:, None], c, kv_len=kv + i).logits[:, 0]
            c.seq_lens += state.active
            x, q, conf = self._pick(logits, gen)
            toks.append(x)
            qs.append(q)
            lens += alive
        tokens = torch.stack(toks, 1)  # [B, K], K <= k (k without stop_below)
        probs = None if qs[0] is None else torch.stack(qs, 1)  # [B, K, V]
        return DraftTree.chain(tokens, lens, probs)

    def commit(self, verdict: Verdict, state: BatchState, target_out) -> None:
        if self.is_tree:  # keep the text through the root; re-feed the accepted path and the bonus
            K1 = verdict.tokens.shape[1]
            self.pending[:, :K1] = verdict.tokens.clamp(min=0)
            self.num_pending = torch.where(state.active > 0, verdict.num_accepted + 1, 1)
            self.cache.seq_lens.copy_(torch.where(state.active > 0, state.seq_lens + 1, 0))
            return
        K = verdict.tokens.shape[1] - 1  # this step's draft length (k, or fewer under stop_below)
        n_acc = verdict.num_accepted
        full = n_acc == K  # the K-th draft was never fed to the draft model
        extra = verdict.tokens.gather(1, n_acc[:, None])[:, 0]  # the new root
        kth = verdict.tokens[:, max(K - 1, 0)]
        self.pending[:, 0] = torch.where(full, kth, extra)
        self.pending[:, 1] = extra
        self.num_pending = 1 + full.long()
        # draft cached = target cached (after this step) + 1 - pending
        new_target = state.seq_lens + 1 + n_acc
        self.cache.seq_lens.copy_(torch.where(state.active > 0, new_target + 1 - self.num_pending, 0))
