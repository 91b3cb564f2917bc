"""The package's layering reads top-down: each layer imports only from itself and the layers below it.

    cli / run / train / report    compose, build, run, write results
    metrics                       counters, results.json, sinks
    engine                        the decode loop
    parallel                      TP / PP transforms, the cross-rank messages of one step
    drafters, verify, data        strategies, acceptance rules, prompt sets
    models                        target and drafter modules, checkpoint formats, kernels
    core (+ errors, log, config)  DraftTree, Verdict, BatchState, requests, sampling, CPU facts
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "specbench"
LEVEL = {"core": 0, "errors": 0, "log": 0, "config": 0, "models": 1, "drafters": 2, "verify": 2, "data": 2,
         "parallel": 3, "engine": 4, "metrics": 5, "run": 6, "train": 6, "report": 6, "cli": 7, "__main__": 8,
         "__init__": 0}


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("specbench."):
            out.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            out |= {a.name.split(".")[1] for a in node.names if a.name.startswith("specbench.")}
    return out


def test_every_import_points_down():
    bad = []
    for f in sorted(PKG.rglob("*.py")):
        rel = f.relative_to(PKG)
        part = rel.parts[0].removesuffix(".py")
        if part not in LEVEL:
            bad.append(f"{rel}: no layer assigned (add it to LEVEL)")
            continue
        for dep in _imports(f):
            if dep != part and LEVEL.get(dep, 99) > LEVEL[part]:
                bad.append(f"{rel} (layer {part}) imports specbench.{dep}, a layer above it")
    assert bad == []
