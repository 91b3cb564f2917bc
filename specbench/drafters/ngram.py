"""Prompt-lookup decoding (n-gram matching): find the context's last n tokens earlier in the context and
propose what followed them. No model; runs on the host over each request's token history, which it keeps
itself (`HostHistory`): the only drafter that needs the tokens on the host, so the decode loop keeps none.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from specbench.core.types import PAD_ID, Admitted, BatchState, DraftTree, Verdict
from specbench.errors import UserError


def lookup(history: list[int] | np.ndarray, k: int, min_n: int, max_n: int) -> list[int]:
    """Up to k tokens that followed the most recent earlier occurrence of the longest matching suffix.

    Example: history [5, 6, 7, 8, 5, 6], k=3, n in 1..2: the suffix [5, 6] occurred at 0, so propose [7, 8, 5].
    """
    h = np.asarray(history, dtype=np.int64)
    L = len(h)
    for n in range(min(max_n, L - 1), min_n - 1, -1):
        windows = np.lib.stride_tricks.sliding_window_view(h[: L - 1], n)  # every earlier n-gram start
        hits = np.flatnonzero((windows == h[L - n:]).all(axis=1))
        if len(hits):
            start = int(hits[-1]) + n  # most recent match; copy what followed it
            return h[start: start + k].tolist()
    return []


class HostHistory:
    """Each row's prompt + generated tokens (including the newest, not yet cached one) as host lists, kept from
    the drafter's own prefill and commit: it reads the step's verdict back (one host sync, inside the drafter
    that needs it). A released row's list stays until its next prefill; `active` says which rows run."""

    def __init__(self, batch_size: int) -> None:
        self.rows: list[list[int]] = [[] for _ in range(batch_size)]

    def prefill(self, rows: list[int], admitted: Admitted) -> None:
        lo, hi = rows[0], rows[-1] + 1
        ids = admitted.prompt_ids.tolist()
        first = admitted.state.last[lo:hi, 0].tolist()
        for i, b in enumerate(rows):
            self.rows[b] = ids[i][: admitted.prompt_lens[i]] + [first[i]]

    def commit(self, verdict: Verdict) -> None:
        n_acc = verdict.num_accepted.tolist()
        toks = verdict.tokens.tolist()
        for b, h in enumerate(self.rows):
            h.extend(toks[b][: n_acc[b] + 1])

    def active(self, state: BatchState) -> list[list[int]]:
        """The running rows' histories ([] for an idle row)."""
        return [h if a else [] for h, a in zip(self.rows, state.active.tolist())]


LOOKUP_MAX_LEN = 16  # largest k of a lookup chain (method=ngram's default method.drafter.max_draft_len)


class NgramDrafter:
    hidden_layers: tuple[int, ...] = ()

    def __init__(self, min_n: int = 2, max_n: int = 4, max_draft_len: int = LOOKUP_MAX_LEN) -> None:
        if not 1 <= min_n <= max_n:
            raise UserError(f"method.drafter.min_n={min_n}, max_n={max_n}: need 1 <= min_n <= max_n")
        self.min_n, self.max_n, self.max_draft_len = min_n, max_n, max_draft_len

    def max_nodes(self, k: int) -> int:
        return k

    def setup(self, target, batch_size: int, max_len: int, k: int, params, gen) -> None:
        self.device = target.device
        self.history = HostHistory(batch_size)

    def prefill(self, rows: list[int], admitted: Admitted, target_out) -> None:
        self.history.prefill(rows, admitted)

    def propose(self, state: BatchState) -> DraftTree:
        """Host-side lookup per running row; the tree is only as wide as the longest proposal this step,
        so a step where nothing matched verifies just the root (a plain decode step)."""
        k = state.k
        histories = self.history.active(state)
        B = len(histories)
        drafts = [lookup(h, k, self.min_n, self.max_n) if h else [] for h in histories]
        width = max(map(len, drafts))
        tokens = torch.full((B, width), PAD_ID, dtype=torch.long)
        for b, d in enumerate(drafts):
            tokens[b, : len(d)] = torch.tensor(d, dtype=torch.long)
        lens = torch.tensor([len(d) for d in drafts], dtype=torch.long)
        return DraftTree.chain(tokens.to(self.device), lens.to(self.device))

    def commit(self, verdict: Verdict, state: BatchState, target_out) -> None:
        self.history.commit(verdict)


