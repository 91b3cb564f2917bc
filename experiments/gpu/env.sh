# Sourced by the GPU scripts (from the repo root): the packages prepare.sh put into .whl/ on the path, $OUT made,
# the GPUs listed, ATTN (flash when flash-attn imports, else sdpa), BASE (the embedded config and tokenizer)
# and SPECBENCH_DATA (.gpu/data) when prepare.sh laid them.
OUT=${OUT:-experiments/results}
mkdir -p "$OUT"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1
[ -d .gpu/data ] && export SPECBENCH_DATA=$PWD/.gpu/data
nvidia-smi -L | tee "$OUT/gpus.txt"
ATTN=sdpa
python3 -c "import flash_attn" 2>/dev/null && ATTN=flash
BASE=()
[ -d .gpu/base ] && BASE=(--base .gpu/base)
