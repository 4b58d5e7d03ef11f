// Device helpers every kernel family shares: constants, lane-group reductions and the one
// family of vector loads and stores.
//
// NVRTC compiles these sources with no host headers: only builtin types and CUDA
// intrinsics here. The loader inlines `#include "x.cuh"` lines before compiling.
//
// Naming: shared helpers are gf_*; a family's own helpers and kernels carry the family's
// prefix (gatv2_, dot_, segment_reduce_, spmm_, gcn_norm_, csr_).
#pragma once

#define GF_FULL_MASK 0xffffffffu
// NVRTC has no <cmath>: spell infinity through its bit pattern.
#define GF_NEG_INF __int_as_float(0xff800000)
#define GF_INT_MAX 0x7fffffff

// ---------------------------------------------------------------------------------------
// Lane groups: W consecutive lanes (W a power of two <= 32, never straddling a warp).

// Mask of the W lanes of this thread's group within its warp.
template <int W>
__device__ __forceinline__ unsigned int gf_group_mask() {
    if constexpr (W == 32) {
        return GF_FULL_MASK;
    } else {
        const unsigned int base = (threadIdx.x & 31u) & ~(unsigned int)(W - 1);
        return ((1u << W) - 1u) << base;
    }
}

// Sum over the W lanes of a group; every lane of the group gets the sum. `mask` names the
// lanes taking part (the whole warp by default).
template <int W>
__device__ __forceinline__ float gf_group_sum(float v, unsigned int mask = GF_FULL_MASK) {
#pragma unroll
    for (int offset = W / 2; offset > 0; offset >>= 1) v += __shfl_xor_sync(mask, v, offset, W);
    return v;
}

// ---------------------------------------------------------------------------------------
// Vector loads and stores of VEC consecutive elements (VEC = 4: one 16-byte access, the
// address must be 16-byte aligned; otherwise VEC scalar accesses).

template <int VEC>
__device__ __forceinline__ void gf_load(float* r, const float* __restrict__ p) {
    if constexpr (VEC == 4) {
        const float4 x = __ldg(reinterpret_cast<const float4*>(p));
        r[0] = x.x; r[1] = x.y; r[2] = x.z; r[3] = x.w;
    } else {
#pragma unroll
        for (int i = 0; i < VEC; ++i) r[i] = __ldg(p + i);
    }
}

template <int VEC>
__device__ __forceinline__ void gf_load(int* r, const int* __restrict__ p) {
    if constexpr (VEC == 4) {
        const int4 x = __ldg(reinterpret_cast<const int4*>(p));
        r[0] = x.x; r[1] = x.y; r[2] = x.z; r[3] = x.w;
    } else {
#pragma unroll
        for (int i = 0; i < VEC; ++i) r[i] = __ldg(p + i);
    }
}

// Rows read once: evict-first in L1 and L2, so gathered rows keep the cache.
template <int VEC>
__device__ __forceinline__ void gf_load_stream(float* r, const float* p) {
    if constexpr (VEC == 4) {
        const float4 x = __ldcs(reinterpret_cast<const float4*>(p));
        r[0] = x.x; r[1] = x.y; r[2] = x.z; r[3] = x.w;
    } else {
#pragma unroll
        for (int i = 0; i < VEC; ++i) r[i] = __ldcs(p + i);
    }
}

template <int VEC>
__device__ __forceinline__ void gf_store(float* p, const float* r) {
    if constexpr (VEC == 4) {
        *reinterpret_cast<float4*>(p) = make_float4(r[0], r[1], r[2], r[3]);
    } else {
#pragma unroll
        for (int i = 0; i < VEC; ++i) p[i] = r[i];
    }
}

template <int VEC>
__device__ __forceinline__ void gf_store(int* p, const int* r) {
    if constexpr (VEC == 4) {
        *reinterpret_cast<int4*>(p) = make_int4(r[0], r[1], r[2], r[3]);
    } else {
#pragma unroll
        for (int i = 0; i < VEC; ++i) p[i] = r[i];
    }
}

// Rows written once: streaming stores.
template <int VEC>
__device__ __forceinline__ void gf_store_stream(float* p, const float* r) {
    if constexpr (VEC == 4) {
        __stcs(reinterpret_cast<float4*>(p), make_float4(r[0], r[1], r[2], r[3]));
    } else {
#pragma unroll
        for (int i = 0; i < VEC; ++i) __stcs(p + i, r[i]);
    }
}

// p[0..VEC) += r, atomically per element (one float4 atomic on sm_90+, global memory).
template <int VEC>
__device__ __forceinline__ void gf_atomic_add(float* p, const float* r) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    constexpr bool vector = VEC == 4;
#else
    constexpr bool vector = false;
#endif
    if constexpr (vector) {
        atomicAdd(reinterpret_cast<float4*>(p), make_float4(r[0], r[1], r[2], r[3]));
    } else {
#pragma unroll
        for (int i = 0; i < VEC; ++i) atomicAdd(p + i, r[i]);
    }
}
