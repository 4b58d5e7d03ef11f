"""DGL ``GraphConv`` on :func:`gnn_fastpath.spmm`.

Reproduces ``dgl.nn.pytorch.conv.GraphConv.forward`` (DGL 2.1.0): the zero-in-degree check
(memoised per Graph, same DGLError), ``edge_weight`` multiplying each message, the
normalisation by structural degrees clamped to >= 1 (``edge_weight`` does not enter it),
the module's ``weight`` or an external ``weight=`` (same DGLError when both exist),
multiplying by W before aggregating when ``in_feats > out_feats`` and after otherwise,
then ``bias`` and ``activation``. Blocks take the first ``num_dst_nodes`` rows as
destination features, a pair ``(feat_src, feat_dst)`` is taken as given.

The source and destination degree scales are applied inside the op (one pass), so where
stock scales before or after the matmul with W the fused path may scale on the other side
of it: the same product, rounded in another order (differences around 1e-7 relative).

Reduced precision, derived from DGL 2.1's code (stock DGL's PyPI build cannot run CUDA
features). Under CUDA autocast (A the autocast dtype): the source scale of ``"left"``/
``"both"`` is float32 (``pow`` autocasts to float32, ``1.0 / degs`` keeps the dtype of the
features, float32 from the user); ``matmul`` with W gives A; ``update_all`` (gspmm) casts
features and ``edge_weight`` to A and aggregates into A; the destination scale of
``"right"``/``"both"`` is computed the same way from ``feat_dst`` (float32 for float32
features; ``"right"`` on 16-bit features, e.g. a previous layer's output, gives A), so
``rst * norm`` is float32 for float32 features; the float32 ``bias`` keeps float32. In a half
module everything is the module's dtype. Under CPU autocast the layer runs stock
(:func:`.graph.check_precision`).

The fused path returns stock's dtypes and rounds less. The op gets the edge weight (and,
without W, the features) cast as DGL casts them (:func:`.graph.sparse_cast`). Where stock's
``matmul`` with W gives 16 bits (a half module, autocast), its operands are cast to that
dtype as stock's are, but the product, the aggregation, the degree scales and the ``bias``
all stay float32 (:class:`_Float32Matmul`, the op's float32 result), and the result is
rounded once to stock's dtype after the ``bias`` (above), before the ``activation``, which
sees stock's dtype. Stock rounds the
projected features before aggregating them (W first) or the aggregate before the product
(W after), then the result before the ``bias``; where the next sum cancels (neighbours with
opposite features, as on heterophilous graphs) those roundings of its larger terms dominate
its error. The gradients of the features, W and the edge weights likewise come from float32
products and sums, rounded once to their dtypes.
"""
from __future__ import annotations

from typing import Optional

import torch

from gnn_fastpath import ops
from gnn_fastpath.ops.dispatch import require
from ..shim import Unsupported, check_like, out_dtype_of, result_dtype
from .graph import check_call, check_zero_in_degree, dgl_error, graph_of, sparse_cast

_NORMS = ("none", "both", "right", "left")
_EXTERNAL_WEIGHT_MESSAGE = (
    "External weight is provided while at the same time the"
    " module has defined its own weight parameter. Please"
    " create the module with flag weight=False."
)


def _check_inputs(module, g, feat, weight, edge_weight, n_src: int, n_dst: int, is_block: bool):
    """(feat_src, W or None) after the checks stock would fail later (those run stock)."""
    norm = module._norm
    if norm not in _NORMS:
        raise Unsupported("norm", f"norm={norm!r}")
    if isinstance(feat, tuple):
        if len(feat) != 2:
            raise Unsupported("input", f"feat is a tuple of {len(feat)} (expected (feat_src, feat_dst))")
        feat_src, feat_dst = feat
        if norm in ("right", "both"):  # stock reads feat_dst's dtype and device for the scale
            check_like("feat[1]", feat_dst, feat_src)
    else:
        feat_src = feat  # stock's destination rows (feat[:num_dst] of a block) only set the scale's dtype
    if feat_src.dim() < 2 or feat_src.shape[0] != n_src:
        raise Unsupported("input", f"feat_src has shape {tuple(feat_src.shape)} for {n_src} source nodes")
    if edge_weight is not None:
        check_like("edge_weight", edge_weight, feat_src)
        if edge_weight.dim() != 1 or edge_weight.shape[0] != g.num_edges():
            raise Unsupported("edge_weight", f"edge_weight of shape {tuple(edge_weight.shape)} "
                                             f"(the fused path takes one scalar per edge, [{g.num_edges()}])")
    if weight is not None and module.weight is not None:
        return feat_src, None  # stock raises; checked after the zero-in-degree check, as stock
    w = module.weight if weight is None else weight
    if w is not None:
        check_like("weight", w, feat_src)
        if w.dim() != 2 or w.shape[0] != feat_src.shape[-1]:
            raise Unsupported("input", f"weight of shape {tuple(w.shape)} for features of width "
                                       f"{feat_src.shape[-1]}")
    return feat_src, w


