#!/usr/bin/env bash
# section 22: head 6 (section 21's run, rebuilt by ../mix4_continuation/pipeline.sh into outputs/eagle3_mix4)
# continued over every self-distilled record once (shared corpus, regen5, regen6) with length-pooled batches
# (train.length_pool=8: ~1.47x the trained tokens/s of the same draws unpooled); evaluated against the shipped
# head 5 by paired walks. Head 5 is the shipped file as of git 3a391c5.
set -x
cd /work/main && . .venv/bin/activate
H=outputs/regen3/heldout_regen/regen.jsonl   # the 64 held-out answers (regen3 prompts 3,265-3,328)
R=experiments/results/acceptance_gap
python -m specbench.train method=eagle3 \
  "data.paths=[../shared/data/smollm2_regen/responses.jsonl,../shared/data/smollm2_regen/responses_2.jsonl,outputs/regen5/regen.jsonl,outputs/regen6/regen.jsonl]" \
  data.max_len=512 method.init_from=outputs/eagle3_mix4 method.eval_max_new_tokens=96 \
  train.steps=${STEPS:-1600} train.batch_size=8 train.length_pool=8 train.lr=2e-4 train.warmup=20 \
  train.eval_every=${STEPS:-1600} train.save_every=25 train.max_wall_s=7200 \
  train.seed=7 train.log_every=10 progress=false out_dir=outputs/eagle3_pool hydra.run.dir=outputs/eagle3_pool || exit 1
python experiments/acceptance_gap.py --head outputs/eagle3_pool/model --target-only --per-category 10 --out outputs/gap/head7_mt80
python experiments/acceptance_gap.py --head outputs/eagle3_pool/model --records $H --limit 64 --out outputs/gap/head7_heldout19
python experiments/acceptance_gap.py --compare $R/head5_mt80.json outputs/gap/head7_mt80.json
python experiments/acceptance_gap.py --compare $R/head5_heldout19.json outputs/gap/head7_heldout19.json
python experiments/acceptance_gap.py --compare $R/head6_mt80.json outputs/gap/head7_mt80.json
echo PIPELINE DONE
# then (head 7 won) the replacement, the guards and the decode-loop sweeps; head 5 is the shipped file of git 3a391c5:
# mkdir -p outputs/head5 && git show 3a391c5:specbench/weights/smollm2-135m-eagle3/model.safetensors > outputs/head5/model.safetensors \
#   && git show 3a391c5:specbench/weights/smollm2-135m-eagle3/config.json > outputs/head5/config.json
# cp outputs/eagle3_pool/model/* specbench/weights/smollm2-135m-eagle3/ && python tests/test_guard.py --record --method=eagle3
# python -m specbench -m experiment=mt_bench_eagle3 k=3 method.drafter.path=outputs/head5,specbench/weights/smollm2-135m-eagle3 hydra.sweep.dir=outputs/cmp_pool
# python -m specbench.report outputs/cmp_pool            # -> results/pool_continuation/loop/
# python -m specbench -m experiment=mt_bench_eagle3_tree method.drafter.path=outputs/head5,specbench/weights/smollm2-135m-eagle3 hydra.sweep.dir=outputs/tree_head7
# python -m specbench.report outputs/tree_head7          # -> results/tree_head7/
# the seven-head table: python experiments/acceptance_gap.py --compare $R/{first,head2,head3,head4,head5,head6,head7}_mt80.json
