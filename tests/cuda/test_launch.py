"""Kernel launches on the CPU: parameter lists read from the .cu sources, and the named
arguments a launch converts and checks against them (no GPU needed)."""
import ctypes
import re

import pytest
import torch

from gnn_fastpath.cuda import launch, loader

SMALL = 'extern "C" __global__ void k(const float* __restrict__ x, long long n, float s, int4* items) {}'
#: A ``__global__`` definition, with or without ``__launch_bounds__``; group 1 is the name.
GLOBAL = re.compile(r"__global__\s+void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)\s*\(")


@pytest.fixture(scope="module")
def small_kernel():
    return launch.Kernel(function=None, name="k", params=launch._parameters(SMALL, "k"), device_index=0)


def test_pointer_of_none_is_null():
    assert launch._pointer(None) == 0
    x = torch.zeros(3)
    assert launch._pointer(x) == x.data_ptr()
    with pytest.raises(TypeError, match="tensor or None"):
        launch._pointer(x.data_ptr())  # a bare integer is not taken for a pointer


def test_arguments_convert_in_parameter_order(small_kernel):
    x = torch.zeros(4)
    args = {"items": None, "s": 0.5, "n": 2**40 + 3, "x": x}  # not in .cu order
    assert small_kernel.arguments(args) == (x.data_ptr(), 2**40 + 3, 0.5, 0)


def _packed(kernel, i, ctype):
    """The value of parameter i as the driver reads it: through its parameter pointer."""
    return ctype.from_address(kernel._param_ptrs[i]).value


def test_packed_values_are_what_the_kernel_reads():
    """Each parameter pointer of the buffer holds its value in the parameter's C type, at its
    native alignment (an int before a pointer leaves a gap), seeds wrapped to 64 bits."""
    src = ('extern "C" __global__ void k(int a, const float* p, unsigned int b, long long c, '
           'unsigned long long seed, float f, int4* q) {}')
    k = launch.Kernel(function=None, name="k", params=launch._parameters(src, "k"), device_index=0)
    x = torch.zeros(2)
    k.pack(k.arguments({"a": -7, "p": x, "b": 2**32 - 1, "c": -2**40, "seed": -1, "f": 0.25, "q": None}))
    types = (ctypes.c_int32, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_int64, ctypes.c_uint64, ctypes.c_float,
             ctypes.c_uint64)
    got = [_packed(k, i, t) for i, t in enumerate(types)]
    assert got == [-7, x.data_ptr(), 2**32 - 1, -2**40, 2**64 - 1, 0.25, 0]
    assert [k._param_ptrs[i] % ctypes.sizeof(t) for i, t in enumerate(types)] == [0] * 7
    with pytest.raises(OverflowError, match="k: a launch value does not fit"):
        k.pack(k.arguments({"a": 2**31, "p": x, "b": 0, "c": 0, "seed": 0, "f": 0.0, "q": None}))


def test_launch_dimensions():
    assert launch._dims(5) == (5, 1, 1) and launch._dims((2, 3)) == (2, 3, 1) and launch._dims([1, 2, 3]) == (1, 2, 3)
    with pytest.raises(ValueError, match="1 to 3 values"):
        launch._dims((1, 1, 1, 1))


def test_arguments_missing_name(small_kernel):
    with pytest.raises(TypeError, match=r"k: no value for parameter n\b"):
        small_kernel.arguments({"x": None, "s": 1.0, "items": None})


def test_arguments_unknown_name(small_kernel):
    with pytest.raises(TypeError, match=r"k: unknown parameters \['count'\]"):
        small_kernel.arguments({"x": None, "n": 1, "s": 1.0, "items": None, "count": 3})


def test_parameters_of_templates_and_every_scalar_type():
    src = ("template <int V, bool E>\n__global__ void __launch_bounds__(256, 2)\n"
           "t(int a, unsigned int b, long long c, unsigned long long seed, float f, const int* __restrict__ p) {}")
    params = launch._parameters(src, "t<4,true>")
    assert [p.name for p in params] == ["a", "b", "c", "seed", "f", "p"]
    assert "".join(p.code for p in params) == "iIqQfQ"
    values = [p.convert(v) for p, v in zip(params, (-1, 7, -2**40, -1, 0.25, None))]
    assert values == [-1, 7, -2**40, 2**64 - 1, 0.25, 0]  # seeds wrap to 64 bits, as the kernels read them
    with pytest.raises(LookupError, match="u is not defined"):
        launch._parameters(src, "u")
    with pytest.raises(TypeError, match="parameter d has type 'double'"):
        launch._parameters('extern "C" __global__ void k(double d) {}', "k")


def _kernels_by_source():
    out = []
    for path in sorted(loader.SOURCE_DIR.glob("*.cu")):
        text = loader.read_source(path.name)
        out += [(path.name, name) for name in GLOBAL.findall(text)]
    return out


def test_every_source_defines_kernels():
    sources = {name for name, _ in _kernels_by_source()}
    assert sources == {p.name for p in loader.SOURCE_DIR.glob("*.cu")}


@pytest.mark.parametrize("source,name", _kernels_by_source())
def test_every_kernel_has_a_launchable_parameter_list(source, name):
    """Each parameter is a pointer or a scalar type launches can pass (else a TypeError)."""
    params = launch._parameters(loader.read_source(source), name)
    assert params and len({p.name for p in params}) == len(params)  # named, no duplicates


def test_vector_width_follows_each_calls_alignment_and_dtypes():
    """The width depends on the rows' element sizes and base addresses; asked again (its
    answers are cached per description of the rows) with other rows, it follows them."""
    base = torch.zeros(64)
    half = torch.zeros(64, dtype=torch.float16)
    assert base.data_ptr() % 16 == 0 and half.data_ptr() % 16 == 0
    for _ in range(2):
        assert launch.vector_width(16, base, resolved=True) == 4
        assert launch.vector_width(16, base[1:17], resolved=True) == 1  # 4-byte aligned
        assert launch.vector_width(16, base, base[2:18], resolved=True) == 1
        assert launch.vector_width(16, half, vec16_bytes=16, resolved=True) == 8
        assert launch.vector_width(16, half, vec16_bytes=8, resolved=True) == 4
        assert launch.vector_width(16, half[4:20], vec16_bytes=16, resolved=True) == 4  # 8-byte aligned
        assert launch.vector_width(16, half, base[1:17], vec16_bytes=16, resolved=True) == 1
        assert launch.vector_width(6, half, None, vec16_bytes=16, resolved=True) == 1
        assert launch.lane_groups(512, base, base, max_chunks=2, resolved=True) == (4, 32, 2, 2)
        assert launch.lane_groups(512, base[1:513], max_chunks=2, resolved=True) == (1, 32, 2, 8)
