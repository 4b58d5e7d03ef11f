"""PyG ``DynamicEdgeConv``: stock's kNN graph, then EdgeConv's fused body (see :mod:`.edge_conv`).

Reproduces ``torch_geometric.nn.conv.DynamicEdgeConv.forward`` (PyG 2.8): ``x`` becomes a pair,
``batch`` (None, a tensor, or a pair) gives the per-graph pointers (``index2ptr``), the graph is
pyg-lib's ``torch.ops.pyg.knn(x[0], x[1], ptr_l, ptr_r, k, False, 1).flip([0])`` (the very
call, so the same edges in the same order), and the messages ``nn(cat[x_i, x_j - x_i])`` are
aggregated as :mod:`.edge_conv` does for ``EdgeConv``. The kNN graph is new on every call, so
its Graph is built per call (no cache to reuse).

Falls back (Unsupported) for everything :mod:`.edge_conv` leaves to stock (checked before
the kNN search), and when ``torch.ops.pyg.knn`` is not available (reason ``knn``: PyG
refuses to build the layer without pyg-lib, so only a module built another way meets it;
stock then raises).
"""
from __future__ import annotations

import torch
from torch import Tensor

from gnn_fastpath.ops.dispatch import require
from ..shim import Unsupported
from .aggregation import check_module, op_of, reduce_of, split
from .edge_conv import check_features, split_nn, fused_body
from .graph import check_inputs, pair_features


def op_for(module) -> str:
    """The op family ``module`` runs on (the Shim's ``op``)."""
    return op_of(reduce_of(module))


def features(x, *args, **kwargs) -> Tensor:
    """The tensor deciding device and dtype: ``x`` or ``x[0]`` of a pair."""
    return pair_features(x)


def _knn():
    """pyg-lib's ``knn`` op, or Unsupported when it is not there (stock raises then)."""
    try:
        return torch.ops.pyg.knn
    except (AttributeError, RuntimeError):
        raise Unsupported("knn", "torch.ops.pyg.knn is not available (pyg-lib is not installed)") from None


def forward(module, backend: str, x, batch=None):
    """Fused ``DynamicEdgeConv.forward``: stock's kNN graph, then EdgeConv's fused body."""
    from torch_geometric.index import index2ptr
    from torch_geometric.nn.conv import DynamicEdgeConv

    reduce = check_module(module, DynamicEdgeConv)
    knn = _knn()
    pair = (x, x) if isinstance(x, Tensor) else x
    if not isinstance(pair, (tuple, list)) or len(pair) != 2 or not all(isinstance(t, Tensor) for t in pair):
        raise Unsupported("input", "x must be a tensor or a pair of tensors")
    if batch is None:
        b = (None, None)
    elif isinstance(batch, Tensor):
        b = (batch, batch)
    elif isinstance(batch, tuple) and len(batch) == 2:
        b = (batch[0], batch[1])
    else:
        raise Unsupported("input", f"batch is a {type(batch).__name__}")
    x_src, x_dst = split(tuple(pair))
    check_features(x_src, x_dst)
    split_nn(module, x_src.shape[-1])  # nn's checks before the kNN search
    check_inputs(module, x_src)
    require(op_of(reduce), x_src.device, x_src.dtype)
    ptr_l = None if b[0] is None else index2ptr(b[0])
    ptr_r = None if b[1] is None else index2ptr(b[1])
    edge_index = knn(pair[0], pair[1], ptr_l, ptr_r, module.k, False, 1).flip([0])
    return fused_body(module, reduce, tuple(pair), edge_index)
