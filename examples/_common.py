"""What the examples share: framework imports, node-classification data, training and report.

    from _common import (import_dgl, import_pyg, add_arguments, load_node_data, enable_fastpath,
                         train_node_classifier, print_report)

Framework imports come from ``tests/frameworks.py``, loaded by path: that file is the one
place that knows DGL 2.1.0's GraphBolt import failure on newer torch and how to get past
it, so tests and examples share it instead of keeping two copies. Nothing here is part of
the installed package.

Data (no PyG needed; numpy and scipy, which DGL requires anyway):

- ``cora`` / ``citeseer``: the raw Planetoid files (``ind.<name>.*``) from
  ``../shared/data/planetoid`` beside the repository, or ``--data DIR``; the standard
  Planetoid split (140/120 train, 500 validation, 1000 test), rows of the features
  normalised to sum 1, self loops removed and duplicate edges merged (as PyG's reader).
- ``tolokers``: ``../shared/data/heterophilous/tolokers.npz`` (or ``--data FILE``), each
  undirected pair in both directions, split 0 of the ten.
- ``synthetic``: a seeded homophilous graph (used when the real files are absent).
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import pickle
import sys
import time
from dataclasses import dataclass
from typing import Callable, Dict, Optional

import numpy as np
import torch
import torch.nn.functional as F

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_DATA = os.path.join(os.path.dirname(REPO_ROOT), "shared", "data")
DATASETS = ("cora", "citeseer", "tolokers", "synthetic")


# --------------------------------------------------------------------------- frameworks
def _frameworks():
    path = os.path.join(REPO_ROOT, "tests", "frameworks.py")
    name = "_gnn_fastpath_test_frameworks"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[name] = module
    return sys.modules[name]


def import_dgl():
    """The ``dgl`` module (past DGL 2.1.0's GraphBolt failure on newer torch), or None."""
    return _frameworks().import_dgl()


def import_pyg():
    """The ``torch_geometric`` module, or None."""
    return _frameworks().import_pyg()


# --------------------------------------------------------------------------- arguments
def add_arguments(parser: argparse.ArgumentParser, epochs: int = 200, lr: float = 0.01,
                  weight_decay: float = 5e-4) -> argparse.ArgumentParser:
    """The flags every node-classification example takes."""
    parser.add_argument("--dataset", choices=DATASETS, default="cora",
                        help="default: cora, or synthetic when the Cora files are absent")
    parser.add_argument("--data", default=None,
                        help="Planetoid folder (ind.<name>.*) or tolokers.npz; default ../shared/data/...")
    parser.add_argument("--epochs", type=int, default=epochs)
    parser.add_argument("--lr", type=float, default=lr)
    parser.add_argument("--weight-decay", type=float, default=weight_decay)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--fastpath", action=argparse.BooleanOptionalAction, default=True,
                        help="gnn_fastpath.enable() (default) or stock layers (--no-fastpath)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quiet", action="store_true", help="no per-epoch lines, only the progress bar")
    return parser


# --------------------------------------------------------------------------- data
@dataclass
class NodeData:
    """A node-classification graph on the CPU: ``edge_index`` [2, M] int64 (sources, targets)."""

    name: str
    edge_index: torch.Tensor
    x: torch.Tensor
    y: torch.Tensor
    train_mask: torch.Tensor
    val_mask: torch.Tensor
    test_mask: torch.Tensor
    num_classes: int

    @property
    def num_nodes(self) -> int:
        return self.x.shape[0]

    def describe(self) -> str:
        return (f"{self.name}: {self.num_nodes:,} nodes, {self.edge_index.shape[1]:,} edges, "
                f"{self.x.shape[1]} features, {self.num_classes} classes, "
                f"{int(self.train_mask.sum())}/{int(self.val_mask.sum())}/{int(self.test_mask.sum())} "
                "train/val/test")


def _mask(n: int, index) -> torch.Tensor:
    mask = torch.zeros(n, dtype=torch.bool)
    mask[torch.as_tensor(index, dtype=torch.long)] = True
    return mask


def _dense(a) -> np.ndarray:
    return np.asarray(a.todense() if hasattr(a, "todense") else a, dtype=np.float32)


