#!/usr/bin/env bash
# Section 36, sweep 1: the draft model at k = 4 as a chain, the 8-node static tree and EAGLE-2 dynamic trees,
# the chain run with its target-only baseline, 16 MT-bench first turns, bf16, greedy, batch 1 (one after another, one folder).
set -euo pipefail
OUT=${OUT:-outputs/dyn_tree1}
common="experiment=mt_bench_methods dtype=bfloat16 k=4 baseline=false"
run() { python -m specbench $common hydra.run.dir=$OUT/$1 "${@:2}"; }
run 1_chain baseline=true
run 2_static_2x1x1x1 method.drafter.tree=[2,1,1,1]
run 3_dyn_2x8 method.tree.topk=2 method.tree.num_draft_tokens=8
run 4_dyn_4x8 method.tree.topk=4 method.tree.num_draft_tokens=8
run 5_dyn_4x12 method.tree.topk=4 method.tree.num_draft_tokens=12
run 6_dyn_4x16 method.tree.topk=4 method.tree.num_draft_tokens=16
run 7_dyn_3x10 method.tree.topk=3 method.tree.num_draft_tokens=10
python -m specbench.report $OUT
