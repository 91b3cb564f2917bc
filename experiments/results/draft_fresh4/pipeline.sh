#!/usr/bin/env bash
# section 28: the shipped draft (section 27; the bf16 export is the start) continued pooled over the shared corpus
# and regen11 (3,486 unanswered Alpaca/GPTeacher/GSM8K prompts answered this session by regen.sh), regen11 listed
# twice; walked on MT-bench and the 64 held-out answers, paired against the shipped draft walked on this machine.
set -x
cd /work/main && . .venv/bin/activate
H=outputs/regen3/heldout_regen/regen.jsonl   # the 64 held-out answers (regen3 prompts 3,265-3,328), answered again
G=outputs/gap
SHIPPED=specbench/weights/smollm2-135m-draft
python -m specbench.train method=draft_model "method.layers=[0,1,2]" method.target_tables=true \
  method.init_from=$SHIPPED \
  "data.paths=[../shared/data/smollm2_regen/responses.jsonl,../shared/data/smollm2_regen/responses_2.jsonl,outputs/regen11/regen.jsonl,outputs/regen11/regen.jsonl]" \
  data.max_len=512 train.steps=${STEPS:-2400} train.batch_size=8 train.length_pool=8 train.lr=3e-4 train.warmup=20 \
  train.eval_every=${STEPS:-2400} train.save_every=25 train.max_wall_s=${WALL:-4300} \
  train.seed=14 train.log_every=10 method.eval_max_new_tokens=96 progress=false \
  out_dir=outputs/draft_fresh5 hydra.run.dir=outputs/draft_fresh5 || exit 1
python experiments/acceptance_gap.py --draft outputs/draft_fresh5/model --k 4 --target-only --per-category 10 --out $G/draftfresh5_mt80
python experiments/acceptance_gap.py --draft outputs/draft_fresh5/model --k 4 --records $H --limit 64 --out $G/draftfresh5_heldout28
# the shipped draft walked again on this machine's greedy text (see section 26: the text depends on the machine)
python experiments/acceptance_gap.py --draft $SHIPPED --k 4 --target-only --per-category 10 --out $G/shipped_mt80_28
python experiments/acceptance_gap.py --draft $SHIPPED --k 4 --records $H --limit 64 --out $G/shipped_heldout28
python experiments/acceptance_gap.py --compare $G/shipped_mt80_28.json $G/draftfresh5_mt80.json
python experiments/acceptance_gap.py --compare $G/shipped_heldout28.json $G/draftfresh5_heldout28.json
echo PIPELINE DONE
