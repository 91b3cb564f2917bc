"""Who is who in a tensor × pipeline parallel run, the process groups, and the timed collectives.

Ranks are laid out tensor-parallel innermost (as Megatron and vLLM): rank = stage · tp + tp_rank, so the tp
ranks of a stage are consecutive (one node's GPUs share the all-reduces) and stage s's tp_rank r sends its
hidden states to stage s+1's tp_rank r.

The *leader* is the first rank of the last stage. It holds the logits, so it runs the acceptance rule and
(with draft_tp=1) the drafter, and every cross-rank message of a step (the draft tree, the verdict, a
prefill's first tokens) is broadcast from it: ranks never compute a decision of their own, so they cannot
disagree. With draft_tp=tp every rank of the last stage runs the (sharded) drafter, and also picks tokens and
runs the acceptance rule like the leader, only so that its per-row generators consume the same random numbers
(its drafter's next draws must equal the leader's, or the sharded draft model would mix two histories); the
leader's proposal and verdict are still the ones every rank follows. Why the last stage and not stage 0: the drafters read the target's final states and
logits (EAGLE's features, Medusa's and the MLP speculator's last state), which exist only there; proposing
there saves sending them back to stage 0 every step (vLLM and SGLang place the drafter there too).
"""

from __future__ import annotations

import atexit
import os
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import timedelta
from typing import NoReturn

import torch
import torch.distributed as dist

from specbench.errors import UserError


class Comm:
    """torch.distributed collectives with a wall-clock total per kind (all-reduce, p2p, broadcast, object).

    On CPU (gloo) every collective blocks, so the totals are exact: time in a collective includes waiting for
    the slowest peer, which is the synchronisation cost of the step. On CUDA the ops are queued on the stream;
    `sync=True` synchronises around each one so the totals are exact there too (and the run slower)."""

    def __init__(self, device: torch.device, sync: bool = False) -> None:
        self.sync = sync and device.type == "cuda"
        self.shm: dict[int, object] = {}  # id(group) -> ShmAllReduce, for groups that all-reduce through /dev/shm
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.bytes: dict[str, int] = defaultdict(int)

    def _timed(self, kind: str, t: torch.Tensor | None, fn):
        if self.sync:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn()
        if self.sync:
            torch.cuda.synchronize()
        self.seconds[kind] += time.perf_counter() - t0
        self.calls[kind] += 1
        if t is not None:
            self.bytes[kind] += t.numel() * t.element_size()
        return out

    def all_reduce(self, t: torch.Tensor, group) -> torch.Tensor:
        fast = self.shm.get(id(group))
        if fast is not None:
            self._timed("all_reduce", t, lambda: fast(t))
        else:
            self._timed("all_reduce", t, lambda: dist.all_reduce(t, group=group))
        return t

    def broadcast(self, t: torch.Tensor, src: int) -> torch.Tensor:
        self._timed("broadcast", t, lambda: dist.broadcast(t, src))
        return t

    def send(self, t: torch.Tensor, dst: int) -> None:
        self._timed("p2p", t, lambda: dist.send(t.contiguous(), dst))

    def recv(self, t: torch.Tensor, src: int) -> torch.Tensor:
        self._timed("p2p", t, lambda: dist.recv(t, src))
        return t

    def broadcast_object(self, obj, src: int):
        box = [obj]
        self._timed("object", None, lambda: dist.broadcast_object_list(box, src))
        return box[0]

    def all_gather_object(self, obj) -> list:
        out = [None] * dist.get_world_size()
        self._timed("object", None, lambda: dist.all_gather_object(out, obj))
        return out

    def reset(self) -> None:
        for d in (self.seconds, self.calls, self.bytes):
            d.clear()

    def summary(self) -> dict:
        return {"seconds": dict(self.seconds), "calls": dict(self.calls), "bytes": dict(self.bytes),
                "total_s": sum(self.seconds.values())}


@dataclass
class Topology:
    """One rank's place in the run. The default (world 1) is a single process: no collectives at all."""

    tp: int = 1
    pp: int = 1
    draft_tp: int = 1
    rank: int = 0
    world: int = 1
    comm: Comm | None = None
    tp_group: object = None  # this rank's stage's tensor-parallel group
    draft_group: object = None  # the group a sharded drafter all-reduces over (the last stage's tp group)
    layers: tuple[int, int] = (0, 0)  # this stage's layer range [lo, hi), set when the target is split
    extra: dict = field(default_factory=dict)

    @property
    def parallel(self) -> bool:
        return self.world > 1

    @property
    def stage(self) -> int:
        return self.rank // self.tp

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tp

    @property
    def first_stage(self) -> bool:
        return self.stage == 0

    @property
    def last_stage(self) -> bool:
        return self.stage == self.pp - 1

    @property
    def leader(self) -> int:
        """The rank whose decisions every rank follows: the first rank of the last stage."""
        return (self.pp - 1) * self.tp

    @property
    def is_leader(self) -> bool:
        return self.rank == self.leader

    @property
    def runs_drafter(self) -> bool:
        """Whether this rank runs the drafter: the leader, or every last-stage rank when it is sharded."""
        return self.is_leader or (self.last_stage and self.draft_tp > 1)

    def describe(self) -> dict:
        return {"tp": self.tp, "pp": self.pp, "draft_tp": self.draft_tp, "world_size": self.world,
                "leader_rank": self.leader, "backend": dist.get_backend() if self.parallel else None,
                "allreduce": self.extra.get("allreduce")}


