"""The draft model as an EAGLE-2 dynamic tree against its chain and n-gram lookup: the tables of experiments
section 36.

`results/dynamic_tree/rounds/r<i>_<n>_<setting>/` holds five interleaved rounds (the 12-node tree in rounds 1-3;
16 MT-bench first turns, bf16, greedy, batch 1, no per-run baseline): each round runs target-only (`none`) first, then the chain and the trees back
to back, so each setting's speedup is its tokens/s over the same round's target-only run (adjacent runs share the
machine's state; this 2-core machine's speed drifts ±10 % between minutes). n-gram lookup ran once, in round 1.
`all80/` holds one run each on all 80 first turns (no target-only runs: τ and τ per category only). Several
folders are read as one (section 37: `results/lookup/all80` next to this section's `all80`); runs with prompt lookup
grafted onto their trees (`method.lookup`) get a table of what the grafts contributed.

    experiments/results/dynamic_tree/rounds.sh                 # the runs (~30 min); all80.sh (~20 min)
    python experiments/dynamic_tree.py [FOLDER ...]            # default: experiments/results/dynamic_tree/rounds
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dynamic_length import _read  # noqa: E402


def main() -> None:
    roots = [Path(a) for a in sys.argv[1:]] or [Path(__file__).parent / "results" / "dynamic_tree" / "rounds"]
    runs: dict[str, dict[str, dict]] = {}
    cats: dict[str, dict[str, float]] = {}
    grafts: dict[str, dict] = {}
    for p in sorted(p for root in roots for p in root.iterdir()):
        if (p / "results.json").is_file():
            r, _, setting = p.name.split("_", 2)
            runs.setdefault(setting, {})[r] = _read(p)
            doc = json.loads((p / "results.json").read_text())
            lookup = ((doc.get("config") or {}).get("drafter") or {}).get("lookup")
            if r == "r1" and lookup and "row_steps" in lookup:
                grafts[setting] = {**lookup, "steps": runs[setting][r]["steps"]}
            if r == "r1":
                pc = doc.get("per_category", {})
                tau = {c: v["acceptance"]["mean_acceptance_length"] for c, v in pc.items()}
                if all(t is not None for t in tau.values()):  # target-only has none
                    cats[setting] = tau
    none = runs.pop("none", None)  # without target-only runs: no speedup columns

    print("| setting | τ | tokens / target step | per position | tokens/s by round | speedup by round (vs the "
          "round's target-only) | median speedup | draft ms / step | verify ms / step |")
    print("|---|---:|---:|---|---|---|---:|---:|---:|")
    for name, rr in runs.items():
        rs = sorted(rr)
        sp = [rr[r]["tps"] / none[r]["tps"] for r in rs] if none else []
        x = rr[rs[0]]
        pos = " / ".join(f"{v:.2f}" for v in x["per_position"])
        print(f"| {name} | {x['tau']:.3f} | {x['tokens'] / x['steps']:.2f} | {pos} | "
              f"{' / '.join(format(rr[r]['tps'], '.1f') for r in rs)} | "
              f"{' / '.join(format(v, '.2f') + '×' for v in sp) or '-'} | "
              f"{f'**{statistics.median(sp):.2f}×**' if sp else '-'} | "
              f"{statistics.median(rr[r]['draft_ms'] for r in rs):.1f} | "
              f"{statistics.median(rr[r]['verify_ms'] for r in rs):.1f} |")
    if none:
        print(f"\ntarget-only tokens/s by round: {' / '.join(format(none[r]['tps'], '.1f') for r in sorted(none))}")

    ngram = [s for s in cats if s.startswith("ngram")]
    names = sorted({c for v in cats.values() for c in v})
    print("\nτ per category (round 1; bold: above n-gram at k = 4), and the categories above each n-gram run:\n")
    print("| setting | " + " | ".join(names) + " | overall τ | " + " | ".join(f"above {g}" for g in ngram) + " |")
    print("|---|" + "---:|" * (len(names) + 1 + len(ngram)))
    overall = {s: runs[s][min(runs[s])]["tau"] for s in cats}
    for s, v in cats.items():
        won = {g: [c for c in names if v[c] > cats[g][c]] for g in ngram}
        bold = won.get("ngram_k4", [])
        cells = [f"**{v[c]:.2f}**" if c in bold and s not in ngram else f"{v[c]:.2f}" for c in names]
        above = ["-" if s in ngram else f"{len(won[g])} / {len(names)}" + (" (overall too)" if overall[s] > overall[g] else "")
                 for g in ngram]
        print(f"| {s} | " + " | ".join(cells) + f" | {overall[s]:.3f} | " + " | ".join(above) + " |")
    if grafts:
        print("\nPrompt lookup grafted onto the trees (round 1; shares of the target steps):\n")
        print("| setting | lookup matched | a path grafted | a grafted token accepted | grafted tokens accepted "
              "per step |")
        print("|---|---:|---:|---:|---:|")
        for s, g in grafts.items():
            n = g["row_steps"]
            print(f"| {s} | {g['matched'] / n:.0%} | {g['grafted'] / n:.0%} | {g['won'] / n:.0%} | "
                  f"{g['accepted_grafted'] / n:.3f} |")


if __name__ == "__main__":
    main()
