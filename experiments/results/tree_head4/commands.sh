#!/usr/bin/env bash
set -x
cd /work/main && . .venv/bin/activate
python -m specbench -m experiment=mt_bench_eagle3_tree hydra.sweep.dir=outputs/tree_head4 && python -m specbench.report outputs/tree_head4
python -m specbench -m experiment=mt_bench_eagle3_tree k=6 method.tree.topk=10 method.tree.num_draft_tokens=60 hydra.sweep.dir=outputs/tree_head4_60 && python -m specbench.report outputs/tree_head4_60
echo TREE DONE
