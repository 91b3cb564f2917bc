#!/usr/bin/env bash
# section 26: rebuild the deterministic prompt lists, answer the 64 held-out prompts again, and answer regen8
# (lines 3,585-5,452 of regen6's list: the last ShareGPT first turns no drafter has seen)
set -ex
cd /work/main && . .venv/bin/activate
S=../shared/data/smollm2_regen
python experiments/regen_prompts.py --out outputs/regen3/prompts.jsonl --n 6000 --exclude $S/responses.jsonl $S/responses_2.jsonl
python experiments/regen_prompts.py --out outputs/regen6/prompts_all.jsonl --n 6000 \
    --exclude $S/responses.jsonl $S/responses_2.jsonl outputs/regen3/prompts.jsonl
sed -n 3265,3328p outputs/regen3/prompts.jsonl > outputs/regen3/heldout_prompts.jsonl
sed -n 3585,5452p outputs/regen6/prompts_all.jsonl > outputs/regen8_prompts.jsonl
wc -l outputs/regen6/prompts_all.jsonl outputs/regen8_prompts.jsonl
python -m specbench.train method=eagle3 data.mode=self_distill "data.paths=[outputs/regen3/heldout_prompts.jsonl]" \
    data.eval_prompts=0 train.steps=0 progress=false out_dir=outputs/regen3/heldout_regen hydra.run.dir=outputs/regen3/heldout_regen
python -m specbench.train method=eagle3 data.mode=self_distill "data.paths=[outputs/regen8_prompts.jsonl]" \
    data.eval_prompts=0 train.steps=0 progress=false out_dir=outputs/regen8 hydra.run.dir=outputs/regen8
echo REGEN DONE
