// Fused GAT (additive) attention: forward and backward over CSR rows.
//
//   z_ij = s_j + t_i (+ u_ij)                                     [H]
//   e_ij = LeakyReLU(z_ij),  alpha_ij = softmax_j(e_ij)
//   out_i = sum_j w_ij ds_ij alpha_ij x_src[j]                    [H, D]
// s = score_src [N_src, H], t = score_dst [N_dst, H], u = edge_score [M, H] and w = edge_weight
// [M] (both in the caller's edge order, read through perm; optional), ds the inverted-dropout
// multiplier (1 without dropout). The design note lives in gnn_fastpath/ops/gat_attention.py;
// the launcher in gnn_fastpath/cuda/gat_attention.py.
//
// Work items and lanes: as the GATv2 kernels (gatv2_attention.cu), with the shared row layout
// of attention_common.cuh: one warp per (int4 work item, head tile); rows longer than the chunk
// length are split into chunk items (slot >= 0) whose partial results are merged afterwards
// (forward: a workspace and gf_merge_chunks; backward: float atomics). A head's D columns are
// spread over LH lanes (GfRow<VW, LH, K, DC>), spare lane groups become edge slots (gf_lane).
// Unlike GATv2 the logit needs no sum over the head's lanes: each lane reads the scalar s_j of
// its head (the LH lanes of a head read one address: one transaction), so per edge the forward
// moves the x_src row and one float per head. The U edges of a step are loaded before any is
// used (memory-level parallelism). With dropout, each (edge, head) multiplier is drawn once by
// the warp's lanes together (gf_step_dropout), not by every lane of the head.
//
// Storage types (template <TI, TO, ...>). x_src and dx_src are TI (float, gf_half, gf_bf16);
// out and alpha are written as TO (TI or float), and the backward reads grad_out, the saved out
// and grad_alpha as TO. The per-node and per-edge scalars (score_src, score_dst, edge_score,
// edge_weight) and their gradients are float (the op converts them and casts the gradients
// back), as are every arithmetic operation and accumulator, lse, delta, the raw logits, the
// chunk workspaces and every buffer atomics add into. Stores to TI/TO round once, to nearest
// even.
#include "attention_common.cuh"

// Block sizes come from the launcher (-D defines), so Python and CUDA agree on them.
#ifndef GAT_THREADS
#error "GAT_THREADS must be defined by the launcher"
#endif
#ifndef GAT_MERGE_THREADS
#error "GAT_MERGE_THREADS must be defined by the launcher"
#endif

// Sum of a per-lane scalar over the edge slots into slot 0.
template <int LH>
__device__ __forceinline__ void gat_sum_slots(float& a, const GfLane& ln) {
    float r[1] = {a};
    gf_sum_slots<1, LH>(r, ln);
    a = r[0];
}

