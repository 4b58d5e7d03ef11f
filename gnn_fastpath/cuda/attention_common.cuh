// Device helpers the attention families share: the online softmax state and the Philox
// dropout multiplier (GATv2, GAT, dot-product), and the head-row lane layout with its
// per-item finishing steps, chunk merge, attention-weight and delta_alpha passes of the
// row-attention kernels (GATv2, GAT). Built on common.cuh.
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

// The dropout stream of a kernel. GF_DEVICE_RNG is a compile-time choice (a -D define: the
// launchers compile a second module of each family, on first use, for an rng tensor) so the
// eager kernels carry none of its code.
//
// GF_DEVICE_RNG 0 (rng None, the eager path): the scalar (seed, offset) parameters, rng
// unread: no load, no barrier, no shared memory; the key stays a constant-bank operand.
//
// GF_DEVICE_RNG 1: (rng[0], rng[1]) replace the scalars (int64 [2], 16-byte aligned: the
// launcher sees to it). Scalars are baked into a captured CUDA graph; memory is read at every
// replay. Resolved once at kernel entry (by the block's thread 0: one 16-byte load, only with
// dropout) into shared memory and read where a mask is drawn (volatile: the read stays there).
// Held in registers across the edge loops, the key would cost the forwards registers and
// spills. Construct it before any thread can return: it syncs the block.
#ifndef GF_DEVICE_RNG
#define GF_DEVICE_RNG 0
#endif

#if GF_DEVICE_RNG
struct GfPhilox {
    const volatile unsigned long long* key;

    __device__ __forceinline__ GfPhilox(const long long* __restrict__ rng, float p, unsigned long long seed,
                                        unsigned long long offset) {
        __shared__ unsigned long long gf_philox_key[2];
        if (threadIdx.x == 0) {
            if (p > 0.f && rng != nullptr) {
                const longlong2 r = __ldg(reinterpret_cast<const longlong2*>(rng));
                seed = (unsigned long long)r.x;
                offset = (unsigned long long)r.y;
            }
            gf_philox_key[0] = seed;
            gf_philox_key[1] = offset;
        }
        __syncthreads();
        key = gf_philox_key;
    }
    __device__ __forceinline__ unsigned long long seed() const { return key[0]; }
    __device__ __forceinline__ unsigned long long offset() const { return key[1]; }
};
#else
struct GfPhilox {
    unsigned long long s, o;  // copies of the parameters: folded back into parameter reads

    __device__ __forceinline__ GfPhilox(const long long* __restrict__, float, unsigned long long seed,
                                        unsigned long long offset)
        : s(seed), o(offset) {}
    __device__ __forceinline__ unsigned long long seed() const { return s; }
    __device__ __forceinline__ unsigned long long offset() const { return o; }
};
#endif

// Online-softmax fold of one chunk's (m, l, acc) of a single column into a running state.
__device__ __forceinline__ void gf_softmax_fold(GfSoftmaxState& st, float& acc, float m2, float l2, float acc2) {
    GfSoftmaxState other;
    other.m = m2;
    other.l = l2;
    float f1, f2;
    gf_softmax_merge(st, other, f1, f2);
    acc = acc * f1 + acc2 * f2;
}

__device__ __forceinline__ float gf_lrelu(float z, float slope) { return z > 0.f ? z : z * slope; }

// Whether storage type T is float (then gradients of split rows are added into the output
// itself; 16-bit outputs get a float scratch instead). NVRTC has no <type_traits>.
template <typename T>
struct GfIsFloat {
    static constexpr bool value = false;
};
template <>
struct GfIsFloat<float> {
    static constexpr bool value = true;
};

