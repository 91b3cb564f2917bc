"""One run: resolve device/dtype, load the target (once per process), decode the prompts, write results."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from specbench.data.prompts import check_turns, load_prompts, next_turns, to_requests
from specbench.engine.loop import Engine, StopCriteria
from specbench.core.sampling import SamplingParams
from specbench.core.hw import cpu_has_fast_bf16
from specbench.errors import UserError
from specbench.log import log
from specbench.metrics.sinks import build_sinks
from specbench.metrics.results import build_results
from specbench.models.loading import LoadedModel, load_model

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_TARGETS: dict[tuple, LoadedModel] = {}  # a multirun sweep loads each target once per process


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise UserError(f"device={name!r}; valid: auto, cpu, cuda, cuda:N") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"device={name!r} but CUDA is not available; use device=cpu")
    return dev


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """auto: bfloat16 on CUDA with bf16 support or a CPU with AVX512-BF16/AMX, else float32."""
    if name == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.bfloat16 if cpu_has_fast_bf16() else torch.float32
    if name not in DTYPES:
        raise UserError(f"dtype={name!r}; valid: auto, {', '.join(DTYPES)}")
    return DTYPES[name]


def parallel_sizes(cfg: DictConfig) -> tuple[int, int, int]:
    p = cfg.parallel
    return int(p.get("tp", 1)), int(p.get("pp", 1)), int(p.get("draft_tp", 1))


def sampling_params(cfg: DictConfig) -> SamplingParams:
    return SamplingParams(float(cfg.temperature), float(cfg.top_p), int(cfg.get("top_k", 0)))


def validate(cfg: DictConfig) -> None:
    if cfg.batch_size < 1:
        raise UserError(f"batch_size={cfg.batch_size}: must be >= 1")
    if cfg.max_new_tokens < 1:
        raise UserError(f"max_new_tokens={cfg.max_new_tokens}: must be >= 1")
    if cfg.temperature < 0:
        raise UserError(f"temperature={cfg.temperature}: must be >= 0 (0 = greedy)")
    if not 0 < cfg.top_p <= 1:
        raise UserError(f"top_p={cfg.top_p}: must be in (0, 1]")
    if cfg.top_k < 0:
        raise UserError(f"top_k={cfg.top_k}: must be >= 0 (0 = off)")
    if cfg.k < 1:
        raise UserError(f"k={cfg.k}: must be >= 1")
    if cfg.dataset.turns < 1:
        raise UserError(f"dataset.turns={cfg.dataset.turns}: must be >= 1 (1 = first turns only)")
    from specbench.parallel import check_sizes

    check_sizes(*parallel_sizes(cfg))
    if not isinstance(cfg.parallel.get("async", False), bool):
        raise UserError(f"parallel.async={cfg.parallel.get('async')!r}; valid: true, false")
    from specbench.verify import RULES, resolve_rule

    if cfg.acceptance not in RULES:
        raise UserError(f"acceptance={cfg.acceptance!r}; valid: {', '.join(RULES)}")
    if cfg.method.get("drafter") is not None:
        try:
            resolve_rule(str(cfg.acceptance), sampling_params(cfg))
        except ValueError as e:
            raise UserError(str(e)) from None
        if cfg.acceptance == "synthetic":
            from specbench.engine.loop import check_synthetic_rates

            check_synthetic_rates(_rates(cfg), int(cfg.k))


def _rates(cfg: DictConfig) -> list[float] | None:
    r = cfg.synthetic.rates
    return None if r is None else list(r)


def acceptance_kw(cfg: DictConfig) -> dict:
    """The acceptance rule's own settings: typical.{epsilon,alpha}, synthetic.rates."""
    return {**dict(cfg.typical), "rates": _rates(cfg)}


