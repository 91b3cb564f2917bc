#!/usr/bin/env bash
# session 17: continue the shipped head (head 3) over every regen3 record not held out, seed 1, lr 2e-4; evaluate
set -x
cd /work/main && . .venv/bin/activate
R=outputs/regen3
python -m specbench.train method=eagle3 \
  "data.paths=[../shared/data/smollm2_regen/responses.jsonl,../shared/data/smollm2_regen/responses_2.jsonl,$R/train.jsonl,$R/train2.jsonl]" \
  data.max_len=512 method.init_from=specbench/weights/smollm2-135m-eagle3 method.eval_max_new_tokens=96 \
  train.steps=${STEPS:-720} train.batch_size=8 train.lr=2e-4 train.warmup=20 train.eval_every=${STEPS:-720} train.save_every=25 \
  train.seed=1 train.log_every=10 progress=false out_dir=outputs/eagle3_mix2 hydra.run.dir=outputs/eagle3_mix2 || exit 1
python experiments/acceptance_gap.py --head outputs/eagle3_mix2/model --records $R/heldout.jsonl --limit 64 --out outputs/gap/head4_heldout
python experiments/acceptance_gap.py --head outputs/eagle3_mix2/model --target-only --per-category 10 --out outputs/gap/head4_mt80
python experiments/acceptance_gap.py --head outputs/first_head --records $R/heldout.jsonl --limit 64 --out outputs/gap/first_heldout
python experiments/acceptance_gap.py --head outputs/first_head --target-only --per-category 10 --out outputs/gap/first_mt80
python -m specbench -m experiment=mt_bench_eagle3 k=3 \
  method.drafter.path=specbench/weights/smollm2-135m-eagle3,outputs/eagle3_mix2/model hydra.sweep.dir=outputs/cmp_mix2
python -m specbench.report outputs/cmp_mix2
echo PIPELINE DONE
