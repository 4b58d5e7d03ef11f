"""Sampled mini-batch node classification with PyG's NeighborLoader, stock or through gnn_fastpath.

    python examples/pyg_neighbor_loader.py                        # arxiv-like, GATv2Conv, fused path
    python examples/pyg_neighbor_loader.py --no-fastpath          # stock PyG, for comparison
    python examples/pyg_neighbor_loader.py --layer transformer    # or gcn, sage_max
    python examples/pyg_neighbor_loader.py --dataset tolokers --fanouts 10,10,10 --batch-size 512
    python examples/pyg_neighbor_loader.py --dataset synthetic --device cpu --epochs 3
    python examples/pyg_neighbor_loader.py --cuda-graphs           # fixed-size batches, CUDA graphs

The training code is ordinary PyG mini-batch code (``torch_geometric.loader.NeighborLoader``);
``gnn_fastpath.enable()`` is the only difference. The features of the whole graph stay on
the CPU: the loader samples ``--fanouts`` neighbours per layer around ``--batch-size`` training
(seed) nodes, slices their features (in ``--num-workers`` worker processes, pinned on CUDA)
and each batch moves to ``--device`` with ``batch.to(device, non_blocking=True)``. The loss
is taken on the seed nodes only (``out[:batch.batch_size]``). Every batch is a new graph,
so this is the setting where the fused path's per-graph set-up (CSR build) is paid on
every step.

Model: ``len(--fanouts)`` (3) layers of ``--layer`` with ELU and feature dropout between them,
then a linear classifier: ``gatv2`` = ``GATv2Conv(d, 64, heads=4)``, ``transformer`` =
``TransformerConv(d, 64, heads=4)``, ``gcn`` = ``GCNConv(d, 64, cached=False)`` (sampled
training builds a new graph every step, so nothing may be cached), ``sage_max`` =
``SAGEConv(d, 64, aggr="max")``; ``--hidden`` and ``--heads`` change the 64 and the 4.

``--cuda-graphs`` records the model's forward and backward once as CUDA graphs and replays them
every step (``torch.compile(model, mode="reduce-overhead")``): each batch, once on the device, is
padded to fixed node and edge capacities by ``gnn_fastpath.integrations.pyg.PadToCapacity``
(zero features, self loops among the padding nodes: the seeds' outputs and the gradients are
those of the unpadded batch), so every step has the recorded shapes. The capacities grow with
the largest batch in the first steps (each growth compiles and records once more), then stay.
Without ``enable()`` (``--no-fastpath``) the same runs stock PyG under CUDA graphs, where
its layers let it.

Accuracy: after training, full-batch inference with the same model on the whole graph (all
features and edges moved to ``--device`` once), not layer-wise inference with the loader;
on graphs too large for that, evaluate with a NeighborLoader over the validation/test nodes.

Data: ``--dataset arxiv-like`` (default) is ``benchmarks/graphs.py``'s synthetic arxiv-sized
graph (169,343 nodes, 1.17M directed edges; ``--scale`` shrinks it, and without ``--scale``
a run on the CPU takes ``_common.CPU_SCALE`` of it, as the full graph takes many minutes per
epoch there) with seeded features and labels planted in the features (``_common.arxiv_like``:
its random structure carries no label signal, so GCN-style averaging stays near chance there
while the other layers learn);
``cora``, ``citeseer``, ``tolokers`` come from ``../shared/data`` (or ``--data``),
``synthetic`` is a homophilous graph (``--nodes``) on which every layer learns.

On the CPU, ``--fastpath`` runs the shims on the pure-PyTorch reference ops
(``enable(cpu="reference")``): that checks them, it is not meant to be faster.

NeighborLoader samples with ``pyg-lib`` or ``torch-sparse``; without either the example stops
and says how to install one (torch-sparse builds from PyPI's source distribution).

Prints a tqdm bar over the batches of every epoch, each epoch's train loss and time, then
validation/test accuracy, the mean epoch time, peak GPU memory and ``gnn_fastpath.stats()``.
"""
from __future__ import annotations

import argparse
import os
import sys
import warnings

import torch
import torch.nn.functional as F
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:  # also when a test imports this file by path
    sys.path.insert(0, HERE)
from _common import (add_sampling_arguments, announce, enable_fastpath, import_pyg,  # noqa: E402
                     load_sampled_data, num_workers_for, print_sampled_report, train_sampled)

LAYERS = ("gatv2", "transformer", "gcn", "sage_max")


def _pyg_wheel_index() -> str:
    """PyG's wheel page for this torch and CUDA (``https://data.pyg.org/whl/torch-2.5.0+cu124.html``)."""
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    variant = f"cu{torch.version.cuda.replace('.', '')}" if torch.version.cuda else "cpu"
    return f"https://data.pyg.org/whl/torch-{major}.{minor}.0+{variant}.html"


#: What to do when NeighborLoader has no sampling backend (the message of the SystemExit).
NO_SAMPLER = f"""\
torch_geometric.loader.NeighborLoader needs pyg-lib or torch-sparse to sample neighbours, and
neither is importable here (torch {torch.__version__}). Install one of them:

  * pyg-lib, if PyG publishes a build for this torch and CUDA (see https://data.pyg.org/whl/):
        pip install pyg_lib -f {_pyg_wheel_index()}
  * or torch-sparse (with torch-scatter, which it imports), built from PyPI's source
    distributions against the installed torch. NeighborLoader samples on the CPU, so a
    CPU-only build is enough, also on a GPU machine. From the repository root (the two
    packages build side by side; the README's "Set up" says how long it takes):
        bash .ci/install-torch-sparse
    or by hand, one after the other:
        FORCE_ONLY_CPU=1 pip install --no-build-isolation torch-scatter==2.1.2 torch-sparse==0.6.18

Then check: python -c "import torch_sparse"   (or: import pyg_lib)"""


