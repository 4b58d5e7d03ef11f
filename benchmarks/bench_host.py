"""Host time per layer call: stock PyG / DGL layers against the same modules under
``gnn_fastpath.enabled()``, on a graph so small that the GPU work of a call is far below the
CPU time of issuing it (the launch-bound regime of sampled mini-batch training).

    python -m benchmarks.bench_host                       # every layer, 1000 calls per measurement
    python -m benchmarks.bench_host --time-budget 50 --calls 2000
    python -m benchmarks.bench_host --layers pyg_gatv2,pyg_gcn --passes fwd
    python -m benchmarks.bench_host --device cpu --calls 20 --warmup 2   # smoke: enable(cpu="reference")
    python -m benchmarks.bench_host --device dry --layers pyg_gatv2      # the fused path's host work on the CPU

A measurement is (layer, mode, pass, graph):

* ``mode``: ``stock`` or ``enabled`` (the same module inside ``gnn_fastpath.enabled(frameworks=...)``;
  on the CPU with ``cpu="reference"`` so the smoke run goes through the shims).
* ``pass``: ``fwd`` = ``conv(x, edge_index)`` (DGL: ``conv(g, x)``) with autograd recording;
  ``fwd_bwd`` = that and ``out.sum().backward()`` (parameter grads accumulate; no optimizer).
  The small-graph rule is off (``GNN_FASTPATH_SMALL_GRAPH=off``): the enabled calls measure
  the fused path, which the rule would otherwise skip on this graph for the aggregations.
* ``graph``: ``same`` = one graph object every call (the fused path's graph caches hit);
  ``new`` = a new graph object every call, from a pool made before timing (PyG: clones of the
  ``edge_index``; DGL: ``dgl.graph`` objects), so every call pays the graph build.

Per measurement, after ``--warmup`` calls: the device is synchronised, ``N`` = ``--calls``
calls are issued back to back with no synchronisation inside the loop, then

* ``host_us`` = (host clock after the last call returned, before synchronising - start) / N:
  the CPU time per call (what the issue's "<= 40 us per fused call" target is about);
* ``wall_us`` = (after the final synchronise - start) / N: host or GPU, whichever bounds;
* ``gpu_us`` = GPU time per call with the host out of the way: ``--gpu-calls`` calls issued
  behind a ``torch.cuda._sleep`` long enough that all of them are queued before the GPU
  reaches them, CUDA events around them. Unmeasurable (``gpu_note``) when issuing them took
  longer than the sleep (e.g. a call that synchronises);
* ``syncs_per_call`` = host-device synchronisations torch reports for one call
  (``torch.cuda.set_sync_debug_mode("warn")``: ``.item()``, ``int(t)``, blocking copies...;
  synchronisations inside CuPy are not seen);
* the fused / fallback counts of ``gnn_fastpath.stats()`` (reset per measurement).

Layers (``--layers``): PyG ``GATv2Conv(F, F, heads=4)``, ``TransformerConv(F, F, heads=4)``,
``GCNConv(F, F)``, ``SAGEConv(F, F)`` with ``aggr="mean"`` and ``"max"``; DGL (when it imports)
``GATv2Conv(F, F, 4)``, ``GraphConv(F, F)``, ``SAGEConv(F, F, "mean" / "pool")``. With DGL's
CPU-only build and a GPU, the DGL graph stays on the CPU (features on the GPU), which only the
fused path runs: stock DGL rows are "not runnable" there. Graph: ``--nodes`` 64, ``--edges``
256 random edges (seeded), ``--features`` F = 16.

``--device dry`` (no GPU needed; PyG layers): the tensors stay on the CPU and the enabled calls
take the fused path's CUDA decisions with their kernel launches recorded and skipped
(:func:`benchmarks.dry.cuda_decisions`): the enabled host time is the fused path's own checks,
plans, work lists, allocations and Python, measured on this CPU; the stock calls compute their
tiny tensors on the CPU. A view of where a fused call's host time goes, and of whether a change
cuts it, for work on the host path without a device; not a GPU machine's numbers (its host runs
CUDA launches, and its CPU differs). A new graph is built as on a GPU (its build kernels
emulated: launches recorded, outputs filled in by the CPU). No target is judged.

Target (issue): host time <= 40 us per fused call, forward, same graph, for every layer.
Results: ``--json`` / ``--markdown`` (default ``benchmarks/results/bench_host.json`` / ``.md``),
rewritten after every measurement.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import time
import warnings
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from . import harness as H
from .dry import cuda_decisions
from .harness import count_syncs, fmt, free_memory, import_dgl, import_pyg, watchdog
from .training import path_summary, stats_counts

TARGET_US = 40.0
LAYERS = ["pyg_gatv2", "pyg_transformer", "pyg_gcn", "pyg_sage_mean", "pyg_sage_max",
          "dgl_gatv2", "dgl_graphconv", "dgl_sage_mean", "dgl_sage_pool"]
LABELS = {"pyg_gatv2": "PyG GATv2Conv", "pyg_transformer": "PyG TransformerConv", "pyg_gcn": "PyG GCNConv",
          "pyg_sage_mean": "PyG SAGEConv(mean)", "pyg_sage_max": "PyG SAGEConv(max)",
          "dgl_gatv2": "DGL GATv2Conv", "dgl_graphconv": "DGL GraphConv", "dgl_sage_mean": "DGL SAGEConv(mean)",
          "dgl_sage_pool": "DGL SAGEConv(pool)"}
PASSES = ("fwd", "fwd_bwd")
GRAPH_MODES = ("same", "new")
MODES = ("stock", "enabled")
DGL_NOT_RUNNABLE = "not runnable (DGL CPU build): the graph stays on the CPU, stock DGL needs it beside the CUDA features"


def framework_of(layer: str) -> str:
    return layer.split("_", 1)[0]


# ----------------------------------------------------------------------------- plan and targets
def plan(layers: Sequence[str], passes: Sequence[str], graphs: Sequence[str]) -> List[Tuple[str, str, str, str]]:
    """Every (layer, mode, pass, graph): the targets' measurements (enabled, fwd, same graph)
    first, then their stock counterparts, then the rest layer by layer."""
    wanted = [(l, m, p, g) for l in layers for p in passes for g in graphs for m in MODES]
    first = [(l, "enabled", "fwd", "same") for l in layers if "fwd" in passes and "same" in graphs]
    first += [(l, "stock", "fwd", "same") for l in layers if "fwd" in passes and "same" in graphs]
    return first + [c for c in wanted if c not in first]


def evaluate_targets(rows: Sequence[dict]) -> List[dict]:
    """Host time per fused forward call (same graph) <= ``TARGET_US`` for each layer measured
    enabled: ``met`` / ``missed`` / ``not measured (...)``, and ``fused`` False when the calls
    did not run fused (a fallback's host time is not the fused path's)."""
    by = {(r.get("layer"), r.get("mode"), r.get("pass"), r.get("graph")): r for r in rows}
    layers = []
    for r in rows:
        if r.get("layer") not in layers:
            layers.append(r.get("layer"))
    out = []
    for layer in layers:
        r = by.get((layer, "enabled", "fwd", "same"))
        if r is None:
            continue
        res = {"target": f"{LABELS.get(layer, layer)}: host time per fused forward call <= {TARGET_US:g} us",
               "layer": layer, "bound_us": TARGET_US, "value": None}
        v = r.get("host_us")
        fused = (r.get("fused_cuda", 0) or 0) + (r.get("fused_reference", 0) or 0)
        if isinstance(v, float):
            res["value"] = v
            if r.get("device") == "dry":
                res["verdict"] = "not measured (dry run: CPU tensors, launches skipped)"
            elif r.get("fallback"):
                res["verdict"] = "not measured (fell back: " + ", ".join(sorted(r["fallback"])) + ")"
            elif not fused:
                res["verdict"] = "not measured (no fused call recorded)"
            elif not r.get("fused_cuda"):
                res["verdict"] = "not measured (reference ops: a CPU smoke run)"
            else:
                res["verdict"] = "met" if v <= TARGET_US else "missed"
        else:
            res["verdict"] = f"not measured ({r.get('status')})"
        out.append(res)
    return out


# ----------------------------------------------------------------------------- layers and graphs
def make_layer(layer: str, pyg, dgl, features: int, heads: int) -> torch.nn.Module:
    f = features
    if layer == "pyg_gatv2":
        return pyg.nn.GATv2Conv(f, f, heads=heads)
    if layer == "pyg_transformer":
        return pyg.nn.TransformerConv(f, f, heads=heads)
    if layer == "pyg_gcn":
        return pyg.nn.GCNConv(f, f)
    if layer == "pyg_sage_mean":
        return pyg.nn.SAGEConv(f, f, aggr="mean")
    if layer == "pyg_sage_max":
        return pyg.nn.SAGEConv(f, f, aggr="max")
    import dgl.nn.pytorch as dglnn

    if layer == "dgl_gatv2":
        return dglnn.GATv2Conv(f, f, num_heads=heads, allow_zero_in_degree=True)
    if layer == "dgl_graphconv":
        return dglnn.GraphConv(f, f, allow_zero_in_degree=True)
    if layer == "dgl_sage_mean":
        return dglnn.SAGEConv(f, f, "mean")
    if layer == "dgl_sage_pool":
        return dglnn.SAGEConv(f, f, "pool")
    raise KeyError(layer)


def tiny_graph(nodes: int, edges: int, seed: int) -> torch.Tensor:
    """A seeded random ``edge_index`` [2, edges] over ``nodes`` nodes (CPU, int64)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, nodes, (2, edges), generator=gen)


