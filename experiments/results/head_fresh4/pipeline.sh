#!/usr/bin/env bash
# section 40: head 12. Head 11 (section 39, not shipped: outputs/eagle3_fresh3/model, rebuilt by
# results/head_fresh3/pipeline.sh) continued over the shared corpus once and all 3,500 of regen16 (rerun
# results/regen16/regen.sh first: it answers the 684 section 39 left) listed twice, seed 29, on a cosine sized to
# end inside the wall limit, into outputs/eagle3_fresh4; walks named head12_*, paired against the shipped head 10's
# walks on this machine's text (section 39's head10_*_39, walked again when outputs/gap lacks them).
set -ex
cd /work/main && . .venv/bin/activate
if [ ! -s outputs/regen3/heldout_regen/regen.jsonl ]; then
  python -m specbench.train method=eagle3 data.mode=self_distill "data.paths=[outputs/regen3/heldout_prompts.jsonl]" \
    data.eval_prompts=0 train.steps=0 progress=false out_dir=outputs/regen3/heldout_regen hydra.run.dir=outputs/regen3/heldout_regen
fi
FRESH="regen16 regen16" OUT=eagle3_fresh4 SEED=29 TAG=39 W=head12 BASE=head10 INIT=outputs/eagle3_fresh3/model \
STEPS=${STEPS:-1250} WALL=${WALL:-6000} exec "$(dirname "$0")/../head_fresh/pipeline.sh"
