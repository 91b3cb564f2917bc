"""`python -m specbench.report <run or multirun dir> [--out DIR]`: results.json files -> Markdown + PNG plots.

Table (method x k): mean acceptance length, acceptance rate, tokens/s, speedup, TPOT p50/p99, outputs match,
and the speedup the standard model predicts next to the measured one. The standard model (Leviathan et al.
2023, chains): with per-token acceptance rate a, k drafts and c = cost of one draft token / cost of one
target step, a step yields (1 - a^(k+1)) / (1 - a) tokens for (c k + 1) target steps of time. `pred (τ)` uses
the measured mean acceptance length instead of the i.i.d. formula; `verify/step` is the measured cost of a
verify forward in plain target steps (the model assumes 1.0), so the gap between predicted and measured
shows where the loop loses time.

A sweep folder (one with `.hydra/`) without a readable results.json is reported by name and skipped.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

SCHEMA = "specbench.results/v1"


@dataclass
class Row:
    path: Path
    doc: dict

    @property
    def method(self) -> str:
        drafter = self.doc["config"].get("drafter") or {}
        lk = drafter.get("lookup") or {}
        deeper = f" (drafter k={lk['drafter_k']})" if lk.get("drafter_k") is not None else ""
        return self._shape(drafter) + (f" + lookup{deeper}" if lk else "")

    def _shape(self, drafter: dict) -> str:
        name = self.doc["config"].get("method", {}).get("name", "?")
        tree = drafter.get("tree")
        if isinstance(tree, dict):  # EAGLE-2 dynamic tree
            return f"{name} tree {tree['topk']}x{tree['num_draft_tokens']}" if tree.get("topk") else name
        if tree:  # a static tree: a preset name or a list of paths
            shape = tree if isinstance(tree, str) else "custom"
            return f"{name} tree {shape} ({drafter.get('tree_nodes', len(tree))} nodes)"
        return name

    @property
    def k(self) -> int:
        return int(self.doc["config"].get("k", 0)) if self.method != "none" else 0


def collect(root: Path) -> tuple[list[Row], list[str]]:
    """All readable results under root, plus one problem line per unreadable or missing one."""
    rows, problems = [], []
    candidates = sorted(set(root.rglob("results.json")) | {p.parent / "results.json" for p in root.rglob(".hydra")})
    for path in candidates:
        if not path.is_file():
            problems.append(f"{path.parent}: no results.json (run failed or unfinished); skipped")
            continue
        try:
            doc = json.loads(path.read_text())
            if doc.get("schema") != SCHEMA:
                raise ValueError(f"schema {doc.get('schema')!r}, expected {SCHEMA!r}")
            for key in ("config", "totals", "acceptance", "latency"):
                doc[key]  # noqa: B018 - presence check
        except (OSError, ValueError, KeyError, TypeError) as e:
            problems.append(f"{path}: malformed ({type(e).__name__}: {e}); skipped")
            continue
        rows.append(Row(path, doc))
    rows.sort(key=lambda r: (r.method != "none", r.method, r.k, str(r.path)))
    return rows, problems


def cost_model(doc: dict) -> dict:
    """Predicted speedups from the measured acceptance and draft/target cost ratio (None when unknown)."""
    a, k = doc["acceptance"], int(doc["config"].get("k", 0))
    base, timing = doc.get("baseline") or {}, doc.get("timing") or {}
    steps, bsteps = doc["totals"]["target_steps"], base.get("target_steps")
    btime = (base.get("timing") or {}).get("step_s")
    out = {"c": None, "verify_over_step": None, "pred_iid": None, "pred_tau": None, "draft_coverage": None}
    if not (steps and bsteps and btime and timing.get("step_s") and k):
        return out
    t_target = btime / bsteps  # one plain target step
    drafted = a.get("num_draft_tokens") or steps * k  # tokens drafted (fewer than k per step: n-gram misses,
    c = timing["draft_s"] / drafted / t_target  # stop_below), so c·L = draft time per step / plain step
    L = drafted / steps
    out["c"], out["verify_over_step"] = c, timing["verify_s"] / steps / t_target
    alpha, tau = a.get("acceptance_rate"), a.get("mean_acceptance_length")
    if alpha is not None:  # i.i.d. acceptance, a draft every step
        gain = float(k + 1) if alpha >= 1.0 else (1 - alpha ** (k + 1)) / (1 - alpha)
        out["pred_iid"] = gain / (c * L + 1)
    if tau is not None:  # measured tokens per step; steps without a draft (no n-gram match) yield 1
        per_step = 1 + a["num_accepted_tokens"] / steps
        out["pred_tau"] = per_step / (c * L + 1)
        out["draft_coverage"] = a["num_drafts"] / steps
    return out


def _f(x, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def table(rows: list[Row]) -> str:
    head = ("| method | k | τ (mean acc. len) | acc. rate | drafted steps | tokens/s | speedup | pred (i.i.d.) | "
            "pred (measured) | c | verify/step | TPOT p50 ms | TPOT p99 ms | outputs match | match rate |")
    lines = [head, "|" + "|".join(["---"] * (head.count("|") - 1)) + "|"]
    for r in rows:
        d, m = r.doc, cost_model(r.doc)
        lat = d["latency"]["tpot_ms"]
        lines.append(
            f"| {r.method} | {r.k if r.method != 'none' else '-'} | {_f(d['acceptance']['mean_acceptance_length'])} | "
            f"{_f(d['acceptance']['acceptance_rate'], '.3f')} | {_f(m['draft_coverage'])} | "
            f"{d['totals']['tokens_per_s']:.1f} | "
            f"{_f(d.get('speedup'))} | {_f(m['pred_iid'])} | {_f(m['pred_tau'])} | {_f(m['c'], '.3f')} | "
            f"{_f(m['verify_over_step'])} | {_f(lat['p50'], '.1f')} | {_f(lat['p99'], '.1f')} | "
            f"{'-' if d.get('outputs_match_baseline') is None else d['outputs_match_baseline']} | "
            f"{_f(d.get('baseline_match_rate'), '.3f')} |")
    return "\n".join(lines)


def category_table(rows: list[Row], key: str = "per_category", label: str = "") -> str:
    """τ / speedup per category (key "per_turn": per user turn, columns named `label` + the turn)."""
    cats = sorted({c for r in rows for c in r.doc.get(key, {})}, key=lambda c: (int(c) if c.isdigit() else 0, c))
    if not cats or cats == ["default"]:
        return ""
    lines = ["| method | k | " + " | ".join(f"{label}{c} τ / speedup" for c in cats) + " |",
             "|" + "|".join(["---"] * (len(cats) + 2)) + "|"]
    for r in rows:
        if r.method == "none":
            continue
        pc = r.doc.get(key, {})
        cells = []
        for c in cats:
            e = pc.get(c)
            cells.append("-" if e is None else f"{_f(e['acceptance']['mean_acceptance_length'])} / {_f(e.get('speedup'))}")
        lines.append(f"| {r.method} | {r.k} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plots(rows: list[Row], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    made: list[Path] = []

    def save(fig, ax, title: str, name: str) -> None:
        ax.set_title(title)
        fig.tight_layout()
        made.append(out / name)
        fig.savefig(made[-1], dpi=120)
        plt.close(fig)

    spec = [r for r in rows if r.method != "none"]
    methods = sorted({r.method for r in spec})
    if spec:
        fig, ax = plt.subplots(figsize=(5, 3.5))
        for m in methods:
            pts = sorted((r.k, r.doc.get("speedup")) for r in spec if r.method == m and r.doc.get("speedup") is not None)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=m)
        ax.axhline(1.0, color="gray", lw=0.8, ls="--")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("k (draft tokens per step)")
        ax.set_ylabel("speedup vs target-only")
        ax.legend()
        save(fig, ax, "speedup vs k", "speedup_vs_k.png")

        fig, ax = plt.subplots(figsize=(5, 3.5))
        curves = [r for r in spec if r.doc["acceptance"]["per_position"]]
        for r in curves:
            pp = r.doc["acceptance"]["per_position"]
            ax.plot(range(1, len(pp) + 1), pp, marker=".", label=f"{r.method} k={r.k}")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("draft position")
        ax.set_ylabel("fraction of drafts accepted")
        ax.set_ylim(0, 1)
        if curves:
            ax.legend(fontsize=7)
        save(fig, ax, "per-position acceptance", "per_position.png")

        cats = sorted({c for r in spec for c in r.doc.get("per_category", {})})
        if len(cats) > 1:
            fig, ax = plt.subplots(figsize=(max(5, len(cats)), 3.5))
            width = 0.8 / len(spec)
            for i, r in enumerate(spec):
                pc = r.doc.get("per_category", {})
                vals = [(pc.get(c) or {}).get("acceptance", {}).get("mean_acceptance_length") or 0 for c in cats]
                ax.bar([j + i * width for j in range(len(cats))], vals, width, label=f"{r.method} k={r.k}")
            ax.set_xticks([j + 0.4 - width / 2 for j in range(len(cats))], cats, rotation=30, ha="right")
            ax.set_ylabel("mean acceptance length τ")
            ax.legend(fontsize=7)
            save(fig, ax, "acceptance per category", "per_category.png")
    return made


def render(root: Path, out: Path | None = None, with_plots: bool = True) -> tuple[str, list[str]]:
    rows, problems = collect(root)
    out = out or root
    out.mkdir(parents=True, exist_ok=True)
    md = [f"# specbench report: {root}", ""]
    if rows:
        c = rows[0].doc["config"]
        md += [f"Target {c.get('target')} ({c.get('dtype')}, {c.get('device')}); dataset {c.get('dataset', {}).get('name')}"
               f"; temperature {c.get('temperature')}; batch {c.get('batch_size')}; {len(rows)} runs.", "",
               table(rows), ""]
        cat = category_table(rows)
        if cat:
            md += ["Per category (τ / speedup, request-level rates):", "", cat, ""]
        turns = category_table(rows, "per_turn", "turn ")
        if turns:
            md += ["Per user turn (dataset.turns; τ / speedup, request-level rates):", "", turns, ""]
        md += ["τ = 1 + accepted / drafts (steps with a draft). drafted steps = fraction of target steps that had "
               "a draft. c = draft time per drafted token / plain target step; verify/step = verify forward "
               "(+ acceptance, commits) / plain target step. pred = tokens per step / (c·L + 1), L = tokens "
               "drafted per step (k unless drafts stop short): i.i.d. uses "
               "(1 − α^(k+1)) / (1 − α) with α = acceptance rate and a draft every step; measured uses "
               "1 + accepted / steps. Measured below predicted = verify costing more than a plain step, "
               "plus loop overhead.", ""]
        if with_plots:
            md += [f"![{p.stem}]({p.name})" for p in plots(rows, out)]
    else:
        md.append("No readable results.json found.")
    if problems:
        md += ["", "Skipped:", *[f"- {p}" for p in problems]]
    text = "\n".join(md) + "\n"
    (out / "report.md").write_text(text)
    return text, problems


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m specbench.report", description=__doc__.splitlines()[0])
    ap.add_argument("dir", help="a run dir or a multirun dir holding results.json files")
    ap.add_argument("--out", default=None, help="where report.md and the PNGs go (default: the dir itself)")
    ap.add_argument("--no-plots", action="store_true")
    args = ap.parse_args()
    root = Path(args.dir)
    if not root.is_dir():
        print(f"error: {args.dir!r} is not a directory (give a run or multirun folder)", file=sys.stderr)
        sys.exit(2)
    text, problems = render(root, Path(args.out) if args.out else None, not args.no_plots)
    for p in problems:
        print(f"warning: {p}", file=sys.stderr)
    print(text)
