// Fused GATv2 attention: forward and backward over destination-major CSR.
//
//   z_ij = x_src[j] + x_dst[i] (+ edge_term[perm(ij)])           [H, D]
//   e_ij = sum_d att[h, d] * LeakyReLU(z_ij)[h, d]               [H]
//   alpha_ij = softmax_j(e_ij),  out_i = sum_j alpha_ij ds_ij x_src[j]
// (ds = inverted-dropout multiplier, 1 without dropout). The design note lives in
// gnn_fastpath/ops/gatv2_attention.py; the launcher in gnn_fastpath/cuda/gatv2_attention.py.
//
// Work items. Every kernel here walks a list of int4 work items (row, edge begin, edge end,
// slot): one item per row, except rows longer than the chunk length, which are split into
// several chunk items with slot >= 0 (their partial results go to a workspace or through
// atomics and are merged afterwards). Items come from gnn_fastpath/cuda/worklist.py.
//
// Storage types (template <TI, TO, ...>). x_src, x_dst and edge_term are stored as TI (float,
// gf_half or gf_bf16), att as float (the op converts it: it is [H, D]); out and alpha
// are written as TO (TI or float), and the backward reads grad_out, the saved out and
// grad_alpha as TO. Everything else is float: every arithmetic operation and accumulator, lse,
// delta, the raw logits, the chunk workspaces and every buffer atomics add into (gradients of
// 16-bit tensors accumulate in float scratch and the launcher casts them once: adding into
// 16-bit memory would round at every atomic). Stores to TI/TO round once, to nearest even.
//
// Lane mapping (template <VW, LH, K, DC, U>): the row-attention layout of attention_common.cuh
// (GfRow, gf_lane: LH lanes per head, K vectors of VW elements per lane, HT heads per tile,
// ES edge slots). Per head, the logit needs a sum over the LH lanes (gf_group_sum); the U
// edges of one step are loaded before any is used (memory-level parallelism).
#include "attention_common.cuh"

// Block sizes come from the launcher (-D defines), so Python and CUDA agree on them.
#ifndef GATV2_THREADS
#error "GATV2_THREADS must be defined by the launcher"
#endif
#ifndef GATV2_MERGE_THREADS
#error "GATV2_MERGE_THREADS must be defined by the launcher"
#endif

