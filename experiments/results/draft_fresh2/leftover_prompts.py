"""Section 26: prompt-only chat records for regen9 — the prompts of ../shared/data's alpaca_5000, gpteacher and
gsm8k_train that the shared corpus (smollm2_regen) did not answer, joined as its SOURCE.md says (instruction and
input by a blank line), a fixed number from each source, shuffled with seed 3.

    python experiments/results/draft_fresh2/leftover_prompts.py outputs/regen9_prompts.jsonl

Section 27 takes the next prompts of the same shuffled lists (each source's list is shuffled the same way whatever
it takes, so a later slice never repeats regen9's): `--start` skips the first N of a source, `--take` sets how many
follow, both as src=N.

    python experiments/results/draft_fresh2/leftover_prompts.py outputs/regen10_prompts.jsonl \
        --start alpaca_5000=1000 gpteacher_codegen=400 gpteacher_roleplay=400 gsm8k_train=300 \
        --take alpaca_5000=1300 gpteacher_codegen=1000 gpteacher_roleplay=550 gsm8k_train=650

Section 28 (regen11) starts after regen10's slice; a take past a source's end stops at its end:

    python experiments/results/draft_fresh2/leftover_prompts.py outputs/regen11_prompts.jsonl \
        --start alpaca_5000=2300 gpteacher_codegen=1400 gpteacher_roleplay=950 gsm8k_train=950 \
        --take alpaca_5000=1000 gpteacher_codegen=1000 gpteacher_roleplay=500 gsm8k_train=1200
"""

import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from regen_prompts import answered, mt_bench_turns  # noqa: E402

D = Path(__file__).resolve().parents[4] / "shared/data"
TAKE = {"alpaca_5000": 1000, "gpteacher_codegen": 400, "gpteacher_roleplay": 400, "gsm8k_train": 300}


def join(rec: dict) -> str:
    return rec["instruction"] + ("\n\n" + rec["input"] if rec.get("input") else "")


def main(out: str, take: dict[str, int], start: dict[str, int]) -> None:
    corpus = [str(D / "smollm2_regen" / f) for f in ("responses.jsonl", "responses_2.jsonl")]
    used = {json.loads(line)["id"] for f in corpus for line in open(f)}
    skip = answered(corpus) | mt_bench_turns(str(D / "mt_bench/question.jsonl"))
    sources = {
        "alpaca_5000": [join(r) for r in json.load(open(D / "alpaca_5000/alpaca_5000.json"))],
        "gpteacher_codegen": [join(r) for r in json.load(open(D / "gpteacher/codegen-instruct.json"))],
        "gpteacher_roleplay": [join(r) for r in json.load(open(D / "gpteacher/roleplay-instruct.json"))],
        "gsm8k_train": [json.loads(l)["question"] for l in open(D / "gsm8k_train/train.jsonl")],
    }
    rng = random.Random(3)
    picked, seen = [], set()
    for src, prompts in sources.items():
        left = []
        for i, p in enumerate(prompts):
            text = p.strip()
            if text and f"{src}-{i}" not in used and text not in skip and text not in seen:
                seen.add(text)
                left.append((i, p))
        rng.shuffle(left)
        a = start.get(src, 0)
        chosen = left[a : a + take[src]]
        print(f"{src}: {len(prompts)} prompts, {len(left)} unanswered, taking {len(chosen)} after the first {a}")
        picked += [{"id": f"{src}-{i}", "source": src, "messages": [{"role": "user", "content": p}]} for i, p in chosen]
    rng.shuffle(picked)
    with open(out, "w") as f:
        for r in picked:
            f.write(json.dumps(r) + "\n")
    print(f"wrote {len(picked)} to {out}")


def counts(items: list[str], flag: str) -> dict[str, int]:
    out = {}
    for item in items:
        src, _, n = item.partition("=")
        if src not in TAKE or not n.isdigit():
            print(f"error: {flag} {item!r}: expected src=N with src one of {', '.join(TAKE)}", file=sys.stderr)
            sys.exit(2)
        out[src] = int(n)
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--start", nargs="*", default=[], help="src=N: skip the first N unanswered prompts of src")
    ap.add_argument("--take", nargs="*", default=[], help="src=N: take N prompts of src (default: regen9's counts)")
    args = ap.parse_args()
    main(args.out, {**TAKE, **counts(args.take, "--take")}, counts(args.start, "--start"))
