#!/usr/bin/env bash
# Run HERE (a machine with the project's venv and a package registry) before a GPU lease: puts what the GPU
# machine lacks into two git-ignored folders of the repo root that the device run carries:
#   .whl/  wheels of hydra-core, omegaconf, antlr4 (the GPU image has torch, transformers, safetensors, tqdm)
#   .gpu/base/  the embedded model's config.json and tokenizer (a random target of real shapes starts there)
#   .gpu/data/mt_bench/question.jsonl  the MT-bench prompts (from ../shared/data; never committed)
# Then, on the device tool: carry [".whl", ".gpu"], command `bash experiments/gpu/parallel.sh` (or async.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx '/.whl/' .git/info/exclude || echo /.whl/ >> .git/info/exclude
grep -qx '/.gpu/' .git/info/exclude || echo /.gpu/ >> .git/info/exclude
rm -rf .whl && mkdir -p .whl .gpu
read -r HYDRA OMEGA < <(python -c "import hydra, omegaconf; print(hydra.__version__, omegaconf.__version__)")
python -m pip download -q --no-deps --only-binary=:all: -d .whl "hydra-core==$HYDRA" "omegaconf==$OMEGA"
python -m pip wheel -q --no-deps -w .whl antlr4-python3-runtime==4.9.3  # sdist only: a pure-Python wheel
python - <<'PY'
import json, shutil
from pathlib import Path
from specbench.models.loading import resolve_folder
from transformers import AutoTokenizer

src, out = resolve_folder(None)[0], Path(".gpu/base")
shutil.rmtree(out, ignore_errors=True)
out.mkdir(parents=True)
shutil.copy(src / "config.json", out / "config.json")
AutoTokenizer.from_pretrained(str(src)).save_pretrained(str(out))
import os
data = Path(os.environ.get("SPECBENCH_DATA", "../shared/data")) / "mt_bench" / "question.jsonl"
(Path(".gpu/data/mt_bench")).mkdir(parents=True, exist_ok=True)
shutil.copy(data, ".gpu/data/mt_bench/question.jsonl")
print("prepared", sorted(p.name for p in Path(".whl").iterdir()), "and", out, "and .gpu/data")
PY
