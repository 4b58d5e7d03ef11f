"""The one place that decides, per op call, which backend runs it and why.

:func:`decide` is the policy: the fused CUDA kernels when they can serve the call, else the
reference op, with the reason. Every op asks it through :func:`choose` with what it knows
(device, dtype, the Graph, the kernels' own shape limit), and the patched layers ask it
before doing any work (without a graph), so both see the same rule. Reasons, in the order
they are checked:

========== =====================================================================
``dtype``      the input is not float32, float16 or bfloat16 (e.g. float64)
``forced``     :func:`gnn_fastpath.config.force_reference` is active
``cpu``        the input is not on a CUDA device
``no_kernel``  the CUDA kernels cannot run here (no CuPy, no GPU, disabled)
``int32``      the graph has 2**31 edges or nodes or more (int32 kernels)
``kernel_limit`` the op's kernels do not take this shape (e.g. a head width)
========== =====================================================================

Inside a patched layer's call (:class:`recording`), an op that would end on the reference
for any reason but ``forced`` (or ``cpu`` with ``enable(cpu="reference")``) raises
:class:`Unsupported`: the layer then runs its stock forward and ``stats()`` counts a
fallback with that reason. The layers ask again through :func:`require` as soon as they know
the graph (and the head shape), before any of their submodules run, so a fallback never runs
the projections, feature dropout or submodule hooks twice. Outside a layer, the op runs its
reference and, for CUDA inputs, warns once per (op, reason).
"""
from __future__ import annotations

import importlib
import threading
import warnings
from dataclasses import dataclass
from typing import Optional, Tuple

import torch

from .. import config, cuda

CUDA = "cuda"
REFERENCE = "reference"
#: dtypes the CUDA kernels take (features stored in these, arithmetic in float32).
CUDA_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
#: The ops that have CUDA kernels.
OPS = ("gat_attention", "gatv2_attention", "dot_attention", "spmm", "segment_reduce", "gcn_norm_values")


@dataclass(frozen=True)
class Decision:
    """The backend that runs a call and, when it is not the fused one, why."""

    backend: str
    reason: Optional[str] = None
    detail: str = ""


#: The decisions that depend on nothing but the rule (immutable: one instance serves all calls).
_FUSED = Decision(CUDA)
_FORCED = Decision(REFERENCE, "forced", "force_reference() is active")
_CPU = Decision(REFERENCE, "cpu", "CPU tensors (the fused kernels run on CUDA)")


class Unsupported(Exception):
    """The fused path does not cover this call: the patched layer runs its stock forward and
    ``stats()`` counts a fallback with ``reason``. Raised by a fused forward for inputs it does
    not cover (before doing any work; the integrations import it as
    ``gnn_fastpath.integrations.shim.Unsupported``) and by an op inside a patched layer's call
    when the fused kernels cannot serve it (:func:`require`, :func:`choose`).

    No ``super().__init__``: torch.compile traces a fused forward, and dynamo cannot trace
    BaseException's constructor (it would break the graph at every fallback); ``args`` and
    ``str()`` come from the two attributes instead."""

    def __init__(self, reason: str, detail: str = ""):
        self.reason = reason
        self.detail = detail

    @property
    def args(self):
        return (self.reason, self.detail)

    def __str__(self) -> str:
        return f"{self.reason}: {self.detail}" if self.detail else self.reason


def decide(device: torch.device, dtype: torch.dtype, graph=None, limit: Optional[str] = None) -> Decision:
    """The backend for an op call on ``device``/``dtype`` over ``graph`` (None: not known
    yet); ``limit`` is the op kernels' own reason to refuse the call's shape, if any."""
    if dtype not in CUDA_DTYPES:
        return Decision(REFERENCE, "dtype", f"{dtype} input (the fused path takes float32, float16 and bfloat16)")
    if config.reference_forced():
        return _FORCED
    if device.type != "cuda":
        return _CPU
    why = cuda.unavailable_reason()
    if why is not None:
        return Decision(REFERENCE, "no_kernel", why)
    if graph is not None and not graph.fits_int32():
        return Decision(REFERENCE, "int32", f"graph with {graph.num_edges} edges and {max(graph.n_src, graph.n_dst)} "
                                            "nodes: the kernels index with int32 (fewer than 2**31)")
    if limit is not None:
        return Decision(REFERENCE, "kernel_limit", limit)
    return _FUSED


def backend_for(op: str, x) -> str:
    """``"cuda"`` if op ``op`` would run its kernels for input ``x`` (graph size aside), else
    ``"reference"``."""
    if op not in OPS:
        raise ValueError(f"op must be one of {', '.join(OPS)}; got {op!r}")
    return decide(x.device, x.dtype).backend


def accepted(decision: Decision) -> bool:
    """Whether a patched layer runs its fused forward with this decision (vs its stock code)."""
    return (decision.backend == CUDA or decision.reason == "forced"
            or (decision.reason == "cpu" and config.cpu_mode() == "reference"))


# ----------------------------------------------------------------------------------------
# What the ops of one patched layer call ran on.

class _Recording(threading.local):
    """The recording open in this thread (``call``). The class attribute is the value of every
    thread that has not opened one: a missing thread-local attribute would make each read raise
    and catch an AttributeError, on every op call outside a patched layer."""

    call = None


_local = _Recording()


