"""Training steps for the training benchmarks (``bench_train_full``, ``bench_train_sampled``,
``bench_compile``) and ``bench_tuning``: the models, one graph's inputs, a timed full-batch
config, torch.compile's bookkeeping, and the runner they share (rows, JSON and markdown
rewritten after every config, the time budget, a watchdog per config).

A config is (graph, layer, dtype, mode). Each builds a 3-layer model (the configuration of
``../shared/docs/baselines.md``, "Training steps"), loads the initial weights every config of
that (graph, layer) shares (one ``state_dict``, so stock and enabled start from the same
parameters), makes a fresh Adam, and times steps

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
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import time
import warnings
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from . import graphs as G
from . import harness as H
from .harness import OOM, autocast, fmt, free_memory, is_oom, time_calls, watchdog

GRAPHS = ["tolokers", "arxiv-like", "pokec-like"]

CPU_GRAPHS = ["arxiv-like"]

CPU_SCALE = 0.01

LAYERS = ["gatv2", "transformer", "gat", "gcn", "sage_max"]

LAYER_LABELS = {"gatv2": "GATv2Conv x3", "transformer": "TransformerConv x3", "gat": "GATConv x3", "gcn": "GCNConv x3",
                "sage_max": "SAGEConv(max) x3"}

DTYPE_NAMES = ["float32", "bfloat16"]

MODES = ("stock", "enabled")

#: Input feature width and classes per graph (tolokers: 10 features, 2 classes; arxiv: 128 / 40;
#: pokec: 65 / 2, as in the real data sets); other graphs get the defaults.
IN_FEATURES = {"tolokers": 10, "arxiv-like": 128, "pokec-like": 65}

NUM_CLASSES = {"tolokers": 2, "arxiv-like": 40, "pokec-like": 2}

DEFAULT_IN, DEFAULT_CLASSES = 64, 8
#: ``--compile`` modes: ``none`` (eager: the rows every run has) and torch.compile's modes.
COMPILE_MODES = ("none", "default", "reduce-overhead")

#: Steps before the timed loop of a compiled row (``--compile-warmup``): trace and compile the
#: forward (1), compile the backward (lazily, at the first backward), and under reduce-overhead
#: run CUDA-graph trees' warm-up (call 1), then record (call 2); from call 3 on every step replays.
COMPILE_WARMUP = 3


# ----------------------------------------------------------------------------- models
def make_conv(pyg, layer: str, d_in: int, hidden: int, heads: int, attn_dropout: float,
              gcn_cached: bool = True) -> Tuple[nn.Module, int]:
    """One conv layer of the benchmark models and its output width (``gcn_cached=False`` for
    sampled mini-batches: every batch is another graph)."""
    if layer == "gatv2":
        return pyg.nn.GATv2Conv(d_in, hidden, heads=heads, dropout=attn_dropout), hidden * heads
    if layer == "transformer":
        return pyg.nn.TransformerConv(d_in, hidden, heads=heads, dropout=attn_dropout), hidden * heads
    if layer == "gat":
        return pyg.nn.GATConv(d_in, hidden, heads=heads, dropout=attn_dropout), hidden * heads
    if layer == "gcn":
        return pyg.nn.GCNConv(d_in, hidden, cached=gcn_cached), hidden
    if layer == "sage_max":
        return pyg.nn.SAGEConv(d_in, hidden, aggr="max"), hidden
    raise KeyError(layer)


class Net(nn.Module):
    """``num_layers`` convs with ELU, feature dropout between them, then a linear classifier."""

    def __init__(self, pyg, layer: str, d_in: int, classes: int, hidden: int = 64, heads: int = 4,
                 attn_dropout: float = 0.1, feat_dropout: float = 0.2, num_layers: int = 3, gcn_cached: bool = True):
        super().__init__()
        convs, d = [], d_in
        for _ in range(num_layers):
            conv, d = make_conv(pyg, layer, d, hidden, heads, attn_dropout, gcn_cached)
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
    bits += [f"compiled {k} {v}" for k, v in sorted((row.get("compiled_calls") or {}).items())]
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


def _fastpath_context(gf, mode: str, device: torch.device, frameworks: str = "pyg"):
    if mode == "stock":
        return contextlib.nullcontext()
    kwargs = {"frameworks": frameworks}
    if device.type != "cuda":
        kwargs["cpu"] = "reference"  # the shims on the reference ops: what the smoke run checks
    return gf.enabled(**kwargs)


def run_config(make_model: Callable[[], nn.Module], data: Data, dtype: str, mode: str, device: torch.device,
               warmup: int, steps: int, lr: float = 0.01, seed: int = 0, gf=None, compile_mode: Optional[str] = None,
               compile_backend: str = "inductor", compile_warmup: int = COMPILE_WARMUP) -> dict:
    """Time ``steps`` training steps of a fresh ``make_model()`` after ``warmup`` ones.

    Returns the measured fields of a row: ``step_ms`` (median; ``"OOM"`` / ``"error"`` on
    failure), ``step_ms_all``, ``peak_mb``, ``losses``, ``finite_losses``, the stats counts
    (enabled mode) and ``fallback_warnings``; ``status`` is ``ok``, ``OOM`` or ``error: ...``.
    ``compile_mode`` (``default`` / ``reduce-overhead``): the model runs as
    ``torch.compile(model, mode=..., dynamic=None)``, ``compile_warmup`` warm-up steps, and the
    row gets the :func:`compile_fields` (dynamo's caches are reset before and after).
    Memory is freed before it returns, whatever happened.
    """
    res: Dict[str, object] = {"step_ms": None, "peak_mb": None, "status": "ok"}
    cuda = device.type == "cuda"
    compiled = compile_mode not in (None, "none")
    failure = None
    if gf is not None and mode == "enabled":
        gf.reset_stats()
    if compiled:
        _dynamo_reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            _timed_steps(res, make_model, data, dtype, mode, device, compile_warmup if compiled else warmup, steps,
                         lr, seed, gf, compile_mode if compiled else None, compile_backend)
        except Exception as exc:  # noqa: BLE001 - OOM is a result; other errors are reported
            failure = (is_oom(exc), f"{type(exc).__name__}: {exc}"[:400])
    if failure is not None:  # outside the except block: the traceback's frames (and tensors) are gone
        oom, message = failure
        res["step_ms"] = OOM if oom else "error"
        res["status"] = OOM if oom else f"error: {message}"
    if gf is not None and mode == "enabled":
        res.update(stats_counts(gf.stats()))
        if compiled:
            res["compiled_calls"] = compiled_counts(gf.stats())
    if compiled:
        _dynamo_reset()  # frees the CUDA-graph pools too; no compile cache reaches the next row
    msgs = sorted({str(w.message) for w in caught if "gnn_fastpath" in str(w.message)})
    if msgs:
        res["fallback_warnings"] = msgs[:10]
    if cuda:  # gc.collect costs ~0.3 s with PyG imported: only where memory must come back
        free_memory()
        torch.cuda.reset_peak_memory_stats(device)
    return res



def start_steps(make_model, device: torch.device, dtype: str, lr: float):
    """The start of a timed training run: (memory allocated before it, for the peak; the model
    built on ``device`` in training mode; its Adam; a GradScaler for float16, else None)."""
    base = 0
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    model = make_model().to(device).train()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    scaler = torch.amp.GradScaler(device.type) if dtype == "float16" else None
    return base, model, opt, scaler

def _timed_steps(res: dict, make_model, data: Data, dtype: str, mode: str, device: torch.device,
                 warmup: int, steps: int, lr: float, seed: int, gf, compile_mode: Optional[str] = None,
                 compile_backend: str = "inductor") -> None:
    cuda = device.type == "cuda"
    base, model, opt, scaler = start_steps(make_model, device, dtype, lr)
    losses: List[torch.Tensor] = []
    x, ei, y = data.x, data.edge_index, data.y
    forward = compile_model(model, compile_mode, compile_backend) if compile_mode else model
    # reduce-overhead: CUDA-graph trees start a new generation at a compiled call with no
    # backward pending, which holds here; marking each step makes it explicit (and safe should
    # a graph break leave a tail graph whose outputs outlive the step)
    mark = compile_mode == "reduce-overhead" and compile_backend == "inductor"

    def step():
        if mark:
            torch.compiler.cudagraph_mark_step_begin()
        opt.zero_grad(set_to_none=True)
        with autocast(device, dtype):
            loss = F.cross_entropy(forward(x, ei), y)
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
        if compile_mode:
            with CompileWatch() as watch:
                snaps = [watch.snapshot()]
                _sync(device)
                t0 = time.perf_counter()
                for i in range(warmup):  # compile (and recompile, record CUDA graphs) until the timed loop
                    step()
                    if i == 0:
                        snaps.append(watch.snapshot())
                _sync(device)
                compile_s = time.perf_counter() - t0
                if len(snaps) == 1:
                    snaps.append(watch.snapshot())
                snaps.append(watch.snapshot())
                times = time_calls(step, 0, steps, device)
                snaps.append(watch.snapshot())
                res.update(compile_fields(watch, *snaps, compile_s=compile_s, warmup=warmup))
        else:
            times = time_calls(step, warmup, steps, device)
    values = [float(v) for v in torch.stack(losses[-steps:]).float().cpu()] if steps else []
    res["step_ms"] = statistics.median(times) if times else None
    res["step_ms_all"] = [round(t, 4) for t in times]
    res["losses"] = values
    res["finite_losses"] = all(v == v and abs(v) != float("inf") for v in values)
    if cuda:
        torch.cuda.synchronize(device)
        res["peak_mb"] = (torch.cuda.max_memory_allocated(device) - base) / 2**20


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ----------------------------------------------------------------------------- torch.compile
def parse_compile_modes(text: Optional[str]) -> List[str]:
    """``--compile``: a comma list of ``COMPILE_MODES`` -> the torch.compile modes to measure,
    in the order given, without ``none`` (eager rows always run) and without repeats."""
    out: List[str] = []
    for t in (text or "none").split(","):
        t = t.strip()
        if not t:
            continue
        if t not in COMPILE_MODES:
            raise SystemExit(f"--compile: unknown mode {t!r}; known: {', '.join(COMPILE_MODES)}")
        if t != "none" and t not in out:
            out.append(t)
    return out


def is_compiled(row: dict) -> bool:
    """A row measured under torch.compile (eager rows have no ``compile`` key, as before)."""
    return row.get("compile") not in (None, "none")


def compile_model(model: nn.Module, mode: str, backend: str = "inductor", dynamic: Optional[bool] = None):
    """``torch.compile(model, mode=mode, dynamic=dynamic)``; a backend other than inductor takes
    no mode (``--compile-backend``, for smoke runs)."""
    if backend == "inductor":
        return torch.compile(model, mode=mode, dynamic=dynamic)
    return torch.compile(model, backend=backend, dynamic=dynamic)


class CompileWatch:
    """What torch.compile does during a config, read as differences of :meth:`snapshot`:

    * ``compiles``: dynamo frame compilations (compiles and recompiles; ``torch._dynamo``'s
      compile callback, else ``counters["frames"]["total"]``), ``backward_compiles``: AOTAutograd's
      lazy backward compilations, ``cudagraph_records``: CUDA graphs recorded by reduce-overhead
      (the callback only; None without it);
    * ``graph_breaks`` (``counters["graph_break"]`` summed; ``break_reasons`` by message),
      ``cudagraph_skips`` (reduce-overhead ran a graph without CUDA graphs), FX graph cache
      hits / misses (a hit makes the compile time a warm-cache one).
    """

    def __init__(self):
        self.events = {"compiles": 0, "backward_compiles": 0, "cudagraph_records": 0}
        self.callback_ok = False
        self._cb = None

    def __enter__(self) -> "CompileWatch":
        try:
            from torch._dynamo.callback import CallbackTrigger, callback_handler

            names = {CallbackTrigger.DYNAMO: "compiles", CallbackTrigger.LAZY_BACKWARD: "backward_compiles",
                     getattr(CallbackTrigger, "CUDAGRAPH_RECORDING", None): "cudagraph_records"}

            def cb(args) -> None:
                name = names.get(getattr(args, "callback_trigger", None))
                if name:
                    self.events[name] += 1

            callback_handler.register_start_callback(cb)
            self._cb, self.callback_ok = cb, True
        except Exception:  # noqa: BLE001 - an internal API: counters still say most of it
            self._cb, self.callback_ok = None, False
        return self

    def __exit__(self, *exc) -> None:
        if self._cb is not None:
            try:
                from torch._dynamo.callback import callback_handler

                callback_handler.remove_start_callback(self._cb)
            except Exception:  # noqa: BLE001 - torch._dynamo.reset() clears it anyway
                pass
            self._cb = None

    def snapshot(self) -> dict:
        from torch._dynamo.utils import counters

        snap = {"frames": int(counters["frames"]["total"]), "graph_breaks": int(sum(counters["graph_break"].values())),
                "break_reasons": dict(counters["graph_break"]),
                "cudagraph_skips": int(counters["inductor"]["cudagraph_skips"]),
                "fx_cache_hit": int(counters["inductor"]["fxgraph_cache_hit"]),
                "fx_cache_miss": int(counters["inductor"]["fxgraph_cache_miss"])}
        snap.update(self.events)
        return snap

    def compiles(self, a: dict, b: dict) -> dict:
        """Compilations between snapshots ``a`` and ``b``."""
        frames = b["compiles"] - a["compiles"] if self.callback_ok else b["frames"] - a["frames"]
        return {"frames": frames, "backward": b["backward_compiles"] - a["backward_compiles"],
                "cudagraph_records": b["cudagraph_records"] - a["cudagraph_records"] if self.callback_ok else None}

    @staticmethod
    def breaks(a: dict, b: dict) -> Tuple[int, Dict[str, int]]:
        """Graph breaks between two snapshots and their reasons (first line of each message)."""
        reasons: Dict[str, int] = {}
        for k, v in b["break_reasons"].items():
            d = int(v) - int(a["break_reasons"].get(k, 0))
            if d > 0:
                line = str(k).strip().splitlines()[0][:160] if str(k).strip() else "?"
                reasons[line] = reasons.get(line, 0) + d
        return b["graph_breaks"] - a["graph_breaks"], reasons


def compile_fields(watch: CompileWatch, s0: dict, s1: dict, s2: dict, s3: dict, compile_s: float,
                   warmup: int) -> dict:
    """The per-row compile fields from snapshots at the start (``s0``), after the first step
    (``s1``), after the warm-up (``s2``) and after the timed steps (``s3``)."""
    breaks, reasons = watch.breaks(s0, s1)
    timed = watch.compiles(s2, s3)
    out = {"compile_s": compile_s, "compile_warmup": warmup, "graph_breaks": breaks,
           "graph_break_reasons": dict(sorted(reasons.items(), key=lambda kv: -kv[1])[:5]),
           "compiles_warmup": watch.compiles(s0, s2), "compiles_timed": timed,
           "recompiles": timed["frames"] + timed["backward"], "cudagraph_records_timed": timed["cudagraph_records"],
           "graph_breaks_timed": s3["graph_breaks"] - s2["graph_breaks"],
           "cudagraph_skips": s3["cudagraph_skips"] - s0["cudagraph_skips"],
           "fx_cache": {"hit": s3["fx_cache_hit"] - s0["fx_cache_hit"],
                        "miss": s3["fx_cache_miss"] - s0["fx_cache_miss"]}}
    return out


def compiled_counts(stats) -> Dict[str, int]:
    """``gnn_fastpath.stats()``'s ``compiled`` outcomes summed over layer classes (one per traced
    layer call: the backend its operators run on, or ``fallback:<reason>``)."""
    out: Dict[str, int] = {}
    for entry in (stats or {}).values():
        if isinstance(entry, dict):
            for k, n in (entry.get("compiled") or {}).items():
                out[k] = out.get(k, 0) + int(n)
    return out


def _dynamo_reset() -> None:
    try:
        torch._dynamo.reset()
    except Exception:  # noqa: BLE001 - never cost a row
        pass


# ----------------------------------------------------------------------------- rows
def is_sampled(row: dict) -> bool:
    return row.get("sampler") is not None


# ----------------------------------------------------------------------------- markdown cells
def _ms(v) -> str:
    return fmt(v) if v is not None else ""


def _ratio(a, b, suffix="x") -> str:
    if isinstance(a, float) and isinstance(b, float) and b > 0:
        return f"{a / b:.2f}{suffix}"
    return ""


def _fmt_or_status(v) -> str:
    return fmt(v) if isinstance(v, (float, str)) else ""


def _pair(a, b, f=lambda v: fmt(v) if isinstance(v, float) else ("" if v is None else str(v))) -> str:
    if a is None and b is None:
        return ""
    return f"{f(a) or '-'} / {f(b) or '-'}"


# ----------------------------------------------------------------------------- runner
class Runner:
    """Rows, settings and the results files of one training benchmark, and the full-batch
    configs. A tool subclasses it: ``benchmark`` names the JSON, :meth:`extend` adds the
    tool's evaluations (targets) to the payload, :meth:`render` makes its markdown."""

    benchmark = "train"

    def __init__(self, args, device: torch.device, pyg, gf, gf_reason: Optional[str]):
        self.args, self.device, self.pyg, self.gf, self.gf_reason = args, device, pyg, gf, gf_reason
        self.rows: List[dict] = []
        self.graph_info: Dict[str, dict] = {}
        self.env: dict = {}
        self.settings: dict = {}
        self.t0 = time.perf_counter()
        self._data: Optional[Data] = None
        self._weights: Dict[tuple, Dict[str, torch.Tensor]] = {}
        self.dgl = None

    def over_budget(self) -> bool:
        b = self.args.time_budget
        return b is not None and time.perf_counter() - self.t0 > b

    def extend(self, payload: dict) -> None:
        """Add the tool's evaluations to ``payload`` (rows, settings and environment are in)."""

    def render(self, payload: dict) -> str:
        """The tool's markdown of ``payload``."""
        return ""

    def payload(self) -> dict:
        out = {"benchmark": self.benchmark, "environment": self.env, "settings": self.settings,
               "graphs": list(self.graph_info.values()), "rows": self.rows}
        self.extend(out)
        return out

    def save(self) -> None:
        payload = self.payload()
        if self.args.json:
            H.write_json(self.args.json, payload)
        H.write_text(self.args.markdown, self.render(payload))

    def mark_running(self, config: tuple) -> None:
        """Name the config about to run in the JSON (``settings.running``): if the process dies
        or hangs there (``--config-timeout``), the file says where."""
        self.settings["running"] = list(config)
        self.save()

    def add(self, row: dict) -> None:
        self.settings.pop("running", None)
        self.rows.append(row)
        keys = ("graph", "layer_key", "dtype", "mode", "compile", "sampler", "batch_size", "step_ms", "host_ms",
                "whole_ms", "loader_ms", "peak_mb", "compile_s", "graph_breaks", "recompiles", "cudagraph_records_timed",
                "cudagraph_skips", "status")
        extra = path_summary(row)
        print("  " + " ".join(f"{k}={fmt(row[k]) if isinstance(row[k], float) else row[k]}"
                              for k in keys if row.get(k) is not None) + (f" path=[{extra}]" if extra else ""),
              flush=True)
        self.save()

    def finish(self) -> None:
        """The elapsed time into the settings, the files written a last time, the markdown printed."""
        self.settings["elapsed_s"] = round(time.perf_counter() - self.t0, 1)
        self.save()
        print()
        print(self.render(self.payload()), flush=True)

    def data(self, name: str, device: Optional[torch.device] = None) -> Data:
        """The graph's inputs on ``device`` (default the benchmark's); only one graph is held
        at a time (peaks stay comparable)."""
        device = device or self.device
        if self._data is not None and self._data.name == name and self._data.x.device == device:
            return self._data
        self._data = None
        free_memory()
        a = self.args
        t = time.perf_counter()
        self._data = load_data(name, device, a.seed, a.scale, a.data_dir)
        if name not in self.graph_info:
            self.graph_info[name] = dict(self._data.meta, load_s=round(time.perf_counter() - t, 2))
            print(f"{name}: {self._data.num_nodes:,} nodes, {self._data.edge_index.shape[1]:,} edges", flush=True)
        return self._data

    def build_model(self, variant: str, layer: str, d_in: int, classes: int) -> nn.Module:
        """A fresh model: :class:`Net` (``variant`` ``full``, or ``pyg``: sampled, GCN uncached)."""
        a = self.args
        # GCNConv(cached=True) keeps tensors a CUDA graph overwrites on its next replay (stock
        # and enabled alike): runs with compile modes use cached=False for every row
        return Net(self.pyg, layer, d_in, classes, a.hidden, a.heads, a.attn_dropout, a.feat_dropout,
                   a.num_layers, gcn_cached=variant == "full" and not a.compile_modes)

    def model_factory(self, data: Data, layer: str, variant: str = "full") -> Callable[[], nn.Module]:
        """A builder of the (graph, layer) model loaded with weights shared by all its configs
        (``variant``: ``full``, ``pyg`` or ``dgl``, see :meth:`build_model`)."""
        a = self.args

        def build() -> nn.Module:
            return self.build_model(variant, layer, data.x.shape[1], int(data.meta["classes"]))

        key = (data.name, layer) if variant == "full" else (data.name, layer, variant)
        if key not in self._weights:
            torch.manual_seed(a.seed)
            self._weights[key] = {k: v.detach().clone() for k, v in build().state_dict().items()}  # CPU

        def make() -> nn.Module:
            model = build()
            model.load_state_dict(self._weights[key])
            return model

        return make

    def run(self, configs: Sequence[tuple]) -> None:
        """Full-batch configs: (graph, layer, dtype, mode), or with a 5th element, the
        torch.compile mode of a compiled row."""
        a = self.args
        missing: Dict[str, str] = {}
        for config in configs:
            gname, layer, dtype, mode = config[:4]
            cmode = config[4] if len(config) > 4 else None
            row = {"graph": gname, "layer_key": layer, "layer": LAYER_LABELS[layer], "dtype": dtype, "mode": mode}
            if cmode:
                row.update(compile=cmode, compile_backend=a.compile_backend)
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
            self.mark_running(tuple(config))
            with watchdog(a.config_timeout):
                row.update(run_config(self.model_factory(data, layer), data, dtype, mode, self.device, a.warmup,
                                      a.steps, a.lr, a.seed, self.gf, compile_mode=cmode,
                                      compile_backend=a.compile_backend, compile_warmup=a.compile_warmup))
            self.add(row)
        self._data = None
        free_memory()


