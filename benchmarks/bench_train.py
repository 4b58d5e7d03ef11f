"""End-to-end full-batch training steps: stock PyG against ``gnn_fastpath.enabled()``, in fp32
and under 16-bit autocast.

    python -m benchmarks.bench_train                      # every graph, layer and dtype
    python -m benchmarks.bench_train --quick --time-budget 240
    python -m benchmarks.bench_train --graphs pokec-like --layers gatv2,transformer --dtypes bf16
    python -m benchmarks.bench_train --device cpu --scale 0.005 --hidden 8 --heads 2 --steps 2   # smoke

A config is (graph, layer, dtype, mode). Each builds a 3-layer model (the configuration of
``../shared/docs/baselines.md``, "Training steps"), loads the initial weights every config of
that (graph, layer) shares (one ``state_dict``, so stock and enabled start from the same
parameters), makes a fresh Adam, and times full-batch steps

    step = zero_grad; [autocast] out = model(x, edge_index); loss = cross_entropy(out, y) [/autocast];
           loss.backward(); optimizer.step()

with CUDA events (median of ``--steps`` after ``--warmup`` steps; ``time.perf_counter`` on the
CPU). ``mode`` is ``stock`` (PyG as installed) or ``enabled`` (the same code inside
``gnn_fastpath.enabled(frameworks="pyg")``; on the CPU with ``cpu="reference"``, so the smoke
run goes through the shims). ``dtype`` ``float32`` is plain fp32 (TF32 off, torch's default);
``bfloat16`` / ``float16`` wrap forward and loss in ``torch.autocast(device, dtype)`` (parameters
stay fp32; float16 adds a ``GradScaler`` as AMP users do).

Models: ``GATv2Conv(d, 64, heads=4, dropout=0.1)`` and ``TransformerConv(d, 64, heads=4,
dropout=0.1)`` (concatenated heads, 256 wide), ``GCNConv(d, 64, cached=True)`` and
``SAGEConv(d, 64, aggr="max")``, three of them, ELU after each and feature dropout 0.2 between
them, then ``Linear(width, classes)``. Inputs are seeded random features (width ``IN_FEATURES``
per graph) and random labels over every node.

Recorded per config: median / all step times, peak memory (``max_memory_allocated`` after
``reset_peak_memory_stats``, minus what was allocated when the config started: the model,
optimizer state, activations and anything gnn_fastpath caches, not the graph and features),
the loss of every timed step, the fused / fallback counts of ``gnn_fastpath.stats()`` (reset
per config) and the fallback warnings, or ``OOM`` (memory freed, the run goes on).

The issue-10 targets are measured first (``TARGETS``) and reported met / missed. Results:
``--json`` (default ``benchmarks/results/bench_train.json``) and ``--markdown`` (default
``benchmarks/results/bench_train.md``), both rewritten after every config, so a run cut by
``--time-budget`` or a timeout keeps what it measured.
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from . import graphs as G
from . import report
from .timing import OOM, SHORT, autocast, fmt, free_memory, import_pyg, is_oom, parse_dtypes, time_calls

GRAPHS = ["tolokers", "arxiv-like", "pokec-like"]
CPU_GRAPHS = ["arxiv-like"]
CPU_SCALE = 0.01
LAYERS = ["gatv2", "transformer", "gcn", "sage_max"]
LAYER_LABELS = {"gatv2": "GATv2Conv x3", "transformer": "TransformerConv x3", "gcn": "GCNConv x3",
                "sage_max": "SAGEConv(max) x3"}
DTYPE_NAMES = ["float32", "bfloat16"]
MODES = ("stock", "enabled")
#: Input feature width and classes per graph (tolokers: 10 features, 2 classes; arxiv: 128 / 40;
#: pokec: 65 / 2, as in the real data sets); other graphs get the defaults.
IN_FEATURES = {"tolokers": 10, "arxiv-like": 128, "pokec-like": 65}
NUM_CLASSES = {"tolokers": 2, "arxiv-like": 40, "pokec-like": 2}
DEFAULT_IN, DEFAULT_CLASSES = 64, 8


# ----------------------------------------------------------------------------- targets
@dataclass(frozen=True)
class Target:
    """An issue-10 target. ``kind`` ``speedup``: stock / enabled step time in ``dtype`` >= ``bound``;
    ``ratio``: enabled ``dtype`` step / enabled fp32 step <= ``bound``."""

    kind: str
    graph: str
    layer: str
    dtype: str
    bound: float

    @property
    def text(self) -> str:
        d = SHORT[self.dtype]
        if self.kind == "speedup":
            return f"{self.graph} {LAYER_LABELS[self.layer]}: {d} enabled >= {self.bound:g}x faster than stock {d}"
        return f"{self.graph} {LAYER_LABELS[self.layer]}: {d} enabled step <= {self.bound:g}x enabled fp32 step"

    def configs(self) -> List[Tuple[str, str, str, str]]:
        """The (graph, layer, dtype, mode) configs it needs, in the order to measure them."""
        if self.kind == "speedup":
            return [(self.graph, self.layer, self.dtype, "enabled"), (self.graph, self.layer, self.dtype, "stock")]
        return [(self.graph, self.layer, self.dtype, "enabled"), (self.graph, self.layer, "float32", "enabled")]


TARGETS = [
    Target("speedup", "tolokers", "gatv2", "bfloat16", 9.0),
    Target("speedup", "arxiv-like", "transformer", "bfloat16", 3.0),
    Target("speedup", "pokec-like", "sage_max", "bfloat16", 7.0),
    Target("ratio", "pokec-like", "gatv2", "bfloat16", 0.6),
    Target("ratio", "pokec-like", "transformer", "bfloat16", 0.6),
]


def plan(graphs: Sequence[str], layers: Sequence[str], dtypes: Sequence[str]) -> List[Tuple[str, str, str, str]]:
    """Every (graph, layer, dtype, mode) to run: the targets' configs first (those selected),
    then the rest graph by graph, so a run cut short has measured what the issue asks."""
    wanted = [(g, l, d, m) for g in graphs for l in layers for d in dtypes for m in MODES]
    first = [c for t in TARGETS for c in t.configs() if c in wanted]
    order: List[Tuple[str, str, str, str]] = []
    for c in first + wanted:
        if c not in order:
            order.append(c)
    return order


def evaluate_targets(rows: Sequence[dict]) -> List[dict]:
    """Each target of ``TARGETS`` with the measured value and ``met`` / ``missed`` /
    ``not measured (...)`` from the config rows."""
    by = {(r.get("graph"), r.get("layer_key"), r.get("dtype"), r.get("mode")): r for r in rows}
    out = []
    for t in TARGETS:
        if t.kind == "speedup":
            num, den = by.get((t.graph, t.layer, t.dtype, "stock")), by.get((t.graph, t.layer, t.dtype, "enabled"))
        else:
            num, den = by.get((t.graph, t.layer, t.dtype, "enabled")), by.get((t.graph, t.layer, "float32", "enabled"))
        res = {"target": t.text, "kind": t.kind, "graph": t.graph, "layer": t.layer, "dtype": t.dtype,
               "bound": t.bound, "value": None}
        a, b = (num or {}).get("step_ms"), (den or {}).get("step_ms")
        if isinstance(a, float) and isinstance(b, float) and b > 0:
            res["value"] = a / b
            ok = res["value"] >= t.bound if t.kind == "speedup" else res["value"] <= t.bound
            res["verdict"] = "met" if ok else "missed"
        elif t.kind == "speedup" and (num or {}).get("status") == OOM and isinstance(b, float):
            res["verdict"] = "met (stock out of memory)"
        else:
            why = [f"{r.get('mode')} {SHORT.get(r.get('dtype'), r.get('dtype'))}: {r.get('status')}"
                   for r in (num, den) if r is not None and not isinstance(r.get("step_ms"), float)]
            if num is None or den is None:
                why.append("config not run")
            res["verdict"] = "not measured (" + "; ".join(why) + ")"
        out.append(res)
    return out


# ----------------------------------------------------------------------------- models
def make_conv(pyg, layer: str, d_in: int, hidden: int, heads: int, attn_dropout: float) -> Tuple[nn.Module, int]:
    """One conv layer of the benchmark models and its output width."""
    if layer == "gatv2":
        return pyg.nn.GATv2Conv(d_in, hidden, heads=heads, dropout=attn_dropout), hidden * heads
    if layer == "transformer":
        return pyg.nn.TransformerConv(d_in, hidden, heads=heads, dropout=attn_dropout), hidden * heads
    if layer == "gcn":
        return pyg.nn.GCNConv(d_in, hidden, cached=True), hidden
    if layer == "sage_max":
        return pyg.nn.SAGEConv(d_in, hidden, aggr="max"), hidden
    raise KeyError(layer)


class Net(nn.Module):
    """``num_layers`` convs with ELU, feature dropout between them, then a linear classifier."""

    def __init__(self, pyg, layer: str, d_in: int, classes: int, hidden: int = 64, heads: int = 4,
                 attn_dropout: float = 0.1, feat_dropout: float = 0.2, num_layers: int = 3):
        super().__init__()
        convs, d = [], d_in
        for _ in range(num_layers):
            conv, d = make_conv(pyg, layer, d, hidden, heads, attn_dropout)
            convs.append(conv)
        self.convs = nn.ModuleList(convs)
        self.head = nn.Linear(d, classes)
        self.feat_dropout = feat_dropout

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        for i, conv in enumerate(self.convs):
            if i:
                x = F.dropout(x, p=self.feat_dropout, training=self.training)
            x = F.elu(conv(x, edge_index))
        return self.head(x)


# ----------------------------------------------------------------------------- one config
def stats_counts(stats) -> Dict[str, object]:
    """``gnn_fastpath.stats()`` summed over layer classes: fused calls by backend and
    fallbacks by reason, e.g. ``{"fused_cuda": 9, "fused_reference": 0, "fallback": {}}``."""
    out: Dict[str, object] = {"fused_cuda": 0, "fused_reference": 0, "fallback": {}}
    for entry in (stats or {}).values():
        if not isinstance(entry, dict):
            continue
        for backend, n in (entry.get("fused") or {}).items():
            key = f"fused_{backend}"
            out[key] = int(out.get(key, 0)) + int(n)
        for reason, n in (entry.get("fallback") or {}).items():
            out["fallback"][reason] = out["fallback"].get(reason, 0) + int(n)
    return out


def path_summary(row: dict) -> str:
    """'cuda 15' / 'reference 15, fallback autocast 15' for a table cell ('' for stock rows)."""
    if row.get("mode") != "enabled" or "fused_cuda" not in row:
        return ""
    bits = [f"{b} {row[f'fused_{b}']}" for b in ("cuda", "reference") if row.get(f"fused_{b}")]
    bits += [f"fallback {k} {v}" for k, v in sorted((row.get("fallback") or {}).items())]
    return ", ".join(bits) or "no patched call"


@dataclass
class Data:
    """One graph's training inputs, on the device."""

    name: str
    edge_index: torch.Tensor
    x: torch.Tensor
    y: torch.Tensor
    num_nodes: int
    meta: dict


