#!/usr/bin/env bash
# Run ON a lent GPU machine from the repo root (after experiments/gpu/prepare.sh here; carry .whl and .gpu):
#   bash experiments/gpu/parallel.sh
# Target: random weights of Llama-3.1-8B's shapes (LAYERS, default 32; the embedded tokenizer's vocabulary),
# bf16, built on the GPU once. Layouts by the GPUs present: tp1 always; tp2 and pp2 with >= 2 GPUs; tp2xpp2
# with >= 4. NCCL under torchrun, flash-attn when importable (else SDPA), parallel.sync_timing=true so each
# collective's time is exact. Writes bench_parallel_cuda.{md,json} (and the log) to $OUT, or
# experiments/results when OUT is unset.
set -euo pipefail
cd "$(dirname "$0")/../.."
. experiments/gpu/env.sh
N=$(python3 -c "import torch; print(torch.cuda.device_count())")
LAYOUTS=tp1
[ "$N" -ge 2 ] && LAYOUTS=tp1,tp2,pp2
[ "$N" -ge 4 ] && LAYOUTS=tp1,tp2,pp2,tp2xpp2
set -o pipefail
python3 experiments/bench_parallel.py --device cuda --dtype bfloat16 --targets llama8b --layers "${LAYERS:-32}" \
  --layouts "$LAYOUTS" --attention "$ATTN" --limit "${LIMIT:-4}" --max-new-tokens "${TOKENS:-64}" \
  "${BASE[@]}" --out "$OUT" 2>&1 | tee "$OUT/bench_parallel_cuda.log"
