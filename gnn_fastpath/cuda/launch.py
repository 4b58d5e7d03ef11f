"""Compiled kernels and their launches: the one kernel cache, argument checking, grid sizing.

A :class:`Kernel` is a compiled CUDA function plus its parameter list, read from the .cu
source text. Launches pass arguments by the .cu parameter names; each value is converted to
the parameter's C type (pointers from tensors or None, ``int``, ``long long``,
``unsigned long long``, ``float``), and a missing or unknown name is a TypeError at the
launch, not a silently misread argument. Constants the .cu and the Python side share are
passed as ``-D`` defines by the launcher modules (:class:`Family`), so each lives in one place.

Every launch goes on torch's current CUDA stream of the kernel's device, with no host
synchronisation. CuPy compiles and loads the modules; the launch itself calls the driver's
``cuLaunchKernel`` with the arguments packed once into the kernel's own parameter buffer:
a training step of small batches is bound by the host time of its launches, and CuPy's
general-purpose launch (one argument object per parameter) would be a large share of it. A
failed launch (bad configuration, too many resources) raises a RuntimeError naming the kernel
and the driver's error.
"""
from __future__ import annotations

import ctypes
import functools
import re
import struct
import threading
import warnings
from typing import Callable, Dict, Mapping, NamedTuple, Optional, Sequence, Tuple

import torch
from torch import Tensor

from .. import config
from .loader import read_source

_COMPILE_OPTIONS = ("-std=c++17",)
_U64_MASK = (1 << 64) - 1


def _pointer(value) -> int:
    """The device address of a tensor (0 for None)."""
    if value is None:
        return 0
    try:
        return value.data_ptr()
    except AttributeError:
        raise TypeError(f"expected a tensor or None for a pointer parameter, got {type(value).__name__}") from None


def _u64(value) -> int:
    return int(value) & _U64_MASK  # seeds wrap to 64 bits, as the kernels read them


#: C parameter types the kernels use -> (converter to the launch value, struct code of the
#: value in the parameter buffer). Values out of a type's range fail the packing.
_SCALARS: Dict[str, Tuple[Callable, str]] = {
    "int": (int, "i"),
    "unsigned int": (int, "I"),
    "long long": (int, "q"),
    "unsigned long long": (_u64, "Q"),
    "float": (float, "f"),
}
_POINTER = (_pointer, "Q")


class Param(NamedTuple):
    """One kernel parameter: its .cu name, the converter of a launch value, its struct code."""
    name: str
    convert: Callable
    code: str


def _parameters(source_text: str, name: str) -> Tuple[Param, ...]:
    """The parameters of kernel ``name`` (template arguments stripped), read from its
    ``__global__`` definition in the inlined source."""
    base = name.split("<", 1)[0].strip()
    pattern = re.compile(r"__global__\s+void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?" + re.escape(base) + r"\s*\(")
    found = pattern.search(source_text)
    if found is None:
        raise LookupError(f"kernel {base} is not defined in the source")
    end = source_text.index(")", found.end())
    params = []
    for raw in source_text[found.end():end].split(","):
        words = raw.replace("__restrict__", " ").replace("*", " * ").split()
        if not words:
            continue
        pname, ctype = words[-1], [w for w in words[:-1] if w != "const"]
        if "*" in ctype:
            params.append(Param(pname, *_POINTER))
            continue
        key = " ".join(ctype)
        if key not in _SCALARS:
            raise TypeError(f"kernel {base}: parameter {pname} has type {key!r}, which launches cannot pass")
        params.append(Param(pname, *_SCALARS[key]))
    return tuple(params)


@functools.lru_cache(maxsize=1)
def _libcuda() -> ctypes.CDLL:
    """The CUDA driver library (loaded by torch and CuPy already)."""
    return ctypes.CDLL("libcuda.so.1")


@functools.lru_cache(maxsize=1)
def _driver_launch() -> Callable:
    """The driver's cuLaunchKernel."""
    fn = _libcuda().cuLaunchKernel
    fn.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
    fn.restype = ctypes.c_int
    return fn


def _driver_error(code: int) -> str:
    name = ctypes.c_char_p()
    _libcuda().cuGetErrorName(code, ctypes.byref(name))
    return name.value.decode() if name.value else f"CUresult {code}"


