#!/usr/bin/env bash
# session 18: the continued draft (outputs/draft_mix) against the shipped 900-step draft: paired walks, the loop, MT-bench
set -x
cd /work/main && . .venv/bin/activate
R=outputs/regen3 G=outputs/gap OLD=specbench/weights/smollm2-135m-draft NEW=outputs/draft_mix/model
python experiments/acceptance_gap.py --draft $NEW --k 4 --records $R/heldout.jsonl --limit 64 --out $G/draftmix_heldout
python experiments/acceptance_gap.py --draft $OLD --k 4 --target-only --per-category 10 --out $G/draft900_mt80
python experiments/acceptance_gap.py --draft $NEW --k 4 --target-only --per-category 10 --out $G/draftmix_mt80
python experiments/acceptance_gap.py --draft $NEW --k 4 --out $G/draftmix_loop16
python experiments/acceptance_gap.py --compare $G/draft900_heldout.json $G/draftmix_heldout.json
python experiments/acceptance_gap.py --compare $G/draft900_mt80.json $G/draftmix_mt80.json
python -m specbench -m experiment=mt_bench_methods k=2,4 dtype=bfloat16 \
  method.drafter.path=$OLD,$NEW hydra.sweep.dir=outputs/cmp_draft_mix
python -m specbench.report outputs/cmp_draft_mix
echo EVAL DONE
