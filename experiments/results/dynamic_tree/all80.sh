#!/usr/bin/env bash
# Section 36, per category: the dynamic draft tree 3x10 against n-gram lookup (k = 4 and 8) on all 80 MT-bench
# first turns (10 per category), bf16, greedy, batch 1, no baseline (tau and per-category tau only).
set -euo pipefail
OUT=${OUT:-outputs/dyn_tree_all80}
data="dataset=jsonl dataset.path=../shared/data/mt_bench/question.jsonl dataset.per_category=10 max_new_tokens=128"
common="$data dtype=bfloat16 baseline=false progress=false"
run() { python -m specbench $common hydra.run.dir=$OUT/$1 "${@:2}"; }
run r1_1_dyn_3x10 method=draft_model k=4 method.tree.topk=3 method.tree.num_draft_tokens=10
run r1_2_ngram_k4 method=ngram k=4
run r1_3_ngram_k8 method=ngram k=8
run r1_4_dyn_k6_4x16 method=draft_model k=6 method.tree.topk=4 method.tree.num_draft_tokens=16