def build_drafter(cfg: DictConfig):
    """Instantiate `method.drafter` (a `_target_` node); None for method=none."""
    node = cfg.method.get("drafter")
    if node is None:
        return None
    from hydra.utils import instantiate

    try:
        drafter = instantiate(node)
    except Exception as e:  # noqa: BLE001 - Hydra wraps constructor errors
        cause = e
        while cause.__cause__ is not None:
            cause = cause.__cause__
        if isinstance(cause, UserError):
            raise cause from None
        raise
    lk = _lookup(cfg)
    if lk is not None:  # prompt lookup grafted onto the drafter's tree
        from specbench.drafters.ngram import LookupUnion

        drafter = LookupUnion(drafter, lk.get("min_n", 2), lk.max_n, str(cfg.method.name), lk.get("drafter_k"))
        drafter.own_k(int(cfg.k))  # drafter_k <= k, said before anything loads
    elif (cfg.method.get("lookup") or {}).get("drafter_k") is not None:
        raise UserError(f"method.lookup.drafter_k={cfg.method.lookup.drafter_k} needs prompt lookup on "
                        "(method.lookup.max_n=4, say): without it the drafter's depth is k")
    if cfg.k > drafter.max_draft_len:
        limit = ("a lookup chain's limit" if getattr(drafter, "drafter_k", None) is not None
                 else "method.drafter.max_draft_len")
        raise UserError(f"k={cfg.k}: method={cfg.method.name} supports k <= {drafter.max_draft_len} ({limit})")
    return drafter


def _lookup(cfg: DictConfig):
    """`method.lookup` when it is on (max_n set), else None."""
    lk = cfg.method.get("lookup")
    return lk if lk is not None and lk.get("max_n") is not None else None


def drafter_info(cfg: DictConfig) -> dict | None:
    node = cfg.method.get("drafter")
    if node is None:
        return None
    info = OmegaConf.to_container(node, resolve=True)
    lk = _lookup(cfg)
    lookup = {"lookup": OmegaConf.to_container(lk)} if lk is not None else {}
    return {"name": cfg.method.name, **{k: v for k, v in info.items() if k != "_target_"},
            "class": info.get("_target_"), **lookup}


def get_target(cfg: DictConfig, device: torch.device, dtype: torch.dtype, topo=None) -> LoadedModel:
    """The target, loaded once per process (and per parallel layout: the transforms cut the model)."""
    from dataclasses import replace

    from specbench.parallel import LOCAL, agree, apply

    topo = topo or LOCAL
    key = (cfg.model.path, str(device), dtype, cfg.cache_dir, cfg.model.attention, topo.tp, topo.pp)
    if key not in _TARGETS:
        t = time.perf_counter()

        def load() -> LoadedModel:
            loaded = load_model(cfg.model.path, dtype, device, cfg.cache_dir, cfg.model.attention)
            return replace(loaded, model=apply(loaded.model, topo))

        _TARGETS[key] = agree(topo, load)  # a rank that fails to load makes every rank fail alike
        where = f", tp={topo.tp} pp={topo.pp} (rank {topo.rank} of {topo.world})" if topo.parallel else ""
        log(f"loaded {_TARGETS[key].name} ({dtype}, {device}{where}) in {time.perf_counter() - t:.1f}s")
    return _TARGETS[key]


