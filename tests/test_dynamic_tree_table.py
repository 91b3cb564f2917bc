"""experiments/dynamic_tree.py: speedups against the same round's target-only run and categories above n-gram,
on hand-made results."""

import json

from spec_helpers import experiment_script

dt = experiment_script("dynamic_tree")


def _result(path, tps, tau=None, cats=None, steps=100, tokens=200):
    path.mkdir(parents=True)
    acc = {"mean_acceptance_length": tau, "num_draft_tokens": 400, "per_position": [0.5, 0.25]}
    doc = {"acceptance": acc, "totals": {"target_steps": steps, "new_tokens": tokens, "tokens_per_s": tps},
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
