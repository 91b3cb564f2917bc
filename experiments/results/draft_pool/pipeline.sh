#!/usr/bin/env bash
# section 24: section 20's draft continuation (outputs/draft_mix5, rebuilt by ../draft_mix5/pipeline.sh) continued
# pooled (train.length_pool=8) over every self-distilled record at hand (shared corpus, regen5, regen6; regen6 never
# seen by a draft), new seed; walked against the shipped draft (section 18) and the section 20 continuation.
set -x
cd /work/main && . .venv/bin/activate
H=outputs/regen3/heldout_regen/regen.jsonl   # the 64 held-out answers (regen3 prompts 3,265-3,328)
G=outputs/gap
R=experiments/results/acceptance_gap
python -m specbench.train method=draft_model "method.layers=[0,1,2]" method.target_tables=true \
  method.init_from=outputs/draft_mix5 \
  "data.paths=[../shared/data/smollm2_regen/responses.jsonl,../shared/data/smollm2_regen/responses_2.jsonl,outputs/regen5/regen.jsonl,outputs/regen6/regen.jsonl]" \
  data.max_len=512 train.steps=${STEPS:-1700} train.batch_size=8 train.length_pool=8 train.lr=3e-4 train.warmup=20 \
  train.eval_every=${STEPS:-1700} train.save_every=25 train.max_wall_s=${WALL:-5700} \
  train.seed=9 train.log_every=10 method.eval_max_new_tokens=96 progress=false \
  out_dir=outputs/draft_pool hydra.run.dir=outputs/draft_pool || exit 1
python experiments/acceptance_gap.py --draft outputs/draft_pool/model --k 4 --target-only --per-category 10 --out $G/draftpool_mt80
python experiments/acceptance_gap.py --draft outputs/draft_pool/model --k 4 --records $H --limit 64 --out $G/draftpool_heldout19
python experiments/acceptance_gap.py --compare $R/draftmix_mt80.json $R/draftmix5_mt80.json $G/draftpool_mt80.json
python experiments/acceptance_gap.py --compare $R/draftmix_heldout19.json $R/draftmix5_heldout19.json $G/draftpool_heldout19.json
echo PIPELINE DONE
