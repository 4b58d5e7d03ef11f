"""The speedup and memory tables of a result as plots (PNG), from its JSON.

    python -m benchmarks.plot benchmarks/results/2026-11-27-h200-train-full-a6c5679.json
    python -m benchmarks.plot RESULT.json [...] --out DIR

Per JSON file ``X.json`` (full-batch training: ``bench_train_full``, or the full-batch rows of
an older ``bench_train`` file; single layers: ``bench_layers``) it writes, beside it or into
``--out``:

* ``X-speedup.png``: stock / enabled time per (graph, layer), one bar per dtype (training
  steps) or per pass (layers: forward, forward + backward); a bar whose stock run ran out of
  memory is drawn at the enabled run's height, hatched and labelled "stock OOM";
* ``X-memory.png``: peak memory stock and enabled per (graph, layer), log scale (training: per
  dtype; layers: the forward's peak), "OOM" where stock ran out of memory.

The title names the GPU, the commit and the date the JSON records (``run`` of a committed
compact file first: its commit is the tree that ran). Needs matplotlib (``pip install -e ".[bench]"``); files of another benchmark are skipped with a note.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

SHORT = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
LAYER_ORDER = ["gatv2", "transformer", "gcn", "sage_max"]
LAYER_LABELS = {"gatv2": "GATv2", "transformer": "Transformer", "gcn": "GCN", "sage_max": "SAGE(max)"}
COLORS = ["#4477aa", "#ee6677", "#228833", "#ccbb44"]


def _num(v) -> Optional[float]:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _oom(v) -> bool:
    return isinstance(v, str) and v.upper() == "OOM"


def title(payload: dict, what: str) -> str:
    run, env = payload.get("run") or {}, payload.get("environment") or {}
    gpu = (run.get("gpu") or env.get("gpu") or "no GPU").replace("NVIDIA ", "")
    commit = str(run.get("commit") or env.get("git_commit") or "?")[:7]
    date = str(run.get("date") or env.get("timestamp_utc") or "")[:10]
    return f"{what}\n{gpu}, commit {commit}, {date}"


# ----------------------------------------------------------------------------- series
def train_series(payload: dict) -> Tuple[List[str], Dict[str, dict]]:
    """Groups ``graph / layer`` of the full-batch eager rows, and per dtype: speedup, the
    stock-OOM flags and the peaks (stock, enabled) of each group."""
    rows = [r for r in payload.get("rows", []) if not r.get("sampler") and r.get("compile") in (None, "none")]
    by = {(r.get("graph"), r.get("layer_key"), r.get("dtype"), r.get("mode")): r for r in rows}
    graphs: List[str] = []
    for r in rows:
        if r.get("graph") not in graphs:
            graphs.append(r.get("graph"))
    layers = sorted({r.get("layer_key") for r in rows},
                    key=lambda k: LAYER_ORDER.index(k) if k in LAYER_ORDER else 99)
    dtypes = [d for d in ("float32", "bfloat16", "float16") if any(r.get("dtype") == d for r in rows)]
    groups, series = [], {d: {"x": [], "oom": [], "stock_mb": [], "enabled_mb": []} for d in dtypes}
    for g in graphs:
        for layer in layers:
            if not any((g, layer, d, m) in by for d in dtypes for m in ("stock", "enabled")):
                continue
            groups.append(f"{g}\n{LAYER_LABELS.get(layer, layer)}")
            for d in dtypes:
                s, e = by.get((g, layer, d, "stock"), {}), by.get((g, layer, d, "enabled"), {})
                a, b = _num(s.get("step_ms")), _num(e.get("step_ms"))
                oom = _oom(s.get("step_ms")) or s.get("status") == "OOM"
                series[d]["x"].append(a / b if a and b else None)
                series[d]["oom"].append(oom and b is not None)
                series[d]["stock_mb"].append(None if oom else _num(s.get("peak_mb")))
                series[d]["enabled_mb"].append(_num(e.get("peak_mb")))
    return groups, {SHORT.get(d, d): v for d, v in series.items()}


def layer_series(payload: dict) -> Tuple[List[str], Dict[str, dict]]:
    """Groups ``graph / layer`` of a bench_layers file (eager, no autocast) and the forward and
    forward + backward speedups, stock-OOM flags and forward peaks."""
    rows = [r for r in payload.get("rows", []) if r.get("autocast", "off") in ("off", None)]
    groups = []
    series = {p: {"x": [], "oom": [], "stock_mb": [], "enabled_mb": []} for p in ("fwd", "fwd+bwd")}
    for r in rows:
        name = str(r.get("layer") or "").split("(")[0]
        groups.append(f"{r.get('graph')}\n{name[:-4] if name.endswith('Conv') else name}")
        for p, s_key, f_key in (("fwd", "stock_fwd_ms", "fused_fwd_ms"), ("fwd+bwd", "stock_fwd_bwd_ms", "fused_fwd_bwd_ms")):
            a, b = _num(r.get(s_key)), _num(r.get(f_key))
            series[p]["x"].append(a / b if a and b else None)
            series[p]["oom"].append(_oom(r.get(s_key)) and b is not None)
            series[p]["stock_mb"].append(_num(r.get("stock_peak_mb")))
            series[p]["enabled_mb"].append(_num(r.get("fused_peak_mb")))
    return groups, series


# ----------------------------------------------------------------------------- drawing
def _figure(n_groups: int):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6.0, 0.75 * n_groups + 2.0), 3.6), dpi=90)
    return plt, fig, ax


def speedup_plot(groups: Sequence[str], series: Dict[str, dict], what: str, path: Path, payload: dict) -> None:
    plt, fig, ax = _figure(len(groups))
    n = max(1, len(series))
    width = 0.8 / n
    top = max([v for s in series.values() for v in s["x"] if v] + [1.0])
    for i, (name, s) in enumerate(series.items()):
        xs = [j + (i - (n - 1) / 2) * width for j in range(len(groups))]
        heights = [v if v else 0.0 for v in s["x"]]
        bars = ax.bar(xs, heights, width, label=name, color=COLORS[i % len(COLORS)])
        for x, v, oom, bar in zip(xs, s["x"], s["oom"], bars):
            if oom:  # stock out of memory: no ratio; mark the slot
                bar.set_height(top * 0.15)
                bar.set_hatch("//")
                bar.set_alpha(0.4)
                ax.text(x, top * 0.16, "stock\nOOM", ha="center", va="bottom", fontsize=6)
            elif v:
                ax.text(x, v, f"{v:.1f}", ha="center", va="bottom", fontsize=6)
    ax.axhline(1.0, color="black", linewidth=0.6)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, fontsize=7)
    ax.set_ylabel("stock / enabled time (x)")
    ax.set_title(title(payload, what), fontsize=9)
    ax.legend(fontsize=7, frameon=False)
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def memory_plot(groups: Sequence[str], series: Dict[str, dict], what: str, path: Path, payload: dict) -> None:
    plt, fig, ax = _figure(len(groups))
    bars = [(f"stock {k}" if len(series) > 1 else "stock", s["stock_mb"], s["oom"]) for k, s in series.items()]
    bars += [(f"enabled {k}" if len(series) > 1 else "enabled", s["enabled_mb"], None) for k, s in series.items()]
    n = len(bars)
    width = 0.8 / n
    values = [v for _, vs, _ in bars for v in vs if v]
    low = min(values) if values else 1.0
    for i, (name, vs, ooms) in enumerate(bars):
        xs = [j + (i - (n - 1) / 2) * width for j in range(len(groups))]
        ax.bar(xs, [v if v else 0.0 for v in vs], width, label=name, color=COLORS[i % len(COLORS)],
               alpha=0.55 if name.startswith("stock") else 1.0)
        for j, x in enumerate(xs):
            if ooms and ooms[j] and not vs[j]:
                ax.text(x, low, "OOM", ha="center", va="bottom", fontsize=6, rotation=90)
    ax.set_yscale("log")
    ax.set_ylim(bottom=low / 2)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, fontsize=7)
    ax.set_ylabel("peak MB (log)")
    ax.set_title(title(payload, what), fontsize=9)
    ax.legend(fontsize=7, frameon=False, ncol=2)
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_file(path: Path, out: Optional[Path] = None) -> List[Path]:
    """The plots of one result JSON (none for other benchmarks); the paths written."""
    payload = json.loads(Path(path).read_text())
    kind = payload.get("benchmark")
    if kind in ("train", "train_full"):
        groups, series = train_series(payload)
        speed_what = "Training steps, full batch: stock / enabled step time"
        mem_what = "Training steps, full batch: peak memory during the config"
    elif kind == "layers":
        groups, series = layer_series(payload)
        speed_what = "Single layers: stock / enabled time"
        mem_what = "Single layers: forward peak memory"
    else:
        print(f"{path}: a {kind!r} result: no plot for it")
        return []
    if not groups:
        print(f"{path}: no rows to plot")
        return []
    out = Path(out) if out is not None else Path(path).parent
    out.mkdir(parents=True, exist_ok=True)
    stem = Path(path).stem
    written = [out / f"{stem}-speedup.png", out / f"{stem}-memory.png"]
    speedup_plot(groups, series, speed_what, written[0], payload)
    if any(v for s in series.values() for v in s["stock_mb"] + s["enabled_mb"]):
        memory_plot(groups, series if kind != "layers" else {"fwd": series["fwd"]}, mem_what, written[1], payload)
    else:
        written.pop()  # a CPU run records no peaks
    for p in written:
        print(p)
    return written


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="+", help="result JSON files")
    p.add_argument("--out", default=None, help="directory for the PNGs (default: beside each JSON file)")
    args = p.parse_args(argv)
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        print("matplotlib is not installed (pip install matplotlib): no plots")
        return 1
    for f in args.files:
        plot_file(Path(f), Path(args.out) if args.out else None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
