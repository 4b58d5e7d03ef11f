"""PyG ``gcn_norm`` edge values for a graph that already holds its self loops."""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ..cuda import spmm as kernels
from ..reference._precision import compute_dtype, no_autocast
from ..graph import GraphTensors
from ._checks import check_bool, check_graph, check_tensor, graph_on
from .dispatch import CUDA, choose


def gcn_norm_values(graph, edge_weight: Optional[Tensor] = None, improved: bool = False,
                    dtype: Optional[torch.dtype] = None) -> Tensor:
    r"""Symmetric GCN normalisation of every edge of ``graph``, in the caller's edge order.

    What PyG's ``gcn_norm`` computes (``flow="source_to_target"``) after
    ``add_remaining_self_loops``, for a homogeneous graph whose edges already include the
    loops (build the Graph from the loop-augmented ``edge_index``):

    .. math::
        w_e = \begin{cases} \text{edge\_weight}_e & \text{if given} \\
                            \text{fill} = (2 \text{ if improved else } 1) & e \text{ a self loop} \\
                            1 & \text{otherwise} \end{cases}
        \qquad d_i = \sum_{e:\,\mathrm{dst}(e) = i} w_e
        \qquad \hat w_e = d_{\mathrm{src}(e)}^{-1/2}\; w_e\; d_{\mathrm{dst}(e)}^{-1/2}

    ``d`` is the weighted in-degree (edges counted at their target) and scales both ends;
    ``d^{-1/2}`` is taken as 0 where ``d == 0``; negative degrees give NaN, as in PyG.
    ``spmm(graph, x, gcn_norm_values(graph, w), norm="none")`` is then PyG's propagation.

    Reproducing PyG 2.8's ``GCNConv`` on an ``edge_index`` (its ``gcn_norm`` calls
    ``add_remaining_self_loops`` and then weighs *every* edge 1 when no weight was given):

    - without edge weights: ``gcn_norm_values(looped_graph)``, ``improved`` left False;
      PyG's ``edge_index`` path ignores ``improved`` when ``edge_weight is None`` (the loop
      fill only reaches loop *weights*, and there are none), so passing True here would
      differ from it;
    - with edge weights: pass the loop-augmented weights that
      ``add_remaining_self_loops(edge_index, edge_weight, 2.0 if improved else 1.0, N)``
      returns (pre-existing loops keep their own weight, new ones get the fill).

    ``improved=True`` without ``edge_weight`` (every loop weighs 2) is the textbook
    "improved" GCN, which is what PyG's ``SparseTensor`` path (``fill_diag``) computes for a
    graph with one loop per node.

    Args:
        graph (Graph): homogeneous graph (n_src == n_dst) including its self loops.
        edge_weight (Tensor, optional): [M] loop-augmented weights in the caller's edge
            order. Differentiable (through the degrees too) on the PyTorch path.
        improved (bool): self loops weigh 2.0 instead of 1.0 (only without ``edge_weight``;
            see above for when PyG applies it). ``True`` or ``False``; anything else is a
            ValueError (a truthy ``"no"`` must not silently mean True).
        dtype (torch.dtype, optional): result dtype without ``edge_weight``
            (default float32); with it, ``edge_weight.dtype``. float16 and bfloat16 are
            computed in float32 and rounded once at the end (degree sums in 16 bits would
            round at every addition); float64 is computed in float64 (reference backend).

    Returns:
        [M] normalised weights in the caller's edge order, on ``edge_weight``'s device (or
        the graph's).

    On the CUDA backend (:mod:`.dispatch`), two kernels compute it when no gradient is
    needed, and differentiable PyTorch ops on the GPU when ``edge_weight`` requires one;
    the reference backend is the same PyTorch code.
    """
    graph = check_graph(graph)
    if graph.n_src != graph.n_dst:
        raise ValueError(f"gcn_norm_values needs a homogeneous graph, got n_src={graph.n_src}, n_dst={graph.n_dst}")
    if edge_weight is not None:
        check_tensor("edge_weight", edge_weight, (graph.num_edges,))
        graph = graph_on(graph, edge_weight)
        dtype = edge_weight.dtype
    elif dtype is None:
        dtype = torch.float32
    check_bool("improved", improved)
    fill = 2.0 if improved else 1.0
    needs_grad = edge_weight is not None and edge_weight.requires_grad and torch.is_grad_enabled()
    if isinstance(graph, GraphTensors):  # compiled: plain torch operations, fused by the compiler
        return _gcn_norm_torch(graph, edge_weight, fill, compute_dtype(dtype)).to(dtype)
    if choose("gcn_norm_values", graph.device, dtype, graph) == CUDA and not needs_grad:
        w = None if edge_weight is None else edge_weight.to(torch.float32).contiguous()  # kernels read float32
        return kernels.gcn_norm(graph, w, fill).to(dtype)
    with no_autocast(graph.device):
        return _gcn_norm_torch(graph, edge_weight, fill, compute_dtype(dtype)).to(dtype)


def _gcn_norm_torch(graph, edge_weight, fill: float, dtype) -> Tensor:
    """The values in ``dtype`` (float32 or float64; a weight is converted to it)."""
    n = graph.n_dst + int(getattr(graph, "extra_row", False))  # removed edges have their own row
    src, dst = graph.caller_coo()  # caller order, as PyG sees the edges
    if edge_weight is None:
        # no tensor made from a Python number: on a GPU that is a blocking copy (a host sync)
        w = torch.ones(src.shape, dtype=dtype, device=src.device).masked_fill_(src == dst, fill)
    else:
        w = edge_weight.to(dtype)
    deg = torch.zeros(n, dtype=w.dtype, device=w.device).index_add(0, dst, w)
    dinv = deg.pow(-0.5)
    dinv = dinv.masked_fill(dinv == float("inf"), 0.0)
    return dinv[src] * w * dinv[dst]