// =======================================================================================
// Row attention (GATv2, GAT): one warp per (work item, head tile) over destination-major (or,
// for source-major backward passes, source-major) CSR rows.
//
// Lane mapping (template <VW, LH, K, DC>). A head's D columns are covered by LH lanes (a
// power of two); lane l of a head holds K vectors of VW elements (float: VW = 4, float4 loads,
// or VW = 1, the scalar path for any D; 16-bit: VW = 8, 16-byte loads, down to 4/2/1 as D and
// the alignment allow), at columns (l + LH * k) * VW. D is a multiple of VW, so a vector is
// either wholly inside the row or wholly masked. DC is the compile-time D of a specialised
// path (0: runtime D, columns past D masked). The warp holds G = 32 / LH lane groups; with
// HT = min(H, G) heads per tile, the G groups form ES = G / HT edge slots that walk
// interleaved edges of the same row (small H*D rows still use the whole warp), and rows with
// H > G are covered by ceil(H / HT) tiles, each its own warp. Shuffles are only ever executed
// by all 32 lanes: loop trip counts are warp-uniform, inactive lanes and tail edges carry
// zeros / -inf instead of branching around the shuffles.

template <int VW, int LH, int K, int DC>
struct GfRow {
    static constexpr int KV = K * VW;

    __device__ static __forceinline__ int col(int l, int k) { return (l + LH * k) * VW; }
    __device__ static __forceinline__ bool ok(int l, int k, int D) { return DC > 0 || col(l, k) < D; }

    // r <- base[columns of lane l] as float (zeros where masked or when !on).
    template <typename T>
    __device__ static __forceinline__ void load(float (&r)[KV], const T* __restrict__ base, int l, int D, bool on) {
#pragma unroll
        for (int k = 0; k < K; ++k) {
            if (on && ok(l, k, D)) {
                gf_load<VW>(r + VW * k, base + col(l, k));
            } else {
#pragma unroll
                for (int t = 0; t < VW; ++t) r[VW * k + t] = 0.f;
            }
        }
    }

    // base[columns of lane l] <- r, rounded once to T.
    template <typename T>
    __device__ static __forceinline__ void store(T* __restrict__ base, const float (&r)[KV], int l, int D) {
#pragma unroll
        for (int k = 0; k < K; ++k) {
            if (ok(l, k, D)) gf_store<VW>(base + col(l, k), r + VW * k);
        }
    }

    __device__ static __forceinline__ void atomic_add(float* base, const float (&r)[KV], int l, int D) {
#pragma unroll
        for (int k = 0; k < K; ++k) {
            if (ok(l, k, D)) gf_atomic_add<VW>(base + col(l, k), r + VW * k);
        }
    }

    // Sum over the row of a[c] * b[c] (this lane's columns; gf_group_sum<LH> completes it).
    __device__ static __forceinline__ float dot(const float (&a)[KV], const float (&b)[KV]) {
        float part = 0.f;
#pragma unroll
        for (int k = 0; k < KV; ++k) part = fmaf(a[k], b[k], part);
        return part;
    }
};

// Lane roles inside the warp for one head tile: lane, l (column lane within the head), s (edge
// slot), ES (slots), HT (heads per tile), head, hh (head within the tile), on (the lane holds
// a real (slot, head)).
struct GfLane {
    int lane, l, s, ES, HT, head, hh;
    bool on;
};

template <int LH>
__device__ __forceinline__ GfLane gf_lane(int H, int tile) {
    constexpr int G = 32 / LH;
    GfLane r;
    r.lane = threadIdx.x & 31;
    r.HT = H < G ? H : G;
    r.ES = G / r.HT;
    const int grp = r.lane / LH;
    r.l = r.lane % LH;
    r.s = grp / r.HT;
    r.hh = grp % r.HT;
    r.head = tile * r.HT + r.hh;
    r.on = r.s < r.ES && r.head < H;
    return r;
}

// One step of a row kernel's grid-stride loop over w = item * n_tiles + tile: the work
// item's row, edge range [start, end) and chunk slot (< 0: a whole row, else the slot of a
// split row's chunk), the head tile, and this lane's place in it (GfLane) with its head hc (0
// for lanes without one) and that head's first column hoff.
struct GfItem {
    int row, start, end, slot, tile;
    GfLane ln;
    int hc, hoff;
};