def sampling_backend():
    """``"pyg-lib"`` or ``"torch-sparse"`` (what NeighborLoader will sample with), or None."""
    import torch_geometric.typing as pyg_typing

    if pyg_typing.WITH_PYG_LIB:
        return "pyg-lib"
    if pyg_typing.WITH_TORCH_SPARSE:
        return "torch-sparse"
    return None


def make_conv(layer: str, d_in: int, hidden: int, heads: int, attn_dropout: float):
    """One conv layer and its output width."""
    from torch_geometric.nn import GATv2Conv, GCNConv, SAGEConv, TransformerConv

    if layer == "gatv2":
        return GATv2Conv(d_in, hidden, heads=heads, dropout=attn_dropout), hidden * heads
    if layer == "transformer":
        return TransformerConv(d_in, hidden, heads=heads, dropout=attn_dropout), hidden * heads
    if layer == "gcn":
        return GCNConv(d_in, hidden, cached=False), hidden
    if layer == "sage_max":
        return SAGEConv(d_in, hidden, aggr="max"), hidden
    raise ValueError(f"unknown layer {layer!r}")


class Net(nn.Module):
    """``num_layers`` convs with ELU and feature dropout between them, then a linear classifier."""

    def __init__(self, layer: str, d_in: int, classes: int, hidden: int = 64, heads: int = 4,
                 dropout: float = 0.2, attn_dropout: float = 0.1, num_layers: int = 3):
        super().__init__()
        convs, d = [], d_in
        for _ in range(num_layers):
            conv, d = make_conv(layer, d, hidden, heads, attn_dropout)
            convs.append(conv)
        self.convs = nn.ModuleList(convs)
        self.head = nn.Linear(d, classes)
        self.dropout = dropout

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        for i, conv in enumerate(self.convs):
            if i:
                x = F.dropout(x, p=self.dropout, training=self.training)
            x = F.elu(conv(x, edge_index))
        return self.head(x)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser = add_sampling_arguments(parser, LAYERS)
    parser.add_argument("--cuda-graphs", action="store_true",
                        help="pad every batch to fixed sizes and run torch.compile(model, mode='reduce-overhead')")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    announce("pyg_neighbor_loader", args.layer, args, device)
    if import_pyg() is None:
        raise SystemExit("torch_geometric is not installed: pip install -e '.[pyg]'")
    backend = sampling_backend()
    if backend is None:
        raise SystemExit(NO_SAMPLER)
    from torch_geometric.data import Data
    from torch_geometric.loader import NeighborLoader

    data = load_sampled_data(args)
    workers = num_workers_for(args, device)
    print(f"data      {data.describe()}")
    print(f"mode      {enable_fastpath(args.fastpath, device, 'pyg')}")
    print(f"device    {device}; model {len(args.fanouts)} x {args.layer}; NeighborLoader ({backend}) "
          f"fan-outs {','.join(map(str, args.fanouts))}, batch size {args.batch_size}, {workers} workers")

    torch.manual_seed(args.seed)     # the shuffle (and torch-sparse's sampling) draw from torch's generator
    graph = Data(x=data.x, edge_index=data.edge_index, y=data.y, num_nodes=data.num_nodes)  # stays on the CPU
    with warnings.catch_warnings():  # PyG's notice that torch-sparse sampling is deprecated in favour of pyg-lib
        warnings.filterwarnings("ignore", message=".*without a 'pyg-lib' installation is deprecated")
        loader = NeighborLoader(graph, num_neighbors=args.fanouts, batch_size=args.batch_size,
                                input_nodes=data.train_mask, shuffle=True, num_workers=workers,
                                persistent_workers=workers > 0, pin_memory=device.type == "cuda")

    model = Net(args.layer, data.x.shape[1], data.num_classes, args.hidden, args.heads, args.dropout,
                args.attn_dropout, num_layers=len(args.fanouts)).to(device)

    run, pad = model, None
    if args.cuda_graphs:
        from gnn_fastpath.integrations.pyg import PadToCapacity

        pad = PadToCapacity()
        run = torch.compile(model, mode="reduce-overhead")
        print("graphs    CUDA graphs (torch.compile mode='reduce-overhead'), batches padded by PadToCapacity")

    def step(batch):
        batch = batch.to(device, non_blocking=True)
        if pad is not None:
            batch = pad(batch)
        out = run(batch.x, batch.edge_index)
        n = batch.batch_size                    # the seed nodes come first
        return F.cross_entropy(out[:n], batch.y[:n]), n

    def infer():
        return model(data.x.to(device), data.edge_index.to(device))

    result = train_sampled(model, loader, step, infer, data, args, device)
    print_sampled_report(result, "full-batch inference on the whole graph")
    if pad is not None:
        print(f"padding   {pad} ({pad.growths} growths)")
    return 0


if __name__ == "__main__":
    sys.stdout.reconfigure(line_buffering=True)  # each line shows at once, also through a pipe
    sys.exit(main())
