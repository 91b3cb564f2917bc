#!/usr/bin/env bash
# section 23: head 7 (section 22's run, rebuilt by ../pool_continuation/pipeline.sh into outputs/eagle3_pool)
# continued a second pass over the same self-distilled records (shared corpus, regen5, regen6), pooled, new seed;
# evaluated against the shipped head 7 by paired walks.
set -x
cd /work/main && . .venv/bin/activate
H=outputs/regen3/heldout_regen/regen.jsonl   # the 64 held-out answers (regen3 prompts 3,265-3,328)
R=experiments/results/acceptance_gap
python -m specbench.train method=eagle3 \
  "data.paths=[../shared/data/smollm2_regen/responses.jsonl,../shared/data/smollm2_regen/responses_2.jsonl,outputs/regen5/regen.jsonl,outputs/regen6/regen.jsonl]" \
  data.max_len=512 method.init_from=outputs/eagle3_pool method.eval_max_new_tokens=96 \
  train.steps=${STEPS:-1400} train.batch_size=8 train.length_pool=8 train.lr=2e-4 train.warmup=20 \
  train.eval_every=${STEPS:-1400} train.save_every=25 train.max_wall_s=${WALL:-6600} \
  train.seed=8 train.log_every=10 progress=false out_dir=outputs/eagle3_pool2 hydra.run.dir=outputs/eagle3_pool2 || exit 1
python experiments/acceptance_gap.py --head outputs/eagle3_pool2/model --target-only --per-category 10 --out outputs/gap/head8_mt80
python experiments/acceptance_gap.py --head outputs/eagle3_pool2/model --records $H --limit 64 --out outputs/gap/head8_heldout19
python experiments/acceptance_gap.py --compare $R/head7_mt80.json outputs/gap/head8_mt80.json
python experiments/acceptance_gap.py --compare $R/head7_heldout19.json outputs/gap/head8_heldout19.json
echo PIPELINE DONE
