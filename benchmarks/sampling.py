"""Sampled mini-batches for the training benchmarks (``bench_train_sampled``, ``bench_compile``):
the samplers' loaders, the kept batches, fixed-size (padded) batches, the timed model step,
the whole step with the real loader, the per-phase profile, and :class:`SampledRunner`.

* **Sampler ``pyg``**: ``NeighborLoader(num_neighbors=fanouts)`` over every node (shuffled), on
  the graph and features held on the CPU; the model runs on the whole sampled subgraph, the
  loss on its first ``batch_size`` rows (the seeds). Needs ``torch_sparse`` or ``pyg_lib``.
* **Sampler ``dgl``**: ``NeighborSampler(fanouts reversed)`` and ``dgl.dataloading.DataLoader``
  on a CPU graph with ``feat``/``label`` prefetched; DGL's layers on the blocks. With a GPU and
  DGL's CPU-only build the blocks stay on the CPU and only the fused path runs them.

Per (graph, sampler, batch size) the loader is built once, K batches are drawn from it and
kept on the CPU (pinned), and the loader alone is timed. The *model step* moves kept batch
``i mod K`` to the GPU as NEW tensors (so no graph cache recognises it), outside the timing,
then times graph build + forward + loss on the seeds + backward + optimizer (CUDA events).
The *whole step* iterates the real loader (worker processes) with the model step, window wall
time / steps. benchmarks/README.md has the columns.
"""
from __future__ import annotations

import argparse
import contextlib
import math
import statistics
import time
import warnings
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from . import harness as H
from .harness import OOM, autocast, fmt, free_memory, is_oom, watchdog
from .training import (COMPILE_WARMUP, LAYER_LABELS, CompileWatch, Data, Runner, _dynamo_reset, _fastpath_context,
                       _sync, compile_fields, compile_model, compiled_counts, is_compiled, start_steps, stats_counts)

SAMPLERS = ["pyg", "dgl"]

BATCH_SIZES = [1024, 4096]

CPU_BATCH_SIZES = [128]

#: Fan-outs per hop, the hop next to the seeds first (PyG's ``num_neighbors`` order; DGL's
#: ``NeighborSampler`` takes them input layer first, so it gets the list reversed).
FANOUTS = [15, 10, 5]

DEFAULT_WORKERS = 4

PREFETCH_FACTOR = 2

#: At most this many distinct batches are pre-sampled per (graph, sampler, batch size); the
#: model-step timing cycles over them (each step still gets new device tensors).
PRESAMPLE_MAX = 20

#: The DGL layer of each benchmark layer (DGL has no TransformerConv; SAGE-max is DGL's "pool":
#: relu(fc_pool(x)) then the max).
DGL_LAYERS = {"gatv2": "GATv2Conv", "gcn": "GraphConv", "sage_max": "SAGEConv(pool)"}

DGL_NOT_RUNNABLE = "not runnable (DGL CPU build): blocks stay on the CPU, stock DGL needs them beside the CUDA features"

PYG_SAMPLER_MISSING = "skipped: needs torch_sparse or pyg_lib"

#: A sampled config: (graph, layer, dtype, mode, sampler, batch size).
SampledConfig = Tuple[str, str, str, str, str, int]

#: Fixed-size mini-batches: caps = max over the kept batches x ``PAD_SLACK``, rounded up to a
#: multiple of ``PAD_MULTIPLE`` (nodes: at least one more than the largest batch, the dummy node).
PAD_SLACK = 1.02
PAD_MULTIPLE = 256