class Graphs:
    """Graph objects for the calls: one (``same``) or a new one per call (``new``, from a pool
    made up front; index ``i`` is never reused)."""

    def __init__(self, framework: str, edge_index: torch.Tensor, nodes: int, device: torch.device, dgl=None,
                 dgl_cuda: bool = True):
        self.framework, self.edge_index, self.nodes, self.device = framework, edge_index, nodes, device
        self.dgl, self.dgl_cuda = dgl, dgl_cuda

    def make(self):
        if self.framework == "pyg":
            return self.edge_index.to(self.device, copy=True)
        g = self.dgl.graph((self.edge_index[0], self.edge_index[1]), num_nodes=self.nodes)
        return g.to(self.device) if self.dgl_cuda and self.device.type == "cuda" else g

    def pool(self, n: int) -> list:
        return [self.make() for _ in range(n)]


def dgl_cuda_ok(dgl, device: torch.device) -> bool:
    if device.type != "cuda":
        return True
    try:
        dgl.graph(([0], [0])).to(device)
        return True
    except Exception:  # noqa: BLE001
        return False


# ----------------------------------------------------------------------------- timing
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


_CYCLES_PER_MS: Dict[str, float] = {}


def cycles_per_ms(device: torch.device) -> float:
    """Clock cycles of ``torch.cuda._sleep`` per millisecond on ``device`` (measured once)."""
    key = str(device)
    if key not in _CYCLES_PER_MS:
        cycles = 20_000_000
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        _sync(device)
        s.record()
        torch.cuda._sleep(cycles)
        e.record()
        e.synchronize()
        _CYCLES_PER_MS[key] = cycles / max(s.elapsed_time(e), 1e-3)
    return _CYCLES_PER_MS[key]


