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
// Storage types. Features are stored as float, IEEE half (gf_half) or bfloat16 (gf_bf16);
// arithmetic and every accumulator are float. The 16-bit types are plain bit patterns, so
// no cuda_fp16.h / cuda_bf16.h header is needed (NVRTC compiles without host headers);
// kernels templated on a storage type T get it from the launcher as "float", "gf_half" or
// "gf_bf16" (gnn_fastpath.cuda.launch.ctype).

struct __align__(2) gf_half {
    unsigned short bits;
};
struct __align__(2) gf_bf16 {
    unsigned short bits;
};

__device__ __forceinline__ float gf_to_float(float v) { return v; }
__device__ __forceinline__ float gf_to_float(gf_bf16 v) { return __uint_as_float((unsigned int)v.bits << 16); }
__device__ __forceinline__ float gf_to_float(gf_half v) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.bits));
    return f;
}

// Round to nearest even, as torch's .to(dtype) does; NaN stays NaN (quiet), infinities stay.
__device__ __forceinline__ void gf_from_float(float& d, float f) { d = f; }
__device__ __forceinline__ void gf_from_float(gf_half& d, float f) {
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(d.bits) : "f"(f));
}
__device__ __forceinline__ void gf_from_float(gf_bf16& d, float f) {
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        d.bits = (unsigned short)((u >> 16) | 0x40u);  // quiet NaN, sign kept
        return;
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    d.bits = (unsigned short)(u >> 16);
}

template <typename T>
__device__ __forceinline__ T gf_cast(float f) {
    T d;
    gf_from_float(d, f);
    return d;
}

// Scalar read-only load as float and scalar store from float, for any storage type.
__device__ __forceinline__ float gf_ldg(const float* p) { return __ldg(p); }
__device__ __forceinline__ float gf_ldg(const gf_half* p) {
    gf_half v;
    v.bits = __ldg(reinterpret_cast<const unsigned short*>(p));
    return gf_to_float(v);
}
__device__ __forceinline__ float gf_ldg(const gf_bf16* p) {
    gf_bf16 v;
    v.bits = __ldg(reinterpret_cast<const unsigned short*>(p));
    return gf_to_float(v);
}
template <typename T>
__device__ __forceinline__ void gf_st(T* p, float v) {
    gf_from_float(*p, v);
}

// The two 16-bit values of a 32-bit word (low half first, as they lie in memory).
template <typename T16>
__device__ __forceinline__ void gf_unpack2(float* r, unsigned int w) {
    T16 lo, hi;
    lo.bits = (unsigned short)(w & 0xffffu);
    hi.bits = (unsigned short)(w >> 16);
    r[0] = gf_to_float(lo);
    r[1] = gf_to_float(hi);
}
template <typename T16>
__device__ __forceinline__ unsigned int gf_pack2(const float* r) {
    const T16 lo = gf_cast<T16>(r[0]), hi = gf_cast<T16>(r[1]);
    return (unsigned int)lo.bits | ((unsigned int)hi.bits << 16);
}

// ---------------------------------------------------------------------------------------
// Vector loads and stores of VEC consecutive elements as float, one access of up to 16
// bytes per 16 bytes of data. float: VEC a multiple of 4 uses float4 accesses (16-byte
// aligned address); 16-bit types: VEC a multiple of 8 uses 16-byte, VEC = 4 8-byte and
// VEC = 2 4-byte accesses (aligned to the access size); any other VEC: scalar accesses.
// The launcher checks the alignment (gnn_fastpath.cuda.launch.vector_width).

