"""Autoregressive (target-only, greedy) CPU benchmark: specbench's native loop vs HF `generate`.

For the embedded SmolLM2-135M-Instruct target, in each dtype (float32, bfloat16) and batch size, one process:
  * native tok/s: `specbench.engine.loop.Engine` (batch_size=B), new tokens summed over requests / wall time
    (prefills included);
  * HF tok/s: `transformers` `generate(do_sample=False)` on the same converted weights (`loaded.path`) and the
    same prompt token ids, B prompts per call, left-padded with an attention mask; only the new tokens up to
    and including the first EOS count;
  * weight-streaming floor: one pass of `F.linear` over every unfused HF weight matrix (q, k, v, o, gate, up,
    down per layer, plus the tied lm_head) on a [1, 1, in] input; median of --floor-reps passes, as ms/step
    and 1000/ms tok/s;
  * native decode step time: TPOT p50 from `specbench.metrics.results.latency`, and its ratio to the floor;
  * greedy agreement: how many prompts give token-identical outputs native vs HF (batch 1 is the one that
    should match; batched HF uses padding and may differ numerically).
Batch 1 uses --prompts builtin prompts; batch B uses B prompts (the builtin set repeated to reach B).
Each configuration is warmed up once; then --rounds rounds run every (dtype, batch) with the native/HF order
alternating per round, and the floor re-measured per round, so drift hits both sides; figures are medians
over rounds, ratios are taken within a round first.

Reproduce (writes experiments/results/bench_ar.md and bench_ar.json):
    python experiments/bench_ar.py --max-new-tokens 64 --prompts 8 --dtypes float32,bfloat16 --batches 1,8,32
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
import transformers

from specbench.data.prompts import builtin_prompts, to_requests
from specbench.engine.loop import Engine, StopCriteria
from specbench.core.request import Request
from specbench.core.sampling import SamplingParams
from specbench.metrics.results import latency
from specbench.models.loading import LoadedModel, load_model

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass
class Run:
    wall_s: float
    outputs: list[list[int]]
    tpot_p50_ms: float | None = None
    itl_p50_ms: float | None = None  # median gap between steps: a pure step time at any batch

    @property
    def tokens_per_s(self) -> float:
        return sum(map(len, self.outputs)) / self.wall_s


def make_requests(n: int, tokenizer) -> list[Request]:
    """n requests from the builtin prompts (repeated as needed, ids kept unique for the engine)."""
    base = to_requests(builtin_prompts(), tokenizer)
    return [Request(id=f"{i}:{base[i % len(base)].id}", prompt=base[i % len(base)].prompt,
                    prompt_ids=list(base[i % len(base)].prompt_ids), category=base[i % len(base)].category)
            for i in range(n)]


def run_native(loaded: LoadedModel, reqs: list[Request], batch: int, max_new: int) -> Run:
    tok = loaded.tokenizer
    engine = Engine(loaded.model, tok, batch_size=batch, params=SamplingParams(), progress=False,
                    stop=StopCriteria(frozenset({tok.eos_token_id}), max_new))
    t0 = time.perf_counter()
    results = engine.run(reqs)
    wall = time.perf_counter() - t0
    lat = latency(results)
    return Run(wall, [list(r.output_ids) for r in results], lat["tpot_ms"]["p50"], lat["itl_ms"]["p50"])


def hf_batches(tokenizer, reqs: list[Request], batch: int) -> list[dict[str, torch.Tensor]]:
    """Left-padded input_ids + attention_mask, `batch` requests per generate call (built before timing)."""
    tokenizer.padding_side = "left"
    return [dict(tokenizer.pad({"input_ids": [r.prompt_ids for r in reqs[i:i + batch]]}, padding=True,
                               return_tensors="pt")) for i in range(0, len(reqs), batch)]


def trim_eos(row: list[int], eos: int) -> list[int]:
    return row[: row.index(eos) + 1] if eos in row else row


@torch.inference_mode()
def run_hf(model, tokenizer, batches: list[dict[str, torch.Tensor]], max_new: int) -> Run:
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    outputs: list[list[int]] = []
    t0 = time.perf_counter()
    for enc in batches:
        out = model.generate(**enc, do_sample=False, max_new_tokens=max_new, eos_token_id=eos, pad_token_id=pad)
        outputs += [trim_eos(row, eos) for row in out[:, enc["input_ids"].shape[1]:].tolist()]
    return Run(time.perf_counter() - t0, outputs)


@torch.inference_mode()
def floor_ms(weights: list[torch.Tensor], reps: int) -> float:
    """Median time (ms) of one F.linear pass over all weight matrices with a [1, 1, in] input."""
    xs = {w.shape[1]: torch.randn(1, 1, w.shape[1], dtype=w.dtype) for w in weights}
    times = []
    for i in range(reps + 2):  # the first two passes are warm-up
        t0 = time.perf_counter()
        for w in weights:
            F.linear(xs[w.shape[1]], w)
        if i >= 2:
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def med(xs: list[float | None]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt(x: float | None, spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=8, help="builtin prompts at batch 1")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds (native/HF order alternates)")
    ap.add_argument("--floor-reps", type=int, default=20)
    ap.add_argument("--out", default="experiments/results/bench_ar.md")
    args = ap.parse_args()
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    batches = [int(b) for b in args.batches.split(",") if b.strip()]
    cpu = torch.device("cpu")
    transformers.utils.logging.disable_progress_bar()

    models: dict[str, tuple[LoadedModel, torch.nn.Module, list[torch.Tensor]]] = {}
    for name in dtypes:
        loaded = load_model(None, DTYPES[name], cpu)
        hf = transformers.AutoModelForCausalLM.from_pretrained(loaded.path, dtype=DTYPES[name]).eval()
        mats = [m.weight for m in hf.modules() if isinstance(m, torch.nn.Linear)]
        assert len(mats) == 7 * hf.config.num_hidden_layers + 1, f"unexpected linear count {len(mats)}"
        models[name] = (loaded, hf, mats)
    tok = next(iter(models.values()))[0].tokenizer
    reqs = {b: make_requests(args.prompts if b == 1 else b, tok) for b in batches}
    enc = {b: hf_batches(tok, reqs[b], b) for b in batches}

    for name, (loaded, hf, _) in models.items():  # warm-up: one short run of every configuration
        for b in batches:
            run_native(loaded, reqs[b][:b], b, 4)
            run_hf(hf, tok, enc[b][:1], 4)

    rows: dict[tuple[str, int], list[dict]] = {(d, b): [] for d in dtypes for b in batches}
    floors: dict[str, list[float]] = {d: [] for d in dtypes}
    outputs: dict[tuple[str, int], tuple[list[list[int]], list[list[int]]]] = {}
    for r in range(args.rounds):
        for name, (loaded, hf, mats) in models.items():
            floors[name].append(fl := floor_ms(mats, args.floor_reps))
            for b in batches:
                if r % 2 == 0:
                    nat = run_native(loaded, reqs[b], b, args.max_new_tokens)
                    ref = run_hf(hf, tok, enc[b], args.max_new_tokens)
                else:
                    ref = run_hf(hf, tok, enc[b], args.max_new_tokens)
                    nat = run_native(loaded, reqs[b], b, args.max_new_tokens)
                outputs.setdefault((name, b), (nat.outputs, ref.outputs))
                rows[(name, b)].append({
                    "native_tok_s": nat.tokens_per_s, "hf_tok_s": ref.tokens_per_s,
                    "native_over_hf": nat.tokens_per_s / ref.tokens_per_s, "floor_ms": fl,
                    "native_tpot_p50_ms": nat.tpot_p50_ms, "native_itl_p50_ms": nat.itl_p50_ms,
                    "step_over_floor": nat.tpot_p50_ms / fl if nat.tpot_p50_ms else None,
                    "native_tokens": sum(map(len, nat.outputs)), "hf_tokens": sum(map(len, ref.outputs)),
                })
                print(f"round {r} {name} b={b}: native {nat.tokens_per_s:.1f} tok/s, hf {ref.tokens_per_s:.1f}"
                      f" tok/s, tpot p50 {fmt(nat.tpot_p50_ms, '.2f')} ms, floor {fl:.2f} ms", file=sys.stderr)

    summary = []
    for (name, b), rs in rows.items():
        nat_out, hf_out = outputs[(name, b)]
        summary.append({"dtype": name, "batch": b, "requests": len(reqs[b]),
                        **{k: med([x[k] for x in rs]) for k in rs[0]},
                        "match": sum(a == c for a, c in zip(nat_out, hf_out)), "rounds": rs})
    floor = {d: {"ms": statistics.median(v), "tok_s": 1000 / statistics.median(v), "rounds": v,
                 "matrices": len(models[d][2]), "weight_mb": sum(w.numel() * w.element_size()
                                                                 for w in models[d][2]) / 2**20}
             for d, v in floors.items()}

    md = [
        "# AR decode benchmark: specbench native loop vs transformers generate (CPU)", "",
        f"Model: {next(iter(models.values()))[0].name}; torch {torch.__version__}, transformers "
        f"{transformers.__version__}, {torch.get_num_threads()} threads, {platform.processor() or platform.machine()}; "
        f"max_new_tokens={args.max_new_tokens}, rounds={args.rounds} (medians), greedy.", "",
        f"Command: `python {' '.join(sys.argv)}`", "",
        "## Weight-streaming floor (F.linear over all unfused matrices, [1,1,in] input)", "",
        "| dtype | matrices | weights MiB | floor ms/step | floor tok/s |", "|---|---:|---:|---:|---:|",
        *[f"| {d} | {f['matrices']} | {f['weight_mb']:.0f} | {f['ms']:.2f} | {f['tok_s']:.1f} |"
          for d, f in floor.items()], "",
        "## Throughput (tokens/s summed over requests, prefill included)", "",
        "| dtype | batch | requests | native tok/s | HF tok/s | native/HF | native TPOT p50 ms | step/floor "
        "| native ITL p50 ms | tokens native/HF | identical outputs |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        *[f"| {s['dtype']} | {s['batch']} | {s['requests']} | {fmt(s['native_tok_s'])} | {fmt(s['hf_tok_s'])} | "
          f"{fmt(s['native_over_hf'], '.2f')} | {fmt(s['native_tpot_p50_ms'], '.2f')} | "
          f"{fmt(s['step_over_floor'], '.2f')} | {fmt(s['native_itl_p50_ms'], '.2f')} | {s['native_tokens']:.0f}/{s['hf_tokens']:.0f} | "
          f"{s['match']}/{s['requests']} |" for s in summary], "",
        "native/HF and step/floor are medians of per-round ratios (each round measures both sides back to back). "
        "step/floor = TPOT p50 / floor. At batch > 1 a request's TPOT also spans the prefills of requests admitted "
        "after it (short runs inflate it); ITL p50 (median gap between steps) is the plain step time. "
        "Identical outputs: greedy token ids equal native vs HF (batch 1 is the exact check; batched HF pads).",
    ]
    text = "\n".join(md) + "\n"
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    meta = {"argv": sys.argv, "torch": torch.__version__, "transformers": transformers.__version__,
            "threads": torch.get_num_threads(), "cpu": platform.processor() or platform.machine()}
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "args": vars(args), "floor": floor,
                                                    "results": summary}, indent=2))
    print(text)


if __name__ == "__main__":
    main()
