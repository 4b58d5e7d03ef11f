"""Full-graph node classification with a 2-layer PyG TransformerConv, stock or through gnn_fastpath.

    python examples/pyg_transformer.py                       # Cora (../shared/data), fused path
    python examples/pyg_transformer.py --no-fastpath         # stock PyG, same seed, for comparison
    python examples/pyg_transformer.py --dataset tolokers --epochs 100
    python examples/pyg_transformer.py --dataset synthetic --device cpu

The model is unchanged PyG code; ``gnn_fastpath.enable()`` is the only difference. On a GPU
the layers run the fused CUDA kernels; on the CPU ``--fastpath`` runs the shims on the
pure-PyTorch reference ops (``enable(cpu="reference")``): that checks them against stock, it
is not meant to be faster. Both modes with the same seed reach the same accuracy within
noise (attention dropout draws its own random numbers on the fused path; with
``--dropout 0`` the two runs agree to float precision).

Prints the loss of every epoch (with a tqdm bar), the final test accuracy, the mean epoch
time, the peak GPU memory and ``gnn_fastpath.stats()``.
"""
from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F
from torch import nn

from _common import (add_arguments, enable_fastpath, import_pyg, load_node_data, print_report,
                     train_node_classifier)


class GraphTransformer(nn.Module):
    """Two TransformerConv layers: ``heads`` concatenated heads, then one averaged head."""

    def __init__(self, in_channels: int, hidden: int, heads: int, num_classes: int, dropout: float):
        from torch_geometric.nn import TransformerConv

        super().__init__()
        self.dropout = dropout
        self.conv1 = TransformerConv(in_channels, hidden, heads=heads, dropout=dropout)
        self.conv2 = TransformerConv(hidden * heads, num_classes, heads=1, concat=False, dropout=dropout)

    def forward(self, x, edge_index):
        x = F.dropout(x, p=self.dropout, training=self.training)
        x = F.elu(self.conv1(x, edge_index))
        x = F.dropout(x, p=self.dropout, training=self.training)
        return self.conv2(x, edge_index)


def main() -> None:
    parser = add_arguments(argparse.ArgumentParser(description=__doc__,
                                                   formatter_class=argparse.RawDescriptionHelpFormatter))
    parser.add_argument("--hidden", type=int, default=16, help="channels per head of the first layer")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--dropout", type=float, default=0.5, help="feature and attention dropout")
    args = parser.parse_args()
    if import_pyg() is None:
        raise SystemExit("torch_geometric is not installed: pip install -e '.[pyg]'")
    device = torch.device(args.device)

    data = load_node_data(args.dataset, args.data, args.seed)
    print(data.describe())
    print(f"device {device}; {enable_fastpath(args.fastpath, device, 'pyg')}")

    torch.manual_seed(args.seed)
    model = GraphTransformer(data.x.shape[1], args.hidden, args.heads, data.num_classes, args.dropout).to(device)
    x, edge_index = data.x.to(device), data.edge_index.to(device)
    result = train_node_classifier(model, lambda: model(x, edge_index), data, args, device)
    print_report(result)


if __name__ == "__main__":
    sys.stdout.reconfigure(line_buffering=True)  # each line shows at once, also through a pipe
    main()
