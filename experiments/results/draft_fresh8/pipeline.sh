#!/usr/bin/env bash
# section 33: section 27's pipeline.sh on the next ShareGPT later turns (regen15, answered by results/regen15/regen.sh;
# no drafter has seen them): the shipped (section-32) draft continued over the shared corpus and regen15, listed
# twice, on a cosine sized to end inside the wall limit, seed 19, into outputs/draft_fresh8; paired against the
# shipped draft walked on this machine, walks named for section 33; held-out prompts 17 and 44 share a 60-character
# opening with regen15 prompts (regen_prompts.py --held-out counts them), so the held-out pair is also printed without
REGEN="regen15" OUT=draft_fresh8 SEED=19 TAG=33 DROP=17,44 STEPS=${STEPS:-600} WALL=${WALL:-2800} \
exec "$(dirname "$0")/../draft_fresh3/pipeline.sh"
