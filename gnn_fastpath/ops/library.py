"""The kernel families as PyTorch custom operators (``torch.ops.gnn_fastpath.*``): opaque
kernels for the compiler, under the one autograd route of each family.

Each family has ONE autograd Function (``GATAttentionFunction`` in :mod:`.gat_attention`,
...), used eagerly and by ``torch.compile`` alike (FlashAttention's ``flash_attn_interface``
is the model): its forward and backward call the family's plain ``_forward``/``_backward``
(the glue and the launcher, written once). On an eager :class:`~gnn_fastpath.graph.Graph` they
call them directly; on a :class:`~gnn_fastpath.graph.tensors.GraphTensors` (what a compiled
layer builds) they call the operators defined here, whose implementations call the same
``_forward``/``_backward`` on :func:`~gnn_fastpath.graph.tensors.as_graph`, and dynamo traces
the Function itself. So:

- one forward and one backward operator per family (``gat_attention`` and
  ``gat_attention_backward``, ...), with a CUDA implementation (the launchers of
  :mod:`gnn_fastpath.cuda`), a CPU implementation (the reference ops: ``enable(cpu=
  "reference")`` compiles too; the backward recomputes the reference with autograd), and a
  fake implementation that gives shapes and dtypes without touching data; no autograd is
  registered on them (the Function is the autograd);
- the graph enters as tensors, never as a Python object: the Function saves the
  GraphTensors' tensors with ``save_for_backward`` (:func:`save`, :func:`saved`); inside an
  operator, the launchers see a static Graph whose launch geometry depends on shapes alone,
  so a CUDA graph recorded by ``mode="reduce-overhead"`` replays correctly on new graphs of
  the same size;
- attention dropout takes its Philox ``(seed, offset)`` from an int64 [2] tensor ``rng``
  drawn on the features' device by the caller's traced code (torch's generator, which CUDA
  graphs advance on every replay), and the backward reads the same tensor (saved).

:data:`AVAILABLE` is False on torch without :func:`torch.library.register_fake` (< 2.4):
the layers then run stock code under compilation, as before.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from ..graph.tensors import N_CSR, N_OPERANDS, GraphTensors, as_graph
from ..reference._precision import product_dtype
from ._attention import incoming

NAMESPACE = "gnn_fastpath"
AVAILABLE = all(hasattr(torch.library, name) for name in ("register_fake", "register_autograd", "impl"))
#: The graph arguments every operator starts with (:class:`GraphTensors`' fields).
GRAPH_SCHEMA = ("Tensor indptr, Tensor indices, Tensor perm, Tensor? src_indptr, Tensor? src_indices, "
                "Tensor? src_perm, Tensor? src_csr_pos, SymInt n_src, Tensor[] geometry, str[] geometry_names")
N_GRAPH = N_OPERANDS
#: return_attention as the operators take it (an int: the schema has no str-or-bool type).
ATTENTION_CODES = {False: 0, True: 1, "dropped": 2}
_ATTENTION_VALUES = {v: k for k, v in ATTENTION_CODES.items()}

_lib = torch.library.Library(NAMESPACE, "FRAGMENT") if AVAILABLE else None


def _qualname(name: str) -> str:
    return f"{NAMESPACE}::{name}"


#: operator name -> the family whose registered implementation (:func:`implement`) it runs
OPERATORS: Dict[str, str] = {}


def _define(name: str, schema: str, impl: Callable, fake: Callable, family: str) -> None:
    """Define ``gnn_fastpath::name(GRAPH, schema)`` with one implementation for CPU and CUDA
    (the implementation looks at the device) and its fake; ``impl`` runs ``family``'s
    registered implementation."""
    OPERATORS[name] = family
    _lib.define(f"{name}({GRAPH_SCHEMA}, {schema}")
    torch.library.impl(_qualname(name), ("CPU", "CUDA"), impl, lib=_lib)
    torch.library.register_fake(_qualname(name), fake, lib=_lib)


def _graph(args: Sequence) -> Tuple[GraphTensors, tuple]:
    csr, (n_src, geometry, names) = args[:N_CSR], args[N_CSR:N_GRAPH]
    return GraphTensors(*csr, n_src, tuple(geometry), tuple(names)), tuple(args[N_GRAPH:])


def _stream(rng: Optional[Tensor]) -> Tuple[object, Optional[int]]:
    """The launchers' (seed, offset) arguments for ``rng``: ``(rng, None)`` (the kernels read
    the key from the device tensor, so a CUDA graph replay uses the key drawn in that replay)
    or ``(0, 0)`` without dropout."""
    return (rng, None) if rng is not None else (0, 0)


def _empty(like: Tensor) -> Tensor:
    """The placeholder of an absent output (operators return tensors, never None)."""
    return like.new_empty(0)


def _grads_or_empty(grads: Sequence[Optional[Tensor]], like: Tensor) -> Tuple[Tensor, ...]:
    return tuple(_empty(like) if g is None else g for g in grads)


def op(name: str):
    """The operator ``gnn_fastpath::name``."""
    return getattr(getattr(torch.ops, NAMESPACE), name).default


def save(ctx, graph, *tensors: Optional[Tensor]) -> None:
    """Keep ``graph`` and ``tensors`` for a Function's backward: a GraphTensors' tensors go
    through ``save_for_backward`` with the others (nothing but tensors crosses a compiled
    graph: ``n_src``, a SymInt under dynamic shapes, travels as the size of an empty
    [n_src, 0] tensor, since dynamo does not carry a forward's SymInt on ctx into the
    backward; its work lists' names stay on ``ctx``), an eager Graph stays on ``ctx``."""
    ctx.on_operators = isinstance(graph, GraphTensors)
    if ctx.on_operators:
        n_src = graph.indptr.new_empty((graph.n_src, 0))
        ctx.geometry_names = graph.geometry_names
        ctx.save_for_backward(*graph.operands[:N_CSR], n_src, *graph.geometry, *tensors)
    else:
        ctx.graph = graph
        ctx.save_for_backward(*tensors)


def saved(ctx) -> Tuple[object, tuple]:
    """(the graph, the tensors) :func:`save` kept."""
    tensors = ctx.saved_tensors
    if ctx.on_operators:
        k, g = N_CSR, len(ctx.geometry_names)
        return (GraphTensors(*tensors[:k], tensors[k].shape[0], tuple(tensors[k + 1:k + 1 + g]), ctx.geometry_names),
                tuple(tensors[k + 1 + g:]))
    return ctx.graph, tuple(tensors)


def rng_of(seed) -> Optional[Tensor]:
    """The operators' ``rng`` argument from a Function's ``seed``: the int64 [2] tensor, or
    None (no dropout)."""
    return seed if isinstance(seed, Tensor) else None


def present(grads: Sequence[Tensor], needs: Sequence[bool]) -> Tuple[Optional[Tensor], ...]:
    """A backward operator's gradients with the placeholders of unneeded ones as None."""
    return tuple(g if n else None for g, n in zip(grads, needs))


def reference_grads(run: Callable[..., Tuple[Tensor, ...]], inputs: Sequence[Optional[Tensor]],
                     needs: Sequence[bool], grads: Sequence[Optional[Tensor]]) -> List[Optional[Tensor]]:
    """The gradients of ``run(*inputs)`` (a tuple of outputs) for the inputs ``needs`` marks,
    by recomputing the reference with autograd (the CPU backward operators)."""
    leaves = [None if t is None else t.detach().requires_grad_(bool(n) and t.is_floating_point())
              for t, n in zip(inputs, needs)]
    wanted = [t for t, n in zip(leaves, needs) if n and t is not None]
    with torch.enable_grad(), _autograd_dispatch():
        outs = run(*leaves)
        pairs = [(o, g) for o, g in zip(outs, grads) if g is not None and o is not None and o.requires_grad]
        found = torch.autograd.grad([o for o, _ in pairs], wanted, [g for _, g in pairs], allow_unused=True) \
            if pairs and wanted else [None] * len(wanted)
    found = iter(found)
    result = []
    for t, n in zip(leaves, needs):
        g = next(found) if (n and t is not None) else None
        result.append(None if not n or t is None else (torch.zeros_like(t) if g is None else g))
    return result


def _autograd_dispatch():
    """Autograd recording inside an operator's implementation: a caller such as compiled
    autograd runs the backward operators with the autograd dispatch keys excluded, under
    which the reference recomputation would record nothing (and give zero gradients)."""
    keys = torch._C._dispatch_tls_local_exclude_set()
    for key in ("AutogradCPU", "AutogradCUDA", "ADInplaceOrView", "AutogradFunctionality"):
        dk = getattr(torch._C.DispatchKey, key, None)
        if dk is not None:
            keys = keys.remove(dk)
    return torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), keys)


