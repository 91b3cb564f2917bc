#!/usr/bin/env bash
# section 31, for the next cycle: 3,500 more ShareGPT later user turns, each asked on its own, none in regen13
# (the list experiments/results/regen13/regen.sh writes is excluded, so that script runs first). Resumable: a rerun
# answers only the chunks outputs/regen14/regen.jsonl does not hold yet.
set -ex
cd /work/main && . .venv/bin/activate
S=../shared/data/smollm2_regen
N=${N:-3500}
test -f outputs/regen13_prompts.jsonl || {
    echo "outputs/regen13_prompts.jsonl is missing; run experiments/results/regen13/regen.sh first" >&2; exit 2; }
python experiments/regen_prompts.py --turns later --min-chars 20 --out outputs/regen14_prompts.jsonl --n $N \
    --exclude $S/responses.jsonl $S/responses_2.jsonl outputs/regen3/prompts.jsonl outputs/regen6/prompts_all.jsonl \
    outputs/regen13_prompts.jsonl
python -m specbench.train method=eagle3 data.mode=self_distill "data.paths=[outputs/regen14_prompts.jsonl]" \
    data.eval_prompts=0 train.steps=0 progress=false out_dir=outputs/regen14 hydra.run.dir=outputs/regen14
echo REGEN DONE
