"""A readable summary of a results document for the terminal."""

from __future__ import annotations


def _f(x, fmt: str = "{:.2f}") -> str:
    return "-" if x is None else fmt.format(x)


def format_summary(doc: dict) -> str:
    c, t, a, lat = doc["config"], doc["totals"], doc["acceptance"], doc["latency"]
    rows = [
        ("method", f"{c.get('method', {}).get('name', '?')}  (k={c.get('k')})"),
        ("target", f"{c.get('model', {}).get('name', '?')}  {c.get('dtype')} on {c.get('device')}"),
        *([("parallel", f"tp={c.get('tp')} pp={c.get('pp')} draft_tp={c.get('draft_tp')} "
                        f"(world {c.get('world_size')})")] if (c.get("world_size") or 1) > 1 else []),
        ("requests / batch", f"{len(doc['requests'])} / {c.get('batch_size')}"),
        ("new tokens", str(t["new_tokens"])),
        ("target steps", str(t["target_steps"])),
        ("wall", f"{t['wall_s']:.2f} s"),
        ("tokens/s", f"{t['tokens_per_s']:.1f}"),
        ("TTFT p50 / p99", f"{_f(lat['ttft_ms']['p50'], '{:.1f}')} / {_f(lat['ttft_ms']['p99'], '{:.1f}')} ms"),
        ("TPOT p50 / p99", f"{_f(lat['tpot_ms']['p50'], '{:.1f}')} / {_f(lat['tpot_ms']['p99'], '{:.1f}')} ms"),
        ("ITL p50", f"{_f(lat['itl_ms']['p50'], '{:.1f}')} ms"),
    ]
    if a["num_drafts"]:
        rows += [
            ("mean acceptance len", _f(a["mean_acceptance_length"])),
            ("acceptance rate", _f(a["acceptance_rate"], "{:.3f}")),
            ("per position", " ".join(f"{p:.2f}" for p in a["per_position"])),
        ]
    rule = c.get("acceptance_rule") or {}
    if rule.get("lossless") is False:
        rows.append(("acceptance rule", f"{rule.get('rule')} (NOT lossless"
                                        + (f"; rates {rule['rates']})" if rule.get("rates") else ")")))
    tm = doc.get("timing") or {}
    if c.get("async") or tm.get("host_s"):
        total = tm.get("host_s") or 0.0
        crit = tm.get("host_critical_s") or 0.0
        rows.append(("host bookkeeping", f"{total * 1e3:.0f} ms, {crit * 1e3:.0f} ms on the critical path "
                                         f"({'async' if c.get('async') else 'sync'})"))
    aux = (c.get("drafter") or {}).get("aux_layers")
    if aux:
        rows.append(("aux layers", f"{aux['layers']} ({aux['convention']}, from {aux['source']})"))
    if doc.get("baseline"):
        rows += [
            ("baseline tokens/s", f"{doc['baseline']['tokens_per_s']:.1f}"),
            ("speedup", _f(doc["speedup"], "{:.2f}x")),
            ("outputs match baseline", str(doc["outputs_match_baseline"])),
            ("baseline match rate", _f(doc["baseline_match_rate"], "{:.3f}")),
        ]
    w = max(len(k) for k, _ in rows)
    lines = ["specbench summary", "-" * (w + 30)] + [f"{k:<{w}}  {v}" for k, v in rows]
    return "\n".join(lines)
