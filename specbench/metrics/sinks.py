"""Metric sinks: they only write what they are given (per-step records, the final results document).

- ConsoleSink: the summary table on stdout.
- JsonlSink: one JSON line per target step (steps.jsonl in the run dir).
- WandbSink: W&B run per specbench run; offline (real run files, `wandb sync` later) when no API key is
  set. Keys are namespaced: accept/*, perf/*, latency/*, batch/*. Runs of one sweep share a group.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

from specbench.engine.loop import StepRecord
from specbench.metrics.console import format_summary


class ConsoleSink:
    def step(self, rec: StepRecord) -> None:
        pass

    def summary(self, doc: dict) -> None:
        print(format_summary(doc))

    def close(self) -> None:
        pass


class JsonlSink:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.f = open(self.path, "w")

    def step(self, rec: StepRecord) -> None:
        self.f.write(json.dumps(asdict(rec)) + "\n")

    def summary(self, doc: dict) -> None:
        self.f.flush()

    def close(self) -> None:
        self.f.close()


def _flat_summary(doc: dict) -> dict:
    a, t, lat = doc["acceptance"], doc["totals"], doc["latency"]
    out = {
        "accept/mean_acceptance_length": a["mean_acceptance_length"], "accept/rate": a["acceptance_rate"],
        "accept/num_drafts": a["num_drafts"], "accept/num_draft_tokens": a["num_draft_tokens"],
        "accept/num_draft_depth_tokens": a["num_draft_depth_tokens"],
        "accept/num_accepted_tokens": a["num_accepted_tokens"],
        "perf/tokens_per_s": t["tokens_per_s"], "perf/wall_s": t["wall_s"], "perf/new_tokens": t["new_tokens"],
        "perf/speedup": doc["speedup"], "perf/baseline_tokens_per_s": (doc["baseline"] or {}).get("tokens_per_s"),
        "accept/outputs_match_baseline": doc["outputs_match_baseline"],
        "accept/baseline_match_rate": doc["baseline_match_rate"],
    }
    for name in ("ttft_ms", "tpot_ms", "itl_ms"):
        for stat in ("mean", "p50", "p99"):
            out[f"latency/{name}_{stat}"] = lat[name][stat]
    for i, p in enumerate(a["per_position"]):
        out[f"accept/per_position_{i + 1}"] = p
    return {k: v for k, v in out.items() if v is not None}


class WandbSink:
    def __init__(self, config: dict, *, project: str = "specbench", entity: str | None = None,
                 group: str | None = None, name: str | None = None, mode: str | None = None,
                 tags: list[str] | None = None, dir: str | Path = ".") -> None:
        import wandb  # optional dependency: `pip install specbench[wandb]`

        if mode is None:  # nothing can be uploaded without a key: write real run files to sync later
            mode = os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
        self.wandb = wandb
        self.run = wandb.init(project=project, entity=entity, group=group, name=name, mode=mode,
                              tags=list(tags or []), config=config, dir=str(dir), reinit="finish_previous")

    def step(self, rec: StepRecord) -> None:
        rate = rec.num_accepted_tokens / rec.num_draft_tokens if rec.num_draft_tokens else None
        data = {"accept/step_num_draft_tokens": rec.num_draft_tokens,
                "accept/step_num_draft_depth": rec.num_draft_depth,
                "accept/step_num_accepted_tokens": rec.num_accepted_tokens,
                "perf/step_ms": rec.step_ms, "perf/draft_ms": rec.draft_ms, "perf/verify_ms": rec.verify_ms,
                "batch/num_active": rec.num_active, "perf/t_s": rec.t}
        if rate is not None:
            data["accept/step_rate"] = rate
        self.run.log(data, step=rec.step)

    def summary(self, doc: dict) -> None:
        wandb = self.wandb
        pp = doc["acceptance"]["per_position"]
        if pp:
            table = wandb.Table(columns=["position", "acceptance"], data=[[i + 1, p] for i, p in enumerate(pp)])
            self.run.log({"accept/per_position": wandb.plot.line(table, "position", "acceptance",
                                                                 title="acceptance per draft position")})
        self.run.summary.update(_flat_summary(doc))

    def close(self) -> None:
        self.run.finish()


def build_sinks(logger_cfg: dict, resolved_config: dict, out_dir: Path, sweep_group: str | None) -> list:
    """Sinks for `logger=<name>`: console always; jsonl / wandb add theirs."""
    name = logger_cfg.get("name", "console")
    sinks: list = [ConsoleSink()]
    if name in ("jsonl", "wandb") or logger_cfg.get("jsonl"):
        sinks.append(JsonlSink(out_dir / logger_cfg.get("file", "steps.jsonl")))
    if name == "wandb":
        sinks.append(WandbSink(resolved_config, project=logger_cfg.get("project", "specbench"),
                               entity=logger_cfg.get("entity"), group=logger_cfg.get("group") or sweep_group,
                               name=logger_cfg.get("run_name"), mode=logger_cfg.get("mode"),
                               tags=logger_cfg.get("tags"), dir=out_dir))
    return sinks
