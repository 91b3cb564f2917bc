#!/usr/bin/env bash
# session 18: continue the shipped draft model (900 steps, section 14) over every self-distilled record not held out
set -x
cd /work/main && . .venv/bin/activate
R=outputs/regen3
tail -n +4353 $R/regen.jsonl > $R/train3.jsonl   # records 4,353-4,608, regenerated at the end of session 17
python -m specbench.train method=draft_model "method.layers=[0,1,2]" method.target_tables=true \
  method.init_from=specbench/weights/smollm2-135m-draft \
  "data.paths=[../shared/data/smollm2_regen/responses.jsonl,../shared/data/smollm2_regen/responses_2.jsonl,$R/train.jsonl,$R/train2.jsonl,$R/train3.jsonl]" \
  data.max_len=512 train.steps=${STEPS:-720} train.batch_size=8 train.lr=3e-4 train.warmup=20 train.eval_every=240 \
  train.save_every=25 train.seed=1 train.log_every=10 train.max_wall_s=4500 method.eval_max_new_tokens=96 \
  progress=false out_dir=outputs/draft_mix hydra.run.dir=outputs/draft_mix || exit 1
echo PIPELINE DONE
