"""EdgeConv, propagation-postponed: a linear map of an edge's two endpoints splits into a
destination term and a source term, so the map runs per node and only node-level data is
reduced (shared by the PyG and DGL ``EdgeConv`` shims).

The identities (W = [A | B] the weight of a Linear over ``cat[x_i, x_j - x_i]``, b its bias):

- PyG ``EdgeConv`` (``nn(cat[x_i, x_j - x_i])``, x_i the target): the first Linear gives
  ``A x_i + B (x_j - x_i) + b = U_i + V_j`` with ``U = (A - B) x_dst + b`` and
  ``V = B x_src`` (:func:`split_linear`).
- DGL ``EdgeConv`` (``theta(x_i - x_j) + phi(x_i)``, DGL's ``fn.v_sub_u``: destination
  minus source): ``W x_i + b + phi(x_i) - W x_j``.

When the whole message is ``U_i + V_j`` (PyG: ``nn`` is one Linear; DGL: always without
batch norm), the aggregation over the in-edges of i is node-level (:func:`reduce_postponed`):
``max_j (U_i + V_j) = U_i + max_j V_j`` (min alike), ``sum_j = deg_i U_i + sum_j V_j``,
``mean_j = U_i + mean_j V_j``, and a destination without in-edges gets 0 (stock's empty
aggregate). One ``segment_reduce`` (or ``spmm``) over the [N_src, F] source term: no
[M, F] edge tensor is ever formed, and the Linear multiplies N rows instead of M.

What differs from stock, to rounding: the terms are rounded before they are added (stock
rounds ``x_j - x_i`` and the product), so values agree to float rounding, and a maximum that
stock meets twice only by rounding (two messages equal in float, their source terms not)
is a tie there and not here (the gradient goes to one edge instead of being shared).
Non-finite features can give other non-finite values (``inf - inf`` placed differently).
Where stock's messages are 16-bit, the node terms are float32 and the result is rounded
once (:func:`split_linear`).

:func:`edge_messages` and :func:`edge_graph` serve the partial reorganisation (PyG only: the
first Linear on the nodes, the rest of ``nn`` per edge on ``U_i + V_j``).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from gnn_fastpath import ops
from gnn_fastpath.graph import Graph, GraphTensors


#: The 16-bit dtypes: a message of one of these is computed from float32 node terms.
HALF = (torch.float16, torch.bfloat16)


def compute_dtype(message_dtype: torch.dtype) -> Optional[torch.dtype]:
    """The dtype to compute the node terms in for messages stock types ``message_dtype``:
    float32 for a 16-bit message (see :func:`split_linear`), None (as stock) otherwise."""
    return torch.float32 if message_dtype in HALF else None


def no_autocast(device: torch.device):
    """A context with autocast off on ``device``."""
    return torch.autocast(device_type=device.type, enabled=False)


def linear(x: Tensor, weight: Tensor, bias: Optional[Tensor], compute: Optional[torch.dtype]) -> Tensor:
    """``F.linear(x, weight, bias)``: as stock runs it (``compute`` None: the ambient autocast
    applies) or in ``compute`` with autocast off (the gradients flow back through the casts
    in the inputs' own dtypes)."""
    if compute is None:
        return F.linear(x, weight, bias)
    with no_autocast(x.device):
        return F.linear(x.to(compute), weight.to(compute), None if bias is None else bias.to(compute))


def split_linear(weight: Tensor, bias: Optional[Tensor], x_dst: Tensor, x_src: Tensor,
                 compute: Optional[torch.dtype] = None) -> Tuple[Tensor, Tensor]:
    """(U, V) of a Linear over ``cat[x_i, x_j - x_i]``: ``U = (A - B) x_dst + b`` [N_dst, H],
    ``V = B x_src`` [N_src, H], with ``weight = [A | B]`` [H, 2F].

    ``compute``: see :func:`linear`. A 16-bit message must come from float32 terms: U_i and
    V_j can be much larger than U_i + V_j (they cancel where x_j is near x_i), so rounding each
    to 16 bits before the sum costs many units of the message's last place, where stock
    rounds the message once (measured: PyG EdgeConv(Sequential(Linear, ReLU, Linear)) under
    CPU autocast with bf16 features, input-gradient errors vs float64 of 5e-2 against
    stock's 3e-3). The caller rounds the reduced result (or the message) to stock's dtype once.
    """
    f = x_src.shape[-1]
    a, b = weight[:, :f], weight[:, f:]
    return linear(x_dst, a - b, bias, compute), linear(x_src, b, None, compute)


def _on(graph: Graph, like: Tensor) -> Graph:
    return graph if graph.device == like.device else graph.to(like.device)


def _column(t: Tensor, like: Tensor) -> Tensor:
    """``t`` [N] viewed as [N, 1, ...] to broadcast against ``like`` [N, ...]."""
    return t.view((t.shape[0],) + (1,) * (like.dim() - 1))


def in_edges_mask(graph: Graph, like: Tensor) -> Tensor:
    """bool [N_dst, 1, ...] (broadcasting against ``like``): whether each destination has an
    in-edge (memoised per graph and device)."""
    graph = _on(graph, like)
    return _column(graph.memo(("integrations", "has_in_edges"), lambda: graph.in_degree() > 0), like)


def _in_degree(graph: Graph, like: Tensor) -> Tensor:
    """The in-degree in ``like``'s dtype as [N_dst, 1, ...] (memoised)."""
    graph = _on(graph, like)
    return _column(graph.memo(("integrations", "in_degree", like.dtype),
                              lambda: graph.in_degree().to(like.dtype)), like)


def reduce_postponed(graph: Graph, node_term: Tensor, src_term: Tensor, reduce: str, *, tie_break: str = "split",
                     non_finite: str = "keep", empty_rows: bool = True, negate: bool = False) -> Tensor:
    """``aggr_j (U_i + V_j)`` over each destination's in-edges, 0 without in-edges, computed
    on node-level data: ``U = node_term`` [N_dst, F], ``V = src_term`` [N_src, F] (``negate``:
    ``V = -src_term``, so a max is ``U - min(src_term)`` with no negated copy).

    ``reduce``: ``"max"``/``"min"`` (``segment_reduce`` with ``tie_break`` and
    ``non_finite``), ``"sum"`` or ``"mean"`` (``spmm``). ``empty_rows=False`` promises that
    every destination has an in-edge (skips the mask).
    """
    if reduce in ("max", "min"):
        inner = reduce if not negate else ("min" if reduce == "max" else "max")
        r = ops.segment_reduce(graph, src_term, inner, tie_break=tie_break, non_finite=non_finite)
        out = node_term - r if negate else node_term + r
        return torch.where(in_edges_mask(graph, out), out, 0) if empty_rows else out
    r = ops.spmm(graph, src_term, norm="right" if reduce == "mean" else "none")
    if reduce == "sum":
        u = _in_degree(graph, node_term) * node_term
    else:
        u = torch.where(in_edges_mask(graph, node_term), node_term, 0) if empty_rows else node_term
    return u - r if negate else u + r


def edge_graph(graph: Graph) -> Graph:
    """``graph`` with every edge its own source: source e is the caller's edge e (n_src = M),
    same rows; reducing [M, F] edge messages over it is stock's aggregation of messages
    (memoised on ``graph``)."""
    if isinstance(graph, GraphTensors):
        return GraphTensors(graph.indptr, graph.perm, graph.perm, None, None, None, None, graph.num_edges,
                            extra_row=graph.extra_row)
    return graph.memo(("integrations", "edge_graph"),
                      lambda: Graph.from_csr(graph.indptr, graph.perm, graph.perm, graph.num_edges, graph.n_dst,
                                             name="edge graph"))


def edge_messages(graph: Graph, node_term: Tensor, src_term: Tensor) -> Tensor:
    """``U_i + V_j`` for every edge, [M, F] in the caller's edge order."""
    graph = _on(graph, src_term)
    src, dst = graph.caller_coo()
    return node_term.index_select(0, dst) + src_term.index_select(0, src)
