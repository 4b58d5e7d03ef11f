"""Layer-level benchmarks: stock PyG layers against the same modules under gnn_fastpath.enable().

    python -m benchmarks.bench_layers --quick
    python -m benchmarks.bench_layers --graphs pokec-like --layers gatv2
    python -m benchmarks.bench_layers --quick --autocast off,bfloat16     # + both under bf16 autocast

Each (graph, layer) builds the module once (seeded), times it stock, then times the very
same module (same parameters, same inputs) under ``gnn_fastpath.enable()``, and records
``gnn_fastpath.stats()`` of the enabled run (proof the fused path ran, or why it fell
back) and the relative difference of the two outputs. When ``gnn_fastpath.enable`` does
not exist yet, only the stock columns are filled.

Layers (the configurations of baselines.md): GATv2Conv(128, 64, heads=2),
TransformerConv(512, 128, heads=4, root_weight=False), GCNConv(512, 512, cached=True),
SAGEConv(512, 512, aggr="max"); and (issue 12) GATConv(128, 64, heads=2) and
GATConv(128, 32, heads=8), AGNNConv, GINConv and EdgeConv with MLPs, GraphConv(aggr="max"),
EdgeConv with a single Linear (the fully node-level reorganisation). Inputs x [N, in] require grad (a hidden layer), so
fwd+bwd includes dx.

``--autocast off,bfloat16,float16`` (default ``off``) repeats every (graph, layer) with the
forward of both runs, stock and enabled, inside ``torch.autocast(device, dtype)`` (fp32 module
and inputs, as AMP training runs them; backward outside, as usual); the row's ``autocast``
column says which, and ``rel err`` compares the two under the same autocast.
"""
from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path
from typing import Dict, List, Optional

import torch

from . import graphs as G
from . import harness as H
from .harness import OOM, autocast, fmt, free_memory, import_pyg, is_oom, measure, measure_bandwidth, parse_dtypes

QUICK_GRAPHS = ["tolokers", "arxiv-like", "arxiv-skewdst", "roads-like"]
FULL_GRAPHS = QUICK_GRAPHS + ["pokec-like"]
CPU_GRAPHS = ["arxiv-like", "roads-like"]
CPU_SCALE = 0.01


def _layers() -> Dict[str, dict]:
    return {
        "gatv2": {"label": "GATv2Conv(128, 64, heads=2)", "in": 128,
                  "make": lambda pyg: pyg.nn.GATv2Conv(128, 64, heads=2)},
        "transformer": {"label": "TransformerConv(512, 128, heads=4, root_weight=False)", "in": 512,
                        "make": lambda pyg: pyg.nn.TransformerConv(512, 128, heads=4, root_weight=False)},
        "gcn": {"label": "GCNConv(512, 512, cached=True)", "in": 512,
                "make": lambda pyg: pyg.nn.GCNConv(512, 512, cached=True)},
        "sage_max": {"label": 'SAGEConv(512, 512, aggr="max")', "in": 512,
                     "make": lambda pyg: pyg.nn.SAGEConv(512, 512, aggr="max")},
        # issue 12: GATConv and the other layers of the fusion literature
        "gat_h2": {"label": "GATConv(128, 64, heads=2)", "in": 128,
                   "make": lambda pyg: pyg.nn.GATConv(128, 64, heads=2)},
        "gat_h8": {"label": "GATConv(128, 32, heads=8)", "in": 128,
                   "make": lambda pyg: pyg.nn.GATConv(128, 32, heads=8)},
        "agnn": {"label": "AGNNConv(requires_grad=True), 128 features", "in": 128,
                 "make": lambda pyg: pyg.nn.AGNNConv(requires_grad=True)},
        "gin": {"label": "GINConv(MLP 128-128-128, train_eps=True)", "in": 128,
                "make": lambda pyg: pyg.nn.GINConv(_mlp(128, 128, 128), train_eps=True)},
        "graph_conv_max": {"label": 'GraphConv(128, 128, aggr="max")', "in": 128,
                           "make": lambda pyg: pyg.nn.GraphConv(128, 128, aggr="max")},
        "edge_conv": {"label": "EdgeConv(MLP 256-128-128, aggr=max)", "in": 128,
                      "make": lambda pyg: pyg.nn.EdgeConv(_mlp(256, 128, 128), aggr="max")},
        "edge_conv_linear": {"label": "EdgeConv(Linear(256, 128), aggr=max)", "in": 128,
                             "make": lambda pyg: pyg.nn.EdgeConv(torch.nn.Linear(256, 128), aggr="max")},
    }


