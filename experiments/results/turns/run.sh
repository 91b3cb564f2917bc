#!/usr/bin/env bash
# Section 39: MT-bench's second turns (dataset.turns=2: each record's second question asked after the run's own
# first answer), 16 records (2 per category) x 2 turns, bf16, greedy, batch 1, no per-run baseline; each round
# runs target-only first, then the headline settings of sections 37-38 and n-gram lookup.
#   experiments/results/turns/run.sh && python experiments/turns.py outputs/turns
set -euo pipefail
OUT=${OUT:-outputs/turns}
DATA=${DATA:-../shared/data/mt_bench/question.jsonl}
common="dataset=jsonl dataset.path=$DATA dataset.per_category=2 dataset.turns=2 max_new_tokens=128 dtype=bfloat16"
common="$common baseline=false progress=false"
run() { python -m specbench $common hydra.run.dir=$OUT/$1 "${@:2}"; }
lk="method.lookup.max_n=4"
dyn="method=draft_model method.tree.topk=3 method.tree.num_draft_tokens=10"
tree="method=eagle3 method.tree.topk=4 method.tree.num_draft_tokens=16"
for r in ${ROUNDS-1}; do
  run r${r}_0_none method=none
  run r${r}_1_eagle3_d3_k3 method=eagle3 k=3 $lk
  run r${r}_2_dyn_3x10_d4_k8 $dyn k=8 $lk method.lookup.drafter_k=4
  run r${r}_3_eagle3_tree_4x16_d5_k8 $tree k=8 $lk method.lookup.drafter_k=5
  run r${r}_4_ngram_k4 method=ngram k=4
  run r${r}_5_ngram_k8 method=ngram k=8
done
