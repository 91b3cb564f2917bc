#!/usr/bin/env bash
# Section 37, speed: interleaved rounds of target-only, n-gram k = 4, the draft model's 10-node dynamic tree and
# EAGLE-3's chain (k = 3), each without and with prompt lookup grafted (method.lookup.max_n=4); 16 MT-bench first
# turns, bf16, greedy, batch 1. Speedup = tokens/s over the same round's target-only run.
set -euo pipefail
OUT=${OUT:-outputs/lookup_rounds}
data="dataset=jsonl dataset.path=../shared/data/mt_bench/question.jsonl dataset.per_category=2 max_new_tokens=128"
common="$data dtype=bfloat16 baseline=false progress=false"
run() { python -m specbench $common hydra.run.dir=$OUT/$1 "${@:2}"; }
lk="method.lookup.max_n=4"
dyn="method=draft_model k=4 method.tree.topk=3 method.tree.num_draft_tokens=10"
for r in ${ROUNDS-1 2 3}; do
  run r${r}_0_none method=none
  run r${r}_1_dyn_3x10 $dyn
  run r${r}_2_dyn_3x10_lookup $dyn $lk
  run r${r}_3_ngram_k4 method=ngram k=4
  run r${r}_4_eagle3_k3 method=eagle3 k=3
  run r${r}_5_eagle3_k3_lookup method=eagle3 k=3 $lk
done
# rounds 4-6 (run later the same session): target-only, EAGLE-3's chain without and with lookup, the draft tree
# with lookup, and EAGLE-3's 16-node tree (k = 5) with lookup
for r in ${EXTRA_ROUNDS-4 5 6}; do
  run r${r}_0_none method=none
  run r${r}_4_eagle3_k3 method=eagle3 k=3
  run r${r}_5_eagle3_k3_lookup method=eagle3 k=3 $lk
  run r${r}_2_dyn_3x10_lookup $dyn $lk
  run r${r}_6_eagle3_tree_k5_4x16_lookup method=eagle3 k=5 method.tree.topk=4 method.tree.num_draft_tokens=16 $lk
done
