#!/usr/bin/env bash
# section 30, for the next cycle: the shared corpus's sources and ShareGPT's first turns are spent, so regen13 answers
# ShareGPT's later user turns, each asked on its own (regen_prompts.py --turns later; 35,273 usable at 20-1,500
# characters, none a turn already answered): the first 3,500 of that shuffled list. The exclusions are files any
# machine rebuilds (the shared corpus's answers, regen3's and regen6's first-turn lists), so the list is the same
# everywhere. Resumable: a rerun answers only the chunks outputs/regen13/regen.jsonl does not hold yet.
set -ex
cd /work/main && . .venv/bin/activate
S=../shared/data/smollm2_regen
N=${N:-3500}
python experiments/regen_prompts.py --out outputs/regen3/prompts.jsonl --n 6000 --exclude $S/responses.jsonl $S/responses_2.jsonl
python experiments/regen_prompts.py --out outputs/regen6/prompts_all.jsonl --n 6000 \
    --exclude $S/responses.jsonl $S/responses_2.jsonl outputs/regen3/prompts.jsonl
python experiments/regen_prompts.py --turns later --min-chars 20 --out outputs/regen13_prompts.jsonl --n $N \
    --exclude $S/responses.jsonl $S/responses_2.jsonl outputs/regen3/prompts.jsonl outputs/regen6/prompts_all.jsonl
python -m specbench.train method=eagle3 data.mode=self_distill "data.paths=[outputs/regen13_prompts.jsonl]" \
    data.eval_prompts=0 train.steps=0 progress=false out_dir=outputs/regen13 hydra.run.dir=outputs/regen13
echo REGEN DONE
