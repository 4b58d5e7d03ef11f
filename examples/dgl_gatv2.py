"""Full-graph node classification with DGL GATv2Conv, stock or through gnn_fastpath.

    python examples/dgl_gatv2.py                       # Cora (../shared/data), fused path
    python examples/dgl_gatv2.py --no-fastpath         # stock DGL, for comparison
    python examples/dgl_gatv2.py --dataset tolokers --epochs 100
    python examples/dgl_gatv2.py --dataset synthetic --device cpu

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
import torch.nn.functional as F
from torch import nn

from _common import (add_arguments, enable_fastpath, import_dgl, load_node_data, place_dgl_graph,
                     print_report, train_node_classifier)


def build_model(in_feats: int, num_classes: int, hidden: int, heads: int, dropout: float):
    from dgl.nn import GATv2Conv

    class GATv2(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = GATv2Conv(in_feats, hidden, heads, feat_drop=dropout, attn_drop=dropout,
                                   activation=F.elu)
            self.conv2 = GATv2Conv(hidden * heads, num_classes, 1, feat_drop=dropout, attn_drop=dropout)

        def forward(self, g, x):
            h = self.conv1(g, x).flatten(1)    # [N, heads * hidden]
            return self.conv2(g, h).mean(1)    # [N, classes]

    return GATv2()


def main() -> None:
    parser = add_arguments(argparse.ArgumentParser(description=__doc__,
                                                   formatter_class=argparse.RawDescriptionHelpFormatter),
                           epochs=200, lr=0.005, weight_decay=5e-4)
    parser.add_argument("--hidden", type=int, default=8)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--dropout", type=float, default=0.6)
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
    g = place_dgl_graph(g, device, args.fastpath, ops=("gatv2_attention",))
    x = data.x.to(device)
    model = build_model(data.x.shape[1], data.num_classes, args.hidden, args.heads, args.dropout).to(device)

    result = train_node_classifier(model, lambda: model(g, x), data, args, device)
    print_report(result)


if __name__ == "__main__":
    sys.stdout.reconfigure(line_buffering=True)  # each line shows at once, also through a pipe
    main()
