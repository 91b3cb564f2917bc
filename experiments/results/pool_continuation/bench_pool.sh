#!/usr/bin/env bash
# section 22: trained tokens/s of the same 16 steps (seed 5: the same 128 sequences) with and without
# train.length_pool=8, EAGLE-3 continued from the shipped head, online teacher, bf16 autocast. Prints
# "P=<pool> <trained tokens> <training wall s> <trained tokens/s>".
cd /work/main && . .venv/bin/activate
for P in 1 8; do
python -m specbench.train method=eagle3 \
  "data.paths=[../shared/data/smollm2_regen/responses.jsonl,../shared/data/smollm2_regen/responses_2.jsonl,outputs/regen5/regen.jsonl,outputs/regen6/regen.jsonl]" \
  data.max_len=512 method.init_from=specbench/weights/smollm2-135m-eagle3 method.eval_max_new_tokens=8 \
  train.steps=16 train.batch_size=8 train.lr=2e-4 train.warmup=2 train.eval_every=0 train.save_every=100 \
  train.seed=5 train.log_every=16 train.length_pool=$P progress=false resume=false out_dir=/tmp/pool$P hydra.run.dir=/tmp/pool$P >/dev/null 2>&1
grep train_tokens_per_s /tmp/pool$P/train_log.jsonl | python -c "import sys,json; r=json.loads(sys.stdin.readlines()[-1]); print('P=$P', r['tokens'], round(r['wall_s'],1), round(r['train_tokens_per_s'],1))"
done
