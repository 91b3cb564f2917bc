#!/usr/bin/env bash
# section 32, for the next cycle: 3,500 more ShareGPT later user turns, each asked on its own, none in regen13 or
# regen14 (the lists experiments/results/regen13/regen.sh and regen14/regen.sh write are excluded, so those scripts
# run first). Resumable: a rerun answers only the chunks outputs/regen15/regen.jsonl does not hold yet.
set -ex
cd /work/main && . .venv/bin/activate
S=../shared/data/smollm2_regen
N=${N:-3500}
for P in regen13 regen14; do
    test -f outputs/${P}_prompts.jsonl || {
        echo "outputs/${P}_prompts.jsonl is missing; run experiments/results/$P/regen.sh first" >&2; exit 2; }
done
python experiments/regen_prompts.py --turns later --min-chars 20 --out outputs/regen15_prompts.jsonl --n $N \
    --exclude $S/responses.jsonl $S/responses_2.jsonl outputs/regen3/prompts.jsonl outputs/regen6/prompts_all.jsonl \
    outputs/regen13_prompts.jsonl outputs/regen14_prompts.jsonl
python -m specbench.train method=eagle3 data.mode=self_distill "data.paths=[outputs/regen15_prompts.jsonl]" \
    data.eval_prompts=0 train.steps=0 progress=false out_dir=outputs/regen15 hydra.run.dir=outputs/regen15
echo REGEN DONE
