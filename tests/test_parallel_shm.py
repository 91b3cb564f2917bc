"""The shared-memory all-reduce (parallel.allreduce=shm) on its own, under torchrun: exact sums counted by
hand, the same bits on every rank, chunking through a small slot, bf16, three ranks on two cores (the yielding
spin), many calls in a row (the double-buffered slots), and a peer that never arrives (a timeout, no hang)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specbench.parallel import shm

WORKER = Path(__file__).with_name("shm_worker.py")
pytestmark = pytest.mark.skipif(not shm.platform.machine() in ("x86_64", "AMD64"),
                                reason="the shared-memory all-reduce relies on x86-64 memory order")


def _run(tmp_path: Path, nproc: int, **spec) -> list[dict]:
    s = tmp_path / "spec.json"
    s.write_text(json.dumps(spec))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
                        str(WORKER), str(s), str(tmp_path / "out")], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    return [json.loads((tmp_path / f"out.rank{i}.json").read_text()) for i in range(nproc) if i != spec.get("absent")]


def _expected(n: int, world: int, first: int = 50) -> tuple[list[float], float]:
    total = sum(range(1, world + 1))  # (1 + ... + world)
    vals = [float(total * (i % 7)) for i in range(n)]
    return vals[:first], sum(vals)


@pytest.mark.parametrize("nproc", [2, 3])
def test_sums_counted_by_hand(tmp_path, nproc):
    # slot of 1 KiB: the 3000-element tensors go through in chunks (12 KB fp32, 6 KB bf16)
    cases = [[1, "float32"], [576, "float32"], [3000, "float32"], [3000, "bfloat16"], [5, "bfloat16"],
             [700, "float32:strided"]]
    ranks = _run(tmp_path, nproc, cases=cases, slot_bytes=1024)
    for got in ranks:
        assert "error" not in got
        for res, (n, _) in zip(got["results"], cases):
            first, total = _expected(n, nproc)
            assert res["values"] == first[:len(res["values"])], (n, res["dtype"])
            assert res["sum"] == total
    assert len({tuple(r["bits"] for r in g["results"]) for g in ranks}) == 1  # identical bits on every rank


def test_many_calls_in_a_row(tmp_path):
    """200 back-to-back calls: a slot is reused every second call, and a fast rank must not overwrite what a
    slow one still reads (the result of the last call is still exact)."""
    ranks = _run(tmp_path, 2, cases=[[64, "float32"]], reps=200)
    # the same tensor is refilled before each call, so the last result is one call's sum
    first, total = _expected(64, 2)
    for got in ranks:
        assert got["results"][0]["values"] == first and got["results"][0]["sum"] == total


def test_absent_peer_times_out(tmp_path):
    ranks = _run(tmp_path, 2, cases=[[16, "float32"]], absent=1, timeout_s=2)
    assert "did not arrive within parallel.timeout_s=2 s" in ranks[0]["error"]
    assert "[1]" in ranks[0]["error"]
