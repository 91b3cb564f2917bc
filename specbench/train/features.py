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
                ids, _ = collate([items[i] for i in group])
                logp = F.log_softmax(target(ids, None).logits.float(), dim=-1)
                vals, idx = logp.topk(self.k, dim=-1)  # [B, T, k]
                for j, i in enumerate(group):
                    T = len(items[i].ids)
                    out[f"{i}.values"] = vals[j, :T].contiguous()
                    out[f"{i}.indices"] = idx[j, :T].to(torch.int32).contiguous()
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
