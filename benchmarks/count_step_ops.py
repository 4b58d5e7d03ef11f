"""Torch operations, kernel launches and host synchronisations of one training step, counted on
the CPU with the fused path's CUDA decisions: a view of the host path without a GPU.

    python -m benchmarks.count_step_ops                           # every layer, stock / exact / static
    python -m benchmarks.count_step_ops --layers gcn --routes exact --top 12

On a GPU a sampled training step is bound by the host: each torch operation costs a kernel
launch (views excepted) and 10-30 us of Python and dispatch, and each read of a device value
stalls the host until the GPU drains. Those costs follow from what the step issues, which this
tool counts on the CPU: the layers run on CPU tensors while the ops' dispatch answers "cuda",
so the fused path's decisions, plans and launchers run as on a GPU; kernel launches are
recorded and skipped (nothing is computed: values are garbage and are not checked), and so are
cuSPARSE products; the custom operators of the static route run their CUDA implementation too.
Per step:

* ``ops``: aten operations dispatched (the model's, autograd's and the optimizer's included);
* ``launches``: the package's own kernel launches; ``cusparse``: cuSPARSE products;
* ``syncs``: operations that read a device value on the host on a GPU (``.item()``,
  ``.tolist()``, ``nonzero``, boolean-mask indexing, ``repeat_interleave`` without an output
  size, ...; not the optimizer's reads of its step counts, which live on the host);
* ``blocking_copies``: tensors made from Python data (``torch.tensor(1.0, device=...)``), on a
  GPU a blocking host-to-device copy, so a synchronisation too;
* with ``--top N``: the most frequent operations and the package functions that issue them.

Unlike a GPU, the exact route's graph build takes its CPU code (on a GPU: a few kernels and one
read-back), so the exact route's build counts are not the GPU's; the rest of the step is. The
tuner is off (``GNN_FASTPATH_TUNE=0``): the rules decide, as on a class not yet timed.

The step: PyG's layer twice (32 features, ``--dtypes``), a new sampled-like graph
(``--targets`` destinations with 1-10 in-edges each, sources among 4x as many nodes, one with
``--hub`` out-edges), forward, loss on the targets, backward, Adam; after two warm-up steps on
other graphs of the same size. Results: ``--json`` (default
``benchmarks/results/count_step_ops.json``) and a markdown table (``--markdown``).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import types
from collections import Counter
from typing import Dict, List, Optional

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from . import harness as H

NAME = "count_step_ops"
LAYERS = ("gatv2", "transformer", "gat", "gcn", "sage_max", "sage_mean")
ROUTES = ("stock", "exact", "static")
WIDTH = 32
FANOUT = 10

#: aten operations that read a device value on the host (a synchronisation on a GPU).
SYNC_OPS = frozenset({"aten._local_scalar_dense.default", "aten.nonzero.default", "aten.masked_select.default",
                      "aten.unique_consecutive.default", "aten._unique2.default", "aten.unique_dim.default",
                      "aten.bincount.default", "aten.is_nonzero.default", "aten.equal.default",
                      "aten.repeat_interleave.Tensor"})
#: aten's operation for a tensor made from Python data (a blocking copy to a GPU).
FROM_PYTHON_DATA = "aten.lift_fresh.default"
_PACKAGE_DIRS = (os.sep + "gnn_fastpath" + os.sep, os.sep + "integrations" + os.sep)


def _reads_back(name: str, args, kwargs) -> bool:
    if name == "aten.repeat_interleave.Tensor":
        return kwargs.get("output_size") is None
    if name in SYNC_OPS:
        return True
    if name.startswith(("aten.index.Tensor", "aten.index_put")) and len(args) > 1 and args[1] is not None:
        return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1])
    return False


def _in_optimizer() -> bool:
    """Whether torch.optim issues the operation (its step counts live on the host, also with a
    GPU: their reads are not synchronisations)."""
    frame = sys._getframe(2)
    while frame is not None:
        if os.sep + "optim" + os.sep in frame.f_code.co_filename:
            return True
        frame = frame.f_back
    return False


def _issuer() -> str:
    """``file:function`` of the innermost package frame on the stack (else the model's code)."""
    frame = sys._getframe(2)
    while frame is not None:
        path = frame.f_code.co_filename
        if any(d in path for d in _PACKAGE_DIRS) and not path.endswith("count_step_ops.py"):
            for d in _PACKAGE_DIRS:
                if d in path:
                    return d.strip(os.sep) + "/" + path.split(d, 1)[1] + ":" + frame.f_code.co_name
        frame = frame.f_back
    return "(model, autograd, optimizer)"


class Tally(TorchDispatchMode):
    """Counts what is dispatched under it (see the module docstring)."""

    def __init__(self, attribute: bool = False):
        super().__init__()
        self.attribute = attribute
        self.ops: Counter = Counter()
        self.issuers: Counter = Counter()
        self.syncs = 0
        self.blocking_copies = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = str(func)
        self.ops[name] += 1
        if name == FROM_PYTHON_DATA:
            self.blocking_copies += 1
        elif _reads_back(name, args, kwargs) and not _in_optimizer():
            self.syncs += 1
        if self.attribute:
            self.issuers[_issuer()] += 1
        return func(*args, **kwargs)

    def add(self, other: "Tally") -> None:
        self.ops.update(other.ops)
        self.issuers.update(other.issuers)
        self.syncs += other.syncs
        self.blocking_copies += other.blocking_copies


class _Recorder:
    """What the stubs saw while counting (launch names, cuSPARSE products, custom-operator bodies)."""

    def __init__(self, attribute: bool):
        self.attribute = attribute
        self.active = False
        self.launches: Counter = Counter()
        self.cusparse = 0
        self.inner = Tally(attribute)


@contextlib.contextmanager
def cuda_decisions(attribute: bool = False):
    """CPU tensors take the fused path's CUDA route with stubbed launches (module docstring);
    yields the :class:`_Recorder`. Everything patched is restored on exit."""
    from gnn_fastpath import cuda
    from gnn_fastpath.cuda import launch
    from gnn_fastpath.cuda.cusparse import CsrMatrix
    from gnn_fastpath.ops import dispatch, library

    rec = _Recorder(attribute)
    stub = types.SimpleNamespace(get_function=lambda name: types.SimpleNamespace(ptr=0, name=name))
    decide = dispatch.decide

    def record_launch(kernel, grid, block, *, shared_mem=0, **args):
        if rec.active:
            rec.launches[kernel.name.split("<")[0]] += 1

    def record_product(matrix, values, b, c, transpose=False):
        if rec.active:
            rec.cusparse += 1
        return c

    def cuda_implementation(impl):
        def run(*args, **kwargs):
            kwargs.pop("use_reference", None)  # the CUDA implementation, also on CPU tensors
            if not rec.active:
                return impl(*args, **kwargs)
            with rec.inner:  # an operator's body is dispatched below the outer mode
                return impl(*args, **kwargs)
        return run

    patches = [(launch, "_module", lambda *a, **k: stub), (launch, "_device_index", lambda device: 0),
               (launch, "resident_blocks", lambda kernel, threads, shared_mem=0: 132),
               (launch.Kernel, "launch", record_launch), (CsrMatrix, "matmul", record_product),
               (cuda, "unavailable_reason", lambda: None),
               (dispatch, "decide", lambda device, *a, **k: decide(torch.device("cuda"), *a, **k))]
    patches += [(family, "_cache", {}) for family in launch.FAMILIES]  # stubs stay out of real caches
    saved = [(obj, attr, getattr(obj, attr)) for obj, attr, _ in patches]
    impls = dict(library._IMPLS)
    try:
        for obj, attr, value in patches:
            setattr(obj, attr, value)
        for family, pair in impls.items():
            library._IMPLS[family] = tuple(cuda_implementation(f) for f in pair)
        yield rec
    finally:
        for obj, attr, value in saved:
            setattr(obj, attr, value)
        library._IMPLS.clear()
        library._IMPLS.update(impls)


def sampled_like(seed: int, targets: int, hub: int) -> torch.Tensor:
    """edge_index of a NeighborLoader-shaped batch of a graph without self loops: targets
    0..targets-1 with 1..FANOUT in-edges each, grouped by target; sources among 4 x targets
    nodes, never the target itself; source 7 with ``hub`` out-edges."""
    g = torch.Generator().manual_seed(seed)
    deg = torch.randint(1, FANOUT + 1, (targets,), generator=g)
    dst = torch.repeat_interleave(torch.arange(targets), deg)
    src = torch.randint(0, 4 * targets, (dst.numel(),), generator=g)
    src[torch.randperm(dst.numel(), generator=g)[:min(hub, dst.numel())]] = 7
    src = torch.where(src == dst, src + 1, src)  # a batch holds a loop only where its graph does
    return torch.stack([src, dst])


def _model(pyg, layer: str) -> torch.nn.Module:
    half = WIDTH // 2
    make = {"gatv2": lambda: pyg.nn.GATv2Conv(WIDTH, half, heads=2, dropout=0.1),
            "transformer": lambda: pyg.nn.TransformerConv(WIDTH, half, heads=2),
            "gat": lambda: pyg.nn.GATConv(WIDTH, half, heads=2),
            "gcn": lambda: pyg.nn.GCNConv(WIDTH, WIDTH),
            "sage_max": lambda: pyg.nn.SAGEConv(WIDTH, WIDTH, aggr="max"),
            "sage_mean": lambda: pyg.nn.SAGEConv(WIDTH, WIDTH)}[layer]
    return torch.nn.ModuleList([make(), make()])



def count_step(pyg, layer: str, route: str, dtype: str, targets: int, hub: int, attribute: bool = False) -> dict:
    """The counts of one training step of ``layer`` x2 on ``route`` (stock / exact / static)."""
    import gnn_fastpath as gf

    torch.manual_seed(0)
    model = _model(pyg, layer).to(getattr(torch, dtype))
    opt = torch.optim.Adam(model.parameters())
    x = torch.randn(4 * targets, WIDTH, dtype=getattr(torch, dtype))

    def step(edge_index):
        opt.zero_grad()
        h = x
        for conv in model:
            h = F.elu(conv(h, edge_index))
        h[:targets].float().square().mean().backward()
        opt.step()

    settings = dict(GNN_FASTPATH_TUNE="0", GNN_FASTPATH_SMALL_GRAPH="off",
                    GNN_FASTPATH_NEW_GRAPH="static" if route == "static" else "exact")
    with contextlib.ExitStack() as stack:
        rec = stack.enter_context(cuda_decisions(attribute))
        stack.enter_context(H.settings_env(**settings))
        if route != "stock":
            stack.enter_context(gf.enabled(frameworks="pyg"))
        gf.reset_stats()
        for seed in (10, 11):
            step(sampled_like(seed, targets, hub))
        edge_index = sampled_like(12, targets, hub)
        tally = Tally(attribute)
        rec.active = True
        with tally:
            step(edge_index)
        rec.active = False
        tally.add(rec.inner)
        stats = {k: v for k, v in gf.stats().items() if k.startswith("pyg.")}
    fused = sum(v["fused"].get("cuda", 0) for v in stats.values())
    if route != "stock" and not fused:
        raise RuntimeError(f"{layer} on the {route} route ran no fused call: {stats}")
    row = {"layer": layer, "route": route, "dtype": dtype, "ops": sum(tally.ops.values()),
           "launches": sum(rec.launches.values()), "cusparse": rec.cusparse, "syncs": tally.syncs,
           "blocking_copies": tally.blocking_copies, "kernels": dict(rec.launches)}
    if attribute:
        row["top_ops"] = tally.ops.most_common()
        row["top_issuers"] = tally.issuers.most_common()
    return row


COLUMNS = ("layer", "dtype", "route", "ops", "launches", "cusparse", "syncs", "blocking_copies")
HEADERS = ("layer x2", "dtype", "route", "aten ops", "kernel launches", "cuSPARSE calls", "syncs",
           "blocking copies")


def _markdown(payload: dict, top: int) -> str:
    lines = ["### Torch operations of one training step, counted on the CPU (CUDA decisions, launches stubbed)", "",
             f"{payload['targets']} targets, hub source of {payload['hub']} out-edges; "
             f"{H.env_header(payload['environment'])}", "", H.markdown_table(payload["rows"], COLUMNS, HEADERS)]
    if top:
        for r in payload["rows"]:
            lines += ["", f"{r['layer']} {r['dtype']} {r['route']}: " + ", ".join(
                f"{where} {n}" for where, n in r["top_issuers"][:top])]
    return "\n".join(lines) + "\n"


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", default=",".join(LAYERS), help="comma list of " + ", ".join(LAYERS))
    p.add_argument("--routes", default=",".join(ROUTES), help="comma list of " + ", ".join(ROUTES))
    p.add_argument("--dtypes", default="float32")
    p.add_argument("--targets", type=int, default=300)
    p.add_argument("--hub", type=int, default=300, help="out-edges of the popular source (default 300)")
    p.add_argument("--top", type=int, default=0, help="also the N package functions issuing most operations")
    p.add_argument("--json", default=None)
    p.add_argument("--markdown", default=None)
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    pyg = H.import_pyg()
    if pyg is None:
        print("PyG is not installed: nothing to count")
        return 0
    layers = H.names(a.layers, LAYERS, "--layers")
    routes = H.names(a.routes, ROUTES, "--routes")
    dtypes = H.parse_dtypes(a.dtypes)
    out = H.out_dir(a.out)
    json_path = a.json or str(out / f"{NAME}.json")
    md_path = a.markdown if a.markdown is not None else str(out / f"{NAME}.md")
    rows: List[Dict] = []
    env = H.environment()
    payload = {"benchmark": NAME, "environment": env,
               "settings": {k: v for k, v in vars(a).items() if k not in ("json", "markdown", "out")},
               "targets": a.targets, "hub": a.hub, "rows": rows}
    print(H.env_header(env))
    for dtype in dtypes:
        for layer in layers:
            for route in routes:
                row = count_step(pyg, layer, route, dtype, a.targets, a.hub, attribute=a.top > 0)
                rows.append(row)
                print(f"{layer:12s} {dtype:9s} {route:7s} ops {row['ops']:4d}  launches {row['launches']:3d}  "
                      f"cusparse {row['cusparse']:2d}  syncs {row['syncs']:2d}  blocking copies "
                      f"{row['blocking_copies']}", flush=True)
                if a.top:
                    for where, n in row["top_issuers"][:a.top]:
                        print(f"    {n:4d} {where}")
    H.write_json(json_path, payload)
    if md_path:
        H.write_text(md_path, _markdown(payload, a.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