// =======================================================================================
// Forward: one streaming pass per item, online softmax, weighted sum of x_src rows.
// Unsplit rows write out and lse directly; chunks of split rows write their unnormalised
// state (acc, m, l) to workspace slot `slot`, merged by gatv2_fwd_merge. When `logits` is
// given, raw float logits go to logits[caller edge, head] (gatv2_alpha_from_logits turns them
// into alpha; kept in float whatever TO is, so that exp(logit - lse) is not computed from a
// rounded logit).
template <typename TI, typename TO, int VW, int LH, int K, int DC, int U, bool ET>
__global__ void __launch_bounds__(GATV2_THREADS)
gatv2_fwd(const int4* __restrict__ items, long long n_work, int n_tiles,
          const int* __restrict__ indices, const int* __restrict__ perm,
          const TI* __restrict__ x_src, const TI* __restrict__ x_dst, const float* __restrict__ att,
          const TI* __restrict__ edge_term, int H, int D_rt, float slope,
          float p, unsigned long long seed, unsigned long long offset, const long long* __restrict__ rng,
          TO* __restrict__ out, float* __restrict__ lse,
          float* __restrict__ part_acc, float* __restrict__ part_m, float* __restrict__ part_l,
          float* __restrict__ logits) {
    const GfPhilox ph(rng, p, seed, offset);
    using R = GfRow<VW, LH, K, DC>;
    constexpr int KV = R::KV;
    const int D = DC > 0 ? DC : D_rt;
    const int HD = H * D;  // < 2**31 (checked by the launcher)
    const bool need_perm = edge_term != nullptr || p > 0.f || logits != nullptr;

    const long long n_warps = ((long long)gridDim.x * blockDim.x) >> 5;
    for (long long w = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; w < n_work; w += n_warps) {
        const GfItem wi = gf_item<LH>(items, w, n_tiles, H, D);
        const int row = wi.row, start = wi.start, end = wi.end, slot = wi.slot, hoff = wi.hoff;
        const GfLane ln = wi.ln;
        const int l = ln.l, s = ln.s, ES = ln.ES;

        float xd[KV], a[KV], acc[KV];
        R::load(xd, x_dst + (long long)row * HD + hoff, l, D, ln.on);
        R::load(a, att + hoff, l, D, ln.on);
#pragma unroll
        for (int k = 0; k < KV; ++k) acc[k] = 0.f;
        GfSoftmaxState st = gf_softmax_init();

        for (long long b = start; b < end; b += 32) {
            const int nb = (int)min(32LL, (long long)end - b);
            const int my_j = ln.lane < nb ? __ldg(indices + b + ln.lane) : 0;
            const int my_pe = (need_perm && ln.lane < nb) ? __ldg(perm + b + ln.lane) : 0;
            const int rounds = (nb + ES - 1) / ES;
            for (int r0 = 0; r0 < rounds; r0 += U) {
                float xs[U][KV], et[ET ? U : 1][KV], c[U];
                int pe[U];
                bool v[U];
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    const int q = (r0 + u) * ES + s;
                    v[u] = ln.on && (r0 + u) < rounds && q < nb;
                    const int j = __shfl_sync(GF_FULL_MASK, my_j, q & 31);
                    pe[u] = __shfl_sync(GF_FULL_MASK, my_pe, q & 31);
                    R::load(xs[u], x_src + (long long)j * HD + hoff, l, D, v[u]);
                    if constexpr (ET) R::load(et[u], edge_term + (long long)pe[u] * HD + hoff, l, D, v[u]);
                }
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    float part = 0.f;
#pragma unroll
                    for (int k = 0; k < KV; ++k) {
                        float z = xs[u][k] + xd[k];
                        if constexpr (ET) z += et[u][k];
                        part = fmaf(a[k], gf_lrelu(z, slope), part);
                    }
                    const float e = gf_group_sum<LH>(part);
                    c[u] = v[u] ? e : GF_NEG_INF;
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
                    float wgt = live ? gf_softmax_add(st, c[u]) : 0.f;
                    if (p > 0.f && v[u])
                        wgt *= gf_dropout_scale(p, ph.seed(), ph.offset(), (unsigned)pe[u], (unsigned)ln.head);
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
        if (ln.on && s == 0) gf_fwd_finish<R>(ln, st, acc, row, start, end, slot, H, D, hoff, out, lse, part_acc, part_m,
                                                 part_l);
    }
}

// Merge the chunk states of split rows (gf_merge_chunks). Needs blockDim.x == GATV2_MERGE_THREADS.
template <typename TO>
__global__ void __launch_bounds__(GATV2_MERGE_THREADS)
gatv2_fwd_merge(const int4* __restrict__ split, int n_split, const float* __restrict__ part_acc,
                const float* __restrict__ part_m, const float* __restrict__ part_l, int H, int D,
                TO* __restrict__ out, float* __restrict__ lse) {
    gf_merge_chunks<TO, GATV2_MERGE_THREADS>(split, n_split, part_acc, part_m, part_l, H, D, out, lse);
}

// alpha[caller edge, h] <- exp(logits[caller edge, h] - lse[row, h]) (times the dropout
// multiplier when `dropped`), from the raw logits gatv2_fwd wrote. For TO = float the
// launcher passes one buffer as both (in place: each element is read, then written, by one
// thread), hence no __restrict__ on them. One warp per work item.
template <typename TO>
__global__ void gatv2_alpha_from_logits(const int4* __restrict__ items, long long n_items,
                                        const int* __restrict__ perm, const float* __restrict__ lse,
                                        int H, float p, unsigned long long seed,
                                        unsigned long long offset, const long long* __restrict__ rng,
                                        int dropped, const float* logits, TO* alpha) {
    const GfPhilox ph(rng, p, seed, offset);
    gf_alpha_from_logits<TO>(items, n_items, perm, lse, H, p, ph.seed(), ph.offset(), dropped, logits, alpha, nullptr);
}

// delta_alpha[row, h] = sum over the row's edges of alpha_out[e, h] * grad_alpha[e, h] (caller order):
// the softmax-gradient term contributed by a gradient on the returned attention. Rows
// split into chunks accumulate with atomics (delta_alpha must be zeroed). One warp per work item.
template <typename TO>
__global__ void gatv2_delta_alpha(const int4* __restrict__ items, long long n_items,
                                  const int* __restrict__ perm, const TO* __restrict__ alpha,
                                  const TO* __restrict__ grad_alpha, int H, float* __restrict__ delta_alpha) {
    gf_delta_alpha<TO>(items, n_items, perm, alpha, grad_alpha, H, delta_alpha);
}

// =======================================================================================
// att's gradient in the backward passes: each lane's per-item sums go to the block's shared
// copy (when it fits: datt_smem) or straight to global memory, and the block adds its shared
// copy into datt once at the end, so atomics on datt stay one per block and column.
__device__ __forceinline__ void gatv2_datt_begin(float* sm_datt, bool use_smem, int HD) {
    if (use_smem) {  // kernel-uniform condition
        for (long long c = threadIdx.x; c < HD; c += blockDim.x) sm_datt[c] = 0.f;
        __syncthreads();
    }
}

template <int VW, int LH, int K, int DC>
__device__ __forceinline__ void gatv2_datt_add(float* sm_datt, float* datt, bool use_smem,
                                               const float (&gt)[K * VW], int l, int D, int hoff) {
    using R = GfRow<VW, LH, K, DC>;
#pragma unroll
    for (int k = 0; k < K; ++k) {
        if (R::ok(l, k, D)) {
#pragma unroll
            for (int t = 0; t < VW; ++t) {
                const long long c = hoff + R::col(l, k) + t;
                if (use_smem) atomicAdd(sm_datt + c, gt[VW * k + t]);
                else atomicAdd(datt + c, gt[VW * k + t]);
            }
        }
    }
}

__device__ __forceinline__ void gatv2_datt_end(const float* sm_datt, float* datt, bool use_smem, int HD) {
    if (use_smem) {
        __syncthreads();
        for (long long c = threadIdx.x; c < HD; c += blockDim.x) {
            const float v = sm_datt[c];
            if (v != 0.f) atomicAdd(datt + c, v);
        }
    }
}

// =======================================================================================
// Backward, destination-major. Per item: delta = <dO_i, O_i> (+ delta_alpha_i), then per edge
//   alpha = exp(e - L_i), dalpha = ds <dO_i, x_j> (+ grad_alpha * (ds if dropped)),
//   de = alpha (dalpha - delta), dz = de * att * LeakyReLU'(z),
//   dx_dst_i += dz (registers; atomics only for split rows, into dx_dst_acc: see below),
//   d_edge_term[perm] = dz,
//   datt += de * LeakyReLU(z) (registers -> shared -> one global atomic per block/column),
//   dx_src_j += alpha ds dO_i + dz (atomics, only when dx_src is given: the "atomic"
//   variant; the "transposed" variant leaves dx_src to gatv2_bwd_src and writes delta).
// Persistent grid (resident blocks only, warps striding over the items) so the datt atomics
// stay few.
// Split rows: whole rows store dx_dst (TI) directly; chunks of split rows add into dx_dst
// itself when TI is float (its split rows zeroed by the launcher), else into the float
// buffer dx_dst_acc at row acc_index[slot] (a zeroed [n_split, H, D] scratch the launcher
// casts into dx_dst). dx_src (atomic variant) and datt are float accumulators.
template <typename TI, typename TO, int VW, int LH, int K, int DC, int U, bool ET>
__global__ void __launch_bounds__(GATV2_THREADS)
gatv2_bwd_dst(const int4* __restrict__ items, long long n_work, int n_tiles,
              const int* __restrict__ indptr, const int* __restrict__ indices, const int* __restrict__ perm,
              const TI* __restrict__ x_src, const TI* __restrict__ x_dst, const float* __restrict__ att,
              const TI* __restrict__ edge_term, const TO* __restrict__ out, const TO* __restrict__ grad_out,
              const float* __restrict__ lse, const float* __restrict__ delta_alpha, const TO* __restrict__ grad_alpha,
              int grad_alpha_dropped, int H, int D_rt, float slope, float p, unsigned long long seed,
              unsigned long long offset, const long long* __restrict__ rng, float* dx_src, TI* dx_dst,
              float* dx_dst_acc, const int* __restrict__ acc_index, TI* __restrict__ d_edge_term,
              float* datt, int datt_smem, float* __restrict__ delta_out) {
    const GfPhilox ph(rng, p, seed, offset);
    using R = GfRow<VW, LH, K, DC>;
    constexpr int KV = R::KV;
    extern __shared__ float sm_datt[];
    const int D = DC > 0 ? DC : D_rt;
    const int HD = H * D;  // < 2**31 (checked by the launcher)
    const bool need_perm = edge_term != nullptr || p > 0.f || grad_alpha != nullptr;
    const bool use_smem = datt != nullptr && datt_smem != 0;

    gatv2_datt_begin(sm_datt, use_smem, HD);

    const long long n_warps = ((long long)gridDim.x * blockDim.x) >> 5;
    for (long long w = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; w < n_work; w += n_warps) {
        const GfItem wi = gf_item<LH>(items, w, n_tiles, H, D);
        const int row = wi.row, start = wi.start, end = wi.end, slot = wi.slot, hc = wi.hc, hoff = wi.hoff;
        const GfLane ln = wi.ln;
        const int l = ln.l, s = ln.s, ES = ln.ES;
        const long long rh = (long long)row * H + hc;

        float xd[KV], a[KV], dO[KV], gd[KV], gt[KV];
        float delta;
        {
            float o[KV];
            R::load(o, out + (long long)row * HD + hoff, l, D, ln.on);
            R::load(dO, grad_out + (long long)row * HD + hoff, l, D, ln.on);
            float part = 0.f;
#pragma unroll
            for (int k = 0; k < KV; ++k) part = fmaf(dO[k], o[k], part);
            delta = gf_group_sum<LH>(part);
        }
        if (delta_alpha != nullptr && ln.on) delta += delta_alpha[rh];
        const float Lr = (ln.on && end > start) ? lse[rh] : 0.f;
        if (delta_out != nullptr && ln.on && s == 0 && l == 0 && (slot < 0 || start == indptr[row])) delta_out[rh] = delta;
        R::load(xd, x_dst + (long long)row * HD + hoff, l, D, ln.on);
        R::load(a, att + hoff, l, D, ln.on);
#pragma unroll
        for (int k = 0; k < KV; ++k) {
            gd[k] = 0.f;
            gt[k] = 0.f;
        }

        for (long long b = start; b < end; b += 32) {
            const int nb = (int)min(32LL, (long long)end - b);
            const int my_j = ln.lane < nb ? __ldg(indices + b + ln.lane) : 0;
            const int my_pe = (need_perm && ln.lane < nb) ? __ldg(perm + b + ln.lane) : 0;
            const int rounds = (nb + ES - 1) / ES;
            for (int r0 = 0; r0 < rounds; r0 += U) {
                float xs[U][KV], et[ET ? U : 1][KV], gav[U];
                int pe[U], jj[U];
                bool v[U];
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    const int q = (r0 + u) * ES + s;
                    v[u] = ln.on && (r0 + u) < rounds && q < nb;
                    jj[u] = __shfl_sync(GF_FULL_MASK, my_j, q & 31);
                    pe[u] = __shfl_sync(GF_FULL_MASK, my_pe, q & 31);
                    R::load(xs[u], x_src + (long long)jj[u] * HD + hoff, l, D, v[u]);
                    if constexpr (ET) R::load(et[u], edge_term + (long long)pe[u] * HD + hoff, l, D, v[u]);
                    gav[u] = (grad_alpha != nullptr && v[u]) ? gf_ldg(grad_alpha + (long long)pe[u] * H + ln.head) : 0.f;
                }
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    // xs[u] becomes z = x_src + x_dst (+ edge_term) once its dot with dO is taken.
                    float pe_part = 0.f, po_part = 0.f;
#pragma unroll
                    for (int k = 0; k < KV; ++k) {
                        const float x = xs[u][k];
                        float z = x + xd[k];
                        if constexpr (ET) z += et[u][k];
                        xs[u][k] = z;
                        pe_part = fmaf(a[k], gf_lrelu(z, slope), pe_part);
                        po_part = fmaf(dO[k], x, po_part);
                    }
                    const float e = gf_group_sum<LH>(pe_part);
                    const float dxo = gf_group_sum<LH>(po_part);
                    if (v[u]) {  // lane-divergent, no shuffles inside
                        const float alpha = __expf(e - Lr);
                        const float ds =
                            p > 0.f ? gf_dropout_scale(p, ph.seed(), ph.offset(), (unsigned)pe[u], (unsigned)ln.head)
                                    : 1.f;
                        const float dal = ds * dxo + gav[u] * (grad_alpha_dropped ? ds : 1.f);
                        const float de = alpha * (dal - delta);
                        const float ad = alpha * ds;
                        float dz[KV];
#pragma unroll
                        for (int k = 0; k < KV; ++k) {
                            const float z = xs[u][k];
                            dz[k] = de * a[k] * (z > 0.f ? 1.f : slope);
                            gd[k] += dz[k];
                            gt[k] = fmaf(de, gf_lrelu(z, slope), gt[k]);
                        }
                        if (d_edge_term != nullptr) R::store(d_edge_term + (long long)pe[u] * HD + hoff, dz, l, D);
                        if (dx_src != nullptr) {
#pragma unroll
                            for (int k = 0; k < KV; ++k) dz[k] = fmaf(ad, dO[k], dz[k]);
                            R::atomic_add(dx_src + (long long)jj[u] * HD + hoff, dz, l, D);
                        }
                    }
                }
            }
        }

        gf_sum_slots<KV, LH>(gd, gt, ln);

        if (ln.on && s == 0) {
            if (dx_dst != nullptr) gf_store_row_grad<R>(dx_dst, dx_dst_acc, acc_index, gd, ln, row, slot, HD, hoff, D);
            if (datt != nullptr && end > start) gatv2_datt_add<VW, LH, K, DC>(sm_datt, datt, use_smem, gt, l, D, hoff);
        }
    }

    gatv2_datt_end(sm_datt, datt, use_smem, HD);
}

