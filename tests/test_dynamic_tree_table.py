"""experiments/dynamic_tree.py: speedups against the same round's target-only run and categories above n-gram,
on hand-made results."""

import json

from spec_helpers import experiment_script

dt = experiment_script("dynamic_tree")


def _result(path, tps, tau=None, cats=None, steps=100, tokens=200, lookup=None):
    path.mkdir(parents=True)
    acc = {"mean_acceptance_length": tau, "num_draft_tokens": 400, "per_position": [0.5, 0.25]}
    doc = {"acceptance": acc, "totals": {"target_steps": steps, "new_tokens": tokens, "tokens_per_s": tps},
           "config": {"drafter": {"lookup": lookup} if lookup else {}},
           "timing": {"draft_s": 1.0, "verify_s": 3.0},
           "per_category": {c: {"acceptance": {"mean_acceptance_length": t}} for c, t in (cats or {}).items()}}
    (path / "results.json").write_text(json.dumps(doc))


def test_rounds_and_categories_by_hand(tmp_path, capsys, monkeypatch):
    none = {"coding": None, "math": None}
    for r, base, tree in (("r1", 20.0, 30.0), ("r2", 25.0, 30.0), ("r3", 24.0, 36.0)):
        _result(tmp_path / f"{r}_0_none", base, cats=none)
        _result(tmp_path / f"{r}_1_tree", tree, 2.5, {"coding": 3.0, "math": 2.0})
    _result(tmp_path / "r1_2_ngram_k4", 22.0, 2.6, {"coding": 2.0, "math": 2.5})
    monkeypatch.setattr("sys.argv", ["dynamic_tree.py", str(tmp_path)])
    dt.main()
    out = capsys.readouterr().out
    tree = next(line for line in out.splitlines() if line.startswith("| tree |") and "×" in line)
    # speedups 30/20 = 1.5, 30/25 = 1.2, 36/24 = 1.5 -> median 1.5; tokens per target step 200/100 = 2
    assert "1.50× / 1.20× / 1.50×" in tree and "**1.50×**" in tree and "| 2.00 |" in tree
    row = next(line for line in out.splitlines() if line.startswith("| tree |") and "/ 2" in line)
    assert "| **3.00** | 2.00 |" in row and "1 / 2" in row and "overall" not in row  # coding above, math not; 2.5 < 2.6


def test_two_folders_and_grafts_by_hand(tmp_path, capsys, monkeypatch):
    _result(tmp_path / "a" / "r1_1_tree", 30.0, 2.5, {"coding": 3.0, "math": 2.0})
    stats = {"min_n": 2, "max_n": 4, "row_steps": 200, "matched": 50, "grafted": 40, "won": 10, "accepted_grafted": 25}
    _result(tmp_path / "b" / "r1_1_tree_lookup", 31.0, 2.7, {"coding": 3.0, "math": 2.7}, lookup=stats)
    _result(tmp_path / "b" / "r1_2_ngram_k4", 22.0, 2.6, {"coding": 2.0, "math": 2.5})
    monkeypatch.setattr("sys.argv", ["dynamic_tree.py", str(tmp_path / "a"), str(tmp_path / "b")])
    dt.main()
    out = capsys.readouterr().out.splitlines()
    row = next(line for line in out if line.startswith("| tree_lookup |") and "/ 2" in line)
    assert "| **3.00** | **2.70** | 2.700 | 2 / 2 (overall too) |" in row  # both categories and overall above 2.6
    assert "| tree |" in "\n".join(out)  # the first folder's run is read too
    # 50 / 200 = 25 %, 40 / 200 = 20 %, 10 / 200 = 5 %, 25 / 200 = 0.125
    assert "| tree_lookup | 25% | 20% | 5% | 0.125 |" in out
