"""Speculative decoding peers (CPU, batch 1, greedy): specbench vs transformers on the same target, draft
model and prompts, in one process.

  * ngram:       specbench method=ngram            vs  generate(prompt_lookup_num_tokens=k, max_matching_ngram_size=n)
  * draft_model: specbench method=draft_model      vs  generate(assistant_model=draft, constant k, no confidence cut)
  * target-only: specbench method=none             vs  generate()                 (the reference for speedups)

Reports tokens/s, the specbench/transformers ratio per method, mean acceptance length (specbench's counters;
for transformers: new tokens per target forward, counted with a forward hook), and whether greedy outputs are
token-identical (to each other and to target-only decoding). Rounds alternate the order of the two sides.

The draft model defaults to the target's first --draft-layers layers + final norm + head (an untrained cut,
built once under the cache dir), or --draft PATH (an HF folder sharing the tokenizer).

Reproduce (writes experiments/results/bench_peers.md and .json):
    python experiments/bench_peers.py --dtype bfloat16 --limit 8 --max-new-tokens 128 --k 4
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import transformers

from specbench.data.prompts import load_prompts, to_requests
from specbench.drafters.draft_model import DraftModelDrafter
from specbench.drafters.ngram import NgramDrafter
from specbench.engine.loop import Engine, StopCriteria
from specbench.core.sampling import SamplingParams
from specbench.metrics.results import AcceptanceStats
from specbench.models.loading import cache_root, hf_state_dict, load_model

MT_BENCH = Path(__file__).resolve().parents[2] / "shared" / "data" / "mt_bench" / "question.jsonl"


def cut_draft(loaded, layers: int) -> Path:
    """HF folder with the target's first `layers` layers, final norm and (tied) head."""
    from safetensors.torch import save_file

    out = cache_root() / "drafts" / f"{Path(loaded.path).name}-cut{layers}"
    if (out / "config.json").is_file():
        return out
    out.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((Path(loaded.path) / "config.json").read_text())
    cfg["num_hidden_layers"] = layers
    sd = {k: v.float().contiguous() for k, v in hf_state_dict(loaded.model).items()
          if not k.startswith("model.layers.") or int(k.split(".")[2]) < layers}
    save_file(sd, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    loaded.tokenizer.save_pretrained(str(out))
    return out


class ForwardCounter:
    def __init__(self, module: torch.nn.Module) -> None:
        self.n = 0
        module.register_forward_hook(lambda *_: setattr(self, "n", self.n + 1))


def run_specbench(loaded, reqs, drafter, k, max_new):
    tok = loaded.tokenizer
    e = Engine(loaded.model, tok, batch_size=1, stop=StopCriteria(frozenset({tok.eos_token_id}), max_new),
               params=SamplingParams(), progress=False, drafter=drafter, k=k)
    t0 = time.perf_counter()
    res = e.run(reqs)
    wall = time.perf_counter() - t0
    acc = AcceptanceStats.from_results(res, k).summary()
    n = sum(r.num_new_tokens for r in res)
    return {"tok_s": n / wall, "tokens": n, "outputs": [r.output_ids for r in res],
            "tau": acc["mean_acceptance_length"], "tokens_per_forward": n / max(1, e.num_steps + len(res))}


@torch.inference_mode()
def run_hf(hf, counter, reqs, tok, max_new, **gen_kw):
    outs, n = [], 0
    counter.n = 0
    t0 = time.perf_counter()
    for r in reqs:
        ids = torch.tensor([r.prompt_ids])
        g = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new,
                        eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id, **gen_kw)
        row = g[0, ids.shape[1]:].tolist()
        row = row[: row.index(tok.eos_token_id) + 1] if tok.eos_token_id in row else row
        outs.append(row)
        n += len(row)
    wall = time.perf_counter() - t0
    return {"tok_s": n / wall, "tokens": n, "outputs": outs, "tokens_per_forward": n / max(1, counter.n)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    ap.add_argument("--dataset", default=str(MT_BENCH))
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--ngram-max", type=int, default=2, help="max n for both (transformers' default is 2)")
    ap.add_argument("--draft", default=None, help="draft model folder (default: a cut of the target)")
    ap.add_argument("--draft-layers", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default="experiments/results/bench_peers.md")
    args = ap.parse_args()
    transformers.utils.logging.disable_progress_bar()
    dt = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    cpu = torch.device("cpu")

    target = load_model(None, dt, cpu)
    tok = target.tokenizer
    draft_path = Path(args.draft) if args.draft else cut_draft(target, args.draft_layers)
    draft = load_model(str(draft_path), dt, cpu)
    hf = transformers.AutoModelForCausalLM.from_pretrained(target.path, dtype=dt).eval()
    hf_draft = transformers.AutoModelForCausalLM.from_pretrained(str(draft_path), dtype=dt).eval()
    hf_draft.generation_config.num_assistant_tokens = args.k
    hf_draft.generation_config.num_assistant_tokens_schedule = "constant"
    hf_draft.generation_config.assistant_confidence_threshold = 0.0
    counter = ForwardCounter(hf)
    reqs = to_requests(load_prompts("jsonl", args.dataset, args.limit), tok)

    sides = {
        "none": (lambda: None, {}),
        "ngram": (lambda: NgramDrafter(min_n=1, max_n=args.ngram_max),
                  {"prompt_lookup_num_tokens": args.k, "max_matching_ngram_size": args.ngram_max}),
        "draft_model": (lambda: DraftModelDrafter(model=draft.model), {"assistant_model": hf_draft}),
    }
    for name, (make, kw) in sides.items():  # warm-up
        run_specbench(target, reqs[:1], make(), args.k if name != "none" else 0, 8)
        run_hf(hf, counter, reqs[:1], tok, 8, **kw)
    rounds: dict[str, list[dict]] = {n: [] for n in sides}
    for r in range(args.rounds):
        for name, (make, kw) in sides.items():
            k = args.k if name != "none" else 0
            if r % 2 == 0:
                sb, pe = run_specbench(target, reqs, make(), k, args.max_new_tokens), run_hf(hf, counter, reqs, tok, args.max_new_tokens, **kw)
            else:
                pe = run_hf(hf, counter, reqs, tok, args.max_new_tokens, **kw)
                sb = run_specbench(target, reqs, make(), k, args.max_new_tokens)
            rounds[name].append({"specbench": sb, "transformers": pe, "ratio": sb["tok_s"] / pe["tok_s"]})
            print(f"round {r} {name}: specbench {sb['tok_s']:.1f} tok/s, transformers {pe['tok_s']:.1f} tok/s",
                  file=sys.stderr)

    ref = rounds["none"][0]["specbench"]["outputs"]
    rows = []
    for name, rs in rounds.items():
        med = lambda f: statistics.median(f(x) for x in rs)  # noqa: E731
        sb0, pe0 = rs[0]["specbench"], rs[0]["transformers"]
        rows.append({
            "method": name, "specbench_tok_s": med(lambda x: x["specbench"]["tok_s"]),
            "transformers_tok_s": med(lambda x: x["transformers"]["tok_s"]), "ratio": med(lambda x: x["ratio"]),
            "specbench_tau": sb0["tau"], "specbench_tokens_per_forward": sb0["tokens_per_forward"],
            "transformers_tokens_per_forward": pe0["tokens_per_forward"],
            "same_outputs": sum(a == b for a, b in zip(sb0["outputs"], pe0["outputs"])),
            "specbench_match_ar": sum(a == b for a, b in zip(sb0["outputs"], ref)), "requests": len(reqs),
        })
    base_sb = next(r for r in rows if r["method"] == "none")["specbench_tok_s"]
    base_pe = next(r for r in rows if r["method"] == "none")["transformers_tok_s"]
    md = [
        "# Speculative peers: specbench vs transformers (CPU, batch 1, greedy)", "",
        f"Target {target.name} ({args.dtype}); draft model `{draft_path.name}`; {len(reqs)} MT-bench first turns; "
        f"max_new_tokens={args.max_new_tokens}; k={args.k}; ngram n<={args.ngram_max}; rounds={args.rounds} (medians); "
        f"torch {torch.__version__}, transformers {transformers.__version__}.", "",
        f"Command: `python {' '.join(sys.argv)}`", "",
        "| method | specbench tok/s | transformers tok/s | specbench / transformers | specbench speedup vs own AR "
        "| transformers speedup vs own AR | specbench τ | tokens per target forward (specbench / transformers) "
        "| identical outputs (specbench = transformers) | specbench = target-only |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        *[f"| {r['method']} | {r['specbench_tok_s']:.1f} | {r['transformers_tok_s']:.1f} | {r['ratio']:.2f} | "
          f"{r['specbench_tok_s'] / base_sb:.2f} | {r['transformers_tok_s'] / base_pe:.2f} | "
          f"{'-' if r['specbench_tau'] is None else format(r['specbench_tau'], '.2f')} | "
          f"{r['specbench_tokens_per_forward']:.2f} / {r['transformers_tokens_per_forward']:.2f} | "
          f"{r['same_outputs']}/{r['requests']} | {r['specbench_match_ar']}/{r['requests']} |" for r in rows], "",
        "τ = mean acceptance length (1 + accepted / drafts, vLLM's definition). Tokens per target forward counts "
        "prefills as forwards on both sides. In bfloat16 a multi-token verify pass rounds differently from a "
        "one-token step, so outputs can diverge from target-only decoding at near-ties (see README).",
    ]
    text = "\n".join(md) + "\n"
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    for rs in rounds.values():
        for x in rs:
            for side in ("specbench", "transformers"):
                x[side].pop("outputs", None)
    out.with_suffix(".json").write_text(json.dumps({"args": vars(args), "rows": rows, "rounds": rounds}, indent=2))
    print(text)


if __name__ == "__main__":
    main()
