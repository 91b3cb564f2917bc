#!/usr/bin/env bash
# section 34: section 33's run (outputs/draft_fresh8, 0.90M trained tokens, not shipped alone) continued on all
# 3,500 regen15 answers (section 33 had trained on the first 2,816), regen15 listed four times (64 % of the listed
# tokens fresh, section 32's share), lr 2e-4 (a continuation of a run whose cosine just ended, not a restart from the
# shipped draft), a cosine sized to end inside the wall limit, seed 23, into outputs/draft_fresh9; paired against the
# shipped draft walked on this machine; held-out 17 and 44 left out in the third pair (see draft_fresh8).
test -f outputs/draft_fresh8/model/model.safetensors || { echo "outputs/draft_fresh8/model is missing: run results/draft_fresh8/pipeline.sh first" >&2; exit 2; }
REGEN="regen15 regen15" INIT=outputs/draft_fresh8/model OUT=draft_fresh9 SEED=23 TAG=34 DROP=17,44 LR=${LR:-2e-4} \
STEPS=${STEPS:-1350} WALL=${WALL:-5000} exec "$(dirname "$0")/../draft_fresh3/pipeline.sh"
