"""Small graphs as new users meet them: PyG-example-shaped training epochs, stock against
``gnn_fastpath.enabled()``, and the graph size where the fused path starts to win.

Two questions, one command each part:

* ``examples``: per-epoch time of the models of PyG's own example scripts on the Planetoid
  graphs they use (``gcn.py``: GCNConv x2, hidden 16, ``cached=True``; ``gat.py``: GATConv 8
  heads x 8 then 1 head, dropout 0.6; ``agnn.py``: Linear, AGNNConv x2, Linear; ``sage``: the
  SAGEConv(mean) x2 model of ``dir_gnn.py``'s SAGE variant), ``NormalizeFeatures``, Adam with
  the scripts' learning rate and weight decay. An epoch is what the scripts time: one training
  step, then one evaluation forward over every node with the accuracy of the three masks read
  back. Reported: mean ms per epoch after ``--warmup`` epochs, per seed, and the test accuracy.
  Stock runs first on even seeds, the enabled model on odd ones (and alternately per size in
  the sweep), so a drift of the machine does not favour one side.
* ``sweep``: the crossover. A two-layer model of each layer (``--layers``) on random graphs of
  growing size (``--nodes``, average in-degree ``--degree``, ``--features`` wide), one training
  step per measurement (forward, loss, backward, Adam), stock against enabled: where the
  enabled step is slower, the row says so; ``crossover`` is the smallest size from which the
  enabled step is no slower at every larger size measured.

    python -m benchmarks.bench_examples                                  # both parts, GPU
    python -m benchmarks.bench_examples --parts sweep --layers gcn,gat --nodes 1000,10000
    python -m benchmarks.bench_examples --device cpu --epochs 2 --warmup 1 --seeds 0 \\
        --nodes 200 --steps 2                                             # CPU smoke (reference)

The Planetoid raw files (``ind.cora.*``, ``ind.citeseer.*``) are looked up as the other
benchmarks look up data (:func:`benchmarks.graphs.data_dirs`: ``--data-dir``,
``$GNN_FASTPATH_DATA``, ``../shared/data``, ``./.data``) and processed offline by PyG's own
``Planetoid`` class in a temporary folder. On the CPU the enabled runs use
``enable(cpu="reference")``, so the smoke run goes through the shims.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F

from . import graphs, harness

EXAMPLES = ("gcn", "gat", "agnn", "sage")
DATASETS = ("cora", "citeseer")
SWEEP_LAYERS = ("gcn", "gcn_cached", "sage_mean", "sage_sum", "sage_max", "gin", "graphconv", "agnn", "gat", "gatv2",
                "transformer")


# ------------------------------------------------------------------------------ the models
def example_model(name: str, n_features: int, n_classes: int) -> torch.nn.Module:
    """The model of PyG example ``name`` (module docstring) and its (lr, weight_decay)."""
    from torch_geometric.nn import AGNNConv, GATConv, GCNConv, SAGEConv

    class GCN(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = GCNConv(n_features, 16, cached=True)
            self.conv2 = GCNConv(16, n_classes, cached=True)

        def forward(self, x, edge_index):
            x = F.dropout(x, 0.5, self.training)
            x = F.dropout(self.conv1(x, edge_index).relu(), 0.5, self.training)
            return self.conv2(x, edge_index)

    class GAT(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = GATConv(n_features, 8, heads=8, dropout=0.6)
            self.conv2 = GATConv(64, n_classes, heads=1, concat=False, dropout=0.6)

        def forward(self, x, edge_index):
            x = F.dropout(x, 0.6, self.training)
            x = F.dropout(F.elu(self.conv1(x, edge_index)), 0.6, self.training)
            return self.conv2(x, edge_index)

    class AGNN(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin1 = torch.nn.Linear(n_features, 16)
            self.prop1 = AGNNConv(requires_grad=False)
            self.prop2 = AGNNConv(requires_grad=True)
            self.lin2 = torch.nn.Linear(16, n_classes)

        def forward(self, x, edge_index):
            x = F.relu(self.lin1(F.dropout(x, 0.5, self.training)))
            x = self.prop2(self.prop1(x, edge_index), edge_index)
            return self.lin2(F.dropout(x, 0.5, self.training))

    class SAGE(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = SAGEConv(n_features, 64)
            self.conv2 = SAGEConv(64, n_classes)

        def forward(self, x, edge_index):
            x = F.dropout(self.conv1(x, edge_index).relu(), 0.5, self.training)
            return self.conv2(x, edge_index)

    return {"gcn": GCN, "gat": GAT, "agnn": AGNN, "sage": SAGE}[name]()


OPTIMISER = {"gcn": (0.01, 5e-4), "gat": (0.005, 5e-4), "agnn": (0.01, 5e-4), "sage": (0.01, 5e-4)}


def sweep_model(layer: str, features: int, classes: int) -> torch.nn.Module:
    """Two layers of ``layer``, ``features`` wide (4 heads for the attention layers)."""
    from torch_geometric.nn import AGNNConv, GATConv, GATv2Conv, GCNConv, GINConv, GraphConv, SAGEConv, TransformerConv

    def make(i: int, o: int, last: bool):
        if layer in ("gcn", "gcn_cached"):
            return GCNConv(i, o, cached=layer == "gcn_cached")
        if layer.startswith("sage_"):
            return SAGEConv(i, o, aggr=layer[len("sage_"):])
        if layer == "gin":
            return GINConv(torch.nn.Sequential(torch.nn.Linear(i, o), torch.nn.ReLU(), torch.nn.Linear(o, o)))
        if layer == "graphconv":
            return GraphConv(i, o)
        if layer == "agnn":  # AGNNConv keeps the width: a Linear after it
            return torch.nn.ModuleList([AGNNConv(), torch.nn.Linear(i, o)])
        heads = 1 if last else 4
        width = o if last else o // heads
        cls = {"gat": GATConv, "gatv2": GATv2Conv, "transformer": TransformerConv}[layer]
        return cls(i, width, heads=heads)

    class Two(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = make(features, features, False)
            self.conv2 = make(features, classes, True)

        @staticmethod
        def _layer(conv, x, edge_index):
            if isinstance(conv, torch.nn.ModuleList):
                return conv[1](conv[0](x, edge_index))
            return conv(x, edge_index)

        def forward(self, x, edge_index):
            return self._layer(self.conv2, self._layer(self.conv1, x, edge_index).relu(), edge_index)

    return Two()


# ------------------------------------------------------------------------------- the runs
def planetoid_raw(name: str, data_dir) -> Optional[Path]:
    """The folder holding the Planetoid raw files ``ind.<name>.*`` (``name`` lower case, as
    the files are named), looked up in :func:`benchmarks.graphs.data_dirs`; None if absent."""
    for base in graphs.data_dirs(data_dir):
        for sub in ("planetoid", ".", f"{name.capitalize()}/raw"):
            if (base / sub / f"ind.{name}.graph").is_file():
                return base / sub
    return None


def planetoid(name: str, data_dir, root: Path, device: torch.device):
    """PyG's Planetoid ``name`` (NormalizeFeatures) processed from the raw files found."""
    import torch_geometric.transforms as T
    from torch_geometric.datasets import Planetoid

    raw = root / name.capitalize() / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    found = planetoid_raw(name, data_dir)
    if found is None:
        raise FileNotFoundError(f"the Planetoid raw files ind.{name}.* were not found in "
                                f"{', '.join(map(str, graphs.data_dirs(data_dir)))}")
    for f in found.glob(f"ind.{name}.*"):
        shutil.copy(f, raw / f.name)
    dataset = Planetoid(str(root), name.capitalize(), transform=T.NormalizeFeatures())
    return dataset, dataset[0].to(device)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def example_epochs(name: str, dataset, data, seed: int, enabled: bool, a, device, gf) -> dict:
    """One run of example ``name``: mean ms per epoch and the final accuracies."""
    torch.manual_seed(seed)
    model = example_model(name, dataset.num_features, dataset.num_classes).to(device)
    lr, wd = OPTIMISER[name]
    opt = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=wd)
    masks = (data.train_mask, data.val_mask, data.test_mask)

    def epoch():
        model.train()
        opt.zero_grad()
        out = model(data.x, data.edge_index)
        F.cross_entropy(out[data.train_mask], data.y[data.train_mask]).backward()
        opt.step()
        model.eval()
        with torch.no_grad():
            pred = model(data.x, data.edge_index).argmax(-1)
        return [int((pred[m] == data.y[m]).sum()) / int(m.sum()) for m in masks]

    with switch(gf, enabled, device):
        if enabled:
            gf.reset_stats()
        for _ in range(a.warmup):
            epoch()
        sync(device)
        t0 = time.perf_counter()
        for _ in range(a.epochs):
            accs = epoch()
        sync(device)
        ms = (time.perf_counter() - t0) / a.epochs * 1e3
        stats = gf.stats() if enabled else None
    return {"ms_per_epoch": ms, "train_acc": accs[0], "val_acc": accs[1], "test_acc": accs[2],
            "fused_path": None if stats is None else harness_stats(stats)}