class fixed_rng:
    """The CPU reference's dropout mask drawn from torch's CPU generator seeded by ``rng`` (the
    operators' int64 [2] tensor), so the backward recomputation draws the forward's mask; a
    no-op for anything but a tensor (no dropout: the seed scalars ``0``)."""

    def __init__(self, rng):
        self.rng = rng if isinstance(rng, Tensor) else None

    def __enter__(self):
        if self.rng is not None:
            self._fork = torch.random.fork_rng(devices=[])
            self._fork.__enter__()
            torch.manual_seed(int(self.rng[0]) & (2**63 - 1))

    def __exit__(self, *exc):
        if self.rng is not None:
            self._fork.__exit__(*exc)


#: family -> (its ``_forward``, its ``_backward``), which each ``ops/<family>.py`` registers with
#: :func:`implement` when it is imported: the operators call the family's one implementation,
#: and this module imports no family module (the families import it).
_IMPLS: dict = {}


def implement(name: str, forward: Callable, backward: Callable) -> None:
    """Register family ``name``'s forward and backward implementations for its operators."""
    _IMPLS[name] = (forward, backward)


# ------------------------------------------------------------------- the attention families
# gat_attention, gatv2_attention and dot_attention share one operator layout: the family's
# input tensors, then (first scalar, dropout, rng, return_attention code, out_dtype) forward
# and (out, lse, grad_out, alpha, grad_alpha, first scalar, dropout, rng, code, needs) backward.
def _attention_operators(family: str, n_inputs: int, values: int):
    """(forward, forward fake, backward, backward fake) of an attention family whose forward
    takes ``n_inputs`` tensors; ``values`` indexes the [N, H, D] input that gives H and D."""

    def forward(*args):
        gt, rest = _graph(args)
        tensors, (first, p, rng, code, out_dtype) = rest[:n_inputs], rest[n_inputs:]
        out, lse, alpha = _IMPLS[family][0](as_graph(gt), *tensors, first, p, *_stream(rng), _ATTENTION_VALUES[code],
                                            out_dtype, use_reference=not tensors[0].is_cuda)
        return out, lse, alpha if alpha is not None else _empty(out)

    def forward_fake(*args):
        gt, rest = _graph(args)
        like, code, out_dtype = rest[values], rest[-2], rest[-1]
        H, D = like.shape[1], like.shape[2]
        out = like.new_empty((gt.n_dst, H, D), dtype=out_dtype)
        alpha = like.new_empty((gt.num_edges, H), dtype=out_dtype) if code else like.new_empty(0, dtype=out_dtype)
        return out, like.new_empty((gt.n_dst, H), dtype=torch.float32), alpha

    def backward(*args):
        gt, rest = _graph(args)
        tensors, (first, p, rng, code, needs) = rest[:n_inputs + 5], rest[n_inputs + 5:]
        grads = _IMPLS[family][1](as_graph(gt), *tensors, first, p, *_stream(rng), _ATTENTION_VALUES[code],
                                  tuple(needs), use_reference=not tensors[0].is_cuda)
        return _grads_or_empty(grads, tensors[0])

    def backward_fake(*args):
        gt, rest = _graph(args)
        inputs, needs = rest[:n_inputs], rest[-1]
        return tuple(torch.empty_like(t) if (n and t is not None) else _empty(rest[0]) for t, n in zip(inputs, needs))

    return forward, forward_fake, backward, backward_fake


