"""Under torchrun: exercise parallel.shm.ShmAllReduce directly and write what each rank got.

Rank r's tensor for case (shape, dtype) is filled with integers (r + 1) * (i % 7) — exact in float32 and bf16 —
so the expected sum is counted by hand in the test: (1 + 2 + ... + world) * (i % 7). `absent` names a rank that
never calls; the others must fail with the timeout error instead of hanging."""

import hashlib
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from specbench.parallel import shm

spec = json.loads(Path(sys.argv[1]).read_text())
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
if spec.get("slot_bytes"):
    shm.SLOT_BYTES = spec["slot_bytes"]
ar = shm.ShmAllReduce(dist.group.WORLD, timeout_s=spec.get("timeout_s", 30))
out = {"rank": rank, "results": []}
try:
    if rank == spec.get("absent"):
        os._exit(0)
    for n, dtype in spec["cases"]:
        for rep in range(spec.get("reps", 1)):
            strided = dtype.endswith(":strided")  # a non-contiguous view: reduced in place all the same
            t = ((rank + 1) * (torch.arange(n) % 7)).to(getattr(torch, dtype.removesuffix(":strided")))
            if strided:
                base = torch.zeros(2 * n, dtype=t.dtype)
                base[::2] = t
                t = base[::2]
            ar(t)
            if strided:
                t = base[::2].contiguous()
        out["results"].append({"n": n, "dtype": dtype, "values": t.float().tolist()[:50],
                               "sum": t.double().sum().item(), "bits": hashlib.sha1(t.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()})
except RuntimeError as e:
    out["error"] = str(e)
Path(f"{sys.argv[2]}.rank{rank}.json").write_text(json.dumps(out))
os._exit(0)
