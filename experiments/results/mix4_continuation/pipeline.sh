#!/usr/bin/env bash
# section 21: continue the shipped head (head 5) on 2,048 freshly regenerated ShareGPT first turns it never saw
# (regen6: the first 2,048 of the turns regen3 left, listed four times so they are ~48 % of the draws) plus the
# shared corpus and regen5 (seen by head 5, listed once); evaluate against head 5 by paired walks.
# Head 5 is the shipped file as of git 6d61569; if the shipped head changes, take it from there (git show).
set -x
cd /work/main && . .venv/bin/activate
F=outputs/regen6/regen.jsonl
O=outputs/regen5/regen.jsonl
H=outputs/regen3/heldout_regen/regen.jsonl   # the 64 held-out answers (regen3 prompts 3,265-3,328)
R=experiments/results/acceptance_gap
python -m specbench.train method=eagle3 \
  "data.paths=[../shared/data/smollm2_regen/responses.jsonl,../shared/data/smollm2_regen/responses_2.jsonl,$O,$F,$F,$F,$F]" \
  data.max_len=512 method.init_from=specbench/weights/smollm2-135m-eagle3 method.eval_max_new_tokens=96 \
  train.steps=${STEPS:-500} train.batch_size=8 train.lr=2e-4 train.warmup=20 train.eval_every=${STEPS:-500} train.save_every=25 \
  train.seed=3 train.log_every=10 progress=false out_dir=outputs/eagle3_mix4 hydra.run.dir=outputs/eagle3_mix4 || exit 1
python experiments/acceptance_gap.py --head outputs/eagle3_mix4/model --target-only --per-category 10 --out outputs/gap/head6_mt80
python experiments/acceptance_gap.py --head outputs/eagle3_mix4/model --records $H --limit 64 --out outputs/gap/head6_heldout19
python experiments/acceptance_gap.py --compare $R/head5_mt80.json outputs/gap/head6_mt80.json
python experiments/acceptance_gap.py --compare $R/head5_heldout19.json outputs/gap/head6_heldout19.json
echo PIPELINE DONE
# the per-category split of the MT-bench walk (section 21's table; the walk takes 10 turns per category in file order)
python - <<'PY'
import json, statistics as st
cats = [json.loads(l)["category"] for l in open("../shared/data/mt_bench/question.jsonl")]
walk = lambda p: json.load(open(p))["per_sequence_steps_accepted"]   # [steps, accepted] per sequence
a, b = walk("experiments/results/acceptance_gap/head5_mt80.json"), walk("outputs/gap/head6_mt80.json")
tau = lambda xs: sum(s + n for s, n in xs) / sum(s for s, _ in xs)
for c in dict.fromkeys(cats):
    i = [j for j, x in enumerate(cats) if x == c]
    d = [tau([b[j]]) - tau([a[j]]) for j in i]
    print(f"{c}: {tau([a[j] for j in i]):.3f} {tau([b[j] for j in i]):.3f} {st.mean(d):+.3f} ± {st.stdev(d) / len(d) ** 0.5:.3f}")
PY
# then a weight average of heads 5 and 6:
mkdir -p outputs/soup56 && python -c "
from safetensors.torch import load_file, save_file
a = load_file('specbench/weights/smollm2-135m-eagle3/model.safetensors'); b = load_file('outputs/eagle3_mix4/model/model.safetensors')
save_file({k: ((a[k].float() + b[k].float()) / 2).to(a[k].dtype) if a[k].is_floating_point() else a[k] for k in a}, 'outputs/soup56/model.safetensors')
" && cp specbench/weights/smollm2-135m-eagle3/config.json outputs/soup56/
python experiments/acceptance_gap.py --head outputs/soup56 --target-only --per-category 10 --out outputs/gap/soup56_mt80
python experiments/acceptance_gap.py --compare $R/head5_mt80.json outputs/gap/soup56_mt80.json
