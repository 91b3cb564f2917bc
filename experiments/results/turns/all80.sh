#!/usr/bin/env bash
# Section 39: all 80 MT-bench records, both turns (dataset.turns=2), τ only (no target-only runs): EAGLE-3's
# 16-node tree with lookup 8 deep and n-gram k = 8, bf16, greedy, batch 1.
#   experiments/results/turns/all80.sh && python experiments/turns.py outputs/turns_all80
set -euo pipefail
OUT=${OUT:-outputs/turns_all80}
DATA=${DATA:-../shared/data/mt_bench/question.jsonl}
common="dataset=jsonl dataset.path=$DATA dataset.turns=2 max_new_tokens=128 dtype=bfloat16 baseline=false"
common="$common progress=false"
run() { python -m specbench $common hydra.run.dir=$OUT/$1 "${@:2}"; }
run r1_1_eagle3_tree_4x16_d5_k8 method=eagle3 method.tree.topk=4 method.tree.num_draft_tokens=16 k=8 \
  method.lookup.max_n=4 method.lookup.drafter_k=5
run r1_2_ngram_k8 method=ngram k=8