// =======================================================================================
// Forward: one streaming pass per item, online softmax over z = s_j + t_i (+ u), weighted sum
// of x_src rows. Unsplit rows write out and lse directly; chunks of split rows write their
// unnormalised state (acc, m, l) to workspace slot `slot`, merged by gat_fwd_merge. When
// `logits` is given, raw float logits go to logits[caller edge, head] (gat_alpha_from_logits
// turns them into alpha). The softmax sum l does not see w and ds: they scale the
// accumulated weight only, so out = sum alpha w ds x and lse is the softmax's.
template <typename TI, typename TO, int VW, int LH, int K, int DC, int U>
__global__ void __launch_bounds__(GAT_THREADS)
gat_fwd(const int4* __restrict__ items, long long n_work, int n_tiles,
        const int* __restrict__ indices, const int* __restrict__ perm,
        const TI* __restrict__ x_src, const float* __restrict__ score_src, const float* __restrict__ score_dst,
        const float* __restrict__ edge_score, const float* __restrict__ edge_weight, int H, int D_rt, float slope,
        float p, unsigned long long seed, unsigned long long offset, const long long* __restrict__ rng,
        TO* __restrict__ out, float* __restrict__ lse,
        float* __restrict__ part_acc, float* __restrict__ part_m, float* __restrict__ part_l,
        float* __restrict__ logits) {
    const GfPhilox ph(rng, p, seed, offset);
    using R = GfRow<VW, LH, K, DC>;
    constexpr int KV = R::KV;
    const int D = DC > 0 ? DC : D_rt;
    const int HD = H * D;  // < 2**31 (checked by the launcher)
    const bool need_perm = edge_score != nullptr || edge_weight != nullptr || p > 0.f || logits != nullptr;

    const long long n_warps = ((long long)gridDim.x * blockDim.x) >> 5;
    for (long long w = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; w < n_work; w += n_warps) {
        const GfItem wi = gf_item<LH>(items, w, n_tiles, H, D);
        const int row = wi.row, start = wi.start, end = wi.end, slot = wi.slot, hc = wi.hc, hoff = wi.hoff;
        const GfLane ln = wi.ln;
        const int l = ln.l, s = ln.s, ES = ln.ES;
        const float t = ln.on ? __ldg(score_dst + (long long)row * H + hc) : 0.f;

        float acc[KV];
#pragma unroll
        for (int k = 0; k < KV; ++k) acc[k] = 0.f;
        GfSoftmaxState st = gf_softmax_init();

        for (long long b = start; b < end; b += 32) {
            const int nb = (int)min(32LL, (long long)end - b);
            const int my_j = ln.lane < nb ? __ldg(indices + b + ln.lane) : 0;
            const int my_pe = (need_perm && ln.lane < nb) ? __ldg(perm + b + ln.lane) : 0;
            const int rounds = (nb + ES - 1) / ES;
            for (int r0 = 0; r0 < rounds; r0 += U) {
                float xs[U][KV], c[U], wm[U];
                int pe[U];
                bool v[U];
                // All U rows and scores are requested before anything branches: the optional
                // terms below are runtime branches, and loads behind a branch are not hoisted
                // above it (4 rows in flight, not 1). j is a valid source id (or 0) even for
                // an invalid slot, so the score load needs no guard.
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    const int q = (r0 + u) * ES + s;
                    v[u] = ln.on && (r0 + u) < rounds && q < nb;
                    const int j = __shfl_sync(GF_FULL_MASK, my_j, q & 31);
                    pe[u] = __shfl_sync(GF_FULL_MASK, my_pe, q & 31);
                    R::load(xs[u], x_src + (long long)j * HD + hoff, l, D, v[u]);
                    c[u] = __ldg(score_src + (long long)j * H + hc);
                }
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    float z = c[u] + t;
                    if (edge_score != nullptr && v[u]) z += __ldg(edge_score + (long long)pe[u] * H + hc);
                    c[u] = v[u] ? gf_lrelu(z, slope) : GF_NEG_INF;
                    wm[u] = (edge_weight != nullptr && v[u]) ? __ldg(edge_weight + pe[u]) : 1.f;
                }
                if (p > 0.f) {  // kernel-uniform
                    float ds[U];
                    gf_step_dropout<U, LH>(ds, ln, my_pe, r0, rounds, nb, H, wi.tile, p, ph.seed(), ph.offset());
#pragma unroll
                    for (int u = 0; u < U; ++u) wm[u] *= ds[u];
                }
                float mx = GF_NEG_INF;
#pragma unroll
                for (int u = 0; u < U; ++u) mx = gf_nan_max(mx, c[u]);
                const float sc = gf_softmax_rescale(st, mx);  // 1 while the state is empty
                const bool live = st.m != GF_NEG_INF;
#pragma unroll
                for (int k = 0; k < KV; ++k) acc[k] *= sc;
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    // Weight 0 for invalid edges (zero values) and for -inf logits, also before
                    // the state has seen a finite one: torch computes 0 * value for those
                    // edges too, so an inf or NaN value still makes the output NaN.
                    const float wgt = (live ? gf_softmax_add(st, c[u]) : 0.f) * wm[u];
#pragma unroll
                    for (int k = 0; k < KV; ++k) acc[k] = fmaf(wgt, xs[u][k], acc[k]);
                }
                if (logits != nullptr) {
#pragma unroll
                    for (int u = 0; u < U; ++u)
                        if (v[u] && l == 0) logits[(long long)pe[u] * H + ln.head] = c[u];
                }
            }
        }

        gf_merge_slots<KV, LH>(st, acc, ln);
        if (ln.on && s == 0)
            gf_fwd_finish<R>(ln, st, acc, row, start, end, slot, H, D, hoff, out, lse, part_acc, part_m, part_l);
    }
}

