#!/usr/bin/env bash
# Section 38, speed: interleaved rounds of target-only and prompt lookup grafted deeper than the drafter's own
# tree (method.lookup.drafter_k = the drafter's depth, k = the longest path verified), next to the same
# drafters with lookup at their own depth (section 37's settings) and n-gram k = 8; 16 MT-bench first turns,
# bf16, greedy, batch 1. Speedup = tokens/s over the same round's target-only run.
set -euo pipefail
OUT=${OUT:-outputs/lookup_deep_rounds}
DATA=${DATA:-../shared/data/mt_bench/question.jsonl}
data="dataset=jsonl dataset.path=$DATA dataset.per_category=2 max_new_tokens=128"
common="$data dtype=bfloat16 baseline=false progress=false"
run() { python -m specbench $common hydra.run.dir=$OUT/$1 "${@:2}"; }
lk="method.lookup.max_n=4"
dyn="method=draft_model method.tree.topk=3 method.tree.num_draft_tokens=10"
tree="method=eagle3 method.tree.topk=4 method.tree.num_draft_tokens=16"
for r in ${ROUNDS-1 2 3}; do
  run r${r}_0_none method=none
  run r${r}_1_eagle3_d3_k3 method=eagle3 k=3 $lk
  run r${r}_2_eagle3_d3_k5 method=eagle3 k=5 $lk method.lookup.drafter_k=3
  run r${r}_3_eagle3_d3_k8 method=eagle3 k=8 $lk method.lookup.drafter_k=3
  run r${r}_4_dyn_3x10_d4_k4 $dyn k=4 $lk
  run r${r}_5_dyn_3x10_d4_k8 $dyn k=8 $lk method.lookup.drafter_k=4
  run r${r}_6_eagle3_tree_4x16_d5_k8 $tree k=8 $lk method.lookup.drafter_k=5
  run r${r}_7_ngram_k8 method=ngram k=8
done
