#!/usr/bin/env bash
# section 28: rebuild the held-out prompt list and answer it again on this machine, then answer regen11: the next
# unanswered prompts of the shared corpus's sources (after regen10's slice of the same shuffled lists): the rest of
# alpaca_5000 and gpteacher_roleplay, 1,000 more codegen, 1,200 more gsm8k
set -ex
cd /work/main && . .venv/bin/activate
S=../shared/data/smollm2_regen
python experiments/regen_prompts.py --out outputs/regen3/prompts.jsonl --n 6000 --exclude $S/responses.jsonl $S/responses_2.jsonl
sed -n 3265,3328p outputs/regen3/prompts.jsonl > outputs/regen3/heldout_prompts.jsonl
python -m specbench.train method=eagle3 data.mode=self_distill "data.paths=[outputs/regen3/heldout_prompts.jsonl]" \
    data.eval_prompts=0 train.steps=0 progress=false out_dir=outputs/regen3/heldout_regen hydra.run.dir=outputs/regen3/heldout_regen
python experiments/results/draft_fresh2/leftover_prompts.py outputs/regen11_prompts.jsonl \
    --start alpaca_5000=2300 gpteacher_codegen=1400 gpteacher_roleplay=950 gsm8k_train=950 \
    --take alpaca_5000=1000 gpteacher_codegen=1000 gpteacher_roleplay=500 gsm8k_train=1200
python -m specbench.train method=eagle3 data.mode=self_distill "data.paths=[outputs/regen11_prompts.jsonl]" \
    data.eval_prompts=0 train.steps=0 progress=false out_dir=outputs/regen11 hydra.run.dir=outputs/regen11
echo REGEN DONE
