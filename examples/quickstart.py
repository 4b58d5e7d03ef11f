"""Quickstart: the four ops on a real (or synthetic) graph, then stock layers vs enable(), with a verdict.

    python examples/quickstart.py [--graph tolokers|synthetic] [--device cuda|cpu] [--nodes N]

Part 1 builds a gnn_fastpath.Graph and runs each op, printing which backend ran and how long
it took. Part 2 runs small PyG layers (and DGL ones when DGL imports) stock and under
gnn_fastpath.enable(), forward and backward, and for each layer prints which path ran (from
gnn_fastpath.stats()), the relative error of the output and of the gradients (input and every
parameter), and a verdict: "matches stock within rtol ...: yes/no". A last line sums up;
the exit code is 0 when every layer matches, 1 when one does not (or raised), 2 when no layer
could be compared (PyG missing).

Without a GPU it says so and still runs: the shims then run on the pure-PyTorch reference ops
(enable(cpu="reference")), which checks the shims against stock layers but says nothing about
the speed of the CUDA kernels: CPU timings are printed, labelled as meaningless.

Data: ``--graph tolokers`` (the default on a GPU) reads ``heterophilous/tolokers.npz`` (or
``tolokers.npz``) from ``$GNN_FASTPATH_DATA`` when that is set (and only there), else from
``../shared/data`` beside the repository or ``./.data`` in it; when it is not found the script
says where it looked and falls back to a synthetic graph. ``--graph synthetic`` (the default
on the CPU) is a seeded random graph of ``--nodes`` nodes and 10 edges per node.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import time
import warnings
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import torch

import gnn_fastpath
from gnn_fastpath import FastpathFallbackWarning, Graph

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(HERE)
if HERE not in sys.path:  # also when a test imports this file by path
    sys.path.insert(0, HERE)
from _common import import_dgl, import_pyg  # noqa: E402

DATA_ENV = "GNN_FASTPATH_DATA"
TOLOKERS_FILES = ("heterophilous/tolokers.npz", "tolokers.npz")

#: Largest accepted relative error, max |enabled - stock| / max |stock| per tensor, by the
#: device the comparison ran on. Both sides compute in float32 (eps = 1.2e-7) and differ only
#: in the order of the sums (and, on CUDA, in the algorithms):
#: - "cpu": the reference ops are plain PyTorch doing the stock layer's arithmetic in another
#:   order (segment softmax and scatter sums per destination row); they agree with stock to
#:   <= 1.3e-6 here (the synthetic graph, and tolokers for the DGL layers), so 1e-5 (~80 ulp)
#:   leaves headroom and still catches a real mistake (a lost edge or a wrong normalisation
#:   moves results by ~1e-3 or more). The shim test suites use the same 1e-5.
#: - "cuda": the fused kernels use an online (running-max) softmax, fp32 atomics in the
#:   backward whose order changes from run to run, and cuSPARSE's or our own SpMM; on real
#:   graphs rows reach thousands of edges (tolokers: in-degree up to ~2,100), so rounding
#:   grows by ~sqrt(degree). 1e-4 is the bound the CUDA kernel tests hold the kernels to
#:   against a float64 reference; stock PyG on CUDA has its own fp32 error of the same kind.
#:   Seen on an H200 with tolokers: <= 3.3e-6 for the three PyG layers.
TOLERANCE = {"cpu": 1e-5, "cuda": 1e-4}
#: Gradients are compared relative to at least this fraction of the layer's largest stock
#: gradient: some are mathematically zero (TransformerConv's key bias shifts every logit of a
#: softmax equally) and come out as float cancellation noise on either path. As in the tests.
GRAD_FLOOR = 1e-2
#: Relative perturbation multiplied into the enabled outputs before they are compared
#: (output * (1 + PERTURB)): 0 here; tests set it to show that the verdict can say "no".
PERTURB = 0.0

CPU_CAVEAT = ("timings on CPU compare the pure-PyTorch reference with stock PyG/DGL and mean "
              "nothing about the GPU kernels")


# --------------------------------------------------------------------------- data
def tolokers_candidates() -> List[str]:
    """Where tolokers.npz is looked for, in order."""
    env = os.environ.get(DATA_ENV)
    dirs = [env] if env else [os.path.join(os.path.dirname(REPO_ROOT), "shared", "data"),
                              os.path.join(REPO_ROOT, ".data")]
    return [os.path.abspath(os.path.join(d, rel)) for d in dirs for rel in TOLOKERS_FILES]


def load_graph(name: str, device: torch.device, nodes: int) -> Tuple[torch.Tensor, int, str]:
    """(edge_index on ``device``, number of nodes, a line saying where the graph came from)."""
    if name == "tolokers":
        looked = tolokers_candidates()
        path = next((p for p in looked if os.path.isfile(p)), None)
        if path is not None:
            pairs = torch.from_numpy(np.load(path)["edges"]).t()
            edge_index = torch.cat([pairs, pairs.flip(0)], 1)
            return edge_index.to(device), int(edge_index.max()) + 1, f"tolokers (real graph), read from {path}"
        where = f"${DATA_ENV}={os.environ[DATA_ENV]}" if os.environ.get(DATA_ENV) else \
            f"set ${DATA_ENV} to the folder holding heterophilous/tolokers.npz"
        source = (f"tolokers NOT FOUND (looked at: {', '.join(looked)}; {where}): "
                  f"falling back to a synthetic graph of {nodes:,} nodes")
    else:
        source = f"synthetic graph (seeded random, {nodes:,} nodes, 10 edges per node)"
    gen = torch.Generator().manual_seed(0)
    edge_index = torch.randint(0, nodes, (2, 10 * nodes), generator=gen)
    return edge_index.to(device), nodes, source


# --------------------------------------------------------------------------- timing
def timed(fn, device: torch.device, repeats: int):
    """(result, median milliseconds) of ``fn()``; CUDA events after a warm-up call (which
    compiles the kernels on first use) on a GPU, wall clock without warm-up on the CPU."""
    out = fn() if device.type == "cuda" else None
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


def repeats_for(device: torch.device) -> int:
    return 20 if device.type == "cuda" else 3


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
    note = "   (CPU: not meaningful)" if device.type == "cpu" else ""
    print(f"{'op':<18}{'backend':<11}{'forward ms':>11}{note}")
    for name, (fn, probe) in cases.items():
        _, ms = timed(fn, device, repeats_for(device))
        print(f"{name:<18}{gnn_fastpath.ops.backend_for(name, probe):<11}{ms:>11.3f}")


# --------------------------------------------------------------------------- comparison
def relative_error(actual: Optional[torch.Tensor], expected: Optional[torch.Tensor], floor: float = 0.0) -> float:
    """max |actual - expected| / max(max |expected|, floor); inf when shapes, NaNs or None-ness differ."""
    if actual is None or expected is None:
        return 0.0 if actual is None and expected is None else float("inf")
    a, e = actual.detach().double(), expected.detach().double()
    if a.shape != e.shape or not torch.equal(torch.isnan(a), torch.isnan(e)):
        return float("inf")
    if e.numel() == 0:
        return 0.0
    a, e = a.nan_to_num(), e.nan_to_num()
    err = (a - e).abs().max().item()
    scale = max(e.abs().max().item(), floor)
    return err / scale if scale > 0 else (0.0 if err == 0 else float("inf"))


def forward_backward(module: torch.nn.Module, call: Callable, x: torch.Tensor, perturb: float = 0.0):
    """(output, {name: gradient}) of ``call(module, x)`` and of a fixed random projection of it."""
    module.zero_grad(set_to_none=True)
    x = x.detach().clone().requires_grad_(True)
    out = call(module, x)
    if perturb:
        out = out * (1 + perturb)
    gen = torch.Generator().manual_seed(1)
    weight = torch.randn(out.shape, generator=gen).to(out.device)
    (out * weight).sum().backward()
    grads = {"input": x.grad}
    grads.update({name: p.grad for name, p in module.named_parameters()})
    return out.detach(), grads


def describe_path(counts: Dict, details: Dict[str, str]) -> str:
    """Which path the enabled run took, in words, from ``gnn_fastpath.stats()``."""
    cuda = sum(c["fused"].get("cuda", 0) for c in counts.values())
    ref = sum(c["fused"].get("reference", 0) for c in counts.values())
    fallbacks: Dict[str, int] = {}
    for c in counts.values():
        for reason, k in c["fallback"].items():
            fallbacks[reason] = fallbacks.get(reason, 0) + k
    parts = []
    if cuda:
        parts.append(("fused CUDA kernels", cuda))
    if ref:
        parts.append(("reference ops (pure PyTorch, cpu='reference')", ref))
    for reason, k in fallbacks.items():
        detail = details.get(reason)
        parts.append((f"stock (fallback: {reason}{': ' + detail if detail else ''})", k))
    if not parts:
        why = ("GNN_FASTPATH=0 makes enable() a no-op" if not gnn_fastpath.config.setting("GNN_FASTPATH")
               else "no patched layer was called")
        return f"stock (fallback: not intercepted, {why})"
    if len(parts) == 1:
        return parts[0][0]
    return "; ".join(f"{text} x{k}" for text, k in parts)


@dataclass
class LayerResult:
    label: str
    path: str = ""
    rtol: float = 0.0
    errors: Dict[str, float] = field(default_factory=dict)
    error: str = ""  # an exception, when a run raised
    ran_stock: bool = False

    @property
    def matches(self) -> bool:
        return not self.error and bool(self.errors) and max(self.errors.values()) <= self.rtol

    def worst(self) -> str:
        if self.error:
            return self.error
        name, err = max(self.errors.items(), key=lambda kv: kv[1])
        return f"{name} {err:.1e} > {self.rtol:.0e}"


def compare_layer(label: str, module: torch.nn.Module, call: Callable, x: torch.Tensor,
                  device: torch.device, cpu_mode: str) -> LayerResult:
    """Stock vs enabled: output and gradients (verdict), then forward timings."""
    result = LayerResult(label, rtol=TOLERANCE["cuda" if device.type == "cuda" else "cpu"])
    print(label)
    module = module.to(device).eval()
    try:
        stock_out, stock_grads = forward_backward(module, call, x)
        gnn_fastpath.reset_stats()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", FastpathFallbackWarning)
            with gnn_fastpath.enabled(cpu=cpu_mode):
                fast_out, fast_grads = forward_backward(module, call, x, PERTURB)
        counts = gnn_fastpath.stats()
    except Exception as exc:  # report it as a failed layer and go on with the others
        result.error = f"raised {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        print(f"  verdict: matches stock within rtol {result.rtol:.0e}: no ({result.error})")
        return result
    details = {}
    for w in caught:
        if issubclass(w.category, FastpathFallbackWarning):
            # "gnn_fastpath: <layer> runs its stock forward (<reason>: <detail>); warned once ..."
            found = re.search(r"stock forward \((.*)\)", str(w.message), re.S)
            reason, _, detail = (found.group(1) if found else "").partition(": ")
            details.setdefault(reason, detail.split("; warned once")[0])
        else:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    result.path = describe_path(counts, details)
    result.ran_stock = not any(c["fused"].get("cuda", 0) + c["fused"].get("reference", 0) for c in counts.values())

    floor = GRAD_FLOOR * max([g.abs().max().item() for g in stock_grads.values() if g is not None and g.numel()]
                             + [0.0])
    result.errors["output"] = relative_error(fast_out, stock_out)
    result.errors["input grad"] = relative_error(fast_grads["input"], stock_grads["input"], floor)
    params = {n: relative_error(fast_grads[n], g, floor) for n, g in stock_grads.items() if n != "input"}
    worst_param = max(params, key=params.get) if params else None
    result.errors.update({f"grad {n}": e for n, e in params.items()})

    print(f"  ran:     {result.path}")
    text = f"  error:   output {result.errors['output']:.1e}, input grad {result.errors['input grad']:.1e}"
    if worst_param is not None:
        text += f", parameter grads <= {params[worst_param]:.1e} (worst: {worst_param}, of {len(params)})"
    print(text)
    print(f"  verdict: matches stock within rtol {result.rtol:.0e}: {'yes' if result.matches else 'no'}"
          + ("" if result.matches else f" ({result.worst()})"))

    with torch.no_grad():
        _, stock_ms = timed(lambda: call(module, x), device, repeats_for(device))
        with gnn_fastpath.enabled(cpu=cpu_mode), warnings.catch_warnings():
            warnings.simplefilter("ignore", FastpathFallbackWarning)  # already reported above
            _, fast_ms = timed(lambda: call(module, x), device, repeats_for(device))
    if device.type == "cuda":
        print(f"  time:    forward stock {stock_ms:.3f} ms, enabled {fast_ms:.3f} ms, "
              f"speedup {stock_ms / fast_ms:.2f}x (median of {repeats_for(device)})")
    else:
        print(f"  time:    forward stock {stock_ms:.1f} ms, enabled {fast_ms:.1f} ms "
              "(CPU: not meaningful, see the note above)")
    return result


def run_layers(edge_index: torch.Tensor, num_nodes: int, device: torch.device, cpu_mode: str) -> List[LayerResult]:
    if import_pyg() is None:
        print("torch_geometric is not installed: pip install -e '.[pyg]' for the layer comparison")
        return []
    from torch_geometric.nn import GATv2Conv, GCNConv, TransformerConv

    # Import DGL (past its GraphBolt failure on newer torch, see tests/frameworks.py) before
    # the first enable(), so that enable() finds it importable and patches its layers too.
    dgl = import_dgl()
    torch.manual_seed(0)
    x = torch.randn(num_nodes, 128, device=device)
    results = []
    layers = {
        "PyG GATv2Conv(128, 64, heads=2)": GATv2Conv(128, 64, heads=2, add_self_loops=False),
        "PyG TransformerConv(128, 64, heads=2)": TransformerConv(128, 64, heads=2),
        "PyG GCNConv(128, 128)": GCNConv(128, 128),
    }
    for label, layer in layers.items():
        results.append(compare_layer(label, layer, lambda m, h: m(h, edge_index), x, device, cpu_mode))

    if dgl is None:
        print("DGL is not importable here: skipping the DGL layers")
        return results
    from dgl.nn import GATv2Conv as DGLGATv2Conv, GraphConv

    g = dgl.graph((edge_index[0].cpu(), edge_index[1].cpu()), num_nodes=num_nodes)
    g = dgl.add_self_loop(dgl.remove_self_loop(g))
    if device.type == "cuda":  # DGL's PyPI build is CPU-only: stock DGL cannot mix devices
        print("DGL layers: stock DGL needs the graph on the features' device; compared on the CPU "
              "(reference ops): " + CPU_CAVEAT)
        device, x = torch.device("cpu"), x.cpu()
        cpu_mode = "reference"
    for label, layer in {"DGL GATv2Conv(128, 64, 2 heads)": DGLGATv2Conv(128, 64, num_heads=2),
                         "DGL GraphConv(128, 128)": GraphConv(128, 128)}.items():
        results.append(compare_layer(label, layer, lambda m, h: m(g, h), x, device, cpu_mode))
    return results


def summarise(results: List[LayerResult]) -> int:
    """Print the final verdict line; the exit code (0 all match, 1 one does not, 2 none compared)."""
    if not results:
        print("Verdict: no layer was compared (install PyG: pip install -e '.[pyg]')")
        return 2
    bad = [r for r in results if not r.matches]
    paths: Dict[str, int] = {}
    for r in results:
        if r.path:
            paths[r.path] = paths.get(r.path, 0) + 1
    ran = "; ".join(f"{k} ran {p}" for p, k in paths.items())
    stock = sum(r.ran_stock for r in results)
    note = (f"; {stock} of them ran stock code, so they were compared with themselves" if stock else "")
    if not bad:
        print(f"Verdict: all {len(results)} layers match stock within tolerance ({ran}){note}")
        return 0
    print(f"Verdict: {len(bad)} of {len(results)} layers do NOT match stock: "
          + "; ".join(f"{r.label} ({r.worst()})" for r in bad))
    return 1


# --------------------------------------------------------------------------- main
def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--graph", choices=["tolokers", "synthetic"], default=None,
                        help="default: tolokers on a GPU, a small synthetic graph on the CPU")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--nodes", type=int, default=10_000,
                        help="nodes of the synthetic graph (10 edges per node); default 10,000")
    args = parser.parse_args(argv)
    device = torch.device(args.device)

    print(f"gnn_fastpath {gnn_fastpath.__version__}, torch {torch.__version__}")
    if device.type == "cuda" and gnn_fastpath.cuda.available():
        print(f"GPU: {torch.cuda.get_device_name(device)}; CUDA kernels available")
        cpu_mode = "stock"
    else:
        if device.type == "cuda":
            print(f"No CUDA kernels here ({gnn_fastpath.cuda.unavailable_reason()}): "
                  "the patched layers fall back to stock code on this GPU")
            cpu_mode = "stock"
        else:
            reason = gnn_fastpath.cuda.unavailable_reason()
            print((f"No CUDA kernels here ({reason})" if reason else "--device cpu")
                  + ": running the pure-PyTorch reference ops, enable(cpu='reference')")
            print(f"Note: {CPU_CAVEAT}.")
            cpu_mode = "reference"
    if not gnn_fastpath.config.setting("GNN_FASTPATH"):
        print("GNN_FASTPATH=0 is set: enable() does nothing, every 'enabled' run below is stock code")

    graph_name = args.graph or ("tolokers" if device.type == "cuda" else "synthetic")
    edge_index, num_nodes, source = load_graph(graph_name, device, args.nodes)
    print(f"\nData: {source}")
    t0 = time.perf_counter()
    graph = Graph.of(edge_index, num_nodes=num_nodes)
    stats = graph.degree_stats()
    print(f"Graph: {graph.n_dst:,} nodes, {graph.num_edges:,} edges, built in "
          f"{(time.perf_counter() - t0) * 1e3:.1f} ms; in-degree max {stats.max}, mean {stats.mean:.1f}\n")
    run_ops(graph, device)
    print("\nStock layers vs gnn_fastpath.enable(), forward and backward. Relative error per tensor: "
          "max |enabled - stock| / max |stock|\n(gradients: at least "
          f"{GRAD_FLOOR:g} of the layer's largest stock gradient); rtol {TOLERANCE['cpu']:.0e} on the CPU "
          f"(reference ops), {TOLERANCE['cuda']:.0e} on CUDA (fused kernels).\n")
    results = run_layers(edge_index, num_nodes, device, cpu_mode)
    print()
    return summarise(results)


if __name__ == "__main__":
    sys.stdout.reconfigure(line_buffering=True)  # each line shows at once, also through a pipe
    sys.exit(main())
