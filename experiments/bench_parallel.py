"""Tensor and pipeline parallel decoding on this CPU: per-step compute vs communication, tp / pp against one
process, on the same prompts, in one run of this script.

Each layout is one real `torchrun -m specbench ...` job (gloo, one thread per rank; the single-process
reference runs with 1 and with all cores). From each job's results.json (target-only baseline and the
speculative run, ngram k=3 by default) it takes, per rank: the decode-step time, the time inside collectives by
kind (all-reduce, p2p, broadcast), and derives compute = step - collectives. On gloo every collective blocks, so
time in a collective is transfer plus waiting for the slowest peer. A second torchrun job times the same
collectives called back to back by both ranks (pure transfer, `--collectives`), which splits the
collective time into transfer and waiting (the pipeline bubble, load imbalance).

Targets: the embedded SmolLM2-135M (9 heads / 3 KV heads: tp=3 splits it, tp=2 does not) and, for tp=2, a
random-weight model of the same size with 8 / 4 heads (head_dim 72, the same matrices otherwise), built once
under the cache dir. Its outputs are meaningless; its step costs are those of a 135M model.

Reproduce (writes experiments/results/bench_parallel.md and .json; ~8 min here):
    python experiments/bench_parallel.py --limit 2 --max-new-tokens 32
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results"

# (label, target, tp, pp, threads per rank, parallel.allreduce)
LAYOUTS = [
    ("tp1 (1 thread)", "embedded", 1, 1, 1, "auto"),
    ("tp1 (2 threads)", "embedded", 1, 1, 2, "auto"),
    ("pp2", "embedded", 1, 2, 1, "auto"),
    ("tp3 shm (3 ranks, 2 cores)", "embedded", 3, 1, 1, "shm"),
    ("tp3 gloo (3 ranks, 2 cores)", "embedded", 3, 1, 1, "gloo"),
    ("tp1 (1 thread)", "heads8", 1, 1, 1, "auto"),
    ("tp1 (2 threads)", "heads8", 1, 1, 2, "auto"),
    ("tp2 shm", "heads8", 2, 1, 1, "shm"),
    ("tp2 gloo", "heads8", 2, 1, 1, "gloo"),
    ("pp2", "heads8", 1, 2, 1, "auto"),
]


SHAPES = {
    # SmolLM2-135M with 8 query / 4 KV heads of 72 dims, so that tp=2 splits it; the same matrices otherwise
    "heads8": dict(num_attention_heads=8, num_key_value_heads=4, head_dim=72),
    # Llama-3.1-8B's layer shapes (the vocabulary is the embedded tokenizer's, so outputs decode)
    "llama8b": dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
                    head_dim=128, rope_theta=500000.0, tie_word_embeddings=False, max_position_embeddings=8192),
}


def random_target(shape: str, layers: int | None, device: str, base: str | None) -> Path:
    """An HF folder with the config of `base` (an HF folder with config.json and the tokenizer; default the
    embedded model) changed to `shape`, random weights, and base's tokenizer (built once)."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from specbench.models.loading import cache_root, resolve_folder

    out = cache_root() / "bench" / f"random-{shape}-{layers or 'all'}"
    if (out / "config.json").is_file():
        return out
    folder = Path(base) if base else resolve_folder(None)[0]
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(SHAPES[shape])
    if layers:
        cfg["num_hidden_layers"] = layers
    cfg.pop("architectures", None)
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    with torch.device(device):
        model = LlamaForCausalLM(LlamaConfig(**cfg)).to(dtype)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out), safe_serialization=True)
    AutoTokenizer.from_pretrained(str(folder)).save_pretrained(str(out))
    del model
    return out


