#!/usr/bin/env bash
# EAGLE-3 for the embedded target on a lent GPU, in the acceptance recipe's two stages, from the parts that
# experiments/gpu/prepare_train.sh packed (the device calls are listed there). On the GPU machine:
#   bash experiments/gpu/train.sh stage   keep the carried part(s) .gpu/train/<n>/ in $STAGE (/root/specbench-train)
#   bash experiments/gpu/train.sh run     keep the last part, join and check the pack (SHA-256 of the pack and
#                                         of every input), then train:
#     stage 1  teacher-forced on ShareGPT's conversations (every assistant turn, the target's soft labels),
#              data.max_len MAXLEN1 (2048), batch BATCH1 (16), STEPS1 steps (1,100: ~one pass), lr 2e-3,
#              at most WALL1 s (240), EAGLE-3.1's per-state fc_norm unless FC_NORM=false (experiments
#              section 15: from scratch it raised teacher-forced agreement at unroll steps 1-3 by ~0.02)
#     stage 2  self-distilled: the target's own greedy responses, from stage 1's weights, max_len 512, batch
#              BATCH2 (32), STEPS2 (500: ~two passes), lr 5e-4, at most WALL2 s (100)
#   Both stages batch sequences of similar length (train.length_pool POOL, 8: less padding, experiments
#   section 22). The budgets bound the training loops; the GGUF conversion, ShareGPT's tokenisation and the evaluations
#   come on top, inside the call's 600 s. A stage stopped by its budget is checkpointed: `run` again (while the
#   machine is warm) resumes it; when stage 1 moves on, stage 2 starts again from its new weights.
#   Results to $OUT (each file under 16 MiB): the head split in two parts, its config.json, both training
#   logs, the run's log, SHA-256 of the head. Here: bash experiments/gpu/train.sh join <files_at> <dest folder>
# DEVICE=cpu with small STEPS*/LIMIT runs the same pipeline on a CPU (a dry run of everything but CUDA).
set -euo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD
if [ "${1:-}" = join ]; then
  src=$(realpath "$2") dest=$3
  mkdir -p "$dest"
  cat "$src"/head.safetensors.part-* > "$dest/model.safetensors"
  cp "$src/config.json" "$dest/"
  (cd "$dest" && sha256sum -c "$src/head.sha256")
  exit 0
fi
[ "${1:-}" = stage ] || [ "${1:-}" = run ] || { echo "usage: train.sh stage | run | join <files_at> <dest>" >&2; exit 2; }
STAGE=${STAGE:-/root/specbench-train}
mkdir -p "$STAGE/parts"
for d in .gpu/train/*/; do cp "$d"* "$STAGE/parts/"; done
ls -la "$STAGE/parts"
[ "$1" = stage ] && exit 0

OUT=${OUT:-experiments/results/gpu_train}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/train_gpu.log") 2>&1
cd "$STAGE"
if [ ! -f SHA256SUMS ]; then
  have=$(ls parts/pack.tar.part-* | wc -l) want=$(cat parts/pack.count)
  [ "$have" = "$want" ] || { echo "$have of the $want parts are here: stage the missing ones first" >&2; exit 2; }
  cat parts/pack.tar.part-* > pack.tar
  sha256sum -c parts/pack.sha256
  tar -xf pack.tar && rm pack.tar
  for f in ./*.gz; do gunzip -f "$f"; done
fi
sha256sum -c SHA256SUMS
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site whl/*.whl
python3 -c "import yaml, packaging, numpy, safetensors, transformers, tqdm" \
  || { echo "the GPU image lacks a dependency above: add its wheel in prepare_train.sh" >&2; exit 2; }
export PYTHONPATH=/tmp/site:$REPO PYTHONUNBUFFERED=1 SPECBENCH_CACHE=${SPECBENCH_CACHE:-$STAGE/cache}
command -v nvidia-smi >/dev/null && nvidia-smi -L
cd "$REPO"
LIMIT=${LIMIT:-null}
COMMON=(method=eagle3 "device=${DEVICE:-cuda}" "model.path=$STAGE/target.gguf" dtype=bfloat16 data.teacher=online
        "data.limit=$LIMIT" "train.length_pool=${POOL:-8}" train.log_every=20 train.save_every=100 progress=true)
SHAREGPT=$STAGE/ShareGPT_V3_unfiltered_cleaned_split.json
ckpt_step() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['history'][-1]['step'])" \
  "$1/checkpoint/history.json" 2>/dev/null || echo 0; }
before=$(ckpt_step "$STAGE/stage1")
python3 -m specbench.train "${COMMON[@]}" "data.paths=[$SHAREGPT]" "data.max_len=${MAXLEN1:-2048}" \
  "train.batch_size=${BATCH1:-16}" "train.steps=${STEPS1:-1100}" train.lr=2e-3 train.warmup=50 \
  "method.fc_norm=${FC_NORM:-true}" \
  "train.eval_every=${EVAL1:-250}" "train.max_wall_s=${WALL1:-240}" \
  "out_dir=$STAGE/stage1" "hydra.run.dir=$STAGE/stage1"
[ "$(ckpt_step "$STAGE/stage1")" = "$before" ] || rm -rf "$STAGE/stage2"  # stage 1 moved on: stage 2 anew
python3 -m specbench.train "${COMMON[@]}" "data.paths=[$STAGE/responses.jsonl,$STAGE/responses_2.jsonl]" \
  data.max_len=512 "method.init_from=$STAGE/stage1" "train.batch_size=${BATCH2:-32}" "train.steps=${STEPS2:-500}" \
  train.lr=5e-4 train.warmup=20 "train.eval_every=${EVAL2:-100}" "train.max_wall_s=${WALL2:-100}" \
  "out_dir=$STAGE/stage2" "hydra.run.dir=$STAGE/stage2"
head=$STAGE/stage2/model
split -b 15m -d -a 1 "$head/model.safetensors" "$OUT/head.safetensors.part-"
cp "$head/config.json" "$OUT/config.json"
(cd "$head" && sha256sum model.safetensors) > "$OUT/head.sha256"
cp "$STAGE/stage1/train_log.jsonl" "$OUT/stage1_log.jsonl"
cp "$STAGE/stage2/train_log.jsonl" "$OUT/stage2_log.jsonl"
ls -la "$OUT"