def gpu_time_per_call(call: Callable[[int], None], start: int, n: int, device: torch.device,
                      host_us_hint: float) -> Tuple[Optional[float], Optional[str]]:
    """GPU microseconds per call with the host out of the way: ``n`` calls issued behind a GPU
    sleep longer than issuing them takes, so the GPU runs them back to back; CUDA events
    around them. (None, why) when issuing took longer than the sleep (the GPU caught up with
    the host, e.g. at a synchronising call)."""
    sleep_ms = max(5.0, 4.0 * n * host_us_hint / 1e3)
    _sync(device)
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(int(sleep_ms * cycles_per_ms(device)))
    s.record()
    h0 = time.perf_counter()
    for i in range(n):
        call(start + i)
    issue_ms = (time.perf_counter() - h0) * 1e3
    e.record()
    e.synchronize()
    if issue_ms >= 0.8 * sleep_ms:
        return None, (f"issuing {n} calls took {issue_ms:.1f} ms, longer than the {sleep_ms:.1f} ms GPU sleep "
                      "(a synchronising call, or a full launch queue)")
    return s.elapsed_time(e) * 1e3 / n, None


def measure(call: Callable[[int], None], n: int, warmup: int, device: torch.device, gpu_calls: int,
            clock: Callable[[], float] = time.perf_counter, repeats: int = 1) -> dict:
    """Time ``call(i)`` for ``i`` = 0.. (see the module docstring). ``call`` uses index ``i``
    to pick its graph, so a pool serves each index once: warm-up, ``repeats`` x ``n`` timed
    calls (the fastest window is kept), the sync count (one call) and ``gpu_calls`` more for
    the GPU time. ``clock``: the host clock (a dry run's stops while the CPU stands in for the
    GPU's build kernels)."""
    i = 0
    for _ in range(warmup):
        call(i)
        i += 1
    host = wall = None
    for _ in range(repeats):
        _sync(device)
        t0 = clock()
        for _ in range(n):
            call(i)
            i += 1
        t1 = clock()
        _sync(device)
        t2 = clock()
        if host is None or t1 - t0 < host:
            host, wall = t1 - t0, t2 - t0
    res = {"calls": n, "host_us": host * 1e6 / n, "wall_us": wall * 1e6 / n, "gpu_us": None}
    if repeats > 1:
        res["repeats"] = repeats
    if device.type == "cuda":  # diagnostics: a failure here must not cost the host time
        try:
            res["syncs_per_call"] = count_syncs(lambda: call(i), device)
        except Exception as exc:  # noqa: BLE001
            res["syncs_note"] = f"{type(exc).__name__}: {exc}"[:200]
        i += 1
        if gpu_calls > 0:
            try:
                res["gpu_us"], note = gpu_time_per_call(call, i, gpu_calls, device, res["host_us"])
            except Exception as exc:  # noqa: BLE001
                note = f"{type(exc).__name__}: {exc}"[:200]
            if note:
                res["gpu_note"] = note
    return res


