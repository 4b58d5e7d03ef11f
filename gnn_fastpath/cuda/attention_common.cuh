// Shared device helpers for the fused attention kernels (GATv2, dot-product).
//
// NVRTC compiles these sources with no host headers: only builtin types and CUDA
// intrinsics here. The loader inlines `#include "x.cuh"` lines before compiling.
#pragma once

#define GF_FULL_MASK 0xffffffffu
// NVRTC has no <cmath>: spell infinity through its bit pattern.
#define GF_NEG_INF __int_as_float(0xff800000)

// ---------------------------------------------------------------------------------------
// Warp reductions.

__device__ __forceinline__ float gf_warp_sum(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(GF_FULL_MASK, v, offset);
    return v;
}

// Sum over aligned groups of `width` lanes (width a power of two <= 32); every lane of a
// group gets the group's sum.
template <int WIDTH>
__device__ __forceinline__ float gf_group_sum(float v) {
#pragma unroll
    for (int offset = WIDTH / 2; offset > 0; offset >>= 1) v += __shfl_xor_sync(GF_FULL_MASK, v, offset);
    return v;
}

__device__ __forceinline__ float gf_warp_max(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(GF_FULL_MASK, v, offset));
    return v;
}

// ---------------------------------------------------------------------------------------
// Online softmax state: running max m, running sum l of exp(e - m). Merging two partial
// states (m1, l1, acc1) and (m2, l2, acc2) rescales each by exp(m_k - m).

struct GfSoftmaxState {
    float m;
    float l;
};

__device__ __forceinline__ GfSoftmaxState gf_softmax_init() {
    GfSoftmaxState s;
    s.m = GF_NEG_INF;
    s.l = 0.f;
    return s;
}

// Add one logit; returns the factor the accumulator must be multiplied by before adding
// p * value, and writes p (the new term's weight relative to the new max).
__device__ __forceinline__ float gf_softmax_push(GfSoftmaxState& s, float logit, float& p) {
    float m_new = fmaxf(s.m, logit);
    float scale = __expf(s.m - m_new);  // exp(-inf) = 0 on the first edge
    p = __expf(logit - m_new);
    s.l = s.l * scale + p;
    s.m = m_new;
    return scale;
}

// logsumexp of a finished state; -inf for an empty row (callers write 0 output then).
__device__ __forceinline__ float gf_softmax_lse(const GfSoftmaxState& s) {
    return s.l > 0.f ? s.m + __logf(s.l) : GF_NEG_INF;
}

// ---------------------------------------------------------------------------------------
// Philox4x32-10 counter-based RNG (Salmon et al., SC'11): the same (seed, counter) always
// gives the same numbers, so forward and backward regenerate one dropout mask without
// storing it. Counter = (edge id, head, offset lo, offset hi).

__device__ __forceinline__ void gf_philox_round(unsigned int& c0, unsigned int& c1, unsigned int& c2,
                                                unsigned int& c3, unsigned int k0, unsigned int k1) {
    const unsigned int M0 = 0xD2511F53u, M1 = 0xCD9E8D57u;
    unsigned int hi0 = __umulhi(M0, c0), lo0 = M0 * c0;
    unsigned int hi1 = __umulhi(M1, c2), lo1 = M1 * c2;
    unsigned int n0 = hi1 ^ c1 ^ k0;
    unsigned int n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
}

// First of Philox's four 32-bit outputs for this counter, as a float in [0, 1).
__device__ __forceinline__ float gf_philox_uniform(unsigned long long seed, unsigned long long offset,
                                                   unsigned int edge, unsigned int head) {
    unsigned int c0 = edge, c1 = head, c2 = (unsigned int)offset, c3 = (unsigned int)(offset >> 32);
    unsigned int k0 = (unsigned int)seed, k1 = (unsigned int)(seed >> 32);
    const unsigned int W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
#pragma unroll
    for (int r = 0; r < 10; ++r) {
        gf_philox_round(c0, c1, c2, c3, k0, k1);
        k0 += W0;
        k1 += W1;
    }
    return (c0 >> 8) * (1.0f / 16777216.0f);  // 24 random bits
}

// Inverted-dropout multiplier for attention weight (edge, head): 0 with probability p,
// else 1 / (1 - p). `edge` is the caller's edge id so the mask does not depend on layout.
__device__ __forceinline__ float gf_dropout_scale(float p, unsigned long long seed, unsigned long long offset,
                                                  unsigned int edge, unsigned int head) {
    if (p <= 0.f) return 1.f;
    return gf_philox_uniform(seed, offset, edge, head) >= p ? 1.f / (1.f - p) : 0.f;
}