class recording:
    """Context manager a patched layer opens around its fused forward: collects the backend
    each op ran on (``backend``: ``"reference"`` if any op ran its reference, else
    ``"cuda"``; None when no op ran)."""

    __slots__ = ("backend", "_previous")

    def __enter__(self) -> "recording":
        self.backend = None
        self._previous = _local.call
        _local.call = self
        return self

    def __exit__(self, *exc) -> None:
        _local.call = self._previous


_warned: set = set()


# Looked up once: the test runs several times on every layer call.
_compiler_is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None)


def is_compiling() -> bool:
    """Whether torch.compile (dynamo) is tracing this call (the one test of it in the package)."""
    return bool(_compiler_is_compiling is not None and _compiler_is_compiling())


@torch.compiler.assume_constant_result
def compiling_with_cuda_graphs() -> bool:
    """Whether the torch.compile call dynamo is tracing records CUDA graphs
    (:func:`records_cuda_graphs` of its backend); False outside tracing. Dynamo calls it each
    time tracing reaches it and takes the answer as a constant, without a guard: it is fixed
    for a compiled function, whose backend dynamo keys its cache on."""
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator

        fn = InstructionTranslator.current_tx().output.compiler_fn
    except Exception:  # noqa: BLE001 - not tracing, or a torch whose dynamo keeps it elsewhere
        return False
    return records_cuda_graphs(fn)


def records_cuda_graphs(backend) -> bool:
    """Whether a torch.compile backend, as dynamo holds it (the compiler of the frame it traces,
    or the frame-evaluation callback of a compiled function that is running), records CUDA
    graphs: inductor with ``triton.cudagraphs`` (``mode="reduce-overhead"``, an ``options``
    dict, or inductor's global config) or the ``"cudagraphs"`` backend. False for backends it
    cannot read (a custom backend: no CUDA graphs of ours to count on)."""
    fn = backend
    for _ in range(8):  # dynamo wraps the backend (WrapBackendDebug, ...): walk to the original
        options = getattr(fn, "config", None)
        if isinstance(options, dict) and "triton.cudagraphs" in options:
            return bool(options["triton.cudagraphs"])
        if getattr(fn, "__name__", None) == "cudagraphs" or type(fn).__name__ == "CudagraphsBackend":
            return True
        if type(fn).__name__ == "_TorchCompileInductorWrapper" or getattr(fn, "__name__", None) == "compile_fx":
            break
        inner = next((getattr(fn, a) for a in ("_torchdynamo_orig_backend", "__wrapped__", "compiler_fn")
                      if getattr(fn, a, None) not in (None, fn)), None)
        if inner is None:
            return False
        fn = inner
    else:
        return False
    try:
        from torch._inductor import config as inductor_config
    except ImportError:  # pragma: no cover - torch without inductor
        return False
    return bool(inductor_config.triton.cudagraphs)


#: The ops whose kernels limit the head shape -> their launcher module in gnn_fastpath.cuda,
#: whose ``unsupported(H, D)`` says why not (imported on first use, then kept in
#: _limit_modules: a per-call import statement costs more than the check itself).
_LIMITED_OPS = {"gat_attention": "gat_attention", "gatv2_attention": "gatv2_attention",
                "dot_attention": "dot_attention"}
_limit_modules: dict = {}
# (op, heads) -> kernel_limit's answer: ``unsupported(H, D)`` reads nothing but the head shape
_limits: dict = {}


def kernel_limit(op: str, heads: Optional[Tuple[int, int]]) -> Optional[str]:
    """Why op ``op``'s kernels cannot take heads of shape ``heads`` = (H, D), or None."""
    if heads is None:
        return None
    key = (op, heads)
    if key in _limits:
        return _limits[key]
    kernels = _limit_modules.get(op)
    if kernels is None:
        if op not in _LIMITED_OPS:
            return None
        kernels = _limit_modules[op] = importlib.import_module(f"..cuda.{_LIMITED_OPS[op]}", __package__)
    limit = kernels.unsupported(*heads)
    if len(_limits) >= 1024:  # bounded: a process sees few head shapes
        _limits.clear()
    _limits[key] = limit
    return limit


def require(op: str, device: torch.device, dtype: torch.dtype, graph=None,
            heads: Optional[Tuple[int, int]] = None) -> None:
    """Inside a patched layer's call: raise :class:`Unsupported` now when op ``op``
    will not run fused on this graph (and head shape); outside a layer, nothing. Under
    torch.compile, nothing: the traced layer decided before it started (its graph is tensors,
    whose limits the operators' shapes carry)."""
    if is_compiling() or _local.call is None:
        return
    decision = decide(device, dtype, graph, kernel_limit(op, heads))
    if not accepted(decision):
        raise Unsupported(decision.reason, decision.detail)


def choose(op: str, device: torch.device, dtype: torch.dtype, graph=None,
           heads: Optional[Tuple[int, int]] = None) -> str:
    """The backend op ``op`` runs this call on (see the module docstring)."""
    decision = decide(device, dtype, graph, kernel_limit(op, heads))
    call = _local.call
    if call is not None:
        if not accepted(decision):
            raise Unsupported(decision.reason, decision.detail)
        if call.backend != REFERENCE:
            call.backend = decision.backend
    elif decision.backend == REFERENCE and device.type == "cuda" and not config.reference_forced():
        key = (op, decision.reason)
        if key not in _warned:
            _warned.add(key)
            warnings.warn(f"gnn_fastpath: {op} runs its reference op on CUDA tensors ({decision.reason}: "
                          f"{decision.detail}); warned once per op and reason", stacklevel=3)
    return decision.backend
