#!/usr/bin/env bash
# session 19: a 2-layer draft (target layers 0-1), section 13's command otherwise (same batches as the 3- and
# 6-layer runs), walked over the same text and run in the loop at k = 2 against the 3-layer one.
set -x
cd /work/main && . .venv/bin/activate
G=outputs/gap R=outputs/regen3/heldout_regen/regen.jsonl NEW=outputs/draft2_300/model
python -m specbench.train method=draft_model method.init=target_layers "method.layers=[0,1]" \
    method.target_tables=true method.draft_vocab_size=8192 \
    "data.paths=[../shared/data/smollm2_regen/responses.jsonl,../shared/data/smollm2_regen/responses_2.jsonl]" \
    data.max_len=512 train.steps=300 train.batch_size=8 train.lr=1e-3 train.warmup=20 train.eval_every=100 \
    train.save_every=25 train.log_every=1 train.max_wall_s=3000 method.eval_max_new_tokens=96 progress=false \
    out_dir=outputs/draft2_300 hydra.run.dir=outputs/draft2_300
python experiments/acceptance_gap.py --draft $NEW --k 4 --records $R --limit 64 --out $G/draft2_heldout
python experiments/acceptance_gap.py --draft $NEW --k 4 --target-only --per-category 10 --out $G/draft2_mt80
A=experiments/results/acceptance_gap
python experiments/acceptance_gap.py --compare $A/draft300_heldout19.json $G/draft2_heldout.json $A/draft6_heldout.json
python experiments/acceptance_gap.py --compare $A/draft300_mt80.json $G/draft2_mt80.json $A/draft6_mt80.json
python -m specbench -m experiment=mt_bench_methods k=2 dtype=bfloat16 \
  method.drafter.path=outputs/draft300,$NEW hydra.sweep.dir=outputs/cmp_draft_depth2
python -m specbench.report outputs/cmp_draft_depth2
echo DEPTH2 DONE
# kept: the k = 2 sweep in k2_two_layers/, the training log as train_log_2layers.jsonl, the walks as results/acceptance_gap/draft2_*
