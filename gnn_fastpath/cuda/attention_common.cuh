// Device helpers the two attention families share (GATv2, dot-product): the online softmax
// state and the Philox dropout multiplier. Built on common.cuh.
//
// NVRTC compiles these sources with no host headers: only builtin types and CUDA
// intrinsics here. The loader inlines `#include "x.cuh"` lines before compiling.
#pragma once

#include "common.cuh"

// ---------------------------------------------------------------------------------------
// Online softmax: running max m and running sum l of exp(e - m) over the logits seen so
// far. An accumulator of weighted values lives beside the state; every time m grows it
// must be rescaled by the factor the helpers return.

// max that propagates NaN (fmaxf drops it): a NaN logit makes its row's softmax NaN, as in
// torch and both frameworks' stock layers.
__device__ __forceinline__ float gf_nan_max(float a, float b) {
    return (a != a || b != b) ? __int_as_float(0x7fc00000) : fmaxf(a, b);
}

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

// Raise the running max to cover a batch of logits whose largest is m_batch. Returns the
// factor the accumulator must be rescaled by (l is rescaled here); a state that has seen
// nothing finite and gets a batch of -inf stays empty (factor 1).
__device__ __forceinline__ float gf_softmax_rescale(GfSoftmaxState& s, float m_batch) {
    const float m_new = gf_nan_max(s.m, m_batch);
    const float scale = m_new == GF_NEG_INF ? 1.f : __expf(s.m - m_new);  // exp(-inf) = 0 at first
    s.l *= scale;
    s.m = m_new;
    return scale;
}

// Weight p = exp(logit - m) of one logit of the batch gf_softmax_rescale covered, added to
// the running sum; 0 for a -inf logit. Needs a finite m (a non-empty state).
__device__ __forceinline__ float gf_softmax_add(GfSoftmaxState& s, float logit) {
    const float p = __expf(logit - s.m);
    s.l += p;
    return p;
}

// Merge state `o` into `s`: the accumulators combine as acc_s * f_self + acc_o * f_other.
// Two empty states stay empty (factors 1 and 0).
__device__ __forceinline__ void gf_softmax_merge(GfSoftmaxState& s, const GfSoftmaxState& o, float& f_self,
                                                 float& f_other) {
    const float m_new = gf_nan_max(s.m, o.m);
    if (m_new == GF_NEG_INF) {
        f_self = 1.f;
        f_other = 0.f;
        return;
    }
    f_self = __expf(s.m - m_new);
    f_other = __expf(o.m - m_new);
    s.l = s.l * f_self + o.l * f_other;
    s.m = m_new;
}

// logsumexp of a finished state; -inf for an empty row (callers write 0 output then), NaN
// for a row that saw a NaN logit.
__device__ __forceinline__ float gf_softmax_lse(const GfSoftmaxState& s) {
    return s.l != 0.f ? s.m + __logf(s.l) : GF_NEG_INF;
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
