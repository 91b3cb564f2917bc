#!/usr/bin/env bash
# Section 38, first look: how deep should the lookup path run past the drafter's own tree
# (method.lookup.drafter_k = the drafter's depth, k = the longest path verified)? 16 MT-bench first turns,
# bf16, greedy, batch 1, no baseline (tau and tokens per target step only).
set -euo pipefail
OUT=${OUT:-outputs/lookup_deep_tau16}
data="dataset=jsonl dataset.path=../shared/data/mt_bench/question.jsonl dataset.per_category=2 max_new_tokens=128"
common="$data dtype=bfloat16 baseline=false progress=false"
run() { python -m specbench $common hydra.run.dir=$OUT/$1 "${@:2}"; }
lk="method.lookup.max_n=4"
dyn="method=draft_model method.tree.topk=3 method.tree.num_draft_tokens=10"
tree="method=eagle3 method.tree.topk=4 method.tree.num_draft_tokens=16"
# folder names r1_<n>_<setting>: the layout experiments/dynamic_tree.py reads (one round)
n=0
for k in 3 5 8 12; do run r1_$((++n))_eagle3_d3_k$k method=eagle3 k=$k $lk method.lookup.drafter_k=3; done
for k in 4 8; do run r1_$((++n))_dyn_3x10_d4_k$k $dyn k=$k $lk method.lookup.drafter_k=4; done
run r1_$((++n))_eagle3_tree_4x16_d5_k8 $tree k=8 $lk method.lookup.drafter_k=5
for k in 8 12; do run r1_$((++n))_ngram_k$k method=ngram k=$k; done
