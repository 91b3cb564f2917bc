"""MT-bench's second turns (`dataset.turns=2`) next to its first: τ and speedup per user turn, the tables of
experiments section 39.

Folders `r<i>_<n>_<setting>/` (each a results.json of a run with dataset.turns=2 and no per-run baseline), every
round starting with target-only (`none`): a setting's speedup in a turn is its tokens/s over that turn's requests
(request-level rates, admission -> last token) divided by the same round's target-only rate for that turn; the
"both" column uses whole-run tokens/s. Then τ by category within each turn, where results.json has it.

    experiments/results/turns/run.sh                         # the runs
    python experiments/turns.py outputs/turns               # the tables
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def _read(path: Path) -> dict:
    d = json.loads((path / "results.json").read_text())
    turns = d.get("per_turn")
    if not turns:
        raise SystemExit(f"{path}: no per_turn block (run with dataset.turns=2)")
    return {"tps": d["totals"]["tokens_per_s"], "tau": d["acceptance"]["mean_acceptance_length"],
            "turn_tps": {t: e["tokens_per_s"] for t, e in turns.items()},
            "turn_tau": {t: e["acceptance"]["mean_acceptance_length"] for t, e in turns.items()},
            "turn_pos": {t: e["acceptance"]["per_position"] for t, e in turns.items()},
            "turn_requests": {t: e["requests"] for t, e in turns.items()},
            # τ by category within each turn (results.json from 6451e46 on; {} before)
            "turn_cat_tau": {t: {c: ce["acceptance"]["mean_acceptance_length"]
                                 for c, ce in e.get("per_category", {}).items()} for t, e in turns.items()}}


def _median(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f}×" if xs else "-"


def main() -> None:
    roots = [Path(a) for a in sys.argv[1:]] or [Path("outputs/turns")]
    runs: dict[str, dict[str, dict]] = {}
    for p in sorted(p for root in roots for p in root.iterdir()):
        if (p / "results.json").is_file():
            r, _, setting = p.name.split("_", 2)
            runs.setdefault(setting, {})[r] = _read(p)
    none = runs.pop("none", {})
    turns = sorted({t for rr in runs.values() for x in rr.values() for t in x["turn_tau"]}, key=int)
    print("| setting | " + " | ".join(f"τ turn {t}" for t in turns) + " | τ both | "
          + " | ".join(f"turn {t} per position" for t in turns) + " | "
          + " | ".join(f"speedup turn {t}" for t in turns) + " | speedup both |")
    print("|---|" + "---:|" * (len(turns) + 1) + "---|" * len(turns) + "---:|" * (len(turns) + 1))
    for name, rr in runs.items():
        rs = sorted(rr, key=lambda r: int(r[1:]))
        x = rr[rs[0]]
        both = [rr[r]["tps"] / none[r]["tps"] for r in rs if r in none]
        per = {t: [rr[r]["turn_tps"][t] / none[r]["turn_tps"][t] for r in rs if r in none] for t in turns}
        print(f"| {name} | " + " | ".join(f"{x['turn_tau'][t]:.3f}" for t in turns) + f" | {x['tau']:.3f} | "
              + " | ".join(" / ".join(f"{v:.2f}" for v in x["turn_pos"][t]) for t in turns) + " | "
              + " | ".join(_median(per[t]) for t in turns) + f" | {_median(both)} |")
    if none:
        first = none[min(none, key=lambda r: int(r[1:]))]
        print(f"\nrequests per turn: {' / '.join(str(first['turn_requests'][t]) for t in turns)}; target-only "
              "tokens/s by round and turn: " + "; ".join(
                  f"{r}: " + " / ".join(f"{none[r]['turn_tps'][t]:.1f}" for t in turns)
                  for r in sorted(none, key=lambda r: int(r[1:]))))

    for t in turns:  # τ by category per turn, each setting's first round (greedy τ repeats across rounds)
        firsts = {name: rr[min(rr, key=lambda r: int(r[1:]))]["turn_cat_tau"].get(t, {}) for name, rr in runs.items()}
        cats = sorted({c for v in firsts.values() for c in v})
        if not cats:
            continue
        print(f"\nτ by category, turn {t}:\n\n| setting | " + " | ".join(cats) + " |\n|---|" + "---:|" * len(cats))
        for name, v in firsts.items():
            print(f"| {name} | " + " | ".join(f"{v[c]:.2f}" if v.get(c) is not None else "-" for c in cats) + " |")


if __name__ == "__main__":
    main()