def load_planetoid(folder: str, name: str) -> NodeData:
    """The Planetoid split of ``name`` from the raw ``ind.<name>.*`` files in ``folder``."""
    def read(part):
        with open(os.path.join(folder, f"ind.{name}.{part}"), "rb") as f:
            return pickle.load(f, encoding="latin1")

    x, tx, allx = (_dense(read(p)) for p in ("x", "tx", "allx"))
    y, ty, ally = (np.asarray(read(p)) for p in ("y", "ty", "ally"))
    graph = read("graph")
    with open(os.path.join(folder, f"ind.{name}.test.index")) as f:
        test_index = np.array([int(line) for line in f if line.strip()])
    sorted_test = np.sort(test_index)
    if name == "citeseer":  # isolated test nodes are missing from tx/ty: pad with zero rows
        full = np.arange(sorted_test.min(), sorted_test.max() + 1)
        tx_ext = np.zeros((len(full), tx.shape[1]), np.float32)
        tx_ext[sorted_test - sorted_test.min()] = tx
        ty_ext = np.zeros((len(full), ty.shape[1]), ty.dtype)
        ty_ext[sorted_test - sorted_test.min()] = ty
        tx, ty = tx_ext, ty_ext
    features = np.concatenate([allx, tx])
    labels = np.concatenate([ally, ty]).argmax(1)
    features[test_index] = features[sorted_test]
    labels[test_index] = labels[sorted_test]
    n = features.shape[0]

    src = np.array([u for u, vs in graph.items() for _ in vs], dtype=np.int64)
    dst = np.array([v for vs in graph.values() for v in vs], dtype=np.int64)
    keep = (src != dst) & (src < n) & (dst < n)
    pairs = np.unique(np.stack([dst[keep], src[keep]], 1), axis=0)  # merge duplicates; target-major
    edge_index = torch.from_numpy(pairs[:, ::-1].T.copy())

    feats = torch.from_numpy(features)
    feats = feats / feats.sum(1, keepdim=True).clamp(min=1e-12)
    return NodeData(name, edge_index, feats, torch.from_numpy(labels).long(),
                    _mask(n, range(len(y))), _mask(n, range(len(y), len(y) + 500)),
                    _mask(n, sorted_test[sorted_test < n]), int(labels.max()) + 1)


def load_tolokers(path: str, split: int = 0) -> NodeData:
    z = np.load(path)
    pairs = torch.from_numpy(z["edges"]).t()
    edge_index = torch.cat([pairs, pairs.flip(0)], 1)
    y = torch.from_numpy(z["node_labels"]).long()
    return NodeData("tolokers", edge_index, torch.from_numpy(z["node_features"]).float(), y,
                    torch.from_numpy(z["train_masks"][split]), torch.from_numpy(z["val_masks"][split]),
                    torch.from_numpy(z["test_masks"][split]), int(y.max()) + 1)


def synthetic(num_nodes: int = 3000, num_classes: int = 5, num_features: int = 64, degree: int = 8,
              homophily: float = 0.8, seed: int = 0) -> NodeData:
    """A seeded graph whose labels can be learnt: class-dependent features, mostly same-class edges."""
    gen = torch.Generator().manual_seed(seed)
    y = torch.randint(0, num_classes, (num_nodes,), generator=gen)
    centres = torch.randn(num_classes, num_features, generator=gen)
    x = centres[y] * 0.5 + torch.randn(num_nodes, num_features, generator=gen)
    src = torch.arange(num_nodes).repeat_interleave(degree)
    by_class = [torch.nonzero(y == c).flatten() for c in range(num_classes)]
    same = torch.rand(src.numel(), generator=gen) < homophily
    dst = torch.randint(0, num_nodes, (src.numel(),), generator=gen)
    for c, members in enumerate(by_class):
        rows = same & (y[src] == c)
        dst[rows] = members[torch.randint(0, members.numel(), (int(rows.sum()),), generator=gen)]
    keep = src != dst
    edge_index = torch.stack([src[keep], dst[keep]])
    edge_index = torch.cat([edge_index, edge_index.flip(0)], 1)
    perm = torch.randperm(num_nodes, generator=gen)
    n_train, n_val = num_nodes // 10, num_nodes // 5
    return NodeData("synthetic", edge_index, x, y, _mask(num_nodes, perm[:n_train]),
                    _mask(num_nodes, perm[n_train:n_train + n_val]),
                    _mask(num_nodes, perm[n_train + n_val:]), num_classes)


