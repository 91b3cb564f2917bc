"""Dynamic draft length (`method.drafter.stop_below`) against fixed k: the tables of experiments section 35.

Two kinds of runs, 16 MT-bench first turns, greedy, batch 1 (`results/dynamic_length/`):

- `fp32/<setting>/`: float32, where every setting's output is token-identical to target-only decoding, so all
  settings walk the *same text* and τ, target steps and draft forwards compare exactly (in bf16 the text
  changes with the verify width, and τ moves by a few hundredths from that alone);
- `rounds/r<i>_<setting>/`: bf16 without the target-only baseline, the settings run back to back in each of
  three rounds; each round's tokens/s is divided by that round's fixed k = 4 run (adjacent runs share the
  machine's state; this 2-core machine's speed drifts ±10 % between minutes).

The modelled column prices each float32 setting's exact counts with the bf16 rounds' median costs per step:
time for the text = target steps × (verify ms + draft ms per step), relative to fixed k = 4.

    python experiments/dynamic_length.py [experiments/results/dynamic_length]
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def _read(path: Path) -> dict:
    d = json.loads((path / "results.json").read_text())
    a, t, tm = d["acceptance"], d["totals"], d["timing"]
    steps = t["target_steps"]
    return {"tau": a["mean_acceptance_length"], "L": a["num_draft_tokens"] / steps, "steps": steps,
            "forwards": a["num_draft_tokens"], "tokens": t["new_tokens"], "per_position": a["per_position"],
            "tps": t["tokens_per_s"], "draft_ms": tm["draft_s"] / steps * 1e3, "verify_ms": tm["verify_s"] / steps * 1e3}


def main() -> None:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent / "results" / "dynamic_length")
    fp32 = {p.name: _read(p) for p in sorted((root / "fp32").iterdir()) if (p / "results.json").is_file()}
    rounds: dict[str, dict[str, dict]] = {}
    for p in sorted((root / "rounds").iterdir()):
        if (p / "results.json").is_file():
            r, setting = p.name.split("_", 1)
            rounds.setdefault(setting, {})[r] = _read(p)
    ref = "k_4_stop_below_null"
    if ref not in rounds or ref not in fp32:
        raise SystemExit(f"{root}: needs the fixed k = 4 run ({ref}) in rounds/ and fp32/")

    print("Float32 (the same 1,950-token text for every setting):\n")
    print("| setting | τ | drafted per step (L) | target steps | draft forwards | per position |")
    print("|---|---:|---:|---:|---:|---|")
    for name, x in fp32.items():
        pos = " / ".join(f"{v:.3f}" for v in x["per_position"])
        print(f"| {name} | {x['tau']:.3f} | {x['L']:.2f} | {x['steps']} | {x['forwards']} | {pos} |")

    print("\nbf16, three interleaved rounds (tokens/s; ratio to the same round's fixed k = 4):\n")
    print("| setting | τ | L | tokens/s by round | ratio by round | median ratio | draft ms / step | verify ms / step |")
    print("|---|---:|---:|---|---|---:|---:|---:|")
    cost = {}
    for name, rr in rounds.items():
        rs = sorted(rr)
        ratios = [rr[r]["tps"] / rounds[ref][r]["tps"] for r in rs if r in rounds[ref]]
        d_ms = statistics.median(rr[r]["draft_ms"] for r in rs)
        v_ms = statistics.median(rr[r]["verify_ms"] for r in rs)
        cost[name] = d_ms + v_ms
        x = rr[rs[0]]
        print(f"| {name} | {x['tau']:.3f} | {x['L']:.2f} | {' / '.join(format(rr[r]['tps'], '.1f') for r in rs)} | "
              f"{' / '.join(format(v, '.3f') for v in ratios)} | {statistics.median(ratios):.3f} | {d_ms:.1f} | "
              f"{v_ms:.1f} |")

    print("\nModelled (float32 counts × bf16 median costs per step), relative to fixed k = 4:\n")
    print("| setting | target steps | ms per step | time for the text (s) | speed vs fixed k = 4 |")
    print("|---|---:|---:|---:|---:|")
    base = fp32[ref]["steps"] * cost[ref]
    for name in cost:
        if name in fp32:
            t = fp32[name]["steps"] * cost[name]
            print(f"| {name} | {fp32[name]['steps']} | {cost[name]:.1f} | {t / 1e3:.1f} | {base / t:.3f} |")


if __name__ == "__main__":
    main()