def pool_size(n: int, warmup: int, gpu_calls: int, repeats: int = 1) -> int:
    return warmup + n * repeats + 1 + gpu_calls


# ----------------------------------------------------------------------------- runner
class HostRunner:
    def __init__(self, args, device: torch.device, pyg, dgl, gf, gf_reason: Optional[str], dry: bool = False):
        self.args, self.device, self.pyg, self.dgl, self.gf, self.gf_reason = args, device, pyg, dgl, gf, gf_reason
        self.dry = dry  # CPU tensors on the fused path's CUDA decisions (module docstring)
        self.dgl_cuda = dgl_cuda_ok(dgl, device) if dgl is not None else False
        self.rows: List[dict] = []
        self.env: dict = {}
        self.settings: dict = {}
        self.t0 = time.perf_counter()
        self.edge_index = tiny_graph(args.nodes, args.edges, args.seed)
        gen = torch.Generator().manual_seed(args.seed + 1)
        self.x = torch.randn(args.nodes, args.features, generator=gen).to(device)
        self._modules: Dict[str, torch.nn.Module] = {}

    def over_budget(self) -> bool:
        b = self.args.time_budget
        return b is not None and time.perf_counter() - self.t0 > b

    def payload(self) -> dict:
        return {"benchmark": "host", "environment": self.env, "settings": self.settings, "rows": self.rows,
                "targets": evaluate_targets(self.rows)}

    def save(self) -> None:
        payload = self.payload()
        if self.args.json:
            H.write_json(self.args.json, payload)
        if self.args.markdown:
            Path(self.args.markdown).parent.mkdir(parents=True, exist_ok=True)
            Path(self.args.markdown).write_text(markdown(payload))

    def add(self, row: dict) -> None:
        self.rows.append(row)
        keys = ("layer", "mode", "pass", "graph", "host_us", "gpu_us", "wall_us", "syncs_per_call", "status")
        extra = path_summary(row)
        print("  " + " ".join(f"{k}={fmt(row[k]) if isinstance(row[k], float) else row[k]}"
                              for k in keys if row.get(k) is not None) + (f" path=[{extra}]" if extra else ""),
              flush=True)
        self.save()

    def module(self, layer: str) -> torch.nn.Module:
        """One module per layer (same weights for stock and enabled)."""
        if layer not in self._modules:
            torch.manual_seed(self.args.seed)
            self._modules[layer] = make_layer(layer, self.pyg, self.dgl, self.args.features,
                                              self.args.heads).to(self.device).train()
        return self._modules[layer]

    @contextlib.contextmanager
    def context(self, mode: str, framework: str):
        """The mode's context; yields the host clock to time with."""
        if mode == "stock":
            yield time.perf_counter
        elif self.dry:
            with cuda_decisions() as rec, self.gf.enabled(frameworks=framework):
                yield rec.host_clock
        else:
            kwargs = {"frameworks": framework}
            if self.device.type != "cuda":
                kwargs["cpu"] = "reference"
            with self.gf.enabled(**kwargs):
                yield time.perf_counter

    def skip_reason(self, layer: str, mode: str) -> Optional[str]:
        fw = framework_of(layer)
        if fw == "pyg" and self.pyg is None:
            return "skipped: PyG does not import"
        if fw == "dgl" and self.dgl is None:
            return "skipped: DGL does not import"
        if fw == "dgl" and self.dry:
            return "skipped: dry runs cover the PyG layers"
        if mode == "enabled" and self.gf is None:
            return f"skipped: {self.gf_reason}"
        if fw == "dgl" and mode == "stock" and self.device.type == "cuda" and not self.dgl_cuda:
            return DGL_NOT_RUNNABLE
        return None

    def run(self, configs: Sequence[Tuple[str, str, str, str]]) -> None:
        a = self.args
        for layer, mode, pas, gmode in configs:
            row = {"layer": layer, "label": LABELS[layer], "framework": framework_of(layer), "mode": mode,
                   "pass": pas, "graph": gmode, "status": "ok"}
            if self.dry:
                row["device"] = "dry"
            reason = "skipped: time budget" if self.over_budget() else self.skip_reason(layer, mode)
            if reason:
                row["status"] = reason
                self.add(row)
                continue
            self.settings["running"] = [layer, mode, pas, gmode]  # where a hang happened, if one does
            self.save()
            with watchdog(a.config_timeout):
                row.update(self.measure_one(layer, mode, pas, gmode))
            self.settings.pop("running", None)
            self.add(row)

    def measure_one(self, layer: str, mode: str, pas: str, gmode: str) -> dict:
        a, device, fw = self.args, self.device, framework_of(layer)
        conv = self.module(layer)
        graphs = Graphs(fw, self.edge_index, a.nodes, device, self.dgl, self.dgl_cuda)
        gpu_calls = a.gpu_calls if device.type == "cuda" else 0
        pool = [graphs.make()] if gmode == "same" else graphs.pool(pool_size(a.calls, a.warmup, gpu_calls, a.repeats))
        x = self.x
        backward = pas == "fwd_bwd"

        def call(i: int) -> None:
            g = pool[i % len(pool)]
            out = conv(x, g) if fw == "pyg" else conv(g, x)
            if isinstance(out, tuple):
                out = out[0]
            if backward:
                out.sum().backward()

        res: Dict[str, object] = {}
        if self.gf is not None:
            self.gf.reset_stats()
        failure = None
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                with torch.enable_grad(), self.context(mode, fw) as clock:
                    res.update(measure(call, a.calls, a.warmup, device, gpu_calls, clock, a.repeats))
            except Exception as exc:  # noqa: BLE001 - reported in the row
                failure = f"{type(exc).__name__}: {exc}"[:300]
        if failure is not None:
            res["status"] = f"error: {failure}"
        if mode == "enabled" and self.gf is not None:
            res.update(stats_counts(self.gf.stats()))
            res["backend"] = "cuda" if res.get("fused_cuda") else ("reference" if res.get("fused_reference") else None)
        msgs = sorted({str(w.message) for w in caught if "gnn_fastpath" in str(w.message)})
        if msgs:
            res["fallback_warnings"] = msgs[:5]
        for p in conv.parameters():
            p.grad = None
        pool.clear()  # the new graphs (and what the caches hold for them) go now
        if gmode == "new" and device.type == "cuda":
            free_memory()
        return res


