#!/usr/bin/env bash
# Run ON a lent GPU machine from the repo root (after experiments/gpu/prepare.sh here; carry .whl and .gpu):
#   bash experiments/gpu/async.sh
# Async scheduling vs the synchronous loop on a random-weight target of Llama-3.1-8B's shapes (LAYERS, default
# 32; the embedded tokenizer's vocabulary), bf16, with a random 2-layer draft model of Llama-3.2-1B's width and
# acceptance=synthetic at fixed per-position rates (RATES, default 0.8,0.6,0.4: tau 2.8 at k=3), so the
# loop and system costs are a real deployment's without a trained drafter. Batches BATCHES (default 1,8,32),
# MT-bench first turns (2 per category, from .gpu/data), TOKENS new tokens (default 128), ROUNDS rounds with
# the modes alternating. Reports mean / P99 TPOT and ITL, sync vs async, and the host time left on the
# critical path. Writes bench_async_cuda.{md,json} (and the log) to $OUT, or experiments/results.
set -euo pipefail
cd "$(dirname "$0")/../.."
. experiments/gpu/env.sh
python3 experiments/bench_async.py --device cuda --dtype bfloat16 --target llama8b --layers "${LAYERS:-32}" \
  --draft llama1b2 --methods draft_model --synthetic "${RATES:-0.8,0.6,0.4}" --k 3 \
  --batches "${BATCHES:-1,8,32}" --rounds "${ROUNDS:-2}" --per-category 2 --max-new-tokens "${TOKENS:-128}" \
  --attention "$ATTN" --tag cuda "${BASE[@]}" --out "$OUT" 2>&1 | tee "$OUT/bench_async_cuda.log"
