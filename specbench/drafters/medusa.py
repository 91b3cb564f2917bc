"""Medusa: H heads on the target's final-normed hidden state at the last accepted position propose the tokens
at depths 1..k in one shot (head d-1 reads the same state and predicts depth d); a static tree of top-k picks
or the top-1 chain goes through the shared verify path.

State per row: the final-normed target state that produced the newest token (the root). After the prefill it
is the last prompt position's; after a verify step it is the state at the last accepted node (or the root),
whose target logits gave the bonus token. No cache, no rollback.

Trees are Medusa's `medusa_choices`: a list of paths of top-k ranks (path (0, 2) = head 0's best token, then
head 1's third best under it). Paths are sorted by (depth, ranks) and truncated to depth k; every prefix of a
path must be a path too. Drafts are deterministic top-k picks, so they are point-mass candidates: greedy,
lossless rejection sampling (the recursive rule with q = one-hot) and Medusa's typical acceptance all apply.
"""

from __future__ import annotations

from pathlib import Path

import torch

from specbench.core.sampling import SamplingParams
from specbench.core.types import BatchState, DraftTree
from specbench.drafters.base import FinalStateDrafter
from specbench.errors import UserError
from specbench.models.medusa import MedusaHeads, load_medusa

SHIPPED = Path(__file__).resolve().parent.parent / "weights" / "smollm2-135m-medusa"

# Medusa's `mc_sim_7b_63` (FasterDecoding/Medusa, medusa_choices.py): 63 nodes, depth 4, ranks up to 9
MC_SIM_7B_63 = [[0], [0, 0], [1], [0, 1], [2], [0, 0, 0], [1, 0], [0, 2], [3], [0, 3], [4], [0, 4], [2, 0], [0, 5],
                [0, 0, 1], [5], [0, 6], [6], [0, 7], [0, 1, 0], [1, 1], [7], [0, 8], [0, 0, 2], [3, 0], [0, 9], [8],
                [9], [1, 0, 0], [0, 2, 0], [1, 2], [0, 0, 3], [4, 0], [2, 1], [0, 0, 4], [0, 0, 5], [0, 0, 0, 0],
                [0, 1, 1], [0, 0, 6], [0, 3, 0], [5, 0], [1, 3], [0, 0, 7], [0, 0, 8], [0, 0, 9], [6, 0], [0, 4, 0],
                [1, 4], [7, 0], [0, 1, 2], [2, 0, 0], [3, 1], [2, 2], [8, 0], [0, 5, 0], [1, 5], [1, 0, 1],
                [0, 2, 1], [9, 0], [0, 6, 0], [0, 0, 0, 1], [1, 6], [0, 7, 0]]
# sized for a 2-core CPU, where a verify's cost grows with its nodes: 12 nodes, depth 4
CPU_12 = [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 0, 1], [0, 1, 0], [1, 0, 0], [0, 0, 0, 0],
          [0, 0, 0, 1]]
CPU_6 = [[0], [1], [0, 0], [1, 0], [0, 0, 0], [0, 0, 0, 0]]  # 6 nodes: a chain plus one second-best branch
PRESETS = {"mc_sim_7b_63": MC_SIM_7B_63, "cpu_12": CPU_12, "cpu_6": CPU_6}


def tree_layout(choices: list, k: int) -> tuple[list[tuple[int, ...]], list[int]]:
    """Paths of depth <= k sorted by (depth, ranks) and each node's parent index (-1 = the root)."""
    try:
        paths = sorted({tuple(int(r) for r in p) for p in choices}, key=lambda p: (len(p), p))
    except (TypeError, ValueError):
        raise UserError(f"method.tree={choices!r}: a preset name ({', '.join(PRESETS)}) or a list of rank paths") from None
    if not paths or any(len(p) == 0 or min(p) < 0 for p in paths):
        raise UserError("method.tree: paths must be non-empty lists of ranks >= 0")
    known = set(paths)
    for p in paths:
        if len(p) > 1 and p[:-1] not in known:
            raise UserError(f"method.tree: path {list(p)} has no parent path {list(p[:-1])}")
    paths = [p for p in paths if len(p) <= k]
    index = {p: i for i, p in enumerate(paths)}
    return paths, [index[p[:-1]] if len(p) > 1 else -1 for p in paths]


