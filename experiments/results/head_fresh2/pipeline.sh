#!/usr/bin/env bash
# section 31: section 29's pipeline.sh on the two self-distilled sets no head has seen: regen12 (the sources' last
# 4,205 prompts, GPTeacher codegen and GSM8K: results/regen12/regen.sh) and regen13 (3,500 ShareGPT later user
# turns asked on their own: results/regen13/regen.sh). The shipped head 9 continued over the shared corpus and both
# sets once each on a 1,400-step cosine sized to end inside the wall limit, seed 17, into outputs/eagle3_fresh2;
# walks named head10_* and, for the shipped head walked again, head9_*_31
FRESH="regen12 regen13" OUT=eagle3_fresh2 SEED=17 TAG=31 W=head10 BASE=head9 STEPS=${STEPS:-1400} WALL=${WALL:-3800} \
exec "$(dirname "$0")/../head_fresh/pipeline.sh"