# ----------------------------------------------------------------------------- markdown
def _us(v) -> str:
    return fmt(v, 1) if isinstance(v, float) else ("" if v is None else str(v))


def table_rows(payload: dict) -> Tuple[List[dict], List[str], List[str]]:
    """One row per (layer, pass, graph): stock and enabled host / GPU time per call."""
    rows = payload.get("rows", [])
    by = {(r.get("layer"), r.get("pass"), r.get("graph"), r.get("mode")): r for r in rows}
    keys = []
    for r in rows:
        k = (r.get("layer"), r.get("pass"), r.get("graph"))
        if k not in keys:
            keys.append(k)
    keys.sort(key=lambda k: (LAYERS.index(k[0]) if k[0] in LAYERS else 99, PASSES.index(k[1]) if k[1] in PASSES else 9,
                             GRAPH_MODES.index(k[2]) if k[2] in GRAPH_MODES else 9))
    out = []
    for layer, pas, gmode in keys:
        s, e = by.get((layer, pas, gmode, "stock"), {}), by.get((layer, pas, gmode, "enabled"), {})
        notes = []
        for mode, r in (("stock", s), ("enabled", e)):
            st = r.get("status")
            if st and st != "ok":
                notes.append(f"{mode}: {st[:90]}")
            if r.get("gpu_note"):
                notes.append(f"{mode} GPU time: {r['gpu_note'][:90]}")
        sh, eh = s.get("host_us"), e.get("host_us")
        verdict = ""
        if pas == "fwd" and gmode == "same" and e.get("device") == "dry":
            verdict = "- (dry run)"
        elif pas == "fwd" and gmode == "same" and isinstance(eh, float) and e.get("fused_cuda") and not e.get("fallback"):
            verdict = "met" if eh <= TARGET_US else "missed"
        elif pas == "fwd" and gmode == "same" and e.get("fused_reference"):
            verdict = "- (reference ops)"
        out.append({"layer": LABELS.get(layer, layer), "pass": "fwd+bwd" if pas == "fwd_bwd" else pas,
                    "graph": "new each call" if gmode == "new" else "same",
                    "sh": _us(sh), "sg": _us(s.get("gpu_us")), "eh": _us(eh), "eg": _us(e.get("gpu_us")),
                    "ew": _us(e.get("wall_us")),
                    "x": f"{sh / eh:.2f}x" if isinstance(sh, float) and isinstance(eh, float) and eh > 0 else "",
                    "syncs": "" if e.get("syncs_per_call") is None else str(e["syncs_per_call"]),
                    "ssyncs": "" if s.get("syncs_per_call") is None else str(s["syncs_per_call"]),
                    "target": verdict, "path": path_summary(e), "notes": "; ".join(notes)})
    cols = ["layer", "pass", "graph", "sh", "sg", "eh", "eg", "ew", "x", "ssyncs", "syncs", "target", "path", "notes"]
    heads = ["layer", "pass", "graph", "stock host us/call", "stock GPU us/call", "enabled host us/call",
             "enabled GPU us/call", "enabled wall us/call", "x host (stock / enabled)", "stock syncs/call",
             "enabled syncs/call", f"<= {TARGET_US:g} us (fwd, same graph)", "fused path", "notes"]
    return out, cols, heads


