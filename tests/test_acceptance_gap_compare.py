"""experiments/acceptance_gap.py --compare: the paired table over the same text, and --drop (sequences left out)."""

import json

import pytest
from spec_helpers import experiment_script


def _walk(path, per_seq):
    path.write_text(json.dumps({"per_sequence_steps_accepted": per_seq, "walk_tau": 2.0,
                                "walk_per_position": [0.5, 0.25, 0.1]}))
    return str(path)


def test_compare_and_drop(tmp_path, capsys):
    # (steps, accepted) over the same 20 / 20 / 16 tokens; per-sequence τ - 1 = accepted / steps
    ref = _walk(tmp_path / "a.json", [[10, 10], [20, 0], [8, 8]])  # 1.0, 0.0, 1.0
    new = _walk(tmp_path / "b.json", [[8, 12], [15, 5], [4, 12]])  # 1.5, 0.333, 3.0
    gap = experiment_script("acceptance_gap")
    gap.compare([ref, new])  # differences +0.5, +0.333, +2.0: mean 0.9444
    assert "+0.9444" in capsys.readouterr().out
    gap.compare([ref, new], "2")  # +0.5 and +0.333: mean 0.4167, sd 0.1179, se 0.0833
    # token-weighted: 17 / 23 - 10 / 30 = +0.4058; z = 2 (12 - 8 * 17/23) / 23 - 2 (10 - 10/3) / 30 = +0.084857 and
    # its negative for the other sequence: SE sqrt(2 * 0.0072007 / 2) = 0.0849
    out = capsys.readouterr().out
    assert "without sequences 2" in out and "+0.4167 ± 0.0833 | 2 / 0 of 2 | +0.4058 ± 0.0849 |" in out
    for bad in ("3", "x", "-1"):
        with pytest.raises(SystemExit) as e:
            gap.compare([ref, new], bad)
        assert e.value.code == 2 and f"--drop={bad}" in capsys.readouterr().err
    other = _walk(tmp_path / "c.json", [[10, 10], [20, 0], [8, 3]])  # 11 tokens, not the same text
    with pytest.raises(SystemExit) as e:
        gap.compare([ref, other])
    assert e.value.code == 2 and "different text" in capsys.readouterr().err
    gap.compare([ref, other], "2")  # without the sequence that differs, the rest pair
    assert "+0.0000 ± 0.0000 | 0 / 0 of 2" in capsys.readouterr().out