template <int LH>
__device__ __forceinline__ GfItem gf_item(const int4* __restrict__ items, long long w, int n_tiles, int H, int D) {
    const long long item = w / n_tiles;
    const int4 it = items[item];
    GfItem r;
    r.row = it.x;
    r.start = it.y;
    r.end = it.z;
    r.slot = it.w;
    r.tile = (int)(w - item * n_tiles);
    r.ln = gf_lane<LH>(H, r.tile);
    r.hc = r.ln.on ? r.ln.head : 0;
    r.hoff = r.hc * D;
    return r;
}

// Source lane of edge slot t for this lane's (head, column) position (clamped: only slot-0
// lanes use what they receive, and for them the source is always inside the warp).
__device__ __forceinline__ int gf_slot_src(const GfLane& ln, int t, int LH) {
    const int src = ln.lane + t * ln.HT * LH;
    return src < 32 ? src : ln.lane;
}

// Sum of the edge slots' copies of a[KV] into slot 0 (the other slots keep theirs).
template <int KV, int LH>
__device__ __forceinline__ void gf_sum_slots(float (&a)[KV], const GfLane& ln) {
    for (int t = 1; t < ln.ES; ++t) {
        const int src = gf_slot_src(ln, t, LH);
#pragma unroll
        for (int k = 0; k < KV; ++k) {
            const float a2 = __shfl_sync(GF_FULL_MASK, a[k], src);
            if (ln.s == 0) a[k] += a2;
        }
    }
}

// The same for two arrays at once (their shuffles interleaved).
template <int KV, int LH>
__device__ __forceinline__ void gf_sum_slots(float (&a)[KV], float (&b)[KV], const GfLane& ln) {
    for (int t = 1; t < ln.ES; ++t) {
        const int src = gf_slot_src(ln, t, LH);
#pragma unroll
        for (int k = 0; k < KV; ++k) {
            const float a2 = __shfl_sync(GF_FULL_MASK, a[k], src);
            const float b2 = __shfl_sync(GF_FULL_MASK, b[k], src);
            if (ln.s == 0) {
                a[k] += a2;
                b[k] += b2;
            }
        }
    }
}

// Merge the edge slots' online-softmax states and accumulators into slot 0.
template <int KV, int LH>
__device__ __forceinline__ void gf_merge_slots(GfSoftmaxState& st, float (&acc)[KV], const GfLane& ln) {
    for (int t = 1; t < ln.ES; ++t) {
        const int src = gf_slot_src(ln, t, LH);
        GfSoftmaxState other;
        other.m = __shfl_sync(GF_FULL_MASK, st.m, src);
        other.l = __shfl_sync(GF_FULL_MASK, st.l, src);
        float a2[KV];
#pragma unroll
        for (int k = 0; k < KV; ++k) a2[k] = __shfl_sync(GF_FULL_MASK, acc[k], src);
        if (ln.s == 0) {
            float f1, f2;
            gf_softmax_merge(st, other, f1, f2);
#pragma unroll
            for (int k = 0; k < KV; ++k) acc[k] = acc[k] * f1 + a2[k] * f2;
        }
    }
}

// Forward, end of one item (slot-0 lanes of real heads only; hoff = head * D): an unsplit row (slot < 0)
// stores out = acc / l and lse; a chunk of a split row stores its unnormalised state (acc,
// m, l) to workspace slot `slot` (merged by gf_merge_chunks). A row whose logits were all
// -inf gets NaN (torch's softmax does), a row without edges zeros and lse = -inf.
template <typename R, typename TO>
__device__ __forceinline__ void gf_fwd_finish(const GfLane& ln, const GfSoftmaxState& st, float (&acc)[R::KV], int row,
                                              int start, int end, int slot, int H, int D, int hoff,
                                              TO* __restrict__ out, float* __restrict__ lse,
                                              float* __restrict__ part_acc, float* __restrict__ part_m,
                                              float* __restrict__ part_l) {
    const int HD = H * D;
    if (slot < 0) {
        // l == 0 with edges: every logit was -inf, which torch's softmax turns into NaN
        const bool all_neg_inf = st.l == 0.f && end > start;
        const float inv = st.l != 0.f ? 1.f / st.l : (all_neg_inf ? __int_as_float(0x7fc00000) : 0.f);
#pragma unroll
        for (int k = 0; k < R::KV; ++k) acc[k] *= inv;
        R::store(out + (long long)row * HD + hoff, acc, ln.l, D);
        if (ln.l == 0) lse[(long long)row * H + ln.head] = all_neg_inf ? inv : gf_softmax_lse(st);
    } else {
        R::store(part_acc + (long long)slot * HD + hoff, acc, ln.l, D);
        if (ln.l == 0) {
            part_m[(long long)slot * H + ln.head] = st.m;
            part_l[(long long)slot * H + ln.head] = st.l;
        }
    }
}

