"""The shared trainer: data order, AdamW with warm-up + cosine decay, gradient accumulation, bf16 autocast,
periodic acceptance evaluation with the real decode loop, checkpoint / resume, progress bar, metric sinks.

A method contributes only its model and its loss (`TrainMethod`). Runs are deterministic on CPU: the data
order of epoch e is a permutation seeded by (seed, e), so resuming at step s replays exactly the batches an
uninterrupted run would have seen.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Protocol

import torch
from torch import Tensor, nn

from specbench.log import log
from specbench.train.data import Tokenized, collate


class TrainMethod(Protocol):
    name: str

    def parameters(self) -> Iterable[nn.Parameter]: ...
    def loss(self, ids: Tensor, mask: Tensor, index: list[int]) -> tuple[Tensor, dict[str, float]]: ...
    def state_dict(self) -> dict[str, Tensor]: ...
    def load_state_dict(self, sd: dict[str, Tensor]) -> None: ...
    def evaluate(self) -> dict[str, float]: ...
    def export(self, out_dir: Path) -> None: ...


@dataclass
class TrainSettings:
    steps: int = 300  # optimizer steps
    batch_size: int = 8  # sequences per micro-batch
    grad_accum: int = 1  # micro-batches per optimizer step
    lr: float = 1e-3
    warmup: int = 20  # linear warm-up steps, then cosine decay to min_lr_ratio * lr
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    clip: float = 1.0  # gradient norm clip (0 = off)
    bf16: bool = True  # bf16 autocast where the hardware runs it (CUDA, CPUs with AVX512-BF16/AMX)
    eval_every: int = 100  # steps between acceptance evaluations (0 = only at the end)
    save_every: int = 50  # steps between checkpoints
    log_every: int = 10
    seed: int = 0
    max_wall_s: float = 0.0  # stop once this process has trained this long (checkpointed: rerun to resume); 0 = off
    length_pool: int = 1  # draw this many steps' sequences at once, sort them by length, batch neighbours (1 = off)


@dataclass
class Phase:
    """A stretch of training from optimizer step `start` on, drawing its batches from items[lo:hi] (in an order
    seeded by (seed, phase, epoch)) at `lr_scale` times the schedule's learning rate."""

    start: int
    lo: int
    hi: int
    lr_scale: float = 1.0
    name: str = "train"


def lr_factor(step: int, s: TrainSettings) -> float:
    if step < s.warmup:
        return (step + 1) / max(1, s.warmup)
    t = (step - s.warmup) / max(1, s.steps - s.warmup)
    return s.min_lr_ratio + (1 - s.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, t)))


