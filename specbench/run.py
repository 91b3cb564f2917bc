"""One run: resolve device/dtype, load the target (once per process), decode the prompts, write results."""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from specbench.data.prompts import load_prompts, to_requests
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
    for key in ("tp", "pp"):
        if int(cfg.parallel.get(key, 1)) != 1:
            raise UserError(f"parallel.{key}={cfg.parallel[key]}: only 1 is supported in this version")
    if bool(cfg.parallel.get("async", False)):
        raise UserError("parallel.async=true: asynchronous scheduling is not supported in this version; "
                        "valid: false")
    from specbench.verify import RULES, resolve_rule

    if cfg.acceptance not in RULES:
        raise UserError(f"acceptance={cfg.acceptance!r}; valid: {', '.join(RULES)}")
    if cfg.method.get("drafter") is not None:
        try:
            resolve_rule(str(cfg.acceptance), sampling_params(cfg))
        except ValueError as e:
            raise UserError(str(e)) from None


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
    if cfg.k > drafter.max_draft_len:
        raise UserError(f"k={cfg.k}: method={cfg.method.name} supports k <= {drafter.max_draft_len} "
                        f"(method.drafter.max_draft_len)")
    return drafter


def drafter_info(cfg: DictConfig) -> dict | None:
    node = cfg.method.get("drafter")
    if node is None:
        return None
    info = OmegaConf.to_container(node, resolve=True)
    return {"name": cfg.method.name, **{k: v for k, v in info.items() if k != "_target_"},
            "class": info.get("_target_")}


def get_target(cfg: DictConfig, device: torch.device, dtype: torch.dtype) -> LoadedModel:
    key = (cfg.model.path, str(device), dtype, cfg.cache_dir, cfg.model.attention)
    if key not in _TARGETS:
        t = time.perf_counter()
        _TARGETS[key] = load_model(cfg.model.path, dtype, device, cfg.cache_dir, cfg.model.attention)
        log(f"loaded {_TARGETS[key].name} ({dtype}, {device}) in {time.perf_counter() - t:.1f}s")
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
    prompts = load_prompts(cfg.dataset.name, cfg.dataset.path, cfg.dataset.limit, cfg.dataset.hf_name,
                           cfg.dataset.split, cfg.dataset.field, cfg.dataset.per_category)
    return to_requests(prompts, tok, cfg.model.chat_template, cfg.model.system_prompt)


def _stop(cfg: DictConfig, target: LoadedModel) -> StopCriteria:
    eos = set(target.model.config.eos_token_id)
    if target.tokenizer.eos_token_id is not None:
        eos.add(int(target.tokenizer.eos_token_id))
    return StopCriteria(frozenset(eos), int(cfg.max_new_tokens), tuple(cfg.stop))


def _resolved_config(cfg: DictConfig, target: LoadedModel, device: torch.device, dtype: torch.dtype) -> dict:
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
                     "acceptance_rule": {"rule": rule, "lossless": LOSSLESS[rule] if rule else True},
                     "tp": int(cfg.parallel.get("tp", 1)), "pp": int(cfg.parallel.get("pp", 1)),
                     "async": bool(cfg.parallel.get("async", False))})
    if device.type == "cpu":
        resolved["cpu"] = {**cpu_summary(), "linear": cpu_kernels.describe(dtype)}
    return resolved


def _timed(engine: Engine, requests: list) -> tuple[list, float]:
    t0 = time.perf_counter()
    results = engine.run(requests)
    return results, time.perf_counter() - t0


def run(cfg: DictConfig) -> dict:
    """Resolve and load, decode the prompts (speculative, then target-only for the same-run baseline), write
    results.json and hand it to the sinks."""
    validate(cfg)
    if cfg.threads:
        torch.set_num_threads(int(cfg.threads))
    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype, device)
    from specbench.models import cpu_kernels

    try:
        cpu_kernels.set_mode(str(cfg.model.linear))
    except ValueError as e:
        raise UserError(str(e)) from None
    target = get_target(cfg, device, dtype)
    requests = _requests(cfg, target.tokenizer)
    stop = _stop(cfg, target)
    params = sampling_params(cfg)
    drafter = build_drafter(cfg)
    resolved = _resolved_config(cfg, target, device, dtype)
    out = output_dir()
    out.mkdir(parents=True, exist_ok=True)
    sinks = build_sinks(OmegaConf.to_container(cfg.logger, resolve=True), resolved, out, sweep_group())

    def engine(d, max_new: int = int(cfg.max_new_tokens), on_step=None) -> Engine:
        return Engine(target.model, target.tokenizer, batch_size=int(cfg.batch_size),
                      stop=StopCriteria(stop.eos_ids, max_new, stop.stop_strings), params=params,
                      seed=int(cfg.seed), progress=bool(cfg.progress) and max_new > 4, drafter=d, k=int(cfg.k),
                      acceptance=str(cfg.acceptance) if d is not None else "auto",
                      acceptance_kw=dict(cfg.typical), on_step=on_step)

    def on_step(rec) -> None:
        for s in sinks:
            s.step(rec)

    try:
        compare = drafter is not None and bool(cfg.baseline)
        if compare:  # warm both paths up (one-time kernel setup) so neither side of the ratio pays it
            engine(drafter, 4).run(requests[:1])
            engine(None, 4).run(requests[:1])
        spec = engine(drafter, on_step=on_step)
        results, wall = _timed(spec, requests)
        baseline = base_results = None
        if compare:
            log("baseline: target-only decoding of the same prompts")
            base = engine(None)
            base_results, bwall = _timed(base, requests)
            btokens = sum(r.num_new_tokens for r in base_results)
            baseline = {"tokens_per_s": btokens / bwall, "wall_s": bwall, "new_tokens": btokens,
                        "target_steps": base.num_steps, "timing": dict(base.timing)}
        if hasattr(drafter, "describe"):  # what the drafter resolved at setup (e.g. EAGLE-3's aux layers)
            resolved["drafter"].update(drafter.describe())
        doc = build_results(resolved, results, wall, spec.num_steps, baseline, base_results,
                            extra={"timing": dict(spec.timing)})
        (out / "results.json").write_text(json.dumps(doc, indent=2))
        for s in sinks:
            s.summary(doc)
    finally:
        for s in sinks:
            s.close()
    log(f"results: {out / 'results.json'}")
    return doc
