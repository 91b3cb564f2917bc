#!/usr/bin/env bash
# Section 38: EAGLE-3's dynamic tree at EAGLE-2's size (depth 6, top-10, 60 nodes; section 29 measured it with
# head 9) with prompt lookup at the tree's depth and 8 deep (method.lookup.drafter_k=6); one round with
# target-only first; 16 MT-bench first turns, bf16, greedy, batch 1.
set -euo pipefail
OUT=${OUT:-outputs/lookup_deep_tree60}
DATA=${DATA:-../shared/data/mt_bench/question.jsonl}
data="dataset=jsonl dataset.path=$DATA dataset.per_category=2 max_new_tokens=128"
common="$data dtype=bfloat16 baseline=false progress=false"
run() { python -m specbench $common hydra.run.dir=$OUT/$1 "${@:2}"; }
lk="method.lookup.max_n=4"
tree="method=eagle3 method.tree.topk=10 method.tree.num_draft_tokens=60"
for r in ${ROUNDS-1}; do
  run r${r}_0_none method=none
  run r${r}_1_eagle3_tree60_k6 $tree k=6
  run r${r}_2_eagle3_tree60_k6_lookup $tree k=6 $lk
  run r${r}_3_eagle3_tree60_d6_k8 $tree k=8 $lk method.lookup.drafter_k=6
done
# then, the same session: a deeper, larger tree (depth 7, top-10, 80 nodes) with lookup at its depth, and the
# 60-node tree with lookup on one-token suffixes too (min_n 1)
for r in ${ROUNDS-1}; do
  run r${r}_4_eagle3_tree80_k7_lookup method=eagle3 method.tree.topk=10 method.tree.num_draft_tokens=80 k=7 $lk
  run r${r}_5_eagle3_tree60_k6_lookup_min1 $tree k=6 $lk method.lookup.min_n=1
done
