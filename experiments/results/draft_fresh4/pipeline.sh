#!/usr/bin/env bash
# section 28: section 27's pipeline.sh on regen11 (3,486 unanswered Alpaca/GPTeacher/GSM8K prompts answered this
# session by regen.sh): the shipped (section-27) draft continued over the shared corpus and regen11 listed twice on
# a 2,400-step cosine sized to end inside the wall limit, seed 14, into outputs/draft_fresh5; walks named for section 28
REGEN=regen11 OUT=draft_fresh5 SEED=14 TAG=28 STEPS=${STEPS:-2400} WALL=${WALL:-4300} \
exec "$(dirname "$0")/../draft_fresh3/pipeline.sh"
