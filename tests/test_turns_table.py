"""experiments/turns.py: per-turn τ and speedups against the same round's target-only run, on hand-made results."""

import json

import pytest

from spec_helpers import experiment_script

tt = experiment_script("turns")


def _result(path, tps, turn_tps, tau=None, turn_tau=(None, None), cats=None):
    path.mkdir(parents=True)
    per_turn = {str(i + 1): {"tokens_per_s": s, "requests": 16, "acceptance": {"mean_acceptance_length": t,
                                                                              "per_position": [0.5, 0.25]}}
                for i, (s, t) in enumerate(zip(turn_tps, turn_tau))}
    for turn, by_cat in (cats or {}).items():  # {"2": {"math": 3.5}}: τ by category within a turn
        per_turn[turn]["per_category"] = {c: {"acceptance": {"mean_acceptance_length": v}} for c, v in by_cat.items()}
    doc = {"acceptance": {"mean_acceptance_length": tau}, "totals": {"tokens_per_s": tps}, "per_turn": per_turn}
    (path / "results.json").write_text(json.dumps(doc))


def test_turn_speedups_by_hand(tmp_path, capsys, monkeypatch):
    _result(tmp_path / "r1_0_none", 20.0, (20.0, 25.0))
    _result(tmp_path / "r1_1_chain", 30.0, (32.0, 30.0), 2.5, (2.25, 2.75))
    _result(tmp_path / "r2_0_none", 24.0, (24.0, 20.0))
    _result(tmp_path / "r2_1_chain", 30.0, (36.0, 30.0), 2.5, (2.25, 2.75))
    monkeypatch.setattr("sys.argv", ["turns.py", str(tmp_path)])
    tt.main()
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("| chain |"))
    # turn 1: 32/20 = 1.6 and 36/24 = 1.5 -> median 1.55; turn 2: 30/25 = 1.2, 30/20 = 1.5 -> 1.35;
    # both: 30/20 = 1.5, 30/24 = 1.25 -> 1.375 (printed 1.38)
    assert row == ("| chain | 2.250 | 2.750 | 2.500 | 0.50 / 0.25 | 0.50 / 0.25 | 1.55× | 1.35× | 1.38× |")
    assert "requests per turn: 16 / 16" in out and "r2: 24.0 / 20.0" in out
    assert "by category" not in out  # results.json without per-turn categories: no such table


def test_categories_per_turn(tmp_path, capsys, monkeypatch):
    _result(tmp_path / "r1_0_none", 20.0, (20.0, 25.0))
    _result(tmp_path / "r1_1_chain", 30.0, (32.0, 30.0), 2.5, (2.25, 2.75),
            {"1": {"math": 2.0, "coding": 2.5}, "2": {"math": 3.25, "coding": None}})
    _result(tmp_path / "r1_2_ngram", 30.0, (32.0, 30.0), 2.5, (2.25, 2.75), {"2": {"math": 4.0}})
    monkeypatch.setattr("sys.argv", ["turns.py", str(tmp_path)])
    tt.main()
    out = capsys.readouterr().out.split("τ by category, turn ")
    assert len(out) == 3
    assert "| setting | coding | math |" in out[1] and "| chain | 2.50 | 2.00 |" in out[1]
    assert "| ngram | - | - |" in out[1]
    assert "| chain | - | 3.25 |" in out[2] and "| ngram | - | 4.00 |" in out[2]  # coding: a null τ, then absent


def test_needs_per_turn(tmp_path, monkeypatch):
    (tmp_path / "r1_0_none").mkdir()
    (tmp_path / "r1_0_none" / "results.json").write_text(json.dumps({"totals": {"tokens_per_s": 1.0},
                                                                   "acceptance": {}}))
    monkeypatch.setattr("sys.argv", ["turns.py", str(tmp_path)])
    with pytest.raises(SystemExit, match="no per_turn block"):
        tt.main()
