// Fused dot-product (Graph Transformer, PyG TransformerConv) attention: forward and backward.
//
//   e_ij = scale * <q_i, k_j + t_ij>,  alpha_ij = softmax_j(e_ij),  O_i = sum_j alpha_ij s_ij (v_j + t_ij)
//
// per head, over the in-edges j -> i of each destination i (destination-major CSR). edge_term (t) is the
// optional edge term in the caller's edge order (read through perm), s_ij the inverted
// dropout multiplier regenerated from (seed, offset, caller edge id, head) by Philox.
//
// Work mapping. A group of LPH lanes (a power of two <= 32) owns NH heads of one row; each
// lane holds, per head, NV vectors of VEC floats, interleaved so the LPH lanes read
// consecutive 16-byte pieces (coalesced). A warp covers 32 / LPH groups of the SAME row, so
// every lane of a warp runs the same edge loop: all shuffles use the full mask and are
// tail-safe (lanes past the head count or the head width hold zeros and still take part).
// A warp's row comes from the row-chunk work list (int4 items: row, first edge, end edge,
// partial slot; gnn_fastpath/cuda/worklist.py): long rows are cut into chunks that write partial states
// (forward: m, l, acc; backward: gradient sums) into slots merged by a second small kernel,
// so a super node does not serialise on one warp.
//
// Edge loop: a window of LPH edges is read lane-parallel (source id, caller id, dropout
// multiplier, per-destination scalars), then consumed in batches of UB edges whose rows are
// gathered together (several 16-byte loads in flight per lane) and broadcast by shuffles.
// Rows read or written once (q, O, dO, edge terms, outputs) use cache-streaming hints so the
// gathered k/v (or q/dO) rows keep the L2.
//
// Template parameters: TI, the storage type of q, k, v, edge_term and of their gradients, and
// TO, that of out and the attention weights (and so of grad_out and grad_alpha): "float",
// "gf_half" or "gf_bf16" (common.cuh), TO either TI or float. Every logit, softmax state,
// accumulator and saved statistic (lse, delta) is float whatever TI is; rows are converted to
// float as they are loaded and rounded once when stored. VEC elements per vector access (float:
// 4 = float4, every row 16-byte aligned; 16-bit: 8 = 16 bytes, 4 = 8 bytes; 1: scalar), LPH,
// NV, NH, EXACT (D == VEC * LPH * NV known at compile time; otherwise the runtime D masks the
// tail). All index arithmetic on feature rows is 64-bit (M * H * D may exceed 2**31); CSR
// indices are int32. Gradients summed with atomics (dk, dv in the atomic backward) go into
// float buffers: the launcher casts them to TI once (adding into 16-bit memory would round at
// every atomic).

#include "attention_common.cuh"

// The block size comes from the launcher (-D define), so Python and CUDA agree on it.
#ifndef DOT_THREADS
#error "DOT_THREADS must be defined by the launcher"
#endif

// Tuning knobs (compile-time; a -D define overrides the default).
// Floats per lane gathered per batch and row tensor: sets edges per batch (UB).
#ifndef DOT_EDGE_FLOATS
#define DOT_EDGE_FLOATS 16
#endif
#ifndef DOT_EDGE_FLOATS_SRC
#define DOT_EDGE_FLOATS_SRC DOT_EDGE_FLOATS
#endif
// __launch_bounds__ minimum resident blocks of 256 threads per SM: 3 caps registers at 80,
// trading a few spilled bytes for occupancy (more gathers in flight).
#ifndef DOT_MIN_BLOCKS_FWD
#define DOT_MIN_BLOCKS_FWD 3
#endif
#ifndef DOT_MIN_BLOCKS_DST
#define DOT_MIN_BLOCKS_DST 3
#endif
#ifndef DOT_MIN_BLOCKS_SRC
#define DOT_MIN_BLOCKS_SRC 3
#endif

// Where one lane's elements live inside a node row of H * D elements (of any storage type;
// registers hold them as float). A group of LPH lanes owns
// NH heads of the row; lane `sub` of the group holds, per head, NV vectors of VEC floats
// (vector j at position j * LPH + sub of the head, so a group's loads are contiguous). A
// warp holds HPW = 32 / LPH groups, i.e. HPB = HPW * NH heads of one row. Register arrays of
// one row are laid out [NH][NV][VEC] (R floats per lane).
template <int VEC, int LPH, int NV, int NH, bool EXACT, int EDGE_FLOATS = DOT_EDGE_FLOATS>
struct DotLanes {
    static constexpr int F = VEC * NV;    // floats per lane per head
    static constexpr int R = F * NH;      // floats per lane per node row
    static constexpr int HPW = 32 / LPH;  // head groups per warp
    static constexpr int HPB = HPW * NH;  // heads per warp
    static constexpr int U = EDGE_FLOATS / R < 1 ? 1 : (EDGE_FLOATS / R > 8 ? 8 : EDGE_FLOATS / R);
    static constexpr int UB = U < LPH ? U : LPH;  // edges per gather batch; divides LPH