def _dims(d) -> Tuple[int, int, int]:
    if type(d) is int:  # the common case, kept cheap
        return (d, 1, 1)
    d = tuple(d) if isinstance(d, (tuple, list)) else (d,)
    if not 1 <= len(d) <= 3:
        raise ValueError(f"a launch dimension has 1 to 3 values, got {d!r}")
    return tuple(int(v) for v in d) + (1,) * (3 - len(d))


def _raw_stream(index: int) -> int:
    """torch's current stream on device ``index`` as the driver handle (a tenth of the host
    time of ``torch.cuda.current_stream``)."""
    get = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return get(index) if get is not None else torch.cuda.current_stream(index).cuda_stream


def _device_index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


@functools.lru_cache(maxsize=None)
def _module(source: str, name_expressions: Tuple[str, ...], defines: Tuple[Tuple[str, int], ...],
            device_index: int):
    import cupy

    options = _COMPILE_OPTIONS + tuple(f"-D{k}={v}" for k, v in defines)
    with cupy.cuda.Device(device_index):
        module = cupy.RawModule(code=read_source(source), options=options,
                                name_expressions=name_expressions or None)
        module.compile()
    return module


class Kernel:
    """One compiled kernel on one device; call :meth:`launch` with named arguments.

    The launch values are packed into one buffer per kernel (each parameter at its native
    alignment) whose parameter pointers are made once; the driver copies the values at the
    launch, so the buffer is free again when ``cuLaunchKernel`` returns (a lock keeps threads
    from packing into it at once)."""

    def __init__(self, function, name: str, params: Tuple[Param, ...], device_index: int):
        self.function = function
        self.name = name
        self.params = params
        self.device_index = device_index
        self._names = frozenset(p.name for p in params)
        # (name, converter) per parameter, in the .cu order: what each launch walks
        self._converters = tuple((p.name, p.convert) for p in params)
        self.resident: Dict[Tuple[int, int], int] = {}  # (threads, shared memory) -> resident blocks
        self._format = "@" + "".join(p.code for p in params)
        self._buffer = ctypes.create_string_buffer(max(struct.calcsize(self._format), 1))
        base = ctypes.addressof(self._buffer)
        offsets = [struct.calcsize("@" + "".join(p.code for p in params[:i + 1])) - struct.calcsize(p.code)
                   for i, p in enumerate(params)]
        self._param_ptrs = (ctypes.c_void_p * max(len(params), 1))(*[base + o for o in offsets])
        self._lock = threading.Lock()

    def arguments(self, args: Mapping[str, object]) -> tuple:
        """The launch values for ``args`` (parameter name -> value), in the .cu order."""
        try:
            values = tuple([convert(args[name]) for name, convert in self._converters])
        except KeyError as exc:
            raise TypeError(f"{self.name}: no value for parameter {exc.args[0]}") from None
        if len(args) != len(self.params):
            extra = sorted(set(args) - self._names)
            raise TypeError(f"{self.name}: unknown parameters {extra}")
        return values

    def pack(self, values: Sequence) -> None:
        """Write ``values`` (from :meth:`arguments`) into the parameter buffer (hold the lock)."""
        try:
            struct.pack_into(self._format, self._buffer, 0, *values)
        except struct.error as exc:
            raise OverflowError(f"{self.name}: a launch value does not fit its parameter type ({exc})") from None

    def launch(self, grid, block, *, shared_mem: int = 0, **args) -> None:
        """Launch on torch's current stream of this kernel's device."""
        index = self.device_index
        values = self.arguments(args)
        g, b = _dims(grid), _dims(block)
        if torch.cuda.current_device() == index:
            self._launch(g, b, shared_mem, values)
        else:
            import cupy

            with cupy.cuda.Device(index):
                self._launch(g, b, shared_mem, values)

    def _launch(self, g, b, shared_mem: int, values: tuple) -> None:
        stream = _raw_stream(self.device_index)
        with self._lock:
            self.pack(values)
            code = _driver_launch()(self.function.kernel.ptr, *g, *b, int(shared_mem), stream, self._param_ptrs,
                                    None)
        if code != 0:
            raise RuntimeError(f"{self.name}: launch of grid {g}, block {b}, {shared_mem} bytes of shared memory "
                               f"failed: {_driver_error(code)}")


