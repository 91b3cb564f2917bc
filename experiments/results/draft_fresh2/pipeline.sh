#!/usr/bin/env bash
# section 26: the shipped draft (section 25; the bf16 export is the start) continued pooled over the shared corpus
# and regen8 (1,868 ShareGPT first turns no draft has seen, answered this session by regen.sh), each listed once;
# walked on MT-bench and the 64 held-out answers, paired against the shipped draft.
set -x
cd /work/main && . .venv/bin/activate
H=outputs/regen3/heldout_regen/regen.jsonl   # the 64 held-out answers (regen3 prompts 3,265-3,328), answered again
G=outputs/gap
R=experiments/results/acceptance_gap
SHIPPED=specbench/weights/smollm2-135m-draft
python -m specbench.train method=draft_model "method.layers=[0,1,2]" method.target_tables=true \
  method.init_from=$SHIPPED \
  "data.paths=[../shared/data/smollm2_regen/responses.jsonl,../shared/data/smollm2_regen/responses_2.jsonl,outputs/regen8/regen.jsonl]" \
  data.max_len=512 train.steps=${STEPS:-1350} train.batch_size=8 train.length_pool=8 train.lr=3e-4 train.warmup=20 \
  train.eval_every=${STEPS:-1350} train.save_every=25 train.max_wall_s=${WALL:-4200} \
  train.seed=11 train.log_every=10 method.eval_max_new_tokens=96 progress=false \
  out_dir=outputs/draft_fresh2 hydra.run.dir=outputs/draft_fresh2 || exit 1
python experiments/acceptance_gap.py --draft outputs/draft_fresh2/model --k 4 --target-only --per-category 10 --out $G/draftfresh2_mt80
python experiments/acceptance_gap.py --draft outputs/draft_fresh2/model --k 4 --records $H --limit 64 --out $G/draftfresh2_heldout26
# the shipped draft walked again on this machine: its greedy text (MT-bench target-only, and the held-out answers
# regenerated this session) differs from section 25's machine's, so the section-25 walks are not its pair
python experiments/acceptance_gap.py --draft $SHIPPED --k 4 --target-only --per-category 10 --out $G/shipped_mt80_26
python experiments/acceptance_gap.py --draft $SHIPPED --k 4 --records $H --limit 64 --out $G/shipped_heldout26
python experiments/acceptance_gap.py --compare $G/shipped_mt80_26.json $G/draftfresh2_mt80.json
python experiments/acceptance_gap.py --compare $G/shipped_heldout26.json $G/draftfresh2_heldout26.json
echo PIPELINE DONE