def targets_table(targets: Sequence[dict]) -> str:
    rows = [{"target": t["target"], "value": "" if t.get("value") is None else f"{t['value']:.1f} us",
             "verdict": t.get("verdict", "")} for t in targets]
    return H.markdown_table(rows, ["target", "value", "verdict"], ["target (host time)", "measured", "verdict"])


def markdown(payload: dict, header: bool = True) -> str:
    st = payload.get("settings", {})
    rows, cols, heads = table_rows(payload)
    top = ["### Host time per layer call (stock vs gnn_fastpath.enabled())", "",
           H.env_header(payload.get("environment", {})), ""] if header else []
    return "\n".join(top + [
        f"Graph: {st.get('nodes')} nodes, {st.get('edges')} random edges, {st.get('features')} features "
        f"({st.get('heads')} heads for the attention layers); {st.get('calls')} calls per measurement after "
        f"{st.get('warmup')} warm-ups" + (f", the fastest of {st['repeats']} such windows" if (st.get("repeats") or 1) > 1
                                         else "") + ", no synchronisation inside the loop. host = CPU time per call (clock before the "
        "final synchronise); wall = with it; GPU = per call with the host out of the way (calls queued behind a GPU "
        f"sleep, {st.get('gpu_calls')} calls); syncs = host-device synchronisations torch reports for one call. "
        "'new each call' = a new graph object per call (graph build included)." + (
            " Dry run: CPU tensors; the enabled calls take the fused path's CUDA decisions with their launches "
            "skipped (its host work on this CPU), the stock calls compute on the CPU." if st.get("device") == "dry"
            else ""), "",
        targets_table(payload.get("targets") or evaluate_targets(payload.get("rows", []))), "",
        H.markdown_table(rows, cols, heads), ""])


