#!/usr/bin/env bash
# section 40: head 12 against the shipped head 10 in the decode loop (chain k = 3, 16 first turns, each with its own
# target-only run), then head 12 copied over the shipped head, the EAGLE-3 guards re-recorded, and the new head's
# chain k = 3 without and with prompt lookup on all 80 first turns (bf16, no baseline: τ only; section 37's
# results/lookup/all80 has head 10's). Run after pipeline.sh, before the copy is committed.
set -ex
cd /work/main && . .venv/bin/activate
python -m specbench -m experiment=mt_bench_eagle3 k=3 \
  method.drafter.path=specbench/weights/smollm2-135m-eagle3,outputs/eagle3_fresh4/model hydra.sweep.dir=outputs/cmp_head12
python -m specbench.report outputs/cmp_head12
cp outputs/eagle3_fresh4/model/config.json outputs/eagle3_fresh4/model/model.safetensors specbench/weights/smollm2-135m-eagle3/
python tests/test_guard.py --record --method=eagle3
data="dataset=jsonl dataset.path=../shared/data/mt_bench/question.jsonl dataset.per_category=10 max_new_tokens=128"
common="$data dtype=bfloat16 baseline=false progress=false method=eagle3 k=3"
python -m specbench $common hydra.run.dir=outputs/head12_all80/chain_k3
python -m specbench $common method.lookup.max_n=4 hydra.run.dir=outputs/head12_all80/chain_k3_lookup
# EAGLE-3's 16-node tree with lookup 8 deep (section 38's r1_4_eagle3_tree_4x16_d5_k8, head 10: τ 2.86)
python -m specbench $data dtype=bfloat16 baseline=false progress=false method=eagle3 method.tree.topk=4 \
  method.tree.num_draft_tokens=16 k=8 method.lookup.max_n=4 method.lookup.drafter_k=5 \
  hydra.run.dir=outputs/head12_all80/tree_4x16_d5_k8