template <int VEC>
__device__ __forceinline__ void gf_load(float* r, const float* __restrict__ p) {
    if constexpr (VEC % 4 == 0) {
#pragma unroll
        for (int i = 0; i < VEC; i += 4) {
            const float4 x = __ldg(reinterpret_cast<const float4*>(p + i));
            r[i] = x.x; r[i + 1] = x.y; r[i + 2] = x.z; r[i + 3] = x.w;
        }
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

// 16-bit storage: STREAM selects evict-first loads (__ldcs) instead of __ldg.
template <int VEC, bool STREAM, typename T16>
__device__ __forceinline__ void gf_load16(float* r, const T16* p) {
    if constexpr (VEC % 8 == 0) {
#pragma unroll
        for (int i = 0; i < VEC; i += 8) {
            const uint4* q = reinterpret_cast<const uint4*>(p + i);
            const uint4 w = STREAM ? __ldcs(q) : __ldg(q);
            gf_unpack2<T16>(r + i, w.x); gf_unpack2<T16>(r + i + 2, w.y);
            gf_unpack2<T16>(r + i + 4, w.z); gf_unpack2<T16>(r + i + 6, w.w);
        }
    } else if constexpr (VEC == 4) {
        const uint2* q = reinterpret_cast<const uint2*>(p);
        const uint2 w = STREAM ? __ldcs(q) : __ldg(q);
        gf_unpack2<T16>(r, w.x); gf_unpack2<T16>(r + 2, w.y);
    } else if constexpr (VEC == 2) {
        const unsigned int* q = reinterpret_cast<const unsigned int*>(p);
        gf_unpack2<T16>(r, STREAM ? __ldcs(q) : __ldg(q));
    } else {
        const unsigned short* q = reinterpret_cast<const unsigned short*>(p);
#pragma unroll
        for (int i = 0; i < VEC; ++i) {
            T16 v;
            v.bits = STREAM ? __ldcs(q + i) : __ldg(q + i);
            r[i] = gf_to_float(v);
        }
    }
}

template <int VEC>
__device__ __forceinline__ void gf_load(float* r, const gf_half* __restrict__ p) { gf_load16<VEC, false>(r, p); }
template <int VEC>
__device__ __forceinline__ void gf_load(float* r, const gf_bf16* __restrict__ p) { gf_load16<VEC, false>(r, p); }

// Rows read once: evict-first in L1 and L2, so gathered rows keep the cache.
template <int VEC>
__device__ __forceinline__ void gf_load_stream(float* r, const float* p) {
    if constexpr (VEC % 4 == 0) {
#pragma unroll
        for (int i = 0; i < VEC; i += 4) {
            const float4 x = __ldcs(reinterpret_cast<const float4*>(p + i));
            r[i] = x.x; r[i + 1] = x.y; r[i + 2] = x.z; r[i + 3] = x.w;
        }
    } else {
#pragma unroll
        for (int i = 0; i < VEC; ++i) r[i] = __ldcs(p + i);
    }
}
template <int VEC>
__device__ __forceinline__ void gf_load_stream(float* r, const gf_half* p) { gf_load16<VEC, true>(r, p); }
template <int VEC>
__device__ __forceinline__ void gf_load_stream(float* r, const gf_bf16* p) { gf_load16<VEC, true>(r, p); }

template <int VEC, bool STREAM, typename T16>
__device__ __forceinline__ void gf_store16(T16* p, const float* r) {
    if constexpr (VEC % 8 == 0) {
#pragma unroll
        for (int i = 0; i < VEC; i += 8) {
            const uint4 w = make_uint4(gf_pack2<T16>(r + i), gf_pack2<T16>(r + i + 2), gf_pack2<T16>(r + i + 4),
                                       gf_pack2<T16>(r + i + 6));
            uint4* q = reinterpret_cast<uint4*>(p + i);
            if constexpr (STREAM) __stcs(q, w); else *q = w;
        }
    } else if constexpr (VEC == 4) {
        const uint2 w = make_uint2(gf_pack2<T16>(r), gf_pack2<T16>(r + 2));
        uint2* q = reinterpret_cast<uint2*>(p);
        if constexpr (STREAM) __stcs(q, w); else *q = w;
    } else if constexpr (VEC == 2) {
        unsigned int* q = reinterpret_cast<unsigned int*>(p);
        if constexpr (STREAM) __stcs(q, gf_pack2<T16>(r)); else *q = gf_pack2<T16>(r);
    } else {
#pragma unroll
        for (int i = 0; i < VEC; ++i) gf_from_float(p[i], r[i]);
    }
}

template <int VEC>
__device__ __forceinline__ void gf_store(float* p, const float* r) {
    if constexpr (VEC % 4 == 0) {
#pragma unroll
        for (int i = 0; i < VEC; i += 4)
            *reinterpret_cast<float4*>(p + i) = make_float4(r[i], r[i + 1], r[i + 2], r[i + 3]);
    } else {
#pragma unroll
        for (int i = 0; i < VEC; ++i) p[i] = r[i];
    }
}
template <int VEC>
__device__ __forceinline__ void gf_store(gf_half* p, const float* r) { gf_store16<VEC, false>(p, r); }
template <int VEC>
__device__ __forceinline__ void gf_store(gf_bf16* p, const float* r) { gf_store16<VEC, false>(p, r); }

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
    if constexpr (VEC % 4 == 0) {
#pragma unroll
        for (int i = 0; i < VEC; i += 4)
            __stcs(reinterpret_cast<float4*>(p + i), make_float4(r[i], r[i + 1], r[i + 2], r[i + 3]));
    } else {
#pragma unroll
        for (int i = 0; i < VEC; ++i) __stcs(p + i, r[i]);
    }
}
template <int VEC>
__device__ __forceinline__ void gf_store_stream(gf_half* p, const float* r) { gf_store16<VEC, true>(p, r); }
template <int VEC>
__device__ __forceinline__ void gf_store_stream(gf_bf16* p, const float* r) { gf_store16<VEC, true>(p, r); }

// p[0..VEC) += r, atomically per element (float4 atomics on sm_90+, global memory).
// Gradients of 16-bit tensors accumulate into float scratch buffers through this and are
// cast once at the end: adding into 16-bit memory would round at every atomic.
template <int VEC>
__device__ __forceinline__ void gf_atomic_add(float* p, const float* r) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    constexpr bool vector = VEC % 4 == 0;
#else
    constexpr bool vector = false;
#endif
    if constexpr (vector) {
#pragma unroll
        for (int i = 0; i < VEC; i += 4)
            atomicAdd(reinterpret_cast<float4*>(p + i), make_float4(r[i], r[i + 1], r[i + 2], r[i + 3]));
    } else {
#pragma unroll
        for (int i = 0; i < VEC; ++i) atomicAdd(p + i, r[i]);
    }
}
