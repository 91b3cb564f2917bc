"""Target (teacher) features cached to disk in chunks: per training sequence, the target's top-k
log-probabilities and their token ids at every position, computed once and reused every epoch.

On this CPU the teacher forward is most of a distillation step; with the cache a step runs only the student.
Chunks are safetensors files (`chunk_00000.safetensors`, ...) under `<cache>/teacher/<key>/`, where the key
hashes the target, k and the token ids of every sequence, so changed data or settings never reuse stale files.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from specbench.log import log
from specbench.train.data import Tokenized


class TeacherTopK:
    def __init__(self, target, items: list[Tokenized], k: int, root: str | Path, *, chunk: int = 64,
                 batch_size: int = 8, target_id: str = "", progress: bool = True) -> None:
        h = hashlib.sha256(json.dumps([target_id, k, [x.ids for x in items]]).encode()).hexdigest()[:16]
        self.dir = Path(root) / "teacher" / h
        self.k, self.chunk, self.n = k, chunk, len(items)
        self._loaded: dict[int, dict[str, Tensor]] = {}
        if not (self.dir / "done.json").is_file():
            self._build(target, items, batch_size, progress)

    @torch.no_grad()
    def _build(self, target, items: list[Tokenized], batch_size: int, progress: bool) -> None:
        from safetensors.torch import save_file
        from tqdm.auto import tqdm

        from specbench.train.data import collate

        self.dir.mkdir(parents=True, exist_ok=True)
        log(f"caching teacher top-{self.k} for {len(items)} sequences in {self.dir}")
        bar = tqdm(total=len(items), desc="teacher features", unit="seq", disable=not progress)
        for c0 in range(0, len(items), self.chunk):
            out: dict[str, Tensor] = {}
            for b0 in range(c0, min(c0 + self.chunk, len(items)), batch_size):
                group = list(range(b0, min(b0 + batch_size, c0 + self.chunk, len(items))))
                ids = collate([items[i] for i in group])[0].to(target.device)
                logp = F.log_softmax(target(ids, None).logits.float(), dim=-1)
                vals, idx = logp.topk(self.k, dim=-1)  # [B, T, k]
                for j, i in enumerate(group):
                    T = len(items[i].ids)
                    out[f"{i}.values"] = vals[j, :T].cpu().contiguous()
                    out[f"{i}.indices"] = idx[j, :T].to(torch.int32).cpu().contiguous()
                bar.update(len(group))
            save_file(out, str(self.dir / f"chunk_{c0 // self.chunk:05d}.safetensors"))
        bar.close()
        (self.dir / "done.json").write_text(json.dumps({"sequences": len(items), "k": self.k}))

    def _chunk(self, c: int) -> dict[str, Tensor]:
        if c not in self._loaded:
            from safetensors.torch import load_file

            if len(self._loaded) > 8:  # keep memory bounded
                self._loaded.pop(next(iter(self._loaded)))
            self._loaded[c] = load_file(str(self.dir / f"chunk_{c:05d}.safetensors"))
        return self._loaded[c]

    def get(self, idx: list[int], T: int) -> tuple[Tensor, Tensor]:
        """Top-k log-probs [B, T, k] float32 and token ids [B, T, k] int64 for sequences idx, padded to T."""
        vals = torch.full((len(idx), T, self.k), -1e4)
        ids = torch.zeros(len(idx), T, self.k, dtype=torch.long)
        for b, i in enumerate(idx):
            ch = self._chunk(i // self.chunk)
            v, t = ch[f"{i}.values"], ch[f"{i}.indices"]
            vals[b, : v.shape[0]] = v
            ids[b, : t.shape[0]] = t.long()
        return vals, ids


class TargetStates:
    """The target states a head trains on, per training sequence, cached to disk in chunks: the captured
    layers' hidden states `aux` [T, L·H] (for EAGLE-3 the low ‖ mid ‖ high capture-before states; none when
    `layers` is empty) and the
    final-normed hidden state `normed` [T, H] (what the lm_head sees; target logits over any vocabulary subset
    are one matmul away). Stored in bfloat16 (4.6 KB per token for SmolLM2), keyed like `TeacherTopK`.
    """

    def __init__(self, target, items: list[Tokenized], layers: tuple[int, ...], root: str | Path, *, chunk: int = 64,
                 batch_size: int = 8, target_id: str = "", progress: bool = True, keep_chunks: int = 1024) -> None:
        h = hashlib.sha256(json.dumps(["states", target_id, list(layers), [x.ids for x in items]]).encode()).hexdigest()[:16]
        self.dir = Path(root) / "states" / h
        self.layers, self.chunk, self.keep = tuple(layers), chunk, keep_chunks
        self._loaded: dict[int, dict[str, Tensor]] = {}
        if not (self.dir / "done.json").is_file():
            self._build(target, items, batch_size, progress)

    @torch.no_grad()
    def _build(self, target, items: list[Tokenized], batch_size: int, progress: bool) -> None:
        from safetensors.torch import save_file
        from tqdm.auto import tqdm

        from specbench.train.data import collate

        self.dir.mkdir(parents=True, exist_ok=True)
        log(f"caching target states (layers {list(self.layers)} + final normed) for {len(items)} sequences in {self.dir}")
        bar = tqdm(total=sum(len(x.ids) for x in items), desc="target states", unit="tok", unit_scale=True,
                   disable=not progress)
        n_chunks = (len(items) + self.chunk - 1) // self.chunk
        for c in range(n_chunks):
            path = self.dir / f"chunk_{c:05d}.safetensors"
            if path.is_file():  # resumable: chunks written by an interrupted run are kept
                bar.update(sum(len(items[i].ids) for i in range(c * self.chunk, min((c + 1) * self.chunk, len(items)))))
                continue
            out: dict[str, Tensor] = {}
            group_all = list(range(c * self.chunk, min((c + 1) * self.chunk, len(items))))
            group_all.sort(key=lambda i: len(items[i].ids))  # similar lengths together: less padding
            for b0 in range(0, len(group_all), batch_size):
                group = group_all[b0: b0 + batch_size]
                ids = collate([items[i] for i in group])[0].to(target.device)
                o = target(ids, None, hidden_layers=self.layers, return_normed=True,
                           logit_index=torch.zeros(len(group), 1, dtype=torch.long, device=ids.device))
                aux = torch.cat(o.hidden, dim=-1) if self.layers else None  # layers=(): the normed states only
                for j, i in enumerate(group):
                    T = len(items[i].ids)
                    if aux is not None:
                        out[f"{i}.aux"] = aux[j, :T].to(torch.bfloat16).cpu().contiguous()
                    out[f"{i}.normed"] = o.normed[j, :T].to(torch.bfloat16).cpu().contiguous()
                    bar.update(T)
            save_file(out, str(path.with_suffix(".tmp")))
            path.with_suffix(".tmp").rename(path)
        bar.close()
        (self.dir / "done.json").write_text(json.dumps({"sequences": len(items), "layers": list(self.layers)}))

    def _chunk(self, c: int) -> dict[str, Tensor]:
        if c not in self._loaded:
            from safetensors.torch import load_file

            if len(self._loaded) >= self.keep:
                self._loaded.pop(next(iter(self._loaded)))
            self._loaded[c] = load_file(str(self.dir / f"chunk_{c:05d}.safetensors"))
        return self._loaded[c]

    def get(self, idx: list[int], T: int) -> tuple[Tensor | None, Tensor]:
        """aux [B, T, L·H] (None when no layers are captured) and normed [B, T, H] (float32, zero-padded to T)
        for sequences idx."""
        rows = [self._chunk(i // self.chunk) for i in idx]
        n0 = rows[0][f"{idx[0]}.normed"]
        aux = torch.zeros(len(idx), T, rows[0][f"{idx[0]}.aux"].shape[-1]) if self.layers else None
        normed = torch.zeros(len(idx), T, n0.shape[-1])
        for b, (i, ch) in enumerate(zip(idx, rows)):
            n = ch[f"{i}.normed"]
            if aux is not None:
                a = ch[f"{i}.aux"]
                aux[b, : a.shape[0]] = a.float()
            normed[b, : n.shape[0]] = n.float()
        return aux, normed


class StackedStates:
    """Several state caches as one, indexed by position in the concatenation of their sequences (a training
    run whose later phase trains on other sequences, e.g. the MLP speculator's stage 2)."""

    def __init__(self, parts: list[tuple[TargetStates, int]]) -> None:
        self.parts, self.starts = [p for p, _ in parts], []
        lo = 0
        for _, n in parts:
            self.starts.append(lo)
            lo += n

    def get(self, idx: list[int], T: int) -> tuple[Tensor | None, Tensor]:
        outs = []
        for i in idx:
            j = max(j for j, lo in enumerate(self.starts) if lo <= i)
            outs.append(self.parts[j].get([i - self.starts[j]], T))
        aux = None if outs[0][0] is None else torch.cat([a for a, _ in outs])
        return aux, torch.cat([n for _, n in outs])