// Merge the chunk states of split rows (gf_merge_chunks). Needs blockDim.x == GAT_MERGE_THREADS.
template <typename TO>
__global__ void __launch_bounds__(GAT_MERGE_THREADS)
gat_fwd_merge(const int4* __restrict__ split, int n_split, const float* __restrict__ part_acc,
              const float* __restrict__ part_m, const float* __restrict__ part_l, int H, int D,
              TO* __restrict__ out, float* __restrict__ lse) {
    gf_merge_chunks<TO, GAT_MERGE_THREADS>(split, n_split, part_acc, part_m, part_l, H, D, out, lse);
}

// alpha[caller edge, h] <- exp(logits - lse[row, h]), times ds * w for "dropped" (the weights
// the aggregation used), from the raw logits gat_fwd wrote (gf_alpha_from_logits: in place for
// TO = float, hence no __restrict__ on logits and alpha). One warp per work item.
template <typename TO>
__global__ void gat_alpha_from_logits(const int4* __restrict__ items, long long n_items,
                                      const int* __restrict__ perm, const float* __restrict__ lse,
                                      int H, float p, unsigned long long seed, unsigned long long offset,
                                      const long long* __restrict__ rng, int dropped, const float* logits,
                                      TO* alpha, const float* __restrict__ edge_weight) {
    const GfPhilox ph(rng, p, seed, offset);
    gf_alpha_from_logits<TO>(items, n_items, perm, lse, H, p, ph.seed(), ph.offset(), dropped, logits, alpha,
                             edge_weight);
}

// delta_alpha[row, h] = sum over the row's edges of alpha_out * grad_alpha (gf_delta_alpha;
// delta_alpha zeroed: chunks of split rows add with atomics). One warp per work item.
template <typename TO>
__global__ void gat_delta_alpha(const int4* __restrict__ items, long long n_items,
                                const int* __restrict__ perm, const TO* __restrict__ alpha,
                                const TO* __restrict__ grad_alpha, int H, float* __restrict__ delta_alpha) {
    gf_delta_alpha<TO>(items, n_items, perm, alpha, grad_alpha, H, delta_alpha);
}

