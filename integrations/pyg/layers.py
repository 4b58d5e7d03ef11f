"""The PyG shims: which classes enable() patches and the fused forward of each."""
from __future__ import annotations

import inspect
from typing import Callable, List

import torch

from torch_geometric.nn.conv import GATv2Conv, GCNConv, SAGEConv, TransformerConv
from torch_geometric.nn.conv import GATConv
from torch_geometric.nn.conv import AGNNConv, DynamicEdgeConv, EdgeConv, GINConv, GraphConv

from ..shim import Shim, Unsupported
from . import gatv2_conv, gcn_conv, sage_conv, transformer_conv
from . import gat_conv
from . import agnn_conv, dynamic_edge_conv, edge_conv, gin_conv, graph_conv


def _features(module) -> Callable:
    """The shim's ``features``: ``module.features`` once the arguments bind to the fused
    forward's (= stock's) signature; arguments that do not bind run stock, which raises."""
    signature = inspect.signature(module.forward)
    # Plain positional calls, ``conv(x, edge_index)``, bind whenever their count fits: that
    # case skips Signature.bind (several microseconds of host time per layer call).
    positional = [p for p in list(signature.parameters.values())[2:]
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = sum(p.default is p.empty for p in positional)

    def features(*args, **kwargs):
        if kwargs or not required <= len(args) <= len(positional):
            try:
                signature.bind(None, None, *args, **kwargs)
            except TypeError as exc:
                raise Unsupported("arguments", str(exc)) from None
        return module.features(*args, **kwargs)

    return features


def edges(x=None, edge_index=None, *args, **kwargs):
    """(the call's edge count, ``edge_index``), the count read off ``edge_index`` (a Tensor
    [2, M], an ``EdgeIndex`` or a torch.sparse adjacency) without building anything; None for
    anything else."""
    if not isinstance(edge_index, torch.Tensor):
        return None
    if edge_index.layout == torch.sparse_coo:
        return edge_index._nnz(), edge_index
    if edge_index.layout == torch.sparse_csr:
        return edge_index.col_indices().numel(), edge_index
    return (edge_index.size(1), edge_index) if edge_index.dim() == 2 else None


# What a fused forward replaces of a MessagePassing layer: overriding any of these (in a
# subclass or on the instance) sends the layer to its stock code.
MESSAGE_PASSING_METHODS = ("forward", "propagate", "message", "aggregate", "message_and_aggregate", "update",
                           "edge_update", "edge_updater")

SHIMS: List[Shim] = [
    Shim(key="pyg.TransformerConv", cls=TransformerConv, forward=transformer_conv.forward,
         op="dot_attention", features=_features(transformer_conv), methods=MESSAGE_PASSING_METHODS,
         edges=edges),
    Shim(key="pyg.GATv2Conv", cls=GATv2Conv, forward=gatv2_conv.forward,
         op="gatv2_attention", features=_features(gatv2_conv), methods=MESSAGE_PASSING_METHODS,
         edges=edges),
    Shim(key="pyg.GATConv", cls=GATConv, forward=gat_conv.forward,
         op="gat_attention", features=_features(gat_conv), methods=MESSAGE_PASSING_METHODS,
         edges=edges),
    Shim(key="pyg.GCNConv", cls=GCNConv, forward=gcn_conv.forward,
         op="spmm", features=_features(gcn_conv), methods=MESSAGE_PASSING_METHODS,
         edges=edges),
    Shim(key="pyg.SAGEConv", cls=SAGEConv, forward=sage_conv.forward,
         op=sage_conv.op_for, features=_features(sage_conv), methods=MESSAGE_PASSING_METHODS,
         edges=edges),
    Shim(key="pyg.AGNNConv", cls=AGNNConv, forward=agnn_conv.forward,
         op="dot_attention", features=_features(agnn_conv), methods=MESSAGE_PASSING_METHODS,
         edges=edges),
    Shim(key="pyg.GINConv", cls=GINConv, forward=gin_conv.forward,
         op=gin_conv.op_for, features=_features(gin_conv), methods=MESSAGE_PASSING_METHODS,
         edges=edges),
    Shim(key="pyg.GraphConv", cls=GraphConv, forward=graph_conv.forward,
         op=graph_conv.op_for, features=_features(graph_conv), methods=MESSAGE_PASSING_METHODS,
         edges=edges),
    Shim(key="pyg.EdgeConv", cls=EdgeConv, forward=edge_conv.forward,
         op=edge_conv.op_for, features=_features(edge_conv), methods=MESSAGE_PASSING_METHODS,
         edges=edges),
    Shim(key="pyg.DynamicEdgeConv", cls=DynamicEdgeConv, forward=dynamic_edge_conv.forward,
         op=dynamic_edge_conv.op_for, features=_features(dynamic_edge_conv), methods=MESSAGE_PASSING_METHODS),
]
