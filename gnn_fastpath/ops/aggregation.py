"""Neighbourhood aggregation ops: weighted sum (SpMM) and min/max reduction."""
from __future__ import annotations

from typing import Optional

from torch import Tensor

from .. import reference
from ._checks import check_choice, check_graph, check_tensor, graph_on
from ._dispatch import CUDA, backend_for, register_cuda

NORMS = ("none", "left", "right", "both")
REDUCES = ("max", "min")
TIE_BREAKS = reference.aggregation.TIE_BREAKS


def _check_features(graph, x, edge_weight):
    if not hasattr(x, "dim") or x.dim() < 2:
        raise ValueError(f"x must be a tensor of shape [N_src, F...], got {getattr(x, 'shape', type(x).__name__)}")
    check_tensor("x", x, (graph.n_src,) + (None,) * (x.dim() - 1))
    if edge_weight is not None:
        check_tensor("edge_weight", edge_weight, (graph.num_edges,), like=x)


def spmm(graph, x: Tensor, edge_weight: Optional[Tensor] = None, norm: str = "none") -> Tensor:
    r"""Sum of (weighted, normalised) source features over each destination's in-edges.

    .. math::
        o_i = c^{dst}_i \sum_{j \in \mathcal{N}(i)} w_{ij}\, c^{src}_j\, x_j

    with DGL ``GraphConv`` normalisation: ``norm="none"``: ``c = 1``; ``"left"``:
    ``c^{src}_j = 1/\deg^{out}_j``; ``"right"``: ``c^{dst}_i = 1/\deg^{in}_i``; ``"both"``:
    ``c^{src}_j = \deg^{out}_j{}^{-1/2}``, ``c^{dst}_i = \deg^{in}_i{}^{-1/2}``. Degrees are
    structural (edge counts, clamped to >= 1); edge weights do not enter them.

    Args:
        graph (Graph): the graph.
        x (Tensor): [N_src, F] (or [N_src, *]) source features.
        edge_weight (Tensor, optional): [M] in the caller's edge order; differentiable.
        norm (str): ``"none"``, ``"left"``, ``"right"`` or ``"both"``.

    Returns:
        [N_dst, F] (same trailing shape as ``x``).
    """
    graph = check_graph(graph)
    _check_features(graph, x, edge_weight)
    check_choice("norm", norm, NORMS)
    graph = graph_on(graph, x)
    if backend_for("spmm", x) == CUDA and graph.fits_int32():
        from .cuda_spmm import spmm_cuda

        return spmm_cuda(graph, x, edge_weight, norm)
    return reference.spmm(graph, x, edge_weight, norm)


def segment_reduce(graph, x: Tensor, reduce: str = "max", edge_weight: Optional[Tensor] = None,
                   tie_break: str = "split") -> Tensor:
    r"""Element-wise max or min of source features over each destination's in-edges.

    .. math::
        o_{i,f} = \max_{j \in \mathcal{N}(i)} w_{ij}\, x_{j,f} \quad (\text{or } \min)

    Destinations with no in-edges get 0. The value never depends on ``tie_break``; the
    gradient of an extreme reached by several edges (ties: common after a ReLU, where many
    messages are exactly 0) does, and each framework does it its own way:

    - ``"split"`` (default, PyG): what ``torch.scatter_reduce(..., include_self=False)`` on a
      zero tensor does, which is PyG's ``MaxAggregation``/``SAGEConv(aggr="max")`` on a plain
      ``edge_index`` without torch-scatter: each tied edge gets ``g / (n + [o == 0])``, with
      ``n`` the number of tied edges. The ``[o == 0]`` term is torch's: the untouched zero of
      the output counts as one more tied candidate whenever the extreme is exactly 0.
    - ``"even"``: ``g / n`` to each tied edge (no framework does exactly this; offered as the
      plain rule).
    - ``"first"`` / ``"last"``: the whole ``g`` to one tied edge, the first / last in the
      caller's edge order. DGL 2.1 (CPU) ``update_all(fn.copy_u, fn.max)`` and
      ``fn.u_mul_e`` with per-feature edge data give it to the last; ``fn.u_mul_e`` with a
      broadcast ``[M]``/``[M, 1]`` edge weight (``SAGEConv('pool')`` with ``edge_weight``)
      to the first.

    Args:
        graph (Graph): the graph.
        x (Tensor): [N_src, F] (or [N_src, *]) source features.
        reduce (str): ``"max"`` or ``"min"``.
        edge_weight (Tensor, optional): [M] per-edge multiplier in the caller's edge order.
        tie_break (str): ``"split"``, ``"even"``, ``"first"`` or ``"last"`` (see above).

    Returns:
        [N_dst, F] (same trailing shape as ``x``).
    """
    graph = check_graph(graph)
    _check_features(graph, x, edge_weight)
    check_choice("reduce", reduce, REDUCES)
    check_choice("tie_break", tie_break, TIE_BREAKS)
    graph = graph_on(graph, x)
    if backend_for("segment_reduce", x) == CUDA and graph.fits_int32():
        from .cuda_segment_reduce import segment_reduce_cuda

        return segment_reduce_cuda(graph, x, reduce, edge_weight, tie_break)
    return reference.segment_reduce(graph, x, reduce, edge_weight, tie_break)


register_cuda("spmm")
register_cuda("segment_reduce")
