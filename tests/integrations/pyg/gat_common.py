"""What the PyG GATConv and GATv2Conv tests share: the layers, their builder and inputs."""
from __future__ import annotations

import torch

F_IN, F_SRC, F_DST = 6, 5, 7

#: The layers of the GAT family, by their torch_geometric.nn name (also the pytest ids).
LAYERS = ["GATConv", "GATv2Conv"]


def make_conv(layer: str, **kwargs):
    """``torch_geometric.nn.<layer>`` seeded (``seed``, default 0), its bias drawn at random."""
    import torch_geometric.nn

    kwargs.setdefault("in_channels", F_IN)
    kwargs.setdefault("out_channels", 4)
    torch.manual_seed(kwargs.pop("seed", 0))
    conv = getattr(torch_geometric.nn, layer)(**kwargs)
    if conv.bias is not None:  # stock initialises the bias to 0: make it count
        with torch.no_grad():
            conv.bias.normal_()
    return conv


def make_x(n, f=F_IN):
    return torch.randn(n, f, requires_grad=True)