def load_node_data(name: str, data: Optional[str] = None, seed: int = 0) -> NodeData:
    """``name`` from ``data`` (or the shared data folder); synthetic when the files are absent."""
    if name in ("cora", "citeseer"):
        folder = data or os.path.join(SHARED_DATA, "planetoid")
        if os.path.exists(os.path.join(folder, f"ind.{name}.graph")):
            return load_planetoid(folder, name)
        if data:
            raise SystemExit(f"no ind.{name}.* files in {folder}")
        print(f"[data] {name} not found under {folder}: using a synthetic graph instead")
    elif name == "tolokers":
        path = data or os.path.join(SHARED_DATA, "heterophilous", "tolokers.npz")
        if os.path.exists(path):
            return load_tolokers(path)
        if data:
            raise SystemExit(f"{path} does not exist")
        print(f"[data] tolokers not found at {path}: using a synthetic graph instead")
    return synthetic(seed=seed)


# --------------------------------------------------------------------------- fastpath
def enable_fastpath(on: bool, device: torch.device, framework: str) -> str:
    """Call ``gnn_fastpath.enable`` for ``framework`` when ``on``; returns a one-line description."""
    import gnn_fastpath

    if not on:
        return "stock layers (--no-fastpath)"
    if device.type == "cpu":
        gnn_fastpath.enable(frameworks=framework, cpu="reference")
        return ("gnn_fastpath.enable(cpu='reference'): on the CPU the shims run the pure-PyTorch "
                "reference ops (a correctness path, not a fast one)")
    gnn_fastpath.enable(frameworks=framework)
    if gnn_fastpath.cuda.available():
        return "gnn_fastpath.enable(): fused CUDA kernels"
    return f"gnn_fastpath.enable(), but no CUDA kernels here ({gnn_fastpath.cuda.unavailable_reason()})"


def place_dgl_graph(g, device: torch.device, fastpath: bool, ops=()):
    """The DGL graph for a model on ``device``.

    A DGL build with CUDA moves it there. DGL's PyPI build is CPU-only: then the graph stays
    on the CPU, which the fused path handles (the ops copy the structure to the GPU once),
    provided every op the model needs has CUDA kernels; stock DGL cannot mix devices.
    """
    if device.type == "cpu":
        return g
    try:
        return g.to(device)
    except Exception as exc:  # DGL built without CUDA
        reason = f"{type(exc).__name__}: {exc}".splitlines()[0]
    import gnn_fastpath

    missing = [op for op in ops if not op in gnn_fastpath.ops.dispatch.OPS]
    if fastpath and gnn_fastpath.cuda.available() and not missing:
        print(f"[graph] DGL cannot move the graph to {device} ({reason[:80]}); it stays on the CPU "
              "and gnn_fastpath copies its structure to the GPU once")
        return g
    why = "--no-fastpath runs stock DGL" if not fastpath else (
        f"no CUDA kernels for {', '.join(missing)} yet" if missing else
        f"no CUDA kernels ({gnn_fastpath.cuda.unavailable_reason()})")
    raise SystemExit(f"This DGL build cannot put the graph on {device} ({reason[:80]}), and {why}: "
                     "stock DGL needs graph and features on one device. Use --device cpu.")


# --------------------------------------------------------------------------- training
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def accuracy(logits: torch.Tensor, y: torch.Tensor, mask: torch.Tensor) -> float:
    return float((logits[mask].argmax(-1) == y[mask]).float().mean()) if bool(mask.any()) else float("nan")


