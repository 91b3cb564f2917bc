#!/usr/bin/env bash
# session 19: does depth help a trained draft? The shipped draft (3 layers, 2.41M trained tokens) continued 200
# steps as it is (arm A) and grown to 6 layers (arm B: target layers 3-5 appended with zeroed output projections,
# so B starts as A's exact function) on the same batches, then walked over the same text and run in the loop.
set -x
cd /work/main && . .venv/bin/activate
D="data.paths=[../shared/data/smollm2_regen/responses.jsonl,../shared/data/smollm2_regen/responses_2.jsonl]"
COMMON="method=draft_model method.target_tables=true method.init_from=specbench/weights/smollm2-135m-draft $D
  data.max_len=512 train.steps=200 train.batch_size=8 train.lr=3e-4 train.warmup=20 train.eval_every=200
  train.save_every=25 train.seed=3 train.log_every=1 method.eval_max_new_tokens=96 progress=false"
python -m specbench.train $COMMON "method.layers=[0,1,2]" out_dir=outputs/grow_a3 hydra.run.dir=outputs/grow_a3
python -m specbench.train $COMMON "method.layers=[0,1,2,3,4,5]" out_dir=outputs/grow_b6 hydra.run.dir=outputs/grow_b6
echo TRAIN DONE
G=outputs/gap R=outputs/regen3/heldout_regen/regen.jsonl
for d in grow_a3 grow_b6; do
  python experiments/acceptance_gap.py --draft outputs/$d/model --k 4 --records $R --limit 64 --out $G/${d}_heldout
  python experiments/acceptance_gap.py --draft outputs/$d/model --k 4 --target-only --per-category 10 --out $G/${d}_mt80
done
python experiments/acceptance_gap.py --compare $G/draftmix_heldout.json $G/grow_a3_heldout.json $G/grow_b6_heldout.json
python experiments/acceptance_gap.py --compare experiments/results/acceptance_gap/draftmix_mt80.json $G/grow_a3_mt80.json $G/grow_b6_mt80.json
python experiments/paired_ab.py outputs/grow_a3 outputs/grow_b6 --out outputs/gap/grow_paired
echo WALKS DONE
# kept: the two training logs and the paired tables here (paired_train*: per-batch, from the logs; paired_*.md:
# the walks, results/acceptance_gap/grow_*); the two drafts were not kept (neither beats the shipped draft)
