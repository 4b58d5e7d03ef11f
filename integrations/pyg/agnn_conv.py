"""PyG ``AGNNConv`` on :func:`gnn_fastpath.dot_attention` (see :mod:`..agnn`).

Reproduces ``torch_geometric.nn.conv.AGNNConv.forward`` (PyG 2.8): with ``add_self_loops``
every existing self loop is removed and one loop per node appended (``remove_self_loops`` +
``add_self_loops(num_nodes=x.size(0))``; on a torch.sparse adjacency the same edges, PyG
rebuilding the sparse tensor), ``x_norm = F.normalize(x, p=2, dim=-1)``, logits
``beta * <x_norm_i, x_norm_j>``, PyG's softmax over each target's in-edges and the sum of
``alpha_ij x_j``. ``beta`` is a parameter (``requires_grad=True``: its gradient comes back) or
a buffer. One fused op: no [M] logits and no [M, F] messages.

A torch.sparse CSR adjacency with ``add_self_loops``: PyG rebuilds it through ``coalesce``,
which merges duplicate entries (one edge where the CSR stored two); a CSR with duplicate
entries therefore runs stock (reason ``duplicates``; checked once per graph). A coalesced
COO adjacency has none. The adjacency's values are ignored (stock's messages do not read
them), as are an ``EdgeIndex``'s sort flags.

Reduced precision (see :mod:`..shim`): stock's dtypes are replayed by
:func:`..shim.result_dtype` (``F.normalize``, the logit, PyG's softmax and the message
``x_j * alpha``); the op gets ``q = beta * x_norm``, ``k = x_norm`` and ``v = x`` in their
common dtype (a 16-bit ``x`` next to a float32 ``x_norm`` or ``beta`` is upcast, exactly)
and writes stock's message dtype.

Falls back (Unsupported) for: ``aggr`` other than sum, ``flow="target_to_source"``, x not
one 2-D tensor (stock takes no pair), a ``beta`` on another device or of a dtype stock would
not mix with x, ``torch_sparse.SparseTensor`` and the graph inputs listed in :mod:`.graph`.
"""
from __future__ import annotations

import torch
from torch import Tensor

from gnn_fastpath.graph import Graph
from gnn_fastpath.ops.dispatch import require
from .. import agnn
from ..shim import Unsupported, check_like, out_dtype_of, result_dtype
from .graph import check_message_passing, graph_of, pyg_softmax, replace_self_loops


def features(x, *args, **kwargs) -> Tensor:
    """The tensor deciding device and dtype: ``x`` (a pair runs stock, which raises)."""
    if not isinstance(x, Tensor):
        raise Unsupported("input", f"x is a {type(x).__name__} (AGNNConv takes one tensor)")
    return x


def _stock_dtypes(x: Tensor, beta: Tensor):
    """(x_norm, message) as stock types them: ``F.normalize``, ``beta * (n_i * n_j).sum(-1)``,
    PyG's softmax, ``x_j * alpha``."""
    n = agnn.normalize(x)
    alpha = pyg_softmax(beta * (n * n).sum(dim=-1))
    return n, x * alpha.unsqueeze(-1)


def has_duplicates(graph: Graph) -> bool:
    """Whether some (source, target) pair occurs twice; once per Graph (one host sync)."""
    def build() -> bool:
        if graph.num_edges < 2:
            return False
        key = graph.dst_index() * max(graph.n_src, 1) + graph.indices
        key = torch.sort(key).values
        return bool((key[1:] == key[:-1]).any())

    return graph.memo(("pyg", "has_duplicate_edges"), build)


def forward(module, backend: str, x, edge_index):
    """Fused ``AGNNConv.forward``: same arguments, same return value."""
    check_message_passing(module)
    if x.dim() != 2:
        raise Unsupported("input", "x must be a 2-D [N, F] tensor")
    if module.node_dim not in (-2, 0):
        raise Unsupported("node_dim", f"node_dim={module.node_dim}")
    beta = check_like("beta", module.beta, x)
    n = x.size(0)
    graph = graph_of(edge_index, n, n, x)
    if module.add_self_loops:
        if edge_index.layout == torch.sparse_csr and has_duplicates(graph):
            raise Unsupported("duplicates", "a CSR adjacency with duplicate entries (PyG's add_self_loops "
                                            "coalesces them into one edge)")
        graph = replace_self_loops(graph, n).graph
    require("dot_attention", x.device, x.dtype, graph, heads=agnn.heads(x))

    x_norm = agnn.normalize(x)
    q = agnn.queries(beta, x_norm)
    compute = torch.promote_types(torch.promote_types(q.dtype, x_norm.dtype), x.dtype)
    _, message_dtype = result_dtype(_stock_dtypes, x.device, x.dtype, beta.dtype)
    out_dtype = out_dtype_of("AGNNConv", compute, message_dtype)
    return agnn.attention(graph, q.to(compute), x_norm.to(compute), x.to(compute), out_dtype=out_dtype)