def load_data(name: str, device: torch.device, seed: int, scale: float, data_dir=None) -> Data:
    g = G.load(name, data_dir=data_dir, device=device, seed=seed, scale=1.0 if name in G.REAL else scale)
    gen = torch.Generator().manual_seed(seed)
    d_in, classes = IN_FEATURES.get(name, DEFAULT_IN), NUM_CLASSES.get(name, DEFAULT_CLASSES)
    x = torch.randn(g.num_nodes, d_in, generator=gen).to(device)
    y = torch.randint(0, classes, (g.num_nodes,), generator=gen).to(device)
    return Data(name, g.edge_index, x, y, g.num_nodes, dict(g.meta, in_features=d_in, classes=classes))


def _fastpath_context(gf, mode: str, device: torch.device):
    if mode == "stock":
        return contextlib.nullcontext()
    kwargs = {"frameworks": "pyg"}
    if device.type != "cuda":
        kwargs["cpu"] = "reference"  # the shims on the reference ops: what the smoke run checks
    return gf.enabled(**kwargs)


def run_config(make_model: Callable[[], nn.Module], data: Data, dtype: str, mode: str, device: torch.device,
               warmup: int, steps: int, lr: float = 0.01, seed: int = 0, gf=None) -> dict:
    """Time ``steps`` training steps of a fresh ``make_model()`` after ``warmup`` ones.

    Returns the measured fields of a row: ``step_ms`` (median; ``"OOM"`` / ``"error"`` on
    failure), ``step_ms_all``, ``peak_mb``, ``losses``, ``finite_losses``, the stats counts
    (enabled mode) and ``fallback_warnings``; ``status`` is ``ok``, ``OOM`` or ``error: ...``.
    Memory is freed before it returns, whatever happened.
    """
    res: Dict[str, object] = {"step_ms": None, "peak_mb": None, "status": "ok"}
    cuda = device.type == "cuda"
    failure = None
    if gf is not None and mode == "enabled":
        gf.reset_stats()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            _timed_steps(res, make_model, data, dtype, mode, device, warmup, steps, lr, seed, gf)
        except Exception as exc:  # noqa: BLE001 - OOM is a result; other errors are reported
            failure = (is_oom(exc), f"{type(exc).__name__}: {exc}"[:400])
    if failure is not None:  # outside the except block: the traceback's frames (and tensors) are gone
        oom, message = failure
        res["step_ms"] = OOM if oom else "error"
        res["status"] = OOM if oom else f"error: {message}"
    if gf is not None and mode == "enabled":
        res.update(stats_counts(gf.stats()))
    msgs = sorted({str(w.message) for w in caught if "gnn_fastpath" in str(w.message)})
    if msgs:
        res["fallback_warnings"] = msgs[:10]
    if cuda:  # gc.collect costs ~0.3 s with PyG imported: only where memory must come back
        free_memory()
        torch.cuda.reset_peak_memory_stats(device)
    return res


