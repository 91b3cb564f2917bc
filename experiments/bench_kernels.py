"""Cost of one target forward of T new tokens (a decode step is T = 1, a chain verify k + 1, a tree verify 1 + N)
with PyTorch's matmuls (`model.linear=torch`) and specbench's CPU kernels (`auto`), in one process, interleaved
rounds, medians. This is what decides whether speculation can pay on a CPU: the verify/step ratio.

    python experiments/bench_kernels.py --dtypes bfloat16,float32 --tokens 1,2,4,8,16,24 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from specbench.models import cpu_kernels
from specbench.models.loading import load_model
from specbench.core.hw import cpu_has_fast_bf16, cpu_summary

OUT = Path(__file__).resolve().parent / "results"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--tokens", default="1,2,4,8,16,24")
    ap.add_argument("--context", type=int, default=200, help="cached tokens before the step")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tag", default="", help="suffix of the result files (e.g. the CPU kind): bench_kernels_<tag>")
    args = ap.parse_args()
    tokens = [int(t) for t in args.tokens.split(",")]
    rows, doc = [], {"cpu": cpu_summary(), "cpu_native_bf16": cpu_has_fast_bf16(), "threads": torch.get_num_threads(),
                     "torch": torch.__version__, "results": []}
    for name in args.dtypes.split(","):
        dtype = getattr(torch, name)
        m = load_model(None, dtype, torch.device("cpu")).model
        cache = m.new_cache(1, args.context + max(tokens) + 1)
        ms: dict[tuple[str, int], list[float]] = {}
        with torch.inference_mode():
            m(torch.randint(0, 1000, (1, args.context)), cache, kv_len=args.context)
            cache.seq_lens.fill_(args.context)
            for _ in range(args.rounds):
                for mode in ("torch", "auto"):
                    cpu_kernels.set_mode(mode)
                    for T in tokens:
                        x = torch.randint(0, 1000, (1, T))
                        m(x, cache, kv_len=args.context + T)  # warm
                        t = time.perf_counter()
                        m(x, cache, kv_len=args.context + T)
                        ms.setdefault((mode, T), []).append((time.perf_counter() - t) * 1e3)
        cpu_kernels.set_mode("auto")
        for mode in ("torch", "auto"):
            one = statistics.median(ms[(mode, 1)])
            for T in tokens:
                med = statistics.median(ms[(mode, T)])
                rows.append((name, mode, T, med, med / one))
                doc["results"].append({"dtype": name, "linear": mode, "tokens": T, "ms": med, "vs_1_token": med / one})
        for T in tokens:
            r = statistics.median(ms[("torch", T)]) / statistics.median(ms[("auto", T)])
            doc["results"].append({"dtype": name, "tokens": T, "torch_over_auto": r})
    doc["linear_choices"] = cpu_kernels.describe()["choices"]
    OUT.mkdir(exist_ok=True)
    stem = "bench_kernels" + (f"_{args.tag}" if args.tag else "")
    (OUT / f"{stem}.json").write_text(json.dumps(doc, indent=2))
    lines = ["| dtype | linear | tokens | ms / forward | vs 1 token |", "|---|---|---:|---:|---:|"]
    lines += [f"| {d} | {m} | {t} | {x:.1f} | {r:.2f} |" for d, m, t, x, r in rows]
    head = [f"CPU: {doc['cpu']['model']} ({', '.join(doc['cpu']['flags'])}), {doc['threads']} threads, "
            f"torch {doc['torch']}", ""]
    (OUT / f"{stem}.md").write_text("\n".join(head + lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