def harness_stats(stats: dict) -> str:
    """``stats()`` per layer class as 'Layer: cuda n, reference n, fallback reason n'."""
    parts = []
    for layer, entry in stats.items():
        if not isinstance(entry, dict) or "fused" not in entry:
            continue
        fused = ", ".join(f"{k} {v}" for k, v in entry["fused"].items() if v)
        fallback = ", ".join(f"fallback {k} {v}" for k, v in entry.get("fallback", {}).items())
        parts.append(f"{layer}: {', '.join(p for p in (fused, fallback) if p) or 'not called'}")
    return "; ".join(parts)


def switch(gf, enabled: bool, device: torch.device):
    """``gnn_fastpath.enabled(frameworks="pyg")`` (on the CPU with the reference ops), or nothing."""
    import contextlib

    if not enabled:
        return contextlib.nullcontext()
    return gf.enabled(frameworks="pyg", cpu="reference" if device.type == "cpu" else None)


def sweep_step_ms(layer: str, nodes: int, a, device, gf, enabled: bool) -> Tuple[float, str]:
    """(median ms of one training step of the two-layer ``layer`` model on a random graph,
    what ran: the layers' ``stats()`` when enabled). ``a.rule == "off"``: the enabled runs
    take the fused path at every size (``GNN_FASTPATH_SMALL_GRAPH=off``)."""
    g = torch.Generator().manual_seed(a.seeds[0])
    m = nodes * a.degree
    edge_index = torch.randint(0, nodes, (2, m), generator=g).to(device)
    x = torch.randn(nodes, a.features, generator=g).to(device)
    y = torch.randint(0, 8, (nodes,), generator=g).to(device)
    torch.manual_seed(a.seeds[0])
    model = sweep_model(layer, a.features, 8).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)

    def step():
        opt.zero_grad()
        F.cross_entropy(model(x, edge_index), y).backward()
        opt.step()

    rule = os.environ.get("GNN_FASTPATH_SMALL_GRAPH")
    if enabled and a.rule == "off":
        os.environ["GNN_FASTPATH_SMALL_GRAPH"] = "off"
    try:
        with switch(gf, enabled, device):
            gf.reset_stats()
            for _ in range(a.warmup):
                step()
            times = []
            for _ in range(a.steps):
                sync(device)
                t0 = time.perf_counter()
                step()
                sync(device)
                times.append((time.perf_counter() - t0) * 1e3)
            ran = harness_stats(gf.stats()) if enabled else "stock"
    finally:
        if rule is None:
            os.environ.pop("GNN_FASTPATH_SMALL_GRAPH", None)
        else:
            os.environ["GNN_FASTPATH_SMALL_GRAPH"] = rule
    return statistics.median(times), ran