def _timed_steps(res: dict, make_model, data: Data, dtype: str, mode: str, device: torch.device,
                 warmup: int, steps: int, lr: float, seed: int, gf) -> None:
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    model = make_model().to(device).train()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    scaler = torch.amp.GradScaler(device.type) if dtype == "float16" else None
    losses: List[torch.Tensor] = []
    x, ei, y = data.x, data.edge_index, data.y

    def step():
        opt.zero_grad(set_to_none=True)
        with autocast(device, dtype):
            loss = F.cross_entropy(model(x, ei), y)
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        losses.append(loss.detach())  # no host sync inside the timed loop

    torch.manual_seed(seed)  # the same feature-dropout masks for stock and enabled
    with _fastpath_context(gf, mode, device):
        times = time_calls(step, warmup, steps, device)
    values = [float(v) for v in torch.stack(losses[-steps:]).float().cpu()] if steps else []
    res["step_ms"] = statistics.median(times) if times else None
    res["step_ms_all"] = [round(t, 4) for t in times]
    res["losses"] = values
    res["finite_losses"] = all(v == v and abs(v) != float("inf") for v in values)
    if cuda:
        torch.cuda.synchronize(device)
        res["peak_mb"] = (torch.cuda.max_memory_allocated(device) - base) / 2**20