LOCAL = Topology()
_GROUPS: dict[tuple[int, int], list] = {}  # (tp, pp) -> tp group per stage, made once per process


def launched_world() -> int | None:
    """The world size torchrun (or any launcher using its env protocol) gave this process; None when plain."""
    w = os.environ.get("WORLD_SIZE")
    return int(w) if w is not None else None


def check_sizes(tp: int, pp: int, draft_tp: int) -> None:
    """The checks that need no model: the same on every rank, so every rank fails alike before any message."""
    for name, v in (("tp", tp), ("pp", pp), ("draft_tp", draft_tp)):
        if v < 1:
            raise UserError(f"parallel.{name}={v}: must be >= 1")
    if draft_tp not in (1, tp):
        raise UserError(f"parallel.draft_tp={draft_tp}: valid: 1 or parallel.tp ({tp})")
    world = launched_world()
    if world is None:
        if tp * pp > 1:
            raise UserError(f"parallel.tp={tp} parallel.pp={pp} need {tp * pp} processes: launch with "
                            f"torchrun --nproc-per-node {tp * pp} -m specbench ...")
        return
    if world != tp * pp:
        raise UserError(f"world size {world} (torchrun processes) != parallel.tp × parallel.pp = {tp} × {pp}; "
                        f"launch {tp * pp} processes or change parallel.tp / parallel.pp")


def local_device(device: torch.device) -> torch.device:
    """Under torchrun each process takes the GPU of its local rank."""
    if device.type == "cuda" and device.index is None and launched_world() is not None:
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return device


def _shutdown() -> None:
    """Leave the process group before the interpreter exits (a live gloo group at exit aborts the process)."""
    if dist.is_initialized():
        dist.destroy_process_group()
        _GROUPS.clear()


def leave(code: int) -> NoReturn:
    """End this rank's process under torchrun: wait for every rank at a barrier (no collective is then in
    flight anywhere), leave the group, flush, and exit `code` at once.

    Exiting without the interpreter's teardown is deliberate: the process groups are still referenced by the
    sharded model's hooks, and a gloo group torn down during finalization (its worker threads alive while C++
    statics are destroyed) can abort the process with "terminate called without an active exception" after a
    run that succeeded. A peer already gone (the barrier fails) turns a 0 into 1."""
    import logging
    import sys

    if dist.is_initialized():
        try:
            dist.barrier()
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - a peer already gone: leave anyway
            code = code or 1
        _GROUPS.clear()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def join(device: torch.device, timeout_s: float = 120.0) -> bool:
    """Under torchrun with several processes, join the process group (gloo on CPU, NCCL on CUDA) that every
    later message uses; True when joined. Joining before any check lets a bad value be agreed on by every
    rank (`step.agree`) so all of them report it and exit together."""
    world = launched_world()
    if world is None or world == 1:
        return False
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
        atexit.register(_shutdown)
    return True


ALLREDUCE = ("auto", "gloo", "shm")


def allreduce_backend(choice: str, device: torch.device) -> str:
    """What `parallel.allreduce` means here: "nccl" on CUDA; on CPU "shm" (auto: one host, x86-64) or "gloo"."""
    from specbench.parallel import shm

    if choice not in ALLREDUCE:
        raise UserError(f"parallel.allreduce={choice!r}: valid: {', '.join(ALLREDUCE)}")
    if device.type == "cuda":
        if choice != "auto":
            raise UserError(f"parallel.allreduce={choice}: CPU only; on CUDA the all-reduce is NCCL's (use auto)")
        return "nccl"
    if choice == "shm" and not shm.supported():
        raise UserError("parallel.allreduce=shm needs every rank on this host (x86-64, /dev/shm); use auto or gloo")
    return "shm" if choice == "shm" or (choice == "auto" and shm.supported()) else "gloo"


def init(tp: int, pp: int, draft_tp: int, device: torch.device, timeout_s: float = 120.0,
         sync_timing: bool = False, allreduce: str = "auto") -> Topology:
    """This rank's Topology: join the process group torchrun set up and make the tp groups (all-reducing
    through shared memory where `allreduce_backend` says so).

    A peer that dies or stops answering makes every collective fail after `timeout_s`, so no rank hangs
    (torchrun also stops the others as soon as one exits with an error)."""
    check_sizes(tp, pp, draft_tp)
    backend = allreduce_backend(allreduce, device)
    if not join(device, timeout_s):
        return LOCAL
    world, rank = dist.get_world_size(), dist.get_rank()
    if (tp, pp) not in _GROUPS:  # every rank creates every group, in the same order
        _GROUPS[(tp, pp)] = [dist.new_group(list(range(s * tp, (s + 1) * tp))) for s in range(pp)]
    groups = _GROUPS[(tp, pp)]
    comm = Comm(device, sync_timing)
    if backend == "shm" and tp > 1:
        from specbench.parallel.shm import ShmAllReduce

        mine = groups[rank // tp]  # the only tp group this rank all-reduces over (the drafter's too, if it is)
        comm.shm[id(mine)] = ShmAllReduce(mine, timeout_s)
    topo = Topology(tp, pp, draft_tp, rank, world, comm, groups[rank // tp], groups[-1])
    topo.extra["allreduce"] = backend if tp > 1 else None
    return topo