class MedusaDrafter(FinalStateDrafter):
    def __init__(self, path: str | None = None, tree: str | list | None = None, max_draft_len: int = 16,
                 model: MedusaHeads | None = None) -> None:
        """path: a Medusa head folder (FasterDecoding or vLLM layout); null = the head shipped for the embedded
        target. tree: a preset name, a list of rank paths (medusa_choices), or null = the top-1 chain."""
        if path is None and model is None:
            if not SHIPPED.is_dir():
                raise UserError("method=medusa needs method.drafter.path=<a Medusa head folder>")
            path = str(SHIPPED)
        if isinstance(tree, str):
            if tree not in PRESETS:
                raise UserError(f"method.tree={tree!r}; valid presets: {', '.join(PRESETS)} (or a list of paths)")
            tree = PRESETS[tree]
        self.choices = [list(p) for p in tree] if tree is not None else None
        if self.choices is not None:
            tree_layout(self.choices, 1 << 30)  # validate now: a bad tree is a config error
        self.path, self.max_draft_len, self.model = path, max_draft_len, model
        self.hidden_layers: tuple[int, ...] = ()

    def max_nodes(self, k: int) -> int:
        return k if self.choices is None else len(tree_layout(self.choices, k)[0])

    def setup(self, target, batch_size: int, max_len: int, k: int, params: SamplingParams, gen,
              path_len: int | None = None) -> None:
        """path_len (`method.lookup.drafter_k`: accepted paths deeper than k) needs no room here: commit reads
        the target's state at the last accepted node, at any depth."""
        if self.model is None:
            try:
                self.model = load_medusa(self.path, target)
            except UserError as e:
                hint = (" (the shipped head is for the embedded SmolLM2-135M-Instruct; give method.drafter.path=...)"
                        if self.path == str(SHIPPED) else "")
                raise UserError(f"{e}{hint}") from None
        if self.model.target_head is None:
            self.model.target_head = target.output
        heads = self.model.config.num_heads
        if k > heads:
            raise UserError(f"k={k}: this Medusa head has {heads} heads, so k (the tree depth) must be <= {heads}")
        self.track(target, batch_size)
        self.k = k
        self.token_ids = self.model.token_ids.to(self.device)
        if self.choices is None:
            self.depth_of = torch.arange(k, device=self.device)
            self.rank_of = torch.zeros(k, dtype=torch.long, device=self.device)
            self.parents, self.width, self.topk = None, 1, 1
        else:
            paths, parents = tree_layout(self.choices, k)
            self.depth_of = torch.tensor([len(p) - 1 for p in paths], device=self.device)
            self.rank_of = torch.tensor([p[-1] for p in paths], device=self.device)
            self.parents = torch.tensor(parents, device=self.device)
            kids = [sum(1 for q in parents if q == i) for i in range(-1, len(paths))]
            self.width, self.topk = max(kids), max(p[-1] for p in paths) + 1
            self.tree_depth = max(len(p) for p in paths)

    def describe(self) -> dict:
        c = self.model.config
        return {"path": self.path, "num_heads": c.num_heads, "num_layers": c.num_layers, "lm_head": c.lm_head,
                "head_vocab_size": c.rows, "shape": "chain" if self.choices is None else "tree",
                "tree_nodes": self.max_nodes(self.k)}

    def propose(self, state: BatchState) -> DraftTree:
        B, k = state.last.shape[0], state.k
        logits = self.model.logits(self.state)[:, :k]  # [B, k, rows]: head d-1 proposes depth d
        picks = logits.topk(self.topk, dim=-1).indices  # [B, k, topk] rows, best first
        cand = self.token_ids[picks]
        tokens = cand[:, self.depth_of, self.rank_of]  # [B, N]
        lens = state.active * tokens.shape[1]
        if self.parents is None:
            return DraftTree.chain(tokens, lens)
        tokens = tokens.masked_fill(lens[:, None] == 0, -1)
        return DraftTree(tokens=tokens, parents=self.parents.expand(B, -1).contiguous(), lens=lens,
                         depth=self.tree_depth, width=self.width)