# ----------------------------------------------------------------------------- runner
class TrainRunner:
    def __init__(self, args, device: torch.device, pyg, gf, gf_reason: Optional[str]):
        self.args, self.device, self.pyg, self.gf, self.gf_reason = args, device, pyg, gf, gf_reason
        self.rows: List[dict] = []
        self.graph_info: Dict[str, dict] = {}
        self.env: dict = {}
        self.settings: dict = {}
        self.t0 = time.perf_counter()
        self._data: Optional[Data] = None
        self._weights: Dict[Tuple[str, str], Dict[str, torch.Tensor]] = {}

    def over_budget(self) -> bool:
        b = self.args.time_budget
        return b is not None and time.perf_counter() - self.t0 > b

    def payload(self) -> dict:
        return {"benchmark": "train", "environment": self.env, "settings": self.settings,
                "graphs": list(self.graph_info.values()), "rows": self.rows,
                "targets": evaluate_targets(self.rows)}

    def save(self) -> None:
        payload = self.payload()
        if self.args.json:
            report.write_json(self.args.json, payload)
        if self.args.markdown:
            Path(self.args.markdown).parent.mkdir(parents=True, exist_ok=True)
            Path(self.args.markdown).write_text(markdown(payload))

    def add(self, row: dict) -> None:
        self.rows.append(row)
        keys = ("graph", "layer_key", "dtype", "mode", "step_ms", "peak_mb", "status")
        extra = path_summary(row)
        print("  " + " ".join(f"{k}={fmt(row[k]) if isinstance(row[k], float) else row[k]}"
                              for k in keys if row.get(k) is not None) + (f" path=[{extra}]" if extra else ""),
              flush=True)
        self.save()

    def data(self, name: str) -> Data:
        """The graph's inputs; only one graph is held at a time (peaks stay comparable)."""
        if self._data is not None and self._data.name == name:
            return self._data
        self._data = None
        free_memory()
        a = self.args
        t = time.perf_counter()
        self._data = load_data(name, self.device, a.seed, a.scale, a.data_dir)
        if name not in self.graph_info:
            self.graph_info[name] = dict(self._data.meta, load_s=round(time.perf_counter() - t, 2))
            print(f"{name}: {self._data.num_nodes:,} nodes, {self._data.edge_index.shape[1]:,} edges", flush=True)
        return self._data

    def model_factory(self, data: Data, layer: str) -> Callable[[], nn.Module]:
        """A builder of the (graph, layer) model loaded with weights shared by all its configs."""
        a = self.args

        def build() -> nn.Module:
            return Net(self.pyg, layer, data.x.shape[1], int(data.meta["classes"]), a.hidden, a.heads,
                       a.attn_dropout, a.feat_dropout, a.num_layers)

        key = (data.name, layer)
        if key not in self._weights:
            torch.manual_seed(a.seed)
            self._weights[key] = {k: v.detach().clone() for k, v in build().state_dict().items()}  # CPU

        def make() -> nn.Module:
            model = build()
            model.load_state_dict(self._weights[key])
            return model

        return make

    def run(self, configs: Sequence[Tuple[str, str, str, str]]) -> None:
        a = self.args
        missing: Dict[str, str] = {}
        for gname, layer, dtype, mode in configs:
            row = {"graph": gname, "layer_key": layer, "layer": LAYER_LABELS[layer], "dtype": dtype, "mode": mode}
            if self.over_budget():
                row["status"] = "skipped: time budget"
                self.add(row)
                continue
            if mode == "enabled" and self.gf is None:
                row["status"] = f"skipped: {self.gf_reason}"
                self.add(row)
                continue
            if gname in missing:
                row["status"] = missing[gname]
                self.add(row)
                continue
            try:
                data = self.data(gname)
            except FileNotFoundError as exc:
                print(f"{gname}: {exc}", flush=True)
                missing[gname] = row["status"] = "missing data"
                self.add(row)
                continue
            row.update(nodes=data.num_nodes, edges=int(data.edge_index.shape[1]))
            row.update(run_config(self.model_factory(data, layer), data, dtype, mode, self.device, a.warmup,
                                  a.steps, a.lr, a.seed, self.gf))
            self.add(row)
        self._data = None
        free_memory()


