"""The acceptance issue's scaling table: held-out acceptance of the EAGLE-3 head against trained tokens and time.

Trained tokens (response tokens whose prediction is in the loss) come from the run's `train_log.jsonl` when it
records them (`tokens`, `wall_s` on every row), else from a replay of the trainer's deterministic batch order
over the same data (`--replay`, for runs that predate those fields). Held-out acceptance is the in-training
evaluation (greedy chain k = 3 with the decode loop on the 8 held-back regenerated prompts). `--anchor` heads are
also measured here, all on the same prompts and token budget, so runs with different evaluation lengths meet on
one footing.

    python experiments/scaling.py --runs outputs/eagle3_scale --start-from-shipped \
        --anchor specbench/weights/smollm2-135m-eagle3 --anchor outputs/eagle3_scale/model
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "smollm2_regen"


def replay_tokens(paths: list[str], max_len: int, batch: int, steps: int, seed: int = 0,
                  eval_prompts: int = 8) -> tuple[list[int], int]:
    """Cumulative trained tokens after each step 1..steps of the trainer's batch order, and the data's total."""
    from specbench.models.loading import load_tokenizer, resolve_folder
    from specbench.train.data import load_examples, tokenize
    from specbench.train.trainer import Trainer, TrainSettings

    tok = load_tokenizer(resolve_folder(None)[0])
    examples = [e for p in paths for e in load_examples(p)][eval_prompts:]
    items = tokenize(examples, tok, max_len)

    class _Count:  # the trainer's batch order without a model
        name = "count"

        def parameters(self):
            return [torch.nn.Parameter(torch.zeros(1))]

    t = Trainer(_Count(), items, TrainSettings(steps=steps, batch_size=batch, seed=seed), "/nonexistent",
                progress=False)
    per_item = [sum(x.loss_mask) for x in items]
    out, total = [], 0
    for step in range(steps):
        total += sum(per_item[i] for i in t.batch(step, 0)[2])
        out.append(total)
    return out, sum(per_item)


def anchor(path: str, max_new: int) -> dict:
    from specbench.data.prompts import Prompt
    from specbench.drafters.eagle import EagleDrafter
    from specbench.models.loading import load_model
    from specbench.run import resolve_dtype
    from specbench.train.data import load_examples
    from specbench.train.evaluate import loop_acceptance

    lm = load_model(None, resolve_dtype("auto", torch.device("cpu")), torch.device("cpu"))
    held = load_examples(str(DATA / "responses.jsonl"))[:8]
    prompts = [Prompt(id=str(i), prompt=e.prompt) for i, e in enumerate(held)]
    return loop_acceptance(lm.model, lm.tokenizer, prompts, EagleDrafter(path=path), 3, max_new)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", nargs="*", default=[], help="training run folders (train_log.jsonl)")
    ap.add_argument("--start-tokens", type=int, default=0, help="tokens the runs' starting weights had seen")
    ap.add_argument("--start-from-shipped", action="store_true",
                    help="the runs started from the shipped head: count the tokens of its recorded training")
    ap.add_argument("--anchor", action="append", default=[], help="heads measured here on the same prompts")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--out", default="experiments/results/scaling_eagle3")
    a = ap.parse_args()
    rows = []
    start = a.start_tokens
    if a.start_from_shipped:  # the shipped head's recorded command (experiments/README.md, section 5)
        start = replay_tokens([str(DATA / "responses.jsonl")], 512, 8, 700)[0][-1]
        print(f"the shipped head trained on {start:,} tokens")
    for run in a.runs:
        log = [json.loads(x) for x in (Path(run) / "train_log.jsonl").read_text().splitlines()]
        cum = None
        if any("tokens" not in r for r in log):  # a run from before the log counted tokens: replay its batches
            from omegaconf import OmegaConf

            c = OmegaConf.load(Path(run) / ".hydra" / "config.yaml")
            cum = replay_tokens(list(c.data.paths), int(c.data.max_len), int(c.train.batch_size),
                                int(c.train.steps), int(c.train.seed), int(c.data.eval_prompts))[0]
        rate = {r["step"]: r["train_tokens_per_s"] for r in log if "train_tokens_per_s" in r}
        for r in log:
            if "eval/per_position_0" in r:
                n = r["tokens"] if cum is None else cum[r["step"] - 1]
                wall = r.get("wall_s") or (n / rate[r["step"]] if r["step"] in rate else None)
                rows.append({"run": run, "step": r["step"], "tokens": start + n, "run_tokens": n,
                             "wall_s": wall, "tau": r["eval/mean_acceptance_length"],
                             "pos": [r[f"eval/per_position_{i}"] for i in range(3)]})
    anchors = [{"head": h, **anchor(h, a.max_new_tokens)} for h in a.anchor]
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"rows": rows, "anchors": anchors}, indent=2) + "\n")
    lines = ["| run | step | trained tokens (run / with its start) | training time | held-out τ (k=3) "
             "| per position |", "|---|---:|---:|---:|---:|---|"]
    for r in rows:
        wall = f"{r['wall_s'] / 60:.0f} min" if r["wall_s"] else "—"
        lines.append(f"| {r['run']} | {r['step']} | {r['run_tokens'] / 1e6:.2f}M / {r['tokens'] / 1e6:.2f}M | {wall} | "
                     f"{r['tau']:.2f} | "
                     + " / ".join(f"{p:.2f}" for p in r["pos"]) + " |")
    lines += ["", "| head (same prompts, same budget) | τ | per position |", "|---|---:|---|"]
    for h in anchors:
        lines.append(f"| {h['head']} | {h['eval/mean_acceptance_length']:.2f} | "
                     + " / ".join(f"{h[f'eval/per_position_{i}']:.2f}" for i in range(3)) + " |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