    int sub;           // lane within the head group
    int gbase;         // first lane of the head group
    int h[NH];         // heads
    bool head_ok[NH];  // h < H
    int col[NH][NV];   // float offset inside the node row
    bool ok[NH][NV];   // this vector exists (head in range, inside D)

    __device__ __forceinline__ DotLanes(int lane, int head_block, int H, int D) {
        sub = lane & (LPH - 1);
        gbase = lane & ~(LPH - 1);
#pragma unroll
        for (int n = 0; n < NH; ++n) {
            h[n] = head_block * HPB + n * HPW + lane / LPH;
            head_ok[n] = h[n] < H;
#pragma unroll
            for (int j = 0; j < NV; ++j) {
                const int vi = j * LPH + sub;
                ok[n][j] = head_ok[n] && (EXACT || vi * VEC < D);
                col[n][j] = h[n] * D + vi * VEC;
            }
        }
    }

    // MODE 0: plain read-only load; 1: streaming (row read once). T: the row's storage type.
    template <int MODE = 0, typename T>
    __device__ __forceinline__ void load(float* r, const T* __restrict__ row) const {
#pragma unroll
        for (int n = 0; n < NH; ++n)
#pragma unroll
            for (int j = 0; j < NV; ++j) {
                float* x = r + n * F + j * VEC;
                if (ok[n][j]) {
                    if constexpr (MODE == 1)
                        gf_load_stream<VEC>(x, row + col[n][j]);
                    else
                        gf_load<VEC>(x, row + col[n][j]);
                } else {
#pragma unroll
                    for (int i = 0; i < VEC; ++i) x[i] = 0.f;
                }
            }
    }

    // Rounds to the row's storage type T.
    template <bool STREAM = false, typename T>
    __device__ __forceinline__ void store(T* row, const float* r) const {
#pragma unroll
        for (int n = 0; n < NH; ++n)
#pragma unroll
            for (int j = 0; j < NV; ++j) {
                if (!ok[n][j]) continue;
                if constexpr (STREAM)
                    gf_store_stream<VEC>(row + col[n][j], r + n * F + j * VEC);
                else
                    gf_store<VEC>(row + col[n][j], r + n * F + j * VEC);
            }
    }

    __device__ __forceinline__ void atomic_add(float* row, const float* r) const {
#pragma unroll
        for (int n = 0; n < NH; ++n)
#pragma unroll
            for (int j = 0; j < NV; ++j)
                if (ok[n][j]) gf_atomic_add<VEC>(row + col[n][j], r + n * F + j * VEC);
    }

    // out[n] = <a, b> over head n's floats of the group (every lane of the group gets it).
    __device__ __forceinline__ static void dots(const float* a, const float* b, float* out) {
#pragma unroll
        for (int n = 0; n < NH; ++n) {
            float d = 0.f;
#pragma unroll
            for (int f = 0; f < F; ++f) d = fmaf(a[n * F + f], b[n * F + f], d);
            out[n] = d;
        }
#pragma unroll
        for (int n = 0; n < NH; ++n) out[n] = gf_group_sum<LPH>(out[n]);
    }
};

// One record of a chunk list (int4): edges [e0, e1) of `row`; slot < 0 writes the result
// directly, slot >= 0 writes a partial state into that slot. One 16-byte load per warp.
struct DotChunk {
    int row;
    int slot;
    long long e0;
    long long e1;
};

__device__ __forceinline__ DotChunk dot_chunk(const int4* __restrict__ items, long long c) {
    const int4 x = __ldg(items + c);
    DotChunk r;
    r.row = x.x;
    r.e0 = x.y;
    r.e1 = x.z;
    r.slot = x.w;
    return r;
}

__device__ __forceinline__ long long dot_warp_id() {
    return ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
}

