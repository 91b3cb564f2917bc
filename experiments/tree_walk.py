"""How much a draft model would accept as a token tree: teacher-forced walks of static width profiles.

A width profile [w1, ..., wk] is the tree whose every depth-(j-1) node on the way has the draft's w_j most likely
next tokens as children (Medusa / Sequoia-style static trees; [1, ..., 1] is the chain, [4, 1, 1, 1] four
depth-1 siblings with a greedy chain under each, [2, 2, 2, 2] a full binary tree). Greedy verification accepts
the path that follows the target's own tokens, so along a finished greedy text a node at depth j is accepted
exactly when drafts 1..j-1 matched the text and the text's next token is among the draft's top w_j *given the
text so far* — which one teacher-forced forward of the draft gives for every position (as
`train.draft_model.greedy_chain_drafts` does for chains). The walk replays the loop: propose after each bonus
token, accept the matching prefix, continue after the bonus; its τ is what the loop's greedy verification would
accept on that text. Nodes per step = w1 + w1·w2 + ... (what the target would verify).

    python experiments/tree_walk.py --k 4 --per-category 10 --out experiments/results/tree_walk/shipped_draft
    python experiments/tree_walk.py --records ../shared/data/.../regen.jsonl --limit 64   # stored greedy answers

The chain profile must reproduce `acceptance_gap.py --draft ... --target-only`'s walk τ on the same text.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
MT_BENCH = ROOT.parent / "shared" / "data" / "mt_bench" / "question.jsonl"
PROFILES = "1,1,1,1;2,1,1,1;4,1,1,1;2,2,1,1;3,2,1,1;2,2,2,2"


def rank_of(logits: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """[T] rank of logits[t, idx[t]] in its row as argmax / topk order it (bf16 logits tie often: an equal logit
    at a lower index comes first, as argmax's first maximum)."""
    own = logits.gather(1, idx[:, None])
    earlier = torch.arange(logits.shape[1])[None] < idx[:, None]
    return (logits > own).sum(1) + ((logits == own) & earlier).sum(1)


def walk(ranks: list[int], start: int, widths: list[int]) -> list[int]:
    """ranks[p] = the text's token p+1 rank among the draft's predictions after ids[:p+1] (0 = its argmax).
    The loop's walk from the first proposal after the prompt (last real position start-1): accepted per step."""
    k, n = len(widths), len(ranks) + 1
    i, out = start - 1, []
    while i + 2 < n:
        a = 0
        while a < k and i + 2 + a < n and ranks[i + 1 + a] < widths[a]:
            a += 1
        out.append(a)
        i += a + 1
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draft", default=str(ROOT / "specbench" / "weights" / "smollm2-135m-draft"))
    ap.add_argument("--profiles", default=PROFILES, help="';'-separated width profiles, each k comma-separated ints")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--per-category", type=int, default=10, help="MT-bench first turns per category (10 = all 80)")
    ap.add_argument("--records", default=None, help="walk the greedy responses in this data file instead")
    ap.add_argument("--limit", type=int, default=64, help="with --records: walk N records")
    ap.add_argument("--max-len", type=int, default=512, help="with --records: tokens per record, as in training")
    ap.add_argument("--out", default=None, help="write <out>.json and <out>.md")
    a = ap.parse_args()
    try:
        profiles = [[int(w) for w in p.split(",")] for p in a.profiles.split(";")]
    except ValueError:
        ap.error(f"--profiles={a.profiles!r}: expected e.g. '1,1,1,1;2,1,1,1' (k widths per profile)")
    if any(not p or min(p) < 1 for p in profiles):
        ap.error(f"--profiles={a.profiles!r}: every width must be >= 1")

    from tqdm.auto import tqdm

    from specbench.core.sampling import SamplingParams
    from specbench.data.prompts import load_prompts, to_requests
    from specbench.drafters.draft_model import DraftModelDrafter, tree_nodes
    from specbench.engine.loop import Engine, StopCriteria
    from specbench.models.loading import load_model
    from specbench.run import resolve_dtype
    from specbench.train.data import load_examples, tokenize

    torch.manual_seed(0)
    dev = torch.device("cpu")
    lm = load_model(None, resolve_dtype("auto", dev), dev)
    target, tok = lm.model, lm.tokenizer
    if a.records:
        items = tokenize(load_examples(a.records)[: a.limit], tok, a.max_len)
        runs = [(x.loss_mask.index(1), x.ids) for x in items]
    else:  # target-only greedy text: the same for every draft
        reqs = to_requests(load_prompts("jsonl", str(MT_BENCH), per_category=a.per_category), tok)
        eng = Engine(target, tok, batch_size=8, params=SamplingParams(), progress=True,
                     stop=StopCriteria(frozenset({tok.eos_token_id}), a.max_new_tokens))
        runs = [(len(q.prompt_ids), list(q.prompt_ids) + list(r.output_ids)) for q, r in zip(reqs, eng.run(reqs))]
    d = DraftModelDrafter(path=a.draft)
    d.setup(target, 1, 16, 1, SamplingParams(), torch.Generator())
    model, ids_of = d.model, d.vocab_ids
    acc = {str(p): [] for p in profiles}
    with torch.inference_mode():
        for P, ids in tqdm(runs, desc="teacher-forced walks", unit="seq"):
            logits = model(torch.tensor([ids]), None).logits[0].float()  # [T, Vd]: after ids[:p+1]
            nxt = torch.tensor(ids[1:])
            r = nxt
            if ids_of is not None:  # a reduced head: rank among its rows; a token outside them is never drafted
                row = torch.full((target.config.vocab_size,), -1, dtype=torch.long)
                row[ids_of.cpu()] = torch.arange(len(ids_of))
                r = row[nxt]
            ranks = torch.where(r >= 0, rank_of(logits[:-1], r.clamp(min=0)), 1 << 30).tolist()
            for p in profiles:
                acc[str(p)].append(walk(ranks, P, p))
    rows = []
    for p in profiles:
        seqs = acc[str(p)]
        steps, accepted = sum(len(s) for s in seqs), sum(sum(s) for s in seqs)
        per_pos = [sum(x > j for s in seqs for x in s) / steps for j in range(len(p))]
        rows.append({"widths": p, "nodes": tree_nodes(p), "walk_tau": 1 + accepted / steps, "steps": steps,
                     "per_position": per_pos, "per_sequence_steps_accepted": [[len(s), sum(s)] for s in seqs]})
    md = ["| widths per depth | nodes verified | walk τ | per position |", "|---|---:|---:|---|"]
    md += [f"| {r['widths']} | {r['nodes']} | {r['walk_tau']:.3f} | {' / '.join(f'{x:.3f}' for x in r['per_position'])} |"
           for r in rows]
    print("\n".join(md))
    if a.out:
        out = Path(a.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        src = a.records or f"MT-bench, {a.per_category} per category, target-only text"
        out.with_suffix(".json").write_text(json.dumps({"draft": a.draft, "source": src, "sequences": len(runs),
                                                        "profiles": rows}, indent=1) + "\n")
        out.with_suffix(".md").write_text("\n".join(md) + "\n")


if __name__ == "__main__":
    main()
