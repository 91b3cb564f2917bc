#!/usr/bin/env bash
# section 31, for the next cycle: 3,500 more ShareGPT later user turns, each asked on its own, none in regen13
# (the list experiments/results/regen13/regen.sh writes is excluded, so that script runs first). Resumable: a rerun
# answers only the chunks outputs/regen14/regen.jsonl does not hold yet. Later cycles run it with NAME (the set:
# outputs/NAME/regen.jsonl, outputs/NAME_prompts.jsonl) and PRIOR (the earlier later-turn sets whose prompt lists
# are excluded) set; the defaults are section 31's run.
set -ex
cd /work/main && . .venv/bin/activate
S=../shared/data/smollm2_regen
N=${N:-3500} NAME=${NAME:-regen14} PRIOR=${PRIOR:-regen13}
LISTS=""
for P in $PRIOR; do
    test -f outputs/${P}_prompts.jsonl || {
        echo "outputs/${P}_prompts.jsonl is missing; run experiments/results/$P/regen.sh first" >&2; exit 2; }
    LISTS="$LISTS outputs/${P}_prompts.jsonl"
done
python experiments/regen_prompts.py --turns later --min-chars 20 --out outputs/${NAME}_prompts.jsonl --n $N \
    --exclude $S/responses.jsonl $S/responses_2.jsonl outputs/regen3/prompts.jsonl outputs/regen6/prompts_all.jsonl \
    $LISTS
python -m specbench.train method=eagle3 data.mode=self_distill "data.paths=[outputs/${NAME}_prompts.jsonl]" \
    data.eval_prompts=0 train.steps=0 progress=false out_dir=outputs/$NAME hydra.run.dir=outputs/$NAME
echo REGEN DONE
