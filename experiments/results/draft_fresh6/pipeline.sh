#!/usr/bin/env bash
# section 32: section 27's pipeline.sh on ShareGPT's later turns (regen13 + regen14: 7,000 later user turns, each
# asked on its own, answered by results/regen13/regen.sh and results/regen14/regen.sh): section 30's run
# (outputs/draft_fresh6, the shipped draft continued on regen12) continued over the shared corpus and regen13 and
# regen14, each listed twice, on a 2,000-step cosine sized to end inside the wall limit, seed 18, into
# outputs/draft_fresh7; paired against the shipped (section-28) draft, walks named for section 32
REGEN="regen13 regen14" INIT=outputs/draft_fresh6/model OUT=draft_fresh7 SEED=18 TAG=32 \
STEPS=${STEPS:-2000} WALL=${WALL:-3700} \
exec "$(dirname "$0")/../draft_fresh3/pipeline.sh"
