"""common.cuh's storage types on the GPU: float -> gf_half / gf_bf16 -> float conversions and
the vector loads and stores, bit for bit against torch's ``.to(dtype)``.

A test kernel compiled here from a source string (common.cuh inlined by the loader) stores
float inputs into a 16-bit (or float) buffer with one of the store helpers and loads them
back with one of the load helpers, VEC elements per thread, for every VEC the kernels use
(1, 2, 4, 8, 16: scalar, 4-, 8- and 16-byte accesses) and both load flavours (__ldg /
evict-first) and store flavours (plain / streaming), plus the scalar gf_st / gf_ldg and
gf_cast / gf_to_float. Inputs: zeros of both signs, +-inf, NaNs, float32 subnormals, fp16
subnormals, the largest finite values and the overflow boundary, exact ties (round half to
even), and a million random float32 bit patterns. Expected: the stored bits equal torch's
conversion (any NaN for a NaN), and the loaded floats equal the stored values exactly.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from gnn_fastpath.cuda import launch, loader

pytestmark = pytest.mark.cuda

_KERNELS = r"""
// FLAVOUR 0: gf_store / gf_load (__ldg); 1: gf_store_stream / gf_load_stream (evict-first);
// 2: the scalar helpers (gf_st and gf_cast on even / odd elements; gf_ldg and gf_to_float).
template <typename T, int VEC, int FLAVOUR>
__global__ void storage_store(const float* __restrict__ in, T* __restrict__ mid, int n_vec) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n_vec) return;
    const long long i = (long long)t * VEC;
    float r[VEC];
#pragma unroll
    for (int j = 0; j < VEC; ++j) r[j] = in[i + j];
    if (FLAVOUR == 0) {
        gf_store<VEC>(mid + i, r);
    } else if (FLAVOUR == 1) {
        gf_store_stream<VEC>(mid + i, r);
    } else {
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
            if (j % 2 == 0) gf_st(mid + i + j, r[j]); else mid[i + j] = gf_cast<T>(r[j]);
        }
    }
}

template <typename T, int VEC, int FLAVOUR>
__global__ void storage_load(const T* __restrict__ mid, float* __restrict__ out, int n_vec) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n_vec) return;
    const long long i = (long long)t * VEC;
    float q[VEC];
    if (FLAVOUR == 0) {
        gf_load<VEC>(q, mid + i);
    } else if (FLAVOUR == 1) {
        gf_load_stream<VEC>(q, mid + i);
    } else {
#pragma unroll
        for (int j = 0; j < VEC; ++j) q[j] = j % 2 == 0 ? gf_ldg(mid + i + j) : gf_to_float(mid[i + j]);
    }
#pragma unroll
    for (int j = 0; j < VEC; ++j) out[i + j] = q[j];
}
"""
# Two kernels: the read-only (__ldg) path must not read what the same kernel wrote.

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
VECS = {torch.float16: (1, 2, 4, 8, 16), torch.bfloat16: (1, 2, 4, 8, 16), torch.float32: (1, 4, 8)}
FLAVOURS = (0, 1, 2)
_modules = {}


def _kernels(dtype, vec, flavour):
    """(store, load) kernels of one (storage type, VEC, flavour)."""
    import cupy

    key = (dtype, vec, flavour)
    if key not in _modules:
        names = [launch.template(k, launch.ctype(dtype), vec, flavour) for k in ("storage_store", "storage_load")]
        source = loader.read_source("common.cuh") + "\n" + _KERNELS
        module = cupy.RawModule(code=source, options=("-std=c++17",), name_expressions=names)
        _modules[key] = tuple(module.get_function(n) for n in names)
    return _modules[key]


def _bits(v: int) -> float:
    return float(np.array([v], dtype=np.uint32).view(np.float32)[0])


def _inputs() -> torch.Tensor:
    special = [0.0, -0.0, float("inf"), float("-inf"), float("nan"), -float("nan"), 1.0, -1.0,
               _bits(0x7fc00001), _bits(0xff800001), _bits(0x7f800001),   # NaNs with payloads (quiet and signalling)
               _bits(0x00000001), _bits(0x807fffff), _bits(0x00400000),   # float32 subnormals
               2.0 ** -24, 3 * 2.0 ** -25, 2.0 ** -25, 2.0 ** -26, 2.0 ** -14 - 2.0 ** -24,  # fp16 subnormal range
               65504.0, 65519.99, 65520.0, -65520.0, 1e5,                      # fp16 max, overflow boundary
               _bits(0x7f7fffff), _bits(0x7f7f8000), _bits(0x7f7f7fff),       # bf16 overflow boundary
               1.0 + 2.0 ** -11, 1.0 + 3 * 2.0 ** -11, -(1.0 + 2.0 ** -11),   # fp16 ties to even
               _bits(0x3f808000), _bits(0x3f818000), _bits(0x3f808001),       # bf16 ties to even (and just above)
               _bits(0xbf808000), _bits(0x00008000), _bits(0x00018000)]       # negative tie, subnormal ties
    gen = torch.Generator().manual_seed(0)
    rand_bits = torch.randint(-2 ** 31, 2 ** 31, (1 << 20,), generator=gen, dtype=torch.int64).to(torch.int32)
    values = torch.cat([torch.tensor(special, dtype=torch.float32), rand_bits.view(torch.float32),
                        torch.randn(4096, generator=gen) * 1e3, torch.randn(4096, generator=gen) * 1e-6])
    n = values.numel()
    pad = (-n) % 16
    return torch.cat([values, torch.zeros(pad)]).cuda()


@pytest.fixture(scope="module")
def inputs():
    return _inputs()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_roundtrip(inputs, dtype, flavour):
    want = inputs.to(dtype)
    for vec in VECS[dtype]:
        mid = torch.empty(inputs.numel(), dtype=dtype, device="cuda")
        out = torch.empty_like(inputs)
        n_vec = inputs.numel() // vec
        store, load = _kernels(dtype, vec, flavour)
        grid = (launch.cdiv(n_vec, 128),)
        torch.cuda.synchronize()  # CuPy launches on its own current stream
        store(grid, (128,), (np.uint64(inputs.data_ptr()), np.uint64(mid.data_ptr()), np.int32(n_vec)))
        load(grid, (128,), (np.uint64(mid.data_ptr()), np.uint64(out.data_ptr()), np.int32(n_vec)))
        import cupy

        cupy.cuda.get_current_stream().synchronize()
        label = f"{dtype}, VEC={vec}, flavour={flavour}"
        nan = torch.isnan(want)
        assert torch.equal(torch.isnan(mid), nan), f"{label}: NaN positions differ"
        ibits = torch.int16 if dtype != torch.float32 else torch.int32
        same = mid.view(ibits) == want.view(ibits)
        bad = ~(same | nan)
        if bad.any():
            i = int(torch.nonzero(bad)[0])
            raise AssertionError(f"{label}: {int(bad.sum())} values round differently, first: {inputs[i].item()!r} "
                                 f"-> {mid[i].item()!r}, torch {want[i].item()!r}")
        # the loads give back exactly the stored values (NaN stays NaN)
        back = mid.float()
        assert torch.equal(torch.isnan(out), nan), f"{label}: load changed NaN-ness"
        assert torch.equal(out[~nan], back[~nan]), f"{label}: loads differ from the stored values"
        # signs of zeros survive both ways
        zeros = (want == 0) & ~nan
        assert torch.equal(torch.signbit(out[zeros]), torch.signbit(want[zeros].float())), f"{label}: zero signs"
