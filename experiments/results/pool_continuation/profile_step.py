"""Section 22: where an EAGLE-3 training step's time goes (4 steps of 8 random sequences from the shared corpus,
the shipped head, online bf16 teacher, bf16 autocast): teacher forward / head forward / backward / optimizer."""
import random
import time

import torch

from specbench.models.loading import load_model
from specbench.train.data import load_examples, tokenize
from specbench.train.eagle3 import Eagle3Method

torch.set_num_threads(2)
lm = load_model(None, torch.bfloat16, torch.device("cpu"), None)
items = tokenize(load_examples("../shared/data/smollm2_regen/responses.jsonl", 200), lm.tokenizer, 512)
m = Eagle3Method(lm.model, lm.tokenizer, items, init_from="specbench/weights/smollm2-135m-eagle3")
opt = torch.optim.AdamW(m.parameters(), lr=1e-5)
random.seed(0)
for _ in range(4):
    b = random.sample(items, 8)
    T = max(len(x.ids) for x in b)
    ids = torch.tensor([x.ids + [0] * (T - len(x.ids)) for x in b])
    mask = torch.tensor([[float(v) for v in x.loss_mask] + [0.0] * (T - len(x.ids)) for x in b])
    t0 = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        aux, normed = m._target_states(ids, None)
        t1 = time.perf_counter()
        m._target_states = lambda ids, idx, a=aux, n=normed: (a, n)  # the loss below reuses this forward
        loss, _ = m.loss(ids, mask)
        t2 = time.perf_counter()
    loss.backward()
    t3 = time.perf_counter()
    opt.step()
    opt.zero_grad()
    t4 = time.perf_counter()
    del m._target_states
    print(f"T={T} tokens={int(mask.sum())} teacher {t1 - t0:.2f}s head fwd {t2 - t1:.2f}s bwd {t3 - t2:.2f}s "
          f"opt {t4 - t3:.2f}s")