def _mlp(*widths: int) -> torch.nn.Sequential:
    """Linear, ReLU, Linear, ...: the MLP GIN and EdgeConv are used with."""
    mods = []
    for i, (a, b) in enumerate(zip(widths, widths[1:])):
        mods += ([torch.nn.ReLU()] if i else []) + [torch.nn.Linear(a, b)]
    return torch.nn.Sequential(*mods)


LAYERS = list(_layers())


def _fastpath():
    """(gnn_fastpath module or None, why not)."""
    try:
        import gnn_fastpath
    except Exception as exc:  # noqa: BLE001
        return None, f"gnn_fastpath does not import: {type(exc).__name__}: {exc}"
    if not hasattr(gnn_fastpath, "enable"):
        return None, "gnn_fastpath.enable does not exist yet"
    return gnn_fastpath, None


def _enable(gf, device: torch.device) -> None:
    # On the CPU, cpu="reference" runs the shims on the reference ops (the smoke run's point).
    kwargs = {"frameworks": "pyg"} if device.type == "cuda" else {"frameworks": "pyg", "cpu": "reference"}
    try:
        gf.enable(**kwargs)
    except TypeError:
        gf.enable()


def _ok(res: dict) -> bool:
    return isinstance(res.get("fwd_ms"), float)


class LayerRunner:
    def __init__(self, args, device, pyg, gf, gf_reason):
        self.args, self.device, self.pyg, self.gf, self.gf_reason = args, device, pyg, gf, gf_reason
        self.rows: List[dict] = []
        self.graph_info: List[dict] = []
        self.t0 = time.perf_counter()
        self.env: dict = {}
        self.settings: dict = {}

    def over_budget(self) -> bool:
        return self.args.budget_s is not None and time.perf_counter() - self.t0 > self.args.budget_s

    def payload(self) -> dict:
        return {"benchmark": "layers", "environment": self.env, "settings": self.settings,
                "graphs": self.graph_info, "rows": self.rows}

    def add(self, row: dict) -> None:
        self.rows.append(row)
        keys = ("graph", "layer", "autocast", "stock_fwd_ms", "stock_fwd_bwd_ms", "stock_peak_mb", "fused_fwd_ms",
                "fused_fwd_bwd_ms", "fused_peak_mb", "speedup_fwd", "speedup_fwd_bwd", "rel_err", "status")
        print("  " + " ".join(f"{k}={fmt(row[k]) if isinstance(row[k], float) else row[k]}"
                              for k in keys if row.get(k) is not None), flush=True)
        if self.args.json_out:
            H.write_json(self.args.json_out, self.payload())

    def run_layer(self, gname: str, ei: torch.Tensor, n: int, key: str, spec: dict, amp: str = "off") -> None:
        a = self.args
        row = {"graph": gname, "nodes": n, "edges": int(ei.shape[1]), "layer": spec["label"], "layer_key": key,
               "autocast": amp}
        if self.over_budget():
            row["status"] = "skipped: time budget"
            self.add(row)
            return
        gen = torch.Generator().manual_seed(a.seed)
        x = torch.randn(n, spec["in"], generator=gen).to(self.device).requires_grad_(a.x_grad)
        torch.manual_seed(a.seed)
        mod = spec["make"](self.pyg).to(self.device)
        params = [p for p in mod.parameters() if p.requires_grad]
        targets = params + ([x] if a.x_grad else [])
        device = self.device

        def call():
            with autocast(device, amp):
                return mod(x, ei)

        stock = measure(call, targets, a.warmup, a.iters, self.device)
        for k in ("fwd_ms", "fwd_bwd_ms", "peak_mb", "error"):
            if stock.get(k) is not None:
                row[f"stock_{k}"] = stock[k]
        ref_out = None
        if _ok(stock):
            try:
                with torch.no_grad():
                    ref_out = call().detach()
            except Exception as exc:  # noqa: BLE001
                if not is_oom(exc):
                    raise
            if ref_out is None:
                free_memory()
        status = []
        if self.gf is None:
            status.append(f"stock only ({self.gf_reason})")
        elif self.over_budget():
            status.append("fused skipped: time budget")
        else:
            gf = self.gf
            if hasattr(gf, "reset_stats"):
                gf.reset_stats()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                _enable(gf, self.device)
                try:
                    fused = measure(call, targets, a.warmup, a.iters, self.device)
                    if _ok(fused) and ref_out is not None:
                        try:
                            with torch.no_grad():
                                out = call().detach()
                            row["rel_err"] = float((out.double() - ref_out.double()).norm()
                                                   / ref_out.double().norm().clamp_min(1e-30))
                            del out
                        except Exception as exc:  # noqa: BLE001
                            row["rel_err_error"] = f"{type(exc).__name__}: {exc}"[:300]
                finally:
                    gf.disable()
            for k in ("fwd_ms", "fwd_bwd_ms", "peak_mb", "error"):
                if fused.get(k) is not None:
                    row[f"fused_{k}"] = fused[k]
            row["fastpath_stats"] = gf.stats() if hasattr(gf, "stats") else None
            warns = sorted({str(w.message) for w in caught if "gnn_fastpath" in str(w.message)})
            if warns:
                row["fastpath_warnings"] = warns[:10]
            for k, name in (("fwd_ms", "speedup_fwd"), ("fwd_bwd_ms", "speedup_fwd_bwd"), ("peak_mb", "memory_ratio")):
                s, f = row.get(f"stock_{k}"), row.get(f"fused_{k}")
                if isinstance(s, float) and isinstance(f, float) and f > 0:
                    row[name] = s / f
            row["fused_path"] = _fused_summary(row.get("fastpath_stats"))
        if "error" in stock:
            status.append("stock error")
        if OOM in (row.get("stock_fwd_ms"), row.get("stock_fwd_bwd_ms"), row.get("stock_peak_mb")):
            status.append("stock OOM")
        if OOM in (row.get("fused_fwd_ms"), row.get("fused_fwd_bwd_ms"), row.get("fused_peak_mb")):
            status.append("fused OOM")
        if row.get("fused_error"):
            status.append("fused error")
        row["status"] = "; ".join(status) or "ok"
        self.add(row)  # the caller frees memory once this frame (module, inputs) is gone

    def run(self, graph_names: List[str], layer_keys: List[str]) -> None:
        a = self.args
        specs = _layers()
        for gname in graph_names:
            if self.over_budget():
                for k in layer_keys:
                    for amp in a.autocast_modes:
                        self.add({"graph": gname, "layer": specs[k]["label"], "autocast": amp, "status": "skipped: time budget"})
                continue
            try:
                bg = G.load(gname, data_dir=a.data_dir, device=self.device, seed=a.seed, scale=a.scale_for(gname))
            except FileNotFoundError as exc:
                print(f"{gname}: {exc}", flush=True)
                for k in layer_keys:
                    for amp in a.autocast_modes:
                        self.add({"graph": gname, "layer": specs[k]["label"], "autocast": amp, "status": "missing data"})
                continue
            self.graph_info.append(bg.meta)
            print(f"{gname}: {bg.num_nodes:,} nodes, {bg.num_edges:,} edges", flush=True)
            for k in layer_keys:
                for amp in a.autocast_modes:
                    self.run_layer(gname, bg.edge_index, bg.num_nodes, k, specs[k], amp)
                    free_memory()
            del bg
            free_memory()