# ---------------------------------------------------------------------------------------- spmm
def _spmm_forward(*args):
    _forward = _IMPLS["spmm"][0]

    gt, (x, edge_weight, norm, out_dtype) = _graph(args)
    return _forward(as_graph(gt), x, edge_weight, norm, out_dtype, use_reference=not x.is_cuda)[0]


def _spmm_forward_fake(*args):
    gt, (x, edge_weight, norm, out_dtype) = _graph(args)
    return x.new_empty((gt.n_dst,) + tuple(x.shape[1:]), dtype=out_dtype)


def _spmm_backward(*args):
    _backward = _IMPLS["spmm"][1]

    gt, (x, edge_weight, norm, grad_out, x_dtype, need_x, need_w) = _graph(args)
    grads = _backward(as_graph(gt), x, edge_weight, norm, grad_out, x_dtype, need_x, need_w,
                      use_reference=not grad_out.is_cuda)
    return _grads_or_empty(grads, grad_out)


def _spmm_backward_fake(*args):
    gt, (x, edge_weight, norm, grad_out, x_dtype, need_x, need_w) = _graph(args)
    dx = grad_out.new_empty((gt.n_src,) + tuple(grad_out.shape[1:]), dtype=x_dtype) if need_x else _empty(grad_out)
    dw = torch.empty_like(edge_weight) if need_w and edge_weight is not None else _empty(grad_out)
    return dx, dw


