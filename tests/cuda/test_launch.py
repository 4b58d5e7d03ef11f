"""Kernel launches on the CPU: parameter lists read from the .cu sources, and the named
arguments a launch converts and checks against them (no GPU needed)."""
import re

import numpy as np
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
    assert launch._pointer(None) == 0 and isinstance(launch._pointer(None), np.uint64)
    x = torch.zeros(3)
    assert int(launch._pointer(x)) == x.data_ptr()
    with pytest.raises(TypeError, match="tensor or None"):
        launch._pointer(x.data_ptr())  # a bare integer is not taken for a pointer


def test_arguments_convert_in_parameter_order(small_kernel):
    x = torch.zeros(4)
    args = {"items": None, "s": 0.5, "n": 2**40 + 3, "x": x}  # not in .cu order
    values = small_kernel.arguments(args)
    assert [type(v) for v in values] == [np.uint64, np.int64, np.float32, np.uint64]
    assert [int(values[0]), int(values[1]), float(values[2]), int(values[3])] == [x.data_ptr(), 2**40 + 3, 0.5, 0]


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
    assert [name for name, _ in params] == ["a", "b", "c", "seed", "f", "p"]
    values = [convert(v) for (_, convert), v in zip(params, (-1, 7, -2**40, -1, 0.25, None))]
    assert [type(v) for v in values] == [np.int32, np.uint32, np.int64, np.uint64, np.float32, np.uint64]
    assert int(values[3]) == 2**64 - 1  # seeds wrap to 64 bits, as the kernels read them
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
    assert params and len({p for p, _ in params}) == len(params)  # named, no duplicates
