#!/usr/bin/env bash
# section 30: section 27's pipeline.sh on regen12 (the sources' last 4,205 unanswered prompts: gpteacher_codegen 901,
# gsm8k_train 3,304, answered by results/regen12/regen.sh): the shipped (section-28) draft continued over the shared
# corpus and regen12 listed twice on a 2,000-step cosine sized to end inside the wall limit, seed 15, into
# outputs/draft_fresh6; walks named for section 30
REGEN=regen12 OUT=draft_fresh6 SEED=15 TAG=30 STEPS=${STEPS:-2000} WALL=${WALL:-3700} \
exec "$(dirname "$0")/../draft_fresh3/pipeline.sh"
