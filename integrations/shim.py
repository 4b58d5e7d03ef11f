"""The machinery every layer shim shares: class patching, fallback checks, dispatch.

A :class:`Shim` names a framework class and a fused forward for it. Patching installs a
class-level ``__call__`` that runs the fused forward when it can and otherwise delegates
to ``torch.nn.Module.__call__``, looked up at call time. Replacing ``forward`` instead would
break ``torch.jit.script`` of PyG models, and capturing ``Module.__call__`` at patch time
broke fx ``to_hetero``.

A fused forward reads the module's own submodules and parameters (so ``state_dict``,
submodule hooks and PEFT wrappers keep working), raises :class:`Unsupported` for any
argument value it does not cover (before doing any work), and never stores state on the
module or the framework graph.

Reduced precision. A fused forward runs for float32, float16 and bfloat16 features (float64
on CUDA runs stock, reason ``"dtype"``), under ``torch.autocast`` and in modules converted
with ``.to(torch.bfloat16)`` / ``.half()``, and returns exactly stock's dtypes. The rule is
stock's own dtype flow, not a table: the shim calls the module's submodules (projections,
bias, residual, skip, gate, normalisation) as stock does, so autocast gives them stock's
dtypes; the op is fed the tensors stock would aggregate, in their dtypes, and its
``out_dtype`` is the dtype of stock's aggregation result, found by :func:`result_dtype`:
stock's message/softmax operations replayed on empty tensors under the ambient autocast
state (memoised per state), so CUDA and CPU autocast, with their different op lists, are
both followed. The ops compute in float32 whatever their input dtype, so the fused values
are at least as accurate as stock's (which rounds its 16-bit intermediates).
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Tuple, Union

import torch
from torch import Tensor
from torch.nn.modules import module as _module_mod
from torch.nn.parameter import is_lazy

from gnn_fastpath import config
from gnn_fastpath.ops import dispatch, library
from gnn_fastpath.ops._checks import check_real
from gnn_fastpath.ops.dispatch import Unsupported
from gnn_fastpath.stats import fallback_cell, record_compiled, record_fallback, record_fused

from . import small_graph


@dataclass
class Shim:
    """A fused forward for one framework class.

    Attributes:
        key: the name in :func:`gnn_fastpath.stats`, e.g. ``"pyg.TransformerConv"``.
        cls: the framework class to patch.
        forward: ``forward(module, backend, *args, **kwargs)``, same arguments and return
            value as the stock forward; ``backend`` is ``"cuda"`` or ``"reference"`` (the ops
            it calls decide again, through the same dispatch, once the graph is known).
        op: the op family it runs (``"gatv2_attention"``, ...), named in the stats; or
            ``op(module) -> str`` for a layer whose op depends on its configuration (e.g. a
            max aggregation on ``segment_reduce``, a mean on ``spmm``).
        features: ``features(*args, **kwargs) -> Tensor`` picking the input tensor whose
            device and dtype decide the backend.
        methods: the methods the fused forward stands in for; a subclass or an instance
            that overrides any of them (``forward``; for PyG also ``message``, ``propagate``,
            ...) runs stock, since the fused math would silently skip the override.
        edges: ``edges(*args, **kwargs) -> (int, graph input) or None``, the call's edge
            count read off its graph input without building anything, and that input (None:
            not known cheaply), for the small-graph rule (:mod:`.small_graph`).
    """

    key: str
    cls: type
    forward: Callable
    op: Union[str, Callable[[torch.nn.Module], str]]
    features: Callable[..., Tensor]
    methods: Tuple[str, ...] = ("forward",)
    edges: Optional[Callable[..., Optional[Tuple[int, Any]]]] = None

    def op_for(self, module: torch.nn.Module) -> str:
        """The op family ``module`` runs on."""
        return self.op(module) if callable(self.op) else self.op

    def patched_call(self) -> Callable:
        """The class-level ``__call__`` that :func:`gnn_fastpath.enable` installs on ``cls``
        (:func:`make_call`)."""
        return make_call(self)


_PYG_HOOK_DICTS = (
    "_propagate_forward_pre_hooks", "_propagate_forward_hooks",
    "_message_forward_pre_hooks", "_message_forward_hooks",
    "_aggregate_forward_pre_hooks", "_aggregate_forward_hooks",
    "_message_and_aggregate_forward_pre_hooks", "_message_and_aggregate_forward_hooks",
    "_edge_update_forward_pre_hooks", "_edge_update_forward_hooks",
)
_MODULE_HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
_GLOBAL_HOOK_DICTS = ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
                      "_global_backward_pre_hooks")


try:
    from torch.fx import _symbolic_trace
except ImportError:  # pragma: no cover - older torch
    _symbolic_trace = None
# Newer torch logs a warning from is_fx_tracing(); its successor reads the same flag
# (compiling is checked separately). Looked up once: this runs on every layer call.
_fx_check = (getattr(_symbolic_trace, "is_fx_symbolic_tracing", None)
             or getattr(_symbolic_trace, "is_fx_tracing", None)) if _symbolic_trace is not None else None


def _is_fx_tracing() -> bool:
    return bool(_fx_check is not None and _fx_check())


# Modules seen with every parameter materialised. Lazy parameters only ever materialise, so
# a module found complete once stays complete; walking every parameter per call would cost
# tens of microseconds of host time on each layer call.
_materialised: "weakref.WeakSet[torch.nn.Module]" = weakref.WeakSet()


def _has_lazy_parameters(module: torch.nn.Module) -> bool:
    if module in _materialised:
        return False
    if any(is_lazy(p) for p in module.parameters()):
        return True
    _materialised.add(module)
    return False


def _any_set(obj, names: Tuple[str, ...]) -> bool:
    """Whether any attribute ``names`` of ``obj`` is truthy (a plain loop: this runs several
    times on every layer call)."""
    for name in names:
        if getattr(obj, name, None):
            return True
    return False


def has_module_hooks(module: torch.nn.Module) -> bool:
    """Whether forward/backward hooks are registered on ``module`` itself."""
    return _any_set(module, _MODULE_HOOK_DICTS)


def _autocast_mix(dtype: torch.dtype, like: Tensor) -> bool:
    """Whether stock mixes ``dtype`` with ``like``'s dtype freely: under autocast for
    ``like``'s device, float32 and the autocast dtype meet everywhere (float32 parameters and
    edge data, 16-bit features from the previous layer) and autocast casts where it matters."""
    low = autocast_dtype(like.device.type)
    return low is not None and {dtype, like.dtype} <= {torch.float32, low}


def check_like(name: str, t, like: Tensor) -> Tensor:
    """``t`` is a tensor on ``like``'s device with ``like``'s dtype (or, under autocast, one
    of float32 and the autocast dtype, as ``like``); :class:`Unsupported` otherwise."""
    if not isinstance(t, Tensor):
        raise Unsupported("input", f"{name} is a {type(t).__name__}, not a tensor")
    if t.dtype != like.dtype and not _autocast_mix(t.dtype, like):
        raise Unsupported("dtype", f"{name} has dtype {t.dtype}, features {like.dtype}")
    if t.device != like.device:
        raise Unsupported("device", f"{name} is on {t.device}, features on {like.device}")
    return t


def finite_number(name: str, value) -> float:
    """``value`` as a float when it is a finite real number (the ops' own check); otherwise
    :class:`Unsupported` (reason ``name``), so stock runs with whatever the module holds."""
    try:
        return check_real(name, value)
    except ValueError as exc:
        raise Unsupported(name, str(exc)) from None


def autocast_dtype(device_type: str) -> Optional[torch.dtype]:
    """The lower-precision dtype of the ``torch.autocast`` active for ``device_type``, or None."""
    try:
        if not torch.is_autocast_enabled(device_type):
            return None
        return torch.get_autocast_dtype(device_type)
    except (TypeError, AttributeError):  # pragma: no cover - torch < 2.4: per-device functions
        if device_type == "cuda":
            return torch.get_autocast_gpu_dtype() if torch.is_autocast_enabled() else None
        if device_type == "cpu":
            return torch.get_autocast_cpu_dtype() if torch.is_autocast_cpu_enabled() else None
        return None


_result_dtypes: Dict[tuple, Tuple[torch.dtype, ...]] = {}


def result_dtype(fn: Callable[..., Any], device: torch.device, *dtypes: torch.dtype) -> Tuple[torch.dtype, ...]:
    """The dtypes of ``fn(*tensors)`` for empty tensors of ``dtypes`` on ``device``'s type,
    run under the ambient autocast state: how stock's own operations (``fn`` replays them,
    shapes aside) type their results here. ``fn`` returns a tensor or a tuple of tensors.

    Memoised per (fn, device type, dtypes, autocast state), so a layer call pays one dict
    lookup; the first evaluation runs a few zero-element operations (no kernel launches).
    """
    kind = device.type
    if dispatch.is_compiling():  # traced: evaluated on fake tensors (dead code); filling the memo would be guarded
        return _evaluate_dtypes(fn, device, dtypes)
    key = (fn, kind, dtypes, autocast_dtype(kind))
    found = _result_dtypes.get(key)
    if found is None:
        found = _result_dtypes[key] = _evaluate_dtypes(fn, device, dtypes)
    return found


def _evaluate_dtypes(fn: Callable[..., Any], device: torch.device, dtypes) -> Tuple[torch.dtype, ...]:
    tensors = [torch.empty((0, 1, 1), dtype=d, device=device) for d in dtypes]
    with torch.no_grad():
        out = fn(*tensors)
    return tuple(t.dtype for t in (out if isinstance(out, tuple) else (out,)))


def _linear(x: Tensor, weight: Tensor) -> Tensor:
    return torch.nn.functional.linear(x.reshape(0, 1), weight.reshape(0, 1))


def linear_dtype(x: Tensor, weight: Tensor) -> torch.dtype:
    """The dtype ``torch.nn.functional.linear(x, weight)`` returns here (the autocast dtype
    under autocast, else the common dtype): known before the submodule runs."""
    return result_dtype(_linear, x.device, x.dtype, weight.dtype)[0]


def out_dtype_of(name: str, compute: torch.dtype, stock: torch.dtype) -> torch.dtype:
    """``stock`` (stock's aggregation result dtype) when an op fed ``compute`` features can
    write it (the ops' contract: their input dtype or float32); else :class:`Unsupported`."""
    if stock not in (compute, torch.float32):
        raise Unsupported("dtype", f"{name}: stock aggregates {compute} features into {stock}")
    return stock


_class_overrides: Dict[Tuple[type, type], Optional[str]] = {}


def _class_override(shim: Shim, cls: type) -> Optional[str]:
    """Which of ``shim.methods`` the subclass ``cls`` of ``shim.cls`` redefines, if any."""
    if cls is shim.cls:
        return None
    below = cls.__mro__[: cls.__mro__.index(shim.cls)]
    for name in shim.methods:
        for k in below:
            own = k.__dict__.get(name)
            # PyG compiles each class's ``propagate`` from a template and stores it on the
            # class under the plain name "propagate"; a method written in a class body has
            # a qualified name (``MyConv.propagate``).
            if own is not None and not (name == "propagate" and getattr(own, "__qualname__", "") == "propagate"):
                return f"{k.__name__} overrides {name}"
    return None


_class_functions: Dict[type, frozenset] = {}


def _is_own_method(module: torch.nn.Module, attr) -> bool:
    """Whether ``attr`` is one of the module's class functions bound to it.

    PyG binds its own ``propagate`` variants on the instance (explain mode switches between
    them); those are not user overrides.
    """
    func = getattr(attr, "__func__", None)
    if func is None or getattr(attr, "__self__", None) is not module:
        return False
    cls = type(module)
    for refresh in (False, True):  # PyG may add class attributes after the first lookup
        ids = _class_functions.get(cls)
        if ids is None or refresh:
            ids = _class_functions[cls] = frozenset(id(v) for k in cls.__mro__ for v in vars(k).values())
        if id(func) in ids:
            return True
    return False


def _override(shim: Shim, module: torch.nn.Module) -> Optional[str]:
    """Why the module's own code must run (a method of ``shim.methods`` overridden), or None."""
    own = module.__dict__
    if not own.keys().isdisjoint(shim.methods):  # most instances hold none of them
        for name in shim.methods:
            attr = own.get(name)
            if attr is not None and not _is_own_method(module, attr):
                return f"the instance overrides {name}"  # e.g. accelerate wraps ``forward`` per instance
    key = (shim.cls, type(module))
    if key not in _class_overrides:
        _class_overrides[key] = _class_override(shim, type(module))
    return _class_overrides[key]


def _framework_blocker(shim: Shim, module: torch.nn.Module) -> Optional[Tuple[str, str]]:
    """(reason, detail) when the module's state rules the fused path out, else None."""
    if torch.jit.is_scripting() or torch.jit.is_tracing():
        return "torchscript", "scripting or tracing"
    if _is_fx_tracing():
        return "fx_tracing", "torch.fx symbolic tracing"
    if _any_set(module, _MODULE_HOOK_DICTS):
        return "hooks", "module hooks are registered"
    if _any_set(_module_mod, _GLOBAL_HOOK_DICTS):
        return "hooks", "global module hooks are registered"
    if _any_set(module, _PYG_HOOK_DICTS):
        return "hooks", "message-passing hooks are registered"
    if getattr(module, "_explain", None) or getattr(module, "explain", None) is True:
        return "explain", "explain mode"
    if getattr(module, "decomposed_layers", 1) > 1:
        return "decomposed_layers", f"decomposed_layers={module.decomposed_layers}"
    override = _override(shim, module)
    if override:
        return "subclass", override
    if _has_lazy_parameters(module):
        return "lazy", "uninitialised lazy parameters"
    return None


def _backend_or_blocker(shim: Shim, x: Tensor, module: torch.nn.Module
                        ) -> Tuple[Optional[str], Optional[Tuple[str, str]]]:
    """The backend the fused forward starts on, or (reason, detail) when it cannot run:
    the dispatch's decision for the features (no graph yet). float32, float16 and bfloat16
    run fused, with or without autocast (see the module docstring); other dtypes (float64)
    run stock with reason ``"dtype"``."""
    if not isinstance(x, Tensor):
        return None, ("input", f"unsupported input type {type(x).__name__}")
    decision = dispatch.decide(x.device, x.dtype)
    if decision.reason == "dtype":
        return None, (decision.reason, decision.detail)
    if dispatch.accepted(decision):
        return decision.backend, None
    if decision.reason == "cpu":
        return None, ("cpu", "CPU tensors run stock code (enable(cpu='reference') to force the shims)")
    return None, (decision.reason, f"{shim.op_for(module)}: {decision.detail}")


def _fused_on_cuda(x) -> bool:
    """Whether a fused path fed ``x`` would run on the CUDA kernels."""
    return isinstance(x, Tensor) and x.is_cuda and dispatch.decide(x.device, x.dtype).backend == dispatch.CUDA


def _small_graph(shim: Shim, module: torch.nn.Module, args: tuple, kwargs: Dict[str, Any]
                 ) -> Optional[Tuple[str, str]]:
    """The small-graph rule's blocker (:mod:`.small_graph`) for a call whose fused path would
    run on the GPU, else None. Asked before the other checks: a call it sends to stock runs
    stock whatever they would say, so the stock call pays only for this question; a layer
    without an entry, or a call above the layer's largest entry, pays a lookup or two. A plain
    ``conv(x, edge_index)`` call like the module's last one is answered, outside dynamo, by the
    patched ``__call__`` from the module's memo (:func:`_memo_stock_cell`) without calling
    :func:`run`."""
    if shim.edges is None:
        return None
    largest = small_graph.largest(shim.key)
    if largest is None:
        return None
    size = shim.edges(*args, **kwargs)
    if size is None:
        return None
    num_edges, graph_input = size
    try:
        x = shim.features(*args, **kwargs)
    except Unsupported:
        return None
    if not isinstance(x, Tensor) or x.dim() == 0 or num_edges * x.size(-1) >= largest or not _fused_on_cuda(x):
        return None
    op = shim.op_for(module)
    blocker = small_graph.blocker(shim.key, op, module, num_edges, x.size(-1), graph_input)
    if blocker is not None and not kwargs and len(args) == 2 and args[0] is x and args[1] is graph_input:
        _remember(module, x, graph_input, small_graph.thresholds(shim.key, op, module), shim.key)
    return blocker


# What the small-graph rule found for a module's last plain call ``conv(x, edge_index)`` that it
# sent to stock: id(module) -> (weak reference to the module, the features' dtype, device type
# and width, the static entry, the new-graph entry, the texts of the settings the rule reads,
# the tables, the stats counter of its stock calls). A sampled batch asks
# the rule once per layer call, and inside a host-bound training step the rule's checks and
# record_fallback showed in the step time (benchmarks/RESULTS.md): answered from here a call
# costs a few attribute reads. Not noticed: a module's own state changed since (``cached``, its
# aggregation), which moves its entry; a stale memo only ever sends a call to stock, which is
# always correct.
_memo: Dict[int, tuple] = {}
_MEMO_MAX = 4096
_SMALL_GRAPH_SLOT = config.setting_slot("GNN_FASTPATH_SMALL_GRAPH")
_DISABLE_CUDA_SLOT = config.setting_slot("GNN_FASTPATH_DISABLE_CUDA")
_FORCE_CONTEXTS = config.force_contexts()  # no memo answer while any force_reference() is open


def _remember(module: torch.nn.Module, x: Tensor, graph_input: Tensor, entries: Tuple[int, int], layer: str) -> None:
    if type(x) is not Tensor or type(graph_input) is not Tensor or graph_input.layout != torch.strided:
        return
    if len(_memo) >= _MEMO_MAX:
        _memo.clear()
    (small, small_key), (disable, disable_key) = _SMALL_GRAPH_SLOT, _DISABLE_CUDA_SLOT
    _memo[id(module)] = (weakref.ref(module), x.dtype, x.is_cuda, x.size(-1), entries[0], entries[1],
                         small.get(small_key), disable.get(disable_key),
                         small_graph.MIN_EDGE_FEATURES, small_graph.NEW_GRAPH_MIN_EDGE_FEATURES,
                         fallback_cell(layer, "small_graph"))


def _memo_stock_cell(module: torch.nn.Module, args: tuple, kwargs: Dict[str, Any]) -> Optional[list]:
    """The stats counter to count a stock call in, where the module's memo answers the call:
    one like the module's last one the rule sent to stock (same call form, features' dtype,
    device type and width, an ``edge_index`` tensor, unchanged settings and tables, no
    force_reference() open in any thread) below the static entry, or below the new-graph entry
    on a graph input the rule has counted no more than :data:`small_graph.STATIC_AFTER_CALLS`
    calls of (:func:`small_graph.calls_on`, counting this one). None: ask the rule. (A read or two per
    check: this is the whole cost of a sampled batch's layer call above stock's, so the patched
    ``__call__`` asks it outside dynamo before calling anything of ours, and it reads the
    settings without calling a function.)"""
    memo = _memo.get(id(module))
    if memo is None or kwargs or len(args) != 2:
        return None
    x, graph_input = args
    if type(x) is not Tensor or type(graph_input) is not Tensor:
        return None
    ref, dtype, is_cuda, width, least, new_least, small, disable, table, new_table, cell = memo
    # dim() and size(): no torch.Size made (each allocation a step's garbage collector counts)
    if (graph_input.dim() != 2 or x.dim() == 0 or x.size(-1) != width or x.dtype is not dtype
            or x.is_cuda is not is_cuda or graph_input.layout is not torch.strided):
        return None
    size = graph_input.size(1) * width
    if size >= least and size >= new_least:
        return None
    (small_env, small_key), (disable_env, disable_key) = _SMALL_GRAPH_SLOT, _DISABLE_CUDA_SLOT
    if (ref() is not module or small_env.get(small_key) is not small or disable_env.get(disable_key) is not disable
            or _FORCE_CONTEXTS[0] or small_graph.MIN_EDGE_FEATURES is not table
            or small_graph.NEW_GRAPH_MIN_EDGE_FEATURES is not new_table):
        return None
    if size >= least and small_graph.calls_on(graph_input) > small_graph.STATIC_AFTER_CALLS:
        return None
    return cell


def run(shim: Shim, module: torch.nn.Module, args: tuple, kwargs: Dict[str, Any]):
    """Run ``module`` fused when possible, else its stock ``__call__`` (counted, warned);
    outside dynamo (the patched ``__call__`` sends a call dynamo traces to :func:`_traced`).

    ``stats()`` records the backend the layer's ops actually ran on (:class:`dispatch.recording`);
    an op that cannot run fused once the graph is known (e.g. the int32 limit) raises
    :class:`Unsupported` too, and the layer falls back like any other case.
    """
    small = _small_graph(shim, module, args, kwargs)
    if small is not None:  # a choice for speed, not a limit: counted, not warned
        record_fallback(shim.key, *small, warn=False)
        return torch.nn.Module.__call__(module, *args, **kwargs)
    blocker = _framework_blocker(shim, module)
    backend = None
    if blocker is None:
        try:
            backend, blocker = _backend_or_blocker(shim, shim.features(*args, **kwargs), module)
        except Unsupported as exc:
            blocker = (exc.reason, exc.detail)
    if blocker is None:
        try:
            with dispatch.recording() as ran:
                out = shim.forward(module, backend, *args, **kwargs)
        except Unsupported as exc:
            blocker = (exc.reason, exc.detail)
        else:
            record_fused(shim.key, ran.backend or backend)
            return out
    record_fallback(shim.key, *blocker)
    return torch.nn.Module.__call__(module, *args, **kwargs)


def _compile_blocker(shim: Shim, module: torch.nn.Module, x) -> Optional[Tuple[str, str]]:
    """:func:`_framework_blocker` and :func:`_backend_or_blocker` as torch.compile can trace
    them: the same rules, read from state that dynamo guards on (module attributes, the
    features' device and dtype) rather than from per-process caches."""
    if not library.AVAILABLE:
        return "compile", f"torch {torch.__version__} has no torch.library.register_fake (torch >= 2.4 compiles the fused path)"
    if has_module_hooks(module) or any(getattr(_module_mod, name, None) for name in _GLOBAL_HOOK_DICTS):
        return "hooks", "module hooks are registered"
    if any(getattr(module, name, None) for name in _PYG_HOOK_DICTS):
        return "hooks", "message-passing hooks are registered"
    if getattr(module, "_explain", None) or getattr(module, "explain", None) is True:
        return "explain", "explain mode"
    if getattr(module, "decomposed_layers", 1) > 1:
        return "decomposed_layers", f"decomposed_layers={module.decomposed_layers}"
    override = _class_override(shim, type(module))
    if override:
        return "subclass", override
    if not isinstance(x, Tensor):
        return "input", f"unsupported input type {type(x).__name__}"
    if x.dtype not in dispatch.CUDA_DTYPES:
        return "dtype", f"{x.dtype} input (the fused path takes float32, float16 and bfloat16)"
    if x.device.type != "cuda" and config.cpu_mode() != "reference":
        return "cpu", "CPU tensors run stock code (enable(cpu='reference') to force the shims)"
    return None


def _traced_for_cuda(x: Tensor) -> bool:
    """Whether a traced fused forward fed ``x`` runs the CUDA kernels."""
    return x.device.type == "cuda"


def _compiled_small_graph(shim: Shim, module: torch.nn.Module, args: tuple, kwargs: Dict[str, Any], x: Tensor
                          ) -> Optional[Tuple[str, str]]:
    """The small-graph rule's compiled entry (:func:`small_graph.compiled_blocker`) for a call
    traced without CUDA graphs; None under CUDA graphs, where the fused path is traced."""
    if shim.edges is None or x.dim() == 0 or dispatch.compiling_with_cuda_graphs():
        return None
    size = shim.edges(*args, **kwargs)
    if size is None:
        return None
    return small_graph.compiled_blocker(shim.key, shim.op_for(module), module, size[0], x.size(-1))


#: What :func:`_traced` returns for a call that traces the stock forward.
_STOCK = object()


def _traced(shim: Shim, module: torch.nn.Module, args: tuple, kwargs: Dict[str, Any]):
    """The call under ``torch.compile``: the fused forward traced onto the custom operators
    (:mod:`gnn_fastpath.ops.library`), the graph built inside the traced region
    (:mod:`gnn_fastpath.graph.tensors`). What runs is decided while tracing and recorded in
    ``stats()`` then, once per trace (not per call: a compiled call runs no Python; a graph
    break in stock's forward makes dynamo trace the call again, and each trace counts) under
    ``"compiled"``; a fallback returns :data:`_STOCK` (its reason in ``stats()``) and the
    caller traces the stock forward. Without CUDA graphs, the small-graph rule's compiled entry
    may send the call to stock too (:func:`_compiled_small_graph`).

    DGL layers are the exception: DGL's graph objects do not trace (stock itself breaks the
    graph several times per layer, at DGL's C calls), so the layer runs its eager path at one
    graph break of its own (:func:`_run_at_graph_break`), fused where eager runs fused; counted
    ``"eager"`` per trace and fused / fallback per call as in eager mode."""
    if shim.key.startswith("dgl."):
        _record_at_trace(shim.key, "eager")
        return _run_at_graph_break(shim, module, args, kwargs)
    try:
        x = shim.features(*args, **kwargs)
    except Unsupported as exc:
        blocker = (exc.reason, exc.detail)
    else:
        blocker = _compile_blocker(shim, module, x)
    if blocker is None and _traced_for_cuda(x):
        blocker = _compiled_small_graph(shim, module, args, kwargs, x)
    if blocker is None:
        backend = dispatch.CUDA if x.device.type == "cuda" else dispatch.REFERENCE
        try:
            out = shim.forward(module, backend, *args, **kwargs)
        except Unsupported as exc:
            blocker = (exc.reason, exc.detail)
        else:
            _record_at_trace(shim.key, backend)
            return out
    _record_at_trace(shim.key, "fallback:" + blocker[0])
    return _STOCK


def _eager(shim: Shim, module: torch.nn.Module, args: tuple, kwargs: Dict[str, Any]):
    """:func:`run` outside dynamo: ``torch.compiler.disable`` makes its call a graph break and
    runs it as Python, where :func:`dispatch.is_compiling` is false (the eager path)."""
    return run(shim, module, args, kwargs)


_run_at_graph_break = torch.compiler.disable(_eager)


try:
    from torch._dynamo.comptime import comptime as _comptime
except ImportError:  # pragma: no cover - torch without dynamo's comptime
    _comptime = None


def _record_compiled_local(ctx) -> None:
    record_compiled(*ctx.get_local("traced").as_python_constant())


def _record_at_trace(layer: str, outcome: str) -> None:
    """Count a traced layer once, while dynamo traces and outside the traced program (a
    counter mutated in traced code would be guarded on its value: every call would
    recompile). dynamo's comptime runs the callback at trace time; it reads the pair from
    this frame's local ``traced``."""
    traced = (layer, outcome)  # noqa: F841 - read by _record_compiled_local through the frame
    if _comptime is not None:
        _comptime(_record_compiled_local)


# torch.compiler.is_compiling itself (not dispatch.is_compiling): called from a frame that dynamo
# runs in Python, a function of ours would be compiled as a frame, and answer True
_compiler_is_compiling = dispatch._compiler_is_compiling

try:
    from torch._C._dynamo.eval_frame import get_eval_frame_callback as _dynamo_callback
    from torch._dynamo.eval_frame import skip_code as _skip_code
except ImportError:  # pragma: no cover - torch without per-code frame strategies
    _dynamo_callback = _skip_code = None

#: (id(module), id(dynamo's frame callback)) -> (weak references to both, the text of
#: ``GNN_FASTPATH_SMALL_GRAPH``, the compiled table and the first argument's ``is_cuda`` it was
#: asked with, the answer of :func:`_stock_at_every_size`), for layer calls that dynamo enters
#: as frames of their own (:func:`make_call`); an entry whose module, callback, setting or table
#: is not the current one, or whose call's first argument is not a tensor on the same kind of
#: device as when it was asked, is asked again. Cleared when it reaches :data:`_TOP_LEVEL_MAX`.
_top_level_stock: Dict[Tuple[int, int], tuple] = {}
_TOP_LEVEL_MAX = 4096


def _stock_at_every_size(shim: Shim, module: torch.nn.Module, args: tuple, kwargs: Dict[str, Any], callback) -> bool:
    """Whether the small-graph rule's compiled entry sends ``module``'s calls to stock whatever
    their size (an entry of None) in the compiled function whose frame-evaluation callback is
    ``callback``: CUDA features (the call's first argument), a backend without CUDA graphs
    (:func:`dispatch.records_cuda_graphs`), no other reason to run stock (:func:`_compile_blocker`,
    an edge count it can read: those are asked and counted by :func:`_traced`). Counted in
    ``stats()`` as a trace that falls back would be. Run with dynamo off
    (:data:`_stock_at_every_size_no_dynamo`)."""
    if shim.edges is None or shim.key.startswith("dgl.") or not args or type(args[0]) is not Tensor:
        return False
    try:
        x = shim.features(*args, **kwargs)
    except Unsupported:
        return False
    if (x is not args[0] or not _traced_for_cuda(x) or dispatch.records_cuda_graphs(callback)
            or _compile_blocker(shim, module, x) is not None or shim.edges(*args, **kwargs) is None):
        return False
    if not small_graph.compiled_stock_at_every_size(shim.key, shim.op_for(module), module):
        return False
    record_compiled(shim.key, "fallback:compiled_stock_faster")
    return True


_stock_at_every_size_no_dynamo = torch.compiler.disable(_stock_at_every_size)


def _compiled_call(shim: Shim, module: torch.nn.Module, args: tuple, kwargs: Dict[str, Any]):
    """A layer call under torch.compile, traced into the model's frame or compiled as a frame of
    its own: :func:`_traced`, then stock's forward where that returns :data:`_STOCK`. The stock
    forward is called from this frame, not from run's: where stock breaks the graph (e.g.
    GCNConv's self-loop removal), each frame between the model and the break becomes a frame of
    its own that every step enters through dynamo. (In Python, a frame dynamo gave up on: run.)"""
    if dispatch.is_compiling():
        out = _traced(shim, module, args, kwargs)
        return torch.nn.Module.__call__(module, *args, **kwargs) if out is _STOCK else out
    return run(shim, module, args, kwargs)


def make_call(shim: Shim):
    """The class-level ``__call__`` installed on ``shim.cls``.

    Under torch.compile it is traced into the model's frame like any function (then
    :func:`_compiled_call`), but dynamo never compiles it as a frame of its own (``skip_code``).
    Where stock's forward breaks the graph inside a model's layer loop, dynamo runs the model's
    frame in Python and enters each layer call at the top; then a layer that the compiled rule
    sends to stock at every size (:func:`_stock_at_every_size`, asked once per module and
    compiled function) calls stock's ``Module.__call__`` straight away, as stock's model does,
    without a frame of ours whose guards, graph break and resume would cost host time on every
    such call; any other layer call compiles :func:`_compiled_call` as its frame.
    Before that choice this frame calls only builtins and torch's own functions
    (``torch.compiler.is_compiling``, the ``torch.compiler.disable`` wrapper), which dynamo
    skips: it compiles every other Python function called from a frame it runs in Python as a
    frame of its own.
    Outside dynamo, a call the module's memo answers (:func:`_memo_stock_cell`) runs stock's
    ``Module.__call__`` from here; any other call runs :func:`run`."""

    def __call__(self, *args, **kwargs):
        if _compiler_is_compiling is not None and _compiler_is_compiling():  # tracing: inlined here
            return _compiled_call(shim, self, args, kwargs)
        callback = _dynamo_callback() if _dynamo_callback is not None else None
        if callback:
            key = (id(self), id(callback))
            entry = _top_level_stock.get(key)
            env, env_key = _SMALL_GRAPH_SLOT
            text = env.get(env_key)
            first = args[0] if args else None
            cuda = first.is_cuda if type(first) is Tensor else None
            if (entry is None or entry[0] is None or entry[0]() is not self or entry[1] is None
                    or entry[1]() is not callback or entry[2] is not text
                    or entry[3] is not small_graph.COMPILED_MIN_EDGE_FEATURES or entry[4] is not cuda):
                stock = _stock_at_every_size_no_dynamo(shim, self, args, kwargs, callback)
                if len(_top_level_stock) >= _TOP_LEVEL_MAX:
                    _top_level_stock.clear()
                try:  # weakref.ref, not a helper: a function of ours would be compiled as a frame here
                    refs = weakref.ref(self), weakref.ref(callback)
                except TypeError:  # a callback that takes no weak reference: asked every call
                    refs = None, None
                _top_level_stock[key] = refs + (text, small_graph.COMPILED_MIN_EDGE_FEATURES, cuda, stock)
            else:
                stock = entry[5]
            if stock:
                return torch.nn.Module.__call__(self, *args, **kwargs)
            return _compiled_call(shim, self, args, kwargs)
        cell = _memo_stock_cell(self, args, kwargs)
        if cell is not None:  # the small-graph rule's answer, from the module's memo
            cell[0] += 1
            return torch.nn.Module.__call__(self, *args)  # looked up now, as everywhere here
        return run(shim, self, args, kwargs)

    if _skip_code is not None:
        _skip_code(__call__.__code__)
    __call__.__gnn_fastpath_shim__ = shim
    return __call__
