"""Prompt-lookup decoding (n-gram matching): find the context's last n tokens earlier in the context and
propose what followed them. No model; runs on the host over each request's token history, which it keeps
itself (`HostHistory`): the only drafter that needs the tokens on the host, so the decode loop keeps none.
"""

from __future__ import annotations

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


class NgramDrafter:
    hidden_layers: tuple[int, ...] = ()

    def __init__(self, min_n: int = 2, max_n: int = 4, max_draft_len: int = 16) -> None:
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
