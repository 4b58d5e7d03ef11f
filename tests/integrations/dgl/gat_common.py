"""What the DGL GATConv and GATv2Conv tests share: the layers, their builder and inputs."""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

OUT = 4


class Layer(NamedTuple):
    key: str  #: the stats() key
    projection: str  #: the submodule projecting the source features
    edge_weight: bool  #: whether forward takes an edge_weight
    op: str  #: the attention op (its CUDA kernels)


LAYERS = {
    "GATConv": Layer("dgl.GATConv", "fc", True, "gat_attention"),
    "GATv2Conv": Layer("dgl.GATv2Conv", "fc_src", False, "gatv2_attention"),
}


def build(dgl, layer, pair, heads, identity=False, eval_mode=False, seed=0, **kwargs):
    """``dgl.nn.<layer>`` with in_feats for one feature tensor (6) or a pair ((7, 5)); with
    ``identity`` the destination width equals the output's, so the residual is an identity."""
    from dgl import nn as dglnn

    torch.manual_seed(seed)
    if pair:
        in_feats = (7, heads * OUT if identity else 5)
    else:
        in_feats = heads * OUT if identity else 6
    conv = getattr(dglnn, layer)(in_feats, OUT, heads, allow_zero_in_degree=True, **kwargs)
    if kwargs.get("residual"):
        assert isinstance(conv.res_fc, nn.Linear) != identity
    with torch.no_grad():  # stock inits biases to 0: make them count
        for name, p in conv.named_parameters():
            if name.endswith("bias"):
                p.normal_()
    return conv.eval() if eval_mode else conv.train()


def in_feats_of(conv, pair):
    return (conv._in_src_feats, conv._in_dst_feats) if pair else conv._in_src_feats


def call_kwargs(h, g, call):
    """Forward kwargs; ``edge_weight=True`` stands for a random positive weight per edge of ``g``."""
    call = dict(call)
    if call.pop("edge_weight", False):
        call["edge_weight"] = h.randn(g.num_edges(), seed=5).abs() + 0.1
    return call
