"""cuSPARSE generic SpMM (int32 CSR x row-major dense) through CuPy's bindings, timed
against the package's own CSR kernel.

Dtypes: B and C are float32, float16 or bfloat16, compute type always CUDA_R_32F (float32
products and sums). cuSPARSE's SpMM takes A and B of one type with C of that type or, for
16-bit A/B, CUDA_R_32F (its mixed-precision table); so A's values are kept as float32
(:class:`EdgeValues`, what the own kernel reads) plus a copy in each 16-bit dtype B comes in,
converted once and cached, and a float32 B with a 16-bit C (the backward of a float32 result
of 16-bit inputs) goes through a float32 C that is cast once. So does every transposed
product with a 16-bit C: cuSPARSE's A^T accumulates into C with atomics in C's type, which
would round at every addition (:func:`_c_dtype`). Every cache key below includes
(B dtype, C dtype).

Zero-copy: descriptors point straight at torch tensors' memory. Stream: every call runs
inside ``cupy.cuda.ExternalStream(torch's current stream)``. That matters because CuPy's
``cusparse.spMM``/``spMM_bufferSize`` wrappers call ``cusparseSetStream(handle, <CuPy's
current stream>)`` themselves before every call (``_setStream`` in
``cupy_backends/cuda/libs/cusparse.pyx``), so setting the handle's stream by hand would be
overwritten; making torch's stream CuPy's current one is what puts the work on it. On exit
CuPy's previous current stream is restored (the next CuPy cuSPARSE call re-sets the
handle's stream anyway).

One :class:`CsrMatrix` per graph orientation holds the cuSPARSE sparse-matrix descriptor
(created once; its values pointer is re-pointed with ``cusparseSpMatSetValues`` before each
call, a host-only operation, so one descriptor serves every normalisation and edge weight),
the chosen algorithm per (operation, width, dtypes), and workspaces per (operation, width,
stream, dtypes). One descriptor per value dtype (a descriptor's value type is fixed).

Algorithm choice: on the first call for an (operation, width) the CSR algorithms
(``CUSPARSE_SPMM_ALG_DEFAULT``, ``CSR_ALG1``, ``CSR_ALG2``, ``CSR_ALG3``, those cuSPARSE
accepts for the call) and, for non-transposed products, the matrix's own kernel (the
``own_kernel`` callback: ``spmm_rows``/``spmm_chunks`` of ``spmm.cu``, launched by
:mod:`gnn_fastpath.cuda.spmm`) are each run ``TIMED_RUNS`` times between CUDA events and the
fastest is kept. That first call synchronises the host with the GPU once; later calls
never do. ``GNN_FASTPATH_SPMM_ALG`` forces one (falling back to the timing if cuSPARSE
refuses it for a call); ``GNN_FASTPATH_SPMM_CUSTOM=0`` leaves the own kernel out of the
timing. An algorithm cuSPARSE refuses (``CUSPARSE_STATUS_NOT_SUPPORTED`` or
``INVALID_VALUE``) is skipped; any other error is raised.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Callable, Dict, Tuple, Union

import numpy as np
import torch
from torch import Tensor

from .. import config, tuning
from .launch import _raw_stream, cupy_stream

#: cusparseSpMMAlg_t values (cusparse.h, CUDA 11.2+; the same in CUDA 12 and 13). CuPy 14's
#: ``cupy_backends.cuda.libs.cusparse`` exposes only the deprecated aliases
#: ``CUSPARSE_MM_ALG_DEFAULT`` (0) and ``CUSPARSE_CSRMM_ALG1`` (4) as attributes, not
#: ``CUSPARSE_SPMM_CSR_ALG2``/``ALG3``; its ``spMM`` takes the plain integer, so the values
#: are spelled here (DEFAULT 0, CSR_ALG1 4, CSR_ALG2 6, CSR_ALG3 12).
_ALGS = {"default": 0, "alg1": 4, "alg2": 6, "alg3": 12}
#: Pseudo-algorithm: the matrix's own kernel (``own_kernel``), timed alongside cuSPARSE's
#: for non-transposed products.
CUSTOM = -1
#: Pseudo-algorithm recorded when cuSPARSE refused every algorithm for a call (so later calls
#: of that key raise :class:`NoAlgorithm` at once instead of searching again).
REFUSED = -2
#: Algorithm code of the block-sparse tensor-core kernel (16-bit products on dense-enough
#: matrices; :mod:`gnn_fastpath.cuda.block_spmm`).
BLOCK = -3
TIMED_RUNS = 3
#: cusparseStatus_t values that mean "this algorithm does not take this call".
_REFUSALS = (3, 10)  # CUSPARSE_STATUS_INVALID_VALUE, CUSPARSE_STATUS_NOT_SUPPORTED
# host scalars for cuSPARSE (pointer mode host), alive for the module's lifetime
_ALPHA = np.ones(1, dtype=np.float32)
_BETA = np.zeros(1, dtype=np.float32)
_lock = threading.Lock()
#: How many algorithm searches ran (tests check that cached plans are reused).
search_count = 0
# call signature -> algorithm chosen by timing (see CsrMatrix._signature); bounded by the
# number of distinct (operation, width, size bucket) combinations a process uses.
_shared_choices: Dict[Tuple[int, ...], int] = {}


def _tuning_class(signature: tuple, transpose: bool) -> str:
    """The tuner's class of an SpMM call signature (:meth:`CsrMatrix._signature`): the
    algorithm chosen for it is kept in the choices file (:mod:`gnn_fastpath.tuning`)."""
    _, F, nnz_bits, rows_bits, cols_bits, b_dtype, c_dtype = signature
    kind = "transposed" if transpose else "plain"
    dt = "->".join(str(t).replace("torch.", "") for t in (b_dtype, c_dtype))
    return f"spmm.algorithm|{kind}|F {F}|nnz<2^{nnz_bits}|rows<2^{rows_bits}|cols<2^{cols_bits}|{dt}"


def _name(alg: int) -> str:
    """The name of an algorithm code (any code :func:`algorithms` offers)."""
    return next(name for name, code in {**_ALGS, "custom": CUSTOM, "block": BLOCK}.items() if code == alg)


def clear_shared_choices() -> None:
    """Forget the algorithms chosen for earlier matrices (the next call of each shape times again)."""
    _shared_choices.clear()


def _cusparse():
    from cupy_backends.cuda.libs import cusparse

    return cusparse


#: cudaDataType_t values (library_types.h; stable ABI): CUDA_R_32F 0, CUDA_R_16F 2,
#: CUDA_R_16BF 14. CuPy's to_cuda_dtype goes through numpy dtypes, which have no bfloat16.
_CUDA_TYPES = {torch.float32: 0, torch.float16: 2, torch.bfloat16: 14}
#: The compute type of every call: float32 arithmetic whatever the storage.
_COMPUTE = _CUDA_TYPES[torch.float32]


def _cuda_type(dtype: torch.dtype) -> int:
    try:
        return _CUDA_TYPES[dtype]
    except KeyError:
        raise ValueError(f"cuSPARSE SpMM here takes float32, float16 and bfloat16, not {dtype}") from None


class EdgeValues:
    """Values of a CSR matrix in CSR order: ``fp32`` [nnz] (what the own kernel reads) and,
    made on first use and kept, a copy in each 16-bit dtype cuSPARSE multiplies in (its A must
    have B's type). The float32 tensor must not change afterwards."""

    __slots__ = ("fp32", "_typed")

    def __init__(self, fp32: Tensor):
        self.fp32 = fp32
        self._typed: Dict[torch.dtype, Tensor] = {torch.float32: fp32}

    def typed(self, dtype: torch.dtype) -> Tensor:
        t = self._typed.get(dtype)
        if t is None:
            t = self._typed[dtype] = self.fp32.to(dtype)
        return t


def fp32_values(values: Union[Tensor, EdgeValues]) -> Tensor:
    """The float32 values of ``values`` (an :class:`EdgeValues` or a float32 tensor)."""
    return values.fp32 if isinstance(values, EdgeValues) else values


def _c_dtype(b_dtype: torch.dtype, c_dtype: torch.dtype, transpose: bool = False) -> torch.dtype:
    """The C type cuSPARSE writes for B of ``b_dtype`` when the caller wants ``c_dtype``:
    ``c_dtype`` itself where cuSPARSE takes the pair, else float32 (cast afterwards).

    A transposed product always gets a float32 C: cuSPARSE computes op(A) = A^T by scattering
    each row's products into C with atomics in C's type (hence its "slightly different
    results during different runs" note), so a 16-bit C would be rounded at every addition
    (16-bit dX of high out-degree sources then misses test_spmm_half's bound, as any 16-bit
    atomic accumulation does). A float32 C
    (16-bit A/B with a float32 C is in cuSPARSE's mixed-precision table; if a transposed call
    is refused, the backward takes the explicit transposed matrix) is cast once, like the own
    kernels' float32 scratch."""
    if transpose:
        return torch.float32
    return c_dtype if c_dtype in (b_dtype, torch.float32) else torch.float32


#: Timed by default. CSR_ALG1 and CSR_ALG3 spread a NaN or inf of one input row into output
#: rows that never read it (cuSPARSE of CUDA 13; test_non_finite shows it), so they run
#: only when forced with GNN_FASTPATH_SPMM_ALG.
_TIMED = ("default", "alg2")


def algorithms(transpose: bool = False, block: bool = False) -> Dict[str, int]:
    """The SpMM algorithms tried, name -> cusparseSpMMAlg_t value (CUSTOM: the own kernel;
    BLOCK: the block-sparse tensor-core kernel, where ``block`` says the call can take it)."""
    algs = {name: _ALGS[name] for name in _TIMED}
    if not transpose and config.setting("GNN_FASTPATH_SPMM_CUSTOM"):
        algs["custom"] = CUSTOM
    if not transpose and block:
        algs["block"] = BLOCK
    return algs


class NoAlgorithm(RuntimeError):
    """No SpMM algorithm accepted the call (e.g. a dtype combination cuSPARSE does not take
    for a transposed product, which has no own-kernel alternative)."""


def _refused(exc) -> bool:
    """Whether a CuSparseError is cuSPARSE refusing an algorithm for a call (not a real fault)."""
    return getattr(exc, "status", None) in _REFUSALS


class CsrMatrix:
    """An int32 CSR matrix [n_rows, n_cols] on one GPU whose values are supplied per call.

    ``indptr`` and ``indices`` must stay unchanged for the object's lifetime (it keeps
    references to them). ``own_kernel(values, b, c)`` (float32 values) computes ``c = A @ b`` without
    cuSPARSE (required for multigraphs with more entries than matrix cells, which cuSPARSE
    cannot describe). ``block_kernel``, when given, is a timed candidate too: an object with
    ``offered(b, c)`` (whether to time it for this call), ``__call__(values, b, c)`` (raises
    :class:`NoAlgorithm` when the matrix turns out unsuited) and ``release()`` (frees its
    state when another algorithm won).
    """

    def __init__(self, indptr: Tensor, indices: Tensor, n_rows: int, n_cols: int,
                 own_kernel: Callable[[Tensor, Tensor, Tensor], None], block_kernel=None):
        if indptr.dtype != torch.int32 or indices.dtype != torch.int32:
            raise ValueError("CsrMatrix needs int32 indptr and indices")
        self.indptr = indptr
        self.indices = indices
        self.n_rows = int(n_rows)
        self.n_cols = int(n_cols)
        self.nnz = indices.numel()
        self.device = indices.device
        self._descs: Dict[torch.dtype, int] = {}  # value dtype -> cuSPARSE descriptor
        self._algs: Dict[tuple, int] = {}
        self._workspaces: Dict[tuple, Tensor] = {}
        self._sizes: Dict[tuple, int] = {}
        self._own_kernel = own_kernel
        self._block = block_kernel
        self._destroy = None  # cusparse.destroySpMat, kept so __del__ imports nothing at exit

    def __del__(self):
        descs, self._descs = getattr(self, "_descs", None) or {}, {}
        for desc in descs.values():
            self._destroy(desc)

    # ------------------------------------------------------------------ internals
    def _descriptor(self, values: Tensor) -> int:
        cs = _cusparse()
        desc = self._descs.get(values.dtype)
        if desc is None:
            self._destroy = cs.destroySpMat
            desc = self._descs[values.dtype] = cs.createCsr(
                self.n_rows, self.n_cols, self.nnz, self.indptr.data_ptr(), self.indices.data_ptr(),
                values.data_ptr(), cs.CUSPARSE_INDEX_32I, cs.CUSPARSE_INDEX_32I, cs.CUSPARSE_INDEX_BASE_ZERO,
                _cuda_type(values.dtype))
        else:
            cs.spMatSetValues(desc, values.data_ptr())
        return desc

    def _workspace(self, size: int, key) -> Tensor:
        ws = self._workspaces.get(key)
        if ws is None or ws.numel() < size:
            ws = torch.empty(max(size, 1), dtype=torch.uint8, device=self.device)
            self._workspaces[key] = ws
        return ws

    def _run(self, handle, op: int, alg: int, desc, mat_b, mat_c, key, values, b, c, c_lib) -> None:
        """One product with ``alg``: the own kernel writes ``c``; cuSPARSE writes ``c_lib``
        (``c``, or a float32 stand-in cast into ``c`` afterwards)."""
        if alg == CUSTOM:
            self._own_kernel(fp32_values(values), b, c)
            return
        if alg == BLOCK:
            self._block(fp32_values(values), b, c)
            return
        cs = _cusparse()
        skey = (op, key[1], alg) + key[3:]
        size = self._sizes.get(skey)
        if size is None:  # depends on the structure, the operation, the width, the dtypes and the algorithm only
            size = cs.spMM_bufferSize(handle, op, cs.CUSPARSE_OPERATION_NON_TRANSPOSE, _ALPHA.ctypes.data, desc,
                                      mat_b, _BETA.ctypes.data, mat_c, _COMPUTE, alg)
            self._sizes[skey] = size
        ws = self._workspace(size, key)
        cs.spMM(handle, op, cs.CUSPARSE_OPERATION_NON_TRANSPOSE, _ALPHA.ctypes.data, desc, mat_b, _BETA.ctypes.data,
                mat_c, _COMPUTE, alg, ws.data_ptr())
        if c_lib is not c:
            c.copy_(c_lib)

    def _signature(self, op: int, F: int, dtypes: tuple) -> tuple:
        """Coarse shape of a call (power-of-two buckets of nnz, rows and columns) and its
        (B, C) dtypes.

        Mini-batch training builds a new graph every step; timing every algorithm for each
        would cost a dozen host syncs per layer per step. Graphs of one signature share the
        first one's choice instead (any algorithm gives the same result, only speed differs).
        """
        return (op, F, self.nnz.bit_length(), self.n_rows.bit_length(), self.n_cols.bit_length()) + dtypes

    def _search(self, handle, op: int, desc, mat_b, mat_c, key, values, b, c, c_lib,
                transpose: bool) -> Tuple[int, Dict[str, float]]:
        """Time each algorithm that accepts this call; return the fastest and every time (ms
        per :data:`TIMED_RUNS` calls, by algorithm name)."""
        global search_count
        cs = _cusparse()
        best, best_ms, errors, times = None, float("inf"), [], {}
        for name, alg in algorithms(transpose, self._offers_block(b, c)).items():
            try:
                self._run(handle, op, alg, desc, mat_b, mat_c, key, values, b, c, c_lib)  # warm-up (and workspace)
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(TIMED_RUNS):
                    self._run(handle, op, alg, desc, mat_b, mat_c, key, values, b, c, c_lib)
                end.record()
                end.synchronize()
                ms = start.elapsed_time(end)
            except cs.CuSparseError as exc:
                if not _refused(exc):
                    raise
                errors.append(f"{name}: {exc}")
                continue
            except NoAlgorithm as exc:  # the block kernel declined this matrix
                errors.append(f"{name}: {exc}")
                continue
            times[name] = ms
            if ms < best_ms:
                best, best_ms = alg, ms
        if best != BLOCK and self._block is not None:
            self._block.release()
        with _lock:
            search_count += 1
        if best is None:
            raise NoAlgorithm("no SpMM algorithm accepted the call: " + "; ".join(errors))
        return best, times

    # ------------------------------------------------------------------ public
    def matmul(self, values: Union[Tensor, EdgeValues], b: Tensor, c: Tensor, transpose: bool = False) -> Tensor:
        """c = op(A) @ b with A's values ``values`` (:class:`EdgeValues`, or a float32 [nnz]
        tensor in CSR order, converted per call for 16-bit ``b``); returns c.

        ``b`` [n_cols, F] (or [n_rows, F] when ``transpose``) and ``c`` [n_rows, F] (or
        [n_cols, F]) are contiguous row-major tensors on this matrix's device, each float32,
        float16 or bfloat16 (float32 arithmetic whatever they are). Every entry of c is
        written (rows without entries get 0).
        """
        import cupy

        rows_c = self.n_cols if transpose else self.n_rows
        rows_b = self.n_rows if transpose else self.n_cols
        F = b.size(1)
        if tuple(b.shape) != (rows_b, F) or tuple(c.shape) != (rows_c, F):
            raise ValueError(f"shape mismatch: A {self.n_rows}x{self.n_cols} (transpose={transpose}), "
                             f"b {tuple(b.shape)}, c {tuple(c.shape)}")
        if not (b.is_contiguous() and c.is_contiguous()):
            raise ValueError("b and c must be contiguous")
        if rows_c == 0 or F == 0:
            return c
        if self.nnz == 0 or rows_b == 0:
            return c.zero_()
        cs = _cusparse()
        op = cs.CUSPARSE_OPERATION_TRANSPOSE if transpose else cs.CUSPARSE_OPERATION_NON_TRANSPOSE
        dtypes = (b.dtype, c.dtype)
        akey = (op, F) + dtypes
        alg = self._algs.get(akey)
        if self.nnz > self.n_rows * self.n_cols:
            # A multigraph can hold more edges than matrix entries (duplicate edges); cuSPARSE
            # refuses such a descriptor (CUSPARSE_STATUS_INVALID_VALUE), our kernel does not.
            if transpose:
                raise ValueError(f"{self.nnz} entries in a {self.n_rows}x{self.n_cols} matrix: "
                                 "use the explicit transposed matrix (GNN_FASTPATH_SPMM_BWD=transposed)")
            alg = self._algs[akey] = CUSTOM
        if alg == CUSTOM:  # no cuSPARSE state needed
            self._own_kernel(fp32_values(values), b, c)
            return c
        if alg == BLOCK:
            self._block(fp32_values(values), b, c)
            return c
        if alg == REFUSED:
            raise NoAlgorithm(f"cuSPARSE refused every SpMM algorithm for {akey}")
        if not isinstance(values, EdgeValues):
            values = EdgeValues(values)
        typed = values.typed(b.dtype)  # cuSPARSE: A has B's type
        c_type = _c_dtype(b.dtype, c.dtype, transpose)
        c_lib = c if c_type == c.dtype else torch.empty(c.shape, dtype=c_type, device=c.device)
        index = self.device.index if self.device.index is not None else torch.cuda.current_device()
        key = (op, F, _raw_stream(index)) + dtypes  # the current stream's handle, without a Stream object
        # CuPy's current device is the CUDA runtime's, i.e. torch's: enter it only when the
        # matrix lives elsewhere (the context manager costs host time on every call)
        device_ctx = contextlib.nullcontext() if torch.cuda.current_device() == index else cupy.cuda.Device(index)
        with device_ctx, cupy_stream(self.device):
            handle = cupy.cuda.device.get_cusparse_handle()
            cs.setPointerMode(handle, cs.CUSPARSE_POINTER_MODE_HOST)
            desc = self._descriptor(typed)
            mat_b = cs.createDnMat(rows_b, F, F, b.data_ptr(), _cuda_type(b.dtype), cs.CUSPARSE_ORDER_ROW)
            mat_c = cs.createDnMat(rows_c, F, F, c_lib.data_ptr(), _cuda_type(c_type), cs.CUSPARSE_ORDER_ROW)
            try:
                if alg is None:
                    names = {**_ALGS, **algorithms(transpose, self._offers_block(b, c))}
                    forced = names.get(config.setting("GNN_FASTPATH_SPMM_ALG") or "")
                    signature = self._signature(op, F, dtypes)
                    klass = _tuning_class(signature, transpose) if tuning.enabled() else None

                    def candidates():
                        # the forced algorithm, else the one timed for a similar matrix (no
                        # search, no host sync): in this process, or (GNN_FASTPATH_TUNE=1) in an
                        # earlier one, from the choices file; unless cuSPARSE refuses it here
                        yield forced
                        yield _shared_choices.get(signature)
                        if klass is not None:
                            yield names.get(tuning.remembered(klass, self.device) or "")

                    for candidate in candidates():
                        if candidate is None:
                            continue
                        try:
                            self._run(handle, op, candidate, desc, mat_b, mat_c, key, values, b, c, c_lib)
                            self._algs[akey] = candidate
                            return c
                        except cs.CuSparseError as exc:
                            if not _refused(exc):
                                raise
                        except NoAlgorithm:  # a similar matrix took the block kernel; this one is unsuited
                            pass
                    try:
                        alg, times = self._search(handle, op, desc, mat_b, mat_c, key, values, b, c, c_lib,
                                                  transpose)
                    except NoAlgorithm:
                        self._algs[akey] = REFUSED
                        raise
                    self._algs[akey] = _shared_choices[signature] = alg
                    if klass is not None:
                        tuning.remember(klass, self.device, _name(alg), times, "default")
                self._run(handle, op, alg, desc, mat_b, mat_c, key, values, b, c, c_lib)
            finally:
                cs.destroyDnMat(mat_b)
                cs.destroyDnMat(mat_c)
        return c

    def _offers_block(self, b: Tensor, c: Tensor) -> bool:
        return self._block is not None and self._block.offered(b, c)

    def chosen_algorithms(self) -> Dict[tuple, int]:
        """(operation, width, B dtype, C dtype) -> algorithm enum value chosen so far."""
        return dict(self._algs)
