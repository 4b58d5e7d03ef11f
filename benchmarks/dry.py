"""The fused path's CUDA decisions on CPU tensors, for looking at the host path without a GPU.

Under :func:`cuda_decisions` the layers run on CPU tensors while the ops' dispatch answers
"cuda", so the fused path's checks, plans, work lists and launchers run as they do on a GPU;
kernel launches and cuSPARSE products are recorded and skipped (nothing is computed: values are
garbage), except the graph-build kernels, whose outputs the CPU fills in so that a new graph
takes the GPU's build branches; the custom operators of the static route run their CUDA
implementation too. What remains is the host's share of a call: its torch operations (which :class:`Tally`
counts) and its Python. :mod:`benchmarks.count_step_ops` counts a training step's operations
this way; ``bench_host --device dry`` times layer calls this way.

On a GPU each torch operation costs a kernel launch (views excepted) on top of its Python and
dispatch, and each read of a device value stalls the host until the GPU drains; on the CPU an
operation on a tiny tensor costs its dispatch and little else, and a read costs nothing. Times
and counts taken here therefore show where the host time goes and whether a change cuts it,
not what a GPU machine's host measures (benchmarks/RESULTS.md compares the two).
"""
from __future__ import annotations

import contextlib
import os
import sys
import time
import types
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

#: aten operations that read a device value on the host (a synchronisation on a GPU).
SYNC_OPS = frozenset({"aten._local_scalar_dense.default", "aten.nonzero.default", "aten.masked_select.default",
                      "aten.unique_consecutive.default", "aten._unique2.default", "aten.unique_dim.default",
                      "aten.bincount.default", "aten.is_nonzero.default", "aten.equal.default",
                      "aten.repeat_interleave.Tensor"})
#: aten's operation for a tensor made from Python data (a blocking copy to a GPU).
FROM_PYTHON_DATA = "aten.lift_fresh.default"
_PACKAGE_DIRS = (os.sep + "gnn_fastpath" + os.sep, os.sep + "integrations" + os.sep)
#: Frames of the counting tools themselves, never an issuer.
_OWN_FILES = ("count_step_ops.py", "dry.py")


def _reads_back(name: str, args, kwargs) -> bool:
    if name == "aten.repeat_interleave.Tensor":
        return kwargs.get("output_size") is None
    if name in SYNC_OPS:
        return True
    if name.startswith(("aten.index.Tensor", "aten.index_put")) and len(args) > 1 and args[1] is not None:
        return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1])
    return False


def _in_optimizer() -> bool:
    """Whether torch.optim issues the operation (its step counts live on the host, also with a
    GPU: their reads are not synchronisations)."""
    frame = sys._getframe(2)
    while frame is not None:
        if os.sep + "optim" + os.sep in frame.f_code.co_filename:
            return True
        frame = frame.f_back
    return False


def _issuer() -> str:
    """``file:function`` of the innermost package frame on the stack (else the model's code)."""
    frame = sys._getframe(2)
    while frame is not None:
        path = frame.f_code.co_filename
        if any(d in path for d in _PACKAGE_DIRS) and not path.endswith(_OWN_FILES):
            for d in _PACKAGE_DIRS:
                if d in path:
                    return d.strip(os.sep) + "/" + path.split(d, 1)[1] + ":" + frame.f_code.co_name
        frame = frame.f_back
    return "(model, autograd, optimizer)"


class Tally(TorchDispatchMode):
    """Counts what is dispatched under it (see the module docstring)."""

    def __init__(self, attribute: bool = False):
        super().__init__()
        self.attribute = attribute
        self.ops: Counter = Counter()
        self.issuers: Counter = Counter()
        self.syncs = 0
        self.blocking_copies = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = str(func)
        self.ops[name] += 1
        if name == FROM_PYTHON_DATA:
            self.blocking_copies += 1
        elif _reads_back(name, args, kwargs) and not _in_optimizer():
            self.syncs += 1
        if self.attribute:
            self.issuers[_issuer()] += 1
        return func(*args, **kwargs)

    def add(self, other: "Tally") -> None:
        self.ops.update(other.ops)
        self.issuers.update(other.issuers)
        self.syncs += other.syncs
        self.blocking_copies += other.blocking_copies


class _Recorder:
    """What the stubs saw while counting (launch names, cuSPARSE products, the host reads of the
    graph-build kernels' outputs, custom-operator bodies)."""

    def __init__(self, attribute: bool):
        self.attribute = attribute
        self.active = False
        self.launches: Counter = Counter()
        self.cusparse = 0
        self.host_reads = 0
        self.inner = Tally(attribute)
        self.emulated_s = 0.0  # CPU time spent filling in the build kernels' outputs

    def host_clock(self) -> float:
        """``time.perf_counter()`` stopped while the CPU stands in for the build kernels: on a GPU
        that work is the device's, not the host's."""
        return time.perf_counter() - self.emulated_s


