#!/usr/bin/env bash
# Section 38: prompt lookup deeper than the drafter's own tree (method.lookup.drafter_k = the drafter's depth,
# k = the longest path verified) on all 80 MT-bench first turns (10 per category), bf16, greedy, batch 1, no
# baseline. The same drafters with lookup at their own depth and n-gram k = 4 / 5 / 6 / 8: section 37's
# results/lookup/all80 and section 36's results/dynamic_tree/all80.
set -euo pipefail
OUT=${OUT:-outputs/lookup_deep_all80}
DATA=${DATA:-../shared/data/mt_bench/question.jsonl}
data="dataset=jsonl dataset.path=$DATA dataset.per_category=10 max_new_tokens=128"
common="$data dtype=bfloat16 baseline=false progress=false"
run() { python -m specbench $common hydra.run.dir=$OUT/$1 "${@:2}"; }
lk="method.lookup.max_n=4"
run r1_1_eagle3_d3_k5 method=eagle3 k=5 $lk method.lookup.drafter_k=3
run r1_2_eagle3_d3_k8 method=eagle3 k=8 $lk method.lookup.drafter_k=3
run r1_3_dyn_3x10_d4_k8 method=draft_model method.tree.topk=3 method.tree.num_draft_tokens=10 k=8 $lk \
  method.lookup.drafter_k=4
run r1_4_eagle3_tree_4x16_d5_k8 method=eagle3 method.tree.topk=4 method.tree.num_draft_tokens=16 k=8 $lk \
  method.lookup.drafter_k=5
# later the same session: EAGLE-3's tree at EAGLE-2's size (depth 6, top-10, 60 nodes) and a deeper one (depth 7,
# 80 nodes), each with lookup at its depth, and the 60-node tree without (results/lookup_deep/tree60.sh measured
# them on the 16 first turns)
run r1_7_eagle3_tree60_k6 method=eagle3 method.tree.topk=10 method.tree.num_draft_tokens=60 k=6
run r1_5_eagle3_tree60_k6_lookup method=eagle3 method.tree.topk=10 method.tree.num_draft_tokens=60 k=6 $lk
run r1_6_eagle3_tree80_k7_lookup method=eagle3 method.tree.topk=10 method.tree.num_draft_tokens=80 k=7 $lk
