"""Compiled kernels and their launches: the one kernel cache, argument checking, grid sizing.

A :class:`Kernel` is a compiled CUDA function plus its parameter list, read from the .cu
source text. Launches pass arguments by the .cu parameter names; each value is converted to
the parameter's C type (pointers from tensors or None, ``int``, ``long long``,
``unsigned long long``, ``float``), and a missing or unknown name is a TypeError at the
launch, not a silently misread argument. Constants the .cu and the Python side share are
passed as ``-D`` defines by the launcher modules (:class:`Family`), so each lives in one place.

Every launch goes on torch's current CUDA stream of the kernel's device, with no host
synchronisation; CuPy raises on a failed launch (bad configuration, too many resources).
"""
from __future__ import annotations

import functools
import re
import warnings
from typing import Callable, Dict, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor

from .. import config
from .loader import read_source

_COMPILE_OPTIONS = ("-std=c++17",)
_U64_MASK = (1 << 64) - 1


_NULL = np.uint64(0)


def _pointer(value) -> np.uint64:
    if value is None:
        return _NULL
    try:
        return np.uint64(value.data_ptr())
    except AttributeError:
        raise TypeError(f"expected a tensor or None for a pointer parameter, got {type(value).__name__}") from None


#: C parameter types the kernels use -> converter to the launch argument.
_SCALARS: Dict[str, Callable] = {
    "int": np.int32,
    "unsigned int": np.uint32,
    "long long": np.int64,
    "unsigned long long": lambda v: np.uint64(int(v) & _U64_MASK),
    "float": np.float32,
}


def _parameters(source_text: str, name: str) -> Tuple[Tuple[str, Callable], ...]:
    """(parameter name, converter) of kernel ``name`` (template arguments stripped), read
    from its ``__global__`` definition in the inlined source."""
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
            params.append((pname, _pointer))
            continue
        key = " ".join(ctype)
        if key not in _SCALARS:
            raise TypeError(f"kernel {base}: parameter {pname} has type {key!r}, which launches cannot pass")
        params.append((pname, _SCALARS[key]))
    return tuple(params)


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
    """One compiled kernel on one device; call :meth:`launch` with named arguments."""

    def __init__(self, function, name: str, params: Tuple[Tuple[str, Callable], ...], device_index: int):
        self.function = function
        self.name = name
        self.params = params
        self.device_index = device_index
        self._names = frozenset(p for p, _ in params)
        self.resident: Dict[Tuple[int, int], int] = {}  # (threads, shared memory) -> resident blocks

    def arguments(self, args: Mapping[str, object]) -> tuple:
        """The launch tuple for ``args`` (parameter name -> value), in the .cu order."""
        try:
            values = tuple([convert(args[p]) for p, convert in self.params])
        except KeyError as exc:
            raise TypeError(f"{self.name}: no value for parameter {exc.args[0]}") from None
        if len(args) != len(self.params):
            extra = sorted(set(args) - self._names)
            raise TypeError(f"{self.name}: unknown parameters {extra}")
        return values

    def launch(self, grid, block, *, shared_mem: int = 0, **args) -> None:
        """Launch on torch's current stream of this kernel's device."""
        index = self.device_index
        stream = _external_stream(torch.cuda.current_stream(index).cuda_stream, index)
        values = self.arguments(args)
        grid = tuple(grid) if isinstance(grid, (tuple, list)) else (grid,)
        block = tuple(block) if isinstance(block, (tuple, list)) else (block,)
        if torch.cuda.current_device() == index:
            self.function.kernel(grid, block, values, shared_mem, stream)
        else:
            import cupy

            with cupy.cuda.Device(index):
                self.function.kernel(grid, block, values, shared_mem, stream)


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
    return _external_stream(torch.cuda.current_stream(index).cuda_stream, index)


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


def vector_width(F: int, *tensors: Optional[Tensor], vec16_bytes: int = 16) -> int:
    """Elements per vector access for rows of width F over ``tensors``: 16 bytes of the
    narrowest dtype (4 floats; 8 halves, or 4 where :func:`bytes16` of ``vec16_bytes`` is 8)
    when F allows and every tensor is aligned, else 4 (8-byte 16-bit accesses, float4), else
    1 (scalar)."""
    sizes = [t.element_size() for t in tensors if t is not None]
    narrowest = min(sizes) if sizes else 4
    widest = (bytes16(vec16_bytes) if narrowest == 2 else 16) // narrowest
    for vec in (widest, 4):
        if F % vec == 0 and vector_ok(vec, *tensors):
            return vec
    return 1


@functools.lru_cache(maxsize=None)
def sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


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

def lane_groups(F: int, *tensors: Tensor, max_chunks: int = 1, vec16_bytes: int = 16) -> Tuple[int, int, int, int]:
    """(VEC, T, CH, feature blocks) for rows of width F.

    VEC = :func:`vector_width` (16-byte loads: 4 floats or 8 halves, when F and every
    tensor's base address allow); T lanes per row (a power of two, up to a warp); CH chunks of VEC features per
    lane (at most ``max_chunks``, only with a full warp); one feature block
    (``blockIdx.y``) covers T * VEC * CH features. Wide rows therefore get several groups
    (F = 512, CH = 1: four warps with one 16-byte load per lane and edge), which keeps
    registers low and many rows in flight.
    """
    vec = vector_width(F, *tensors, vec16_bytes=vec16_bytes)
    width = F // vec
    lanes = min(32, next_pow2(max(width, 1)))
    chunks = 1
    while chunks < max_chunks and lanes * chunks < width:
        chunks *= 2
    return vec, lanes, chunks, cdiv(F, lanes * vec * chunks)


def group_grid(n_groups: int, lanes: int, feature_blocks: int, threads: int) -> Tuple[int, int]:
    """Grid for ``n_groups`` lane groups of ``lanes`` lanes over ``feature_blocks`` blocks."""
    return cdiv(n_groups, threads // lanes), feature_blocks
