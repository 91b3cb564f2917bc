"""All-reduce through shared memory for CPU ranks on one host (`parallel.allreduce=shm`).

Why: tensor parallelism all-reduces twice per layer, and on CPU each gloo all-reduce is a few socket messages
whose cost is the operating system waking the waiting process, not the bytes. On a small VM that wake-up is
0.2–0.4 ms per message (experiments/README.md, section 10): 60 all-reduces per step of a 30-layer model cost
more than the step's compute. Here every rank copies its partial sum into its own slot of a shared buffer, bumps
its flag, and spins (yielding the core now and then, so more ranks than cores still progress) until every
peer's flag has reached the same count; then each rank adds the slots in rank order. So:

* every rank computes the identical sum (same inputs, same order, float32 accumulation), as one process would
  for the same partials;
* slots are double-buffered by the parity of the call count: a rank can only overwrite a slot two calls later,
  after every peer has entered the next call and so finished reading this one;
* ordering relies on x86-64's store and load order (data stores before the flag store, flag load before data
  loads), so `auto` uses it only on x86-64; a peer that stops answering fails the call after `timeout_s`.

The buffer lives in /dev/shm and is unlinked as soon as every rank has mapped it: nothing is left behind even
when a rank is killed.
"""

from __future__ import annotations

import mmap
import os
import platform
import tempfile
import time

import numpy as np
import torch
import torch.distributed as dist

SLOT_BYTES = 4 << 20  # per rank and parity; larger tensors go through in chunks
HEADER = 4096  # flags, one int64 per rank, on their own page


def supported() -> bool:
    """Whether `auto` may pick shm: one host (torchrun's local world is the world), x86-64, /dev/shm."""
    one_host = os.environ.get("LOCAL_WORLD_SIZE") == os.environ.get("WORLD_SIZE")
    return one_host and platform.machine() in ("x86_64", "AMD64") and os.path.isdir("/dev/shm")


class ShmAllReduce:
    """Sum-all-reduce over the ranks of `group` through one shared buffer. Every rank of the group must call
    it the same number of times with tensors of the same shape, like any collective."""

    def __init__(self, group, timeout_s: float) -> None:
        ranks = dist.get_process_group_ranks(group)
        self.n, self.me, self.timeout_s = len(ranks), ranks.index(dist.get_rank()), timeout_s
        size = HEADER + 2 * self.n * SLOT_BYTES
        box = [None]
        if self.me == 0:
            fd, box[0] = tempfile.mkstemp(prefix="specbench-allreduce-", dir="/dev/shm")
            os.ftruncate(fd, size)
            os.close(fd)
        dist.broadcast_object_list(box, src=ranks[0], group=group)
        path = box[0]
        with open(path, "r+b") as f:
            self.buf = mmap.mmap(f.fileno(), size)
        dist.barrier(group=group)  # every rank has it mapped: the name can go
        if self.me == 0:
            os.unlink(path)
        self.flags = np.frombuffer(self.buf, dtype=np.int64, count=self.n)
        self.data = torch.frombuffer(self.buf, dtype=torch.uint8, offset=HEADER,
                                     count=2 * self.n * SLOT_BYTES).view(2, self.n, SLOT_BYTES)
        self.calls = 0

    def _wait(self) -> None:
        """Spin until every peer has written this call's slot; yield the core after a while; time out."""
        seq, spins, t0 = self.calls, 0, None
        while self.flags.min() < seq:
            spins += 1
            if spins >= 64:
                os.sched_yield()
                if spins % 1024 == 0:
                    t0 = t0 or time.monotonic()
                    if time.monotonic() - t0 > self.timeout_s:
                        late = [r for r in range(self.n) if self.flags[r] < seq]
                        raise RuntimeError(f"shared-memory all-reduce: ranks {late} of the group did not arrive "
                                           f"within parallel.timeout_s={self.timeout_s:g} s")

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        if not t.is_contiguous():  # e.g. a strided view out of a fused projection: reduce a copy, write it back
            return t.copy_(self(t.contiguous()))
        raw = t.view(-1).view(torch.uint8)
        step = SLOT_BYTES - SLOT_BYTES % t.element_size()
        for lo in range(0, raw.numel(), step):
            nb = min(step, raw.numel() - lo)
            self.calls += 1
            slots = self.data[self.calls & 1]
            slots[self.me, :nb].copy_(raw[lo:lo + nb])
            self.flags[self.me] = self.calls  # after the data: x86 keeps the stores in order
            self._wait()
            acc = slots[0, :nb].view(t.dtype).to(torch.float32, copy=True)  # never add into a shared slot
            for r in range(1, self.n):
                acc += slots[r, :nb].view(t.dtype)
            raw[lo:lo + nb].view(t.dtype).copy_(acc)
        return t