def run_layout(target: str, tp: int, pp: int, threads: int, allreduce: str, args, work: Path) -> dict:
    world = tp * pp
    run_dir = work / f"{Path(target).name}-tp{tp}-pp{pp}-t{threads}-{allreduce}"
    cli = ["-m", "specbench", f"method={args.method}", f"k={args.k}", f"dataset.limit={args.limit}",
           f"max_new_tokens={args.max_new_tokens}", f"dtype={args.dtype}", "progress=false", f"threads={threads}",
           f"parallel.tp={tp}", f"parallel.pp={pp}", f"hydra.run.dir={run_dir}", f"device={args.device}",
           f"model.attention={args.attention}", f"parallel.allreduce={allreduce}"]
    if args.device == "cuda":  # queued collectives: synchronise around each so their time is exact
        cli.append("parallel.sync_timing=true")
    if target != "embedded":
        cli.append(f"model.path={target}")
    if world > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(world), *cli]
    else:
        cmd = [sys.executable, *cli]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"layout tp={tp} pp={pp} failed:\n{r.stderr[-3000:]}")
    doc = json.loads((run_dir / "results.json").read_text())
    doc["_job_s"] = time.perf_counter() - t0
    return doc


def per_rank(doc: dict) -> dict[str, list[dict]]:
    """For the baseline and the speculative run: each rank's steps, step time and collective time by kind."""
    out = {}
    for name, steps in (("baseline", doc["baseline"]["target_steps"]), ("speculative", doc["totals"]["target_steps"])):
        rows = []
        if "parallel" in doc:
            for r in doc["parallel"]["ranks"]:
                c = r["comm"][name]
                rows.append({"rank": r["rank"], "stage": r["stage"], "tp_rank": r["tp_rank"],
                             "step_s": c["timing"]["step_s"], "comm": c["seconds"], "calls": c["calls"],
                             "bytes": c["bytes"]})
        else:
            t = doc["baseline"]["timing"] if name == "baseline" else doc["timing"]
            rows.append({"rank": 0, "stage": 0, "tp_rank": 0, "step_s": t["step_s"], "comm": {}, "calls": {},
                         "bytes": {}})
        out[name] = {"steps": steps, "ranks": rows}
    return out