def sweep_group() -> str | None:
    """The multirun sweep folder's name (runs of one sweep share a W&B group); None for a single run."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hc = HydraConfig.get()
        return Path(hc.sweep.dir).name if hc.mode == RunMode.MULTIRUN else None
    except ValueError:
        return None


def output_dir() -> Path:
    try:
        from hydra.core.hydra_config import HydraConfig

        return Path(HydraConfig.get().runtime.output_dir)
    except ValueError:  # not under Hydra (library use)
        return Path.cwd()


def _requests(cfg: DictConfig, tok) -> list:
    """The first turns of the prompt set (a conversation's later turns come from `_decode`)."""
    prompts = load_prompts(cfg.dataset.name, cfg.dataset.path, cfg.dataset.limit, cfg.dataset.hf_name,
                           cfg.dataset.split, cfg.dataset.field, cfg.dataset.per_category)
    check_turns(prompts, cfg.dataset.turns, tok, bool(cfg.model.chat_template), f"dataset={cfg.dataset.name}")
    return to_requests(prompts, tok, cfg.model.chat_template, cfg.model.system_prompt)


@dataclass
class Decoded:
    """Every turn's results (turn 1 of every conversation, then turn 2 of those that have one, ...) and the
    engine's counters summed over the turns."""
    results: list
    wall_s: float = 0.0
    steps: int = 0
    timing: dict = field(default_factory=dict)
    discarded_rows: int = 0


def _decode(cfg: DictConfig, engine: Engine, requests: list) -> Decoded:
    """Decode the first turns, then, up to dataset.turns, each conversation's next user turn after the answers
    this engine gave (MT-bench's second turns follow the run's own first answers, as EAGLE's and Spec-Bench's
    evaluations do). The turns run one after another: a turn waits for every conversation's previous one."""
    out = Decoded([])
    for turn in range(1, int(cfg.dataset.turns) + 1):
        if not requests:
            break
        if turn > 1:
            log(f"turn {turn}: {len(requests)} conversations")
        sink = engine.on_step
        if sink is not None and turn > 1:  # the step logs run on across turns (W&B needs rising steps)
            engine.on_step = lambda rec, n=out.steps, t=out.wall_s: sink(replace(rec, step=rec.step + n, t=rec.t + t))
        t0 = time.perf_counter()
        try:
            results = engine.run(requests)
        finally:
            engine.on_step = sink
        out.wall_s += time.perf_counter() - t0
        out.results += results
        out.steps += engine.num_steps
        out.discarded_rows += engine.discarded_rows
        for key, v in engine.timing.items():
            out.timing[key] = out.timing.get(key, 0.0) + v
        if turn < int(cfg.dataset.turns):
            requests = next_turns(requests, [r.text for r in results], engine.tokenizer,
                                  bool(cfg.model.chat_template), cfg.model.system_prompt)
    return out


def _stop(cfg: DictConfig, target: LoadedModel) -> StopCriteria:
    eos = set(target.model.config.eos_token_id)
    if target.tokenizer.eos_token_id is not None:
        eos.add(int(target.tokenizer.eos_token_id))
    return StopCriteria(frozenset(eos), int(cfg.max_new_tokens), tuple(cfg.stop))


def _resolved_config(cfg: DictConfig, target: LoadedModel, device: torch.device, dtype: torch.dtype,
                     world_size: int = 1) -> dict:
    """The config as it ran: resolved values, device, dtype, the acceptance rule, CPU and kernel choices."""
    from specbench.core.hw import cpu_summary
    from specbench.models import cpu_kernels
    from specbench.verify import LOSSLESS, resolve_rule

    resolved = OmegaConf.to_container(cfg, resolve=True)
    resolved["model"]["name"] = cfg.model.name or target.name
    has_drafter = cfg.method.get("drafter") is not None
    rule = resolve_rule(str(cfg.acceptance), sampling_params(cfg)) \
        if has_drafter else None
    resolved.update({"device": str(device), "dtype": str(dtype).removeprefix("torch."),
                     "target": resolved["model"]["name"], "drafter": drafter_info(cfg),
                     "acceptance_rule": {"rule": rule, "lossless": LOSSLESS[rule] if rule else True,
                                         **({"rates": _rates(cfg)} if rule == "synthetic" else {})},
                     "tp": int(cfg.parallel.get("tp", 1)), "pp": int(cfg.parallel.get("pp", 1)),
                     "draft_tp": int(cfg.parallel.get("draft_tp", 1)), "world_size": world_size,
                     "async": bool(cfg.parallel.get("async", False))})
    if device.type == "cpu":
        resolved["cpu"] = {**cpu_summary(), "linear": cpu_kernels.describe(dtype)}
    return resolved


def _threads(cfg: DictConfig) -> None:
    """threads, or under torchrun on CPU the cores divided among the local ranks (they must not oversubscribe)."""
    import os

    if cfg.threads:
        torch.set_num_threads(int(cfg.threads))
    elif int(os.environ.get("LOCAL_WORLD_SIZE", "1")) > 1:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["LOCAL_WORLD_SIZE"])))


def _parallel_report(topo, engines: dict) -> dict | None:
    """Every rank's collective time and step timing, gathered on each (the writer keeps them)."""
    if not topo.parallel:
        return None
    mine = {"rank": topo.rank, "stage": topo.stage, "tp_rank": topo.tp_rank, "layers": list(topo.layers),
            "runs_drafter": topo.runs_drafter, "comm": {n: c for n, c in engines.items()}}
    return {**topo.describe(), "ranks": topo.comm.all_gather_object(mine)}


