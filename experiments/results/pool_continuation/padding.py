"""Section 22: the share of a batch's [B, T] slots that hold real tokens, random batches of 8 from section 22's
training files vs 8 steps' draws pooled, sorted by length and cut into batches of 8 (train.length_pool=8)."""
import random

import torch

from specbench.models.loading import load_model
from specbench.train.data import load_examples, tokenize

lm = load_model(None, torch.float32, torch.device("cpu"), None)
paths = ["../shared/data/smollm2_regen/responses.jsonl", "../shared/data/smollm2_regen/responses_2.jsonl",
         "outputs/regen5/regen.jsonl", "outputs/regen6/regen.jsonl"]
items = [x for p in paths for x in tokenize(load_examples(p, None), lm.tokenizer, 512)]
L = [len(x.ids) for x in items]
print(f"{len(items)} sequences, {sum(L)} tokens, {sum(sum(x.loss_mask) for x in items)} response tokens")
random.seed(0)
slots = used = 0
for _ in range(2000):
    b = random.sample(range(len(items)), 8)
    slots, used = slots + 8 * max(L[i] for i in b), used + sum(L[i] for i in b)
print(f"random batches of 8: {used / slots:.3f} of the slots are real tokens")
slots = used = 0
for _ in range(250):
    pool = sorted(random.sample(range(len(items)), 64), key=lambda i: L[i])
    for c in range(8):
        b = pool[8 * c:8 * c + 8]
        slots, used = slots + 8 * max(L[i] for i in b), used + sum(L[i] for i in b)
print(f"length_pool=8: {used / slots:.3f}")
