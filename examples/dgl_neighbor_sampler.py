"""Sampled mini-batch node classification with DGL's NeighborSampler, stock or through gnn_fastpath.

    python examples/dgl_neighbor_sampler.py                       # arxiv-like, GATv2Conv, fused path
    python examples/dgl_neighbor_sampler.py --no-fastpath         # stock DGL (CPU, or a CUDA build of DGL)
    python examples/dgl_neighbor_sampler.py --layer graphconv     # or sage (--aggr mean|gcn|pool)
    python examples/dgl_neighbor_sampler.py --dataset tolokers --fanouts 10,10,10 --batch-size 512
    python examples/dgl_neighbor_sampler.py --dataset synthetic --device cpu --epochs 3

The training code is ordinary DGL mini-batch code: ``dgl.dataloading.NeighborSampler(
--fanouts)`` and ``dgl.dataloading.DataLoader`` over the training node ids give, per batch,
the input node ids, the seed (output) node ids and one block per layer; the model runs layer
``i`` on block ``i`` and the loss is taken on the seeds. ``gnn_fastpath.enable()`` is the
only difference.

Devices: the graph is sampled on the CPU. DGL's PyPI build is CPU-only, so there the blocks
stay on the CPU while the model and the input features of each batch go to ``--device``:
the fused path copies each block's CSR to the features' device (stock DGL cannot mix
devices, so ``--no-fastpath`` on a GPU needs a CUDA build of DGL, which moves the blocks to
the GPU in the DataLoader). Features of the whole graph stay on the CPU; each batch's rows
are gathered there and copied (``non_blocking``; pinned first on CUDA).

Model: ``len(--fanouts)`` (3) layers with ELU and feature dropout between them, then a linear
classifier: ``gatv2`` = ``GATv2Conv(d, 64, num_heads=4)``, ``graphconv`` = ``GraphConv(d, 64)``
(norm "both"), ``sage`` = ``SAGEConv(d, 64, --aggr)`` (``mean`` by default; ``gcn`` and
``pool`` also run fused; ``lstm`` does not and is not offered). Self loops are added to the
graph before sampling, so every seed keeps at least one in-edge in its block and the
layers' zero-in-degree check (``allow_zero_in_degree=False``, the default) passes.

Accuracy: after training, full-batch inference with the same model on the whole graph (each
layer on the full graph instead of a block), not layer-wise inference with the loader.

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

Comparing stock and enabled runs: ``--seed`` fixes the shuffle, the initial weights and the
dropout masks, but DGL's CPU sampler draws neighbours on several threads in whatever order
they run, so two runs with the same seed train on other batches (test accuracy of SAGE pool
on ``--dataset synthetic`` moves by 0.1 and more between runs). With one thread
(``OMP_NUM_THREADS=1``) the batches repeat, and a stock and an enabled run agree to float
precision.

Prints a tqdm bar over the batches of every epoch, each epoch's train loss and time, then
validation/test accuracy, the mean epoch time, peak GPU memory and ``gnn_fastpath.stats()``.
"""
from __future__ import annotations

import argparse
import os
import sys
import warnings

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:  # also when a test imports this file by path
    sys.path.insert(0, HERE)
from _common import (add_sampling_arguments, announce, enable_fastpath, import_dgl,  # noqa: E402
                     load_sampled_data, num_workers_for, place_dgl_graph, print_sampled_report, train_sampled)

LAYERS = ("gatv2", "graphconv", "sage")
SAGE_AGGREGATORS = ("mean", "gcn", "pool")
#: The gnn_fastpath op each layer runs on (for the device check of ``place_dgl_graph``).
OPS = {"gatv2": "gatv2_attention", "graphconv": "spmm", "mean": "spmm", "gcn": "spmm", "pool": "segment_reduce"}


def make_conv(layer: str, d_in: int, hidden: int, heads: int, attn_dropout: float, aggr: str):
    """One DGL conv layer and its output width (heads concatenated)."""
    from dgl.nn import GATv2Conv, GraphConv, SAGEConv

    if layer == "gatv2":
        return GATv2Conv(d_in, hidden, heads, attn_drop=attn_dropout), hidden * heads
    if layer == "graphconv":
        return GraphConv(d_in, hidden, norm="both"), hidden
    if layer == "sage":
        return SAGEConv(d_in, hidden, aggr), hidden
    raise ValueError(f"unknown layer {layer!r}")