# ----------------------------------------------------------------------------- markdown
def _ms(v) -> str:
    return fmt(v) if v is not None else ""


def _ratio(a, b, suffix="x") -> str:
    if isinstance(a, float) and isinstance(b, float) and b > 0:
        return f"{a / b:.2f}{suffix}"
    return ""


def summary_rows(payload: dict) -> Tuple[List[dict], List[str], List[str]]:
    """One table row per (graph, layer): per dtype stock / enabled step, speedup and peaks,
    and each 16-bit dtype's enabled step over the fp32 enabled step."""
    dtypes = payload.get("settings", {}).get("dtypes") or DTYPE_NAMES
    graphs = payload.get("settings", {}).get("graphs") or GRAPHS
    by = {(r.get("graph"), r.get("layer_key"), r.get("dtype"), r.get("mode")): r for r in payload.get("rows", [])}
    pairs = []
    for r in payload.get("rows", []):
        k = (r.get("graph"), r.get("layer_key"))
        if k not in pairs:
            pairs.append(k)
    pairs.sort(key=lambda k: (graphs.index(k[0]) if k[0] in graphs else 99,
                              LAYERS.index(k[1]) if k[1] in LAYERS else 99))
    cols, heads, out = ["graph", "layer"], ["graph", "layer"], []
    for d in dtypes:
        s = SHORT[d]
        cols += [f"{d}_stock", f"{d}_enabled", f"{d}_x", f"{d}_peak"]
        heads += [f"{s} stock ms", f"{s} enabled ms", f"x {s}", f"{s} peak MB stock / enabled"]
    for d in dtypes:
        if d != "float32" and "float32" in dtypes:
            cols.append(f"{d}_vs_fp32")
            heads.append(f"{SHORT[d]} / fp32 enabled")
    cols += ["path", "notes"]
    heads += ["fused path (enabled, stats)", "notes"]
    for g, l in pairs:
        cell: Dict[str, str] = {"graph": g, "layer": LAYER_LABELS.get(l, l)}
        paths, notes = [], []
        for d in dtypes:
            s, e = by.get((g, l, d, "stock"), {}), by.get((g, l, d, "enabled"), {})
            cell[f"{d}_stock"] = _ms(s.get("step_ms")) if s else ""
            cell[f"{d}_enabled"] = _ms(e.get("step_ms")) if e else ""
            cell[f"{d}_x"] = _ratio(s.get("step_ms"), e.get("step_ms"))
            cell[f"{d}_peak"] = " / ".join(fmt(r.get("peak_mb"), 0) if r.get("peak_mb") is not None else "-"
                                           for r in (s, e)) if (s or e) else ""
            if e and path_summary(e):
                paths.append(f"{SHORT[d]}: {path_summary(e)}")
            for mode, r in (("stock", s), ("enabled", e)):
                st = r.get("status")
                if st and st not in ("ok", OOM):
                    notes.append(f"{mode} {SHORT[d]}: {st[:80]}")
                elif r.get("finite_losses") is False:
                    notes.append(f"{mode} {SHORT[d]}: non-finite loss")
            if d != "float32" and "float32" in dtypes:
                cell[f"{d}_vs_fp32"] = _ratio(e.get("step_ms"), by.get((g, l, "float32", "enabled"), {}).get("step_ms"), "")
        cell["path"] = "; ".join(paths)
        cell["notes"] = "; ".join(notes)
        out.append(cell)
    return out, cols, heads


