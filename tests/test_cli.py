"""`python -m specbench`: results.json per the contract, config composition, bad input -> one line, exit 2."""

from __future__ import annotations

import json
import re
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from conftest import write_jsonl
from specbench.cli import CONF_DIR, GROUPS, group_options
from specbench.config import register
from specbench.errors import UserError

CONTRACT = {"schema", "config", "totals", "acceptance", "latency", "baseline", "speedup", "outputs_match_baseline",
            "baseline_match_rate", "requests"}


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, "-m", "specbench", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def _compose(overrides: list[str]):
    register()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=overrides)


def test_run_writes_results_contract(tmp_path, tiny_dir):
    data = write_jsonl(tmp_path / "q.jsonl", [
        {"question_id": 81, "category": "writing", "turns": ["the quick brown fox", "second turn ignored"]},
        {"question_id": 82, "category": "math", "turns": ["one two three"]},
        {"question_id": 83, "category": "math", "turns": ["hello world"]},
    ])
    out = tmp_path / "run"
    p = cli(f"model.path={tiny_dir}", "dataset=jsonl", f"dataset.path={data}", "dataset.limit=2",
            "max_new_tokens=6", "batch_size=2", "progress=false", f"hydra.run.dir={out}", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    doc = json.loads((out / "results.json").read_text())
    assert CONTRACT <= set(doc) and doc["schema"] == "specbench.results/v1"
    c = doc["config"]
    for key in ("method", "k", "target", "drafter", "dataset", "temperature", "batch_size", "seed", "device",
                "dtype", "tp", "pp", "async"):
        assert key in c, key
    assert c["method"]["name"] == "none" and c["dtype"] in ("float32", "bfloat16") and c["device"] == "cpu"
    assert isinstance(c["cpu"]["flags"], list) and c["cpu"]["linear"]["mode"] == "auto"
    assert c["acceptance_rule"] == {"rule": None, "lossless": True}
    assert [r["id"] for r in doc["requests"]] == ["81", "82"]
    assert [r["category"] for r in doc["requests"]] == ["writing", "math"]
    assert doc["requests"][0]["prompt"] == "the quick brown fox"
    assert all(r["new_tokens"] == 6 and r["first_divergence"] is None for r in doc["requests"])
    t = doc["totals"]
    assert t["new_tokens"] == 12 and t["target_steps"] == 5 and t["tokens_per_s"] > 0
    a = doc["acceptance"]
    assert a["num_drafts"] == 0 and a["num_accepted_tokens"] == 0 and a["mean_acceptance_length"] is None
    assert doc["baseline"] is None and doc["speedup"] is None and doc["outputs_match_baseline"] is None
    for k in ("ttft_ms", "tpot_ms", "itl_ms"):
        assert set(doc["latency"][k]) == {"mean", "p50", "p99"} and doc["latency"][k]["p50"] > 0
    assert "tokens/s" in p.stdout and "specbench summary" in p.stdout


@pytest.mark.parametrize(
    "args, needle",
    [
        (["method=nosuch"], "method='nosuch' is not a known method; valid: draft_model, eagle, eagle3, medusa, mlp_speculator, ngram, none"),
        (["model.path=/no/such/model"], "model path '/no/such/model' does not exist"),
        (["batch_size=0"], "batch_size=0"),
        (["batch_size=abc"], None),  # Hydra's own type check: still exit 2
        (["method=ngram", "acceptance=sampling", "temperature=0"], "acceptance=sampling needs temperature > 0"),
        (["method=ngram", "method.acceptance=sampling"], "acceptance is a top-level setting: acceptance=sampling"),
        (["method=draft_model", "method.lookup.max_n=4"], "method.lookup.max_n=4: method=draft_model cannot take "
         "tokens it did not draft as a chain"),
        (["method=eagle3", "method.lookup.max_n=2", "method.lookup.min_n=3"], "method.lookup.min_n=3, max_n=2"),
        (["method=eagle3", "method.lookup.drafter_k=2"], "method.lookup.drafter_k=2 needs prompt lookup on"),
        (["method=eagle3", "k=3", "method.lookup.max_n=4", "method.lookup.drafter_k=4"],
         "method.lookup.drafter_k=4 > k=3: the drafter's own depth is at most k"),
        (["method=eagle3", "k=8", "method.drafter.max_draft_len=4", "method.lookup.max_n=4",
          "method.lookup.drafter_k=5"], "method.lookup.drafter_k=5: method=eagle3 supports a depth <= 4"),
        (["method=eagle3", "method.lookup.max_n=4", "method.lookup.drafter_k=0"], "method.lookup.drafter_k=0: an "
         "integer >= 1"),
        (["dataset.turns=0"], "dataset.turns=0: must be >= 1 (1 = first turns only)"),
        (["dataset.turns=2"], "dataset.turns=2: no record of dataset=builtin has more than 1 user turn(s)"),
    ],
)
def test_bad_input_exits_2(tmp_path, args, needle):
    p = cli(*args, "progress=false", f"hydra.run.dir={tmp_path / 'r'}", cwd=tmp_path)
    assert p.returncode == 2, p.stderr
    if needle:
        lines = [ln for ln in p.stderr.splitlines() if ln.startswith("error:")]
        assert len(lines) == 1 and needle in lines[0], p.stderr
        assert "Traceback" not in p.stderr


def test_async_synthetic_run_records(tmp_path, tiny_dir, monkeypatch):
    """parallel.async=true with acceptance=synthetic: results.json says async, the rule is lossy with its rates,
    and records the host time overlapped and left on the critical path. Rates 1 / 1 / 0 are deterministic: the
    target drafting for itself keeps exactly 2 of 3 drafts every step, so the output is still target-only's."""
    from specbench.run import run

    cfg = _compose([f"model.path={tiny_dir}", "method=draft_model", f"method.drafter.path={tiny_dir}", "k=3",
                    "max_new_tokens=13", "batch_size=2", "dtype=float32", "progress=false", "dataset.limit=3",
                    "parallel.async=true", "acceptance=synthetic", "synthetic.rates=[1.0,1.0,0.0]"])
    monkeypatch.chdir(tmp_path)
    doc = run(cfg)
    assert doc["config"]["async"] is True
    assert doc["config"]["acceptance_rule"] == {"rule": "synthetic", "lossless": False, "rates": [1.0, 1.0, 0.0]}
    assert doc["acceptance"]["per_position"] == [1.0, 1.0, 0.0]
    assert [r["accepted_per_step"] for r in doc["requests"]] == [[2, 2, 2, 2]] * 3  # 1 + 4 steps of 3 = 13
    assert doc["outputs_match_baseline"] is True
    t = doc["timing"]
    assert t["host_overlap_s"] + t["host_critical_s"] == pytest.approx(t["host_s"]) and t["host_s"] > 0


@pytest.mark.parametrize(
    "overrides, needle",
    [
        (["dataset=jsonl", "dataset.path=/no/such.jsonl"], "no such file"),
        (["temperature=-1"], "temperature=-1"),
        (["k=0"], "k=0"),
        (["top_p=0"], "top_p=0"),
        (["dtype=int8"], "dtype='int8'"),
        (["device=tpu"], "device='tpu'"),
        (["parallel.tp=2"], "parallel.tp=2"),
        (["dataset.limit=0"], "dataset.limit=0"),
    ],
)
def test_bad_values_raise_user_errors(overrides, needle, tiny_dir):
    from specbench.run import run

    cfg = _compose([f"model.path={tiny_dir}", "progress=false", *overrides])
    with pytest.raises(UserError, match=needle.replace("(", r"\(").replace("[", r"\[")):
        run(cfg)


def test_bad_jsonl_records(tmp_path):
    from specbench.data.prompts import jsonl_prompts

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question_id": 1, "turns": ["ok"]}\n{not json}\n')
    with pytest.raises(UserError, match=r"bad.jsonl:2: not valid JSON"):
        jsonl_prompts(str(bad))
    bad.write_text('{"question_id": 1, "text": "no turns"}\n')
    with pytest.raises(UserError, match=r"bad.jsonl:1: record has no 'turns'"):
        jsonl_prompts(str(bad))
    bad.write_text("\n")
    with pytest.raises(UserError, match="bad.jsonl: the file is empty"):
        jsonl_prompts(str(bad))


def test_prompt_longer_than_context_via_run(tmp_path):
    from conftest import make_hf_model
    from specbench.run import run

    small = tmp_path / "ctx32"
    make_hf_model(small, max_pos=32)
    data = write_jsonl(tmp_path / "q.jsonl", [{"question_id": 1, "turns": ["the quick brown fox " * 20]}])
    cfg = _compose([f"model.path={small}", "dataset=jsonl", f"dataset.path={data}", "progress=false"])
    with pytest.raises(UserError, match="context is 32"):
        run(cfg)


def test_mt_bench_first_turns():
    from specbench.data.prompts import load_prompts

    path = Path(__file__).resolve().parents[2] / "shared" / "data" / "mt_bench" / "question.jsonl"
    if not path.is_file():
        pytest.skip("shared/data is not beside this checkout")
    ps = load_prompts("jsonl", str(path), limit=12)
    assert len(ps) == 12 and ps[0].id == "81" and ps[0].category == "writing"
    assert ps[0].prompt.startswith("Compose an engaging travel blog post about a recent trip to Hawaii")


def test_every_group_option_composes():
    for group in (g for g in GROUPS if g != "experiment"):  # experiments: test_experiments_and_launcher_compose
        for option in group_options(group):
            extra = {"dataset": {"jsonl": ["dataset.path=x.jsonl"], "hf": ["dataset.hf_name=x"]}}.get(group, {})
            cfg = _compose([f"{group}={option}", *extra.get(option, [])])
            if group != "model":  # model.name is a display name (null = derived from the path)
                assert cfg[group].name == option
    cfg = _compose([])
    assert cfg.method.name == "none" and cfg.model.path is None and cfg.dataset.name == "builtin"
    assert cfg.dtype == "auto" and cfg.batch_size == 1


def test_builtin_prompt_set():
    from specbench.data.prompts import builtin_prompts

    ps = builtin_prompts()
    cats = {p.category for p in ps}
    assert len(ps) == 16 and len({p.id for p in ps}) == 16
    assert {"chat", "code", "math", "summarization", "translation"} <= cats


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_speculative_run_with_baseline(tmp_path, tiny_dir, method, monkeypatch):
    from specbench.run import run

    extra = [f"method.drafter.path={tiny_dir}"] if method == "draft_model" else []
    cfg = _compose([f"model.path={tiny_dir}", f"method={method}", "k=3", "max_new_tokens=12", "batch_size=2",
                    "dtype=float32", "progress=false", "dataset.limit=3", *extra])
    monkeypatch.chdir(tmp_path)  # outside Hydra results.json goes to the working directory
    doc = run(cfg)
    a, reqs = doc["acceptance"], doc["requests"]
    assert doc["outputs_match_baseline"] is True and doc["baseline_match_rate"] == 1.0
    assert doc["totals"]["new_tokens"] == doc["baseline"]["new_tokens"] == 36
    # same tokens on both sides: the speedup is the ratio of the two wall times
    assert doc["speedup"] == pytest.approx(doc["baseline"]["wall_s"] / doc["totals"]["wall_s"])
    assert len(a["per_position"]) == (3 if a["num_drafts"] else 0)
    assert doc["config"]["acceptance_rule"] == {"rule": "greedy", "lossless": True}
    if method == "draft_model":
        # the target drafting for itself accepts every draft: 1 token from the prefill, then 3 steps of 4
        # tokens (3 drafts + bonus), the last one trimmed to the 12-token budget
        assert [r["accepted_per_step"] for r in reqs] == [[3, 3, 3]] * 3
        assert a["num_drafts"] == 9 and a["num_draft_tokens"] == 27 and a["num_accepted_tokens"] == 27
        assert a["mean_acceptance_length"] == 4.0 and a["per_position"] == [1.0, 1.0, 1.0]
        assert a["histogram"] == [0, 0, 0, 9] and doc["totals"]["target_steps"] == 6  # 2 batches of 3 steps
    else:
        assert a["num_accepted_tokens"] == sum(sum(r["accepted_per_step"]) for r in reqs)
    assert doc["config"]["drafter"]["name"] == method
    assert all(r["first_divergence"] is None for r in reqs)
    assert (tmp_path / "results.json").is_file()


@pytest.mark.parametrize(
    "overrides, needle",
    [
        (["method=ngram", "k=17"], "k=17: method=ngram supports k <= 16"),
        # the shipped SmolLM2 draft (compact: it takes the target's tables) on another target
        (["method=draft_model"], "specbench_target_tables needs the target's vocabulary and width"),
        (["method=eagle"], "method=eagle (EAGLE-1) needs method.drafter.path"),
        (["method=eagle3", "method.tree.topk=0"], "method.tree.topk=0: must be >= 1"),
        (["method=medusa", "method.drafter.path=/nonexistent/head"], "Medusa head '/nonexistent/head' does not exist"),
        (["method=medusa", "method.tree=huge"], "method.tree='huge'; valid presets"),
        (["method=eagle3", "method.drafter.path=/nonexistent/head"], "EAGLE head '/nonexistent/head' does not exist"),
        (["method=ngram", "acceptance=bogus"], "acceptance='bogus'; valid: auto, greedy, sampling, typical, synthetic"),
        (["method=ngram", "acceptance=typical"], "acceptance=typical needs temperature > 0"),
        (["method=ngram", "acceptance=sampling"], "acceptance=sampling needs temperature > 0"),
        (["method=ngram", "acceptance=greedy", "temperature=0.5"], "acceptance=greedy with temperature=0.5"),
        (["parallel.async=maybe"], "parallel.async='maybe'; valid: true, false"),
        (["method=ngram", "acceptance=synthetic"], "synthetic.rates=None: a list of per-position acceptance rates"),
        (["method=ngram", "acceptance=synthetic", "synthetic.rates=[0.5,0.6,0.2]"], "non-increasing"),
        (["method=ngram", "acceptance=synthetic", "synthetic.rates=[0.9,0.5]"], "2 entries, k=3 needs at least 3"),
        (["method=ngram", "acceptance=synthetic", "synthetic.rates=[1.5,0.5,0.1]"], "each in [0, 1]"),
        (["method=ngram", "method.drafter.min_n=3", "method.drafter.max_n=2"], "min_n=3, max_n=2"),
    ],
)
def test_bad_method_settings(overrides, needle, tiny_dir):
    from specbench.run import run

    cfg = _compose([f"model.path={tiny_dir}", "progress=false", *overrides])
    with pytest.raises(UserError, match=re.escape(needle)):
        run(cfg)


def test_draft_model_with_another_vocabulary(tmp_path, tiny_dir):
    from conftest import make_hf_model
    from specbench.run import run

    other = tmp_path / "v8"
    make_hf_model(other, vocab=8)
    cfg = _compose([f"model.path={tiny_dir}", "method=draft_model", f"method.drafter.path={other}",
                    "progress=false", "dataset.limit=1"])
    with pytest.raises(UserError, match="vocab_size 8 != target's 384"):
        run(cfg)


def test_experiments_and_launcher_compose():
    from specbench.cli import group_options

    for exp in group_options("experiment"):
        cfg = _compose([f"experiment={exp}"])
        assert cfg.method.name in group_options("method")
    cfg = _compose(["experiment=mt_bench_ngram"])
    assert cfg.method.name == "ngram" and cfg.dataset.name == "jsonl" and cfg.dataset.per_category == 2
    register()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        hc = compose("config", overrides=["hydra/launcher=specbench_slurm", "experiment=mt_bench_ngram"],
                     return_hydra_config=True)
    assert hc.hydra.launcher.gpus_per_node == 1 and "submitit" in hc.hydra.launcher._target_
    assert str(hc.hydra.sweeper.params.k) == "2,3,4,5"


def test_per_category_selection():
    from specbench.data.prompts import load_prompts

    path = Path(__file__).resolve().parents[2] / "shared" / "data" / "mt_bench" / "question.jsonl"
    if not path.is_file():
        pytest.skip("shared/data is not beside this checkout")
    ps = load_prompts("jsonl", str(path), per_category=2)
    cats = [p.category for p in ps]
    assert len(ps) == 16 and all(cats.count(c) == 2 for c in set(cats)) and len(set(cats)) == 8


def test_hf_dataset_by_name(tmp_path, monkeypatch):
    """dataset=hf goes through datasets.load_dataset; a local dataset folder stands in for a hub id."""
    pytest.importorskip("datasets")
    from specbench.data.prompts import load_prompts

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    folder = tmp_path / "my_prompts"
    folder.mkdir()
    write_jsonl(folder / "train.jsonl", [{"question_id": 7, "category": "math", "turns": ["one two three"]},
                                         {"id": "b", "instruction": "Say hi", "input": "politely"}])
    ps = load_prompts("hf", name=str(folder), split="train")
    assert [(p.id, p.category, p.prompt) for p in ps] == [("7", "math", "one two three"),
                                                          ("b", None, "Say hi\n\npolitely")]
    with pytest.raises(UserError, match="cannot load"):
        load_prompts("hf", name=str(tmp_path / "missing"), split="train")
