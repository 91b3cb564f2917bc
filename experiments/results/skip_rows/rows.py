"""Section 23: the share of a batch's [B, T] slots the EAGLE-3 training step computes at each unroll step once
indices whose outputs are never used (prompt, padding, the last positions) are skipped, on section 22's training
files, 8 steps' draws pooled into batches of 8 (train.length_pool=8), the shipped head's draft vocabulary."""
import random

import torch
from safetensors.torch import load_file

from specbench.models.loading import load_model
from specbench.train.data import collate, load_examples, tokenize
from specbench.train.eagle3 import Eagle3Method

torch.set_num_threads(1)
lm = load_model(None, torch.float32, torch.device("cpu"), None)
paths = ["../shared/data/smollm2_regen/responses.jsonl", "../shared/data/smollm2_regen/responses_2.jsonl",
         "outputs/regen5/regen.jsonl", "outputs/regen6/regen.jsonl"]
items = [x for p in paths for x in tokenize(load_examples(p, None), lm.tokenizer, 512)]
m = Eagle3Method.__new__(Eagle3Method)  # only trained_indices: the head's vocabulary and ttt_steps
d2t = load_file("specbench/weights/smollm2-135m-eagle3/model.safetensors")["d2t"]
t2d = torch.zeros(lm.model.config.vocab_size, dtype=torch.bool)
t2d[torch.arange(len(d2t)) + d2t.long()] = True
m.head, m.ttt_steps = type("H", (), {"t2d": t2d})(), 4
L = [len(x.ids) for x in items]
random.seed(0)
slots, real, per_step = 0, 0, torch.zeros(4)
for _ in range(100):
    pool = sorted(random.sample(range(len(items)), 64), key=lambda i: L[i])
    for c in range(8):
        ids, mask = collate([items[i] for i in pool[8 * c:8 * c + 8]])[:2]
        _, need = m.trained_indices(ids, mask.float())
        slots, real = slots + ids.numel(), real + sum(L[i] for i in pool[8 * c:8 * c + 8])
        per_step += need.flatten(1).sum(1).float()
print(f"{len(items)} sequences; pooled batches: {real / slots:.3f} of the slots are real tokens")
print("share of slots computed at unroll step 0..3 (step 0's keys and values: every slot):",
      " ".join(f"{x:.3f}" for x in (per_step / slots).tolist()))