// Backward, end of one item (slot-0 lanes of real heads only): a gradient row g of node
// `row`. Unsplit rows store it (T); chunks of split rows add it into `dst` itself when T is
// float (its split rows zeroed by the launcher), else into the float scratch `acc` at row
// acc_index[slot] (a zeroed [n_split, H, D] buffer the launcher casts into dst).
template <typename R, typename T>
__device__ __forceinline__ void gf_store_row_grad(T* dst, float* acc, const int* __restrict__ acc_index,
                                                  const float (&g)[R::KV], const GfLane& ln, int row, int slot,
                                                  int HD, int hoff, int D) {
    if (slot < 0) {
        R::store(dst + (long long)row * HD + hoff, g, ln.l, D);
    } else {
        if constexpr (GfIsFloat<T>::value) R::atomic_add(dst + (long long)row * HD + hoff, g, ln.l, D);
        else R::atomic_add(acc + (long long)acc_index[slot] * HD + hoff, g, ln.l, D);
    }
}

// delta[row, h] = <dO_row, O_row> over the head's columns (+ delta_alpha[row, h] when given):
// the softmax-gradient term of every destination row, for the passes that read it per edge
// (source-major and undirected backward). One warp per (row, head tile) of n_work = rows x
// n_tiles; only edge slot 0 works (a node-sized pass).
template <int VW, int LH, int K, int DC, typename TO>
__device__ __forceinline__ void gf_row_delta(long long n_work, int n_tiles, const TO* __restrict__ out,
                                             const TO* __restrict__ grad_out, const float* __restrict__ delta_alpha,
                                             int H, int D, float* __restrict__ delta) {
    using R = GfRow<VW, LH, K, DC>;
    constexpr int KV = R::KV;
    const int HD = H * D;
    const long long n_warps = ((long long)gridDim.x * blockDim.x) >> 5;
    for (long long w = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; w < n_work; w += n_warps) {
        const long long row = w / n_tiles;
        const int tile = (int)(w - row * n_tiles);
        const GfLane ln = gf_lane<LH>(H, tile);
        const bool on = ln.on && ln.s == 0;
        const int hc = on ? ln.head : 0;
        float o[KV], dO[KV];
        R::load(o, out + row * HD + hc * D, ln.l, D, on);
        R::load(dO, grad_out + row * HD + hc * D, ln.l, D, on);
        const float d = gf_group_sum<LH>(R::dot(dO, o));
        if (on && ln.l == 0) delta[row * H + hc] = d + (delta_alpha != nullptr ? delta_alpha[row * H + hc] : 0.f);
    }
}

