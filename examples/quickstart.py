"""Quickstart: the four ops on a real (or synthetic) graph, then stock vs enable().

    python examples/quickstart.py [--graph tolokers|synthetic] [--device cuda|cpu]

Part 1 builds a gnn_fastpath.Graph and runs each op, printing which backend ran and how long
it took. Part 2 runs a small PyG model (and a DGL one when DGL imports) stock and under
gnn_fastpath.enable(), printing whether the fused path ran (from stats()), the largest
output difference and the timings. Without a GPU it says so and still runs: the shims then
run on the pure-PyTorch reference ops (enable(cpu="reference")).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import torch

import gnn_fastpath
from gnn_fastpath import Graph

HERE = os.path.dirname(os.path.abspath(__file__))
TOLOKERS = os.path.join(HERE, "..", "..", "shared", "data", "heterophilous", "tolokers.npz")


def load_graph(name: str, device: torch.device):
    if name == "tolokers" and os.path.exists(TOLOKERS):
        pairs = torch.from_numpy(np.load(TOLOKERS)["edges"]).t()
        edge_index = torch.cat([pairs, pairs.flip(0)], 1)
        num_nodes, label = int(edge_index.max()) + 1, "tolokers (real)"
    else:
        gen = torch.Generator().manual_seed(0)
        num_nodes = 10_000
        edge_index = torch.randint(0, num_nodes, (2, 100_000), generator=gen)
        label = "synthetic"
    return edge_index.to(device), num_nodes, label


def timed(fn, device: torch.device, repeats: int = 10):
    """(result, median milliseconds) of ``fn()``; CUDA events on a GPU, wall clock on CPU."""
    out = fn()  # warm-up (compiles kernels on first use)
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            out = fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return out, float(np.median(times))


def run_ops(graph: Graph, device: torch.device) -> None:
    n, H, D, F = graph.n_src, 2, 64, 128
    x = torch.randn(n, H, D, device=device)
    att = torch.randn(H, D, device=device)
    feats = torch.randn(n, F, device=device)
    cases = {
        "gatv2_attention": (lambda: gnn_fastpath.gatv2_attention(graph, x, x, att), x),
        "dot_attention": (lambda: gnn_fastpath.dot_attention(graph, x, x, x), x),
        "spmm": (lambda: gnn_fastpath.spmm(graph, feats, norm="both"), feats),
        "segment_reduce": (lambda: gnn_fastpath.segment_reduce(graph, feats, "max"), feats),
    }
    print(f"{'op':<18}{'backend':<11}{'forward ms':>11}")
    for name, (fn, probe) in cases.items():
        _, ms = timed(fn, device, repeats=5 if device.type == "cpu" else 20)
        print(f"{name:<18}{gnn_fastpath.ops.backend_for(name, probe):<11}{ms:>11.3f}")


def compare_layer(label: str, module: torch.nn.Module, call, device: torch.device, cpu_mode: str) -> None:
    module.eval()
    with torch.no_grad():
        stock, stock_ms = timed(call, device)
        gnn_fastpath.reset_stats()
        with gnn_fastpath.enabled(cpu=cpu_mode):
            fused, fused_ms = timed(call, device)
        counts = gnn_fastpath.stats()
    diff = (stock - fused).abs().max().item()
    ran = {k: v["fused"] for k, v in counts.items()}
    fell = {k: v["fallback"] for k, v in counts.items() if v["fallback"]}
    print(f"{label:<34} stock {stock_ms:8.3f} ms   enabled {fused_ms:8.3f} ms   "
          f"speedup {stock_ms / fused_ms:5.2f}x   max |diff| {diff:.2e}")
    print(f"{'':<34} fused calls: {ran}" + (f"   fallbacks: {fell}" if fell else ""))


def run_layers(edge_index: torch.Tensor, num_nodes: int, device: torch.device, cpu_mode: str) -> None:
    try:
        from torch_geometric.nn import GATv2Conv, GCNConv, TransformerConv
    except ImportError:
        print("torch_geometric is not installed: pip install -e '.[pyg]' for the layer demo")
        return
    torch.manual_seed(0)
    x = torch.randn(num_nodes, 128, device=device)
    layers = {
        "PyG GATv2Conv(128, 64, heads=2)": GATv2Conv(128, 64, heads=2, add_self_loops=False),
        "PyG TransformerConv(128, 64, heads=2)": TransformerConv(128, 64, heads=2),
        "PyG GCNConv(128, 128)": GCNConv(128, 128),
    }
    for label, layer in layers.items():
        layer = layer.to(device)
        compare_layer(label, layer, lambda: layer(x, edge_index), device, cpu_mode)

    sys.path.insert(0, os.path.join(HERE, "..", "tests"))
    from frameworks import import_dgl

    dgl = import_dgl()
    if dgl is None:
        print("DGL is not importable here: skipping the DGL layers")
        return
    from dgl.nn import GATv2Conv as DGLGATv2Conv, GraphConv

    g = dgl.graph((edge_index[0].cpu(), edge_index[1].cpu()), num_nodes=num_nodes)
    g = dgl.add_self_loop(dgl.remove_self_loop(g))
    if device.type == "cuda":  # DGL's PyPI build is CPU-only: stock DGL cannot mix devices
        print("DGL layers: stock DGL needs the graph on the features' device; shown on CPU")
        device, x = torch.device("cpu"), x.cpu()
        cpu_mode = "reference"
    for label, layer in {"DGL GATv2Conv(128, 64, 2 heads)": DGLGATv2Conv(128, 64, num_heads=2),
                         "DGL GraphConv(128, 128)": GraphConv(128, 128)}.items():
        compare_layer(label, layer, lambda: layer(g, x), device, cpu_mode)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--graph", choices=["tolokers", "synthetic"], default=None,
                        help="default: tolokers on a GPU, a small synthetic graph on the CPU")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    device = torch.device(args.device)

    print(f"gnn_fastpath {gnn_fastpath.__version__}, torch {torch.__version__}")
    if gnn_fastpath.cuda.available():
        print(f"GPU: {torch.cuda.get_device_name(device)}; CUDA kernels available")
    else:
        print(f"No CUDA kernels here ({gnn_fastpath.cuda.unavailable_reason()}); "
              "running the reference ops and enable(cpu='reference')")
    cpu_mode = "reference" if device.type == "cpu" else "stock"

    graph_name = args.graph or ("tolokers" if device.type == "cuda" else "synthetic")
    edge_index, num_nodes, label = load_graph(graph_name, device)
    t0 = time.perf_counter()
    graph = Graph.of(edge_index, num_nodes=num_nodes)
    stats = graph.degree_stats()
    print(f"\nGraph: {label}: {graph.n_dst:,} nodes, {graph.num_edges:,} edges, built in "
          f"{(time.perf_counter() - t0) * 1e3:.1f} ms; in-degree max {stats.max}, mean {stats.mean:.1f}\n")
    run_ops(graph, device)
    print()
    run_layers(edge_index, num_nodes, device, cpu_mode)


if __name__ == "__main__":
    main()
