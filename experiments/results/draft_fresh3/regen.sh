#!/usr/bin/env bash
# section 27: rebuild the held-out prompt list and answer it again on this machine, then answer regen10: the next
# 3,500 unanswered prompts of the shared corpus's sources (after regen9's slice of the same shuffled lists).
# Later cycles run the same script with REGEN (the answers' folder), START and TAKE (leftover_prompts.py's src=N
# lists) set; the defaults are section 27's.
set -ex
cd /work/main && . .venv/bin/activate
S=../shared/data/smollm2_regen
REGEN=${REGEN:-regen10}
START=${START:-alpaca_5000=1000 gpteacher_codegen=400 gpteacher_roleplay=400 gsm8k_train=300}
TAKE=${TAKE:-alpaca_5000=1300 gpteacher_codegen=1000 gpteacher_roleplay=550 gsm8k_train=650}
python experiments/regen_prompts.py --out outputs/regen3/prompts.jsonl --n 6000 --exclude $S/responses.jsonl $S/responses_2.jsonl
sed -n 3265,3328p outputs/regen3/prompts.jsonl > outputs/regen3/heldout_prompts.jsonl
python -m specbench.train method=eagle3 data.mode=self_distill "data.paths=[outputs/regen3/heldout_prompts.jsonl]" \
    data.eval_prompts=0 train.steps=0 progress=false out_dir=outputs/regen3/heldout_regen hydra.run.dir=outputs/regen3/heldout_regen
python experiments/results/draft_fresh2/leftover_prompts.py outputs/${REGEN}_prompts.jsonl --start $START --take $TAKE
python -m specbench.train method=eagle3 data.mode=self_distill "data.paths=[outputs/${REGEN}_prompts.jsonl]" \
    data.eval_prompts=0 train.steps=0 progress=false out_dir=outputs/$REGEN hydra.run.dir=outputs/$REGEN
echo REGEN DONE