// Gathers one batch of edge rows: x[u] = base[row u] (+ t[cid u] when t is given) and y[u]
// likewise from base2; zeros for dead slots. The three may have different storage types.
template <class L, int UB, typename TA, typename TB, typename TE>
__device__ __forceinline__ void dot_gather(const L& ln, float (*x)[L::R], float (*y)[L::R],
                                           const TA* __restrict__ base, const TB* __restrict__ base2,
                                           const TE* __restrict__ edge_term, const int* rows, const int* cid,
                                           const bool* live, long long HD) {
#pragma unroll
    for (int u = 0; u < UB; ++u) {
        if (live[u]) {
            const long long off = (long long)rows[u] * HD;
            ln.load(x[u], base + off);
            ln.load(y[u], base2 + off);
            if (edge_term != nullptr) {
                float tr[L::R];
                ln.template load<1>(tr, edge_term + (long long)cid[u] * HD);  // each edge term is read once
#pragma unroll
                for (int f = 0; f < L::R; ++f) {
                    x[u][f] += tr[f];
                    y[u][f] += tr[f];
                }
            }
        } else {
#pragma unroll
            for (int f = 0; f < L::R; ++f) {
                x[u][f] = 0.f;
                y[u][f] = 0.f;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Forward: one warp per (chunk, head block). Writes out (normalised, in TO) and lse for whole
// rows, or float (m, l, acc) partials for chunks of split rows; optionally the raw float
// logits e_ij at logits[caller edge, head] (normalised later by dot_alpha_from_logits).

template <typename TI, typename TO, int VEC, int LPH, int NV, int NH, bool EXACT>
__global__ void __launch_bounds__(DOT_THREADS, DOT_MIN_BLOCKS_FWD)
dot_fwd(const int* __restrict__ indices, const int* __restrict__ perm,
        const int4* __restrict__ items, long long n_work, int head_blocks,
        const TI* __restrict__ q, const TI* __restrict__ k, const TI* __restrict__ v,
        const TI* __restrict__ edge_term, TO* __restrict__ out, float* __restrict__ lse,
        float* __restrict__ part_acc, float* __restrict__ part_ml, float* __restrict__ logits, int H, int D_rt,
        float scale, float p, unsigned long long seed, unsigned long long offset,
        const long long* __restrict__ rng) {
    const GfPhilox ph(rng, p, seed, offset);
    typedef DotLanes<VEC, LPH, NV, NH, EXACT> L;
    constexpr int F = L::F;
    constexpr int R = L::R;
    constexpr int UB = L::UB;
    const int D = EXACT ? VEC * LPH * NV : D_rt;
    const long long w = dot_warp_id();
    if (w >= n_work) return;  // whole warps only: blockDim is a multiple of 32
    const int lane = threadIdx.x & 31;
    const long long c = w / head_blocks;
    const int hb = (int)(w - c * head_blocks);
    const DotChunk ch = dot_chunk(items, c);
    const L ln(lane, hb, H, D);
    const long long HD = (long long)H * D;
    const bool need_cid = (edge_term != nullptr) || (p > 0.f) || (logits != nullptr);

    float qr[R], acc[R];
    GfSoftmaxState st[NH];
    ln.template load<1>(qr, q + (long long)ch.row * HD);
#pragma unroll
    for (int f = 0; f < R; ++f) acc[f] = 0.f;
#pragma unroll
    for (int n = 0; n < NH; ++n) st[n] = gf_softmax_init();

    for (long long w0 = ch.e0; w0 < ch.e1; w0 += LPH) {
        const long long rem = ch.e1 - w0;
        const int nwin = rem < LPH ? (int)rem : LPH;
        // Lane-parallel window reads: edge w0 + sub, for each of this lane's heads.
        const bool my_live = ln.sub < nwin;
        const long long my_e = w0 + ln.sub;
        const int my_src = my_live ? indices[my_e] : 0;
        const int my_cid = (my_live && need_cid) ? perm[my_e] : 0;
        float my_s[NH];
#pragma unroll
        for (int n = 0; n < NH; ++n)
            my_s[n] = (my_live && p > 0.f)
                          ? gf_dropout_scale(p, ph.seed(), ph.offset(), (unsigned)my_cid, (unsigned)ln.h[n])
                          : 1.f;
        for (int b = 0; b < nwin; b += UB) {
            int src[UB], cid[UB];
            float sd[UB][NH];
            bool live[UB];
#pragma unroll
            for (int u = 0; u < UB; ++u) {
                const int from = ln.gbase + b + u;  // b + u < LPH: UB divides LPH
                src[u] = __shfl_sync(GF_FULL_MASK, my_src, from);
                cid[u] = __shfl_sync(GF_FULL_MASK, my_cid, from);
#pragma unroll
                for (int n = 0; n < NH; ++n) sd[u][n] = __shfl_sync(GF_FULL_MASK, my_s[n], from);
                live[u] = b + u < nwin;
            }
            float kr[UB][R], vr[UB][R];
            dot_gather<L, UB>(ln, kr, vr, k, v, edge_term, src, cid, live, HD);
            float lg[UB][NH];
#pragma unroll
            for (int u = 0; u < UB; ++u) L::dots(qr, kr[u], lg[u]);
#pragma unroll
            for (int n = 0; n < NH; ++n) {
                float mb = GF_NEG_INF;
#pragma unroll
                for (int u = 0; u < UB; ++u) {
                    lg[u][n] = live[u] ? lg[u][n] * scale : GF_NEG_INF;
                    mb = gf_nan_max(mb, lg[u][n]);
                }
                // mb is finite: the batch's first edge is live.
                const float corr = gf_softmax_rescale(st[n], mb);  // 0 on the first batch
#pragma unroll
                for (int f = 0; f < F; ++f) acc[n * F + f] *= corr;
#pragma unroll
                for (int u = 0; u < UB; ++u) {
                    const float wgt = gf_softmax_add(st[n], lg[u][n]) * sd[u][n];  // 0 for dead slots
#pragma unroll
                    for (int f = 0; f < F; ++f) acc[n * F + f] = fmaf(wgt, vr[u][n * F + f], acc[n * F + f]);
                }
            }
            if (logits != nullptr && ln.sub == 0) {
#pragma unroll
                for (int u = 0; u < UB; ++u)
#pragma unroll
                    for (int n = 0; n < NH; ++n)
                        if (live[u] && ln.head_ok[n]) logits[(long long)cid[u] * H + ln.h[n]] = lg[u][n];
            }
        }
    }

    if (ch.slot < 0) {
#pragma unroll
        for (int n = 0; n < NH; ++n) {
            const float inv = st[n].l != 0.f ? 1.f / st[n].l : 0.f;  // NaN stays NaN
#pragma unroll
            for (int f = 0; f < F; ++f) acc[n * F + f] *= inv;
            if (ln.sub == 0 && ln.head_ok[n])
                lse[(long long)ch.row * H + ln.h[n]] = gf_softmax_lse(st[n]);
        }
        ln.template store<true>(out + (long long)ch.row * HD, acc);
    } else {
        ln.store(part_acc + (long long)ch.slot * HD, acc);
#pragma unroll
        for (int n = 0; n < NH; ++n) {
            if (ln.sub == 0 && ln.head_ok[n]) {
                const long long s = ((long long)ch.slot * H + ln.h[n]) * 2;
                part_ml[s] = st[n].m;
                part_ml[s + 1] = st[n].l;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Backward, destination-major: one warp per (chunk, head block). Recomputes alpha from lse,
// uses delta_i = <O_i, dO_i> (+ delta_alpha_i = sum_j A_ij dA_ij when the returned attention
// has a gradient) and accumulates dq in registers. Per edge it also writes d_edge_term (caller order, no
// atomics: every edge is visited once) and, in atomic mode (dk != nullptr), adds the source
// gradients with vector atomics into float dk, dv (the real gradients for float TI, scratch
// buffers cast once by the launcher otherwise). In transposed mode it writes Delta (+ G) for
// dot_bwd_src.
//
//   alpha~ = alpha * s;  dalpha = s <dO_i, v_j + t_ij> (+ dA' );  de = alpha (dalpha - Delta_i)
//   dq_i += scale de (k_j + t_ij);  dk_j += scale de q_i;  dv_j += alpha~ dO_i;
//   dt_ij = alpha~ dO_i + scale de q_i
// where dA' = dA (return_attention True) or s dA ("dropped").

template <typename TI, typename TO, int VEC, int LPH, int NV, int NH, bool EXACT>
__global__ void __launch_bounds__(DOT_THREADS, DOT_MIN_BLOCKS_DST)
dot_bwd_dst(const int* __restrict__ indices, const int* __restrict__ perm,
            const int4* __restrict__ items, long long n_work, int head_blocks,
            const TI* __restrict__ q, const TI* __restrict__ k, const TI* __restrict__ v,
            const TI* __restrict__ edge_term, const TO* __restrict__ out, const TO* __restrict__ grad_out,
            const float* __restrict__ lse, const TO* __restrict__ grad_alpha, const float* __restrict__ delta_alpha,
            int grad_alpha_dropped, TI* __restrict__ dq, float* __restrict__ part_dq, float* dk, float* dv,
            TI* __restrict__ d_edge_term, float* __restrict__ delta_out, int H, int D_rt, float scale, float p,
            unsigned long long seed, unsigned long long offset, const long long* __restrict__ rng) {
    const GfPhilox ph(rng, p, seed, offset);
    typedef DotLanes<VEC, LPH, NV, NH, EXACT> L;
    constexpr int F = L::F;
    constexpr int R = L::R;
    constexpr int UB = L::UB;
    const int D = EXACT ? VEC * LPH * NV : D_rt;
    const long long w = dot_warp_id();
    if (w >= n_work) return;
    const int lane = threadIdx.x & 31;
    const long long c = w / head_blocks;
    const int hb = (int)(w - c * head_blocks);
    const DotChunk ch = dot_chunk(items, c);
    const L ln(lane, hb, H, D);
    const long long HD = (long long)H * D;
    const long long rowb = (long long)ch.row * HD;

    float qr[R], gr[R], dqa[R], delta[NH], lrow[NH];
    ln.template load<1>(qr, q + rowb);
    ln.template load<1>(gr, grad_out + rowb);
    {
        float orow[R];
        ln.template load<1>(orow, out + rowb);
        L::dots(orow, gr, delta);
    }
#pragma unroll
    for (int n = 0; n < NH; ++n) {
        const long long rh = (long long)ch.row * H + ln.h[n];
        if (delta_alpha != nullptr && ln.head_ok[n]) delta[n] += delta_alpha[rh];
        lrow[n] = ln.head_ok[n] ? lse[rh] : 0.f;
        // every chunk of a split row computes the same Delta: duplicate writes are benign
        if (delta_out != nullptr && ln.sub == 0 && ln.head_ok[n]) delta_out[rh] = delta[n];
    }
#pragma unroll
    for (int f = 0; f < R; ++f) dqa[f] = 0.f;

    const bool need_cid = (edge_term != nullptr) || (p > 0.f) || (grad_alpha != nullptr);
    for (long long w0 = ch.e0; w0 < ch.e1; w0 += LPH) {
        const long long rem = ch.e1 - w0;
        const int nwin = rem < LPH ? (int)rem : LPH;
        const bool my_live = ln.sub < nwin;
        const long long my_e = w0 + ln.sub;
        const int my_src = my_live ? indices[my_e] : 0;
        const int my_cid = (my_live && need_cid) ? perm[my_e] : 0;
        float my_s[NH], my_da[NH];
#pragma unroll
        for (int n = 0; n < NH; ++n) {
            my_s[n] = (my_live && p > 0.f)
                          ? gf_dropout_scale(p, ph.seed(), ph.offset(), (unsigned)my_cid, (unsigned)ln.h[n])
                          : 1.f;
            my_da[n] = 0.f;
            if (grad_alpha != nullptr && my_live && ln.head_ok[n]) {
                my_da[n] = gf_to_float(grad_alpha[(long long)my_cid * H + ln.h[n]]);
                if (grad_alpha_dropped) my_da[n] *= my_s[n];
            }
        }
        for (int b = 0; b < nwin; b += UB) {
            int src[UB], cid[UB];
            float sd[UB][NH], da[UB][NH];
            bool live[UB];
#pragma unroll
            for (int u = 0; u < UB; ++u) {
                const int from = ln.gbase + b + u;
                src[u] = __shfl_sync(GF_FULL_MASK, my_src, from);
                cid[u] = __shfl_sync(GF_FULL_MASK, my_cid, from);
#pragma unroll
                for (int n = 0; n < NH; ++n) {
                    sd[u][n] = __shfl_sync(GF_FULL_MASK, my_s[n], from);
                    da[u][n] = __shfl_sync(GF_FULL_MASK, my_da[n], from);
                }
                live[u] = b + u < nwin;
            }
            float kr[UB][R], vr[UB][R];
            dot_gather<L, UB>(ln, kr, vr, k, v, edge_term, src, cid, live, HD);
            float lg[UB][NH], dd[UB][NH];
#pragma unroll
            for (int u = 0; u < UB; ++u) {
                L::dots(qr, kr[u], lg[u]);
                L::dots(gr, vr[u], dd[u]);
            }
#pragma unroll
            for (int u = 0; u < UB; ++u) {
                if (!live[u]) continue;  // warp-uniform
                float cq[NH], as[NH];
#pragma unroll
                for (int n = 0; n < NH; ++n) {
                    const float alpha = __expf(fmaf(lg[u][n], scale, -lrow[n]));
                    const float de = alpha * (fmaf(sd[u][n], dd[u][n], da[u][n]) - delta[n]);
                    cq[n] = scale * de;
                    as[n] = alpha * sd[u][n];
#pragma unroll
                    for (int f = 0; f < F; ++f) dqa[n * F + f] = fmaf(cq[n], kr[u][n * F + f], dqa[n * F + f]);
                }
                if (dk != nullptr) {
                    float tmp[R];
#pragma unroll
                    for (int n = 0; n < NH; ++n)
#pragma unroll
                        for (int f = 0; f < F; ++f) tmp[n * F + f] = cq[n] * qr[n * F + f];
                    ln.atomic_add(dk + (long long)src[u] * HD, tmp);
#pragma unroll
                    for (int n = 0; n < NH; ++n)
#pragma unroll
                        for (int f = 0; f < F; ++f) tmp[n * F + f] = as[n] * gr[n * F + f];
                    ln.atomic_add(dv + (long long)src[u] * HD, tmp);
                }
                if (d_edge_term != nullptr) {
                    float tmp[R];
#pragma unroll
                    for (int n = 0; n < NH; ++n)
#pragma unroll
                        for (int f = 0; f < F; ++f) tmp[n * F + f] = fmaf(as[n], gr[n * F + f], cq[n] * qr[n * F + f]);
                    ln.template store<true>(d_edge_term + (long long)cid[u] * HD, tmp);
                }
            }
        }
    }

    if (ch.slot < 0) {
        ln.template store<true>(dq + rowb, dqa);
    } else {
        ln.store(part_dq + (long long)ch.slot * HD, dqa);
    }
}

// ---------------------------------------------------------------------------------------
// Backward, source-major (transposed mode): one warp per (source chunk, head block) over the
// source-major CSR (out-edges: destination id and caller edge id per edge). k_j and v_j stay
// in registers; dk_j and dv_j accumulate in registers, no atomics. Needs lse and Delta (+ G)
// per (destination, head), written by dot_bwd_dst.

template <typename TI, typename TO, int VEC, int LPH, int NV, int NH, bool EXACT>
__global__ void __launch_bounds__(DOT_THREADS, DOT_MIN_BLOCKS_SRC)
dot_bwd_src(const int* __restrict__ s_indices, const int* __restrict__ s_perm,
            const int4* __restrict__ items, long long n_work, int head_blocks,
            const TI* __restrict__ q, const TI* __restrict__ k, const TI* __restrict__ v,
            const TI* __restrict__ edge_term, const TO* __restrict__ grad_out, const float* __restrict__ lse,
            const float* __restrict__ delta, const TO* __restrict__ grad_alpha, int grad_alpha_dropped,
            TI* __restrict__ dk, TI* __restrict__ dv, float* __restrict__ part_dk,
            float* __restrict__ part_dv, int H, int D_rt, float scale, float p, unsigned long long seed,
            unsigned long long offset, const long long* __restrict__ rng) {
    const GfPhilox ph(rng, p, seed, offset);
    typedef DotLanes<VEC, LPH, NV, NH, EXACT, DOT_EDGE_FLOATS_SRC> L;
    constexpr int F = L::F;
    constexpr int R = L::R;
    constexpr int UB = L::UB;
    const int D = EXACT ? VEC * LPH * NV : D_rt;
    const long long w = dot_warp_id();
    if (w >= n_work) return;
    const int lane = threadIdx.x & 31;
    const long long c = w / head_blocks;
    const int hb = (int)(w - c * head_blocks);
    const DotChunk ch = dot_chunk(items, c);
    const L ln(lane, hb, H, D);
    const long long HD = (long long)H * D;
    const long long rowb = (long long)ch.row * HD;

    float kj[R], vj[R], dka[R], dva[R];
    ln.template load<1>(kj, k + rowb);
    ln.template load<1>(vj, v + rowb);
#pragma unroll
    for (int f = 0; f < R; ++f) {
        dka[f] = 0.f;
        dva[f] = 0.f;
    }

    for (long long w0 = ch.e0; w0 < ch.e1; w0 += LPH) {
        const long long rem = ch.e1 - w0;
        const int nwin = rem < LPH ? (int)rem : LPH;
        const bool my_live = ln.sub < nwin;
        const long long my_e = w0 + ln.sub;
        const int my_dst = my_live ? s_indices[my_e] : 0;
        const int my_cid = my_live ? s_perm[my_e] : 0;
        float my_s[NH], my_l[NH], my_delta[NH], my_da[NH];
#pragma unroll
        for (int n = 0; n < NH; ++n) {
            my_s[n] = (my_live && p > 0.f)
                          ? gf_dropout_scale(p, ph.seed(), ph.offset(), (unsigned)my_cid, (unsigned)ln.h[n])
                          : 1.f;
            my_l[n] = 0.f;
            my_delta[n] = 0.f;
            my_da[n] = 0.f;
            if (my_live && ln.head_ok[n]) {
                const long long ih = (long long)my_dst * H + ln.h[n];
                my_l[n] = lse[ih];
                my_delta[n] = delta[ih];
                if (grad_alpha != nullptr) {
                    my_da[n] = gf_to_float(grad_alpha[(long long)my_cid * H + ln.h[n]]);
                    if (grad_alpha_dropped) my_da[n] *= my_s[n];
                }
            }
        }
        for (int b = 0; b < nwin; b += UB) {
            int dst[UB], cid[UB];
            float sd[UB][NH], lrow[UB][NH], dl[UB][NH], da[UB][NH];
            bool live[UB];
#pragma unroll
            for (int u = 0; u < UB; ++u) {
                const int from = ln.gbase + b + u;
                dst[u] = __shfl_sync(GF_FULL_MASK, my_dst, from);
                cid[u] = __shfl_sync(GF_FULL_MASK, my_cid, from);
#pragma unroll
                for (int n = 0; n < NH; ++n) {
                    sd[u][n] = __shfl_sync(GF_FULL_MASK, my_s[n], from);
                    lrow[u][n] = __shfl_sync(GF_FULL_MASK, my_l[n], from);
                    dl[u][n] = __shfl_sync(GF_FULL_MASK, my_delta[n], from);
                    da[u][n] = __shfl_sync(GF_FULL_MASK, my_da[n], from);
                }
                live[u] = b + u < nwin;
            }
            float qi[UB][R], gi[UB][R];
            dot_gather<L, UB>(ln, qi, gi, q, grad_out, static_cast<const TI*>(nullptr), dst, cid, live, HD);
            float lg[UB][NH], dd[UB][NH];
            if (edge_term != nullptr) {  // <q_i, k_j + t> and <dO_i, v_j + t>
#pragma unroll
                for (int u = 0; u < UB; ++u) {
                    float kt[R];
                    if (live[u]) {
                        ln.template load<1>(kt, edge_term + (long long)cid[u] * HD);
                    } else {
#pragma unroll
                        for (int f = 0; f < R; ++f) kt[f] = 0.f;
                    }
                    float vt[R];
#pragma unroll
                    for (int f = 0; f < R; ++f) {
                        vt[f] = vj[f] + kt[f];
                        kt[f] += kj[f];
                    }
                    L::dots(qi[u], kt, lg[u]);
                    L::dots(gi[u], vt, dd[u]);
                }
            } else {
#pragma unroll
                for (int u = 0; u < UB; ++u) {
                    L::dots(qi[u], kj, lg[u]);
                    L::dots(gi[u], vj, dd[u]);
                }
            }
#pragma unroll
            for (int u = 0; u < UB; ++u) {
                if (!live[u]) continue;  // warp-uniform
#pragma unroll
                for (int n = 0; n < NH; ++n) {
                    const float alpha = __expf(fmaf(lg[u][n], scale, -lrow[u][n]));
                    const float de = alpha * (fmaf(sd[u][n], dd[u][n], da[u][n]) - dl[u][n]);
                    const float cq = scale * de;
                    const float as = alpha * sd[u][n];
#pragma unroll
                    for (int f = 0; f < F; ++f) {
                        dka[n * F + f] = fmaf(cq, qi[u][n * F + f], dka[n * F + f]);
                        dva[n * F + f] = fmaf(as, gi[u][n * F + f], dva[n * F + f]);
                    }
                }
            }
        }
    }

    if (ch.slot < 0) {
        ln.template store<true>(dk + rowb, dka);
        ln.template store<true>(dv + rowb, dva);
    } else {
        ln.store(part_dk + (long long)ch.slot * HD, dka);
        ln.store(part_dv + (long long)ch.slot * HD, dva);
    }
}

// ---------------------------------------------------------------------------------------
// Merges of split rows: split[r] = (row, first slot, number of slots, 0) (worklist.py); a
// static work list (worklist.build_static) also has entries with 0 slots, all after the others:
// a thread stops at the first (its grid-stride loop only meets later entries after it).

// Forward: combine the (m, l, acc) partials of split rows into out (TO) and lse. One thread per
// (split row, head, d), grid-stride.
template <typename TO>
__global__ void dot_fwd_merge(const int4* __restrict__ split, long long n_split,
                              const float* __restrict__ part_acc, const float* __restrict__ part_ml,
                              TO* __restrict__ out, float* __restrict__ lse, int H, int D) {
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < n_split * H * D;
         idx += (long long)gridDim.x * blockDim.x) {
        const int d = (int)(idx % D);
        const long long rh = idx / D;
        const int h = (int)(rh % H);
        const int4 sp = split[rh / H];
        if (sp.z == 0) break;  // a static work list's unsplit rows: none after it
        // Two passes (max, then the rescaled sums): one exp per partial instead of the online
        // merge's two; the partials are all there already.
        float mx = GF_NEG_INF;
        for (int s = sp.y; s < sp.y + sp.z; ++s) mx = gf_nan_max(mx, part_ml[((long long)s * H + h) * 2]);
        float l = 0.f, a = 0.f;
        if (mx != GF_NEG_INF) {
            for (int s = sp.y; s < sp.y + sp.z; ++s) {
                const long long sh = (long long)s * H + h;
                const float wgt = expf(part_ml[sh * 2] - mx);
                l = fmaf(wgt, part_ml[sh * 2 + 1], l);
                a = fmaf(wgt, part_acc[sh * D + d], a);
            }
        }
        const long long row = sp.x;
        gf_st(out + (row * H + h) * D + d, l != 0.f ? a / l : 0.f);
        if (d == 0) lse[row * H + h] = l != 0.f ? mx + logf(l) : GF_NEG_INF;
    }
}

// Backward: sum the float partial gradient rows of split rows into dst (storage type T,
// rounded once). One thread per (split row, element of a row), grid-stride.
template <typename T>
__global__ void dot_sum_partials(const int4* __restrict__ split, long long n_split,
                                 const float* __restrict__ part, T* __restrict__ dst, long long row_len) {
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < n_split * row_len;
         idx += (long long)gridDim.x * blockDim.x) {
        const long long r = idx / row_len;
        const long long x = idx - r * row_len;
        const int4 sp = split[r];
        if (sp.z == 0) break;  // a static work list's unsplit rows: none after it
        float a = 0.f;
        for (int s = sp.y; s < sp.y + sp.z; ++s) a += part[(long long)s * row_len + x];
        gf_st(dst + (long long)sp.x * row_len + x, a);
    }
}

// ---------------------------------------------------------------------------------------
// Attention weights: turn the raw float logits written by dot_fwd (caller order [M, H]) into
// alpha = exp(e - lse) (times the dropout multiplier for "dropped"), stored in TO. For float TO
// the launcher passes one buffer as both (in place: each element is read, then written, by one
// thread; hence no __restrict__); a 16-bit alpha gets its own float logits buffer, so logits
// are never rounded to 16 bits. One warp per chunk of the destination work list, lanes over
// (edge, head) pairs.
template <typename TO>
__global__ void dot_alpha_from_logits(const int* __restrict__ perm, const int4* __restrict__ items,
                                      long long n_items, const float* __restrict__ lse, const float* logits,
                                      TO* alpha, int H, int dropped, float p, unsigned long long seed,
                                      unsigned long long offset, const long long* __restrict__ rng) {
    const GfPhilox ph(rng, p, seed, offset);
    const long long w = dot_warp_id();
    if (w >= n_items) return;
    const int lane = threadIdx.x & 31;
    const DotChunk ch = dot_chunk(items, w);
    const long long n = (ch.e1 - ch.e0) * H;
    for (long long i = lane; i < n; i += 32) {
        const long long e = ch.e0 + i / H;
        const int h = (int)(i % H);
        const long long at = (long long)perm[e] * H + h;
        float a = expf(logits[at] - lse[(long long)ch.row * H + h]);
        if (dropped) a *= gf_dropout_scale(p, ph.seed(), ph.offset(), (unsigned)perm[e], (unsigned)h);
        gf_st(alpha + at, a);
    }
}

// delta_alpha_i = sum_j A_ij dA_ij per (destination, head), A the returned attention (alpha
// or alpha~), dA its gradient, both caller order [M, H] in TO; delta_alpha is float. delta_alpha
// must be zeroed: split rows add one partial per chunk. One warp per chunk, lanes over edges, a
// loop over heads.
template <typename TO>
__global__ void dot_delta_alpha(const int* __restrict__ perm, const int4* __restrict__ items, long long n_items,
                                const TO* __restrict__ alpha, const TO* __restrict__ grad_alpha,
                                float* __restrict__ delta_alpha, int H) {
    const long long w = dot_warp_id();
    if (w >= n_items) return;
    const int lane = threadIdx.x & 31;
    const DotChunk ch = dot_chunk(items, w);
    if (ch.e1 <= ch.e0) return;  // warp-uniform
    for (int h = 0; h < H; ++h) {
        float s = 0.f;
        for (long long e = ch.e0 + lane; e < ch.e1; e += 32) {
            const long long at = (long long)perm[e] * H + h;
            s = fmaf(gf_to_float(alpha[at]), gf_to_float(grad_alpha[at]), s);
        }
        s = gf_group_sum<32>(s);
        if (lane == 0) atomicAdd(delta_alpha + (long long)ch.row * H + h, s);
    }
}