def run(cfg: DictConfig) -> dict:
    """Resolve and load, decode the prompts (speculative, then target-only for the same-run baseline), write
    results.json and hand it to the sinks. Under torchrun every rank runs this; rank 0 writes and logs."""
    from specbench.parallel import agree, init, join, local_device, shard_drafter

    device = local_device(resolve_device(cfg.device))
    timeout = float(cfg.parallel.get("timeout_s", 120))
    if timeout <= 0:
        raise UserError(f"parallel.timeout_s={cfg.parallel.timeout_s}: must be > 0 (seconds)")
    join(device, timeout)  # under torchrun: every rank fails alike below
    agree(None, lambda: validate(cfg))
    _threads(cfg)
    dtype = resolve_dtype(cfg.dtype, device)
    tp, pp, draft_tp = parallel_sizes(cfg)
    topo = init(tp, pp, draft_tp, device, timeout, bool(cfg.parallel.get("sync_timing", False)),
                str(cfg.parallel.get("allreduce", "auto")))
    writer = topo.rank == 0
    from specbench.models import cpu_kernels

    try:
        cpu_kernels.set_mode(str(cfg.model.linear))
    except ValueError as e:
        raise UserError(str(e)) from None
    target = get_target(cfg, device, dtype, topo)
    requests = _requests(cfg, target.tokenizer)
    stop = _stop(cfg, target)
    params = sampling_params(cfg)
    drafter = agree(topo, lambda: build_drafter(cfg))
    agree(topo, lambda: shard_drafter(drafter, topo, str(cfg.method.name)))
    resolved = _resolved_config(cfg, target, device, dtype, topo.world)
    out = output_dir()
    sinks = []
    if writer:
        out.mkdir(parents=True, exist_ok=True)
        sinks = build_sinks(OmegaConf.to_container(cfg.logger, resolve=True), resolved, out, sweep_group())

    def engine(d, max_new: int = int(cfg.max_new_tokens), on_step=None) -> Engine:
        return Engine(target.model, target.tokenizer, batch_size=int(cfg.batch_size),
                      stop=StopCriteria(stop.eos_ids, max_new, stop.stop_strings), params=params,
                      seed=int(cfg.seed), progress=bool(cfg.progress) and max_new > 4 and writer, drafter=d,
                      k=int(cfg.k), acceptance=str(cfg.acceptance) if d is not None else "auto",
                      acceptance_kw=acceptance_kw(cfg), on_step=on_step, topology=topo,
                      async_scheduling=bool(cfg.parallel.get("async", False)))

    def on_step(rec) -> None:
        for s in sinks:
            s.step(rec)

    try:
        compare = drafter is not None and bool(cfg.baseline)
        if compare:  # warm both paths up (one-time kernel setup) so neither side of the ratio pays it
            engine(drafter, 4).run(requests[:1])
            engine(None, 4).run(requests[:1])
        if topo.parallel:
            topo.comm.reset()
        spec = engine(drafter, on_step=on_step)
        done = _decode(cfg, spec, requests)
        comm = {"speculative": {**topo.comm.summary(), "timing": done.timing}} if topo.parallel else {}
        baseline = base_results = None
        if compare:
            log("baseline: target-only decoding of the same prompts")
            if topo.parallel:
                topo.comm.reset()
            base = _decode(cfg, engine(None), requests)
            base_results = base.results
            if topo.parallel:
                comm["baseline"] = {**topo.comm.summary(), "timing": base.timing}
            btokens = sum(r.num_new_tokens for r in base_results)
            baseline = {"tokens_per_s": btokens / base.wall_s, "wall_s": base.wall_s, "new_tokens": btokens,
                        "target_steps": base.steps, "timing": base.timing}
        if hasattr(drafter, "describe"):  # what the drafter resolved at setup (e.g. EAGLE-3's aux layers)
            from specbench.parallel import share_outcome

            info = drafter.describe() if topo.runs_drafter else None
            resolved["drafter"].update(share_outcome(topo, None, info) if topo.parallel else info)
        extra = {"timing": done.timing, "scheduling": {"async": spec.async_, "discarded_rows": done.discarded_rows}}
        report = _parallel_report(topo, comm)
        if report is not None:
            extra["parallel"] = report
        if writer:
            doc = build_results(resolved, done.results, done.wall_s, done.steps, baseline, base_results, extra=extra)
            (out / "results.json").write_text(json.dumps(doc, indent=2))
            for s in sinks:
                s.summary(doc)
        else:
            doc = {}
    finally:
        for s in sinks:
            s.close()
    log(f"results: {out / 'results.json'}")
    return doc