def _filled(rec: "_Recorder", launcher, truth, reads: int = 0):
    """``launcher`` (a graph-build kernel's) as the dry run calls it: its allocations and its
    recorded launches as on a GPU, then its outputs filled with what the kernels would have
    written (``truth``, computed outside the counting modes: on a GPU that work is the kernels'),
    so that the build takes the branches a GPU's takes. ``reads``: the host reads of its
    outputs that follow on a GPU (a CPU tensor's ``tolist()`` dispatches nothing to count)."""
    def run(*args):
        if rec.active:
            rec.host_reads += reads
        outputs = launcher(*args)
        start = time.perf_counter()
        with _disable_current_modes(), torch.no_grad():
            for out, value in zip(outputs if isinstance(outputs, tuple) else (outputs,), truth(*args)):
                out.copy_(value)
        rec.emulated_s += time.perf_counter() - start
        return outputs
    return run


def _true_edge_facts(src: torch.Tensor, dst: torch.Tensor, n_src: int, n_dst: int):
    """What ``csr_build.edge_facts`` computes (see there), by torch operations."""
    ok_src, ok_dst = (src >= 0) & (src < n_src), (dst >= 0) & (dst < n_dst)
    in_degree = torch.bincount(dst[ok_dst], minlength=n_dst)
    out_degree = torch.bincount(src[ok_src], minlength=n_src)
    facts = [src.min(), src.max(), dst.min(), dst.max(), (dst[1:] < dst[:-1]).sum(), (src == dst).sum(),
             in_degree.max() if n_dst else 0, out_degree.max() if n_src else 0,
             ((dst[1:] == dst[:-1]) & (src[1:] < src[:-1])).sum()]
    return torch.tensor([int(f) for f in facts]), in_degree, out_degree


def _true_indptr(sorted_rows: torch.Tensor, n_rows: int):
    """What ``csr_build.csr_indptr`` computes: the row offsets of sorted row ids (the CPU
    build's way)."""
    from gnn_fastpath.graph.graph import _indptr_by_counts

    return (_indptr_by_counts(sorted_rows, n_rows),)


@contextlib.contextmanager
def cuda_decisions(attribute: bool = False):
    """CPU tensors take the fused path's CUDA route with stubbed launches (module docstring);
    yields the :class:`_Recorder`. Everything patched is restored on exit."""
    from gnn_fastpath import cuda
    from gnn_fastpath.cuda import launch
    from gnn_fastpath.cuda.cusparse import CsrMatrix
    from gnn_fastpath.graph import graph as graph_module
    from gnn_fastpath.ops import dispatch, library

    rec = _Recorder(attribute)
    stub = types.SimpleNamespace(get_function=lambda name: types.SimpleNamespace(ptr=0, name=name))
    decide = dispatch.decide

    def record_launch(kernel, grid, block, *, shared_mem=0, **args):
        if rec.active:
            rec.launches[kernel.name.split("<")[0]] += 1

    def record_product(matrix, values, b, c, transpose=False):
        if rec.active:
            rec.cusparse += 1
        return c

    def cuda_implementation(impl):
        def run(*args, **kwargs):
            kwargs.pop("use_reference", None)  # the CUDA implementation, also on CPU tensors
            if not rec.active:
                return impl(*args, **kwargs)
            with rec.inner:  # an operator's body is dispatched below the outer mode
                return impl(*args, **kwargs)
        return run

    patches = [(launch, "_module", lambda *a, **k: stub), (launch, "_device_index", lambda device: 0),
               (launch, "resident_blocks", lambda kernel, threads, shared_mem=0: 132),
               (launch.Kernel, "launch", record_launch), (CsrMatrix, "matmul", record_product),
               (cuda, "unavailable_reason", lambda: None), (graph_module, "_builds_on_gpu", lambda t: True),
               (cuda, "edge_facts", _filled(rec, cuda.edge_facts, _true_edge_facts, reads=1)),
               (cuda, "csr_indptr", _filled(rec, cuda.csr_indptr, _true_indptr)),
               (dispatch, "decide", lambda device, *a, **k: decide(torch.device("cuda"), *a, **k))]
    patches += [(family, "_cache", {}) for family in launch.FAMILIES]  # stubs stay out of real caches
    saved = [(obj, attr, getattr(obj, attr)) for obj, attr, _ in patches]
    impls = dict(library._IMPLS)
    try:
        for obj, attr, value in patches:
            setattr(obj, attr, value)
        for family, pair in impls.items():
            library._IMPLS[family] = tuple(cuda_implementation(f) for f in pair)
        yield rec
    finally:
        for obj, attr, value in saved:
            setattr(obj, attr, value)
        library._IMPLS.clear()
        library._IMPLS.update(impls)