# ------------------------------------------------------------------------------ segment_reduce
def _segment_forward(*args):
    _forward = _IMPLS["segment_reduce"][0]

    gt, (x, edge_weight, reduce, tie_break, non_finite, need_grad) = _graph(args)
    result, state = _forward(as_graph(gt), x, edge_weight, reduce, tie_break, non_finite, need_grad,
                             use_reference=not x.is_cuda)
    return result, state if state is not None else x.new_empty(0, dtype=torch.int32)


def _segment_forward_fake(*args):
    gt, (x, edge_weight, reduce, tie_break, non_finite, need_grad) = _graph(args)
    result = x.new_empty((gt.n_dst,) + tuple(x.shape[1:]), dtype=product_dtype(x, edge_weight))
    if need_grad and x.device.type != "cpu":
        from ..cuda.segment_reduce import state_size

        aux = x.new_empty((state_size(gt.n_dst, _width(x)),), dtype=torch.int32)
    else:
        aux = x.new_empty(0, dtype=torch.int32)
    return result, aux


def _width(t: Tensor):
    n = 1
    for d in t.shape[1:]:
        n = n * d
    return n


def _segment_backward(*args):
    _backward = _IMPLS["segment_reduce"][1]

    gt, (x, edge_weight, result, aux, grad_out, reduce, tie_break, non_finite, need_x, need_w) = _graph(args)
    grads = _backward(as_graph(gt), x, edge_weight, result, aux, grad_out, reduce, tie_break, non_finite, need_x,
                      need_w, use_reference=not x.is_cuda)
    return _grads_or_empty(grads, x)


def _segment_backward_fake(*args):
    gt, (x, edge_weight, result, aux, grad_out, reduce, tie_break, non_finite, need_x, need_w) = _graph(args)
    return (torch.empty_like(x) if need_x else _empty(x),
            torch.empty_like(edge_weight) if need_w and edge_weight is not None else _empty(x))


# --------------------------------------------------------------------------------- registration
_ATTENTION_TAIL = "float dropout, Tensor? rng, int return_attention"
#: (family, its input tensors in the schema, how many, which one gives H and D)
_ATTENTION_FAMILIES = (
    ("gat_attention",
     "Tensor x_src, Tensor score_src, Tensor score_dst, Tensor? edge_score, Tensor? edge_weight", 5, 0),
    ("gatv2_attention", "Tensor x_src, Tensor x_dst, Tensor att, Tensor? edge_term", 4, 0),
    ("dot_attention", "Tensor q, Tensor k, Tensor v, Tensor? edge_term", 4, 1),
)


def _define_attention(family: str, inputs: str, n_inputs: int, values: int) -> None:
    """Define an attention family's forward and backward operators."""
    first = "float scale" if family == "dot_attention" else "float negative_slope"
    forward, forward_fake, backward, backward_fake = _attention_operators(family, n_inputs, values)
    _define(family, f"{inputs}, {first}, {_ATTENTION_TAIL}, ScalarType out_dtype) -> (Tensor, Tensor, Tensor)",
            forward, forward_fake, family)
    _define(f"{family}_backward",
            f"{inputs}, Tensor out, Tensor lse, Tensor grad_out, Tensor? alpha, Tensor? grad_alpha, {first}, "
            f"{_ATTENTION_TAIL}, bool[] needs) -> ({', '.join(['Tensor'] * n_inputs)})", backward, backward_fake,
            family)


