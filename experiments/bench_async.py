"""Async scheduling vs the synchronous loop: TPOT / ITL (mean, P99), tokens/s and where the host bookkeeping goes.

Each cell (method x batch x mode) is a real `specbench.run.run` in ONE process (the target loaded once), the
modes alternating within each round (sync, async, then async, sync, ...) so machine drift falls on both; the
table keeps each cell's median over rounds. Per run, from results.json:
  host_s         the bookkeeping of every step (read the step's tokens, stop conditions, detokenise, metrics)
  host_critical  the part of it the next step waited for (sync: all of it; async: only what the main thread
                 waited for after launching the next step)
  hand-off       async only: the main thread's time handing each step to the worker thread and collecting it
  host share     host_critical / wall: the share of the run in which the compute sat idle for the host

CPU (default): the embedded SmolLM2-135M on MT-bench first turns (2 per category), bf16 where the CPU has
native bf16, the shipped drafters, real acceptance, greedy:
    python experiments/bench_async.py --methods ngram,draft_model,eagle3 --batches 1,4 --rounds 2
GPU (experiments/gpu/async.sh runs this): random-weight Llama-3.1-8B shapes and a random 2-layer draft model of
Llama-3.2-1B's width, synthetic acceptance at fixed per-position rates, so the loop and system costs are those
of a real deployment without a trained drafter:
    python experiments/bench_async.py --device cuda --target llama8b --draft llama1b2 --synthetic 0.8,0.6,0.4
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))
DATA = Path(os.environ.get("SPECBENCH_DATA", ROOT.parent / "shared" / "data"))

DRAFT_SHAPES = {  # random draft models with the target's tokenizer (bench_parallel's random_target builds them)
    "llama1b2": dict(hidden_size=2048, intermediate_size=8192, num_attention_heads=32, num_key_value_heads=8,
                     head_dim=64, rope_theta=500000.0, tie_word_embeddings=False, max_position_embeddings=8192,
                     num_hidden_layers=2),
}


def compose(overrides: list[str]):
    from hydra import compose as hc, initialize_config_dir

    from specbench.cli import CONF_DIR
    from specbench.config import register

    register()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return hc("config", overrides=overrides)


def one_run(overrides: list[str], work: Path) -> dict:
    from specbench.run import run

    work.mkdir(parents=True, exist_ok=True)
    cwd = os.getcwd()
    os.chdir(work)  # outside Hydra, results.json goes to the working directory
    try:
        doc = run(compose(overrides))
    finally:
        os.chdir(cwd)
    t, lat = doc["timing"], doc["latency"]
    wall = doc["totals"]["wall_s"]
    return {"tok_s": doc["totals"]["tokens_per_s"], "wall_s": wall, "steps": doc["totals"]["target_steps"],
            "tau": doc["acceptance"]["mean_acceptance_length"],
            "tpot_mean": lat["tpot_ms"]["mean"], "tpot_p99": lat["tpot_ms"]["p99"],
            "itl_mean": lat["itl_ms"]["mean"], "itl_p99": lat["itl_ms"]["p99"],
            "host_ms": t["host_s"] * 1e3, "host_critical_ms": t["host_critical_s"] * 1e3,
            "handoff_ms": t["host_handoff_s"] * 1e3, "host_share": t["host_critical_s"] / wall,
            "discarded": doc["scheduling"]["discarded_rows"],
            "outputs": [(r["text"], r["accepted_per_step"]) for r in doc["requests"]]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", default="ngram,draft_model,eagle3")
    ap.add_argument("--batches", default="1,4")
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--per-category", type=int, default=2, help="MT-bench first turns per category (8 categories)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--target", default="embedded", help="embedded, or a random target of a bench_parallel shape")
    ap.add_argument("--layers", type=int, default=None, help="random target: layers (default: the shape's)")
    ap.add_argument("--draft", default=None, help="random draft model shape for method=draft_model (GPU runs)")
    ap.add_argument("--synthetic", default=None, help="acceptance=synthetic at these per-position rates, e.g. 0.8,0.6,0.4")
    ap.add_argument("--attention", default="auto")
    ap.add_argument("--stop", default=None, help="comma-separated stop strings (each kept token is detokenised)")
    ap.add_argument("--base", default=None, help="HF folder with config.json + tokenizer for random targets")
    ap.add_argument("--tag", default="cpu")
    ap.add_argument("--out", default=str(ROOT / "experiments" / "results"))
    args = ap.parse_args()

    from bench_parallel import SHAPES, random_target
    from specbench.core.hw import cpu_summary

    SHAPES.update(DRAFT_SHAPES)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = out / f"bench_async_{args.tag}_runs"
    base = [f"k={args.k}", f"max_new_tokens={args.max_new_tokens}", f"dtype={args.dtype}", f"device={args.device}",
            "progress=false", "baseline=false", "dataset=jsonl", f"dataset.path={DATA / 'mt_bench' / 'question.jsonl'}",
            f"dataset.per_category={args.per_category}", f"model.attention={args.attention}"]
    if args.threads:
        base.append(f"threads={args.threads}")
    if args.target != "embedded":
        base.append(f"model.path={random_target(args.target, args.layers, args.device, args.base)}")
    if args.stop:
        base.append(f"stop=[{args.stop}]")
    if args.synthetic:
        base += ["acceptance=synthetic", f"synthetic.rates=[{args.synthetic}]"]
    methods = args.methods.split(",")
    extra = {m: [] for m in methods}
    if args.draft:
        extra["draft_model"] = [f"method.drafter.path={random_target(args.draft, None, args.device, args.base)}"]
    cells: dict[tuple, list[dict]] = {}
    t0 = time.perf_counter()
    for rnd in range(args.rounds):
        for m in methods:
            for b in [int(x) for x in args.batches.split(",")]:
                modes = (False, True) if rnd % 2 == 0 else (True, False)
                for a in modes:
                    name = f"{m}-b{b}-{'async' if a else 'sync'}-r{rnd}"
                    r = one_run([*base, f"method={m}", f"batch_size={b}", f"parallel.async={str(a).lower()}",
                                 *extra[m]], work / name)
                    cells.setdefault((m, b, a), []).append(r)
                    print(f"[{time.perf_counter() - t0:6.0f}s] {name}: {r['tok_s']:.1f} tok/s, TPOT "
                          f"{r['tpot_mean']:.1f} ms, host {r['host_ms']:.0f} ms ({r['host_critical_ms']:.0f} critical)",
                          flush=True)
    rows = []
    for (m, b, a), runs in cells.items():
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0] if k not in ("outputs", "tau")}
        med["tau"] = runs[0]["tau"]
        same = all(r["outputs"] == cells[(m, b, False)][0]["outputs"] for r in runs)
        rows.append({"method": m, "batch": b, "async": a, "runs": len(runs), "outputs_equal_sync": same, **med})
    doc = {"cpu": cpu_summary() if args.device == "cpu" else None, "torch": torch.__version__,
           "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu", "args": vars(args),
           "threads": torch.get_num_threads(), "rows": rows}
    (out / f"bench_async_{args.tag}.json").write_text(json.dumps(doc, indent=2))
    lines = [f"# Async scheduling vs sync ({doc['device']}, {args.target}, {args.methods}, k={args.k}, "
             f"{args.max_new_tokens} tokens, {args.rounds} rounds, medians)", "",
             "| method | batch | mode | tok/s | TPOT mean / P99 ms | ITL mean / P99 ms | steps | host ms "
             "| on critical path ms | hand-off ms | host share of wall | async/sync TPOT | outputs = sync |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in sorted(rows, key=lambda r: (r["method"], r["batch"], r["async"])):
        s = next(x for x in rows if (x["method"], x["batch"], x["async"]) == (r["method"], r["batch"], False))
        ratio = r["tpot_mean"] / s["tpot_mean"]
        lines.append(f"| {r['method']} | {r['batch']} | {'async' if r['async'] else 'sync'} | {r['tok_s']:.1f} | "
                     f"{r['tpot_mean']:.1f} / {r['tpot_p99']:.1f} | {r['itl_mean']:.1f} / {r['itl_p99']:.1f} | "
                     f"{r['steps']:.0f} | {r['host_ms']:.1f} | {r['host_critical_ms']:.1f} | {r['handoff_ms']:.1f} | "
                     f"{100 * r['host_share']:.3f} % | "
                     f"{ratio:.3f} | {r['outputs_equal_sync']} |")
    (out / f"bench_async_{args.tag}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
