#!/usr/bin/env bash
# section 26, second step: answer regen9 (2,100 unanswered prompts of ../shared/data's alpaca_5000, gpteacher and
# gsm8k_train, from leftover_prompts.py), then continue the first step's fp32 checkpoint (outputs/draft_fresh2)
# pooled over the shared corpus, regen8 and regen9, each listed once; walked and paired as pipeline.sh.
set -x
cd /work/main && . .venv/bin/activate
H=outputs/regen3/heldout_regen/regen.jsonl
G=outputs/gap
python experiments/results/draft_fresh2/leftover_prompts.py outputs/regen9_prompts.jsonl || exit 1
python -m specbench.train method=eagle3 data.mode=self_distill "data.paths=[outputs/regen9_prompts.jsonl]" \
    data.eval_prompts=0 train.steps=0 progress=false out_dir=outputs/regen9 hydra.run.dir=outputs/regen9 || exit 1
python -m specbench.train method=draft_model "method.layers=[0,1,2]" method.target_tables=true \
  method.init_from=outputs/draft_fresh2 \
  "data.paths=[../shared/data/smollm2_regen/responses.jsonl,../shared/data/smollm2_regen/responses_2.jsonl,outputs/regen8/regen.jsonl,outputs/regen9/regen.jsonl]" \
  data.max_len=512 train.steps=${STEPS:-1350} train.batch_size=8 train.length_pool=8 train.lr=${LR:-2e-4} train.warmup=20 \
  train.eval_every=${STEPS:-1350} train.save_every=25 train.max_wall_s=${WALL:-2400} \
  train.seed=12 train.log_every=10 method.eval_max_new_tokens=96 progress=false \
  out_dir=outputs/draft_fresh3 hydra.run.dir=outputs/draft_fresh3 || exit 1
python experiments/acceptance_gap.py --draft outputs/draft_fresh3/model --k 4 --target-only --per-category 10 --out $G/draftfresh3_mt80
python experiments/acceptance_gap.py --draft outputs/draft_fresh3/model --k 4 --records $H --limit 64 --out $G/draftfresh3_heldout26
python experiments/acceptance_gap.py --compare $G/shipped_mt80_26.json $G/draftfresh3_mt80.json
python experiments/acceptance_gap.py --compare $G/shipped_heldout26.json $G/draftfresh3_heldout26.json
python experiments/acceptance_gap.py --compare $G/draftfresh2_mt80.json $G/draftfresh3_mt80.json
python experiments/acceptance_gap.py --compare $G/draftfresh2_heldout26.json $G/draftfresh3_heldout26.json
echo CONTINUE DONE