# ----------------------------------------------------------------------------- fixed-size mini-batches
def _round_up(n: int, multiple: int) -> int:
    return -(-int(n) // multiple) * multiple if multiple > 1 else int(n)


def pad_caps(nodes: Sequence[int], edges: Sequence[int], slack: float = PAD_SLACK,
             multiple: int = PAD_MULTIPLE) -> Tuple[int, int]:
    """(N_cap, M_cap) for batches of ``nodes`` / ``edges``: the maxima times ``slack``, rounded up
    to ``multiple``; N_cap is larger than every batch's node count, so node N_cap - 1 (the dummy
    that takes the padding edges) is a padding node in every batch."""
    n, m = max(nodes), max(edges)
    n_cap = _round_up(max(math.ceil(n * slack), n + 1), multiple)
    m_cap = _round_up(max(math.ceil(m * slack), m, 1), multiple)
    return n_cap, m_cap


def pad_batch(x: torch.Tensor, edge_index: torch.Tensor, n_cap: int, m_cap: int,
              batch_size: Optional[int] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """A sampled subgraph padded to ``n_cap`` nodes and ``m_cap`` edges as the package's
    ``PadToCapacity`` pads a batch (:func:`gnn_fastpath.integrations.pyg.padding.padding_edges`):
    padding nodes get zero features, padding edges are self loops spread over the padding
    nodes (ids ``n .. n_cap - 1``, never among the first ``batch_size`` seeds). Real nodes
    keep their ids, edges, and in-neighbourhoods, so every real node's output (the seeds'
    loss included) is unchanged.
    """
    from gnn_fastpath.integrations.pyg.padding import padding_edges

    n, m = int(x.shape[0]), int(edge_index.shape[1])
    if n >= n_cap or m > m_cap:
        raise ValueError(f"batch of {n} nodes / {m} edges does not fit the caps {n_cap} / {m_cap} "
                         "(nodes need one spare row for the dummy)")
    if batch_size is not None and not batch_size <= n:
        raise ValueError(f"batch_size {batch_size} > {n} nodes")
    xp = x.new_zeros((n_cap,) + tuple(x.shape[1:]))
    xp[:n] = x
    return xp, torch.cat([edge_index, padding_edges(n, m, n_cap, m_cap, edge_index)], dim=1)


# ----------------------------------------------------------------------------- rows
def sampled_layer_label(sampler: str, layer: str) -> str:
    if sampler == "dgl":
        return f"DGL {DGL_LAYERS.get(layer, layer)} x3"
    return LAYER_LABELS[layer]


def sampler_bound(loader_ms, step_ms) -> Optional[str]:
    """``"sampler"`` when the loader alone takes at least the model step per batch, else
    ``"model"``; None when either is missing."""
    if isinstance(loader_ms, float) and isinstance(step_ms, float):
        return "sampler" if loader_ms >= step_ms else "model"
    return None


# ----------------------------------------------------------------------------- models and batches
def make_dgl_conv(dglnn, layer: str, d_in: int, hidden: int, heads: int, attn_dropout: float) -> Tuple[nn.Module, int]:
    """The DGL counterpart of :func:`make_conv` (zero in-degree allowed: a seed without in-edges
    has none in its block either)."""
    if layer == "gatv2":
        return dglnn.GATv2Conv(d_in, hidden, num_heads=heads, attn_drop=attn_dropout, allow_zero_in_degree=True), \
            hidden * heads
    if layer == "gcn":
        return dglnn.GraphConv(d_in, hidden, norm="both", allow_zero_in_degree=True), hidden
    if layer == "sage_max":
        return dglnn.SAGEConv(d_in, hidden, "pool"), hidden
    raise KeyError(f"no DGL layer for {layer!r}")


class DGLNet(nn.Module):
    """:class:`Net` on DGL blocks: conv ``i`` runs on ``blocks[i]`` (heads flattened)."""

    def __init__(self, dgl, layer: str, d_in: int, classes: int, hidden: int = 64, heads: int = 4,
                 attn_dropout: float = 0.1, feat_dropout: float = 0.2, num_layers: int = 3):
        super().__init__()
        import dgl.nn.pytorch as dglnn

        convs, d = [], d_in
        for _ in range(num_layers):
            conv, d = make_dgl_conv(dglnn, layer, d, hidden, heads, attn_dropout)
            convs.append(conv)
        self.convs = nn.ModuleList(convs)
        self.head = nn.Linear(d, classes)
        self.feat_dropout = feat_dropout

    def forward(self, x: torch.Tensor, blocks) -> torch.Tensor:
        for i, (conv, block) in enumerate(zip(self.convs, blocks)):
            if i:
                x = F.dropout(x, p=self.feat_dropout, training=self.training)
            x = F.elu(conv(block, x).flatten(1))
        return self.head(x)


@dataclass
class SampledBatch:
    """A batch as the model step takes it: features, graph (PyG ``edge_index`` of the sampled
    subgraph, or the DGL blocks), labels (the seeds' first) and the number of seeds."""

    x: torch.Tensor
    graph: object
    y: torch.Tensor
    batch_size: int


def pyg_sampler_reason() -> Optional[str]:
    """None when PyG's NeighborLoader can sample here (pyg_lib or torch_sparse), else why not."""
    try:
        import torch_geometric.typing as T
    except Exception as exc:  # noqa: BLE001
        return f"skipped: torch_geometric.typing does not import ({exc})"
    if getattr(T, "WITH_PYG_LIB", False) or getattr(T, "WITH_TORCH_SPARSE", False):
        return None
    return PYG_SAMPLER_MISSING


def dgl_cuda_ok(dgl, device: torch.device) -> bool:
    """Whether DGL can put a graph on ``device`` (False for the CPU-only PyPI build)."""
    if device.type != "cuda":
        return True
    try:
        dgl.graph(([0], [0])).to(device)
        return True
    except Exception:  # noqa: BLE001
        return False


class BatchSource:
    """One (graph, sampler, batch size): the real loader (``workers`` processes, persistent,
    pinned memory for PyG), batches drawn from it as users do, and pinned copies kept for the
    model-step timing.

    PyG: ``NeighborLoader(num_neighbors=fanouts)`` over every node (shuffled), on the graph and
    features held on the CPU; the model runs on the whole sampled subgraph, the loss on its
    first ``batch_size`` rows (the seeds). DGL: ``NeighborSampler(fanouts reversed)`` and
    ``dgl.dataloading.DataLoader`` on a CPU graph with ``feat``/``label`` prefetched; blocks
    stay on the CPU when DGL cannot hold them on the GPU (``dgl_cuda`` False).
    """

    def __init__(self, sampler: str, data: Data, batch_size: int, fanouts: Sequence[int], workers: int,
                 device: torch.device, dgl=None, dgl_cuda: bool = True, prefetch_factor: int = PREFETCH_FACTOR):
        self.sampler, self.batch_size, self.device = sampler, int(batch_size), device
        self.fanouts, self.workers, self.dgl, self.dgl_cuda = list(fanouts), int(workers), dgl, dgl_cuda
        self.cuda = device.type == "cuda"
        kw: Dict[str, object] = {"num_workers": self.workers, "persistent_workers": self.workers > 0}
        if self.workers > 0:
            kw["prefetch_factor"] = prefetch_factor
        #: batches the workers may hold ready (sampled ahead): drained before a timed window
        self.backlog = prefetch_factor * self.workers if self.workers > 0 else 0
        if sampler == "pyg":
            from torch_geometric.data import Data as PygData
            from torch_geometric.loader import NeighborLoader

            d = PygData(x=data.x, edge_index=data.edge_index, y=data.y, num_nodes=data.num_nodes)
            self.loader = NeighborLoader(d, num_neighbors=self.fanouts, batch_size=self.batch_size, shuffle=True,
                                         pin_memory=self.cuda, **kw)
        elif sampler == "dgl":
            g = dgl.graph((data.edge_index[0], data.edge_index[1]), num_nodes=data.num_nodes)
            g.ndata["feat"] = data.x
            g.ndata["label"] = data.y
            g.create_formats_()  # once, before the workers fork
            s = dgl.dataloading.NeighborSampler(list(reversed(self.fanouts)), prefetch_node_feats=["feat"],
                                                prefetch_labels=["label"])
            self.loader = dgl.dataloading.DataLoader(g, torch.arange(data.num_nodes), s, batch_size=self.batch_size,
                                                     shuffle=True, drop_last=False, **kw)
        else:
            raise KeyError(sampler)
        self._it = None

    def next_raw(self):
        """The loader's next batch (a new epoch when one ends)."""
        if self._it is None:
            self._it = iter(self.loader)
        try:
            return next(self._it)
        except StopIteration:
            self._it = iter(self.loader)
            return next(self._it)

    def drain(self) -> None:
        """Take (and drop) the batches the workers sampled ahead while nobody asked, so a timed
        window starts with none waiting, as in the middle of an epoch."""
        for _ in range(self.backlog):
            self.next_raw()

    def to_device(self, raw) -> SampledBatch:
        """A loader batch moved as users move it (``non_blocking``)."""
        dev = self.device
        if self.sampler == "pyg":
            b = raw.to(dev, non_blocking=True)
            return SampledBatch(b.x, b.edge_index, b.y, int(b.batch_size))
        _, seeds, blocks = raw
        x = blocks[0].srcdata["feat"].to(dev, non_blocking=True)
        y = blocks[-1].dstdata["label"].to(dev, non_blocking=True)
        if self.dgl_cuda:
            blocks = [blk.to(dev) for blk in blocks]
        return SampledBatch(x, blocks, y, int(seeds.shape[0]))

    def keep(self, raw) -> dict:
        """What the model step needs of a loader batch, on the CPU (pinned with a GPU)."""
        pin = (lambda t: t.contiguous().pin_memory()) if self.cuda else (lambda t: t.contiguous())
        if self.sampler == "pyg":
            bs = int(raw.batch_size)
            return {"x": pin(raw.x), "graph": pin(raw.edge_index), "y": pin(raw.y[:bs]), "batch_size": bs,
                    "nodes": int(raw.x.shape[0]), "edges": int(raw.edge_index.shape[1])}
        _, seeds, blocks = raw
        coo = []
        for blk in blocks:  # ids stay in pageable memory: DGL rebuilds blocks from them on the CPU
            src, dst = blk.edges(order="eid")
            coo.append((src, dst, int(blk.num_src_nodes()), int(blk.num_dst_nodes())))
        return {"x": pin(blocks[0].srcdata["feat"]), "graph": coo, "y": pin(blocks[-1].dstdata["label"]),
                "batch_size": int(seeds.shape[0]), "nodes": int(blocks[0].num_src_nodes()),
                "edges": sum(int(blk.num_edges()) for blk in blocks)}

    def pad_kept(self, kept: Sequence[dict], slack: float = PAD_SLACK,
                 multiple: int = PAD_MULTIPLE) -> Tuple[List[dict], int, int]:
        """The kept PyG batches padded to one fixed size (:func:`pad_caps`, :func:`pad_batch`),
        pinned again; ``nodes`` / ``edges`` stay the real counts. Returns (batches, N_cap, M_cap)."""
        if self.sampler != "pyg":
            raise ValueError("fixed-size batches are made for the PyG sampler only")
        n_cap, m_cap = pad_caps([b["nodes"] for b in kept], [b["edges"] for b in kept], slack, multiple)
        pin = (lambda t: t.contiguous().pin_memory()) if self.cuda else (lambda t: t.contiguous())
        out = []
        for b in kept:
            x, ei = pad_batch(b["x"], b["graph"], n_cap, m_cap, b["batch_size"])
            out.append(dict(b, x=pin(x), graph=pin(ei), padded_nodes=n_cap, padded_edges=m_cap))
        return out, n_cap, m_cap

    def from_kept(self, kept: dict) -> SampledBatch:
        """A kept batch on the device as NEW objects (new ``edge_index`` tensors, new DGL
        blocks), so no graph cache can recognise it from an earlier step."""
        dev = self.device
        move = lambda t: t.to(dev, non_blocking=True, copy=True)  # noqa: E731
        if self.sampler == "pyg":
            graph = move(kept["graph"])
        else:
            graph = [self.dgl.create_block((src, dst), num_src_nodes=ns, num_dst_nodes=nd)
                     for src, dst, ns, nd in kept["graph"]]
            if self.dgl_cuda and self.cuda:
                graph = [blk.to(dev) for blk in graph]
        return SampledBatch(move(kept["x"]), graph, move(kept["y"]), kept["batch_size"])

    def close(self) -> None:
        it, self._it = self._it, None
        shutdown = getattr(it, "_shutdown_workers", None)
        if shutdown is not None:
            try:
                shutdown()
            except Exception:  # noqa: BLE001
                pass
        inner = getattr(self.loader, "_iterator", None)
        if inner is not None and inner is not it and hasattr(inner, "_shutdown_workers"):
            try:
                inner._shutdown_workers()
            except Exception:  # noqa: BLE001
                pass
        self.loader = None


# ----------------------------------------------------------------------------- steps
def _train_step(model: nn.Module, opt, scaler, b: SampledBatch, dtype: str, device: torch.device,
                losses: Optional[List[torch.Tensor]], mark_step: bool = False) -> None:
    """zero_grad; [autocast] out = model(x, graph); loss on the seeds' rows [/autocast];
    backward; optimizer step (the graph build happens inside the first layer call).
    ``mark_step``: ``torch.compiler.cudagraph_mark_step_begin()`` first (reduce-overhead)."""
    if mark_step:
        torch.compiler.cudagraph_mark_step_begin()
    opt.zero_grad(set_to_none=True)
    with autocast(device, dtype):
        out = model(b.x, b.graph)
        loss = F.cross_entropy(out[:b.batch_size], b.y[:b.batch_size])
    if scaler is None:
        loss.backward()
        opt.step()
    else:
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    if losses is not None:
        losses.append(loss.detach())


def _phase_step(model: nn.Module, opt, scaler, b: SampledBatch, dtype: str, device: torch.device,
                labels: bool = False, sync_between: bool = False) -> dict:
    """One training step split into forward (with loss), backward and optimizer: CUDA-event
    milliseconds per phase (``*_ms``; wall milliseconds on the CPU) and the host time the
    Python thread spent issuing each phase (``*_host_ms``). The GPU is idle when it starts.
    ``labels``: each phase inside ``torch.profiler.record_function("gfp_phase:<name>")``;
    ``sync_between``: synchronise after each phase (for kernel attribution by time)."""
    cuda = device.type == "cuda"
    from torch.profiler import record_function

    rf = record_function if labels else (lambda name: contextlib.nullcontext())
    events = [torch.cuda.Event(enable_timing=True) for _ in range(4)] if cuda else []
    host: List[float] = []

    def mark(i: int) -> None:
        if cuda:
            if sync_between and i:
                torch.cuda.synchronize(device)
            events[i].record()
        host.append(time.perf_counter())

    _sync(device)
    mark(0)
    with rf("gfp_phase:forward"):
        opt.zero_grad(set_to_none=True)
        with autocast(device, dtype):
            out = model(b.x, b.graph)
            loss = F.cross_entropy(out[:b.batch_size], b.y[:b.batch_size])
    mark(1)
    with rf("gfp_phase:backward"):
        if scaler is None:
            loss.backward()
        else:
            scaler.scale(loss).backward()
    mark(2)
    with rf("gfp_phase:optimizer"):
        if scaler is None:
            opt.step()
        else:
            scaler.step(opt)
            scaler.update()
    mark(3)
    _sync(device)
    res = {}
    for i, name in enumerate(("fwd", "bwd", "opt")):
        res[f"{name}_host_ms"] = (host[i + 1] - host[i]) * 1e3
        res[f"{name}_ms"] = events[i].elapsed_time(events[i + 1]) if cuda else res[f"{name}_host_ms"]
    res["total_ms"] = events[0].elapsed_time(events[3]) if cuda else (host[3] - host[0]) * 1e3
    res["total_host_ms"] = (host[3] - host[0]) * 1e3
    return res


def _kernel_ms_by_phase(step: Callable[[], object]) -> dict:
    """GPU activity (kernels, copies, memsets) per phase of one ``_phase_step(labels=True,
    sync_between=True)`` under ``torch.profiler``: each device event is given to the phase
    whose ``gfp_phase:`` range started last before it (phases are synchronised, so none
    overlaps the next). Milliseconds by phase (``forward``, ``backward``, ``optimizer``) and
    ``total``; ``{"error": ...}`` when the profiler cannot say."""
    try:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            step()
        events = list(prof.events())
        starts = sorted((e.time_range.start, e.name.split(":", 1)[1]) for e in events
                        if e.name.startswith("gfp_phase:") and "CPU" in str(e.device_type))
        if not starts:
            return {"error": "no phase ranges in the profile"}
        out = {name: 0.0 for _, name in starts}
        total = 0.0
        for e in events:
            if "CUDA" not in str(e.device_type) or e.name.startswith("gfp_phase:") or getattr(e, "is_user_annotation",
                                                                                              False):
                continue
            ms = e.time_range.elapsed_us() / 1e3
            total += ms
            owner = None
            for s, name in starts:
                if e.time_range.start >= s:
                    owner = name
            if owner is not None:
                out[owner] += ms
        out["total"] = total
        return out
    except Exception as exc:  # noqa: BLE001 - a profiler problem must not cost the row
        return {"error": f"{type(exc).__name__}: {exc}"[:200]}


def _median_dict(items: Sequence[dict]) -> dict:
    keys = items[0].keys() if items else ()
    return {k: statistics.median(d[k] for d in items) for k in keys}


def profile_phases(model, opt, scaler, source: "BatchSource", kept: Sequence[dict], dtype: str, device: torch.device,
                   n: int, start: int = 0) -> dict:
    """The per-phase breakdown of the model step (``--profile-phases``), ``n`` times:

    * ``cold``: a step on a batch never seen (new device tensors / blocks): every graph the
      layers need is built inside it; ``warm``: the same step again on the SAME batch objects,
      so the graph caches hit (gnn_fastpath's Graph, its memoised self-loop / norm / transpose
      data). ``build_ms`` = cold - warm per phase (medians): the graph-build cost (stock rows
      show the noise of this difference, having no cache).
    * per phase forward (+loss), backward, optimizer: CUDA-event ms and the host ms spent
      issuing it (host close to the event time: the GPU waited for the CPU);
    * ``kernel_ms`` (CUDA only): GPU busy time per phase of one more warm step under
      ``torch.profiler`` (synchronised between phases); fwd+bwd elapsed minus kernels is the
      host glue.
    """
    cold, warm = [], []
    b = None
    for i in range(n):
        b = source.from_kept(kept[(start + i) % len(kept)])
        cold.append(_phase_step(model, opt, scaler, b, dtype, device))
        warm.append(_phase_step(model, opt, scaler, b, dtype, device))
    res = {"n": n, "cold": _median_dict(cold), "warm": _median_dict(warm)}
    res["build_ms"] = {k: res["cold"][f"{k}_ms"] - res["warm"][f"{k}_ms"] for k in ("fwd", "bwd", "opt", "total")}
    res["build_host_ms"] = {k: res["cold"][f"{k}_host_ms"] - res["warm"][f"{k}_host_ms"]
                            for k in ("fwd", "bwd", "opt", "total")}
    if device.type == "cuda" and b is not None:
        res["kernel_ms"] = _kernel_ms_by_phase(
            lambda: _phase_step(model, opt, scaler, b, dtype, device, labels=True, sync_between=True))
    return res


def _timed_window(source: "BatchSource", device: torch.device, warmup: int, steps: int,
                  step: Optional[Callable[[SampledBatch], None]]) -> dict:
    """Batches from the real loader, as users iterate it: drain the backlog, ``warmup`` untimed
    batches, then ``steps`` timed ones (``to_device`` + ``step``), synchronised only at the
    window's ends. ``ms`` = window wall time / steps; ``host_ms_all``: per-step host intervals."""
    source.drain()
    for _ in range(warmup):
        b = source.to_device(source.next_raw())
        if step is not None:
            step(b)
    _sync(device)
    t0 = time.perf_counter()
    marks = [t0]
    for _ in range(steps):
        b = source.to_device(source.next_raw())
        if step is not None:
            step(b)
        marks.append(time.perf_counter())
    del b
    _sync(device)
    t1 = time.perf_counter()
    return {"ms": (t1 - t0) * 1e3 / steps, "host_ms_all": [round((marks[i + 1] - marks[i]) * 1e3, 3)
                                                           for i in range(steps)]}


def loader_alone(source: "BatchSource", device: torch.device, warmup: int, steps: int) -> dict:
    """The loader alone: iterate + ``to_device`` (no model), per batch."""
    return _timed_window(source, device, warmup, steps, None)


#: The mode of a config whose stock and enabled steps alternate (:func:`run_paired_config`).
PAIRED = "paired"


def _timed_step(step: Callable[[], object], device: torch.device) -> Tuple[float, float]:
    """(ms, host ms) of ``step()`` started from an idle device: CUDA events on the GPU (wall
    time on the CPU), and the host time of issuing it."""
    _sync(device)
    cuda = device.type == "cuda"
    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
    h0 = time.perf_counter()
    step()
    host_ms = (time.perf_counter() - h0) * 1e3
    if cuda:
        end.record()
        end.synchronize()
        return start.elapsed_time(end), host_ms
    return host_ms, host_ms


def run_sampled_config(make_model: Callable[[], nn.Module], source: BatchSource, kept: Sequence[dict], dtype: str,
                       mode: str, device: torch.device, warmup: int, steps: int, lr: float = 0.01, seed: int = 0,
                       gf=None, frameworks: str = "pyg", whole_steps: int = 0, profile_steps: int = 0,
                       budget_ok: Callable[[], bool] = lambda: True, compile_mode: Optional[str] = None,
                       compile_backend: str = "inductor", compile_warmup: int = COMPILE_WARMUP) -> dict:
    """One sampled config: the model step on pre-sampled batches (``step_ms``), optionally the
    phase profile (``phases``) and the whole step with the real loader (``whole_ms``).

    Model step: before each step (outside the timed region) pre-sampled batch ``i mod K`` is
    moved to the device as new objects and the device synchronised; then graph build +
    forward + loss on the seeds + backward + optimizer, timed with CUDA events (wall time on
    the CPU); ``host_ms``: the host time of issuing the step. Whole step: same model and
    optimizer, continuing, ``whole_steps`` steps with batches from the loader
    (:func:`_timed_window`); its own failure is ``whole_status``, the model step stays.
    ``compile_mode``: the model under ``torch.compile`` (``compile_warmup`` warm-ups, the
    :func:`compile_fields`); such a row times the model step only (no phases, no whole step:
    the real loader's batches are not padded, every one would be a new shape).
    """
    res: Dict[str, object] = {"step_ms": None, "peak_mb": None, "status": "ok"}
    compiled = compile_mode not in (None, "none")
    failure = None
    if gf is not None and mode == "enabled":
        gf.reset_stats()
    if compiled:
        _dynamo_reset()
        whole_steps = profile_steps = 0
        res["whole_status"] = "skipped: compiled rows time the model step only"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            _sampled_steps(res, make_model, source, kept, dtype, mode, device, compile_warmup if compiled else warmup,
                           steps, lr, seed, gf, frameworks, whole_steps, profile_steps, budget_ok,
                           compile_mode if compiled else None, compile_backend)
        except Exception as exc:  # noqa: BLE001 - OOM is a result; other errors are reported
            failure = (is_oom(exc), f"{type(exc).__name__}: {exc}"[:400])
    if failure is not None:
        oom, message = failure
        res["step_ms"] = OOM if oom else "error"
        res["status"] = OOM if oom else f"error: {message}"
    if gf is not None and mode == "enabled":
        res.update(stats_counts(gf.stats()))
        if compiled:
            res["compiled_calls"] = compiled_counts(gf.stats())
    if compiled:
        _dynamo_reset()
    msgs = sorted({str(w.message) for w in caught if "gnn_fastpath" in str(w.message)})
    if msgs:
        res["fallback_warnings"] = msgs[:10]
    if device.type == "cuda":
        free_memory()
        torch.cuda.reset_peak_memory_stats(device)
    return res


def _sampled_steps(res: dict, make_model, source: BatchSource, kept: Sequence[dict], dtype: str, mode: str,
                   device: torch.device, warmup: int, steps: int, lr: float, seed: int, gf, frameworks: str,
                   whole_steps: int, profile_steps: int, budget_ok: Callable[[], bool],
                   compile_mode: Optional[str] = None, compile_backend: str = "inductor") -> None:
    cuda = device.type == "cuda"
    base, model, opt, scaler = start_steps(make_model, device, dtype, lr)
    losses: List[torch.Tensor] = []
    times: List[float] = []
    hosts: List[float] = []
    step_model = compile_model(model, compile_mode, compile_backend) if compile_mode else model
    mark = compile_mode == "reduce-overhead" and compile_backend == "inductor"
    torch.manual_seed(seed)
    with _fastpath_context(gf, mode, device, frameworks), \
            (CompileWatch() if compile_mode else contextlib.nullcontext()) as watch:
        snaps = [watch.snapshot()] if watch is not None else []
        t_compile = time.perf_counter()
        for i in range(warmup + steps):
            if watch is not None and i in (1, warmup):
                _sync(device)
                if i == warmup:  # the compile time: every warm-up step, up to the timed loop
                    res["compile_s"] = time.perf_counter() - t_compile
                    if len(snaps) == 1:
                        snaps.append(watch.snapshot())
                snaps.append(watch.snapshot())
            b = source.from_kept(kept[i % len(kept)])
            ms, host_ms = _timed_step(lambda b=b: _train_step(step_model, opt, scaler, b, dtype, device, losses, mark),
                                      device)
            if i >= warmup:
                times.append(ms)
                hosts.append(host_ms)
            del b
        if watch is not None:
            snaps.append(watch.snapshot())
            if len(snaps) == 4:
                res.update(compile_fields(watch, *snaps, compile_s=res.pop("compile_s"), warmup=warmup))
        values = [float(v) for v in torch.stack(losses[-steps:]).float().cpu()] if steps else []
        res["step_ms"] = statistics.median(times) if times else None
        res["step_ms_all"] = [round(t, 4) for t in times]
        res["host_ms"] = statistics.median(hosts) if hosts else None
        res["losses"] = values
        res["finite_losses"] = all(v == v and abs(v) != float("inf") for v in values)
        if cuda:
            torch.cuda.synchronize(device)
            res["peak_mb"] = (torch.cuda.max_memory_allocated(device) - base) / 2**20
        if profile_steps > 0:  # its failure is kept in ``phases``; the model step stays
            failure = None
            try:
                res["phases"] = profile_phases(model, opt, scaler, source, kept, dtype, device, profile_steps,
                                               start=warmup + steps)
            except Exception as exc:  # noqa: BLE001
                failure = f"{type(exc).__name__}: {exc}"[:300]
            if failure is not None:
                res["phases"] = {"error": failure}
                free_memory()
        if whole_steps > 0:
            if not budget_ok():
                res["whole_status"] = "skipped: time budget"
                return
            failure = None
            try:
                w = _timed_window(source, device, warmup, whole_steps,
                                  lambda b: _train_step(model, opt, scaler, b, dtype, device, None))
                res["whole_ms"] = w["ms"]
                res["whole_host_ms_all"] = w["host_ms_all"]
                res["whole_status"] = "ok"
            except Exception as exc:  # noqa: BLE001
                failure = (is_oom(exc), f"{type(exc).__name__}: {exc}"[:300])
            if failure is not None:
                res["whole_ms"] = OOM if failure[0] else "error"
                res["whole_status"] = OOM if failure[0] else f"error: {failure[1]}"
                free_memory()


#: Timed steps of one mode in a row under ``--paired`` (a block), after one untimed step.
PAIRED_BLOCK = 4


def paired_schedule(steps: int, block: int = PAIRED_BLOCK) -> List[Tuple[str, int]]:
    """The ``--paired`` blocks: (mode, timed steps) in the order stock, enabled, enabled, stock,
    stock, enabled, ... (ABBA: a drift linear in time weighs both modes alike over each two
    block pairs, so exactly with a multiple of ``2 * block`` steps), ``steps`` timed steps per
    mode in all."""
    sizes = [min(block, steps - i) for i in range(0, steps, block)]
    out = []
    for k, n in enumerate(sizes):
        first, second = ("stock", "enabled") if k % 2 == 0 else ("enabled", "stock")
        out += [(first, n), (second, n)]
    return out


def run_paired_config(make_model: Callable[[], nn.Module], source: BatchSource, kept: Sequence[dict], dtype: str,
                      device: torch.device, warmup: int, steps: int, lr: float = 0.01, seed: int = 0, gf=None,
                      frameworks: str = "pyg", control: bool = False) -> Tuple[dict, dict, dict]:
    """Stock and enabled model steps interleaved in short blocks on the same batches: (the stock
    row's fields, the enabled row's, the pair statistics).

    Two models from the same seed (the same parameters), each with its own optimizer; each
    mode's ``i``-th step runs pre-sampled batch ``i mod K``. After ``warmup`` steps of each,
    the modes take turns in blocks of :data:`PAIRED_BLOCK` timed steps (:func:`paired_schedule`),
    each block entered with ``enable()`` or left stock and started by one untimed step: switching
    patches the layer classes, which slows the next step whichever model runs it (see
    benchmarks/RESULTS.md, seventh session), and a user enables once. Every step runs from an
    idle device and is timed alone as :func:`run_sampled_config` times a step. Machine drift
    (clocks, other processes, the host CPU) then hits both sides of every block pair alike, so
    a difference smaller than the round-to-round spread of separate runs is still resolved:
    ``paired_x`` is the median over the block pairs of (stock block's median ms / enabled
    block's), ``paired_enabled_slower`` the share of pairs in which the enabled block was
    slower. Each row's ``step_ms`` is the median of its own steps. ``control``: the "enabled"
    model's blocks run stock too (an A/A control: the spread of ``paired_x`` when nothing
    differs, against which a small difference is read; ``stats["control"]``)."""
    cuda = device.type == "cuda"
    rows = {m: {"step_ms": None, "peak_mb": None, "status": "ok", "whole_status": "skipped: paired rows time the "
                "model step only"} for m in ("stock", "enabled")}
    stats: Dict[str, object] = {"pairs": 0, "block": PAIRED_BLOCK, "control": control}
    if gf is not None:
        gf.reset_stats()
    runs = {}
    done = {"stock": 0, "enabled": 0}
    blocks: Dict[str, List[List[float]]] = {"stock": [], "enabled": []}
    hosts: Dict[str, List[float]] = {"stock": [], "enabled": []}
    losses: Dict[str, List[torch.Tensor]] = {"stock": [], "enabled": []}

    def run_block(mode: str, untimed: int, timed: int) -> None:
        model, opt, scaler = runs[mode]
        times = []
        with _fastpath_context(gf, "stock" if control else mode, device, frameworks):
            for j in range(untimed + timed):
                b = source.from_kept(kept[done[mode] % len(kept)])
                done[mode] += 1
                ms, host_ms = _timed_step(
                    lambda b=b: _train_step(model, opt, scaler, b, dtype, device, losses[mode]), device)
                if j >= untimed:
                    times.append(ms)
                    hosts[mode].append(host_ms)
                del b
        if timed:
            blocks[mode].append(times)

    try:
        for mode in ("stock", "enabled"):
            torch.manual_seed(seed)
            runs[mode] = start_steps(make_model, device, dtype, lr)[1:]
        for mode in ("stock", "enabled"):
            run_block(mode, warmup, 0)
        for mode, n in paired_schedule(steps):
            run_block(mode, 1, n)
    except Exception as exc:  # noqa: BLE001 - OOM is a result; other errors are reported
        status = OOM if is_oom(exc) else f"error: {type(exc).__name__}: {exc}"[:400]
        for r in rows.values():
            r["step_ms"], r["status"] = OOM if status == OOM else "error", status
    else:
        for mode, r in rows.items():
            times = [t for blk in blocks[mode] for t in blk]
            values = [float(v) for v in torch.stack(losses[mode][-steps:]).float().cpu()] if steps else []
            r.update(step_ms=statistics.median(times) if times else None,
                     step_ms_all=[round(t, 4) for t in times],
                     host_ms=statistics.median(hosts[mode]) if hosts[mode] else None,
                     losses=values, finite_losses=all(v == v and abs(v) != float("inf") for v in values))
        ratios = [statistics.median(s) / statistics.median(e) for s, e in zip(blocks["stock"], blocks["enabled"])
                  if statistics.median(e) > 0]
        stats.update(pairs=len(ratios), paired_x=statistics.median(ratios) if ratios else None,
                     paired_enabled_slower=sum(r < 1.0 for r in ratios) / len(ratios) if ratios else None)
    if gf is not None:
        rows["enabled"].update(stats_counts(gf.stats()))
    runs.clear()
    if cuda:
        free_memory()
        torch.cuda.reset_peak_memory_stats(device)
    for r in rows.values():
        r["paired"] = dict(stats)
    return rows["stock"], rows["enabled"], stats


# ----------------------------------------------------------------------------- runner
class SampledRunner(Runner):
    """:class:`Runner` with the sampled configs: one live (graph, sampler, batch size) source
    and its kept batches at a time; ``target_configs``: the configs ``--profile-phases``
    (bare) profiles."""

    def __init__(self, args, device: torch.device, pyg, gf, gf_reason: Optional[str]):
        super().__init__(args, device, pyg, gf, gf_reason)
        self.loaders: List[dict] = []
        self._source_key: Optional[tuple] = None
        self._source: Optional[BatchSource] = None
        self._kept: List[dict] = []
        self._source_info: dict = {}
        self.dgl_cuda = True
        self.sampler_reason: Dict[str, Optional[str]] = {}
        self.target_configs: set = set()

    def build_model(self, variant: str, layer: str, d_in: int, classes: int) -> nn.Module:
        a = self.args
        if variant == "dgl":
            return DGLNet(self.dgl, layer, d_in, classes, a.hidden, a.heads, a.attn_dropout, a.feat_dropout,
                          a.num_layers)
        return super().build_model(variant, layer, d_in, classes)

    def prepare_samplers(self, samplers: Sequence[str]) -> None:
        """Why each sampler cannot run here (None when it can)."""
        for s in samplers:
            if s == "pyg":
                self.sampler_reason[s] = pyg_sampler_reason()
            elif s == "dgl":
                self.dgl = H.import_dgl()
                if self.dgl is None:
                    self.sampler_reason[s] = "skipped: DGL does not import"
                else:
                    self.sampler_reason[s] = None
                    self.dgl_cuda = dgl_cuda_ok(self.dgl, self.device)
            else:
                raise SystemExit(f"unknown sampler {s!r}; known: {', '.join(SAMPLERS)}")

    def close_source(self) -> None:
        if self._source is not None:
            self._source.close()
        self._source, self._source_key, self._kept, self._source_info = None, None, [], {}
        free_memory()

    def source(self, gname: str, sampler: str, batch_size: int) -> Tuple[BatchSource, List[dict], dict]:
        """The live source of (graph, sampler, batch size): loader built, K batches pre-sampled
        (pinned), the loader alone timed once. A failure is kept in the info's ``status``."""
        key = (gname, sampler, batch_size)
        if key == self._source_key:
            return self._source, self._kept, self._source_info
        self.close_source()
        a = self.args
        data = self.data(gname, torch.device("cpu"))
        info = {"graph": gname, "sampler": sampler, "batch_size": batch_size, "workers": a.workers,
                "fanouts": list(a.fanouts), "status": "ok"}
        self._source_key, self._source_info = key, info
        self.loaders.append(info)
        failure = self._build_source(info, data, sampler, batch_size, a.workers)
        if failure is not None and a.workers > 0:
            # e.g. too little shared memory for worker batches: the model step can still be
            # measured on batches sampled in this process; the loader then runs without workers
            print(f"  loader {gname} {sampler} batch {batch_size} with {a.workers} workers failed ({failure}); "
                  "retrying with workers=0", flush=True)
            info["workers_error"] = failure
            info["workers"] = 0
            failure = self._build_source(info, data, sampler, batch_size, 0)
        if failure is not None:
            info["status"] = f"sampler error: {failure}"
            self._kept = []
        print(f"  loader {gname} {sampler} batch {batch_size}: " + " ".join(
            f"{k}={fmt(v) if isinstance(v, float) else v}" for k, v in info.items()
            if k in ("presample_s", "batch_nodes", "batch_edges", "loader_ms", "status")), flush=True)
        return self._source, self._kept, info

    def _build_source(self, info: dict, data: Data, sampler: str, batch_size: int, workers: int) -> Optional[str]:
        """Build the loader, pre-sample, time the loader alone; None, or the error."""
        a = self.args
        if self._source is not None:
            self._source.close()
            self._source = None
        failure = None
        try:
            t = time.perf_counter()
            src = BatchSource(sampler, data, batch_size, a.fanouts, workers, self.device, self.dgl, self.dgl_cuda)
            self._source = src
            warm = max(a.warmup, a.compile_warmup if a.compile_modes else 0)
            k = max(1, min(a.presample, warm + a.steps + a.profile_steps))
            self._kept = [src.keep(src.next_raw()) for _ in range(k)]
            info["presample_s"] = round(time.perf_counter() - t, 2)
            info["presampled"] = k
            info["batch_nodes"] = statistics.mean(b["nodes"] for b in self._kept)
            info["batch_edges"] = statistics.mean(b["edges"] for b in self._kept)
            if a.pad_batches and sampler == "pyg":
                info["batch_nodes_max"] = max(b["nodes"] for b in self._kept)
                info["batch_edges_max"] = max(b["edges"] for b in self._kept)
                first = self._kept[0]
                self._kept, info["padded_nodes"], info["padded_edges"] = src.pad_kept(self._kept, a.pad_slack)
                info["padded"] = True
                info["pad_check"] = self.padding_check(first, self._kept[0])
            if a.whole:
                w = loader_alone(src, self.device, a.warmup, a.whole_steps)
                info["loader_ms"] = w["ms"]
                info["loader_host_ms_all"] = w["host_ms_all"]
        except Exception as exc:  # noqa: BLE001 - a sampler that fails is a result, not a crash
            failure = f"{type(exc).__name__}: {exc}"[:300]
            self._kept = []
        return failure

    def padding_check(self, kept: dict, padded: dict):
        """Whether padding leaves the seeds' outputs alone, on one kept batch: a stock GCNConv
        model of the run's depth (degree-normalised: a padding edge reaching a real node would
        show) in float64 on the CPU, the largest |difference| of the seeds' outputs padded and
        not (0 up to rounding); the error's text when the check itself fails."""
        try:
            torch.manual_seed(self.args.seed)
            model = self.build_model("pyg", "gcn", int(kept["x"].shape[1]), 4).double().eval()
            n = int(kept["batch_size"])
            with torch.no_grad():
                out = model(kept["x"].double(), kept["graph"])[:n]
                out_padded = model(padded["x"].double(), padded["graph"])[:n]
            return float((out - out_padded).abs().max())
        except Exception as exc:  # noqa: BLE001 - the check must not cost the run
            return f"check failed: {type(exc).__name__}: {exc}"[:200]

    def profiled(self, row: dict) -> bool:
        """Whether ``--profile-phases`` covers this sampled config (``all``, or ``targets``: the
        configs in ``target_configs``)."""
        how = self.args.profile_phases
        if how == "all":
            return not is_compiled(row)
        if how != "targets":
            return False
        if is_compiled(row):
            return False
        c = (row["graph"], row["layer_key"], row["dtype"], row["mode"], row["sampler"], row["batch_size"])
        return c in self.target_configs

    def run_sampled(self, configs: Sequence[tuple]) -> None:
        """Sampled configs: (graph, layer, dtype, mode, sampler, batch size), or with a 7th
        element, the torch.compile mode of a compiled row. Mode :data:`PAIRED` runs
        :func:`run_paired_config` and adds its stock and its enabled row."""
        a = self.args
        missing: Dict[str, str] = {}
        listed = Counter(map(tuple, configs))  # a config listed again is its next round
        runs: Dict[tuple, int] = {}
        for config in configs:
            gname, layer, dtype, mode, sampler, bsize = config[:6]
            cmode = config[6] if len(config) > 6 else None
            row = {"graph": gname, "layer_key": layer, "layer": sampled_layer_label(sampler, layer), "dtype": dtype,
                   "mode": mode, "sampler": sampler, "batch_size": bsize}
            if listed[tuple(config)] > 1:
                runs[tuple(config)] = row["round"] = runs.get(tuple(config), 0) + 1
            if cmode:
                row.update(compile=cmode, compile_backend=a.compile_backend)
            status = None
            if self.over_budget():
                status = "skipped: time budget"
            elif mode in ("enabled", PAIRED) and self.gf is None:
                status = f"skipped: {self.gf_reason}"
            elif self.sampler_reason.get(sampler):
                status = self.sampler_reason[sampler]
            elif sampler == "dgl" and mode in ("stock", PAIRED) and not self.dgl_cuda:
                status = DGL_NOT_RUNNABLE
            elif gname in missing:
                status = missing[gname]
            elif cmode and sampler != "pyg":
                status = "skipped: compiled rows use the PyG sampler only"
            if status is None:
                self.mark_running(tuple(config))
                try:
                    with watchdog(a.config_timeout):
                        source, kept, info = self.source(gname, sampler, bsize)
                except FileNotFoundError as exc:
                    print(f"{gname}: {exc}", flush=True)
                    missing[gname] = status = "missing data"
                else:
                    if info.get("status") != "ok":
                        status = info["status"]
            if status is not None:
                for mode_row in (("stock", "enabled") if mode == PAIRED else (mode,)):
                    self.add(dict(row, mode=mode_row, status=status))
                continue
            data = self._data
            row.update(nodes=data.num_nodes, edges=int(data.edge_index.shape[1]), workers=info.get("workers"),
                       batch_nodes=info.get("batch_nodes"), batch_edges=info.get("batch_edges"),
                       loader_ms=info.get("loader_ms"))
            if info.get("padded"):
                row.update(padded=True, padded_nodes=info["padded_nodes"], padded_edges=info["padded_edges"])
            if mode == PAIRED:
                with watchdog(a.config_timeout):
                    stock, enabled, _ = run_paired_config(self.model_factory(data, layer, sampler), source, kept,
                                                          dtype, self.device, a.warmup, a.steps, a.lr, a.seed, self.gf,
                                                          frameworks=sampler,
                                                          control=getattr(a, "paired_control", False))
                for side in (stock, enabled):
                    self.add(dict(row, mode="stock" if side is stock else "enabled", **side))
                continue
            with watchdog(a.config_timeout):
                row.update(run_sampled_config(
                    self.model_factory(data, layer, sampler), source, kept, dtype, mode, self.device, a.warmup,
                    a.steps, a.lr, a.seed, self.gf, frameworks=sampler, whole_steps=a.whole_steps if a.whole else 0,
                    profile_steps=a.profile_steps if self.profiled(row) else 0,
                    budget_ok=lambda: not self.over_budget(), compile_mode=cmode, compile_backend=a.compile_backend,
                    compile_warmup=a.compile_warmup))
            bound = sampler_bound(row.get("loader_ms"), row.get("step_ms"))
            if bound:
                row["bound"] = bound
            self.add(row)
        self.close_source()
        self._data = None
        free_memory()


# ----------------------------------------------------------------------------- command line
def add_sampled_args(p: argparse.ArgumentParser, samplers: Sequence[str] = SAMPLERS) -> None:
    """The sampled mini-batch options (``bench_train_sampled``, ``bench_compile``)."""
    g = p.add_argument_group("sampled mini-batches")
    g.add_argument("--samplers", default=",".join(samplers), help="comma list of pyg, dgl")
    g.add_argument("--batch-sizes", default=None,
                   help=f"seeds per batch, comma list (default {','.join(map(str, BATCH_SIZES))}; CPU: "
                        f"{','.join(map(str, CPU_BATCH_SIZES))})")
    g.add_argument("--fanouts", default=",".join(map(str, FANOUTS)),
                   help="neighbours per hop, the hop next to the seeds first (default 15,10,5); one per layer")
    g.add_argument("--workers", type=int, default=DEFAULT_WORKERS, help="loader worker processes (default 4)")
    g.add_argument("--presample", type=int, default=PRESAMPLE_MAX,
                   help=f"at most this many distinct batches pre-sampled for the model step (default {PRESAMPLE_MAX})")
    g.add_argument("--whole", action=argparse.BooleanOptionalAction, default=True,
                   help="also time the whole step with the real loader and the loader alone (default on)")
    g.add_argument("--whole-steps", type=int, default=None, help="timed steps of the whole step (default --steps)")
    g.add_argument("--profile-phases", nargs="?", const="targets", default="off", choices=["off", "targets", "all"],
                   help="per-phase breakdown of the model step (graph build, forward, backward, optimizer; GPU and "
                        "host time; kernels by torch.profiler) for the targets' configs (bare flag) or all")
    g.add_argument("--profile-steps", type=int, default=3, help="cold/warm step pairs per profiled config (default 3)")
    g.add_argument("--pad-slack", type=float, default=PAD_SLACK,
                   help=f"padded batches: caps = largest of the pre-sampled batches x this, rounded up to "
                        f"{PAD_MULTIPLE} (default {PAD_SLACK})")


def finish_sampled_args(args, device: torch.device) -> None:
    """Checks and defaults of :func:`add_sampled_args` (after the common ones): ``args.samplers``,
    ``args.batch_sizes``, ``args.fanouts`` (one per layer) as lists."""
    cpu = device.type != "cuda"
    args.samplers = H.names(args.samplers, SAMPLERS, "--samplers")
    args.batch_sizes = H.int_list(args.batch_sizes, "--batch-sizes") if args.batch_sizes else \
        (CPU_BATCH_SIZES if cpu else BATCH_SIZES)
    fanouts = H.int_list(args.fanouts, "--fanouts")
    args.fanouts = (fanouts + [fanouts[-1]] * args.num_layers)[:args.num_layers]  # one per layer
    args.whole_steps = args.whole_steps if args.whole_steps is not None else args.steps
    if args.whole and args.whole_steps < 1:
        raise SystemExit("--whole-steps must be at least 1")
    args.profile_steps = max(args.profile_steps, 1) if args.profile_phases != "off" else 0
    args.presample = max(args.presample, 1)
    if args.pad_slack < 1.0:
        raise SystemExit("--pad-slack must be at least 1")


def sampled_settings(args, graphs: Sequence[str], order: Sequence[tuple]) -> dict:
    """``settings.sampled`` of the JSON."""
    out = {"graphs": list(graphs), "samplers": args.samplers, "batch_sizes": args.batch_sizes, "fanouts": args.fanouts,
           "workers": args.workers, "prefetch_factor": PREFETCH_FACTOR, "presample": args.presample,
           "whole": args.whole, "whole_steps": args.whole_steps if args.whole else 0,
           "profile_steps": args.profile_steps, "profile_phases": args.profile_phases,
           "padded": args.pad_batches, "order": [list(c) for c in order]}
    if args.pad_batches:
        out.update(pad_slack=args.pad_slack, pad_multiple=PAD_MULTIPLE, padded_samplers=["pyg"])
    return out


def run_sampled_configs(runner: SampledRunner, configs: Sequence[tuple]) -> None:
    """Check the samplers (the JSON says which can run and where DGL's blocks live), then run."""
    a = runner.args
    runner.prepare_samplers(a.samplers)
    runner.settings["sampled"].update(
        sampler_status={s: r or "ok" for s, r in runner.sampler_reason.items()},
        dgl_blocks_on=("device" if runner.dgl_cuda else "cpu") if "dgl" in a.samplers else None)
    for s, r in runner.sampler_reason.items():
        if r:
            print(f"note: sampler {s}: {r}", flush=True)
    runner.run_sampled(configs)
