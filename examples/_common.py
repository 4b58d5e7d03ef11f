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