class Family:
    """The kernels of one ``.cu`` source, compiled with its ``-D`` defines and cached per
    (device, kernel, template arguments): the one kernel cache of the package.

    ``kernel(device, name, *template_args)`` returns ``name<template_args...>`` (or the
    ``extern "C"`` kernel ``name`` without arguments). Templates listed in ``together`` are
    instantiated in one module with the same arguments (one NVRTC compile for all of them).
    """

    def __init__(self, source: str, defines: Optional[Mapping[str, int]] = None, together: Sequence[str] = ()):
        self.source = source
        self.defines = tuple(sorted((defines or {}).items()))
        self.together = tuple(together)
        self._cache: Dict[tuple, Kernel] = {}
        FAMILIES.append(self)

    def kernel(self, device: torch.device, name: str, *template_args) -> Kernel:
        index = _device_index(device)
        key = (index, name, template_args)
        k = self._cache.get(key)
        if k is None:
            k = self._cache[key] = self._compile(index, name, template_args)
        return k

    def _compile(self, index: int, name: str, template_args: tuple) -> Kernel:
        if template_args:
            group = self.together if name in self.together else (name,)
            templates = tuple(template(n, *template_args) for n in group)
            full = template(name, *template_args)
        else:
            templates, full = (), name
        module = _module(self.source, templates, self.defines, index)
        return Kernel(module.get_function(full), full, _parameters(read_source(self.source), full), index)


#: Every kernel family (tests reset their caches).
FAMILIES: list = []


def template(name: str, *args) -> str:
    """``name<a,b,...>`` with Python bools spelled as C++ ``true``/``false``, strings (type
    names such as :func:`ctype` gives) as they are and numbers as integers."""
    spelled = ("true" if a is True else "false" if a is False else a if isinstance(a, str) else str(int(a))
               for a in args)
    return f"{name}<{','.join(spelled)}>"


#: Storage types of the kernels (common.cuh): torch dtype -> C++ type name.
_CTYPES = {torch.float32: "float", torch.float16: "gf_half", torch.bfloat16: "gf_bf16"}


def ctype(dtype: torch.dtype) -> str:
    """The C++ storage type of ``dtype`` in the kernels (``float``, ``gf_half``, ``gf_bf16``)."""
    try:
        return _CTYPES[dtype]
    except KeyError:
        raise TypeError(f"the kernels store float32, float16 and bfloat16, not {dtype}") from None


@functools.lru_cache(maxsize=64)
def _external_stream(ptr: int, device_index: int):
    import cupy

    with warnings.catch_warnings():  # CuPy 14 deprecates ExternalStream; made once per stream
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        return cupy.cuda.ExternalStream(ptr, device_index)


def cupy_stream(device: torch.device):
    """CuPy's view of torch's current stream on ``device`` (for library calls such as cuSPARSE)."""
    index = _device_index(device)
    return _external_stream(_raw_stream(index), index)


# ----------------------------------------------------------------------------------------
# Grid sizing and alignment.

def next_pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 << max(0, (int(n) - 1).bit_length())


