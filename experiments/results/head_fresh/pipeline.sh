#!/usr/bin/env bash
# section 29: the shipped EAGLE-3 head (head 8, section 23; the bf16 export is the start) continued pooled over the
# shared corpus and the four self-distilled sets the draft model's sections 25-28 answered (regen8-11, rebuilt by
# their sections' regen.sh records; regen9 by the first two commands of draft_fresh2/continue.sh: 10,954 answers
# no head has seen); walked on MT-bench and the 64 held-out answers, paired
# against the shipped head walked on this machine (the greedy text depends on the machine, section 26).
# FRESH, BASE, W, OUT, SEED, TAG, STEPS, WALL, INIT: later cycles set these (results/head_fresh2/pipeline.sh); the
# shipped head's walks are kept when $G already holds them under this TAG (the same machine's text, section 40)
set -x
cd /work/main && . .venv/bin/activate
H=outputs/regen3/heldout_regen/regen.jsonl   # the 64 held-out answers (regen3 prompts 3,265-3,328), answered again
G=outputs/gap
SHIPPED=specbench/weights/smollm2-135m-eagle3
OUT=${OUT:-eagle3_fresh} SEED=${SEED:-9} TAG=${TAG:-29} STEPS=${STEPS:-2000}
W=${W:-head9}   # the walks' name
BASE=${BASE:-head8}   # the shipped head's walks' name
FRESH=${FRESH:-"regen8 regen9 regen10 regen11"}   # the self-distilled sets listed after the shared corpus, once each
DATA=../shared/data/smollm2_regen/responses.jsonl,../shared/data/smollm2_regen/responses_2.jsonl
for R in $FRESH; do DATA=$DATA,outputs/$R/regen.jsonl; done
INIT=${INIT:-$SHIPPED}   # the head continued: the shipped one unless a later cycle names an unshipped export
python -m specbench.train method=eagle3 method.init_from=$INIT \
  "data.paths=[$DATA]" \
  data.max_len=512 method.eval_max_new_tokens=96 \
  train.steps=$STEPS train.batch_size=8 train.length_pool=8 train.lr=2e-4 train.warmup=20 \
  train.eval_every=$STEPS train.save_every=25 train.max_wall_s=${WALL:-4300} \
  train.seed=$SEED train.log_every=10 progress=false out_dir=outputs/$OUT hydra.run.dir=outputs/$OUT || exit 1
python experiments/acceptance_gap.py --head outputs/$OUT/model --target-only --per-category 10 --out $G/${W}_mt80
python experiments/acceptance_gap.py --head outputs/$OUT/model --records $H --limit 64 --out $G/${W}_heldout$TAG
[ -s $G/${BASE}_mt80_$TAG.json ] ||
  python experiments/acceptance_gap.py --head $SHIPPED --target-only --per-category 10 --out $G/${BASE}_mt80_$TAG
[ -s $G/${BASE}_heldout$TAG.json ] ||
  python experiments/acceptance_gap.py --head $SHIPPED --records $H --limit 64 --out $G/${BASE}_heldout$TAG
python experiments/acceptance_gap.py --compare $G/${BASE}_mt80_$TAG.json $G/${W}_mt80.json
python experiments/acceptance_gap.py --compare $G/${BASE}_heldout$TAG.json $G/${W}_heldout$TAG.json
echo PIPELINE DONE
