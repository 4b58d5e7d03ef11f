"""Reading result JSON files: a compact summary of any benchmark's JSON, and the compact form
in which results are committed. Imports the harness only, never a benchmark tool.

    python -m benchmarks.report summary RESULT.json [...]     # compact markdown tables
    python -m benchmarks.report compact RESULT.json OUT.json [--commit SHA] [--note TEXT]

``summary``: ops and layers JSON as one line per measurement (the CUDA backend, the reference
beside it; the 16-bit / fp32 table when the file has it); every other benchmark's JSON as its
verdict tables (``targets``, ``sampled_targets``, ``compiled``). ``compact``: the same payload
headed by ``run`` (date, GPU, commit) without the per-call lists (``*_all``, losses), the plan
(``settings.order``) and probe and tuner details, one row per line: what the tables and plots
in RESULTS.md are made from.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import List, Sequence

from .harness import SHORT, env_header, fmt, markdown_table


def _f(v, digits=2):
    return fmt(v, digits)


def _short(dtype_name) -> str:
    return SHORT.get(dtype_name, str(dtype_name or ""))


# ----------------------------------------------------------------------------- ops and layers
def compact_ops(payload: dict) -> str:
    """One row per (graph, op, variant) of the CUDA backend, the reference beside it."""
    rows = payload.get("rows", [])
    ref = {(r["graph"], r["op"], r.get("dtype", "float32")): r for r in rows if r.get("backend") == "reference"}
    main = "cuda" if any(r.get("backend") == "cuda" for r in rows) else "reference"
    graphs = payload.get("settings", {}).get("graphs", [])
    ops = ["gatv2_attention", "gat_attention", "dot_attention", "spmm", "segment_reduce"]
    dtypes = ["float32", "bfloat16", "float16"]

    def key(r):
        return (ops.index(r["op"]) if r.get("op") in ops else 9, graphs.index(r["graph"]) if r.get("graph") in graphs else 99,
                r.get("variant") != "default", str(r.get("variant")),
                dtypes.index(r.get("dtype", "float32")) if r.get("dtype", "float32") in dtypes else 9)

    out = []
    for r in sorted(rows, key=key):
        if r.get("backend") != main:
            continue
        rr = {} if main == "reference" else ref.get((r["graph"], r["op"], r.get("dtype", "float32")), {})
        status = r.get("status") or ""
        if status.startswith("no CUDA path"):
            status = "no CUDA path"
        out.append({"graph": r["graph"], "op": r["op"], "dtype": _short(r.get("dtype", "float32")),
                    "variant": "" if r.get("variant") == "default" else str(r.get("variant")).replace("GNN_FASTPATH_", ""),
                    "fwd": _f(r.get("fwd_ms")), "fb": _f(r.get("fwd_bwd_ms")), "mb": _f(r.get("peak_mb")),
                    "xf": _f(r.get("x_floor_fwd")), "xfb": _f(r.get("x_floor_fwd_bwd")),
                    "rfwd": _f(rr.get("fwd_ms")) or (rr.get("status") or "")[:12], "rfb": _f(rr.get("fwd_bwd_ms")),
                    "err": "" if r.get("rel_err_vs_reference") is None else f"{r['rel_err_vs_reference']:.0e}",
                    "status": "" if status == "ok" else status[:60]})
    cols = ["graph", "op", "dtype", "variant", "fwd", "fb", "mb", "xf", "xfb", "rfwd", "rfb", "err", "status"]
    heads = ["graph", "op", "dtype", "variant", "fwd ms", "f+b ms", "peak MB", "x floor", "x floor f+b", "ref fwd", "ref f+b",
             "err", "status"]
    return markdown_table(out, cols, heads)


#: The 16-bit / fp32 table of the op benchmark (``bench_ops.ratio_rows`` makes its rows).
RATIO_COLUMNS = ["graph", "op", "dtype", "variant", "fp32_fwd", "fwd", "ratio_fwd", "fp32_fb", "fb", "ratio_fb",
                 "x_floor", "x_floor_fb", "verdict"]
RATIO_HEADERS = ["graph", "op", "dtype", "variant", "fp32 fwd ms", "fwd ms", "/ fp32 fwd", "fp32 f+b ms", "f+b ms",
                 "/ fp32 f+b", "x floor (own bytes)", "x floor f+b", "target"]


def ratio_table(rows: Sequence[dict]) -> str:
    return markdown_table(rows, RATIO_COLUMNS, RATIO_HEADERS)


def compact_layers(payload: dict) -> str:
    out = []
    for r in payload.get("rows", []):
        sx = r.get("speedup_fwd")
        sxb = r.get("speedup_fwd_bwd")
        out.append({"graph": r.get("graph"), "layer": (r.get("layer") or "").split("(")[0],
                    "ac": "" if r.get("autocast", "off") == "off" else _short(r.get("autocast")),
                    "sf": _f(r.get("stock_fwd_ms")), "ff": _f(r.get("fused_fwd_ms")),
                    "x": "" if sx is None else f"{sx:.2f}", "sfb": _f(r.get("stock_fwd_bwd_ms")),
                    "ffb": _f(r.get("fused_fwd_bwd_ms")), "xb": "" if sxb is None else f"{sxb:.2f}",
                    "smb": _f(r.get("stock_peak_mb"), 0), "fmb": _f(r.get("fused_peak_mb"), 0),
                    "err": "" if r.get("rel_err") is None else f"{r['rel_err']:.0e}",
                    "path": (r.get("fused_path") or "")[:50],
                    "status": "" if r.get("status") == "ok" else (r.get("status") or "")[:50]})
    cols = ["graph", "layer", "ac", "sf", "ff", "x", "sfb", "ffb", "xb", "smb", "fmb", "err", "path", "status"]
    heads = ["graph", "layer", "autocast", "stock fwd", "fused fwd", "x", "stock f+b", "fused f+b", "x f+b", "stock MB",
             "fused MB", "err", "fused path", "status"]
    return markdown_table(out, cols, heads)


# ----------------------------------------------------------------------------- verdicts
def _value(t: dict) -> str:
    v = t.get("value")
    if not isinstance(v, (int, float)):
        return ""
    if t.get("kind") in ("speedup", "sampled_speedup"):
        return f"{v:.2f}x"
    if "bound_us" in t:
        return f"{v:.1f} us"
    return f"{v:.2f}"


def verdict_tables(payload: dict) -> List[str]:
    """The verdicts a payload carries: ``targets`` (training, host time), ``sampled_targets``
    and the ``compiled`` comparisons, one markdown table each."""
    parts: List[str] = []
    for key, title in (("targets", "target"), ("sampled_targets", "target (sampled training)")):
        ts = payload.get(key) or []
        if ts:
            rows = [{"target": t.get("target") or t.get("layer"), "value": _value(t), "verdict": t.get("verdict", "")}
                    for t in ts]
            parts += [markdown_table(rows, ["target", "value", "verdict"], [title, "measured", "verdict"]), ""]
    comps = payload.get("compiled") or []
    if comps:
        rows = [{"where": f"{c.get('graph')} " + ("full batch" if c.get("kind") == "full" else
                                                   f"{c.get('sampler')} b{c.get('batch_size')}"),
                 "layer": c.get("layer"), "dtype": _short(c.get("dtype")), "mode": c.get("compile"),
                 "x": "" if c.get("x_vs_eager_enabled") is None else f"{c['x_vs_eager_enabled']:.2f}x",
                 "target": f">= {c.get('bound', 1):g}x", "verdict": c.get("verdict", "")} for c in comps]
        parts += [markdown_table(rows, ["where", "layer", "dtype", "mode", "x", "target", "verdict"],
                                 ["graph", "layer", "dtype", "compile mode", "x vs eager enabled", "target", "verdict"]),
                  ""]
    return parts


def summarize(paths: Sequence[str]) -> str:
    """Compact markdown of result JSON files (missing or unreadable files are named)."""
    parts = []
    for p in paths:
        path = Path(p)
        if not path.exists():
            parts.append(f"({path.name}: not written)")
            continue
        try:
            payload = json.loads(path.read_text())
        except ValueError as exc:
            parts.append(f"({path.name}: unreadable: {exc})")
            continue
        kind = payload.get("benchmark")
        if kind == "ops":
            parts += [f"#### ops ({path.name}): {env_header(payload.get('environment', {}))}", "",
                      compact_ops(payload), ""]
            if payload.get("ratios"):
                parts += [f"#### ops: 16-bit / fp32 ({path.name})", "", ratio_table(payload["ratios"]), ""]
        elif kind == "layers":
            parts += [f"#### layers ({path.name})", "", compact_layers(payload), ""]
        else:
            tables = verdict_tables(payload)
            parts += [f"#### {kind} ({path.name}): {len(payload.get('rows', []))} rows", ""] + \
                (tables or ["(no verdicts in this file: see its markdown)", ""])
    return "\n".join(parts)


# ----------------------------------------------------------------------------- compact form
#: Keys the compact form drops wherever they occur: raw per-call and per-round lists, losses,
#: the plan, probe and tuner details (the tables use the medians and choices beside them).
DROPPED = ("losses", "order", "bandwidth_probe", "rounds_ms", "runs", "tuning_report", "tuning_classes",
           "fastpath_stats")


def compact(payload: dict, commit: str = None, note: str = None) -> dict:
    """``payload`` without what no table needs (keys ending in ``_all`` and :data:`DROPPED`, at
    any depth), headed by ``run``: the date, GPU and commit of the run (``commit``: the tree that
    ran, where the file's own ``git_commit`` is wrong, e.g. a device copy whose .git lagged)."""

    def strip(v):
        if isinstance(v, dict):
            return {k: strip(x) for k, x in v.items() if not k.endswith("_all") and k not in DROPPED}
        if isinstance(v, list):
            return [strip(x) for x in v]
        return v

    env = payload.get("environment") or {}
    run = dict(payload.get("run") or {})
    run.setdefault("date", str(env.get("timestamp_utc") or env.get("date") or "")[:10] or None)
    run.setdefault("gpu", env.get("gpu") or payload.get("gpu") or payload.get("device"))
    run.setdefault("commit", env.get("git_commit"))
    if commit:
        run["commit"] = commit
    if note:
        run["note"] = note
    out = {"run": run}
    out.update(strip({k: v for k, v in payload.items() if k != "run"}))
    return out


def compact_dumps(payload: dict) -> str:
    """JSON with one top-level key per line and one list item (row) per line."""
    lines = ["{"]
    items = list(payload.items())
    for i, (k, v) in enumerate(items):
        end = "," if i < len(items) - 1 else ""
        if isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            lines.append(json.dumps(k) + ": [")
            lines += [json.dumps(x, separators=(",", ":"), default=str) + ("," if j < len(v) - 1 else "")
                      for j, x in enumerate(v)]
            lines.append("]" + end)
        else:
            lines.append(json.dumps(k) + ": " + json.dumps(v, separators=(",", ":"), default=str) + end)
    lines.append("}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("summary", help="compact markdown tables of result JSON files")
    s.add_argument("files", nargs="+")
    c = sub.add_parser("compact", help="the compact form of a result JSON file (for benchmarks/results/)")
    c.add_argument("file")
    c.add_argument("out")
    c.add_argument("--commit", default=None, help="the tree that ran, when the file's git_commit is wrong")
    c.add_argument("--note", default=None, help="one line on what the run was")
    args = p.parse_args(argv)
    if args.cmd == "summary":
        print(summarize(args.files))
    else:
        payload = compact(json.loads(Path(args.file).read_text()), args.commit, args.note)
        Path(args.out).write_text(compact_dumps(payload))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
