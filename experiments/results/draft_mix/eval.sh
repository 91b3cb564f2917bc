#!/usr/bin/env bash
# session 18: the continued draft (outputs/draft_mix/model, shipped now) against the drafts it follows, from git
# history: draft900 (commit 616a3ff, shipped before this session) and draft300 (commit 246b0e4): paired teacher-
# forced walks over the same text, the loop-vs-walk check, the MT-bench sweep. (This session ran the draft900 steps
# with OLD=specbench/weights/smollm2-135m-draft, before the copy in that folder was replaced: the same file.)
set -x
cd /work/main && . .venv/bin/activate
R=outputs/regen3 G=outputs/gap NEW=outputs/draft_mix/model
for c in 616a3ff:draft900 246b0e4:draft300; do
  mkdir -p outputs/${c#*:}
  for f in model.safetensors config.json; do
    git show ${c%:*}:specbench/weights/smollm2-135m-draft/$f > outputs/${c#*:}/$f
  done
done
for d in draft300:outputs/draft300 draft900:outputs/draft900 draftmix:$NEW; do
  python experiments/acceptance_gap.py --draft ${d#*:} --k 4 --records $R/heldout.jsonl --limit 64 --out $G/${d%%:*}_heldout
  python experiments/acceptance_gap.py --draft ${d#*:} --k 4 --target-only --per-category 10 --out $G/${d%%:*}_mt80
done
python experiments/acceptance_gap.py --draft $NEW --k 4 --out $G/draftmix_loop16   # the loop's own output: walk = loop?
python experiments/acceptance_gap.py --compare $G/draft300_heldout.json $G/draft900_heldout.json $G/draftmix_heldout.json
python experiments/acceptance_gap.py --compare $G/draft300_mt80.json $G/draft900_mt80.json $G/draftmix_mt80.json
python -m specbench -m experiment=mt_bench_methods k=2,4 dtype=bfloat16 \
  method.drafter.path=outputs/draft900,$NEW hydra.sweep.dir=outputs/cmp_draft_mix
python -m specbench.report outputs/cmp_draft_mix
echo EVAL DONE