def crossover(rows: List[dict]) -> Optional[int]:
    """The smallest node count from which the enabled step is no slower at every larger size
    (rows of one layer, any order); None when it is slower at the largest."""
    ordered = sorted((r for r in rows if r.get("speedup") is not None), key=lambda r: r["nodes"])
    best = None
    for r in reversed(ordered):
        if r["speedup"] < 1.0:
            break
        best = r["nodes"]
    return best


# ------------------------------------------------------------------------------ command line
def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", default="examples,sweep", help="comma list of examples, sweep")
    p.add_argument("--examples", default=",".join(EXAMPLES), help=f"comma list of {', '.join(EXAMPLES)}")
    p.add_argument("--datasets", default="cora", help=f"comma list of {', '.join(DATASETS)}")
    p.add_argument("--seeds", default="0,1", help="comma list of seeds")
    p.add_argument("--epochs", type=int, default=100, help="timed epochs per run (default 100)")
    p.add_argument("--warmup", type=int, default=5, help="untimed epochs or steps first (default 5)")
    p.add_argument("--layers", default=",".join(SWEEP_LAYERS), help=f"sweep: comma list of {', '.join(SWEEP_LAYERS)}")
    p.add_argument("--nodes", default="1000,4000,16000,64000,256000", help="sweep: comma list of node counts")
    p.add_argument("--degree", type=int, default=8, help="sweep: average in-degree (default 8)")
    p.add_argument("--features", type=int, default=64, help="sweep: hidden width (default 64)")
    p.add_argument("--steps", type=int, default=20, help="sweep: timed steps per measurement (default 20)")
    p.add_argument("--rule", default="on", choices=("on", "off"),
                   help="sweep: 'off' runs the fused path at every size (GNN_FASTPATH_SMALL_GRAPH=off), to "
                        "measure the crossovers the small-graph rule is built from (default on)")
    p.add_argument("--device", default="auto", help="auto (cuda when available), cuda or cpu")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--time-budget", type=float, default=None,
                   help="seconds: start no new measurement after this; what was measured is written")
    p.add_argument("--json", default=None, help="JSON path (default <out>/bench_examples.json)")
    p.add_argument("--markdown", default=None, help="markdown path (default <out>/bench_examples.md; '' for none)")
    p.add_argument("--out", default=None, help="results directory (default benchmarks/results/)")
    a = p.parse_args(argv)
    device = harness.pick_device(a.device)
    parts = harness.names(a.parts, ("examples", "sweep"), "--parts")
    examples = harness.names(a.examples, EXAMPLES, "--examples")
    datasets = harness.names(a.datasets, DATASETS, "--datasets")
    layers = harness.names(a.layers, SWEEP_LAYERS, "--layers")
    try:
        a.seeds = [int(t) for t in a.seeds.split(",") if t.strip()]
    except ValueError:
        raise SystemExit(f"--seeds: expected a comma list of integers, got {a.seeds!r}") from None
    sizes = harness.int_list(a.nodes, "--nodes")
    harness.import_pyg()
    gf, why = harness.fastpath()
    if gf is None:
        print(why, file=sys.stderr)
        return 1
    start = time.perf_counter()

    def over() -> bool:
        return a.time_budget is not None and time.perf_counter() - start > a.time_budget

    example_rows: List[dict] = []
    sweep_rows: List[dict] = []
    if "examples" in parts:
        with tempfile.TemporaryDirectory() as tmp:
            for ds_name in datasets:
                dataset, data = planetoid(ds_name, a.data_dir, Path(tmp), device)
                for name in examples:
                    for seed in a.seeds:
                        if over():
                            example_rows.append({"dataset": ds_name, "example": name, "seed": seed,
                                                 "status": "skipped: time budget"})
                            continue
                        row: Dict[str, object] = {"dataset": ds_name, "example": name, "seed": seed, "status": "ok"}
                        # which runs first alternates with the seed: a drift of the machine
                        # (clocks, allocator, caches) then does not favour one side
                        for mode in ("stock", "enabled") if seed % 2 == 0 else ("enabled", "stock"):
                            r = example_epochs(name, dataset, data, seed, mode == "enabled", a, device, gf)
                            for k, v in r.items():
                                row[f"{mode}_{k}"] = v
                        row["speedup"] = row["stock_ms_per_epoch"] / row["enabled_ms_per_epoch"]
                        row["verdict"] = "slower" if row["speedup"] < 1.0 else "no slower"
                        example_rows.append(row)
                        print(f"{ds_name} {name} seed {seed}: stock {row['stock_ms_per_epoch']:.2f} ms, "
                              f"enabled {row['enabled_ms_per_epoch']:.2f} ms", flush=True)
    if "sweep" in parts:
        for layer in layers:
            for nodes in sizes:
                row = {"layer": layer, "nodes": nodes, "edges": nodes * a.degree, "status": "ok"}
                if over():
                    row["status"] = "skipped: time budget"
                else:
                    try:
                        order = (False, True) if sizes.index(nodes) % 2 == 0 else (True, False)
                        for enabled in order:  # alternating, as the examples
                            ms, ran = sweep_step_ms(layer, nodes, a, device, gf, enabled)
                            row["enabled_ms" if enabled else "stock_ms"] = ms
                            if enabled:
                                row["ran"] = ran
                        row["speedup"] = row["stock_ms"] / row["enabled_ms"]
                    except Exception as exc:  # noqa: BLE001 (OOM or a failure of one size: the row says so)
                        row["status"] = f"{type(exc).__name__}: {str(exc)[:200]}"
                        harness.free_memory()
                sweep_rows.append(row)
                print(f"sweep {layer} {nodes} nodes: {row.get('stock_ms')} -> {row.get('enabled_ms')}", flush=True)
    crossovers = {layer: crossover([r for r in sweep_rows if r["layer"] == layer]) for layer in layers
                  if any(r["layer"] == layer for r in sweep_rows)}

    env = harness.environment()
    payload = {"benchmark": "examples", "environment": env,
               "settings": {k: v for k, v in vars(a).items() if k not in ("json", "markdown", "out")},
               "rows": example_rows, "sweep": sweep_rows, "crossover_nodes": crossovers}
    fmt = harness.fmt
    text = [f"### PyG-example-shaped epochs and the small-graph crossover ({device.type})", "",
            harness.env_header(env), ""]
    if example_rows:
        text += [harness.markdown_table(
            example_rows, ["dataset", "example", "seed", "stock_ms_per_epoch", "enabled_ms_per_epoch", "speedup",
                           "verdict", "stock_test_acc", "enabled_test_acc", "enabled_fused_path", "status"],
            ["graph", "example", "seed", "stock ms/epoch", "enabled ms/epoch", "x", "enabled", "stock test acc",
             "enabled test acc", "fused path", "status"],
            {k: fmt for k in ("stock_ms_per_epoch", "enabled_ms_per_epoch", "speedup")}
            | {k: (lambda v: fmt(v, 3)) for k in ("stock_test_acc", "enabled_test_acc")}), ""]
    if sweep_rows:
        text += [harness.markdown_table(
            sweep_rows, ["layer", "nodes", "edges", "stock_ms", "enabled_ms", "speedup", "ran", "status"],
            ["layer x2", "nodes", "edges", "stock ms/step", "enabled ms/step", "x", "what ran (enabled)", "status"],
            {k: fmt for k in ("stock_ms", "enabled_ms", "speedup")}), "",
            "Crossover (enabled no slower from this many nodes up): "
            + ", ".join(f"{k} {v if v is not None else 'none'}" for k, v in crossovers.items()), ""]
    out = harness.out_dir(a.out)
    json_path = a.json if a.json is not None else out / "bench_examples.json"
    md_path = a.markdown if a.markdown is not None else out / "bench_examples.md"
    harness.publish(payload, "\n".join(text), json_path, md_path or None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