# ----------------------------------------------------------------------------- main
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", default=",".join(LAYERS), help="comma list of " + ", ".join(LAYERS))
    p.add_argument("--passes", default=",".join(PASSES), help="comma list of fwd, fwd_bwd")
    p.add_argument("--graphs", default=",".join(GRAPH_MODES), help="comma list of same, new")
    p.add_argument("--calls", type=int, default=None, help="timed calls per measurement (default 1000; CPU 50)")
    p.add_argument("--warmup", type=int, default=None, help="untimed calls first (default 50; CPU 3)")
    p.add_argument("--gpu-calls", type=int, default=16, help="calls queued behind a GPU sleep for the GPU time")
    p.add_argument("--repeats", type=int, default=None,
                   help="timed windows of --calls calls per measurement, the fastest kept (default 1; dry 5: a "
                        "shared CPU's noise)")
    p.add_argument("--nodes", type=int, default=64)
    p.add_argument("--edges", type=int, default=256)
    p.add_argument("--features", type=int, default=16)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto",
                   help="auto (cuda when available), cuda, cpu, or dry (CPU tensors on the fused path's CUDA "
                        "decisions, launches skipped: see the module docstring)")
    p.add_argument("--time-budget", type=float, default=None,
                   help="seconds: start no new measurement after this; what was measured is written")
    p.add_argument("--config-timeout", type=float, default=60.0,
                   help="seconds one measurement may take before every thread's traceback is printed and the "
                        "process exits (0: off; default 60)")
    p.add_argument("--json", default=None, help="JSON path (default <out>/bench_host.json)")
    p.add_argument("--markdown", default=None, help="markdown path (default <out>/bench_host.md; '' for none)")
    p.add_argument("--out", default=None, help="results directory (default benchmarks/results/)")
    return p.parse_args(argv)