def cdiv(a: int, b: int) -> int:
    return -(-int(a) // int(b))


def aligned16(*tensors: Optional[Tensor]) -> bool:
    """True when every given tensor's data starts on a 16-byte boundary (None counts as aligned)."""
    return all(t is None or t.data_ptr() % 16 == 0 for t in tensors)


def vector_ok(vec: int, *tensors: Optional[Tensor]) -> bool:
    """Whether rows of ``vec`` elements of every given tensor can use common.cuh's vector
    accesses: each base address aligned to its access size, min(16, vec * element size)
    bytes (None counts as aligned). Row widths must be multiples of ``vec`` (the caller's)."""
    return all(t is None or t.data_ptr() % min(16, vec * t.element_size()) == 0 for t in tensors)


def bytes16(default: int) -> int:
    """Bytes per vector access of 16-bit rows: ``GNN_FASTPATH_VEC16`` when set, else the
    kernel family's ``default`` (8: 4 halves per lane, the float32 lane layout; 16: 8)."""
    forced = config.setting("GNN_FASTPATH_VEC16")
    return int(forced) if forced else default


def vector_width(F: int, *tensors: Optional[Tensor], vec16_bytes: int = 16, resolved: bool = False) -> int:
    """Elements per vector access for rows of width F over ``tensors``: 16 bytes of the
    narrowest dtype (4 floats; 8 halves, or 4 where :func:`bytes16` of ``vec16_bytes`` is 8)
    when F allows and every tensor is aligned, else 4 (8-byte 16-bit accesses, float4), else
    1 (scalar). ``resolved``: ``vec16_bytes`` is already the width to use (a plan read
    ``GNN_FASTPATH_VEC16``), not the family's default."""
    return _vector_width(F, _rows(tensors), vec16_bytes if resolved else bytes16(vec16_bytes))


def _rows(tensors: Sequence[Optional[Tensor]]) -> tuple:
    """(element size, base address mod 16) of each given tensor: all that the vector width
    reads of them (every access size is a power of two up to 16 bytes, so the address mod 16
    decides its alignment)."""
    return tuple([(t.element_size(), t.data_ptr() % 16) for t in tensors if t is not None])


# A pure function of few distinct arguments per run, asked on every launch: cached.
@functools.lru_cache(maxsize=4096)
def _vector_width(F: int, rows: tuple, vec16_bytes: int) -> int:
    """:func:`vector_width` of rows described by :func:`_rows`, ``vec16_bytes`` resolved."""
    narrowest = min([size for size, _ in rows]) if rows else 4
    widest = (vec16_bytes if narrowest == 2 else 16) // narrowest
    for vec in (widest, 4):
        if F % vec == 0 and all(align % min(16, vec * size) == 0 for size, align in rows):
            return vec
    return 1


@functools.lru_cache(maxsize=None)
def sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def l2_bytes(device: torch.device) -> int:
    """The L2 cache size of ``device`` in bytes."""
    return _l2_bytes(_device_index(device))


@functools.lru_cache(maxsize=None)
def _l2_bytes(device_index: int) -> int:
    size = getattr(torch.cuda.get_device_properties(device_index), "L2_cache_size", None)  # torch >= 2.5
    if size is None:
        import cupy

        size = cupy.cuda.Device(device_index).attributes["L2CacheSize"]
    return int(size)


def resident_blocks(k: Kernel, threads: int, shared_mem: int = 0) -> int:
    """Blocks of ``threads`` threads of ``k`` that fit on the whole GPU at once (cached on ``k``)."""
    key = (threads, shared_mem)
    n = k.resident.get(key)
    if n is None:
        from cupy.cuda import driver

        per_sm = driver.occupancyMaxActiveBlocksPerMultiprocessor(k.function.kernel.ptr, threads, shared_mem)
        n = k.resident[key] = max(1, int(per_sm)) * sm_count(k.device_index)
    return n


# ----------------------------------------------------------------------------------------
# Lane groups over feature rows (min/max reduction, SpMM, SDDMM: aggregation kernels).

def lane_groups(F: int, *tensors: Tensor, max_chunks: int = 1, vec16_bytes: int = 16,
                resolved: bool = False) -> Tuple[int, int, int, int]:
    """(VEC, T, CH, feature blocks) for rows of width F.

    VEC = :func:`vector_width` (16-byte loads: 4 floats or 8 halves, when F and every
    tensor's base address allow); T lanes per row (a power of two, up to a warp); CH chunks of VEC features per
    lane (at most ``max_chunks``, only with a full warp); one feature block
    (``blockIdx.y``) covers T * VEC * CH features. Wide rows therefore get several groups
    (F = 512, CH = 1: four warps with one 16-byte load per lane and edge), which keeps
    registers low and many rows in flight. ``vec16_bytes`` and ``resolved`` as
    :func:`vector_width`'s.
    """
    return _lane_groups(F, _rows(tensors), max_chunks, vec16_bytes if resolved else bytes16(vec16_bytes))


@functools.lru_cache(maxsize=4096)
def _lane_groups(F: int, rows: tuple, max_chunks: int, vec16_bytes: int) -> Tuple[int, int, int, int]:
    """:func:`lane_groups` of rows described by :func:`_rows`, ``vec16_bytes`` resolved."""
    vec = _vector_width(F, rows, vec16_bytes)
    width = F // vec
    lanes = min(32, next_pow2(max(width, 1)))
    chunks = 1
    while chunks < max_chunks and lanes * chunks < width:
        chunks *= 2
    return vec, lanes, chunks, cdiv(F, lanes * vec * chunks)


def group_grid(n_groups: int, lanes: int, feature_blocks: int, threads: int) -> Tuple[int, int]:
    """Grid for ``n_groups`` lane groups of ``lanes`` lanes over ``feature_blocks`` blocks."""
    return cdiv(n_groups, threads // lanes), feature_blocks