// =======================================================================================
// Backward. Per edge (alpha recomputed from the saved lse, nothing of size [M, H] stored):
//   f = w ds, g = <dO_i, x_j>, dalpha = f g (+ grad_alpha, times f when "dropped"),
//   de = alpha (dalpha - delta_i), dz = de LeakyReLU'(z),
//   d s_j += dz, d t_i += dz, d u_ij = dz, d w_ij = sum_h ds alpha (g (+ grad_alpha when
//   "dropped")), dx_src_j += f alpha dO_i,
// with delta_i = <dO_i, O_i> (+ delta_alpha_i): FlashAttention's Delta, = sum_j alpha dalpha
// also with w and dropout, as O carries them.
//
// Destination-major ("atomic" variant): one pass over each destination's in-edges gathering
// x_j. d t_i in registers (stored, or added by chunks of split rows into the zeroed d_score_dst);
// d s_j (float [N_src, H]) and dx_src (float [N_src, H, D], 16-bit gradients cast by the
// launcher) by atomics, d u stored at its caller position, d w (float [M], zeroed) summed over
// the tile's heads by shuffles and added once per (edge, tile). Scalar stores and atomics come
// from the head's lane l == 0 only.
template <typename TI, typename TO, int VW, int LH, int K, int DC, int U>
__global__ void __launch_bounds__(GAT_THREADS)
gat_bwd_dst(const int4* __restrict__ items, long long n_work, int n_tiles,
            const int* __restrict__ indices, const int* __restrict__ perm,
            const TI* __restrict__ x_src, const float* __restrict__ score_src, const float* __restrict__ score_dst,
            const float* __restrict__ edge_score, const float* __restrict__ edge_weight,
            const TO* __restrict__ out, const TO* __restrict__ grad_out, const float* __restrict__ lse,
            const float* __restrict__ delta_alpha, const TO* __restrict__ grad_alpha, int grad_alpha_dropped,
            int H, int D_rt, float slope, float p, unsigned long long seed, unsigned long long offset,
            const long long* __restrict__ rng, float* dx_src, float* d_score_src, float* d_score_dst,
            float* __restrict__ d_edge_score, float* d_edge_weight) {
    const GfPhilox ph(rng, p, seed, offset);
    using R = GfRow<VW, LH, K, DC>;
    constexpr int KV = R::KV;
    const int D = DC > 0 ? DC : D_rt;
    const int HD = H * D;  // < 2**31 (checked by the launcher)
    const bool need_perm = edge_score != nullptr || edge_weight != nullptr || p > 0.f || grad_alpha != nullptr ||
                           d_edge_score != nullptr || d_edge_weight != nullptr;

    const long long n_warps = ((long long)gridDim.x * blockDim.x) >> 5;
    for (long long w = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; w < n_work; w += n_warps) {
        const GfItem wi = gf_item<LH>(items, w, n_tiles, H, D);
        const int row = wi.row, start = wi.start, end = wi.end, slot = wi.slot, hc = wi.hc, hoff = wi.hoff;
        const GfLane ln = wi.ln;
        const int l = ln.l, s = ln.s, ES = ln.ES;
        const long long rh = (long long)row * H + hc;

        float dO[KV];
        float delta;
        {
            float o[KV];
            R::load(o, out + (long long)row * HD + hoff, l, D, ln.on);
            R::load(dO, grad_out + (long long)row * HD + hoff, l, D, ln.on);
            delta = gf_group_sum<LH>(R::dot(dO, o));
        }
        if (delta_alpha != nullptr && ln.on) delta += delta_alpha[rh];
        const float Lr = (ln.on && end > start) ? lse[rh] : 0.f;
        const float t = ln.on ? __ldg(score_dst + rh) : 0.f;
        float dt = 0.f;

        for (long long b = start; b < end; b += 32) {
            const int nb = (int)min(32LL, (long long)end - b);
            const int my_j = ln.lane < nb ? __ldg(indices + b + ln.lane) : 0;
            const int my_pe = (need_perm && ln.lane < nb) ? __ldg(perm + b + ln.lane) : 0;
            const int rounds = (nb + ES - 1) / ES;
            for (int r0 = 0; r0 < rounds; r0 += U) {
                float xs[U][KV], z[U], wm[U], ga[U], ds[U];
                int jj[U], pe[U];
                bool v[U];
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    const int q = (r0 + u) * ES + s;
                    v[u] = ln.on && (r0 + u) < rounds && q < nb;
                    jj[u] = __shfl_sync(GF_FULL_MASK, my_j, q & 31);
                    pe[u] = __shfl_sync(GF_FULL_MASK, my_pe, q & 31);
                    R::load(xs[u], x_src + (long long)jj[u] * HD + hoff, l, D, v[u]);
                    z[u] = __ldg(score_src + (long long)jj[u] * H + hc);  // jj valid (or 0): as the forward
                }
#pragma unroll
                for (int u = 0; u < U; ++u) {  // the optional terms branch: after every row load (forward)
                    z[u] = v[u] ? z[u] + t : 0.f;
                    if (edge_score != nullptr && v[u]) z[u] += __ldg(edge_score + (long long)pe[u] * H + hc);
                    wm[u] = (edge_weight != nullptr && v[u]) ? __ldg(edge_weight + pe[u]) : 1.f;
                    ga[u] = (grad_alpha != nullptr && v[u]) ? gf_ldg(grad_alpha + (long long)pe[u] * H + hc) : 0.f;
                    ds[u] = 1.f;
                }
                if (p > 0.f) gf_step_dropout<U, LH>(ds, ln, my_pe, r0, rounds, nb, H, wi.tile, p, ph.seed(), ph.offset());
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    const float g = gf_group_sum<LH>(R::dot(dO, xs[u]));
                    float dw = 0.f;
                    if (v[u]) {  // lane-divergent, no shuffles inside
                        const float alpha = __expf(gf_lrelu(z[u], slope) - Lr);
                        const float f = wm[u] * ds[u];
                        const float dal = f * g + ga[u] * (grad_alpha_dropped ? f : 1.f);
                        const float de = alpha * (dal - delta);
                        const float dz = de * (z[u] > 0.f ? 1.f : slope);
                        dt += dz;
                        dw = ds[u] * alpha * (grad_alpha_dropped ? g + ga[u] : g);
                        if (l == 0) {
                            if (d_score_src != nullptr) atomicAdd(d_score_src + (long long)jj[u] * H + hc, dz);
                            if (d_edge_score != nullptr) d_edge_score[(long long)pe[u] * H + hc] = dz;
                        }
                        if (dx_src != nullptr) {
                            const float pw = f * alpha;
                            float m[KV];
#pragma unroll
                            for (int k = 0; k < KV; ++k) m[k] = pw * dO[k];
                            R::atomic_add(dx_src + (long long)jj[u] * HD + hoff, m, l, D);
                        }
                    }
                    if (d_edge_weight != nullptr) {  // kernel-uniform
                        const float sum = gf_tile_head_sum<LH>(dw, ln);
                        if (v[u] && ln.hh == 0 && l == 0) atomicAdd(d_edge_weight + pe[u], sum);
                    }
                }
            }
        }

        gat_sum_slots<LH>(dt, ln);
        if (ln.on && s == 0 && l == 0 && d_score_dst != nullptr) {
            if (slot < 0) d_score_dst[rh] = dt;
            else atomicAdd(d_score_dst + rh, dt);
        }
    }
}

