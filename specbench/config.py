"""Typed config schemas, registered with Hydra's ConfigStore; the YAML files in conf/ extend them.

Every option is documented in README.md ("Config reference"). Groups without a schema here (method,
logger, parallel) have per-choice fields; their YAML files document them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING


@dataclass
class ModelSchema:
    name: Optional[str] = None  # display name in results; null = derived from the path
    path: Optional[str] = None  # HF folder / .safetensors / .gguf; null = the embedded default
    chat_template: bool = True  # wrap prompts in the tokenizer's chat template
    system_prompt: Optional[str] = None  # null = the template's own default
    attention: str = "auto"  # auto | sdpa | flash
    linear: str = "auto"  # auto (CPU small-M matmul kernels, see models/cpu_kernels.py) | torch


@dataclass
class DatasetSchema:
    name: str = "builtin"  # builtin | jsonl | hf
    path: Optional[str] = None  # jsonl: a question.jsonl (MT-bench / Spec-Bench format)
    limit: Optional[int] = None  # keep the first N prompts
    per_category: Optional[int] = None  # keep the first N prompts of each category (applied before limit)
    turns: int = 1  # user turns decoded per record: 2 = MT-bench's second turns too, after the run's own answers
    hf_name: Optional[str] = None  # hf: dataset id on the hub
    split: str = "train"  # hf: split
    field: Optional[str] = None  # hf: column holding the prompt (default: turns/prompt/instruction)


@dataclass
class TypicalSchema:
    epsilon: float = 0.09  # Medusa's posterior_threshold
    alpha: float = 0.3  # Medusa's posterior_alpha


@dataclass
class SyntheticSchema:
    rates: Optional[list[float]] = None  # acceptance=synthetic: per-position rates (>= k, non-increasing)


@dataclass
class RunConfig:
    method: Any = MISSING
    model: ModelSchema = field(default_factory=ModelSchema)
    dataset: DatasetSchema = field(default_factory=DatasetSchema)
    logger: Any = MISSING
    parallel: Any = MISSING
    k: int = 3  # speculative tokens per step (tree depth); unused by method=none
    max_new_tokens: int = 128
    batch_size: int = 1
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    stop: list[str] = field(default_factory=list)  # stop strings (besides EOS)
    acceptance: str = "auto"  # auto | greedy | sampling | typical | synthetic (see verify.py)
    typical: TypicalSchema = field(default_factory=lambda: TypicalSchema())  # acceptance=typical only
    synthetic: SyntheticSchema = field(default_factory=lambda: SyntheticSchema())  # acceptance=synthetic only
    baseline: bool = True  # also run target-only decoding in the same process (speculative methods)
    progress: bool = True  # progress bar on stderr
    threads: Optional[int] = None  # torch CPU threads; null = torch's default
    cache_dir: Optional[str] = None  # GGUF conversion cache; null = $SPECBENCH_CACHE or ~/.cache/specbench


def register() -> None:
    cs = ConfigStore.instance()
    cs.store(name="run_schema", node=RunConfig)
    cs.store(group="model", name="model_schema", node=ModelSchema)
    cs.store(group="dataset", name="dataset_schema", node=DatasetSchema)
