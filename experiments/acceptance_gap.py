"""Where an EAGLE-3 head's (or a draft model's) acceptance goes: teacher-forced agreement vs what the loop accepts.

Training logs top-1 agreement with the target at every response position (in-draft-vocabulary positions only);
the decode loop's first-position rate is lower. This script takes the exact tokens a greedy chain-k run of the
decode loop produced, runs the head teacher-forced over them (`Eagle3Method.greedy_drafts`, the training-time
unroll) and walks the chain the way the loop does (`evaluate.chain_walk`: propose k drafts after each bonus
token, accept the matching prefix). Then:

- the walk reproduces the loop's accepted-per-step sequence (checks that training's and the loop's features
  agree; bf16 rounding may flip a few near-ties);
- the gap between uniform agreement and the first-position rate splits into positions whose token is outside
  the draft vocabulary (never accepted, excluded from the training metric) and *which* positions the loop
  tests (only those right after a bonus token — after a rejection, or after a fully accepted chain).

    python experiments/acceptance_gap.py --head specbench/weights/smollm2-135m-eagle3 \\
        --out experiments/results/acceptance_gap/shipped

With `--target-only` it walks target-only greedy output instead (the same text for every head: paired
comparisons; `--per-category 10` = all 80 first turns). With `--records FILE` it skips the loop and walks the
target's own greedy responses stored in a data file (`{"prompt", "response"}` records, as regeneration writes
them; tokenized as training does): a held-out acceptance estimate over thousands of positions for the cost of
one teacher-forced forward per record.

`--draft DIR` walks a draft model (`method=draft_model`'s folder, compact or HF) instead of a head: its chain
drafts come from one teacher-forced forward (`train.draft_model.greedy_chain_drafts`; a test checks the walk
replays the loop), so `--draft A --target-only` and `--draft B --target-only` compare two drafts pairwise.

`--compare A.json B.json ...` reads earlier `--out` files walked over the same text and prints a paired table
against the first (per-sequence τ difference, its standard error, sequences better / worse, and the difference of
the walks' own τ — a ratio of sums, so long answers weigh more — with its delta-method standard error):

    python experiments/acceptance_gap.py --compare experiments/results/acceptance_gap/head2_mt80.json \\
        experiments/results/acceptance_gap/head3_mt80.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
MT_BENCH = ROOT.parent / "shared" / "data" / "mt_bench" / "question.jsonl"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--head", default=str(ROOT / "specbench" / "weights" / "smollm2-135m-eagle3"))
    ap.add_argument("--draft", default=None, help="walk this draft model folder (compact or HF) instead of --head")
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--per-category", type=int, default=2, help="MT-bench first turns per category (2 = 16)")
    ap.add_argument("--target-only", action="store_true",
                    help="walk target-only greedy output of the MT-bench prompts (the same text for every head)")
    ap.add_argument("--records", default=None, help="walk the greedy responses in this data file instead of the loop's")
    ap.add_argument("--skip", type=int, default=0, help="with --records: skip the first N records")
    ap.add_argument("--limit", type=int, default=256, help="with --records: walk N records")
    ap.add_argument("--max-len", type=int, default=512, help="with --records: tokens per record, as in training")
    ap.add_argument("--out", default=None, help="write <out>.json and <out>.md")
    ap.add_argument("--compare", nargs="+", default=None, metavar="JSON",
                    help="paired comparison of earlier --out files over the same text (the first is the reference)")
    ap.add_argument("--drop", default="", metavar="I,J,...",
                    help="with --compare: leave these sequences out (0-based indices of the walked records)")
    a = ap.parse_args()
    if a.drop and not a.compare:
        ap.error(f"--drop={a.drop} needs --compare")
    if a.compare:
        compare(a.compare, a.drop)
        return

    from specbench.core.sampling import SamplingParams
    from specbench.data.prompts import load_prompts, to_requests
    from specbench.drafters.draft_model import DraftModelDrafter
    from specbench.drafters.eagle import EagleDrafter
    from specbench.engine.loop import Engine, StopCriteria
    from specbench.models.loading import load_model
    from specbench.run import resolve_dtype
    from specbench.train.draft_model import greedy_chain_drafts
    from specbench.train.eagle3 import Eagle3Method
    from specbench.train.data import load_examples, tokenize
    from specbench.train.evaluate import chain_walk
    from tqdm.auto import tqdm

    torch.manual_seed(0)
    dev = torch.device("cpu")
    lm = load_model(None, resolve_dtype("auto", dev), dev)
    target, tok = lm.model, lm.tokenizer
    if a.records:  # (prompt length, whole sequence, None) per stored greedy response
        items = tokenize(load_examples(a.records)[a.skip:a.skip + a.limit], tok, a.max_len)
        runs = [(x.loss_mask.index(1), x.ids, None) for x in items]
    else:  # the loop's own chain-k output, with its accepted count per step
        reqs = to_requests(load_prompts("jsonl", str(MT_BENCH), per_category=a.per_category), tok)
        drafter = None if a.target_only else DraftModelDrafter(path=a.draft) if a.draft else EagleDrafter(path=a.head)
        eng = Engine(target, tok, batch_size=8 if a.target_only else 1, params=SamplingParams(), progress=True,
                     stop=StopCriteria(frozenset({tok.eos_token_id}), a.max_new_tokens),
                     drafter=drafter, k=a.k if drafter else 0)
        runs = [(len(q.prompt_ids), list(q.prompt_ids) + list(r.output_ids), r.accepted_per_step if drafter else None)
                for q, r in zip(reqs, eng.run(reqs))]
    if a.draft:  # an autoregressive draft: one teacher-forced forward gives every chain's drafts
        d = DraftModelDrafter(path=a.draft)
        d.setup(target, 1, 16, a.k, SamplingParams(), torch.Generator())
        V = target.config.vocab_size
        t2d = torch.ones(V, dtype=torch.bool) if d.vocab_ids is None else \
            torch.zeros(V, dtype=torch.bool).index_fill_(0, d.vocab_ids.cpu(), True)

        def drafts_of(ids):
            return greedy_chain_drafts(d.model, d.vocab_ids, ids, a.k)
    else:
        method = Eagle3Method(target, tok, [], init_from=a.head, ttt_steps=a.k)
        method.head.eval()
        drafts_of, t2d = method.greedy_drafts, method.head.t2d.cpu()

    tot = {"steps": 0, "loop_steps": 0, "same_steps": 0, "loop_accepted": 0, "walk_accepted": 0,
           "uniform": [0] * a.k, "uniform_vocab": [0] * a.k, "n_uniform": 0, "n_vocab": 0, "oov": 0,
           "tested_oov": 0, "tested_hit": 0, "tested": 0, "after_reject": [0, 0], "after_full": [0, 0],
           "walk_pos": [0] * a.k}
    per_seq = []  # (walk steps, drafts accepted) per sequence: paired comparisons of heads on the same text
    for P, ids, loop in tqdm(runs, desc="teacher-forced walk", unit="seq"):
        per_i = drafts_of(ids)
        in_vocab = t2d[torch.tensor(ids[2:] + [0, 0])].tolist()  # [i]: token i+2 in the draft vocabulary
        acc, tested = chain_walk(per_i, ids, P, a.k)
        loop = loop if loop is not None else acc
        tot["loop_steps"] += len(loop)
        tot["loop_accepted"] += sum(loop)
        tot["steps"] += len(acc)
        tot["walk_accepted"] += sum(acc)
        per_seq.append([len(acc), sum(acc)])
        tot["same_steps"] += sum(x == y for x, y in zip(acc, loop))
        for j in range(a.k):
            tot["walk_pos"][j] += sum(x > j for x in acc)
        # uniform teacher-forced agreement: every proposal point i whose depth-j target lies in the response
        for i in range(P - 1, len(ids) - 2):
            tot["n_uniform"] += 1
            oov = not in_vocab[i]
            tot["oov"] += oov
            tot["n_vocab"] += not oov
            for j in range(a.k):
                if i + 2 + j < len(ids) and per_i[i][j] == ids[i + 2 + j] and all(
                        per_i[i][m] == ids[i + 2 + m] for m in range(j)):
                    tot["uniform"][j] += 1
                    tot["uniform_vocab"][j] += not oov
        prev = None
        for t, x in zip(tested, acc):
            tot["tested"] += 1
            tot["tested_oov"] += not in_vocab[t - 2]
            tot["tested_hit"] += x > 0
            if prev is not None:
                bucket = "after_full" if prev == a.k else "after_reject"
                tot[bucket][0] += x > 0
                tot[bucket][1] += 1
            prev = x

    n, s = tot["n_uniform"], tot["steps"]
    out = {
        "head": a.draft or a.head, "drafter": "draft_model" if a.draft else "eagle3", "k": a.k,
        "source": a.records or f"MT-bench, {a.per_category} per category" + (", target-only text" if a.target_only else ""),
        "sequences": len(runs), "max_new_tokens": None if a.records else a.max_new_tokens,
        "loop_tau": None if a.records or a.target_only else 1 + tot["loop_accepted"] / tot["loop_steps"],
        "walk_tau": 1 + tot["walk_accepted"] / s,
        "walk_matches_loop_steps": tot["same_steps"] / max(tot["loop_steps"], 1),
        "walk_per_position": [x / s for x in tot["walk_pos"]],
        "uniform_chain_prefix": [x / n for x in tot["uniform"]],
        "uniform_first_in_vocab_only": tot["uniform_vocab"][0] / max(tot["n_vocab"], 1),
        "oov_rate_all_positions": tot["oov"] / n,
        "oov_rate_tested_positions": tot["tested_oov"] / max(tot["tested"], 1),
        "first_position_after_reject": tot["after_reject"][0] / max(tot["after_reject"][1], 1),
        "first_position_after_full_chain": tot["after_full"][0] / max(tot["after_full"][1], 1),
        "tested_share_of_positions": tot["tested"] / n,
        "counts": tot,
        "per_sequence_steps_accepted": per_seq,
    }
    text = json.dumps(out, indent=1)
    print(text)
    if a.out:
        p = Path(a.out)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.with_suffix(".json").write_text(text + "\n")
        rows = [("decode loop τ (chain k=%d)" % a.k, out["loop_tau"]),
                ("teacher-forced walk τ", out["walk_tau"]),
                ("steps where the walk accepts what the loop did",
                 None if out["loop_tau"] is None else out["walk_matches_loop_steps"]),
                ("walk first-position rate (= loop's)", out["walk_per_position"][0]),
                ("uniform agreement, every position, depth 1", out["uniform_chain_prefix"][0]),
                ("uniform agreement, in-vocabulary positions (the training metric)", out["uniform_first_in_vocab_only"]),
                ("positions whose token is outside the draft vocabulary, all", out["oov_rate_all_positions"]),
                ("the same, at tested first positions", out["oov_rate_tested_positions"]),
                ("first position right after a rejection", out["first_position_after_reject"]),
                ("first position right after a fully accepted chain", out["first_position_after_full_chain"]),
                ("share of positions the loop tests at depth 1", out["tested_share_of_positions"])]
        rows = [r for r in rows if r[1] is not None]  # --records / --target-only: no loop to compare with
        md = ["| quantity | value |", "|---|---:|"] + [f"| {q} | {v:.3f} |" for q, v in rows]
        p.with_suffix(".md").write_text("\n".join(md) + "\n")


def compare(paths: list[str], drop: str = "") -> None:
    """Print the paired table of `--compare` (exit 2 naming the file when one is not over the same text), without
    the sequences `drop` lists (comma-separated 0-based indices)."""
    import sys

    from specbench.train.evaluate import paired_walks

    if len(paths) < 2:
        print(f"error: --compare needs a reference and at least one more file, got {len(paths)}", file=sys.stderr)
        sys.exit(2)
    try:
        dropped = {int(i) for i in drop.split(",") if i.strip()}
        if any(i < 0 for i in dropped):
            raise ValueError
    except ValueError:
        print(f"error: --drop={drop}: expected comma-separated sequence indices >= 0", file=sys.stderr)
        sys.exit(2)
    runs = []
    for p in paths:
        try:
            r = json.loads(Path(p).read_text())
            r["per_sequence_steps_accepted"], r["walk_tau"], r["walk_per_position"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            print(f"error: --compare {p}: not an acceptance_gap.py --out JSON with per-sequence counts ({e!r})",
                  file=sys.stderr)
            sys.exit(2)
        if dropped and max(dropped) >= len(r["per_sequence_steps_accepted"]):
            print(f"error: --drop={drop}: {p} walks {len(r['per_sequence_steps_accepted'])} sequences "
                  f"(valid indices 0-{len(r['per_sequence_steps_accepted']) - 1})", file=sys.stderr)
            sys.exit(2)
        r["per_sequence_steps_accepted"] = [
            x for i, x in enumerate(r["per_sequence_steps_accepted"]) if i not in dropped]
        runs.append(r)
    if dropped:
        print(f"without sequences {', '.join(map(str, sorted(dropped)))} (paired columns; walk τ and first "
              "position are the files' own, over every sequence)")
    cells = ["reference | — | —"]
    for p, r in zip(paths[1:], runs[1:]):
        try:
            d = paired_walks(runs[0]["per_sequence_steps_accepted"], r["per_sequence_steps_accepted"])
        except ValueError as e:
            print(f"error: --compare {p} against {paths[0]}: {e}", file=sys.stderr)
            sys.exit(2)
        cells.append(f"{d['mean_diff']:+.4f} ± {d['se']:.4f} | {d['better']} / {d['worse']} of {d['n']} | "
                     f"{d['walk_diff']:+.4f} ± {d['walk_se']:.4f}")
    print("| head | walk τ | first position | paired τ diff vs the first (± SE) | sequences better / worse "
          "| walk τ diff, token-weighted (± SE) |")
    print("|---|---:|---:|---:|---:|---:|")
    for p, r, cell in zip(paths, runs, cells):
        print(f"| `{p}` | {r['walk_tau']:.4f} | {r['walk_per_position'][0]:.4f} | {cell} |")


if __name__ == "__main__":
    main()
