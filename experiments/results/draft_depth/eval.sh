#!/usr/bin/env bash
# session 19: a 6-layer draft (target layers 0-5) against the 3-layer draft (section 13, commit 246b0e4), both
# 300 steps on the same data, batches and schedule: teacher-forced walks over the same text, then the MT-bench loop.
set -x
cd /work/main && . .venv/bin/activate
R=outputs/regen3 G=outputs/gap NEW=outputs/draft6_300/model
mkdir -p outputs/draft300 $G
for f in model.safetensors config.json; do git show 246b0e4:specbench/weights/smollm2-135m-draft/$f > outputs/draft300/$f; done
# the 64 held-out prompts of regen3 (records 3,265-3,328), answered again (outputs/ did not survive the session)
python -m specbench.train method=eagle3 data.mode=self_distill "data.paths=[$R/heldout_prompts.jsonl]" \
    data.eval_prompts=0 train.steps=0 out_dir=$R/heldout_regen hydra.run.dir=$R/heldout_regen
for d in draft300:outputs/draft300 draft6:$NEW draftmix:specbench/weights/smollm2-135m-draft; do
  python experiments/acceptance_gap.py --draft ${d#*:} --k 4 --records $R/heldout_regen/regen.jsonl --limit 64 --out $G/${d%%:*}_heldout
done
python experiments/acceptance_gap.py --draft $NEW --k 4 --target-only --per-category 10 --out $G/draft6_mt80
python experiments/acceptance_gap.py --compare $G/draft300_heldout.json $G/draft6_heldout.json $G/draftmix_heldout.json
python experiments/acceptance_gap.py --compare experiments/results/acceptance_gap/draft300_mt80.json $G/draft6_mt80.json
echo WALKS DONE
python -m specbench -m experiment=mt_bench_methods k=2,4 dtype=bfloat16 \
  method.drafter.path=outputs/draft300,$NEW hydra.sweep.dir=outputs/cmp_draft_depth
python -m specbench.report outputs/cmp_draft_depth
# kept: the sweep and the 6-layer run's training log here (train_log_6layers.jsonl); the walks in results/acceptance_gap/ as draft6_*,
# draft300_heldout19.*, draftmix_heldout19.* (the held-out text answered again this session)
