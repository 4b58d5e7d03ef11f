"""Argument checks shared by the ops: clear ValueErrors that name the argument.

Devices: the graph may be on any device (an op copies it once to the features' device,
:func:`graph_on`); every tensor argument must be on one device. Each op first passes all
its tensor arguments to :func:`check_devices`, so a mismatch names the arguments that
differ from the rest (``"x_src is on meta, x_dst and att on cpu"``), not whichever argument
happened to be compared second.
"""
from __future__ import annotations

import math
import numbers
from typing import Optional, Sequence, Tuple

import torch
from torch import Tensor

from ..graph import Graph, GraphTensors


def check_graph(graph) -> Graph:
    """A Graph, or the GraphTensors a compiled layer builds (which the ops run on their
    custom operators, :mod:`.library`)."""
    if not isinstance(graph, (Graph, GraphTensors)):
        raise ValueError(f"graph must be a gnn_fastpath.Graph (see Graph.of), got {type(graph).__name__}")
    return graph


def check_devices(*named: Tuple[str, object]) -> None:
    """Every tensor among the ``(name, value)`` pairs on one device; ValueError listing each
    argument and its device otherwise.

    The rule: the device most arguments are on is "the rest" (a tie goes to the device of
    the earliest argument in the list, i.e. in the op's signature); the arguments on any
    other device are named first, as the ones that differ: ``"x_src is on meta, x_dst and
    att on cpu"``. Values that are not tensors (``None``, or a wrong type that
    :func:`check_tensor` reports) are skipped. The graph is not one of them: the ops take it
    on any device.
    """
    first = None
    for _, t in named:  # fast path: no dict unless the devices differ
        if isinstance(t, Tensor):
            if first is None:
                first = t.device
            elif t.device != first:
                break
    else:
        return
    by_device = {}
    for name, t in named:
        if isinstance(t, Tensor):
            by_device.setdefault(t.device, []).append(name)
    rest = max(by_device, key=lambda d: len(by_device[d]))  # first of the largest groups
    parts = [f"{_join(names)} {'is' if len(names) == 1 else 'are'} on {device}"
             for device, names in by_device.items() if device != rest]
    parts.append(f"{_join(by_device[rest])} on {rest}")
    raise ValueError(f"{', '.join(parts)}: the tensor arguments must all be on one device "
                     "(the graph may be on any)")


def _join(names) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def check_tensor(name: str, t, shape: Sequence[Optional[int]], like: Optional[Tensor] = None) -> Tensor:
    """Check ``t`` is a floating tensor of ``shape`` (None = any size) with ``like``'s dtype.

    Devices: the ops compare all their tensor arguments at once with :func:`check_devices`
    before calling this (see the module docstring), so the message names the argument that
    differs from the rest; the comparison with ``like``'s device here is only a backstop for
    callers that do not.
    """
    if not isinstance(t, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not t.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")
    sizes = t.shape
    if len(sizes) != len(shape) or not _sizes_match(shape, sizes):
        want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
        raise ValueError(f"{name} must have shape {want}, got {list(t.shape)}")
    if like is not None:
        if t.device != like.device:
            raise ValueError(f"{name} is on {t.device} but the other inputs are on {like.device}")
        if t.dtype != like.dtype:
            raise ValueError(f"{name} has dtype {t.dtype} but the other inputs have {like.dtype}")
    return t


def _sizes_match(shape: Sequence[Optional[int]], sizes) -> bool:
    """Whether ``sizes`` has every size ``shape`` gives (None = any), dimension by dimension."""
    for want, size in zip(shape, sizes):
        if want is not None and want != size:
            return False
    return True


def graph_on(graph: Graph, x: Tensor) -> Graph:
    """The graph on ``x``'s device (a cached copy when they differ).

    A graph on the meta device holds no data and cannot be copied to a real one: ValueError
    naming ``graph``.
    """
    if graph.device == x.device:
        return graph
    if isinstance(graph, GraphTensors):
        raise ValueError(f"graph tensors are on {graph.device} but the features on {x.device}")
    if graph.device.type == "meta":
        raise ValueError(f"graph is on {graph.device}, a device without data; it cannot be copied to {x.device}, "
                         "where the features are: build the Graph on a real device")
    return graph.to(x.device)


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


def _finite(value: float) -> bool:
    """math.isfinite by comparisons: torch.compile traces these on a module's float (which
    dynamic=True makes symbolic), where math.isfinite would break the graph."""
    return value == value and value != math.inf and value != -math.inf


def check_real(name: str, value, *, allow_none: bool = False, finite: bool = True):
    """``value`` as a float: a real number (int, float, numpy scalar; not bool, not a tensor),
    finite unless ``finite=False``; ``None`` passes through when ``allow_none``. ValueError
    naming ``name`` and the value otherwise."""
    if type(value) is float:  # fast path for the usual argument
        if finite and not _finite(value):
            raise ValueError(f"{name} must be finite, got {value!r}")
        return value
    if value is None and allow_none:
        return None
    kind = "a real number" + (" or None" if allow_none else "")
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        hint = " (pass float(t) for a 0-d tensor)" if isinstance(value, Tensor) else ""
        raise ValueError(f"{name} must be {kind}, got {value!r} of type {type(value).__name__}{hint}")
    try:
        f = float(value)
    except OverflowError:
        f = math.inf if value > 0 else -math.inf
    if finite and not math.isfinite(f):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return f


def check_bool(name: str, value) -> bool:
    """``value`` must be ``True`` or ``False`` (not a truthy number or string)."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be a bool (True or False), got {value!r}")
    return value


def check_return_attention(value) -> None:
    if not (value is False or value is True or value == "dropped"):
        raise ValueError(f"return_attention must be False, True or 'dropped', got {value!r}")


def check_features(graph: Graph, x, edge_weight) -> None:
    """``x`` [N_src, F...] floating node features and an optional floating [M] ``edge_weight``
    on x's device, of any floating dtype (the weight's dtype may differ from x's: a float32
    parameter with 16-bit features under autocast). ``x`` is checked first."""
    if not hasattr(x, "dim") or x.dim() < 2:
        raise ValueError(f"x must be a tensor of shape [N_src, F...], got {getattr(x, 'shape', type(x).__name__)}")
    check_tensor("x", x, (graph.n_src,) + (None,) * (x.dim() - 1))
    if edge_weight is not None:
        check_devices(("x", x), ("edge_weight", edge_weight))
        check_tensor("edge_weight", edge_weight, (graph.num_edges,))


def row_width(t: Tensor) -> int:
    """Features per node row: the product of the trailing dimensions."""
    n = 1
    for d in t.shape[1:]:
        n *= d
    return n


def as_rows(t: Tensor, n: int) -> Tensor:
    """``t`` [n, *] as contiguous rows [n, row_width(t)] (``t`` itself when 2-D and contiguous)."""
    return (t if t.dim() == 2 else t.reshape(n, row_width(t))).contiguous()


def fresh_rows(n: int, like: Tensor, dtype: torch.dtype) -> Tuple[Tensor, Tensor]:
    """A fresh output [n, *like.shape[1:]] of ``dtype`` on ``like``'s device, and its rows view
    [n, row_width(like)] (the same tensor when 2-D): allocated in its final shape, so the op
    returns a fresh tensor, not a view."""
    out = torch.empty((n,) + tuple(like.shape[1:]), dtype=dtype, device=like.device)
    return out, (out if out.dim() == 2 else out.view(n, row_width(like)))

