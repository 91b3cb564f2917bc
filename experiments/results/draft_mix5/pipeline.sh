#!/usr/bin/env bash
# section 20: continue the shipped draft (section 18) on the 1,392 fresh answers it never saw (regen3 prompts
# 4,609-6,000, the tail of outputs/regen5/regen.jsonl; listed three times) plus the shared corpus; walk it.
set -x
cd /work/main && . .venv/bin/activate
tail -n +257 outputs/regen5/regen.jsonl > outputs/regen5/draft_new.jsonl
N=outputs/regen5/draft_new.jsonl
H=outputs/regen3/heldout_regen/regen.jsonl
G=outputs/gap
python -m specbench.train method=draft_model "method.layers=[0,1,2]" method.target_tables=true \
  method.init_from=specbench/weights/smollm2-135m-draft \
  "data.paths=[../shared/data/smollm2_regen/responses.jsonl,../shared/data/smollm2_regen/responses_2.jsonl,$N,$N,$N]" \
  data.max_len=512 train.steps=${STEPS:-200} train.batch_size=8 train.lr=3e-4 train.warmup=20 train.eval_every=${STEPS:-200} \
  train.save_every=25 train.seed=4 train.log_every=10 method.eval_max_new_tokens=96 progress=false \
  out_dir=outputs/draft_mix5 hydra.run.dir=outputs/draft_mix5 || exit 1
python experiments/acceptance_gap.py --draft outputs/draft_mix5/model --k 4 --records $H --limit 64 --out $G/draftmix5_heldout19
python experiments/acceptance_gap.py --draft outputs/draft_mix5/model --k 4 --target-only --per-category 10 --out $G/draftmix5_mt80
python experiments/acceptance_gap.py --compare experiments/results/acceptance_gap/draftmix_heldout19.json $G/draftmix5_heldout19.json
python experiments/acceptance_gap.py --compare experiments/results/acceptance_gap/draftmix_mt80.json $G/draftmix5_mt80.json
echo PIPELINE DONE