def targets_table(targets: Sequence[dict]) -> str:
    rows = [{"target": t["target"], "value": "" if t.get("value") is None else
             (f"{t['value']:.2f}x" if t["kind"] == "speedup" else f"{t['value']:.2f}"),
             "verdict": t.get("verdict", "")} for t in targets]
    return report.markdown_table(rows, ["target", "value", "verdict"], ["target (issue 10)", "measured", "verdict"])


def markdown(payload: dict, header: bool = True) -> str:
    """The targets table and the (graph, layer) table; ``header``: title and environment first."""
    st = payload.get("settings", {})
    rows, cols, heads = summary_rows(payload)
    top = ["### Training steps, full batch (PyG stock vs gnn_fastpath.enabled())", "",
           report.env_header(payload.get("environment", {})), ""] if header else []
    return "\n".join(top + [
        f"{st.get('num_layers', 3)} layers ({st.get('hidden')} x {st.get('heads')} heads for GATv2 / Transformer, {st.get('hidden')} wide "
        f"for GCN / SAGE-max), Adam; step = forward + loss + backward + optimizer, median of {st.get('steps')} after "
        f"{st.get('warmup')} warm-ups; 16-bit dtypes under torch.autocast; x = stock / enabled; peak = "
        "max_memory_allocated during the config above what was allocated at its start.", "",
        targets_table(payload.get("targets") or evaluate_targets(payload.get("rows", []))), "",
        report.markdown_table(rows, cols, heads), ""])


