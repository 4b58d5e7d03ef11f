"""PyG ``EdgeConv`` and ``DynamicEdgeConv``, propagation-postponed (see :mod:`..edge_conv`).

Stock (PyG 2.8): each message is ``nn(cat[x_i, x_j - x_i])`` (x_i the target, x_j the
source; a single tensor is both sides), aggregated by ``aggr`` (default ``"max"``) over each
target's in-edges; ``DynamicEdgeConv`` first builds its graph with pyg-lib's
``torch.ops.pyg.knn(x[0], x[1], ptr_l, ptr_r, k, False, 1)`` (the shim makes the same call,
then runs EdgeConv's fused body on that graph).

What runs fused, by ``nn``:

- **one Linear** (``torch.nn.Linear`` or PyG's ``Linear``, or a ``Sequential`` holding just
  one): the message is ``U_i + V_j`` (``U = (A - B) x_dst + b``, ``V = B x_src``), so the
  plain aggregations are node-level: max/min ``U_i + segment_reduce(V)``, sum
  ``deg_i U_i + spmm(V)``, mean ``U_i + spmm(V, "right")``, 0 without in-edges. No [M, F] edge
  tensor, and the Linear multiplies N rows instead of M.
- **a ``Sequential`` whose first module is a Linear** (and more modules after it): partial
  reorganisation. The first Linear runs on the nodes (U, V as above), the edge tensor
  ``h_ij = U_i + V_j`` [M, hidden] is formed by two gathers and an add (caller edge order,
  so batch norm and dropout in the rest of ``nn`` see stock's rows), the remaining modules run
  on it as submodules, and the messages are reduced by the ops over :func:`..edge_conv.edge_graph`
  (max/min ``segment_reduce`` with stock's tie rule on the messages themselves: exact).
  It saves the ``cat``, the subtraction, the x_i/x_j gathers and the edge-level matmul of
  the first Linear but still writes [M, hidden]; NOT MEASURED YET (no GPU where it was
  written): :data:`PARTIAL` picks when it runs, and its ``"auto"`` rule (only when the first
  Linear does not widen: ``out_features <= in_features``, i.e. hidden <= 2F, where the bytes
  gathered per edge, ~7*hidden, stay below stock's ~13F + hidden) is a byte-count estimate
  for the lead to benchmark and settle. When it does not run, the layer runs stock (reason
  ``partial_reorganisation``).
- anything else (a first module that is not a plain Linear, a PyG ``MLP``, a function):
  stock (reason ``nn``).

Tie rule of max/min in the one-Linear case: PyG's scatter splits a tied maximum's gradient
as ``g / (n + [o == 0])`` (torch counts the untouched zero of its output as one more tied
candidate when the extreme o is exactly 0); here the extreme reduced is ``max_j V_j``, not
``o = U_i + max_j V_j``, so the op runs ``tie_break="even"`` (``g / n``): the gradients equal
stock's except where o is exactly 0 (e.g. all-zero features with a zero bias), where stock
loses the share it gives to that zero. On CUDA with torch-scatter installed stock gives a
tie to one arbitrary edge anyway. The partial path has no such difference.

Known differences (inherent to the reorganisation; see :mod:`..edge_conv`): values agree to
float rounding, not bit for bit, so a maximum two messages reach only by rounding (or, with
features that repeat rows, by BLAS rounding equal rows differently by their position) is a
tie on one path and not on the other; and non-finite features can give other non-finite
values and gradients (stock spreads a NaN extreme's gradient to every edge of the row through
its edge-level Linear; ``inf - inf`` lands elsewhere). A ``segment_reduce`` taking the
destination term (``ext_j (u_i + v_j)``) would remove the one-Linear tie and non-finite
differences while staying node-level; the op does not offer it yet.

The Linear's ``weight``/``bias`` are read directly (it is not called): a first Linear (or
``nn``) with hooks runs stock (reason ``hooks``), as does one whose input width is not
``2 * F`` (stock raises).

Reduced precision (see :mod:`..shim`): where stock's first Linear gives 16-bit messages
(under autocast, in a half module), U and V are computed in float32 (autocast off for these
two node-level products) and the result is rounded once to stock's dtype: the reduced
output (one Linear) or the edge tensor ``U_i + V_j`` (partial), which the rest of ``nn`` then
takes as stock's messages. Rounding U and V to 16 bits separately would lose the bits they
cancel (see :func:`..edge_conv.split_linear`). The 16-bit case thus reduces float32 node data
(twice the bytes of a 16-bit reduction): for the lead to weigh when benchmarking.

Falls back (Unsupported) also for: other aggregations, ``flow="target_to_source"``,
features that are not 2-D or of different widths, a pair without its target side (stock
fails), the graph inputs listed in :mod:`.graph` and the aggregation paths
:mod:`.aggregation` leaves to stock; ``DynamicEdgeConv`` without pyg-lib's ``knn``
(reason ``knn``).
"""
from __future__ import annotations