def _fused_summary(stats) -> Optional[str]:
    """'cuda 25' / 'fallback: reason 25' from gnn_fastpath.stats() of one layer run."""
    if not isinstance(stats, dict) or not stats:
        return None if stats is None else "no patched call recorded"
    parts = []
    for layer, entry in stats.items():
        if not isinstance(entry, dict):
            continue
        fused = {k: v for k, v in (entry.get("fused") or {}).items() if v}
        fb = {k: v for k, v in (entry.get("fallback") or {}).items() if v}
        bits = [f"{k} {v}" for k, v in fused.items()] + [f"fallback {k} {v}" for k, v in fb.items()]
        parts.append(f"{layer}: " + (", ".join(bits) or "none"))
    return "; ".join(parts)


COLUMNS = ["graph", "layer", "autocast", "stock_fwd_ms", "fused_fwd_ms", "speedup_fwd", "stock_fwd_bwd_ms", "fused_fwd_bwd_ms",
           "speedup_fwd_bwd", "stock_peak_mb", "fused_peak_mb", "rel_err", "fused_path", "status"]
HEADERS = ["graph", "layer", "autocast", "stock fwd ms", "fused fwd ms", "x fwd", "stock f+b ms", "fused f+b ms", "x f+b",
           "stock peak MB", "fused peak MB", "rel err", "fused path (stats)", "status"]


