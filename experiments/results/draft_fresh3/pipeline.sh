#!/usr/bin/env bash
# section 27: the shipped draft (section 26; the bf16 export is the start) continued pooled over the shared corpus
# and regen10 (3,500 unanswered Alpaca/GPTeacher/GSM8K prompts answered this session by regen.sh), regen10 listed
# twice; walked on MT-bench and the 64 held-out answers, paired against the shipped draft walked on this machine.
# Later cycles run the same script with REGEN (the fresh answers: one set or several, space-separated, each listed
# twice), INIT (the start; the shipped draft unless set), OUT (the run folder), SEED, TAG (the section, naming the
# held-out and shipped walks), STEPS, WALL, LR and DROP set; the defaults are section 27's run.
set -x
cd /work/main && . .venv/bin/activate
H=outputs/regen3/heldout_regen/regen.jsonl   # the 64 held-out answers (regen3 prompts 3,265-3,328), answered again
G=outputs/gap
SHIPPED=specbench/weights/smollm2-135m-draft
REGEN=${REGEN:-regen10} OUT=${OUT:-draft_fresh4} SEED=${SEED:-13} TAG=${TAG:-27} STEPS=${STEPS:-2800}
INIT=${INIT:-$SHIPPED}
W=${OUT//_/}   # the walks' name: draftfresh4
FRESH=""
for R in $REGEN; do
  test -f outputs/$R/regen.jsonl || { echo "outputs/$R/regen.jsonl is missing (REGEN=$REGEN); run its regen.sh first" >&2; exit 2; }
  FRESH="$FRESH,outputs/$R/regen.jsonl,outputs/$R/regen.jsonl"
done
python -m specbench.train method=draft_model "method.layers=[0,1,2]" method.target_tables=true \
  method.init_from=$INIT \
  "data.paths=[../shared/data/smollm2_regen/responses.jsonl,../shared/data/smollm2_regen/responses_2.jsonl$FRESH]" \
  data.max_len=512 train.steps=$STEPS train.batch_size=8 train.length_pool=8 train.lr=${LR:-3e-4} train.warmup=20 \
  train.eval_every=$STEPS train.save_every=25 train.max_wall_s=${WALL:-4400} \
  train.seed=$SEED train.log_every=10 method.eval_max_new_tokens=96 progress=false \
  out_dir=outputs/$OUT hydra.run.dir=outputs/$OUT || exit 1
python experiments/acceptance_gap.py --draft outputs/$OUT/model --k 4 --target-only --per-category 10 --out $G/${W}_mt80
python experiments/acceptance_gap.py --draft outputs/$OUT/model --k 4 --records $H --limit 64 --out $G/${W}_heldout$TAG
# the shipped draft walked again on this machine's greedy text (see section 26: the text depends on the machine)
python experiments/acceptance_gap.py --draft $SHIPPED --k 4 --target-only --per-category 10 --out $G/shipped_mt80_$TAG
python experiments/acceptance_gap.py --draft $SHIPPED --k 4 --records $H --limit 64 --out $G/shipped_heldout$TAG
python experiments/acceptance_gap.py --compare $G/shipped_mt80_$TAG.json $G/${W}_mt80.json
python experiments/acceptance_gap.py --compare $G/shipped_heldout$TAG.json $G/${W}_heldout$TAG.json
# DROP: held-out sequences whose prompts open like a fresh prompt (a shared ShareGPT template), left out
test -z "$DROP" || python experiments/acceptance_gap.py --compare $G/shipped_heldout$TAG.json $G/${W}_heldout$TAG.json --drop $DROP
echo PIPELINE DONE
