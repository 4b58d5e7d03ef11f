"""Torch operations, kernel launches and host synchronisations of one training step, counted on
the CPU with the fused path's CUDA decisions: a view of the host path without a GPU.

    python -m benchmarks.count_step_ops                           # every layer, stock / exact / static
    python -m benchmarks.count_step_ops --layers gcn --routes exact --top 12

On a GPU a sampled training step is bound by the host: each torch operation costs a kernel
launch (views excepted) on top of its Python and dispatch, and each read of a device value
stalls the host until the GPU drains. Those costs follow from what the step issues, which this
tool counts on the CPU under :func:`benchmarks.dry.cuda_decisions`: CPU tensors, the fused
path's CUDA decisions, plans and launchers, kernel launches and cuSPARSE products recorded and
skipped (nothing is computed: values are garbage and are not checked). Per step:

* ``ops``: aten operations dispatched (the model's, autograd's and the optimizer's included);
* ``launches``: the package's own kernel launches; ``cusparse``: cuSPARSE products;
* ``syncs``: operations that read a device value on the host on a GPU (``.item()``,
  ``.tolist()``, ``nonzero``, boolean-mask indexing, ``repeat_interleave`` without an output
  size, ...; not the optimizer's reads of its step counts, which live on the host);
* ``blocking_copies``: tensors made from Python data (``torch.tensor(1.0, device=...)``), on a
  GPU a blocking host-to-device copy, so a synchronisation too;
* with ``--top N``: the most frequent operations and the package functions that issue them.

A new graph is built as on a GPU: the build kernels (edge facts, row offsets) are launches,
their outputs filled in by the CPU, and the read of the edge facts (a new graph's one
synchronisation) counts as a sync. The tuner is off (``GNN_FASTPATH_TUNE=0``): the rules
decide, as on a class not yet timed.

The step: PyG's layer twice (32 features, ``--dtypes``), a new sampled-like graph
(``--targets`` destinations with 1-10 in-edges each, sources among 4x as many nodes, one with
``--hub`` out-edges), forward, loss on the targets, backward, Adam; after two warm-up steps on
other graphs of the same size. Results: ``--json`` (default
``benchmarks/results/count_step_ops.json``) and a markdown table (``--markdown``).
"""
from __future__ import annotations

import argparse
import contextlib
from typing import Dict, List, Optional

import torch
import torch.nn.functional as F

from . import harness as H
from .dry import Tally, cuda_decisions

NAME = "count_step_ops"
LAYERS = ("gatv2", "transformer", "gat", "gcn", "sage_max", "sage_mean")
ROUTES = ("stock", "exact", "static")
WIDTH = 32
FANOUT = 10

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
           "launches": sum(rec.launches.values()), "cusparse": rec.cusparse,
           "syncs": tally.syncs + rec.host_reads,
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