// =======================================================================================
// Backward, source-major ("transposed" variant): dx_src_j = sum over out-edges (j -> i) of
// alpha~_ij dO_i + dz_ij, with no atomics except for split source rows. Reads the
// transposed CSR (s_indices = destination ids, s_perm = caller edge ids) and delta (with delta_alpha
// folded in) from gatv2_bwd_dst. Split source rows as dx_dst in gatv2_bwd_dst: whole rows
// store dx_src (TI), chunks add into dx_src itself (TI = float) or into the float scratch
// dx_src_acc at row acc_index[slot].
template <typename TI, typename TO, int VW, int LH, int K, int DC, int U, bool ET>
__global__ void __launch_bounds__(GATV2_THREADS)
gatv2_bwd_src(const int4* __restrict__ items, long long n_work, int n_tiles,
              const int* __restrict__ s_indices, const int* __restrict__ s_perm,
              const TI* __restrict__ x_src, const TI* __restrict__ x_dst, const float* __restrict__ att,
              const TI* __restrict__ edge_term, const TO* __restrict__ grad_out, const float* __restrict__ lse,
              const float* __restrict__ delta, const TO* __restrict__ grad_alpha, int grad_alpha_dropped, int H, int D_rt,
              float slope, float p, unsigned long long seed, unsigned long long offset,
              const long long* __restrict__ rng, TI* dx_src, float* dx_src_acc, const int* __restrict__ acc_index) {
    const GfPhilox ph(rng, p, seed, offset);
    using R = GfRow<VW, LH, K, DC>;
    constexpr int KV = R::KV;
    const int D = DC > 0 ? DC : D_rt;
    const int HD = H * D;  // < 2**31 (checked by the launcher)
    const bool need_perm = edge_term != nullptr || p > 0.f || grad_alpha != nullptr;

    const long long n_warps = ((long long)gridDim.x * blockDim.x) >> 5;
    for (long long w = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; w < n_work; w += n_warps) {
        const GfItem wi = gf_item<LH>(items, w, n_tiles, H, D);
        const int row = wi.row, start = wi.start, end = wi.end, slot = wi.slot, hc = wi.hc, hoff = wi.hoff;
        const GfLane ln = wi.ln;
        const int l = ln.l, s = ln.s, ES = ln.ES;

        float xs[KV], a[KV], acc[KV];
        R::load(xs, x_src + (long long)row * HD + hoff, l, D, ln.on);
        R::load(a, att + hoff, l, D, ln.on);
#pragma unroll
        for (int k = 0; k < KV; ++k) acc[k] = 0.f;

        for (long long b = start; b < end; b += 32) {
            const int nb = (int)min(32LL, (long long)end - b);
            const int my_i = ln.lane < nb ? __ldg(s_indices + b + ln.lane) : 0;
            const int my_pe = (need_perm && ln.lane < nb) ? __ldg(s_perm + b + ln.lane) : 0;
            const int rounds = (nb + ES - 1) / ES;
            for (int r0 = 0; r0 < rounds; r0 += U) {
                float zt[U][KV], dO[U][KV], et[ET ? U : 1][KV], Lv[U], delta_v[U], gav[U];
                int pe[U];
                bool v[U];
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    const int q = (r0 + u) * ES + s;
                    v[u] = ln.on && (r0 + u) < rounds && q < nb;
                    const int i = __shfl_sync(GF_FULL_MASK, my_i, q & 31);
                    pe[u] = __shfl_sync(GF_FULL_MASK, my_pe, q & 31);
                    R::load(zt[u], x_dst + (long long)i * HD + hoff, l, D, v[u]);
                    R::load(dO[u], grad_out + (long long)i * HD + hoff, l, D, v[u]);
                    if constexpr (ET) R::load(et[u], edge_term + (long long)pe[u] * HD + hoff, l, D, v[u]);
                    const long long ih = (long long)i * H + hc;
                    Lv[u] = v[u] ? __ldg(lse + ih) : 0.f;
                    delta_v[u] = v[u] ? __ldg(delta + ih) : 0.f;
                    gav[u] = (grad_alpha != nullptr && v[u]) ? gf_ldg(grad_alpha + (long long)pe[u] * H + hc) : 0.f;
                }
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    float pe_part = 0.f, po_part = 0.f;
#pragma unroll
                    for (int k = 0; k < KV; ++k) {
                        float z = zt[u][k] + xs[k];
                        if constexpr (ET) z += et[u][k];
                        zt[u][k] = z;
                        pe_part = fmaf(a[k], gf_lrelu(z, slope), pe_part);
                        po_part = fmaf(dO[u][k], xs[k], po_part);
                    }
                    const float e = gf_group_sum<LH>(pe_part);
                    const float dxo = gf_group_sum<LH>(po_part);
                    if (v[u]) {
                        const float alpha = __expf(e - Lv[u]);
                        const float ds =
                            p > 0.f ? gf_dropout_scale(p, ph.seed(), ph.offset(), (unsigned)pe[u], (unsigned)ln.head)
                                    : 1.f;
                        const float dal = ds * dxo + gav[u] * (grad_alpha_dropped ? ds : 1.f);
                        const float de = alpha * (dal - delta_v[u]);
                        const float ad = alpha * ds;
#pragma unroll
                        for (int k = 0; k < KV; ++k) {
                            const float dz = de * a[k] * (zt[u][k] > 0.f ? 1.f : slope);
                            acc[k] += fmaf(ad, dO[u][k], dz);
                        }
                    }
                }
            }
        }

        gf_sum_slots<KV, LH>(acc, ln);
        if (ln.on && s == 0) gf_store_row_grad<R>(dx_src, dx_src_acc, acc_index, acc, ln, row, slot, HD, hoff, D);
    }
}

