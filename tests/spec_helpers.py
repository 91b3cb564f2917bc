"""Helpers used only by tests: a dynamic-tree drafter over a fixed random transition table, an oracle tree
drafter, and a loader for the scripts in experiments/."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

from specbench.core.sampling import uniform
from specbench.core.types import DraftTree
from specbench.drafters.ngram import HostHistory


class TableTreeDrafter:
    """Draft tree from q(next | last token) = softmax(table[last]): `width` children of the root drawn without
    replacement (Gumbel top-k; top-k when greedy), then one chain child under each, depth k.

    Node order is by depth: [b0 d1, b1 d1, b0 d2, b1 d2, ...], so parents come before children.
    """

    hidden_layers: tuple[int, ...] = ()
    refeeds_path = True  # q depends on the newest token only: any accepted path will do (method.lookup)

    def __init__(self, vocab: int, width: int = 2, seed: int = 0, sharpness: float = 2.0, max_draft_len: int = 8):
        g = torch.Generator().manual_seed(seed)
        self.q = torch.softmax(torch.randn(vocab, vocab, generator=g) * sharpness, -1)  # [V, V]
        self.width, self.max_draft_len = width, max_draft_len

    def max_nodes(self, k: int) -> int:
        return k * self.width

    def setup(self, target, batch_size, max_len, k, params, gen) -> None:
        self.params, self.gen = params, gen

    def prefill(self, rows, admitted, target_out) -> None:
        pass

    def _children(self, q: torch.Tensor, n: int) -> torch.Tensor:
        if self.params.greedy:
            return q.topk(n, -1).indices
        gumbel = -torch.log(-torch.log(uniform(tuple(q.shape), self.gen, q.device).clamp(1e-20, 1 - 1e-7)))
        return (q.clamp(min=1e-30).log() + gumbel).topk(n, -1).indices  # sampling without replacement

    def propose(self, state) -> DraftTree:
        k, W = state.k, self.width
        B = state.last.shape[0]
        q_root = self.q[state.last[:, 0]]  # [B, V]
        first = self._children(q_root, W)  # [B, W]
        tokens, probs, parents = [first], [q_root[:, None].expand(B, W, -1)], [torch.full((B, W), -1)]
        cur = first
        for d in range(1, k):
            q = self.q[cur]  # [B, W, V]
            nxt = torch.stack([self._children(q[:, j], 1)[:, 0] for j in range(W)], 1)
            tokens.append(nxt)
            probs.append(q)
            parents.append(torch.arange(W).expand(B, W) + (d - 1) * W)
            cur = nxt
        lens = state.active * (k * W)
        return DraftTree(tokens=torch.cat(tokens, 1), parents=torch.cat(parents, 1).contiguous(), lens=lens,
                         probs=torch.cat(probs, 1), depth=k, width=W)

    def commit(self, verdict, state, target_out) -> None:
        pass


class OracleTreeDrafter:
    """A width-2 tree built from the target itself, with a planned accepted length per row and step.

    Nodes by depth: [a1, b1, a2, b2, ..., ak, bk]; a_d's parent is a_{d-1}, b_d's is b_{d-1} (a1, b1: the root).
    One branch (a or b, alternating with row + step, so the accepted path is often the second sibling and the
    cache compaction moves scattered slots) carries the target's own greedy continuation up to a planned break
    depth j in 1..k+1 where it turns wrong; the other branch is wrong from depth 1. Greedy verification must
    then accept exactly j - 1 tokens: `plans` records (planned, accepted) per row per step.
    """

    hidden_layers: tuple[int, ...] = ()
    max_draft_len = 8

    def __init__(self, model) -> None:
        self.model = model
        self.plans: list[list[tuple[int, int]]] = []  # per step: [(planned, accepted)] of the active rows

    def max_nodes(self, k: int) -> int:
        return 2 * k

    def setup(self, target, batch_size, max_len, k, params, gen) -> None:
        self.steps = [0] * batch_size
        self.V = target.config.vocab_size
        self.history = HostHistory(batch_size)

    def prefill(self, rows, admitted, target_out) -> None:
        self.history.prefill(rows, admitted)
        for b in rows:
            self.steps[b] = 0

    def _greedy(self, history: list[int], k: int) -> list[int]:
        seq = list(history)
        for _ in range(k):
            seq.append(int(self.model(torch.tensor([seq]), None).logits[0, -1].argmax()))
        return seq[len(history):]

    def propose(self, state) -> DraftTree:
        k, B, V = state.k, state.last.shape[0], self.V
        tokens = torch.full((B, 2 * k), -1, dtype=torch.long)
        parents = torch.tensor([-1, -1] + [2 * (d - 1) + br for d in range(1, k) for br in (0, 1)]).expand(B, 2 * k)
        self.planned = [None] * B
        for b in range(B):
            if not state.active[b]:
                continue
            g = self._greedy(self.history.rows[b], k)
            j = 1 + (b * 7 + self.steps[b] * 3) % (k + 1)  # first wrong depth on the good branch (k+1: none)
            good = (b + self.steps[b]) % 2
            for d in range(1, k + 1):
                right = g[d - 1]
                tokens[b, 2 * (d - 1) + good] = right if d < j else (right + 1) % V
                tokens[b, 2 * (d - 1) + 1 - good] = (g[0] + 2) % V if d == 1 else (right + 3) % V
            self.planned[b] = j - 1
            self.steps[b] += 1
        lens = state.active * (2 * k)
        return DraftTree(tokens=tokens.masked_fill(lens[:, None] == 0, -1), parents=parents.contiguous(), lens=lens,
                         depth=k, width=2)

    def commit(self, verdict, state, target_out) -> None:
        self.history.commit(verdict)
        acc = verdict.num_accepted.tolist()
        self.plans.append([(p, acc[b]) for b, p in enumerate(self.planned) if p is not None])


def experiment_script(name: str):
    """experiments/<name>.py loaded as a module (the scripts are not a package)."""
    path = Path(__file__).resolve().parents[1] / "experiments" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