// Dropout multipliers ds[u] for the U edges this lane's slot takes in one step (rounds r0 ..
// r0 + U - 1 of a batch of nb <= 32 edges whose caller ids lane q holds in my_pe), for its
// head. Each (edge, head) pair is drawn once: pair (u, g) of lane group g is computed by lane
// (u % LH) * G + g in pass u / LH, and the LH lanes of the head get it by shuffles, instead of
// every lane of the head running Philox for it. Pairs outside the row get 1.
template <int U, int LH>
__device__ __forceinline__ void gf_step_dropout(float (&ds)[U], const GfLane& ln, int my_pe, int r0, int rounds,
                                                int nb, int H, int tile, float p, unsigned long long seed,
                                                unsigned long long offset) {
    constexpr int G = 32 / LH;
    constexpr int NP = (U + LH - 1) / LH;
    const int grp = ln.lane % G;  // the lane group whose pairs this lane draws
    const int ps = grp / ln.HT;
    const int ph = tile * ln.HT + grp % ln.HT;
    float mine[NP];
#pragma unroll
    for (int c = 0; c < NP; ++c) {
        const int u = c * LH + ln.lane / G;
        const int q = (r0 + u) * ln.ES + ps;
        const bool ok = u < U && ps < ln.ES && ph < H && (r0 + u) < rounds && q < nb;
        const int pe = __shfl_sync(GF_FULL_MASK, my_pe, q & 31);
        const float d = gf_dropout_scale(p, seed, offset, (unsigned)pe, (unsigned)ph);
        mine[c] = ok ? d : 1.f;
    }
#pragma unroll
    for (int u = 0; u < U; ++u) ds[u] = __shfl_sync(GF_FULL_MASK, mine[u / LH], (u % LH) * G + ln.lane / LH);
}

// Sum of v over the heads of this lane's tile that share its edge slot; meaningful in the
// lanes of the tile's first head (hh == 0), which read lanes + k * LH, k < HT.
template <int LH>
__device__ __forceinline__ float gf_tile_head_sum(float v, const GfLane& ln) {
    float sum = v;
    for (int k = 1; k < ln.HT; ++k) {  // warp-uniform trip count
        const int src = ln.lane + k * LH;
        sum += __shfl_sync(GF_FULL_MASK, v, src < 32 ? src : ln.lane);
    }
    return sum;
}

// ---------------------------------------------------------------------------------------
// Merge the chunk states of split rows. split[r] = (row, first slot, number of chunks, 0);
// entries with 0 chunks (a static work list's unsplit rows, worklist.build_static) are skipped.
// Block (x, y) = (split row, 32-column tile), both grid-stride. Warp w folds chunks
// w, w + nwarps, ... of its 32 columns with an online (m, l, acc) merge, loading
// GF_MERGE_AHEAD chunks ahead of folding them, then warp 0 folds the warps' states from
// shared memory. Needs blockDim.x == THREADS.
#define GF_MERGE_AHEAD 4

template <typename TO, int THREADS>
__device__ __forceinline__ void gf_merge_chunks(const int4* __restrict__ split, int n_split,
                                                const float* __restrict__ part_acc, const float* __restrict__ part_m,
                                                const float* __restrict__ part_l, int H, int D,
                                                TO* __restrict__ out, float* __restrict__ lse) {
    constexpr int WARPS = THREADS / 32;
    __shared__ float sm_m[WARPS][32], sm_l[WARPS][32], sm_a[WARPS][32];
    const int HD = H * D;
    const int n_ctiles = (HD + 31) / 32;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int r = blockIdx.x; r < n_split; r += gridDim.x) {
        const int4 sp = split[r];
        const int row = sp.x, first = sp.y, n = sp.z;
        // A static work list's entries of unsplit rows (0 chunks) come after every split row's:
        // nothing is left for this block (block-uniform).
        if (n == 0) break;
        for (int t = blockIdx.y; t < n_ctiles; t += gridDim.y) {  // block-uniform loops
            const int c = t * 32 + lane;
            const bool on = c < HD;
            const int h = on ? c / D : 0;
            GfSoftmaxState st = gf_softmax_init();
            float acc = 0.f;
            for (int k0 = warp; k0 < n; k0 += WARPS * GF_MERGE_AHEAD) {
                float m2[GF_MERGE_AHEAD], l2[GF_MERGE_AHEAD], a2[GF_MERGE_AHEAD];
#pragma unroll
                for (int u = 0; u < GF_MERGE_AHEAD; ++u) {
                    const int k = k0 + u * WARPS;
                    const long long s = (long long)first + k;
                    const bool ok = on && k < n;
                    m2[u] = ok ? part_m[s * H + h] : GF_NEG_INF;
                    l2[u] = ok ? part_l[s * H + h] : 0.f;
                    a2[u] = ok ? part_acc[s * HD + c] : 0.f;
                }
#pragma unroll
                for (int u = 0; u < GF_MERGE_AHEAD; ++u) gf_softmax_fold(st, acc, m2[u], l2[u], a2[u]);
            }
            sm_m[warp][lane] = st.m;
            sm_l[warp][lane] = st.l;
            sm_a[warp][lane] = acc;
            __syncthreads();
            if (warp == 0 && on) {
                for (int w = 1; w < WARPS; ++w) gf_softmax_fold(st, acc, sm_m[w][lane], sm_l[w][lane], sm_a[w][lane]);
                // split rows have edges: l == 0 means every logit was -inf (torch: NaN)
                const float nan = __int_as_float(0x7fc00000);
                gf_st(out + (long long)row * HD + c, st.l != 0.f ? acc / st.l : nan);
                if (c == h * D) lse[(long long)row * H + h] = st.l != 0.f ? gf_softmax_lse(st) : nan;
            }
            __syncthreads();
        }
    }
}