// =======================================================================================
// Backward of an undirected graph in one pass ("fused" variant). On a symmetric graph the
// in-edges k -> i of row i, reversed, are its out-edges i -> k, so one walk of the forward
// CSR takes both gradients of node i (s_perm[e]: the caller id of the reverse of CSR edge e,
// graph.kernel_source_csr()):
//   k -> i, destination i (as gatv2_bwd_dst): dx_dst_i, datt, d_edge_term[perm[e]];
//   i -> k, destination k (as gatv2_bwd_src): dx_src_i, with lse_k and delta_k (gatv2_delta).
// Each edge gathers x_src[k], x_dst[k] and dO_k in one sweep: the bytes of the destination
// and source-major passes together, without the atomics of the atomic variant. Both rows of
// the result stay in registers; chunks of split rows add theirs as the two-pass variant's
// (gf_store_row_grad: into dx_src / dx_dst itself for TI = float, their split rows zeroed by
// the launcher, else into the float scratch rows acc_index[slot] of dx_src_acc / dx_dst_acc).
template <typename TI, typename TO, int VW, int LH, int K, int DC, int U, bool ET>
__global__ void __launch_bounds__(GATV2_THREADS)
gatv2_bwd_undirected(const int4* __restrict__ items, long long n_work, int n_tiles,
                     const int* __restrict__ indices, const int* __restrict__ perm, const int* __restrict__ s_perm,
                     const TI* __restrict__ x_src, const TI* __restrict__ x_dst, const float* __restrict__ att,
                     const TI* __restrict__ edge_term, const TO* __restrict__ grad_out,
                     const float* __restrict__ lse, const float* __restrict__ delta,
                     const TO* __restrict__ grad_alpha, int grad_alpha_dropped, int H, int D_rt, float slope,
                     float p, unsigned long long seed, unsigned long long offset, const long long* __restrict__ rng,
                     TI* dx_src, float* dx_src_acc, TI* dx_dst, float* dx_dst_acc, const int* __restrict__ acc_index,
                     TI* __restrict__ d_edge_term, float* datt, int datt_smem) {
    const GfPhilox ph(rng, p, seed, offset);
    using R = GfRow<VW, LH, K, DC>;
    constexpr int KV = R::KV;
    extern __shared__ float sm_datt[];
    const int D = DC > 0 ? DC : D_rt;
    const int HD = H * D;  // < 2**31 (checked by the launcher)
    const bool need_perm = edge_term != nullptr || p > 0.f || grad_alpha != nullptr || d_edge_term != nullptr;
    const bool use_smem = datt != nullptr && datt_smem != 0;
    gatv2_datt_begin(sm_datt, use_smem, HD);

    const long long n_warps = ((long long)gridDim.x * blockDim.x) >> 5;
    for (long long w = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; w < n_work; w += n_warps) {
        const GfItem wi = gf_item<LH>(items, w, n_tiles, H, D);
        const int row = wi.row, start = wi.start, end = wi.end, slot = wi.slot, hc = wi.hc, hoff = wi.hoff;
        const GfLane ln = wi.ln;
        const int l = ln.l, s = ln.s, ES = ln.ES;
        const long long rh = (long long)row * H + hc;

        // the row's own: as destination (xd, dO, L_i, delta_i) and as source (xs)
        float xd[KV], xs[KV], a[KV], dO[KV], gd[KV], gt[KV], gs[KV];
        R::load(xd, x_dst + (long long)row * HD + hoff, l, D, ln.on);
        R::load(xs, x_src + (long long)row * HD + hoff, l, D, ln.on);
        R::load(a, att + hoff, l, D, ln.on);
        R::load(dO, grad_out + (long long)row * HD + hoff, l, D, ln.on);
        const bool has = ln.on && end > start;
        const float Lr = has ? lse[rh] : 0.f;
        const float dr = has ? delta[rh] : 0.f;
#pragma unroll
        for (int k = 0; k < KV; ++k) {
            gd[k] = 0.f;
            gt[k] = 0.f;
            gs[k] = 0.f;
        }

        for (long long b = start; b < end; b += 32) {
            const int nb = (int)min(32LL, (long long)end - b);
            const int my_k = ln.lane < nb ? __ldg(indices + b + ln.lane) : 0;
            const int my_pe = (need_perm && ln.lane < nb) ? __ldg(perm + b + ln.lane) : 0;
            const int my_pr = (need_perm && ln.lane < nb) ? __ldg(s_perm + b + ln.lane) : 0;
            const int rounds = (nb + ES - 1) / ES;
            for (int r0 = 0; r0 < rounds; r0 += U) {
                // per edge: x_src[k] (becomes z_in = x_src[k] + x_dst[i]), x_dst[k] (becomes
                // z_out = x_src[i] + x_dst[k]), dO_k; "in" is k -> i, "out" is i -> k
                float zi[U][KV], zo[U][KV], dOk[U][KV], eti[ET ? U : 1][KV], eto[ET ? U : 1][KV];
                float Lk[U], dk[U], gai[U], gao[U];
                int pe[U], pr[U];
                bool v[U];
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    const int q = (r0 + u) * ES + s;
                    v[u] = ln.on && (r0 + u) < rounds && q < nb;
                    const int kk = __shfl_sync(GF_FULL_MASK, my_k, q & 31);
                    pe[u] = __shfl_sync(GF_FULL_MASK, my_pe, q & 31);
                    pr[u] = __shfl_sync(GF_FULL_MASK, my_pr, q & 31);
                    R::load(zi[u], x_src + (long long)kk * HD + hoff, l, D, v[u]);
                    R::load(zo[u], x_dst + (long long)kk * HD + hoff, l, D, v[u]);
                    R::load(dOk[u], grad_out + (long long)kk * HD + hoff, l, D, v[u]);
                    if constexpr (ET) {
                        R::load(eti[u], edge_term + (long long)pe[u] * HD + hoff, l, D, v[u]);
                        R::load(eto[u], edge_term + (long long)pr[u] * HD + hoff, l, D, v[u]);
                    }
                    const long long kh = (long long)kk * H + hc;
                    Lk[u] = v[u] ? __ldg(lse + kh) : 0.f;
                    dk[u] = v[u] ? __ldg(delta + kh) : 0.f;
                    const bool ga = grad_alpha != nullptr && v[u];
                    gai[u] = ga ? gf_ldg(grad_alpha + (long long)pe[u] * H + hc) : 0.f;
                    gao[u] = ga ? gf_ldg(grad_alpha + (long long)pr[u] * H + hc) : 0.f;
                }
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    float ei = 0.f, oi = 0.f, eo = 0.f, oo = 0.f;
#pragma unroll
                    for (int k = 0; k < KV; ++k) {
                        const float xk = zi[u][k];
                        float z1 = xk + xd[k], z2 = xs[k] + zo[u][k];
                        if constexpr (ET) {
                            z1 += eti[u][k];
                            z2 += eto[u][k];
                        }
                        zi[u][k] = z1;
                        zo[u][k] = z2;
                        ei = fmaf(a[k], gf_lrelu(z1, slope), ei);
                        oi = fmaf(dO[k], xk, oi);
                        eo = fmaf(a[k], gf_lrelu(z2, slope), eo);
                        oo = fmaf(dOk[u][k], xs[k], oo);
                    }
                    const float e_in = gf_group_sum<LH>(ei), dxo_in = gf_group_sum<LH>(oi);
                    const float e_out = gf_group_sum<LH>(eo), dxo_out = gf_group_sum<LH>(oo);
                    if (v[u]) {  // lane-divergent, no shuffles inside
                        float ds_in = 1.f, ds_out = 1.f;
                        if (p > 0.f) {
                            ds_in = gf_dropout_scale(p, ph.seed(), ph.offset(), (unsigned)pe[u], (unsigned)ln.head);
                            ds_out = gf_dropout_scale(p, ph.seed(), ph.offset(), (unsigned)pr[u], (unsigned)ln.head);
                        }
                        const float alpha_in = __expf(e_in - Lr), alpha_out = __expf(e_out - Lk[u]);
                        const float de_in =
                            alpha_in * (ds_in * dxo_in + gai[u] * (grad_alpha_dropped ? ds_in : 1.f) - dr);
                        const float de_out =
                            alpha_out * (ds_out * dxo_out + gao[u] * (grad_alpha_dropped ? ds_out : 1.f) - dk[u]);
                        const float ad_out = alpha_out * ds_out;
                        float dz[KV];
#pragma unroll
                        for (int k = 0; k < KV; ++k) {
                            const float z1 = zi[u][k], z2 = zo[u][k];
                            dz[k] = de_in * a[k] * (z1 > 0.f ? 1.f : slope);
                            gd[k] += dz[k];
                            gt[k] = fmaf(de_in, gf_lrelu(z1, slope), gt[k]);
                            gs[k] += fmaf(ad_out, dOk[u][k], de_out * a[k] * (z2 > 0.f ? 1.f : slope));
                        }
                        if (d_edge_term != nullptr) R::store(d_edge_term + (long long)pe[u] * HD + hoff, dz, l, D);
                    }
                }
            }
        }

        gf_sum_slots<KV, LH>(gd, gt, ln);
        gf_sum_slots<KV, LH>(gs, ln);
        if (ln.on && s == 0) {
            if (dx_dst != nullptr) gf_store_row_grad<R>(dx_dst, dx_dst_acc, acc_index, gd, ln, row, slot, HD, hoff, D);
            if (dx_src != nullptr) gf_store_row_grad<R>(dx_src, dx_src_acc, acc_index, gs, ln, row, slot, HD, hoff, D);
            if (datt != nullptr && end > start) gatv2_datt_add<VW, LH, K, DC>(sm_datt, datt, use_smem, gt, l, D, hoff);
        }
    }
    gatv2_datt_end(sm_datt, datt, use_smem, HD);
}

// delta of every destination row before gatv2_bwd_undirected (gf_row_delta).
template <typename TO, int VW, int LH, int K, int DC>
__global__ void __launch_bounds__(GATV2_THREADS)
gatv2_delta(long long n_work, int n_tiles, const TO* __restrict__ out, const TO* __restrict__ grad_out,
            const float* __restrict__ delta_alpha, int H, int D_rt, float* __restrict__ delta) {
    gf_row_delta<VW, LH, K, DC>(n_work, n_tiles, out, grad_out, delta_alpha, H, DC > 0 ? DC : D_rt, delta);
}
