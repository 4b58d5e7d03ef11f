"""The DGL shims: which classes enable() patches and the fused forward of each (one table,
as the PyG shims' ``integrations/pyg/layers.py``).

Imported only once ``import dgl`` has succeeded (see ``__init__.shims``).
"""
from __future__ import annotations

from typing import List

from dgl.nn.pytorch.conv import AGNNConv, EdgeConv, GATConv, GATv2Conv, GINConv, GraphConv, SAGEConv

from ..shim import Shim
from . import agnn_conv, edge_conv, gat_conv, gatv2_conv, gin_conv, graph_conv, sage_conv
from .graph import features_of

SHIMS: List[Shim] = [
    Shim(key="dgl.GATv2Conv", cls=GATv2Conv, forward=gatv2_conv.fused_forward, op="gatv2_attention",
         features=features_of),
    Shim(key="dgl.GATConv", cls=GATConv, forward=gat_conv.fused_forward, op="gat_attention", features=features_of),
    Shim(key="dgl.GraphConv", cls=GraphConv, forward=graph_conv.fused_forward, op="spmm", features=features_of),
    Shim(key="dgl.SAGEConv", cls=SAGEConv, forward=sage_conv.fused_forward, op=sage_conv.op_for,
         features=features_of),
    Shim(key="dgl.AGNNConv", cls=AGNNConv, forward=agnn_conv.fused_forward, op="dot_attention",
         features=features_of),
    Shim(key="dgl.GINConv", cls=GINConv, forward=gin_conv.fused_forward, op=gin_conv.op_for, features=features_of),
    Shim(key="dgl.EdgeConv", cls=EdgeConv, forward=edge_conv.fused_forward, op="segment_reduce",
         features=features_of),
]
