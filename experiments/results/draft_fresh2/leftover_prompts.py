"""Section 26: prompt-only chat records for regen9 — the prompts of ../shared/data's alpaca_5000, gpteacher and
gsm8k_train that the shared corpus (smollm2_regen) did not answer, joined as its SOURCE.md says (instruction and
input by a blank line), a fixed number from each source, shuffled with seed 3.

    python experiments/results/draft_fresh2/leftover_prompts.py outputs/regen9_prompts.jsonl
"""

import json
import random
import sys
from pathlib import Path

D = Path(__file__).resolve().parents[4] / "shared/data"
TAKE = {"alpaca_5000": 1000, "gpteacher_codegen": 400, "gpteacher_roleplay": 400, "gsm8k_train": 300}


def join(rec: dict) -> str:
    return rec["instruction"] + ("\n\n" + rec["input"] if rec.get("input") else "")


def main(out: str) -> None:
    used, answered = set(), set()
    for f in ("responses.jsonl", "responses_2.jsonl"):
        for line in open(D / "smollm2_regen" / f):
            r = json.loads(line)
            used.add(r["id"])
            answered.add(r["messages"][0]["content"].strip())
    mt = {json.loads(l)["turns"][0].strip() for l in open(D / "mt_bench/question.jsonl")}
    sources = {
        "alpaca_5000": [join(r) for r in json.load(open(D / "alpaca_5000/alpaca_5000.json"))],
        "gpteacher_codegen": [join(r) for r in json.load(open(D / "gpteacher/codegen-instruct.json"))],
        "gpteacher_roleplay": [join(r) for r in json.load(open(D / "gpteacher/roleplay-instruct.json"))],
        "gsm8k_train": [json.loads(l)["question"] for l in open(D / "gsm8k_train/train.jsonl")],
    }
    rng = random.Random(3)
    picked, seen = [], set()
    for src, prompts in sources.items():
        left = [(i, p) for i, p in enumerate(prompts) if f"{src}-{i}" not in used and p.strip() not in answered
                and p.strip() not in mt and p.strip()]
        left = [(i, p) for i, p in left if not (p.strip() in seen or seen.add(p.strip()))]
        rng.shuffle(left)
        print(f"{src}: {len(prompts)} prompts, {len(left)} unanswered, taking {min(TAKE[src], len(left))}")
        picked += [{"id": f"{src}-{i}", "source": src, "messages": [{"role": "user", "content": p}]}
                   for i, p in left[: TAKE[src]]]
    rng.shuffle(picked)
    with open(out, "w") as f:
        for r in picked:
            f.write(json.dumps(r) + "\n")
    print(f"wrote {len(picked)} to {out}")


if __name__ == "__main__":
    main(sys.argv[1])
