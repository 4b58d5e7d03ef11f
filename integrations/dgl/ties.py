"""DGL's tie rule for ``fn.max``/``fn.min``, read off the DGL build that runs.

DGL gives the gradient of a maximum (minimum) that several edges reach with equal messages
whole to one of them, and which one depends on the kernel DGL picks, not on an API rule:
DGL 2.1's plain CSR loop (CUDA, and the CPU without libxsmm) keeps the *first* tied edge of
a destination in its edge order, its libxsmm CPU kernel (x86 with AVX-512, ``dgl.use_libxsmm``
on, messages without broadcasting, not float64) the *last*. So the same model gives another
gradient on another CPU. Rather than guess the build's choice, :func:`tie_break` asks DGL
once per process and (device, message kind, broadcast, libxsmm switch): it runs
``update_all`` on a tiny graph whose destinations each receive three equal messages, in an
edge order that tells "first" and "last" apart from any rule by source id, and looks where
the gradient went.
"""
from __future__ import annotations

from typing import Dict, Hashable, List, Optional, Sequence

import torch

from ..shim import Unsupported

#: Message kinds the shims reduce with max/min, as DGL's message functions name them.
MESSAGES = ("copy_u", "u_mul_e", "copy_e")

#: The probe graph: destinations 0..3, each receiving three edges from sources 4..15; the
#: edges of the four destinations interleave, and within each destination the first (last)
#: edge comes from neither always the smallest nor always the largest source id.
_PROBE_SOURCES = ((5, 4, 6), (8, 9, 7), (10, 12, 11), (15, 13, 14))
_PROBE_NODES = 16
_PROBE_WIDTH = 4

_rules: Dict[Hashable, Optional[str]] = {}


def probe_edges() -> torch.Tensor:
    """The probe's ``edge_index`` [2, 12] (row 0 sources, row 1 destinations), in edge order."""
    pairs = [(sources[k], d) for k in range(3) for d, sources in enumerate(_PROBE_SOURCES)]
    return torch.tensor(pairs, dtype=torch.int64).t().contiguous()


def classify(edge_index: torch.Tensor, winners: Sequence[int]) -> Optional[str]:
    """``"first"``/``"last"`` when, for every destination of ``edge_index``, the edge that took the
    gradient (``winners[d]``: its position in edge order) is that destination's first/last
    in-edge in edge order; None for any other pattern."""
    dst = edge_index[1].tolist()
    rows: Dict[int, List[int]] = {}
    for e, d in enumerate(dst):
        rows.setdefault(d, []).append(e)
    for rule, pick in (("first", 0), ("last", -1)):
        if all(winners[d] == edges[pick] for d, edges in rows.items()):
            return rule
    return None


def _winners(edge_index: torch.Tensor, edge_grad: torch.Tensor) -> List[int]:
    """Per destination, the one edge whose message got a gradient (-1 for none or several)."""
    out = []
    for d in range(len(_PROBE_SOURCES)):
        hit = ((edge_index[1] == d) & (edge_grad != 0)).nonzero().flatten().tolist()
        out.append(hit[0] if len(hit) == 1 else -1)
    return out


def _observe(device: torch.device, message: str, broadcast: bool, reduce: str) -> Optional[str]:
    import dgl
    import dgl.function as fn

    edge_index = probe_edges()
    src, dst = edge_index
    g = dgl.graph((src, dst), num_nodes=_PROBE_NODES).to(device)
    m, f = src.numel(), _PROBE_WIDTH
    # every message equal: 2.0 (a positive value, so max and min both tie at it)
    red = getattr(fn, reduce)
    with torch.inference_mode(False), torch.enable_grad(), torch.autocast(device.type, enabled=False):
        x = torch.full((_PROBE_NODES, f), 2.0, device=device, requires_grad=True)
        w = torch.ones((m,) if broadcast else (m, f), device=device, requires_grad=True)
        if message == "copy_u":
            g.srcdata["x"] = x
            g.update_all(fn.copy_u("x", "m"), red("m", "o"))
        elif message == "u_mul_e":
            g.srcdata["x"], g.edata["w"] = x, w
            g.update_all(fn.u_mul_e("x", "w", "m"), red("m", "o"))
        else:  # copy_e: the edge data itself (EdgeConv's message)
            g.edata["w"] = w
            g.update_all(fn.copy_e("w", "m"), red("m", "o"))
        g.dstdata["o"][: len(_PROBE_SOURCES)].sum().backward()
    if message == "copy_e" or message == "u_mul_e":
        grad = w.grad.reshape(m, -1).abs().sum(1)
    else:  # a source's gradient, per edge: only one edge per source in the probe
        grad = x.grad.abs().sum(1)[src.to(device)]
    return classify(edge_index, _winners(edge_index, grad.cpu()))


def _libxsmm_switch() -> Hashable:
    import dgl

    enabled = getattr(dgl, "is_libxsmm_enabled", None)
    return bool(enabled()) if callable(enabled) else None


def tie_break(device: torch.device, message: str, broadcast: bool = False, reduce: str = "max") -> str:
    """The ``segment_reduce`` ``tie_break`` (``"first"``/``"last"``) that reproduces stock DGL's
    ``fn.max``/``fn.min`` gradient for messages of kind ``message`` (:data:`MESSAGES`) on a
    graph on ``device``, with (``broadcast=True``) or without a broadcast edge weight.

    Measured once per process for each key (see the module docstring). A graph on a device
    where DGL cannot run (a CUDA device under a CPU-only DGL build: stock cannot run those
    features either) takes the CPU's rule, which is what stock gives on CPU copies.
    Raises :class:`Unsupported` (reason ``tie_rule``) when the build follows neither rule."""
    if message not in MESSAGES:
        raise ValueError(f"message must be one of {', '.join(map(repr, MESSAGES))}; got {message!r}")
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    key = (str(device), message, bool(broadcast), reduce, _libxsmm_switch())
    if key not in _rules:
        try:
            _rules[key] = _observe(device, message, broadcast, reduce)
        except Exception:  # noqa: BLE001 - DGL cannot run on this device: stock runs on the CPU
            if device.type == "cpu":
                raise
            _rules[key] = tie_break(torch.device("cpu"), message, broadcast, reduce)
    rule = _rules[key]
    if rule is None:
        raise Unsupported("tie_rule", f"DGL's {message} + fn.{reduce} on {device} gives tied gradients "
                                      "neither to the first nor to the last tied edge")
    return rule


def forget() -> None:
    """Drop the measured rules (tests; after switching ``dgl.use_libxsmm`` the key changes anyway)."""
    _rules.clear()
