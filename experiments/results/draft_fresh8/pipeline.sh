#!/usr/bin/env bash
# section 33: section 27's pipeline.sh on the next ShareGPT later turns (regen15, answered by results/regen15/regen.sh;
# no drafter has seen them): the shipped (section-32) draft continued over the shared corpus and regen15, listed
# twice, on a cosine sized to end inside the wall limit, seed 19, into outputs/draft_fresh8; paired against the
# shipped draft walked on this machine, walks named for section 33
REGEN="regen15" OUT=draft_fresh8 SEED=19 TAG=33 STEPS=${STEPS:-700} WALL=${WALL:-2700} \
exec "$(dirname "$0")/../draft_fresh3/pipeline.sh"