def train_node_classifier(model: torch.nn.Module, forward: Callable[[], torch.Tensor], data: NodeData,
                          args, device: torch.device) -> Dict[str, float]:
    """Full-graph training: per-epoch loss (tqdm), then test accuracy, epoch time, peak memory.

    ``forward()`` returns logits [N, C] for every node; ``data``'s labels and masks are moved
    to ``device`` here.
    """
    from tqdm import tqdm

    y = data.y.to(device)
    masks = {k: getattr(data, f"{k}_mask").to(device) for k in ("train", "val", "test")}
    opt = torch.optim.Adam(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    bar = tqdm(range(1, args.epochs + 1), desc="train", unit="epoch", dynamic_ncols=True)
    for epoch in bar:
        _sync(device)
        t0 = time.perf_counter()
        model.train()
        opt.zero_grad(set_to_none=True)
        logits = forward()
        loss = F.cross_entropy(logits[masks["train"]], y[masks["train"]])
        loss.backward()
        opt.step()
        _sync(device)
        times.append(time.perf_counter() - t0)
        value = loss.item()
        bar.set_postfix(loss=f"{value:.4f}")
        if not args.quiet:
            tqdm.write(f"epoch {epoch:4d}  loss {value:.4f}  {times[-1] * 1e3:8.1f} ms")
    bar.close()
    model.eval()
    with torch.no_grad():
        logits = forward()
    timed = times[1:] if len(times) > 1 else times  # the first epoch pays one-off set-up
    return {
        "train_acc": accuracy(logits, y, masks["train"]),
        "val_acc": accuracy(logits, y, masks["val"]),
        "test_acc": accuracy(logits, y, masks["test"]),
        "epoch_ms": 1e3 * float(np.mean(timed)) if timed else float("nan"),
        "first_epoch_ms": 1e3 * times[0] if times else float("nan"),
        "peak_mem_mib": torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None,
    }


def print_report(result: Dict[str, float]) -> None:
    import gnn_fastpath

    print(f"test accuracy      {result['test_acc']:.4f}   (val {result['val_acc']:.4f}, "
          f"train {result['train_acc']:.4f})")
    print(f"mean epoch time    {result['epoch_ms']:.1f} ms   (first epoch {result['first_epoch_ms']:.1f} ms, "
          "not in the mean)")
    peak = result["peak_mem_mib"]
    print(f"peak GPU memory    {'n/a on CPU' if peak is None else f'{peak:.1f} MiB'}")
    print(f"gnn_fastpath.stats() {gnn_fastpath.stats()}")


# --------------------------------------------------------------------------- sampled mini-batch training
# Used by pyg_neighbor_loader.py and dgl_neighbor_sampler.py: the flags, the data (the datasets
# above plus a synthetic arxiv-sized graph), the epoch loop over a loader and the report.
SAMPLED_DATASETS = DATASETS + ("arxiv-like",)
#: ``--scale`` of the arxiv-sized graphs when an example runs on the CPU and no ``--scale`` is
#: given: the full graph takes many minutes per epoch there, this fraction of it seconds.
CPU_SCALE = 0.05


def _bench_graphs():
    """``benchmarks/graphs.py`` loaded by path (no change to ``sys.path``), as ``_frameworks``."""
    path = os.path.join(REPO_ROOT, "benchmarks", "graphs.py")
    name = "_gnn_fastpath_bench_graphs"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # its dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules[name]


def arxiv_like(seed: int = 0, scale: float = 1.0, num_features: int = 128, num_classes: int = 40,
               separation: float = 1.0) -> NodeData:
    """The benchmarks' ``arxiv-like`` graph with seeded features and planted labels.

    Structure: ``benchmarks.graphs.load("arxiv-like", seed=seed, scale=scale)`` (169,343 nodes and
    1,166,243 directed edges at scale 1, sources power-law, destinations uniform; generated in
    seconds and cached under ``.bench_cache/``), edges used as they are (directed). Labels:
    ``num_classes`` (ogbn-arxiv's 40) drawn at random; features: ``num_features`` (its 128)
    standard normal values around a random centre per class (scaled by ``separation``), so
    the labels can be read from a node's own features while its random neighbours add noise.
    Layers that keep the node's own features apart learn them (SAGE's root weight,
    TransformerConv's, GATv2 once it attends to the self loop; at ``scale=0.2``, 99-100% test
    accuracy after 3 epochs with PyG's TransformerConv, GATv2Conv and SAGEConv(max), after 7
    with DGL's GATv2Conv); GCN / DGL GraphConv, which average a node with its random neighbours,
    stay near chance (1/40) here: ``synthetic`` (homophilous) shows them learn. The dataset is
    for speed and memory at arxiv scale, not for what a GNN can learn from structure. Split at
    random with ogbn-arxiv's proportions (54% / 18% / 28% train / validation / test).
    """
    g = _bench_graphs().load("arxiv-like", seed=seed, scale=scale)
    n = g.num_nodes
    gen = torch.Generator().manual_seed(seed)
    y = torch.randint(0, num_classes, (n,), generator=gen)
    centres = torch.randn(num_classes, num_features, generator=gen)
    x = centres[y] * separation + torch.randn(n, num_features, generator=gen)
    perm = torch.randperm(n, generator=gen)
    n_train, n_val = int(0.54 * n), int(0.18 * n)
    name = "arxiv-like" if scale == 1.0 else f"arxiv-like (scale {scale:g})"
    return NodeData(name, g.edge_index, x, y, _mask(n, perm[:n_train]), _mask(n, perm[n_train:n_train + n_val]),
                    _mask(n, perm[n_train + n_val:]), num_classes)


def _fanouts(text: str):
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or any(v == 0 or v < -1 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated fan-outs such as 15,10,5 "
                                         "(-1: every neighbour)")
    return values


def add_sampling_arguments(parser: argparse.ArgumentParser, layers, epochs: int = 10, lr: float = 0.003,
                           weight_decay: float = 0.0) -> argparse.ArgumentParser:
    """``add_arguments`` plus the flags of the sampled mini-batch examples (``--layer`` from ``layers``).

    ``--dataset`` also takes ``arxiv-like`` (the default here: mini-batches pay off on graphs of
    that size); ``--scale`` is left None when not given (``announce`` fills it in for the device);
    ``--num-workers`` defaults to 4 on CUDA and 0 on the CPU.
    """
    add_arguments(parser, epochs=epochs, lr=lr, weight_decay=weight_decay)
    parser.set_defaults(dataset="arxiv-like")
    for action in parser._actions:  # the shared flag, with one more choice
        if action.dest == "dataset":
            action.choices = SAMPLED_DATASETS
            action.help = ("default: arxiv-like (synthetic, benchmarks/graphs.py); cora, citeseer, "
                           "tolokers from ../shared/data (synthetic when absent); synthetic")
    parser.add_argument("--layer", choices=tuple(layers), default=tuple(layers)[0])
    parser.add_argument("--fanouts", type=_fanouts, default=[15, 10, 5],
                        help="neighbours sampled per layer, first layer's hop first (default 15,10,5); "
                             "one layer per entry")
    parser.add_argument("--batch-size", type=int, default=1024, help="seed (training) nodes per mini-batch")
    parser.add_argument("--num-workers", type=int, default=None,
                        help="loader worker processes (default: 4 on CUDA, 0 on the CPU)")
    parser.add_argument("--hidden", type=int, default=64, help="channels per head")
    parser.add_argument("--heads", type=int, default=4, help="attention heads (gatv2, transformer)")
    parser.add_argument("--dropout", type=float, default=0.2, help="feature dropout between layers")
    parser.add_argument("--attn-dropout", type=float, default=0.1, help="attention dropout (gatv2, transformer)")
    parser.add_argument("--nodes", type=int, default=3000, help="nodes of --dataset synthetic")
    parser.add_argument("--scale", type=float, default=None,
                        help=f"size of --dataset arxiv-like (1: 169,343 nodes); default 1 on a GPU, "
                             f"{CPU_SCALE:g} on the CPU")
    return parser


def default_scale(args, device: torch.device) -> str:
    """Fill in ``args.scale`` (None: not given) for ``device``; returns a note for the run's first line."""
    if args.scale is not None:
        return f"--scale {args.scale:g}"
    args.scale = 1.0 if device.type == "cuda" else CPU_SCALE
    if args.scale == 1.0:
        return "full size"
    return f"--scale {args.scale:g}: the CPU default; --scale 1 runs the full graph"


def announce(script: str, layer: str, args, device: torch.device) -> None:
    """The first line of a sampled example, printed before anything slow (imports, data).

    Fills in ``args.scale`` for ``device`` first (``default_scale``).
    """
    size = default_scale(args, device)
    data = f"arxiv-like ({size})" if args.dataset == "arxiv-like" else args.dataset
    print(f"{script}: {layer} on {device}, {data}, {args.epochs} epochs, "
          f"{'gnn_fastpath.enable()' if args.fastpath else 'stock layers'}; loading ...", flush=True)


def num_workers_for(args, device: torch.device) -> int:
    return args.num_workers if args.num_workers is not None else (4 if device.type == "cuda" else 0)


def load_sampled_data(args) -> NodeData:
    """The graph of a sampled-training example (``--dataset``, ``--data``, ``--nodes``, ``--scale``)."""
    if args.dataset == "arxiv-like":
        return arxiv_like(seed=args.seed, scale=args.scale)
    if args.dataset == "synthetic":
        return synthetic(num_nodes=args.nodes, seed=args.seed)
    return load_node_data(args.dataset, args.data, args.seed)


def fastpath_summary() -> str:
    """``gnn_fastpath.stats()`` summed over layer classes: fused calls by backend, fallbacks by reason."""
    import gnn_fastpath

    fused: Dict[str, int] = {}
    fallback: Dict[str, int] = {}
    for entry in gnn_fastpath.stats().values():
        for backend, n in entry.get("fused", {}).items():
            fused[backend] = fused.get(backend, 0) + int(n)
        for reason, n in entry.get("fallback", {}).items():
            fallback[reason] = fallback.get(reason, 0) + int(n)
    calls = ", ".join(f"{b} {n}" for b, n in fused.items()) or "none"
    falls = ", ".join(f"{r} {n}" for r, n in sorted(fallback.items())) or "none"
    return f"fused calls: {calls}; fallbacks: {falls}"


def train_sampled(model: torch.nn.Module, loader, step: Callable, infer: Callable[[], torch.Tensor],
                  data: NodeData, args, device: torch.device) -> Dict[str, object]:
    """Mini-batch training: one tqdm bar over the batches of each epoch, then full-graph accuracy.

    ``step(batch)`` runs the model on one mini-batch and returns ``(loss, seeds)``: the mean
    cross-entropy over the batch's seed nodes and their count. ``infer()`` returns logits
    [N, C] for every node (called once, after training, in eval mode under ``no_grad``). The
    epoch time includes sampling, host-to-device copies, forward, backward and the optimizer.
    """
    from tqdm import tqdm

    opt = torch.optim.Adam(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    losses, times = [], []
    for epoch in range(1, args.epochs + 1):
        model.train()
        _sync(device)
        t0 = time.perf_counter()
        total = torch.zeros((), device=device)
        seen = 0
        bar = tqdm(loader, total=len(loader), desc=f"epoch {epoch}/{args.epochs}", unit="batch",
                   dynamic_ncols=True, leave=False)
        for i, batch in enumerate(bar):
            opt.zero_grad(set_to_none=True)
            loss, seeds = step(batch)
            loss.backward()
            opt.step()
            total += loss.detach() * seeds
            seen += seeds
            if i % 10 == 0 or i == len(loader) - 1:  # a host sync now and then, not every step
                bar.set_postfix(loss=f"{total.item() / max(seen, 1):.4f}")
        bar.close()
        _sync(device)
        times.append(time.perf_counter() - t0)
        losses.append(total.item() / max(seen, 1))
        if not args.quiet:
            tqdm.write(f"epoch {epoch:3d}  train loss {losses[-1]:.4f}  time {times[-1]:7.2f} s  "
                       f"({len(loader)} batches)")
    peak_train = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None

    model.eval()
    _sync(device)
    t0 = time.perf_counter()
    with torch.no_grad():
        logits = infer().float().cpu()
    _sync(device)
    infer_s = time.perf_counter() - t0
    timed = times[1:] if len(times) > 1 else times  # the first epoch pays one-off set-up
    return {
        "losses": losses,
        "epoch_s": times,
        "mean_epoch_s": float(np.mean(timed)) if timed else float("nan"),
        "first_epoch_s": times[0] if times else float("nan"),
        "infer_s": infer_s,
        "train_acc": accuracy(logits, data.y, data.train_mask),
        "val_acc": accuracy(logits, data.y, data.val_mask),
        "test_acc": accuracy(logits, data.y, data.test_mask),
        "peak_train_mib": peak_train,
        "peak_mib": torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None,
    }


def print_sampled_report(result: Dict[str, object], inference: str) -> None:
    """The end-of-run lines of the sampled examples (``inference`` says how accuracy was computed)."""
    import gnn_fastpath

    print(f"validation accuracy {result['val_acc']:.4f}   test accuracy {result['test_acc']:.4f}   "
          f"(train {result['train_acc']:.4f}; {inference}, {result['infer_s']:.2f} s)")
    print(f"mean epoch time     {result['mean_epoch_s']:.3f} s   (first epoch {result['first_epoch_s']:.3f} s, "
          "not in the mean unless it is the only one)")
    if result["peak_mib"] is None:
        print("peak GPU memory     n/a on CPU")
    else:
        print(f"peak GPU memory     {result['peak_train_mib']:.1f} MiB training, "
              f"{result['peak_mib']:.1f} MiB with the inference "
              "(torch.cuda.max_memory_allocated)")
    print(f"gnn_fastpath        {fastpath_summary()}")
    print(f"gnn_fastpath.stats() {gnn_fastpath.stats()}")