def _both_scale(degs):
    return torch.pow(degs.clamp(min=1), -0.5)


def _right_scale(degs):
    return 1.0 / degs.clamp(min=1)


def _matmul(a, b):
    return torch.matmul(a, b)


def _low_precision(a: torch.Tensor, w: torch.Tensor) -> Optional[torch.dtype]:
    """The 16-bit dtype stock's ``torch.matmul(a, w)`` computes in here (a half module, or
    CUDA autocast), or None (float32: the product is not rounded to 16 bits)."""
    dtype = result_dtype(_matmul, a.device, a.dtype, w.dtype)[0]
    return dtype if dtype in (torch.float16, torch.bfloat16) else None


#: Elements per row block of the float32 copies a 16-bit operand is upcast to.
_BLOCK_ELEMENTS = 1 << 22


def _row_blocks(n_rows: int, width: int):
    step = max(1, _BLOCK_ELEMENTS // max(width, 1))
    return [(start, min(start + step, n_rows)) for start in range(0, n_rows, step)]


def _no_autocast(device: torch.device):
    return torch.autocast(device_type=device.type, enabled=False)


_MM_OUT_DTYPE = {}


def _has_mm_out_dtype(device: torch.device) -> bool:
    """Whether ``torch.mm(a, b, out_dtype=torch.float32)`` takes 16-bit operands on ``device``
    (CUDA in recent torch: the tensor cores' float32 accumulator, no rounding of the result);
    asked once per device type."""
    if device.type not in _MM_OUT_DTYPE:
        try:
            one = torch.ones(1, 1, dtype=torch.bfloat16, device=device)
            _MM_OUT_DTYPE[device.type] = torch.mm(one, one, out_dtype=torch.float32).dtype == torch.float32
        except (TypeError, RuntimeError, NotImplementedError):
            _MM_OUT_DTYPE[device.type] = False
    return _MM_OUT_DTYPE[device.type]


def _mm_float32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` with float32 sums and a float32 result. Two 16-bit operands of one dtype go to
    the 16-bit matrix units with a float32 output where torch offers it (as fast as stock's
    16-bit product); otherwise 16-bit rows are upcast a block at a time."""
    if a.dtype == b.dtype and a.dtype in (torch.float16, torch.bfloat16) and _has_mm_out_dtype(a.device):
        return torch.mm(a, b, out_dtype=torch.float32)
    b32 = b.float()
    if a.dtype == torch.float32:
        return torch.mm(a, b32)
    out = torch.empty(a.shape[0], b.shape[1], dtype=torch.float32, device=a.device)
    for start, end in _row_blocks(a.shape[0], a.shape[1]):
        out[start:end] = torch.mm(a[start:end].float(), b32)
    return out


class _Float32Matmul(torch.autograd.Function):
    """``a @ w`` for 2-d operands of any floating dtype, with float32 sums and a float32 result
    (torch's 16-bit matmul rounds its result to 16 bits): :func:`_mm_float32`, which keeps
    16-bit operands on the 16-bit matrix units where torch can return float32 (CUDA) and
    otherwise upcasts 16-bit rows a block at a time (``a`` is saved as given, so no float32
    copy of it outlives a block).

    Backward: where the matrix units serve, the float32 gradient is rounded once to the
    operands' 16-bit dtype first (stock's gradient arrives in 16 bits anyway) and each
    product is a float32-accumulated 16-bit product rounded once; elsewhere the products run
    in float32 and are rounded once to the operands' dtypes."""

    @staticmethod
    def forward(ctx, a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(a, w)
        with _no_autocast(a.device):
            return _mm_float32(a, w)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        a, w = ctx.saved_tensors
        grad_a = grad_w = None
        with _no_autocast(a.device):
            units = a.dtype == w.dtype and a.dtype in (torch.float16, torch.bfloat16) and _has_mm_out_dtype(a.device)
            grad = grad.to(a.dtype) if units else grad.float()
            if ctx.needs_input_grad[0]:
                if units:
                    grad_a = _mm_float32(grad, w.t()).to(a.dtype)
                else:
                    w32 = w.float()
                    grad_a = torch.empty(a.shape, dtype=a.dtype, device=a.device)
                    for start, end in _row_blocks(a.shape[0], a.shape[1]):
                        grad_a[start:end] = torch.mm(grad[start:end], w32.t())
            if ctx.needs_input_grad[1]:
                if units:
                    grad_w = _mm_float32(a.t(), grad).to(w.dtype)
                else:
                    acc = torch.zeros(w.shape, dtype=torch.float32, device=w.device)
                    for start, end in _row_blocks(a.shape[0], a.shape[1]):
                        acc.addmm_(a[start:end].t().float(), grad[start:end])
                    grad_w = acc.to(w.dtype)
        return grad_a, grad_w


def _project(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``torch.matmul(a, w)`` for ``a`` [N, *, K] and ``w`` [K, F] as :class:`_Float32Matmul`
    (a float32 result)."""
    out = _Float32Matmul.apply(a.reshape(-1, a.shape[-1]), w)
    return out.view(*a.shape[:-1], w.shape[1])


def _stock_dtype(norm: str, aggregated: torch.dtype, like: torch.Tensor) -> torch.dtype:
    """The dtype of stock's result before ``bias``: the aggregate (after W where W comes
    after) times the destination scale, computed in the dtype of ``feat_dst`` (``like``)."""
    if norm not in ("right", "both"):
        return aggregated
    scale = _both_scale if norm == "both" else _right_scale
    return torch.promote_types(aggregated, result_dtype(scale, like.device, like.dtype)[0])


def fused_forward(module, backend, graph, feat, weight=None, edge_weight=None):
    """``GraphConv.forward(graph, feat, weight=None, edge_weight=None)`` on the fused op."""
    g = graph
    n_src, n_dst, is_block, x = check_call(g, feat)
    feat_src, w = _check_inputs(module, g, feat, weight, edge_weight, n_src, n_dst, is_block)

    G = graph_of(g)
    check_zero_in_degree(module, G)
    require("spmm", x.device, x.dtype, G)  # before any matmul runs
    if weight is not None and module.weight is not None:
        raise dgl_error(_EXTERNAL_WEIGHT_MESSAGE)

    norm = module._norm
    dst_like = feat[1] if isinstance(feat, tuple) else x  # stock's degree scale takes feat_dst's dtype
    low = None  # the 16-bit dtype of stock's product with W, where the fused path keeps float32
    if w is None:
        feat_src, edge_weight = sparse_cast(feat_src, edge_weight)
        out_dtype = out_dtype_of("GraphConv", feat_src.dtype, _stock_dtype(norm, feat_src.dtype, dst_like))
        rst = ops.spmm(G, feat_src, edge_weight, norm, out_dtype=out_dtype)
    elif module._in_feats > module._out_feats:
        # multiply by W first to shrink the features that are aggregated (as stock)
        low = _low_precision(feat_src, w)
        if low is None:
            feat_src, edge_weight = sparse_cast(torch.matmul(feat_src, w), edge_weight)
            out_dtype = out_dtype_of("GraphConv", feat_src.dtype, _stock_dtype(norm, feat_src.dtype, dst_like))
            rst = ops.spmm(G, feat_src, edge_weight, norm, out_dtype=out_dtype)
        else:
            # stock rounds the projected features to 16 bits before aggregating them
            (edge_weight,) = sparse_cast(edge_weight)
            rst = ops.spmm(G, _project(feat_src.to(low), w.to(low)), edge_weight, norm, out_dtype=torch.float32)
    else:
        feat_src, edge_weight = sparse_cast(feat_src, edge_weight)
        low = _low_precision(feat_src, w)
        if low is None:
            rst = torch.matmul(ops.spmm(G, feat_src, edge_weight, norm), w)
        else:
            # stock rounds the aggregate, then the product, to 16 bits; here the product stays
            # float32 (and so does the aggregate where no 16-bit matrix units take it)
            agg_dtype = low if _has_mm_out_dtype(feat_src.device) else torch.float32
            rst = _project(ops.spmm(G, feat_src, edge_weight, norm, out_dtype=agg_dtype), w.to(low))
    if low is None:
        if module.bias is not None:
            rst = rst + module.bias
    else:
        # float32 so far: one rounding to stock's dtype, after the bias (stock rounds before it too)
        dtype = _stock_dtype(norm, low, dst_like)
        if module.bias is not None:
            dtype = torch.promote_types(dtype, module.bias.dtype)
            rst = rst + module.bias
        rst = rst.to(dtype)
    if module._activation is not None:
        rst = module._activation(rst)
    return rst
