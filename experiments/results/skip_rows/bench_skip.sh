#!/usr/bin/env bash
# section 23: trained tokens/s of the same 16 pooled steps (seed 5: the same 128 sequences, train.length_pool=8)
# with the training step before this section (git b5c5413, checked out as a worktree in $OLD) and with unused
# indices skipped (this tree); EAGLE-3 continued from the shipped head, online teacher, bf16 autocast; the two
# alternate twice. Prints "<tree> <trained tokens> <training wall s> <trained tokens/s> <final loss>".
OLD=${OLD:-/tmp/old_sb}   # git worktree add /tmp/old_sb b5c5413
M=/work/main
. $M/.venv/bin/activate
for rep in 1 2; do for tree in $OLD $M; do
  (cd $tree && python -m specbench.train method=eagle3 \
  "data.paths=[$M/../shared/data/smollm2_regen/responses.jsonl,$M/../shared/data/smollm2_regen/responses_2.jsonl,$M/outputs/regen5/regen.jsonl,$M/outputs/regen6/regen.jsonl]" \
  data.max_len=512 method.init_from=$M/specbench/weights/smollm2-135m-eagle3 method.eval_max_new_tokens=8 \
  train.steps=16 train.batch_size=8 train.lr=2e-4 train.warmup=2 train.eval_every=0 train.save_every=100 \
  train.seed=5 train.log_every=16 train.length_pool=8 progress=false resume=false out_dir=/tmp/skip_bench hydra.run.dir=/tmp/skip_bench >/dev/null 2>&1)
  grep train_tokens_per_s /tmp/skip_bench/train_log.jsonl | python -c "import sys,json; r=json.loads(sys.stdin.readlines()[-1]); print('$tree', r['tokens'], round(r['wall_s'],1), round(r['train_tokens_per_s'],1), round(r['loss'],4))"
done; done