# ----------------------------------------------------------------------------- command line
def add_common_args(p: argparse.ArgumentParser, name: str, graphs_help: Optional[str] = None) -> None:
    """The options every training benchmark takes; ``name``: the results files' stem."""
    p.add_argument("--graphs", default=None,
                   help=graphs_help or f"comma list (default {','.join(GRAPHS)}; CPU: {','.join(CPU_GRAPHS)})")
    p.add_argument("--layers", default=",".join(LAYERS), help="comma list of " + ", ".join(LAYERS))
    p.add_argument("--dtypes", default=",".join(DTYPE_NAMES), help="comma list of float32, bfloat16, float16 "
                                                                  "(16-bit ones run under torch.autocast)")
    p.add_argument("--steps", type=int, default=None, help="timed steps per config (default 12; quick 6)")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps first (default 3; quick 2)")
    p.add_argument("--quick", action="store_true", help="fewer steps (2 warm-ups, 6 timed)")
    p.add_argument("--device", default="auto", help="auto (cuda when available), cuda or cpu")
    p.add_argument("--time-budget", type=float, default=None,
                   help="seconds: start no new config after this; what was measured is written")
    p.add_argument("--json", default=None, help=f"JSON path (default <out>/{name}.json)")
    p.add_argument("--markdown", default=None, help=f"markdown path (default <out>/{name}.md; '' for none)")
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
    p.add_argument("--config-timeout", type=float, default=150.0,
                   help="seconds one config may take before every thread's traceback is printed and the process "
                        "exits (a hang leaves a stack; 0: off; default 150)")