if AVAILABLE:
    for family, inputs, n_inputs, values in _ATTENTION_FAMILIES:
        _define_attention(family, inputs, n_inputs, values)

    _define("spmm", "Tensor x, Tensor? edge_weight, str norm, ScalarType out_dtype) -> Tensor",
            _spmm_forward, _spmm_forward_fake, "spmm")
    _define("spmm_backward",
            "Tensor? x, Tensor? edge_weight, str norm, Tensor grad_out, ScalarType x_dtype, bool need_x, bool need_w) "
            "-> (Tensor, Tensor)",
            _spmm_backward, _spmm_backward_fake, "spmm")

    _define("segment_reduce",
            "Tensor x, Tensor? edge_weight, str reduce, str tie_break, str non_finite, bool need_grad) "
            "-> (Tensor, Tensor)",
            _segment_forward, _segment_forward_fake, "segment_reduce")
    _define("segment_reduce_backward",
            "Tensor x, Tensor? edge_weight, Tensor result, Tensor aux, Tensor grad_out, str reduce, str tie_break, "
            "str non_finite, bool need_x, bool need_w) -> (Tensor, Tensor)",
            _segment_backward, _segment_backward_fake, "segment_reduce")


# ------------------------------------------------------------------------ what the ops call
def attention_forward(family: str, eager: Callable, graph, tensors: Sequence[Optional[Tensor]], first: float,
                      dropout: float, seed, offset, return_attention, out_dtype):
    """An attention Function's forward route: (out, lse, alpha or None). On a GraphTensors
    graph (the compiled path) the family's operator, else its ``eager`` ``_forward`` on the
    Graph; ``first`` is the family's scalar (negative slope or scale)."""
    if isinstance(graph, GraphTensors):
        out, lse, alpha = op(family)(*graph.operands, *tensors, first, dropout, rng_of(seed),
                                     ATTENTION_CODES[return_attention], out_dtype)
        return out, lse, alpha if return_attention else None
    return eager(graph, *tensors, first, dropout, seed, offset, return_attention, out_dtype)


#: an attention Function's arguments after its input tensors: graph, the family's scalar,
#: return_attention, dropout, seed, offset, out_dtype (no gradients)
_ATTENTION_OPTIONS = 7


def attention_backward(ctx, family: str, eager: Callable, n_inputs: int, first: float,
                       grad_out: Optional[Tensor], grad_alpha: Optional[Tensor]) -> tuple:
    """An attention Function's whole backward: the gradients of its ``n_inputs`` input tensors
    (None where not needed) and None for its options. Through the family's backward operator
    when the forward ran on operators, else its ``eager`` ``_backward``; ``first`` is the
    family's scalar (negative slope or scale). Reads what :func:`save` kept: the inputs, out,
    lse, alpha and the rng tensor."""
    graph, saved_tensors = saved(ctx)
    inputs, (out, lse, alpha, rng) = saved_tensors[:n_inputs], saved_tensors[n_inputs:]
    needs = tuple(ctx.needs_input_grad[:n_inputs])
    options = (None,) * _ATTENTION_OPTIONS
    if (grad_out is None and grad_alpha is None) or not any(needs):
        return (None,) * n_inputs + options
    grad_out, grad_alpha = incoming(out, grad_out, grad_alpha)
    tensors = (*inputs, out, lse, grad_out, alpha, grad_alpha)
    if ctx.on_operators:
        grads = present(op(f"{family}_backward")(*graph.operands, *tensors, first, ctx.dropout, rng,
                                                 ATTENTION_CODES[ctx.return_attention], list(needs)), needs)
    else:
        grads = eager(graph, *tensors, first, ctx.dropout, ctx.seed if rng is None else rng, ctx.offset,
                      ctx.return_attention, needs)
    return tuple(grads) + options


def draw_rng(dropout: float, like: Tensor) -> Optional[Tensor]:
    """The Philox (seed, offset) of one dropout call, drawn on ``like``'s device by torch's
    generator (traced: a CUDA graph draws anew on every replay)."""
    if dropout <= 0.0:
        return None
    return torch.randint(0, 2**62, (2,), dtype=torch.int64, device=like.device)


def unpad_result(graph: GraphTensors, result):
    """An attention Function's result (``out`` or ``(out, alpha)``) without the extra row."""
    if isinstance(result, tuple):
        return (graph.unpad(result[0]),) + tuple(result[1:])
    return graph.unpad(result)