class Net(nn.Module):
    """``num_layers`` convs (layer i on block i) with ELU and dropout between them, then a linear classifier."""

    def __init__(self, layer: str, d_in: int, classes: int, hidden: int = 64, heads: int = 4,
                 dropout: float = 0.2, attn_dropout: float = 0.1, num_layers: int = 3, aggr: str = "mean"):
        super().__init__()
        convs, d = [], d_in
        for _ in range(num_layers):
            conv, d = make_conv(layer, d, hidden, heads, attn_dropout, aggr)
            convs.append(conv)
        self.convs = nn.ModuleList(convs)
        self.head = nn.Linear(d, classes)
        self.dropout = dropout

    def forward(self, blocks, x: torch.Tensor) -> torch.Tensor:
        """``blocks``: one block (or the full graph) per layer; ``x``: features of the first one's sources."""
        for i, (conv, block) in enumerate(zip(self.convs, blocks)):
            if i:
                x = F.dropout(x, p=self.dropout, training=self.training)
            x = F.elu(conv(block, x).flatten(1))   # GATv2Conv: [N, heads, hidden] -> [N, heads * hidden]
        return self.head(x)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_sampling_arguments(parser, LAYERS)
    parser.add_argument("--aggr", choices=SAGE_AGGREGATORS, default="mean", help="SAGEConv aggregator (--layer sage)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    layer = f"{args.layer} ({args.aggr})" if args.layer == "sage" else args.layer
    announce("dgl_neighbor_sampler", layer, args, device)
    dgl = import_dgl()
    if dgl is None:
        raise SystemExit("DGL is not importable here: pip install -e '.[dgl]' (see README, 'Installing DGL')")
    data = load_sampled_data(args)
    workers = num_workers_for(args, device)
    op = OPS[args.aggr if args.layer == "sage" else args.layer]
    print(f"data      {data.describe()}")
    print(f"mode      {enable_fastpath(args.fastpath, device, 'dgl')}")

    g = dgl.graph((data.edge_index[0], data.edge_index[1]), num_nodes=data.num_nodes)
    g = dgl.add_self_loop(dgl.remove_self_loop(g))   # every seed keeps an in-edge in its block
    # The full graph for inference: on the device with a CUDA build of DGL; else it stays on the
    # CPU (fused path only; without it this stops with a message, as stock DGL cannot mix devices).
    g_eval = place_dgl_graph(g, device, args.fastpath, ops=(op,))
    block_device = g_eval.device  # where the DataLoader puts the blocks: the CPU or a CUDA build's GPU
    print(f"device    {device} (blocks on {block_device}); model {len(args.fanouts)} x {layer}; NeighborSampler "
          f"fan-outs {','.join(map(str, args.fanouts))}, batch size {args.batch_size}, {workers} workers")

    train_ids = torch.nonzero(data.train_mask).flatten()
    dgl.seed(args.seed)              # DGL's sampler draws from its own generator,
    np.random.seed(args.seed)        # its DataLoader shuffles with numpy's,
    torch.manual_seed(args.seed)     # the model's initial weights and dropout come from torch's
    sampler = dgl.dataloading.NeighborSampler(args.fanouts)
    loader = dgl.dataloading.DataLoader(g, train_ids, sampler, device=block_device, batch_size=args.batch_size,
                                        shuffle=True, drop_last=False, num_workers=workers,
                                        persistent_workers=workers > 0)
    pin = device.type == "cuda"

    model = Net(args.layer, data.x.shape[1], data.num_classes, args.hidden, args.heads, args.dropout,
                args.attn_dropout, num_layers=len(args.fanouts), aggr=args.aggr).to(device)

    def step(batch):
        input_nodes, output_nodes, blocks = batch
        input_nodes, output_nodes = input_nodes.cpu(), output_nodes.cpu()
        x = data.x[input_nodes]                 # gathered on the CPU, where the features live
        y = data.y[output_nodes]
        if pin:
            x, y = x.pin_memory(), y.pin_memory()
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        out = model(blocks, x)                  # [len(output_nodes), classes]
        return F.cross_entropy(out, y), len(output_nodes)

    def infer():
        return model([g_eval] * len(args.fanouts), data.x.to(device))

    with warnings.catch_warnings():  # DGL's hint about its CPU affinity option, on every epoch
        warnings.filterwarnings("ignore", message=".*CPU affinity opt is not enabled")
        result = train_sampled(model, loader, step, infer, data, args, device)
    print_sampled_report(result, "full-batch inference on the whole graph")
    return 0


if __name__ == "__main__":
    sys.stdout.reconfigure(line_buffering=True)  # each line shows at once, also through a pipe
    sys.exit(main())