# ------------------------------------------------------------------------------- aligned collective costs
def collectives_worker(spec: dict) -> None:
    """Under torchrun: the median time of each (kind, bytes) collective called back to back by every rank, i.e.
    with no rank waiting for another's compute: the cost of the message itself on this machine."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    from specbench.parallel.shm import ShmAllReduce

    fast = ShmAllReduce(dist.group.WORLD, 60.0)
    res = {}
    for kind, nbytes in spec["sizes"]:
        t = torch.zeros(max(1, nbytes // 4))
        dist.barrier()
        times = []
        for i in range(spec["reps"] + 5):  # back to back: after the first few calls the ranks run in lockstep
            t0 = time.perf_counter()
            if kind == "all_reduce":
                dist.all_reduce(t)
            elif kind == "all_reduce_shm":
                fast(t)
            elif kind == "broadcast":
                dist.broadcast(t, world - 1)
            else:  # p2p: rank 0 -> 1 and back (one boundary each way), half the round trip
                if rank == 0:
                    dist.send(t, 1)
                    dist.recv(t, 1)
                elif rank == 1:
                    dist.recv(t, 0)
                    dist.send(t, 0)
            times.append(time.perf_counter() - t0)
        times = sorted(times[5:])
        res[f"{kind}:{nbytes}"] = times[len(times) // 2] / (2 if kind == "p2p" else 1)
    if rank == 0:
        Path(spec["out"]).write_text(json.dumps(res))
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)


def aligned_costs(sizes: set[tuple[str, int]], work: Path, reps: int = 200) -> dict[str, float]:
    spec = {"sizes": sorted(sizes), "reps": reps, "out": str(work / "collectives.json")}
    (work / "collectives_spec.json").write_text(json.dumps(spec))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", __file__,
           "--collectives", str(work / "collectives_spec.json")]
    r = subprocess.run(cmd, cwd=work, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"collective timing failed:\n{r.stderr[-3000:]}")
    return json.loads((work / "collectives.json").read_text())


def _kind(doc: dict, kind: str) -> str:
    """The collective as timed by --collectives: an all-reduce through shared memory is its own kind."""
    return "all_reduce_shm" if kind == "all_reduce" and doc.get("parallel", {}).get("allreduce") == "shm" else kind


# ---------------------------------------------------------------------------------------------- the table
def summarise(label: str, target: str, doc: dict, costs: dict[str, float]) -> list[dict]:
    rows = []
    for name, part in per_rank(doc).items():
        steps = part["steps"]
        for r in part["ranks"]:
            comm = sum(r["comm"].values())
            transfer = 0.0
            for kind, calls in r["calls"].items():
                if kind == "object" or not calls:
                    continue
                per_call = costs.get(f"{_kind(doc, kind)}:{r['bytes'][kind] // calls}")
                transfer += (per_call or 0.0) * calls
            transfer = min(transfer, comm)
            rows.append({"target": target, "layout": label, "run": name, "tp": doc["config"]["tp"],
                         "pp": doc["config"]["pp"], "rank": r["rank"], "steps": steps,
                         "step_ms": 1e3 * r["step_s"] / steps, "compute_ms": 1e3 * (r["step_s"] - comm) / steps,
                         "comm_ms": 1e3 * comm / steps, "transfer_ms": 1e3 * transfer / steps,
                         "wait_ms": 1e3 * (comm - transfer) / steps,
                         "comm_by_kind_ms": {k: 1e3 * v / steps for k, v in r["comm"].items()},
                         "calls_per_step": {k: v / steps for k, v in r["calls"].items()},
                         "sync_fraction": comm / r["step_s"] if r["step_s"] else 0.0,
                         "tokens_per_s": (doc["baseline"]["tokens_per_s"] if name == "baseline"
                                          else doc["totals"]["tokens_per_s"]),
                         "outputs_match_baseline": doc["outputs_match_baseline"]})
    return rows


def markdown(rows: list[dict], meta: dict) -> str:
    where = f"{meta['gpus']}× {meta['gpu']}" if meta.get("gpu") else f"{meta['cpu']}, {meta['cores']} cores"
    lines = [f"# Parallel decoding: compute vs communication per step ({where})", "",
             f"`{meta['command']}` — torch {meta['torch']}, {meta['dtype']}, method={meta['method']} k={meta['k']}, "
             f"{meta['limit']} built-in prompts × {meta['max_new_tokens']} tokens, batch 1. Per rank, per decode "
             "step (ms): step = compute + collectives; collectives = transfer (calls × the median cost of the "
             "same collective called back to back by both ranks) + wait (for the slowest peer's compute).", "",
             "| target | layout | run | rank | tokens/s | step ms | compute ms | collectives ms | transfer | wait "
             "| sync share | by kind (ms/step) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        kinds = ", ".join(f"{k} {v:.2f}" for k, v in sorted(r["comm_by_kind_ms"].items()) if k != "object")
        lines.append(f"| {r['target']} | {r['layout']} | {r['run']} | {r['rank']} | {r['tokens_per_s']:.1f} | "
                     f"{r['step_ms']:.1f} | {r['compute_ms']:.1f} | {r['comm_ms']:.1f} | {r['transfer_ms']:.2f} | "
                     f"{r['wait_ms']:.1f} | {100 * r['sync_fraction']:.0f}% | {kinds or '-'} |")
    if not meta["aligned"]:
        lines += ["", "No transfer/wait split here: on CUDA (`parallel.sync_timing=true`) a collective's time is the "
                  "synchronised collective, waiting for the peers included."]
        return "\n".join(lines) + "\n"
    lines += ["", "Collective cost with no waiting (gloo; all_reduce_shm = parallel.allreduce=shm; 2 ranks, 1 thread "
              "each, median µs per call; bytes = the run's mean per call):", "",
              "| collective | bytes | µs |", "|---|---|---|"]
    for key, s in sorted(meta["aligned"].items()):
        kind, nbytes = key.split(":")
        lines.append(f"| {kind} | {nbytes} | {1e6 * s:.0f} |")
    lines += ["", "tp3 runs 3 ranks on 2 cores and its transfer column uses the 2-rank costs: a lower bound."]
    return "\n".join(lines) + "\n"


def parse_layout(name: str) -> tuple[int, int]:
    """"tp2" -> (2, 1), "pp2" -> (1, 2), "tp2xpp2" -> (2, 2), "tp1" -> (1, 1)."""
    tp = pp = 1
    for part in name.split("x"):
        if part.startswith("tp") and part[2:].isdigit():
            tp = int(part[2:])
        elif part.startswith("pp") and part[2:].isdigit():
            pp = int(part[2:])
        else:
            sys.exit(f"--layouts: {name!r} is not tpT, ppP or tpTxppP")
    return tp, pp


def cpu_name() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        name = next((ln.split(":", 1)[1].strip() for ln in out.splitlines() if ln.startswith("Model name")), "")
        flags = next((ln for ln in out.splitlines() if ln.startswith("Flags")), "")
        kind = "AMX" if "amx_bf16" in flags else "AVX512-BF16" if "avx512_bf16" in flags else "AVX2"
        return f"{name or platform.processor()}, {kind}"
    except OSError:
        return platform.processor()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--method", default="ngram")
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--limit", type=int, default=2, help="built-in prompts (dataset.limit)")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--targets", default="embedded,heads8",
                    help="comma list of: embedded, heads8 (CPU layouts), or one of " + ", ".join(SHAPES)
                    + " with --layouts")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--attention", default="auto", help="model.attention: auto | sdpa | flash")
    ap.add_argument("--layouts", help="comma list of tpT or ppP or tpTxppP (default: this CPU's table)")
    ap.add_argument("--layers", type=int, help="layers of a random target (default: the embedded model's)")
    ap.add_argument("--base", help="HF folder whose config.json and tokenizer a random target starts from "
                    "(default: the embedded model's)")
    ap.add_argument("--out", help="folder for the result files (default experiments/results)")
    ap.add_argument("--collectives", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.collectives:
        collectives_worker(json.loads(Path(args.collectives).read_text()))
        return
    wanted = args.targets.split(",")
    if args.layouts:
        layouts = [(name, target, *parse_layout(name), 1, "auto") for target in wanted
                   for name in args.layouts.split(",")]
    else:
        layouts = [row for row in LAYOUTS if row[1] in wanted]
    paths = {t: "embedded" if t == "embedded" else str(random_target(t, args.layers, args.device, args.base))
             for t in wanted}
    docs = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for label, target, tp, pp, threads, allreduce in layouts:
            print(f"[bench_parallel] {target}: {label}", flush=True)
            docs.append((label, target, run_layout(paths[target], tp, pp, threads, allreduce, args, work)))
        sizes = set()
        for _, _, doc in docs:
            for part in per_rank(doc).values():
                for r in part["ranks"]:
                    sizes |= {(_kind(doc, k), r["bytes"][k] // c) for k, c in r["calls"].items()
                              if k != "object" and c}
        costs = aligned_costs(sizes, work) if sizes and args.device == "cpu" else {}
    rows = [row for label, target, doc in docs for row in summarise(label, target, doc, costs)]
    gpu = torch.cuda.get_device_name() if args.device == "cuda" else None
    meta = {"cpu": cpu_name(), "gpu": gpu, "gpus": torch.cuda.device_count() if gpu else 0, "cores": os.cpu_count(), "torch": torch.__version__, "dtype": args.dtype,
            "method": args.method, "k": args.k, "limit": args.limit, "max_new_tokens": args.max_new_tokens,
            "aligned": costs, "command": "python experiments/bench_parallel.py " + " ".join(sys.argv[1:])}
    out = Path(args.out) if args.out else RESULTS
    out.mkdir(parents=True, exist_ok=True)
    stem = "bench_parallel" + ("_cuda" if gpu else "")
    (out / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    md = markdown(rows, meta)
    (out / f"{stem}.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
