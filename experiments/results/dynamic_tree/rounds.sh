#!/usr/bin/env bash
# Section 36, speed: three interleaved rounds of target-only, the draft chain and three EAGLE-2 dynamic draft trees
# at k = 4 (16 MT-bench first turns, bf16, greedy, batch 1); n-gram k = 4 and k = 8 once, after round 1.
set -euo pipefail
OUT=${OUT:-outputs/dyn_tree_rounds}
data="dataset=jsonl dataset.path=../shared/data/mt_bench/question.jsonl dataset.per_category=2 max_new_tokens=128"
common="$data dtype=bfloat16 baseline=false progress=false"
run() { python -m specbench $common hydra.run.dir=$OUT/$1 "${@:2}"; }
for r in ${ROUNDS-1 2 3}; do
  run r${r}_0_none method=none
  run r${r}_1_chain method=draft_model k=4
  run r${r}_2_dyn_4x8 method=draft_model k=4 method.tree.topk=4 method.tree.num_draft_tokens=8
  run r${r}_3_dyn_3x10 method=draft_model k=4 method.tree.topk=3 method.tree.num_draft_tokens=10
  run r${r}_4_dyn_4x12 method=draft_model k=4 method.tree.topk=4 method.tree.num_draft_tokens=12
  if [ $r = 1 ]; then
    run r1_5_ngram_k4 method=ngram k=4
    run r1_6_ngram_k8 method=ngram k=8
  fi
done
# rounds 4 and 5 (run later the same session): target-only, the chain and the two smaller trees
for r in ${EXTRA_ROUNDS-4 5}; do
  run r${r}_0_none method=none
  run r${r}_1_chain method=draft_model k=4
  run r${r}_2_dyn_4x8 method=draft_model k=4 method.tree.topk=4 method.tree.num_draft_tokens=8
  run r${r}_3_dyn_3x10 method=draft_model k=4 method.tree.topk=3 method.tree.num_draft_tokens=10
done
python -m specbench.report $OUT
