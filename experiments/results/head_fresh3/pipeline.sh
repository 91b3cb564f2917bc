#!/usr/bin/env bash
# section 39: head 11. The shipped head 10 (section 31) continued over the shared corpus once and regen16 (ShareGPT
# later user turns no drafter has seen: results/regen16/regen.sh) listed twice, seed 23, on a cosine sized to end
# inside the wall limit, into outputs/eagle3_fresh3; walks named head11_* and, for the shipped head walked again on
# this machine's text, head10_*_39. The 64 held-out answers are answered again first when outputs/ lacks them
# (greedy text depends on the machine; regen16/regen.sh rebuilds their prompt list).
set -ex
cd /work/main && . .venv/bin/activate
if [ ! -s outputs/regen3/heldout_regen/regen.jsonl ]; then
  python -m specbench.train method=eagle3 data.mode=self_distill "data.paths=[outputs/regen3/heldout_prompts.jsonl]" \
    data.eval_prompts=0 train.steps=0 progress=false out_dir=outputs/regen3/heldout_regen hydra.run.dir=outputs/regen3/heldout_regen
fi
FRESH="regen16 regen16" OUT=eagle3_fresh3 SEED=23 TAG=39 W=head11 BASE=head10 STEPS=${STEPS:-600} WALL=${WALL:-2700} \
exec "$(dirname "$0")/../head_fresh/pipeline.sh"
