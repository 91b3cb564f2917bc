"""Sweeps, sinks and the report: a multirun over two methods x two k on a tiny model, W&B offline files
read back, steps.jsonl, report numbers equal the results', bad sweep folders skipped by name."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from wandb_files import read_run


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, tiny_dir) -> Path:
    root = tmp_path_factory.mktemp("sweep")
    out = root / "mr"
    env = dict(os.environ, WANDB_MODE="offline", WANDB_SILENT="true")
    env.pop("WANDB_API_KEY", None)
    p = subprocess.run([sys.executable, "-m", "specbench", "-m", "method=none,ngram", "k=2,3",
                        f"model.path={tiny_dir}", "max_new_tokens=8", "dataset.limit=3", "progress=false",
                        "dtype=float32", "logger=wandb", f"hydra.sweep.dir={out}"],
                       cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return out


def test_multirun_writes_one_result_per_job(sweep):
    runs = sorted(sweep.glob("*/results.json"))
    assert len(runs) == 4
    docs = [json.loads(p.read_text()) for p in runs]
    assert sorted((d["config"]["method"]["name"], d["config"]["k"]) for d in docs) == [
        ("ngram", 2), ("ngram", 3), ("none", 2), ("none", 3)]
    for d in docs:
        if d["config"]["method"]["name"] == "ngram":
            assert d["outputs_match_baseline"] is True and d["baseline"]["timing"]["step_s"] > 0


def test_wandb_offline_files_hold_the_logged_metrics(sweep):
    for job in sorted(p for p in sweep.iterdir() if p.is_dir()):
        doc = json.loads((job / "results.json").read_text())
        (run_dir,) = list((job / "wandb").glob("offline-run-*"))
        run = read_run(run_dir)
        assert run["group"] == sweep.name and run["project"] == "specbench"
        assert run["config"]["method"]["name"] == doc["config"]["method"]["name"]
        steps = [h for h in run["history"] if "perf/step_ms" in h]
        assert len(steps) == doc["totals"]["target_steps"]
        assert sum(h["accept/step_num_accepted_tokens"] for h in steps) == doc["acceptance"]["num_accepted_tokens"]
        s = run["summary"]
        assert s["perf/tokens_per_s"] == pytest.approx(doc["totals"]["tokens_per_s"])
        assert s["perf/new_tokens"] == doc["totals"]["new_tokens"]
        assert s["latency/tpot_ms_p50"] == pytest.approx(doc["latency"]["tpot_ms"]["p50"])
        if doc["speedup"] is not None:
            assert s["perf/speedup"] == pytest.approx(doc["speedup"])
        jsonl = [json.loads(x) for x in (job / "steps.jsonl").read_text().splitlines()]
        assert [r["step"] for r in jsonl] == [h["_step"] for h in steps]


def _table_rows(text: str) -> list[list[str]]:
    lines = [ln for ln in text.splitlines() if ln.startswith("| ") and not ln.startswith("| method")]
    return [[c.strip() for c in ln.strip("|").split("|")] for ln in lines]


def test_report_numbers_equal_results(sweep, tmp_path):
    from specbench.report.report import render

    text, problems = render(sweep, tmp_path)
    assert problems == []
    rows = _table_rows(text.split("Per category")[0])
    docs = sorted((json.loads(p.read_text()) for p in sweep.glob("*/results.json")),
                  key=lambda d: (d["config"]["method"]["name"] != "none", d["config"]["method"]["name"], d["config"]["k"]))
    assert len(rows) == 4
    for row, d in zip(rows, docs):
        assert row[0] == d["config"]["method"]["name"]
        assert row[5] == f"{d['totals']['tokens_per_s']:.1f}"
        assert row[6] == ("-" if d["speedup"] is None else f"{d['speedup']:.2f}")
        assert row[11] == f"{d['latency']['tpot_ms']['p50']:.1f}"
    assert (tmp_path / "speedup_vs_k.png").stat().st_size > 1000
    assert (tmp_path / "per_position.png").is_file() and (tmp_path / "report.md").is_file()


def test_report_skips_missing_and_malformed(sweep, tmp_path):
    from specbench.report.report import render

    root = tmp_path / "copy"
    shutil.copytree(sweep, root, ignore=shutil.ignore_patterns("wandb"))
    jobs = sorted(p for p in root.iterdir() if p.is_dir())
    (jobs[0] / "results.json").unlink()
    (jobs[1] / "results.json").write_text("{not json")
    text, problems = render(root, tmp_path / "out", with_plots=False)
    assert len(_table_rows(text.split("Per category")[0])) == 2
    assert any(jobs[0].name in p and "no results.json" in p for p in problems)
    assert any(jobs[1].name in p and "malformed" in p for p in problems)
    p = subprocess.run([sys.executable, "-m", "specbench.report", str(root), "--no-plots", "--out", str(tmp_path / "o2")],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "skipped" in p.stderr


def test_cost_model_counts_the_tokens_actually_drafted():
    """Hand-counted: 10 steps drafted 25 tokens in 0.5 s (k = 4, drafts stop short), a plain target step is
    2.0 s / 40 = 0.05 s: c = 0.5 / 25 / 0.05 = 0.4 per drafted token; 12 accepted -> 2.2 tokens per step over
    a step costing 1 + 0.4 * 2.5 = 2 plain steps -> 1.1."""
    from specbench.report.report import cost_model

    doc = {"config": {"k": 4}, "totals": {"target_steps": 10},
           "acceptance": {"num_draft_tokens": 25, "num_accepted_tokens": 12, "num_drafts": 10,
                          "acceptance_rate": 0.0, "mean_acceptance_length": 2.2},
           "timing": {"draft_s": 0.5, "verify_s": 0.6, "step_s": 1.2},
           "baseline": {"target_steps": 40, "timing": {"step_s": 2.0}}}
    m = cost_model(doc)
    assert m["c"] == pytest.approx(0.4) and m["pred_tau"] == pytest.approx(1.1)
    assert m["verify_over_step"] == pytest.approx(1.2) and m["pred_iid"] == pytest.approx(0.5)  # α = 0: 1 / 2


def test_method_labels():
    from specbench.report.report import Row

    def label(drafter, name="draft_model"):
        return Row(None, {"config": {"method": {"name": name}, "drafter": drafter}}).method

    assert label({"tree": {"topk": 3, "num_draft_tokens": 10}}) == "draft_model tree 3x10"
    assert label({"tree": {"topk": 3, "num_draft_tokens": 10}, "lookup": {"min_n": 2, "max_n": 4}}) == \
        "draft_model tree 3x10 + lookup"
    assert label({"tree": None, "lookup": {"min_n": 2, "max_n": 4}}, "eagle3") == "eagle3 + lookup"
    assert label({"tree": None, "lookup": {"min_n": 2, "max_n": 4, "drafter_k": 3}}, "eagle3") == \
        "eagle3 + lookup (drafter k=3)"  # the run's k is lookup's depth
    assert label({"tree": "cpu_12", "tree_nodes": 12}, "medusa") == "medusa tree cpu_12 (12 nodes)"
    assert label(None, "none") == "none"


def test_per_turn_table():
    """A run with dataset.turns=2 gets a per-turn table, turns in numeric order; runs without one get none."""
    from specbench.report.report import Row, category_table

    def entry(tau, speedup):
        return {"acceptance": {"mean_acceptance_length": tau}, "speedup": speedup}

    doc = {"config": {"method": {"name": "ngram"}, "k": 3},
           "per_turn": {"10": entry(1.5, 1.0), "2": entry(2.25, 1.5), "1": entry(2.0, 1.25)}}
    text = category_table([Row(Path("a/results.json"), doc)], "per_turn", "turn ")
    assert text.splitlines()[0] == "| method | k | turn 1 τ / speedup | turn 2 τ / speedup | turn 10 τ / speedup |"
    assert text.splitlines()[2] == "| ngram | 3 | 2.00 / 1.25 | 2.25 / 1.50 | 1.50 / 1.00 |"
    assert category_table([Row(Path("a/results.json"), {"config": doc["config"]})], "per_turn", "turn ") == ""