def finish_common_args(args, name: str) -> torch.device:
    """Defaults that depend on the device and ``--quick``; the device. Sets ``args.layer_keys``,
    ``args.dtype_names``, ``args.graph_names`` (None: the tool's default) and, for tools
    without them, the compile and padding attributes the runners read."""
    device = H.pick_device(args.device)
    cpu = device.type != "cuda"
    args.graph_names = [g.strip() for g in args.graphs.split(",") if g.strip()] if args.graphs else None
    args.layer_keys = H.names(args.layers, LAYERS, "--layers")
    args.dtype_names = H.parse_dtypes(args.dtypes)
    args.warmup = args.warmup if args.warmup is not None else (2 if args.quick else 3)
    args.steps = args.steps if args.steps is not None else (6 if args.quick else 12)
    if args.steps < 1:
        raise SystemExit("--steps must be at least 1")
    if cpu:
        print("CPU: stock vs enable(cpu='reference') on scaled-down graphs (a smoke run, not a benchmark)", flush=True)
    args.scale = args.scale if args.scale is not None else (CPU_SCALE if cpu else 1.0)
    out_dir = H.out_dir(args.out)
    args.json = str(out_dir / f"{name}.json") if args.json is None else args.json
    args.markdown = str(out_dir / f"{name}.md") if args.markdown is None else args.markdown
    for attr, default in (("compile_modes", []), ("compile_backend", "inductor"), ("compile_warmup", COMPILE_WARMUP),
                          ("pad_batches", False)):
        if not hasattr(args, attr):
            setattr(args, attr, default)
    return device


def common_settings(args, device: torch.device) -> dict:
    """The settings every training JSON records."""
    return {"layers": args.layer_keys, "dtypes": args.dtype_names, "warmup": args.warmup, "steps": args.steps,
            "seed": args.seed, "scale": args.scale, "hidden": args.hidden, "heads": args.heads,
            "num_layers": args.num_layers, "attn_dropout": args.attn_dropout, "feat_dropout": args.feat_dropout,
            "lr": args.lr, "device": str(device), "time_budget_s": args.time_budget, "quick": args.quick}


def model_text(st: dict) -> str:
    """One sentence on the models and the step, for a markdown section."""
    return (f"{st.get('num_layers', 3)} layers ({st.get('hidden')} x {st.get('heads')} heads for GATv2 / Transformer, "
            f"{st.get('hidden')} wide for GCN / SAGE-max), Adam; step = forward + loss + backward + optimizer, median "
            f"of {st.get('steps')} after {st.get('warmup')} warm-ups; 16-bit dtypes under torch.autocast; x = stock / "
            "enabled; peak = max_memory_allocated during the config above what was allocated at its start.")
