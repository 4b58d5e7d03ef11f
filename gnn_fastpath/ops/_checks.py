"""Argument checks shared by the ops: clear ValueErrors that name the argument."""
from __future__ import annotations

from typing import Optional, Sequence

from torch import Tensor

from ..graph import Graph


def check_graph(graph) -> Graph:
    if not isinstance(graph, Graph):
        raise ValueError(f"graph must be a gnn_fastpath.Graph (see Graph.of), got {type(graph).__name__}")
    return graph


def check_tensor(name: str, t, shape: Sequence[Optional[int]], like: Optional[Tensor] = None) -> Tensor:
    """Check ``t`` is a floating tensor of ``shape`` (None = any size) on ``like``'s device/dtype."""
    if not isinstance(t, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not t.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")
    if t.dim() != len(shape) or any(s is not None and s != d for s, d in zip(shape, t.shape)):
        want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
        raise ValueError(f"{name} must have shape {want}, got {list(t.shape)}")
    if like is not None:
        if t.device != like.device:
            raise ValueError(f"{name} is on {t.device} but the other inputs are on {like.device}")
        if t.dtype != like.dtype:
            raise ValueError(f"{name} has dtype {t.dtype} but the other inputs have {like.dtype}")
    return t


def graph_on(graph: Graph, x: Tensor) -> Graph:
    """The graph on ``x``'s device (a cached copy when they differ)."""
    return graph if graph.device == x.device else graph.to(x.device)


def check_choice(name: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}; got {value!r}")


def check_probability(name: str, p) -> float:
    if isinstance(p, bool) or not isinstance(p, (int, float)):
        raise ValueError(f"{name} must be a float in [0, 1], got {p!r}")
    p = float(p)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {p}")
    return p


def check_return_attention(value) -> None:
    if not (value is False or value is True or value == "dropped"):
        raise ValueError(f"return_attention must be False, True or 'dropped', got {value!r}")


def check_features(graph: Graph, x, edge_weight) -> None:
    """``x`` [N_src, F...] node features and an optional [M] ``edge_weight`` like it."""
    if not hasattr(x, "dim") or x.dim() < 2:
        raise ValueError(f"x must be a tensor of shape [N_src, F...], got {getattr(x, 'shape', type(x).__name__)}")
    check_tensor("x", x, (graph.n_src,) + (None,) * (x.dim() - 1))
    if edge_weight is not None:
        check_tensor("edge_weight", edge_weight, (graph.num_edges,), like=x)


def row_width(t: Tensor) -> int:
    """Features per node row: the product of the trailing dimensions."""
    n = 1
    for d in t.shape[1:]:
        n *= d
    return n