class Trainer:
    def __init__(self, method: TrainMethod, items: list[Tokenized], settings: TrainSettings, out_dir: str | Path,
                 *, autocast_ok: bool = False, progress: bool = True, on_log=None, pad_id: int = 0,
                 phases: list[Phase] | None = None) -> None:
        if not items:
            raise ValueError("no training sequences")
        self.method, self.items, self.s = method, items, settings
        self.phases = phases or [Phase(0, 0, len(items))]
        if self.phases[0].start != 0 or any(p.hi <= p.lo for p in self.phases) or \
                any(a.start >= b.start for a, b in zip(self.phases, self.phases[1:])):
            raise ValueError(f"phases {self.phases}: the first starts at 0, starts increase, each has items")
        if settings.length_pool < 1:
            raise ValueError(f"length_pool={settings.length_pool}: must be >= 1 (1 = batches as drawn)")
        self.out = Path(out_dir)
        self.params = [p for p in method.parameters() if p.requires_grad]
        self.device = self.params[0].device if self.params else torch.device("cpu")  # batches go where it trains
        self.opt = torch.optim.AdamW(self.params, lr=settings.lr, weight_decay=settings.weight_decay)
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            self.opt, lambda st: lr_factor(st, settings) * self.phase(st)[1].lr_scale)
        self.step = 0
        self.tokens, self.wall_s = 0, 0.0  # trained tokens and training time so far, across resumes
        self.history: list[dict] = []
        self.autocast = settings.bf16 and autocast_ok
        self.progress, self.on_log, self.pad_id = progress, on_log, pad_id
        self._perm_key, self._perm = None, torch.empty(0, dtype=torch.long)  # the permutation being drawn from

    # ----------------------------------------------------------------------------------------- data
    def phase(self, step: int) -> tuple[int, Phase]:
        return max((i, p) for i, p in enumerate(self.phases) if p.start <= step)

    def batch(self, step: int, micro: int) -> tuple[Tensor, Tensor, list[int]]:
        """Micro-batch `micro` of optimizer step `step` (deterministic in (seed, step, micro)):
        ids [B, T], mask [B, T], and the sequences' indices into items (for cached teacher features).

        With `length_pool` = P > 1 the sequences of P consecutive steps (the same ones, in the same epochs, as
        without it) are sorted by length and cut into micro-batches of neighbours, which are then dealt to those
        steps in a seeded order: batches pad to lengths that are close, so less compute goes into padding."""
        k, ph = self.phase(step)
        B, per_step, P = self.s.batch_size, self.s.batch_size * self.s.grad_accum, self.s.length_pool
        pool, r = divmod(step - ph.start, P)
        first = pool * P * per_step
        idx = [self._draw(k, ph, j) for j in range(first, first + P * per_step)]
        if P > 1:
            idx.sort(key=lambda i: (len(self.items[i].ids), i))
            g = torch.Generator().manual_seed(self.s.seed * 100003 + 104729 * (k + 1) + pool)
            chunk = int(torch.randperm(P * self.s.grad_accum, generator=g)[r * self.s.grad_accum + micro])
        else:
            chunk = r * self.s.grad_accum + micro
        idx = idx[chunk * B:(chunk + 1) * B]
        return (*collate([self.items[i] for i in idx], self.pad_id), idx)

    def _draw(self, k: int, ph: Phase, j: int) -> int:
        """The j-th sequence phase k draws: position j mod N of the permutation seeded by (seed, epoch, k)."""
        N = ph.hi - ph.lo
        epoch, pos = divmod(j, N)
        key = (epoch, k)
        if self._perm_key != key:
            g = torch.Generator().manual_seed(self.s.seed * 100003 + epoch + 7919 * k)
            self._perm_key, self._perm = key, torch.randperm(N, generator=g)
        return ph.lo + int(self._perm[pos])

    # --------------------------------------------------------------------------------- checkpoints
    @property
    def ckpt_dir(self) -> Path:
        return self.out / "checkpoint"

    def save(self) -> None:
        from safetensors.torch import save_file

        tmp = self.ckpt_dir.with_name("checkpoint.tmp")
        tmp.mkdir(parents=True, exist_ok=True)
        save_file({k: v.detach().cpu().clone().contiguous() for k, v in self.method.state_dict().items()},
                  str(tmp / "model.safetensors"))
        torch.save({"opt": self.opt.state_dict(), "sched": self.sched.state_dict(), "step": self.step,
                    "tokens": self.tokens, "wall_s": self.wall_s}, tmp / "trainer.pt")
        (tmp / "history.json").write_text(json.dumps({"settings": asdict(self.s), "history": self.history}))
        if self.ckpt_dir.exists():
            import shutil

            shutil.rmtree(self.ckpt_dir)
        tmp.rename(self.ckpt_dir)

    def try_resume(self) -> bool:
        if not (self.ckpt_dir / "trainer.pt").is_file():
            return False
        from safetensors.torch import load_file

        self.method.load_state_dict(load_file(str(self.ckpt_dir / "model.safetensors")))
        st = torch.load(self.ckpt_dir / "trainer.pt", weights_only=True, map_location="cpu")
        self.opt.load_state_dict(st["opt"])
        self.sched.load_state_dict(st["sched"])
        self.step = int(st["step"])
        # the saved rate was set by the saved run's schedule; a rerun with a larger train.steps (an extension)
        # recomputes it from this schedule (the same value on a plain resume)
        for g, base, f in zip(self.opt.param_groups, self.sched.base_lrs, self.sched.lr_lambdas):
            g["lr"] = base * f(self.step)
        self.tokens, self.wall_s = int(st.get("tokens", 0)), float(st.get("wall_s", 0.0))
        self.history = json.loads((self.ckpt_dir / "history.json").read_text())["history"]
        log(f"resumed from {self.ckpt_dir} at step {self.step}")
        return True

    # ------------------------------------------------------------------------------------------ fit
    def _record(self, row: dict) -> None:
        self.history.append(row)
        if self.on_log is not None:
            self.on_log(row)

    def fit(self, stop_after: int | None = None) -> list[dict]:
        """Train to `settings.steps` (or `stop_after` more steps, to simulate an interruption)."""
        from tqdm.auto import tqdm

        end = self.s.steps if stop_after is None else min(self.s.steps, self.step + stop_after)
        bar = tqdm(total=self.s.steps, initial=self.step, desc=f"train {self.method.name}", unit="step",
                   disable=not self.progress, dynamic_ncols=True)
        t0, tokens = time.perf_counter(), 0
        tokens0, wall0 = self.tokens, self.wall_s  # totals before a resume
        while self.step < end:
            self.opt.zero_grad(set_to_none=True)
            total, extra = 0.0, {}
            for micro in range(self.s.grad_accum):
                ids, mask, index = self.batch(self.step, micro)
                ids, mask = ids.to(self.device), mask.to(self.device)
                with torch.autocast("cpu" if ids.device.type == "cpu" else "cuda", dtype=torch.bfloat16,
                                    enabled=self.autocast):
                    loss, extra = self.method.loss(ids, mask, index)
                (loss / self.s.grad_accum).backward()
                total += float(loss.detach()) / self.s.grad_accum
                tokens += int(mask.sum())
            if self.s.clip > 0:
                torch.nn.utils.clip_grad_norm_(self.params, self.s.clip)
            lr = self.opt.param_groups[0]["lr"]  # the rate this step used
            self.opt.step()
            self.sched.step()
            self.step += 1
            rate = tokens / (time.perf_counter() - t0)
            bar.update(1)
            bar.set_postfix(loss=f"{total:.3f}", tok_s=f"{rate:.0f}", refresh=False)
            self.tokens, self.wall_s = tokens0 + tokens, wall0 + time.perf_counter() - t0
            done = {"tokens": self.tokens, "wall_s": self.wall_s}
            out_of_time = self.s.max_wall_s > 0 and time.perf_counter() - t0 >= self.s.max_wall_s
            if self.step % self.s.log_every == 0 or self.step == end or out_of_time:
                self._record({"step": self.step, **done, "loss": total, "lr": lr,
                              "train_tokens_per_s": rate, **({"phase": self.phase(self.step - 1)[1].name}
                                                             if len(self.phases) > 1 else {}), **extra})
            if self.s.eval_every and self.step % self.s.eval_every == 0 and self.step < self.s.steps:
                self._record({"step": self.step, **done, **self.method.evaluate()})
            if self.step % self.s.save_every == 0 or self.step == end or out_of_time:
                self.save()
            if out_of_time and self.step < end:
                log(f"train.max_wall_s={self.s.max_wall_s:g} spent at step {self.step} of {self.s.steps}: "
                    f"checkpointed; the same command resumes")
                break
        bar.close()
        if self.step >= self.s.steps:
            self._record({"step": self.step, "tokens": self.tokens, "wall_s": self.wall_s, **self.method.evaluate()})
            self.save()
        return self.history
