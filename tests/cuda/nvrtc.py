"""NVRTC through ctypes, for compiling the kernels on a machine without a GPU.

NVRTC (CUDA's run-time compiler, the one CuPy drives on the GPU machine) needs no GPU: the
``nvidia-cuda-nvrtc-cu12`` wheel (a test dependency) ships it. ``compile_source`` returns
``(ok, log)``; ``available()`` says whether the library could be loaded.
"""
from __future__ import annotations

import ctypes
import functools
import glob
import importlib.util
import os
from typing import Optional, Sequence, Tuple

#: The GPU generation the device machine has (H100/H200): compile for it.
ARCH = "compute_90"


@functools.lru_cache(maxsize=1)
def _library() -> Optional[ctypes.CDLL]:
    spec = importlib.util.find_spec("nvidia.cuda_nvrtc")
    if spec is None or not spec.submodule_search_locations:
        return None
    libdir = os.path.join(list(spec.submodule_search_locations)[0], "lib")
    libs = sorted(glob.glob(os.path.join(libdir, "libnvrtc.so*")))
    if not libs:
        return None
    for builtins in sorted(glob.glob(os.path.join(libdir, "libnvrtc-builtins.so*"))):
        ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)  # libnvrtc dlopens it by name
    return ctypes.CDLL(libs[0])


def available() -> bool:
    return _library() is not None


def compile_source(text: str, name_expressions: Sequence[str], options: Sequence[str]) -> Tuple[bool, str]:
    """Compile CUDA C++ ``text`` for :data:`ARCH`, instantiating ``name_expressions``."""
    lib = _library()
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), text.encode(), b"kernel.cu", 0, None, None) != 0:
        return False, "nvrtcCreateProgram failed"
    try:
        for expr in name_expressions:
            lib.nvrtcAddNameExpression(prog, expr.encode())
        opts = [f"--gpu-architecture={ARCH}", *options]
        array = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
        status = lib.nvrtcCompileProgram(prog, len(opts), array)
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(max(size.value, 1))
        lib.nvrtcGetProgramLog(prog, log)
        return status == 0, log.value.decode(errors="replace")
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
