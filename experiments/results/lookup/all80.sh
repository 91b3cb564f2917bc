#!/usr/bin/env bash
# Section 37: prompt lookup grafted onto the drafters' trees (method.lookup.max_n=4, min_n 2: method=ngram's
# defaults) on all 80 MT-bench first turns (10 per category), bf16, greedy, batch 1, no baseline (tau, per
# category, tokens per target step). The same settings without lookup: section 36's all80.sh (draft trees, n-gram)
# and the two EAGLE-3 runs here.
set -euo pipefail
OUT=${OUT:-outputs/lookup_all80}
data="dataset=jsonl dataset.path=../shared/data/mt_bench/question.jsonl dataset.per_category=10 max_new_tokens=128"
common="$data dtype=bfloat16 baseline=false progress=false"
run() { python -m specbench $common hydra.run.dir=$OUT/$1 "${@:2}"; }
lk="method.lookup.max_n=4"
run 1_dyn_3x10_lookup method=draft_model k=4 method.tree.topk=3 method.tree.num_draft_tokens=10 $lk
run 2_eagle3_k3 method=eagle3 k=3
run 3_eagle3_k3_lookup method=eagle3 k=3 $lk
run 4_eagle3_tree_k5_4x16 method=eagle3 k=5 method.tree.topk=4 method.tree.num_draft_tokens=16
run 5_eagle3_tree_k5_4x16_lookup method=eagle3 k=5 method.tree.topk=4 method.tree.num_draft_tokens=16 $lk
run 6_dyn_k6_4x16_lookup method=draft_model k=6 method.tree.topk=4 method.tree.num_draft_tokens=16 $lk
# n-gram lookup alone at the depths of the trees above (k = 5 for EAGLE-3's tree, k = 6 for the k = 6 draft tree):
# the equal-k comparisons (n-gram k = 4 and 8: section 36's all80.sh)
run 7_ngram_k5 method=ngram k=5
run 8_ngram_k6 method=ngram k=6