// delta[row, h] = <grad_out_i, out_i> (+ delta_alpha[row, h]) for the source-major backward.
// One warp per (destination row, head tile); only edge slot 0 works (a node-sized pass).
template <typename TI, typename TO, int VW, int LH, int K, int DC, int U>
__global__ void __launch_bounds__(GAT_THREADS)
gat_delta(long long n_work, int n_tiles, const TO* __restrict__ out, const TO* __restrict__ grad_out,
          const float* __restrict__ delta_alpha, int H, int D_rt, float* __restrict__ delta) {
    gf_row_delta<VW, LH, K, DC>(n_work, n_tiles, out, grad_out, delta_alpha, H, DC > 0 ? DC : D_rt, delta);
}

// Source-major ("transposed" variant): one pass over each source's out-edges (s_indices =
// destination ids, s_perm = caller edge ids) gathering dO_i with lse_i, delta_i (gat_delta) and
// t_i; x_j and s_j are the row's own. dx_src and d s_j in registers, no atomics except for
// chunks of split source rows (dx_src as gf_store_row_grad: into dx_src itself for TI = float,
// its split rows zeroed by the launcher, else into the float scratch dx_src_acc at row
// acc_index[slot]; d s_j added into the zeroed d_score_src). d t_i by atomics into the zeroed
// d_score_dst; d u and d w as in gat_bwd_dst.
template <typename TI, typename TO, int VW, int LH, int K, int DC, int U>
__global__ void __launch_bounds__(GAT_THREADS)
gat_bwd_src(const int4* __restrict__ items, long long n_work, int n_tiles,
            const int* __restrict__ s_indices, const int* __restrict__ s_perm,
            const TI* __restrict__ x_src, const float* __restrict__ score_src, const float* __restrict__ score_dst,
            const float* __restrict__ edge_score, const float* __restrict__ edge_weight,
            const TO* __restrict__ grad_out, const float* __restrict__ lse, const float* __restrict__ delta,
            const TO* __restrict__ grad_alpha, int grad_alpha_dropped, int H, int D_rt, float slope, float p,
            unsigned long long seed, unsigned long long offset, const long long* __restrict__ rng, TI* dx_src,
            float* dx_src_acc, const int* __restrict__ acc_index, float* d_score_src, float* d_score_dst,
            float* __restrict__ d_edge_score, float* d_edge_weight) {
    const GfPhilox ph(rng, p, seed, offset);
    using R = GfRow<VW, LH, K, DC>;
    constexpr int KV = R::KV;
    const int D = DC > 0 ? DC : D_rt;
    const int HD = H * D;  // < 2**31 (checked by the launcher)
    const bool need_perm = edge_score != nullptr || edge_weight != nullptr || p > 0.f || grad_alpha != nullptr ||
                           d_edge_score != nullptr || d_edge_weight != nullptr;

    const long long n_warps = ((long long)gridDim.x * blockDim.x) >> 5;
    for (long long w = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; w < n_work; w += n_warps) {
        const GfItem wi = gf_item<LH>(items, w, n_tiles, H, D);
        const int row = wi.row, start = wi.start, end = wi.end, slot = wi.slot, hc = wi.hc, hoff = wi.hoff;
        const GfLane ln = wi.ln;
        const int l = ln.l, s = ln.s, ES = ln.ES;

        float xj[KV], acc[KV];
        R::load(xj, x_src + (long long)row * HD + hoff, l, D, ln.on);
        const float sj = ln.on ? __ldg(score_src + (long long)row * H + hc) : 0.f;
#pragma unroll
        for (int k = 0; k < KV; ++k) acc[k] = 0.f;
        float dsj = 0.f;

        for (long long b = start; b < end; b += 32) {
            const int nb = (int)min(32LL, (long long)end - b);
            const int my_i = ln.lane < nb ? __ldg(s_indices + b + ln.lane) : 0;
            const int my_pe = (need_perm && ln.lane < nb) ? __ldg(s_perm + b + ln.lane) : 0;
            const int rounds = (nb + ES - 1) / ES;
            for (int r0 = 0; r0 < rounds; r0 += U) {
                float dO[U][KV], z[U], Lv[U], dl[U], wm[U], ga[U], ds[U];
                long long ih[U];
                int pe[U];
                bool v[U];
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    const int q = (r0 + u) * ES + s;
                    v[u] = ln.on && (r0 + u) < rounds && q < nb;
                    const int i = __shfl_sync(GF_FULL_MASK, my_i, q & 31);
                    pe[u] = __shfl_sync(GF_FULL_MASK, my_pe, q & 31);
                    R::load(dO[u], grad_out + (long long)i * HD + hoff, l, D, v[u]);
                    ih[u] = (long long)i * H + hc;  // i valid (or 0): no guard, as the forward
                    z[u] = __ldg(score_dst + ih[u]);
                    Lv[u] = __ldg(lse + ih[u]);
                    dl[u] = __ldg(delta + ih[u]);
                }
#pragma unroll
                for (int u = 0; u < U; ++u) {  // the optional terms branch: after every row load
                    z[u] = v[u] ? sj + z[u] : 0.f;
                    Lv[u] = v[u] ? Lv[u] : 0.f;
                    dl[u] = v[u] ? dl[u] : 0.f;
                    if (edge_score != nullptr && v[u]) z[u] += __ldg(edge_score + (long long)pe[u] * H + hc);
                    wm[u] = (edge_weight != nullptr && v[u]) ? __ldg(edge_weight + pe[u]) : 1.f;
                    ga[u] = (grad_alpha != nullptr && v[u]) ? gf_ldg(grad_alpha + (long long)pe[u] * H + hc) : 0.f;
                    ds[u] = 1.f;
                }
                if (p > 0.f) gf_step_dropout<U, LH>(ds, ln, my_pe, r0, rounds, nb, H, wi.tile, p, ph.seed(), ph.offset());
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    const float g = gf_group_sum<LH>(R::dot(dO[u], xj));
                    float dw = 0.f;
                    if (v[u]) {  // lane-divergent, no shuffles inside
                        const float alpha = __expf(gf_lrelu(z[u], slope) - Lv[u]);
                        const float f = wm[u] * ds[u];
                        const float pw = f * alpha;
#pragma unroll
                        for (int k = 0; k < KV; ++k) acc[k] = fmaf(pw, dO[u][k], acc[k]);
                        const float dal = f * g + ga[u] * (grad_alpha_dropped ? f : 1.f);
                        const float de = alpha * (dal - dl[u]);
                        const float dz = de * (z[u] > 0.f ? 1.f : slope);
                        dsj += dz;
                        dw = ds[u] * alpha * (grad_alpha_dropped ? g + ga[u] : g);
                        if (l == 0) {
                            if (d_score_dst != nullptr) atomicAdd(d_score_dst + ih[u], dz);
                            if (d_edge_score != nullptr) d_edge_score[(long long)pe[u] * H + hc] = dz;
                        }
                    }
                    if (d_edge_weight != nullptr) {  // kernel-uniform
                        const float sum = gf_tile_head_sum<LH>(dw, ln);
                        if (v[u] && ln.hh == 0 && l == 0) atomicAdd(d_edge_weight + pe[u], sum);
                    }
                }
            }
        }

        gf_sum_slots<KV, LH>(acc, ln);
        gat_sum_slots<LH>(dsj, ln);
        if (ln.on && s == 0) {
            if (dx_src != nullptr) gf_store_row_grad<R>(dx_src, dx_src_acc, acc_index, acc, ln, row, slot, HD, hoff, D);
            if (d_score_src != nullptr && l == 0) {
                if (slot < 0) d_score_src[(long long)row * H + hc] = dsj;
                else atomicAdd(d_score_src + (long long)row * H + hc, dsj);
            }
        }
    }
}