from typing import List, Tuple

from torch import Tensor, nn

from gnn_fastpath.ops.dispatch import require
from .. import edge_conv
from ..shim import Unsupported, has_module_hooks, linear_dtype
from .aggregation import aggregate, aggregation, check_module, node_counts, op_of, reduce_of, split
from .graph import check_inputs, graph_of, pair_features

#: When the partial reorganisation (``nn`` = ``Sequential(Linear, ...)``) runs: ``"auto"``
#: (the first Linear does not widen), ``"always"`` or ``"never"``. A module attribute, read
#: per call, so a benchmark can switch it
#: (``gnn_fastpath.integrations.pyg.edge_conv.PARTIAL = "always"``); not an environment
#: variable until measurements say which rule to keep.
PARTIAL = "auto"


def op_for(module) -> str:
    """The op family ``module`` runs on (the Shim's ``op``)."""
    return op_of(reduce_of(module))


def features(x, *args, **kwargs) -> Tensor:
    """The tensor deciding device and dtype: ``x`` or ``x[0]`` of a pair."""
    return pair_features(x)


def _is_linear(m) -> bool:
    from torch_geometric.nn.dense.linear import Linear

    return type(m) in (nn.Linear, Linear)


def split_nn(module, width: int) -> Tuple[nn.Module, List[nn.Module]]:
    """(first Linear, the modules after it) of ``module.nn`` for features of ``width``, when
    the fused path runs it; Unsupported otherwise."""
    net = module.nn
    if _is_linear(net):
        first, rest = net, []
    elif type(net) is nn.Sequential and len(net) >= 1 and _is_linear(net[0]):
        if has_module_hooks(net):
            raise Unsupported("hooks", "hooks on nn (a Sequential the fused path does not call)")
        first, rest = net[0], list(net)[1:]
    else:
        raise Unsupported("nn", f"nn is a {type(net).__name__} (the fused path takes a Linear or a Sequential "
                                "starting with one)")
    if has_module_hooks(first):
        raise Unsupported("hooks", "hooks on nn's first Linear (the fused path reads its weights)")
    weight = first.weight
    if weight.dim() != 2 or weight.shape[1] != 2 * width:
        raise Unsupported("input", f"nn's first Linear takes {weight.shape[-1]} features, "
                                   f"cat[x_i, x_j - x_i] has {2 * width}")
    if rest and not _partial_runs(weight):
        raise Unsupported("partial_reorganisation", f"nn = Sequential(Linear({weight.shape[1]}, {weight.shape[0]}), "
                                                    f"...) with PARTIAL={PARTIAL!r}")
    return first, rest


def _partial_runs(weight: Tensor) -> bool:
    """Whether the partial reorganisation runs for a first Linear of this weight [H, 2F]
    (see :data:`PARTIAL`)."""
    if PARTIAL == "always":
        return True
    if PARTIAL == "never":
        return False
    return weight.shape[0] <= weight.shape[1]  # "auto": the first Linear does not widen


def check_features(x_src: Tensor, x_dst) -> None:
    if x_dst is None:
        raise Unsupported("input", "x[1] is None (stock's message needs x_i)")
    if x_dst.shape[-1] != x_src.shape[-1]:
        raise Unsupported("input", "source and target features of different widths (stock's x_j - x_i fails)")


def fused_body(module, reduce: str, x, edge_index, size=None):
    """EdgeConv's propagate, fused; ``reduce`` from :func:`.aggregation.check_module`."""
    x_src, x_dst = split(x)
    check_features(x_src, x_dst)
    first, rest = split_nn(module, x_src.shape[-1])
    check_inputs(module, x_src)
    n_src, n_dst = node_counts(edge_index, size, x_src, x_dst)
    graph = graph_of(edge_index, n_src, n_dst, x_src)
    path = aggregation(module, reduce, edge_index, x_src, x_src.dtype)
    require(op_of(reduce), x_src.device, x_src.dtype, graph)  # before any submodule runs

    message_dtype = linear_dtype(x_src, first.weight)  # stock's first Linear output
    u, v = edge_conv.split_linear(first.weight, first.bias, x_dst, x_src, edge_conv.compute_dtype(message_dtype))
    if not rest:
        tie = "even" if reduce in ("max", "min") else "split"
        return edge_conv.reduce_postponed(graph, u, v, reduce, tie_break=tie).to(message_dtype)
    # Partial reorganisation (see the module docstring and PARTIAL): the edge tensor of the
    # first Linear's output, built from node-level terms; the rest of nn per edge.
    h = edge_conv.edge_messages(graph, u, v).to(message_dtype)
    for m in rest:
        h = m(h)
    return aggregate(edge_conv.edge_graph(graph), h, path)


def forward(module, backend: str, x, edge_index):
    """Fused ``EdgeConv.forward``: same arguments, same return value."""
    from torch_geometric.nn.conv import EdgeConv

    return fused_body(module, check_module(module, EdgeConv), x, edge_index)
