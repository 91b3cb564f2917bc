#!/usr/bin/env bash
# section 20: continue the shipped head (head 4) on 1,648 freshly regenerated ShareGPT first turns it never saw
# (regen3 prompts 4,353-6,000, listed three times so they are ~38 % of the draws) plus the shared corpus; evaluate.
set -x
cd /work/main && . .venv/bin/activate
N=outputs/regen5/regen.jsonl
H=outputs/regen3/heldout_regen/regen.jsonl   # the 64 held-out answers (regen3 prompts 3,265-3,328)
python -m specbench.train method=eagle3 \
  "data.paths=[../shared/data/smollm2_regen/responses.jsonl,../shared/data/smollm2_regen/responses_2.jsonl,$N,$N,$N]" \
  data.max_len=512 method.init_from=specbench/weights/smollm2-135m-eagle3 method.eval_max_new_tokens=96 \
  train.steps=${STEPS:-400} train.batch_size=8 train.lr=2e-4 train.warmup=20 train.eval_every=${STEPS:-400} train.save_every=25 \
  train.seed=2 train.log_every=10 progress=false out_dir=outputs/eagle3_mix3 hydra.run.dir=outputs/eagle3_mix3 || exit 1
python experiments/acceptance_gap.py --head outputs/eagle3_mix3/model --records $H --limit 64 --out outputs/gap/head5_heldout19
python experiments/acceptance_gap.py --head specbench/weights/smollm2-135m-eagle3 --records $H --limit 64 --out outputs/gap/head4_heldout19
python experiments/acceptance_gap.py --head outputs/eagle3_mix3/model --target-only --per-category 10 --out outputs/gap/head5_mt80
python experiments/acceptance_gap.py --compare outputs/gap/head4_heldout19.json outputs/gap/head5_heldout19.json
python experiments/acceptance_gap.py --compare experiments/results/acceptance_gap/head4_mt80.json outputs/gap/head5_mt80.json
echo PIPELINE DONE
# then the decode loop and the trees. Head 4 is the shipped file before this section (git 0d45bec); after the
# replacement the shipped path is head 5, so head 4 comes from git:
# mkdir -p outputs/head4 && git show 0d45bec:specbench/weights/smollm2-135m-eagle3/model.safetensors > outputs/head4/model.safetensors \
#   && cp specbench/weights/smollm2-135m-eagle3/config.json outputs/head4/
# python -m specbench -m experiment=mt_bench_eagle3 k=3 method.drafter.path=outputs/head4,outputs/eagle3_mix3/model hydra.sweep.dir=outputs/cmp_mix3
# python -m specbench.report outputs/cmp_mix3
# python -m specbench -m experiment=mt_bench_eagle3_tree method.drafter.path=outputs/head4,outputs/eagle3_mix3/model hydra.sweep.dir=outputs/tree_head5
# python -m specbench -m experiment=mt_bench_eagle3_tree k=6 method.tree.topk=10 method.tree.num_draft_tokens=60 hydra.sweep.dir=outputs/tree60_head5