def graft(tokens: list[int], parents: list[int], chain: list[int]) -> list[tuple[int, int]]:
    """The nodes to append so a tree (parents before children, -1 = the root) also holds `chain` as a path from
    the root: follow the chain down existing nodes while a child carries its next token, then hang the rest
    below as new nodes. Returns (token, parent) per new node, in order; the first new node's parent is an
    existing node (or -1), each later one's the new node before it (at index len(tokens) + j - 1).

    Example: tokens [5, 6, 7], parents [-1, -1, 0] (5 → 7, and 6) and chain [5, 7, 9, 4]: 5 and 7 are there,
    so [(9, 2), (4, 3)] — 9 under node 2, 4 under the new node 3."""
    kids = {(p, t): n for n, (t, p) in enumerate(zip(tokens, parents))}
    cur = -1
    for i, t in enumerate(chain):
        nxt = kids.get((cur, t))
        if nxt is None:
            base = len(tokens)
            return [(t, cur)] + [(u, base + j) for j, u in enumerate(chain[i + 1:])]
        cur = nxt
    return []


class LookupUnion:
    """Prompt lookup drafted alongside another drafter (`method.lookup.max_n`): each step the inner drafter's
    tree, plus the context's n-gram continuation (up to k tokens, as `method=ngram` finds it) grafted onto it as
    one more path (`graft`: shared prefixes are merged), go to the target in one verify forward. Greedy keeps
    the longest accepted path of the union, so a step accepts at least what either part alone would.

    Sampling stays lossless: a grafted node is appended after every node of the inner tree, so it is the last
    child its parent tries, with a point-mass q. Once its drafted siblings are rejected the residual p' is exactly
    the target's distribution of what remains, and testing one more token x against it (accept with p'(x), else
    draw from p' without x) keeps it exact. Merging shared prefixes keeps a token from appearing twice among
    siblings (a rejected token has no residual mass left, so a duplicate would only cost a verified node).

    The inner drafter must rebuild its own state from whatever path was accepted (`refeeds_path`: EAGLE heads,
    Medusa, the MLP speculator, the draft model as a tree); its nodes and q are passed through untouched. Every
    other attribute the run reads (hidden_layers, shardable, ...) is the inner drafter's.

    `drafter_k` (< the run's k) lets the lookup path run deeper than the drafter's own tree: the drafter drafts
    to depth drafter_k, the grafted chain up to k tokens, and the drafter is set up to re-feed accepted paths of
    up to k tokens (its `setup(..., path_len=k)`)."""

    def __init__(self, inner, min_n: int = 2, max_n: int = 4, name: str = "", drafter_k: int | None = None) -> None:
        given = {"min_n": min_n, "max_n": max_n, **({} if drafter_k is None else {"drafter_k": drafter_k})}
        for key, v in given.items():
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise UserError(f"method.lookup.{key}={v!r}: an integer >= 1 (method.lookup.max_n null = no lookup"
                                "; drafter_k null = k)")
        if not 1 <= min_n <= max_n:
            raise UserError(f"method.lookup.min_n={min_n}, max_n={max_n}: need 1 <= min_n <= max_n")
        if drafter_k is not None and drafter_k > inner.max_draft_len:
            raise UserError(f"method.lookup.drafter_k={drafter_k}: method={name or type(inner).__name__} supports "
                            f"a depth <= {inner.max_draft_len} (method.drafter.max_draft_len)")
        if not getattr(inner, "refeeds_path", False):
            hint = (" as a chain: give it a tree (method.tree.topk=..., or method.drafter.tree=[1,1,1,1] for a "
                    "chain that re-feeds)" if name == "draft_model" else "")
            raise UserError(f"method.lookup.max_n={max_n}: method={name or type(inner).__name__} cannot take "
                            f"tokens it did not draft{hint}; valid with eagle, eagle3, medusa, mlp_speculator and "
                            "draft_model trees")
        self.inner, self.min_n, self.max_n, self.drafter_k = inner, min_n, max_n, drafter_k
        self._reset()

    def _reset(self) -> None:
        """Per run (a warm-up run uses the same drafter): host counts, and the accepted-graft counts kept on the
        device (commit adds to them without reading the verdict back)."""
        self.counts = dict.fromkeys(("row_steps", "matched", "grafted"), 0)
        self.won = self.accepted_grafted = 0
        self.first_graft = None

    @property
    def stats(self) -> dict:
        return {**self.counts, "won": int(self.won), "accepted_grafted": int(self.accepted_grafted)}

    def __getattr__(self, name):  # what the run reads off a drafter (shardable, path, ...) is the inner one's
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    @property
    def max_draft_len(self) -> int:
        """Largest run k: the drafter's own limit, or with drafter_k the lookup chain's (as method=ngram's)."""
        return self.inner.max_draft_len if self.drafter_k is None else max(LOOKUP_MAX_LEN, self.drafter_k)

    def own_k(self, k: int) -> int:
        """The drafter's own depth in a run of depth k (checked: at most k)."""
        if self.drafter_k is not None and self.drafter_k > k:
            raise UserError(f"method.lookup.drafter_k={self.drafter_k} > k={k}: the drafter's own depth is at most "
                            "k (k = the longest path verified, lookup's included)")
        return k if self.drafter_k is None else self.drafter_k

    def max_nodes(self, k: int) -> int:
        return self.inner.max_nodes(self.own_k(k)) + k

    def setup(self, target, batch_size: int, max_len: int, k: int, params, gen) -> None:
        d = self.own_k(k)
        if d < k:  # grafted paths are deeper than the drafter's own tree: it must re-feed up to k tokens
            try:
                self.inner.setup(target, batch_size, max_len, d, params, gen, path_len=k)
            except UserError as e:
                raise UserError(f"{e} (method.lookup.drafter_k={d}: the drafter's own depth)") from None
        else:
            self.inner.setup(target, batch_size, max_len, k, params, gen)
        self.history = HostHistory(batch_size)
        self._reset()

    def prefill(self, rows: list[int], admitted: Admitted, target_out) -> None:
        self.inner.prefill(rows, admitted, target_out)
        self.history.prefill(rows, admitted)

    def propose(self, state: BatchState) -> DraftTree:
        d = self.own_k(state.k)
        tree = self.inner.propose(state if d == state.k else replace(state, k=d))
        histories = self.history.active(state)
        chains = [lookup(h, state.k, self.min_n, self.max_n) if h else [] for h in histories]
        self.counts["row_steps"] += sum(1 for h in histories if h)
        self.counts["matched"] += sum(1 for c in chains if c)
        self.first_graft = None  # [B]: node ids from here on are grafted (None: nothing grafted this step)
        if not any(chains):  # the drafter's tree as it is, without reading it back
            return tree
        B, N = tree.tokens.shape
        lens = tree.lens.tolist()  # the one host read of the drafter's tree, on steps where lookup matched
        toks, pars = tree.tokens.tolist(), tree.parents.tolist()
        extra = [graft(toks[b][: lens[b]], pars[b][: lens[b]], chains[b]) if chains[b] else [] for b in range(B)]
        self.counts["grafted"] += sum(1 for e in extra if e)
        if not any(extra):  # every chain is already a path of the tree
            return tree
        self.first_graft = tree.lens
        N2 = max(N, max(lens[b] + len(extra[b]) for b in range(B)))
        depth, kids = tree.depth, tree.width
        at = ([], [], [])  # (row, node, token) of every grafted node
        for b, e in enumerate(extra):
            if e:  # the new nodes' depths (parents come first) and the widest parent they hang under
                row_p = pars[b][: lens[b]]
                d = []
                for p in row_p + [p for _, p in e]:
                    d.append(1 if p < 0 else d[p] + 1)
                n_kids = [0] * (len(d) + 1)  # index 0 = the root
                for p in row_p + [p for _, p in e]:
                    n_kids[p + 1] += 1
                depth, kids = max(depth, max(d[lens[b]:])), max(kids, max(n_kids))
                for j, (t, p) in enumerate(e):
                    at[0].append(b), at[1].append(lens[b] + j), at[2].append(t)
            toks[b] = toks[b][: lens[b]] + [t for t, _ in e] + [PAD_ID] * (N2 - lens[b] - len(e))
            pars[b] = pars[b][: lens[b]] + [p for _, p in e] + [-1] * (N2 - lens[b] - len(e))
        dev = tree.tokens.device
        probs = tree.probs
        if probs is not None:  # a grafted node's q is a point mass on its token
            probs = torch.cat([probs, probs.new_zeros(B, N2 - N, probs.shape[-1])], 1) if N2 > N else probs.clone()
            rows, nodes = torch.tensor(at[0], device=dev), torch.tensor(at[1], device=dev)
            probs[rows, nodes] = 0.0
            probs[rows, nodes, torch.tensor(at[2], device=dev)] = 1.0
        return DraftTree(torch.tensor(toks, dtype=torch.long, device=dev),
                         torch.tensor(pars, dtype=torch.long, device=dev),
                         tree.lens + torch.tensor([len(e) for e in extra], device=dev), probs, False, depth, kids)

    def commit(self, verdict: Verdict, state: BatchState, target_out) -> None:
        self.inner.commit(verdict, state, target_out)
        if self.first_graft is not None:  # accepted grafted nodes, counted on the device
            g = verdict.accepted_nodes >= self.first_graft[:, None]  # padding (-1) is never >= a length
            self.won = self.won + g.any(1).sum()
            self.accepted_grafted = self.accepted_grafted + g.sum()
        self.history.commit(verdict)

    def describe(self) -> dict:
        info = self.inner.describe() if hasattr(self.inner, "describe") else {}
        return {**info, "lookup": {"min_n": self.min_n, "max_n": self.max_n, "drafter_k": self.drafter_k,
                                   **self.stats}}
