// Shared device helpers for the aggregation kernels (segment_reduce.cu, edge_norm.cu).
//
// NVRTC compiles these with no host headers: builtin types and CUDA intrinsics only. The
// loader inlines `#include "x.cuh"` lines before compiling.
//
// Feature mapping used by every templated kernel here: a *group* of T lanes (T a power of
// two <= 32, never straddling a warp) serves one destination row (or one edge range); each
// lane owns CH chunks of VEC consecutive features, chunk c covering features
// fb + c*T*VEC + lane*VEC .. +VEC-1, where fb = blockIdx.y * T*VEC*CH is the feature block.
// VEC = 4 uses 16-byte loads and needs F % 4 == 0 and 16-byte aligned rows.
#pragma once

#define GA_NEG_INF __int_as_float(0xff800000)
#define GA_INT_MAX 0x7fffffff

// Mask of the T lanes of this thread's group within its warp.
template <int T>
__device__ __forceinline__ unsigned int ga_group_mask() {
    if constexpr (T == 32) {
        return 0xffffffffu;
    } else {
        const unsigned int base = (threadIdx.x & 31u) & ~(unsigned int)(T - 1);
        return ((1u << T) - 1u) << base;
    }
}

// Sum over the T lanes of a group; every lane gets the sum.
template <int T>
__device__ __forceinline__ float ga_group_sum(float v, unsigned int mask) {
#pragma unroll
    for (int offset = T / 2; offset > 0; offset >>= 1) v += __shfl_xor_sync(mask, v, offset, T);
    return v;
}

template <int VEC>
__device__ __forceinline__ void ga_load(const float* __restrict__ p, float* v) {
    if (VEC == 4) {
        const float4 t = __ldg(reinterpret_cast<const float4*>(p));
        v[0] = t.x; v[1] = t.y; v[2] = t.z; v[3] = t.w;
    } else {
#pragma unroll
        for (int j = 0; j < VEC; ++j) v[j] = __ldg(p + j);
    }
}

template <int VEC>
__device__ __forceinline__ void ga_store(float* p, const float* v) {
    if (VEC == 4) {
        *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
    } else {
#pragma unroll
        for (int j = 0; j < VEC; ++j) p[j] = v[j];
    }
}

template <int VEC>
__device__ __forceinline__ void ga_store_int(int* p, const int* v) {
    if (VEC == 4) {
        *reinterpret_cast<int4*>(p) = make_int4(v[0], v[1], v[2], v[3]);
    } else {
#pragma unroll
        for (int j = 0; j < VEC; ++j) p[j] = v[j];
    }
}

template <int VEC>
__device__ __forceinline__ void ga_load_int(const int* __restrict__ p, int* v) {
    if (VEC == 4) {
        const int4 t = __ldg(reinterpret_cast<const int4*>(p));
        v[0] = t.x; v[1] = t.y; v[2] = t.z; v[3] = t.w;
    } else {
#pragma unroll
        for (int j = 0; j < VEC; ++j) v[j] = __ldg(p + j);
    }
}

// The row (destination) holding CSR position k: the last r with indptr[r] <= k.
// Requires 0 <= k < indptr[n_rows].
__device__ __forceinline__ int ga_row_of(const int* __restrict__ indptr, int n_rows, int k) {
    int lo = 0, hi = n_rows;  // answer in [lo, hi)
    while (hi - lo > 1) {
        const int mid = lo + ((hi - lo) >> 1);
        if (__ldg(indptr + mid) <= k) lo = mid; else hi = mid;
    }
    return lo;
}

// DGL GraphConv degree scale of a structural degree (clamped to >= 1):
// mode 0: 1, mode 1: 1/d, mode 2: 1/sqrt(d).
__device__ __forceinline__ float ga_degree_scale(int degree, int mode) {
    if (mode == 0) return 1.f;
    const float d = (float)(degree > 1 ? degree : 1);
    return mode == 1 ? 1.f / d : 1.f / sqrtf(d);
}

// Order-preserving 32-bit key of a float: a < b (as floats, -0 == +0 after
// canonicalisation by the caller) iff key(a) < key(b). Key 0 is below every real value.
__device__ __forceinline__ unsigned int ga_order_key(float v) {
    const unsigned int u = __float_as_uint(v);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float ga_order_key_decode(unsigned int k) {
    const unsigned int u = (k & 0x80000000u) ? (k & 0x7fffffffu) : ~k;
    return __uint_as_float(u);
}
