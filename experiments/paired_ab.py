"""Paired comparison of training runs that drew the same batches (same data, seed, batch size and steps).

Each logged row's teacher-forced metrics (`acc_j`, `kl_j`: top-1 agreement with the target and KL at unroll
step j) are measured on the step's batch *before* the step trains on it, so in a run's first pass over its data
they are held-out numbers. Runs that share the batch order can be compared step by step: the per-step
difference removes the batch-to-batch variance that dominates a single run's curve.

    python experiments/paired_ab.py outputs/ab_ce outputs/ab_hass outputs/ab_ttt7 --from-step 46 \\
        --out experiments/results/ab_hass_sharegpt/paired

The first run is the reference; for every other run and metric: the mean over steps >= --from-step of the
run's value and of its difference to the reference, with the standard error of the mean difference.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path


def rows(run: Path) -> dict[int, dict]:
    out = {}
    for line in (run / "train_log.jsonl").read_text().splitlines():
        r = json.loads(line)
        if "loss" in r:  # training rows (evaluation rows carry eval/*)
            out[int(r["step"])] = r
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="run folders (train_log.jsonl); the first is the reference")
    ap.add_argument("--from-step", type=int, default=1, help="compare logged steps >= this (default: all)")
    ap.add_argument("--out", type=Path, default=None, help="write <out>.md and <out>.json")
    a = ap.parse_args()
    if len(a.runs) < 2:
        raise SystemExit("error: need a reference run and at least one more")
    logs = [rows(r) for r in a.runs]
    steps = sorted(set.intersection(*(set(x) for x in logs)))
    steps = [s for s in steps if s >= a.from_step]
    if len(steps) < 2:
        raise SystemExit(f"error: --from-step={a.from_step}: fewer than 2 steps logged by every run")
    ref = logs[0]
    metrics = sorted(k for k in ref[steps[0]] if k.startswith(("acc_", "kl_", "top1")) and all(k in x[steps[0]] for x in logs))
    result = {"runs": [str(r) for r in a.runs], "steps": [steps[0], steps[-1]], "n": len(steps), "metrics": {}}
    lines = [f"Paired over steps {steps[0]}–{steps[-1]} ({len(steps)} batches), reference `{a.runs[0]}`.", "",
             "| metric | " + " | ".join(f"`{r.name}`" for r in a.runs) + " |", "|---|" + "---:|" * len(a.runs)]
    for m in metrics:
        cells, res = [], {}
        base = [ref[s][m] for s in steps]
        mean_ref = sum(base) / len(base)
        cells.append(f"{mean_ref:.4f}")
        res[str(a.runs[0])] = {"mean": mean_ref}
        for run, log in zip(a.runs[1:], logs[1:]):
            vals = [log[s][m] for s in steps]
            d = [v - b for v, b in zip(vals, base)]
            md = sum(d) / len(d)
            se = math.sqrt(sum((x - md) ** 2 for x in d) / (len(d) - 1) / len(d))
            cells.append(f"{sum(vals) / len(vals):.4f} ({md:+.4f} ± {se:.4f})")
            res[str(run)] = {"mean": sum(vals) / len(vals), "diff": md, "se": se}
        result["metrics"][m] = res
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.with_suffix(".md").write_text(text)
        a.out.with_suffix(".json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