def _split(text: str, known: Sequence[str], option: str) -> List[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in items if t not in known]
    if bad or not items:
        raise SystemExit(f"{option}: unknown {bad or text!r}; known: {', '.join(known)}")
    return items


def main(argv=None) -> int:
    args = parse_args(argv)
    # The question is the fused path's own host time: on this tiny graph the small-graph rule
    # would send the aggregation layers to stock (integrations/small_graph.py).
    os.environ["GNN_FASTPATH_SMALL_GRAPH"] = "off"
    layers = _split(args.layers, LAYERS, "--layers")
    passes = _split(args.passes, PASSES, "--passes")
    graph_modes = _split(args.graphs, GRAPH_MODES, "--graphs")
    dry = args.device == "dry"
    device = torch.device("cpu" if dry else ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto"
                          else args.device)
    cpu = device.type != "cuda"
    args.calls = args.calls if args.calls is not None else (300 if dry else 50 if cpu else 1000)
    args.warmup = args.warmup if args.warmup is not None else (50 if dry else 3 if cpu else 50)
    args.repeats = args.repeats if args.repeats is not None else (5 if dry else 1)
    if args.calls < 1 or args.repeats < 1:
        raise SystemExit("--calls and --repeats must be at least 1")
    if dry:
        print("dry: stock on the CPU vs the fused path's host work (CUDA decisions, launches skipped)", flush=True)
    elif cpu:
        print("CPU: stock vs enable(cpu='reference') (a smoke run: host time there includes the compute)", flush=True)
    pyg = import_pyg() if any(framework_of(l) == "pyg" for l in layers) else None
    dgl = None
    if any(framework_of(l) == "dgl" for l in layers):
        dgl = import_dgl()
        if dgl is None:
            print("note: DGL does not import; DGL rows are skipped", flush=True)
    try:
        import gnn_fastpath as gf
        reason = None
    except Exception as exc:  # noqa: BLE001
        gf, reason = None, f"gnn_fastpath does not import: {type(exc).__name__}: {exc}"
        print(f"note: {reason}: stock numbers only", flush=True)
    out_dir = H.out_dir(args.out)
    args.json = str(out_dir / "bench_host.json") if args.json is None else args.json
    args.markdown = str(out_dir / "bench_host.md") if args.markdown is None else args.markdown

    runner = HostRunner(args, device, pyg, dgl, gf, reason, dry=dry)
    runner.env = H.environment(None)
    configs = plan(layers, passes, graph_modes)
    runner.settings = {"layers": layers, "passes": passes, "graphs": graph_modes, "calls": args.calls,
                       "warmup": args.warmup, "repeats": args.repeats, "gpu_calls": args.gpu_calls if not cpu else 0, "nodes": args.nodes,
                       "edges": args.edges, "features": args.features, "heads": args.heads, "seed": args.seed,
                       "device": "dry" if dry else str(device), "time_budget_s": args.time_budget, "target_us": TARGET_US,
                       "dgl_graph_on": None if dgl is None else ("device" if runner.dgl_cuda else "cpu"),
                       "order": [list(c) for c in configs]}
    runner.run(configs)
    runner.settings["elapsed_s"] = round(time.perf_counter() - runner.t0, 1)
    runner.save()
    print()
    print(markdown(runner.payload()), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
