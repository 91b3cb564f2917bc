#!/usr/bin/env bash
# section 31, for the next cycle: 3,500 more ShareGPT later user turns, each asked on its own, none in regen13.
# Resumable: a rerun answers only the chunks outputs/regen14/regen.jsonl does not hold yet. Later cycles run it with
# NAME (the set: outputs/NAME/regen.jsonl, outputs/NAME_prompts.jsonl) and PRIOR (the earlier later-turn sets, in
# the order they were drawn) set; the defaults are section 31's run. Every prompt list is rebuilt here (seconds;
# deterministic: each set's list excludes the shared corpus's answers, regen3's and regen6's first-turn lists and
# the sets before it), so a fresh machine answers only NAME and needs none of the earlier answers. Sets from
# regen16 on also drop prompts that open with the same 60 characters as one of the 64 held-out prompts
# (regen_prompts.py --held-out, section 33); regen13-15 were drawn without that filter and are rebuilt as drawn.
set -ex
cd /work/main && . .venv/bin/activate
S=../shared/data/smollm2_regen
N=${N:-3500} NAME=${NAME:-regen14} PRIOR=${PRIOR-regen13}   # PRIOR= (empty): the first set, regen13
python experiments/regen_prompts.py --out outputs/regen3/prompts.jsonl --n 6000 --exclude $S/responses.jsonl $S/responses_2.jsonl
sed -n 3265,3328p outputs/regen3/prompts.jsonl > outputs/regen3/heldout_prompts.jsonl
python experiments/regen_prompts.py --out outputs/regen6/prompts_all.jsonl --n 6000 \
    --exclude $S/responses.jsonl $S/responses_2.jsonl outputs/regen3/prompts.jsonl
LISTS=""
for P in $PRIOR $NAME; do
    case $P in
        regen13|regen14|regen15) HELD="" ;;
        *) HELD="--held-out outputs/regen3/heldout_prompts.jsonl" ;;
    esac
    n=3500; [ "$P" = "$NAME" ] && n=$N   # every earlier set was drawn at 3,500
    python experiments/regen_prompts.py --turns later --min-chars 20 --out outputs/${P}_prompts.jsonl --n $n $HELD \
        --exclude $S/responses.jsonl $S/responses_2.jsonl outputs/regen3/prompts.jsonl outputs/regen6/prompts_all.jsonl \
        $LISTS
    LISTS="$LISTS outputs/${P}_prompts.jsonl"
done
python -m specbench.train method=eagle3 data.mode=self_distill "data.paths=[outputs/${NAME}_prompts.jsonl]" \
    data.eval_prompts=0 train.steps=0 progress=false out_dir=outputs/$NAME hydra.run.dir=outputs/$NAME
echo REGEN DONE
