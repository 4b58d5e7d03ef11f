"""Full-graph node classification with DGL GraphConv (GCN), stock or through gnn_fastpath.

    python examples/dgl_gcn.py                         # Cora (../shared/data), fused path
    python examples/dgl_gcn.py --no-fastpath           # stock DGL, for comparison
    python examples/dgl_gcn.py --dataset tolokers --epochs 100
    python examples/dgl_gcn.py --dataset synthetic --device cpu

The model is unchanged DGL code; ``gnn_fastpath.enable()`` is the only difference. DGL's
PyPI build is CPU-only, so the DGL graph stays on the CPU while the model and features go
to ``--device``: the fused path copies the graph structure to the GPU once. On the CPU,
``--fastpath`` runs the shims on the pure-PyTorch reference ops (enable(cpu="reference")):
that checks them against stock, it is not meant to be faster.

Prints the loss of every epoch (with a tqdm bar), the final test accuracy, the mean epoch
time, the peak GPU memory and ``gnn_fastpath.stats()``.
"""
from __future__ import annotations

import argparse
import sys

import torch
from torch import nn

from _common import (add_arguments, enable_fastpath, import_dgl, load_node_data, place_dgl_graph,
                     print_report, train_node_classifier)


def build_model(in_feats: int, num_classes: int, hidden: int, dropout: float, norm: str):
    from dgl.nn import GraphConv

    class GCN(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = GraphConv(in_feats, hidden, norm=norm, activation=torch.relu)
            self.conv2 = GraphConv(hidden, num_classes, norm=norm)
            self.dropout = nn.Dropout(dropout)

        def forward(self, g, x):
            h = self.conv1(g, self.dropout(x))
            return self.conv2(g, self.dropout(h))

    return GCN()


def main() -> None:
    parser = add_arguments(argparse.ArgumentParser(description=__doc__,
                                                   formatter_class=argparse.RawDescriptionHelpFormatter),
                           epochs=200, lr=0.01, weight_decay=5e-4)
    parser.add_argument("--hidden", type=int, default=16)
    parser.add_argument("--dropout", type=float, default=0.5)
    parser.add_argument("--norm", choices=["both", "right", "left", "none"], default="both")
    args = parser.parse_args()

    dgl = import_dgl()
    if dgl is None:
        raise SystemExit("DGL is not importable here: pip install -e '.[dgl]'")
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    data = load_node_data(args.dataset, args.data, args.seed)
    print(f"data      {data.describe()}")
    print(f"mode      {enable_fastpath(args.fastpath, device, 'dgl')}")
    print(f"device    {device}")

    g = dgl.graph((data.edge_index[0], data.edge_index[1]), num_nodes=data.num_nodes)
    g = dgl.add_self_loop(dgl.remove_self_loop(g))   # no zero in-degree nodes
    g = place_dgl_graph(g, device, args.fastpath, ops=("spmm",))
    x = data.x.to(device)
    model = build_model(data.x.shape[1], data.num_classes, args.hidden, args.dropout, args.norm).to(device)

    result = train_node_classifier(model, lambda: model(g, x), data, args, device)
    print_report(result)


if __name__ == "__main__":
    sys.stdout.reconfigure(line_buffering=True)  # each line shows at once, also through a pipe
    main()