// alpha[caller edge, h] <- exp(logits[caller edge, h] - lse[row, h]) (times the dropout
// multiplier and, when given, edge_weight[caller edge] when `dropped`), from the raw logits the
// forward wrote. For TO = float the launcher passes one buffer as both (in place: each element
// is read, then written, by one thread), hence no __restrict__ on them. One warp per work item.
template <typename TO>
__device__ __forceinline__ void gf_alpha_from_logits(const int4* __restrict__ items, long long n_items,
                                                     const int* __restrict__ perm, const float* __restrict__ lse,
                                                     int H, float p, unsigned long long seed,
                                                     unsigned long long offset, int dropped, const float* logits,
                                                     TO* alpha, const float* __restrict__ edge_weight) {
    const int lane = threadIdx.x & 31;
    const long long n_warps = ((long long)gridDim.x * blockDim.x) >> 5;
    for (long long w = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; w < n_items; w += n_warps) {
        const int4 it = items[w];
        for (long long e = (long long)it.y + lane; e < it.z; e += 32) {
            const int pe = perm[e];
            const float ew = (dropped && edge_weight != nullptr) ? edge_weight[pe] : 1.f;
            for (int h = 0; h < H; ++h) {
                const long long o = (long long)pe * H + h;
                float v = __expf(logits[o] - lse[(long long)it.x * H + h]);
                if (dropped) v *= gf_dropout_scale(p, seed, offset, (unsigned)pe, (unsigned)h) * ew;
                gf_st(alpha + o, v);
            }
        }
    }
}

// delta_alpha[row, h] = sum over the row's edges of alpha_out[e, h] * grad_alpha[e, h] (caller
// order): the softmax-gradient term contributed by a gradient on the returned attention. Rows
// split into chunks accumulate with atomics (delta_alpha must be zeroed). One warp per work item.
template <typename TO>
__device__ __forceinline__ void gf_delta_alpha(const int4* __restrict__ items, long long n_items,
                                               const int* __restrict__ perm, const TO* __restrict__ alpha,
                                               const TO* __restrict__ grad_alpha, int H,
                                               float* __restrict__ delta_alpha) {
    const int lane = threadIdx.x & 31;
    const long long n_warps = ((long long)gridDim.x * blockDim.x) >> 5;
    for (long long w = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; w < n_items; w += n_warps) {
        const int4 it = items[w];
        for (int h = 0; h < H; ++h) {
            float sum = 0.f;
            for (long long e = (long long)it.y + lane; e < it.z; e += 32) {
                const long long o = (long long)perm[e] * H + h;
                sum = fmaf(gf_to_float(alpha[o]), gf_to_float(grad_alpha[o]), sum);
            }
            sum = gf_group_sum<32>(sum);
            if (lane == 0 && it.z > it.y) {
                if (it.w < 0) delta_alpha[(long long)it.x * H + h] = sum;
                else atomicAdd(delta_alpha + (long long)it.x * H + h, sum);
            }
        }
    }
}
