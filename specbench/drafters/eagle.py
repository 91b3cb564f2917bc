"""EAGLE-1 / EAGLE-3 drafting: a one-layer head fed by the target's hidden states, as a chain of depth k or an
EAGLE-2 dynamic tree.

Alignment (per row): the head's cache slot j holds the pair (target hidden at position j, token j+1), so its
output there predicts token j+2. After the target's prefill of P tokens and its first sampled token, pairs
0..P-2 are cached and pair P-1 (its hidden, the sampled token) is *pending*. After a verify step that accepted
n drafts, the n+1 new pairs (root hidden, draft 1), ..., (draft n hidden, bonus) are pending. Invariant:
head cached + pending = target cached. `propose` first runs the pending pairs (one forward, [B, k+1] padded),
whose last output gives the depth-1 candidates, then one forward per depth over the frontier, feeding back the
head's own output o as EAGLE-3 does; `commit` rolls the head's cache back to the target's committed length
(the speculative entries are rewritten from real target states next step).

Dynamic tree (EAGLE-2, `tree: {topk, num_draft_tokens}`): every frontier node proposes its `topk` best
children with priority = parent priority + log q(child); the `topk` best candidates of each depth become the
next frontier (one forward for all of them, with a tree mask over the head's scratch slots); finally the
`num_draft_tokens` best candidates of every depth form the tree verified by the target. Priorities fall along
every path, so the kept set is closed under ancestors. A chain is topk = 1.

Dynamic chain length (`stop_below`, chains only; the draft model's rule): a row's chain ends at its first token
whose draft probability is below the threshold (kept), and drafting ends once every running row's has.

Sampling (temperature > 0) stays lossless: each node's children are drawn *without replacement* from its draft
distribution q (Gumbel top-k, in draw order), while priorities use q's sorted values, so which sibling slots
survive never depends on the tokens drawn into them — verification's recursive rejection sampling then
reproduces the target distribution exactly (tested).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from specbench.core.types import Admitted, BatchState, DraftTree, Verdict
from specbench.drafters.base import check_stop_below, dynamic_pool_layout, select_best
from specbench.core.sampling import SamplingParams, exponential
from specbench.errors import UserError
from specbench.models.attention import AttnMeta
from specbench.models.cache import KVCache
from specbench.models.eagle import EagleDraft, load_eagle, resolve_aux_layers
from specbench.models.transformer import build_mask

WEIGHTS = Path(__file__).resolve().parent.parent / "weights"
SHIPPED = {3: WEIGHTS / "smollm2-135m-eagle3"}  # heads trained here for the embedded target


class EagleDrafter:
    max_draft_len: int
    refeeds_path = True  # commit re-feeds the accepted path with the target's features (any path: method.lookup)

    def __init__(self, path: str | None = None, version: int = 3, tree: dict | None = None, max_draft_len: int = 16,
                 temperature: float | None = None, aux_layers: list[int] | None = None, aux_convention: str = "auto",
                 model: EagleDraft | None = None, stop_below: float | None = None) -> None:
        """path: the head's folder (null = the head shipped for the embedded SmolLM2 target; EAGLE-1 has none).
        tree: {topk, num_draft_tokens} = EAGLE-2 dynamic tree of depth k; null or topk null = a chain of depth k.
        aux_layers / aux_convention: override the checkpoint's eagle_aux_hidden_state_layer_ids. stop_below: a
        chain row ends at its first token with draft probability < stop_below (null = always depth k)."""
        if version not in (1, 3):
            raise UserError(f"method.drafter.version={version}; valid: 1 (EAGLE-1), 3 (EAGLE-3)")
        if path is None and model is None and version not in SHIPPED:
            raise UserError("method=eagle (EAGLE-1) needs method.drafter.path=<folder of an EAGLE-1 head>")
        self.path = str(SHIPPED[version]) if path is None and model is None else path
        self.version, self.max_draft_len, self.temperature = version, max_draft_len, temperature
        self.aux_override = list(aux_layers) if aux_layers else None
        self.aux_convention = aux_convention
        self.topk, self.num_draft_tokens = 1, None
        if tree is not None and tree.get("topk") is not None:
            topk, n = int(tree["topk"]), tree.get("num_draft_tokens")
            if topk < 1:
                raise UserError(f"method.tree.topk={topk}: must be >= 1")
            if n is not None and int(n) < 1:
                raise UserError(f"method.tree.num_draft_tokens={n}: must be >= 1")
            self.topk, self.num_draft_tokens = topk, (int(n) if n is not None else None)
        self.stop_below = check_stop_below(stop_below)
        if self.stop_below is not None and self.topk > 1:
            raise UserError(f"method.drafter.stop_below={stop_below} applies to chains; a dynamic tree "
                            f"(method.tree.topk={self.topk}) already keeps its most likely nodes")
        self.model = model
        self.hidden_layers: tuple[int, ...] = ()
        self.aux_info: dict = {}

    # ------------------------------------------------------------------------------------------ setup
    def pool_size(self, k: int) -> int:
        return self.topk + (k - 1) * self.topk * self.topk

    def max_nodes(self, k: int) -> int:
        if self.topk == 1:
            return k
        return min(self.num_draft_tokens or self.pool_size(k), self.pool_size(k))

    def setup(self, target, batch_size: int, max_len: int, k: int, params: SamplingParams,
              gen: torch.Generator, path_len: int | None = None) -> None:
        """path_len: the longest accepted path commit re-feeds (default k; `method.lookup.drafter_k` grafts
        deeper paths than the head drafts)."""
        if self.model is None:
            try:
                self.model = load_eagle(self.path, target)
            except UserError as e:
                hint = (" (the shipped head is for the embedded SmolLM2-135M-Instruct; give method.drafter.path=...)"
                        if self.path == str(SHIPPED.get(self.version)) else "")
                raise UserError(f"{e}{hint}") from None
        cfg = self.model.config
        if cfg.version != self.version:
            want = "eagle3" if cfg.version == 3 else "eagle"
            raise UserError(f"method.drafter.path={self.path} is an EAGLE-{cfg.version} head; use method={want}")
        self.aux_info = resolve_aux_layers(cfg, target.config.num_layers, self.aux_override, self.aux_convention)
        self.hidden_layers = tuple(self.aux_info["layers"])
        self.target, self.device = target, target.device
        t = params.temperature if self.temperature is None else self.temperature
        self.params, self.gen = SamplingParams(t, 1.0), gen
        f, self.k = self.topk, k
        self.M = (k - 1) * f  # head scratch slots for the frontier forwards of one proposal
        P = max(path_len or k, k) + 1  # pending pairs: the root and the accepted path
        self.cache = KVCache(1, batch_size, cfg.num_kv_heads, max_len + self.M + P + 1, cfg.head_dim,
                             self.model.fc.weight.dtype, self.device)
        self.model.ensure_rope(self.cache.max_len + 1)
        width = 3 * cfg.target_hidden_size if cfg.version == 3 else cfg.target_hidden_size
        self.pend_tok = torch.zeros(batch_size, P, dtype=torch.long, device=self.device)  # [B, P]
        self.pend_hid = torch.zeros(batch_size, P, width, dtype=self.model.fc.weight.dtype, device=self.device)
        self.num_pend = torch.ones(batch_size, dtype=torch.long, device=self.device)  # [B] 1..P
        self.draft_ids = self.model.draft_ids  # [Vd] target id of each draft-vocabulary entry
        # static pool layout: depth of each candidate, and the q (distribution) it was drawn from
        self.pool_depth, self.pool_qsrc = dynamic_pool_layout(f, k, self.device)

    def describe(self) -> dict:
        """For results.json: the head actually used, its aux-layer convention and the drafting shape."""
        c = self.model.config
        return {"version": c.version, "path": self.path, "draft_vocab_size": c.draft_vocab_size,
                "aux_layers": self.aux_info, "shape": "chain" if self.topk == 1 else "tree",
                "tree": None if self.topk == 1 else {"topk": self.topk, "num_draft_tokens": self.max_nodes(self.k)}}

    # ---------------------------------------------------------------------------------------- helpers
    def _features(self, hidden: list[Tensor]) -> Tensor:
        """The target states the head reads: low ‖ mid ‖ high (EAGLE-3) or the final-normed last state (EAGLE-1)."""
        if self.model.config.version == 3:
            return torch.cat(hidden, dim=-1)
        return self.target.norm(hidden[0])

    def _run(self, cache: KVCache, tokens: Tensor, hidden: Tensor, slots: Tensor, positions: Tensor,
             mask: Tensor, kv_len: int, from_target: bool) -> Tensor:
        B, T = tokens.shape
        rows = torch.arange(B, device=self.device)[:, None].expand(B, T)
        return self.model.step(tokens, hidden, positions, cache, (rows, slots), AttnMeta(kv_len, mask), from_target)

    def _causal(self, cache: KVCache, tokens: Tensor, hidden: Tensor, kv_len: int) -> Tensor:
        """Run T pairs per row at slots (= positions) seq_lens + arange(T), causal."""
        T = tokens.shape[1]
        slots = cache.seq_lens[:, None] + torch.arange(T, device=self.device)
        return self._run(cache, tokens, hidden, slots, slots, build_mask(cache.seq_lens, T, kv_len, None),
                         kv_len, from_target=True)

    def _log_q(self, logits: Tensor) -> Tensor:
        """Draft log-distribution [.., Vd] (float32). When sampling, q is floored at 1e-9 (renormalised) so any
        token Gumbel top-k can draw has q > 0 — the tree reports exactly the q it drew from."""
        if self.params.greedy:
            return F.log_softmax(logits.float(), dim=-1)
        q = torch.softmax(logits.float() / self.params.temperature, dim=-1)
        return ((q + 1e-9) / (1 + 1e-9 * q.shape[-1])).log()

    def _children(self, log_q: Tensor, n: int) -> tuple[Tensor, Tensor]:
        """log_q [B, f, Vd] -> (children [B, f, n] draft ids in draw order, sorted log q values [B, f, n])."""
        vals, idx = log_q.topk(n, dim=-1)
        if self.params.greedy:
            return idx, vals
        gumbel = -exponential(tuple(log_q.shape), self.gen, log_q.device).log()
        return (log_q + gumbel).topk(n, dim=-1).indices, vals  # Gumbel top-k: n draws without replacement

    def _tree_mask(self, base: Tensor, anc: Tensor, kv_len: int) -> Tensor:
        """[B, 1, f, kv_len]: the committed prefix (slots < base) plus each query's ancestors-or-self among the
        scratch slots base .. base+M-1 (anc [B, f, M])."""
        B, f, M = anc.shape
        rel = torch.arange(kv_len, device=self.device)[None] - base[:, None]  # [B, S]
        seen = anc.gather(2, rel.clamp(0, M - 1)[:, None, :].expand(B, f, kv_len))
        return ((rel < 0)[:, None, :] | ((rel >= 0) & (rel < M))[:, None, :] & seen)[:, None]

    # -------------------------------------------------------------------------------------------- run
    def prefill(self, rows: list[int], admitted: Admitted, target_out) -> None:
        lo, hi = rows[0], rows[-1] + 1
        feats = self._features(target_out.hidden).to(self.pend_hid.dtype)  # [R, P, W]
        ids, P = admitted.prompt_ids, admitted.prompt_ids.shape[1]
        view = self.cache.rows(lo, hi)
        view.seq_lens.zero_()
        if P > 1:  # pairs (hidden j, token j+1) for j < P-1; the last prompt position pairs with the first sample
            self._causal(view, ids[:, 1:], feats[:, :-1], P - 1)
        lens = torch.tensor(admitted.prompt_lens, device=self.device)
        view.seq_lens.copy_(lens - 1)
        self.pend_hid[lo:hi, 0] = feats[torch.arange(hi - lo, device=self.device), lens - 1]
        self.pend_tok[lo:hi, 0] = admitted.state.last[lo:hi, 0]
        self.num_pend[lo:hi] = 1

    def propose(self, state: BatchState) -> DraftTree:
        k, f, c = state.k, self.topk, self.cache
        B, H = state.last.shape[0], self.model.config.hidden_size
        top = state.len_bound  # host bound on every row's target length (= head cached + pending)
        o = self._causal(c, self.pend_tok, self.pend_hid, top + k + 1)  # [B, P, H]: real pairs end before top
        o = o.gather(1, (self.num_pend - 1)[:, None, None].expand(B, 1, H))  # last real pair's output
        c.seq_lens += self.num_pend * state.active
        base = c.seq_lens.clone()  # first scratch slot = position of the depth-1 nodes' forward
        q_all = [self._log_q(self.model.logits(o))]  # [B, 1, Vd]
        tok, prio = self._children(q_all[0], f)  # depth-1 candidates [B, 1, f]
        pool_tok, pool_prio, pool_par = [tok.view(B, f)], [prio.view(B, f)], [torch.full((B, f), -1, device=self.device)]
        ids = self.draft_ids  # the head embeds target ids; candidates are draft-vocabulary indices
        front_tok, front_prio = ids[tok.view(B, f)], prio.view(B, f)
        front_hid, front_pool = o.expand(B, f, H), torch.arange(f, device=self.device).expand(B, f)
        anc = torch.zeros(B, f, self.M, dtype=torch.bool, device=self.device)
        eye = torch.arange(f, device=self.device)
        lens, alive = state.active.clone(), state.active > 0  # stop_below (chains): rows still confident
        for d in range(1, k):  # forward the depth-d frontier -> depth d+1 candidates
            if self.stop_below is not None:
                alive &= q_all[-1].gather(2, pool_tok[-1][:, None, -1:])[:, 0, 0].exp() >= self.stop_below
                if not bool(alive.any()):  # one host sync per depth, under stop_below only
                    break
                lens += alive
            col = (d - 1) * f
            anc[:, eye, col + eye] = True
            slots = base[:, None] + col + eye
            pos = (base + d - 1)[:, None].expand(B, f)
            kv = top + self.M + 1
            o = self._run(c, front_tok, front_hid, slots, pos, self._tree_mask(base, anc, kv), kv, from_target=False)
            log_q = self._log_q(self.model.logits(o))  # [B, f, Vd]
            q_all.append(log_q)
            ctok, cval = self._children(log_q, f)  # [B, f, f]
            cprio = front_prio[..., None] + cval
            pool_tok.append(ctok.reshape(B, f * f))
            pool_prio.append(cprio.reshape(B, f * f))
            pool_par.append(front_pool.repeat_interleave(f, dim=1))
            if d < k - 1:  # the next frontier: the f best candidates of this depth
                sel = cprio.reshape(B, f * f).topk(f, dim=-1).indices  # [B, f]
                par = sel // f
                front_tok = ids[ctok.reshape(B, -1).gather(1, sel)]
                front_prio = cprio.reshape(B, -1).gather(1, sel)
                front_hid = o.gather(1, par[..., None].expand(B, f, H))
                anc = anc.gather(1, par[..., None].expand(B, f, self.M))
                front_pool = f + (d - 1) * f * f + sel
        return self._tree(state, k, torch.cat(pool_tok, 1), torch.cat(pool_prio, 1), torch.cat(pool_par, 1), q_all,
                          lens if self.stop_below is not None else None)

    def _tree(self, state: BatchState, k: int, pool_tok: Tensor, pool_prio: Tensor, pool_par: Tensor,
              q_all: list[Tensor], chain_lens: Tensor | None = None) -> DraftTree:
        """Select the verified nodes from the candidate pool [B, Np] and build the DraftTree (target ids);
        chain_lens: each row's chain length under stop_below (the pool may then be shorter than k)."""
        B, Np = pool_tok.shape
        N = Np if self.topk == 1 else self.max_nodes(k)
        if self.topk == 1:  # a chain: every candidate, in depth order
            sel = torch.arange(Np, device=self.device).expand(B, Np)
        else:  # best N by priority (ancestors first, in pool order)
            sel, parents = select_best(pool_prio, pool_par, self.pool_depth, N)
        tokens = self.draft_ids[pool_tok.gather(1, sel)]
        lens = state.active * N if chain_lens is None else chain_lens
        probs = None
        if not self.params.greedy:
            q = torch.cat(q_all, 1).exp()  # [B, 1 + (k-1) f, Vd]
            qn = q.gather(1, self.pool_qsrc[sel][..., None].expand(B, N, q.shape[-1]))
            probs = torch.zeros(B, N, self.model.config.vocab_size, device=self.device)
            probs.scatter_(2, self.draft_ids.expand(B, N, -1), qn)
        if self.topk == 1:
            return DraftTree.chain(tokens, lens, probs)
        return DraftTree(tokens=tokens, parents=parents, lens=lens, probs=probs, depth=k, width=self.topk)

    def commit(self, verdict: Verdict, state: BatchState, target_out) -> None:
        feats = self._features(target_out.hidden).to(self.pend_hid.dtype)  # [B, 1+N, W]
        B, K1 = verdict.tokens.shape
        # forward index of the root (0) and of each accepted node; past the path: the root (never read)
        idx = torch.cat([torch.zeros(B, 1, dtype=torch.long, device=self.device), verdict.accepted_nodes + 1], 1)
        idx = idx.clamp(min=0)
        self.pend_hid[:, :K1] = feats.gather(1, idx[..., None].expand(B, K1, feats.shape[-1]))
        self.pend_tok[:, :K1] = verdict.tokens.clamp(min=0)
        self.num_pend = torch.where(state.active > 0, verdict.num_accepted + 1, 1)
        self.cache.seq_lens.copy_(torch.where(state.active > 0, state.seq_lens, 0))