def markdown(payload: dict) -> str:
    fm = {c: fmt for c in COLUMNS if c.endswith("_ms") or c.endswith("_mb")}
    fm.update(speedup_fwd=lambda v: "" if v is None else f"{v:.2f}x",
              speedup_fwd_bwd=lambda v: "" if v is None else f"{v:.2f}x",
              rel_err=lambda v: "" if v is None else f"{v:.1e}",
              status=lambda s: "" if s == "ok" else str(s or ""))
    layer_order = [s["label"] for s in _layers().values()]
    graphs = payload["settings"].get("graphs", [])
    amps = payload["settings"].get("autocast") or ["off"]
    rows = sorted(payload["rows"], key=lambda r: (layer_order.index(r["layer"]) if r.get("layer") in layer_order else 9,
                                                  graphs.index(r["graph"]) if r.get("graph") in graphs else 99,
                                                  amps.index(r.get("autocast", "off")) if r.get("autocast", "off")
                                                  in amps else 9))
    return "\n".join([
        "### Layer benchmarks (PyG stock vs gnn_fastpath.enable())", "", H.env_header(payload["environment"]), "",
        f"warm-up {payload['settings']['warmup']}, timed {payload['settings']['iters']} (median); x = stock / fused.", "",
        H.markdown_table(rows, COLUMNS, HEADERS, fm), ""])


def parse_autocast(text: str) -> List[str]:
    """``--autocast`` as a list: ``"off"`` (also ``none``/``float32``) first, then 16-bit dtype names."""
    items = [t.strip().lower() for t in text.split(",") if t.strip()]
    half = [t for t in items if t not in ("off", "none", "float32", "fp32")]
    modes = ["off"] if len(half) < len(items) or not items else []
    return modes + (parse_dtypes(",".join(half), "--autocast") if half else [])


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--graphs", default=None)
    p.add_argument("--layers", default=",".join(LAYERS), help="comma list of " + ", ".join(LAYERS))
    p.add_argument("--quick", action="store_true")
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--iters", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--scale", type=float, default=None)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--out", default=None)
    p.add_argument("--json-out", default=None)
    p.add_argument("--md", default=None)
    p.add_argument("--autocast", default="off",
                   help="comma list of off, bfloat16, float16: each (graph, layer) stock vs enabled under that autocast")
    p.add_argument("--no-x-grad", dest="x_grad", action="store_false", help="inputs without requires_grad")
    p.add_argument("--budget-s", type=float, default=None)
    p.add_argument("--bandwidth", type=float, default=None, help="GB/s to record instead of measuring")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    pyg = import_pyg()
    if pyg is None:
        return 0
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    graph_names = [g.strip() for g in args.graphs.split(",")] if args.graphs else (QUICK_GRAPHS if args.quick else FULL_GRAPHS)
    layer_keys = [k.strip() for k in args.layers.split(",") if k.strip()]
    args.autocast_modes = parse_autocast(args.autocast)
    bad = [k for k in layer_keys if k not in LAYERS]
    if bad:
        raise SystemExit(f"unknown layers {bad}; known: {', '.join(LAYERS)}")
    args.warmup = args.warmup if args.warmup is not None else (3 if args.quick else 5)
    args.iters = args.iters if args.iters is not None else (10 if args.quick else 20)
    scale = args.scale
    if not cuda:
        print("no GPU: stock vs enable() on scaled-down synthetic graphs on the CPU (a smoke run, not a benchmark)")
        scale = CPU_SCALE if scale is None else scale
        if not args.graphs:
            graph_names = CPU_GRAPHS
        args.warmup, args.iters = min(args.warmup, 1), min(args.iters, 3)
    scale = 1.0 if scale is None else scale
    args.scale_for = lambda name: 1.0 if name in G.REAL else scale
    out_dir = H.out_dir(args.out)
    args.json_out = args.json_out or str(out_dir / "bench_layers.json")
    md_path = str(out_dir / "bench_layers.md") if args.md is None else args.md

    gf, reason = _fastpath()
    bw = {"gb_s": args.bandwidth, "note": "given by --bandwidth"} if args.bandwidth else (measure_bandwidth() if cuda else None)
    runner = LayerRunner(args, device, pyg, gf, reason)
    runner.env = H.environment(bw)
    runner.settings = {"warmup": args.warmup, "iters": args.iters, "seed": args.seed, "scale": scale,
                       "graphs": graph_names, "layers": layer_keys, "autocast": args.autocast_modes,
                       "x_requires_grad": args.x_grad,
                       "device": str(device), "fastpath": reason or "enabled run included"}
    if reason:
        print(f"note: {reason}: stock numbers only", flush=True)
    runner.run(graph_names, layer_keys)
    H.write_json(args.json_out, runner.payload())
    text = markdown(runner.payload())
    if md_path:
        Path(md_path).parent.mkdir(parents=True, exist_ok=True)
        Path(md_path).write_text(text)
    print()
    print(text, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