# ----------------------------------------------------------------------------- main
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--graphs", default=None, help=f"comma list (default {','.join(GRAPHS)}; CPU: {','.join(CPU_GRAPHS)})")
    p.add_argument("--layers", default=",".join(LAYERS), help="comma list of " + ", ".join(LAYERS))
    p.add_argument("--dtypes", default=",".join(DTYPE_NAMES), help="comma list of float32, bfloat16, float16 "
                                                                  "(16-bit ones run under torch.autocast)")
    p.add_argument("--steps", type=int, default=None, help="timed steps per config (default 12; quick 6)")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps first (default 3; quick 2)")
    p.add_argument("--quick", action="store_true", help="fewer steps (2 warm-ups, 6 timed)")
    p.add_argument("--device", default="auto", help="auto (cuda when available), cuda or cpu")
    p.add_argument("--time-budget", type=float, default=None,
                   help="seconds: start no new config after this; what was measured is written")
    p.add_argument("--json", default=None, help="JSON path (default <out>/bench_train.json)")
    p.add_argument("--markdown", default=None, help="markdown path (default <out>/bench_train.md; '' for none)")
    p.add_argument("--out", default=None, help="results directory (default benchmarks/results/)")
    p.add_argument("--scale", type=float, default=None, help="synthetic graph scale (default 1; CPU: 0.01)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--num-layers", type=int, default=3)
    p.add_argument("--attn-dropout", type=float, default=0.1)
    p.add_argument("--feat-dropout", type=float, default=0.2)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--data-dir", default=None)
    return p.parse_args(argv)


def _fastpath():
    try:
        import gnn_fastpath
    except Exception as exc:  # noqa: BLE001
        return None, f"gnn_fastpath does not import: {type(exc).__name__}: {exc}"
    return gnn_fastpath, None


def main(argv=None) -> int:
    args = parse_args(argv)
    pyg = import_pyg()
    if pyg is None:
        return 0
    if args.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(args.device)
    cpu = device.type != "cuda"
    graphs = [g.strip() for g in args.graphs.split(",") if g.strip()] if args.graphs else (CPU_GRAPHS if cpu else GRAPHS)
    layers = [k.strip() for k in args.layers.split(",") if k.strip()]
    bad = [k for k in layers if k not in LAYERS]
    if bad:
        raise SystemExit(f"unknown layers {bad}; known: {', '.join(LAYERS)}")
    dtypes = parse_dtypes(args.dtypes)
    args.warmup = args.warmup if args.warmup is not None else (2 if args.quick else 3)
    args.steps = args.steps if args.steps is not None else (6 if args.quick else 12)
    if args.steps < 1:
        raise SystemExit("--steps must be at least 1")
    if cpu:
        print("CPU: stock vs enable(cpu='reference') on scaled-down graphs (a smoke run, not a benchmark)", flush=True)
    args.scale = args.scale if args.scale is not None else (CPU_SCALE if cpu else 1.0)
    out_dir = report.out_dir(args.out)
    args.json = str(out_dir / "bench_train.json") if args.json is None else args.json
    args.markdown = str(out_dir / "bench_train.md") if args.markdown is None else args.markdown

    gf, reason = _fastpath()
    runner = TrainRunner(args, device, pyg, gf, reason)
    runner.env = report.environment(None)
    configs = plan(graphs, layers, dtypes)
    runner.settings = {"graphs": graphs, "layers": layers, "dtypes": dtypes, "warmup": args.warmup,
                       "steps": args.steps, "seed": args.seed, "scale": args.scale, "hidden": args.hidden,
                       "heads": args.heads, "num_layers": args.num_layers, "attn_dropout": args.attn_dropout,
                       "feat_dropout": args.feat_dropout, "lr": args.lr, "device": str(device),
                       "time_budget_s": args.time_budget, "quick": args.quick,
                       "order": [list(c) for c in configs]}
    if reason:
        print(f"note: {reason}: stock numbers only", flush=True)
    runner.run(configs)
    runner.settings["elapsed_s"] = round(time.perf_counter() - runner.t0, 1)
    runner.save()
    print()
    print(markdown(runner.payload()), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
