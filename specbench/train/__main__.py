"""`python -m specbench.train method=<name>`: build the target, the data and the method; train; export."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from specbench.errors import UserError

CONF = Path(__file__).resolve().parents[2] / "conf" / "train"
METHODS = ("draft_model", "eagle3", "medusa", "mlp_speculator")


REGEN_CHUNK = 64  # prompts per decode run of the regeneration per 8 in its batch (the cache is appended after each)


def regenerate(target, tokenizer, examples, max_new: int, cache: Path, batch_size: int = 8, progress: bool = True):
    """Self-distillation data: the target's own greedy responses to the prompts, through the decode engine (batched,
    slot refill), in chunks of REGEN_CHUNK prompts per 8 sequences of the batch (so a wide batch refills its slots
    many times before a chunk's tail leaves them empty) appended to the JSONL cache as each finishes: an interrupted
    regeneration resumes after the last finished chunk."""
    from specbench.data.prompts import Prompt, to_requests
    from specbench.engine.loop import Engine, StopCriteria
    from specbench.core.sampling import SamplingParams
    from specbench.train.data import Example

    done = {}
    if cache.is_file():
        for line in cache.read_text().splitlines():
            r = json.loads(line)
            done[r["prompt"]] = r["response"]
    todo = list({e.prompt: e for e in examples if e.prompt not in done}.values())
    if todo:
        from tqdm.auto import tqdm

        eng = Engine(target, tokenizer, batch_size=batch_size, params=SamplingParams(), progress=False,
                     stop=StopCriteria(frozenset({tokenizer.eos_token_id}), max_new))
        bar = tqdm(total=len(todo), desc="regenerate", unit="prompt", dynamic_ncols=True, disable=not progress,
                   postfix={"cached": len(done)})
        with open(cache, "a") as f:  # in chunks, appended as they finish: an interrupted run resumes after them
            size = REGEN_CHUNK * -(-batch_size // 8)
            for lo in range(0, len(todo), size):
                chunk = todo[lo: lo + size]
                reqs = to_requests([Prompt(id=str(lo + i), prompt=e.prompt) for i, e in enumerate(chunk)], tokenizer)
                for e, r in zip(chunk, eng.run(reqs)):
                    done[e.prompt] = r.text
                    f.write(json.dumps({"prompt": e.prompt, "response": r.text}) + "\n")
                f.flush()
                bar.update(len(chunk))
        bar.close()
    return [Example(e.prompt, done[e.prompt], e.source) for e in examples]


def build_draft_model(cfg: DictConfig, lm, items, prompts):
    from specbench.train.draft_model import DraftModelMethod

    m = cfg.method
    width = {k: m.get(k) for k in ("hidden_size", "intermediate_size", "num_heads", "num_kv_heads")}
    method = DraftModelMethod(lm.model, lm.tokenizer, init=m.init, layers=list(m.layers), num_layers=m.num_layers,
                              width={k: v for k, v in width.items() if v is not None} if m.init == "scratch" else None,
                              eval_prompts=prompts, eval_k=int(m.eval_k), eval_max_new_tokens=int(m.eval_max_new_tokens),
                              embed_init=str(m.get("embed_init", "random")),
                              target_tables=bool(m.get("target_tables", False)),
                              draft_vocab_size=None if m.get("draft_vocab_size") is None else int(m.draft_vocab_size),
                              items=items, init_from=m.get("init_from"))
    if method.vocab_ids is not None and cfg.data.teacher == "cached":
        raise UserError(f"train.method.draft_vocab_size={m.draft_vocab_size} with data.teacher=cached: the cached "
                        "top-k tokens are not the draft vocabulary; valid: data.teacher=online or states")
    if cfg.data.teacher == "states":  # shares the EAGLE-3 state cache for the same data (default aux layers)
        from specbench.models.eagle import default_aux_layers
        from specbench.models.loading import cache_root
        from specbench.train.features import TargetStates

        layers = tuple(default_aux_layers(lm.model.config.num_layers))
        method.states = TargetStates(lm.model, items, layers, cache_root(cfg.cache_dir), target_id=lm.path,
                                     progress=bool(cfg.progress))
    if cfg.data.teacher == "cached":
        from specbench.models.loading import cache_root
        from specbench.train.features import TeacherTopK

        k = int(cfg.data.teacher_topk)
        if not 1 <= k <= lm.model.config.vocab_size:
            raise UserError(f"data.teacher_topk={k}: must be in 1..{lm.model.config.vocab_size}")
        method.teacher = TeacherTopK(lm.model, items, k, cache_root(cfg.cache_dir), target_id=lm.path,
                                     progress=bool(cfg.progress))
    return method


def build_eagle3(cfg: DictConfig, lm, items, prompts):
    from specbench.train.eagle3 import Eagle3Method

    m = cfg.method
    vocab = m.get("draft_vocab_size")
    method = Eagle3Method(lm.model, lm.tokenizer, items, draft_vocab_size=None if vocab is None else int(vocab),
                          ttt_steps=int(m.ttt_steps), step_weight=float(m.step_weight),
                          aux_layers=list(m.aux_layers) if m.aux_layers else None, eval_prompts=prompts,
                          eval_k=int(m.eval_k), eval_max_new_tokens=int(m.eval_max_new_tokens),
                          init_from=m.get("init_from"), fc_norm=bool(m.get("fc_norm", False)),
                          topk=int(m.get("topk", 0)), topk_weight=float(m.get("topk_weight", 1.0)))
    if cfg.data.teacher in ("cached", "states"):  # EAGLE-3 always trains from the state cache when cached
        from specbench.models.loading import cache_root
        from specbench.train.features import TargetStates

        method.states = TargetStates(lm.model, items, tuple(method.aux_layers), cache_root(cfg.cache_dir),
                                     target_id=lm.path, progress=bool(cfg.progress))
    return method


def build_medusa(cfg: DictConfig, lm, items, prompts):
    from specbench.train.medusa import MedusaMethod

    m = cfg.method
    method = MedusaMethod(lm.model, lm.tokenizer, items, num_heads=int(m.num_heads), num_layers=int(m.num_layers),
                          head_vocab_size=int(m.head_vocab_size), decay=float(m.decay), eval_prompts=prompts,
                          eval_k=int(m.eval_k), eval_tree=m.get("eval_tree"),
                          eval_max_new_tokens=int(m.eval_max_new_tokens))
    if cfg.data.teacher in ("cached", "states"):  # the final-normed states of the shared target-state cache
        from specbench.models.eagle import default_aux_layers
        from specbench.models.loading import cache_root
        from specbench.train.features import TargetStates

        layers = tuple(default_aux_layers(lm.model.config.num_layers))
        method.states = TargetStates(lm.model, items, layers, cache_root(cfg.cache_dir), target_id=lm.path,
                                     progress=bool(cfg.progress))
    return method


def build_mlp_speculator(cfg: DictConfig, lm, items, prompts, examples, out: Path):
    """The method, plus stage 2 (the target's own samples, fms-fsdp) as a second phase when it is on."""
    from specbench.data.prompts import encode_prompt
    from specbench.train.mlp_speculator import MLPSpeculatorMethod, sample_sequences
    from specbench.train.trainer import Phase

    m, s2 = cfg.method, cfg.method.stage2
    method = MLPSpeculatorMethod(lm.model, lm.tokenizer, n_predict=int(m.n_predict), inner_dim=int(m.inner_dim),
                                 tables=str(m.tables), tie_weights=bool(m.tie_weights),
                                 scale_input=bool(m.scale_input), labels=str(m.labels), positions=int(m.positions),
                                 top_k_tokens_per_head=list(m.top_k_tokens_per_head) if m.top_k_tokens_per_head else None,
                                 n_candidates=int(m.n_candidates), eval_prompts=prompts, eval_k=int(m.eval_k),
                                 eval_tree=m.get("eval_tree"), eval_max_new_tokens=int(m.eval_max_new_tokens),
                                 seed=int(cfg.train.seed))
    frac = float(s2.start_fraction)
    if not 0 < frac <= 1:
        raise UserError(f"train.method.stage2.start_fraction={frac}: must be in (0, 1] (1 = stage 1 only)")
    start = int(round(frac * int(cfg.train.steps)))
    phases, parts = None, [items]
    if start < int(cfg.train.steps):
        if int(s2.sequences) < 1 or int(s2.new_tokens) < 1 or float(s2.temperature) <= 0 or int(s2.top_k) < 0:
            raise UserError(f"train.method.stage2: sequences={s2.sequences}, new_tokens={s2.new_tokens} must be >= 1, "
                            f"temperature={s2.temperature} > 0, top_k={s2.top_k} >= 0")
        short = [e.prompt for e in examples
                 if len(encode_prompt(lm.tokenizer, e.prompt)) <= int(s2.prompt_max_tokens)][: int(s2.sequences)]
        if not short:
            raise UserError(f"train.method.stage2.prompt_max_tokens={s2.prompt_max_tokens}: no training prompt is "
                            "that short")
        sampled = sample_sequences(lm.model, lm.tokenizer, short, new_tokens=int(s2.new_tokens),
                                   temperature=float(s2.temperature), top_k=int(s2.top_k),
                                   batch_size=int(s2.batch_size), seed=int(cfg.train.seed),
                                   cache=out / "stage2.jsonl", progress=bool(cfg.progress))
        parts.append(sampled)
        phases = [Phase(0, 0, len(items), 1.0, "stage1"),
                  Phase(start, len(items), len(items) + len(sampled), float(s2.lr_scale), "stage2")]
    if cfg.data.teacher in ("cached", "states"):  # final-normed states only (layers=())
        from specbench.models.loading import cache_root
        from specbench.train.features import StackedStates, TargetStates

        caches = [(TargetStates(lm.model, p, (), cache_root(cfg.cache_dir), target_id=lm.path,
                                progress=bool(cfg.progress)), len(p)) for p in parts]
        method.states = StackedStates(caches) if len(caches) > 1 else caches[0][0]
    return method, [x for p in parts for x in p], phases


def train(cfg: DictConfig) -> dict:
    import torch

    from specbench.data.prompts import Prompt
    from specbench.log import log
    from specbench.run import resolve_device, resolve_dtype
    from specbench.models.loading import load_model
    from specbench.train.data import load_examples, tokenize
    from specbench.train.trainer import Trainer, TrainSettings

    if cfg.method.name not in METHODS:
        raise UserError(f"method={cfg.method.name!r}; trainable methods: {', '.join(METHODS)}")
    if cfg.data.mode not in ("teacher_forced", "self_distill"):
        raise UserError(f"data.mode={cfg.data.mode!r}; valid: teacher_forced, self_distill")
    for key, low in (("data.regen_batch_size", 1), ("data.regen_max_new_tokens", 1), ("train.steps", 0),
                     ("train.length_pool", 1)):
        v = OmegaConf.select(cfg, key)
        if not isinstance(v, int) or isinstance(v, bool) or v < low:
            note = " (0: prepare the data, train nothing)" if low == 0 else ""
            raise UserError(f"{key}={v!r}; valid: an integer >= {low}{note}")
    device = resolve_device(str(cfg.get("device", "auto")))
    dtype = resolve_dtype(cfg.dtype, device)
    lm = load_model(cfg.model.path, dtype, device, cfg.cache_dir)
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    examples = [e for p in cfg.data.paths for e in load_examples(p, cfg.data.limit)]
    n_eval = int(cfg.data.eval_prompts)
    if len(examples) <= n_eval:
        raise UserError(f"data: {len(examples)} records, need more than data.eval_prompts={n_eval}")
    held, examples = examples[:n_eval], examples[n_eval:]
    if cfg.data.mode == "self_distill":
        examples = regenerate(lm.model, lm.tokenizer, examples, int(cfg.data.regen_max_new_tokens), out / "regen.jsonl",
                              int(cfg.data.regen_batch_size), bool(cfg.progress))
    items = tokenize(examples, lm.tokenizer, int(cfg.data.max_len))
    m = cfg.method
    if cfg.data.teacher not in ("online", "cached", "states"):
        raise UserError(f"data.teacher={cfg.data.teacher!r}; valid: online, cached, states")
    prompts = [Prompt(id=str(i), prompt=e.prompt) for i, e in enumerate(held)]
    phases = None
    if m.name == "mlp_speculator":
        method, items, phases = build_mlp_speculator(cfg, lm, items, prompts, examples, out)
    else:
        build = {"eagle3": build_eagle3, "medusa": build_medusa, "draft_model": build_draft_model}[m.name]
        method = build(cfg, lm, items, prompts)
    if int(cfg.train.steps) == 0:  # prepare only: the regeneration and teacher caches above are on disk now
        log(f"train.steps=0: data prepared ({len(items):,} sequences"
            + (f"; regenerated responses in {out / 'regen.jsonl'}" if cfg.data.mode == "self_distill" else "")
            + "); nothing trained or exported")
        return {}
    settings = TrainSettings(**OmegaConf.to_container(cfg.train, resolve=True))
    history_log = out / "train_log.jsonl"

    def on_log(row: dict) -> None:
        with open(history_log, "a") as f:
            f.write(json.dumps(row) + "\n")

    trainer = Trainer(method, items, settings, out, autocast_ok=dtype == torch.bfloat16, progress=bool(cfg.progress),
                      on_log=on_log, pad_id=lm.tokenizer.pad_token_id or 0, phases=phases)
    if cfg.resume:
        trainer.try_resume()
    history = trainer.fit()
    method.export(out / "model")
    final = history[-1] if history else {}
    print(json.dumps({"out": str(out / "model"), "steps": trainer.step, **final}, indent=2))
    return final


@hydra.main(version_base="1.3", config_path=str(CONF), config_name="config")
def _main(cfg: DictConfig) -> None:
    try:
        train(cfg)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    _main()
