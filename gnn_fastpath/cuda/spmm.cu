// SpMM family: out = A @ x over destination-major CSR (rows are destinations), the per-edge
// values of A (DGL GraphConv degree normalisation, PyG gcn_norm), and the SDDMM that gives
// the gradient w.r.t. the edge weights. The launcher is gnn_fastpath/cuda/spmm.py; cuSPARSE
// is timed against spmm_rows/spmm_chunks there and the faster is kept per graph and width.
//
// CSR conventions: indptr [n_rows+1], indices [M] (source ids) and perm [M] (caller edge id
// of each CSR position) are int32. Per-edge tensors in the caller's order are read and
// written through perm.
//
// Feature mapping of the templated kernels: a group of T lanes (T a power of two <= 32,
// never straddling a warp) serves one row (or one edge range); each lane owns CH chunks of
// VEC consecutive features, chunk c covering features fb + c*T*VEC + lane*VEC .. +VEC-1,
// where fb = blockIdx.y * T*VEC*CH is the feature block. VEC is common.cuh's vector width
// (16-byte loads: 4 floats or 8 halves; the launcher checks F and the alignment). Edge
// metadata is loaded T edges at a time and broadcast; U = 4/CH rows' loads are in flight per
// lane.
//
// Storage types: dense inputs are read as TX and outputs written as TO (float, gf_half or
// gf_bf16, common.cuh); edge values, products and sums are float. Atomic partial sums go to
// float memory only: the output itself when TO is float, else a float scratch row per split
// row that spmm_split_store casts once (adding into 16-bit memory would round at every add).
#include "common.cuh"

// Degree-scale codes come from the launcher (-D defines), so Python and CUDA agree on them.
#if !defined(SPMM_SCALE_NONE) || !defined(SPMM_SCALE_INVERSE) || !defined(SPMM_SCALE_RSQRT)
#error "the SPMM_SCALE_* codes must be defined by the launcher"
#endif

// The row (destination) holding CSR position k: the last r with indptr[r] <= k.
// Requires 0 <= k < indptr[n_rows].
__device__ __forceinline__ int spmm_row_of(const int* __restrict__ indptr, int n_rows, int k) {
    int lo = 0, hi = n_rows;  // answer in [lo, hi)
    while (hi - lo > 1) {
        const int mid = lo + ((hi - lo) >> 1);
        if (__ldg(indptr + mid) <= k) lo = mid; else hi = mid;
    }
    return lo;
}

// DGL GraphConv degree scale of a structural degree (clamped to >= 1).
__device__ __forceinline__ float spmm_degree_scale(int degree, int mode) {
    if (mode == SPMM_SCALE_NONE) return 1.f;
    const float d = (float)(degree > 1 ? degree : 1);
    return mode == SPMM_SCALE_INVERSE ? 1.f / d : 1.f / sqrtf(d);
}

// ---------------------------------------------------------------------------------------
// SpMM, row-major CSR x row-major dense: short rows written whole (spmm_rows); long rows
// arrive as chunk items (worklist.py) whose partial sums are added atomically into rows the
// caller zeroed first (spmm_chunks).
template <typename TX, int VEC, int T, int CH>
__device__ __forceinline__ void spmm_sum_range(const int* __restrict__ indices, const float* __restrict__ values,
                                             const TX* __restrict__ x, int start, int end, int F, int f0,
                                             unsigned int mask, int lane, float (&acc)[CH][VEC]) {
    constexpr int U = CH >= 4 ? 1 : 4 / CH;
    for (int e0 = start; e0 < end; e0 += T) {
        const int k = e0 + lane;
        int s = 0;
        float a = 0.f;
        if (k < end) {
            s = __ldg(indices + k);
            a = __ldg(values + k);
        }
        const int nb = min(T, end - e0);
        int t = 0;
        for (; t + U - 1 < nb; t += U) {
            int ss[U];
            float aa[U], v[U][CH][VEC];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                ss[u] = __shfl_sync(mask, s, t + u, T);
                aa[u] = __shfl_sync(mask, a, t + u, T);
            }
#pragma unroll
            for (int u = 0; u < U; ++u)
#pragma unroll
                for (int c = 0; c < CH; ++c)
                    if (f0 + c * T * VEC < F) gf_load<VEC>(v[u][c], x + (long long)ss[u] * F + f0 + c * T * VEC);
#pragma unroll
            for (int u = 0; u < U; ++u)
#pragma unroll
                for (int c = 0; c < CH; ++c)
#pragma unroll
                    for (int j = 0; j < VEC; ++j) acc[c][j] = fmaf(aa[u], v[u][c][j], acc[c][j]);
        }
        for (; t < nb; ++t) {
            const int s0 = __shfl_sync(mask, s, t, T);
            const float a0 = __shfl_sync(mask, a, t, T);
#pragma unroll
            for (int c = 0; c < CH; ++c) {
                if (f0 + c * T * VEC < F) {
                    float v0[VEC];
                    gf_load<VEC>(v0, x + (long long)s0 * F + f0 + c * T * VEC);
#pragma unroll
                    for (int j = 0; j < VEC; ++j) acc[c][j] = fmaf(a0, v0[j], acc[c][j]);
                }
            }
        }
    }
}

// One group per row of `rows` (row = group id when rows is null); writes the whole row.
template <typename TX, typename TO, int VEC, int T, int CH>
__global__ void spmm_rows(const int* __restrict__ indptr, const int* __restrict__ indices,
                                 const float* __restrict__ values, const int* __restrict__ rows, int n_rows,
                                 const TX* __restrict__ x, int F, TO* __restrict__ out) {
    const int gid = (int)((blockIdx.x * (long long)blockDim.x + threadIdx.x) / T);
    const int lane = threadIdx.x % T;
    if (gid >= n_rows) return;
    const unsigned int mask = gf_group_mask<T>();
    const int row = rows != nullptr ? __ldg(rows + gid) : gid;
    const int f0 = blockIdx.y * (T * VEC * CH) + lane * VEC;
    float acc[CH][VEC];
#pragma unroll
    for (int c = 0; c < CH; ++c)
#pragma unroll
        for (int j = 0; j < VEC; ++j) acc[c][j] = 0.f;
    spmm_sum_range<TX, VEC, T, CH>(indices, values, x, __ldg(indptr + row), __ldg(indptr + row + 1), F, f0, mask,
                                   lane, acc);
#pragma unroll
    for (int c = 0; c < CH; ++c) {
        const int f = f0 + c * T * VEC;
        if (f < F) gf_store<VEC>(out + (long long)row * F + f, acc[c]);
    }
}

// Chunks of long rows: items [n_items] = (row, edge start, edge end, split row index);
// partial sums added atomically into row `row` of out (SLOT false: a float output whose split
// rows the caller zeroed) or into row `split row index` of a zeroed float scratch (SLOT
// true: 16-bit outputs, finished by spmm_split_store).
template <typename TX, int VEC, int T, int CH, bool SLOT>
__global__ void spmm_chunks(const int4* __restrict__ items, int n_items, const int* __restrict__ indices,
                                  const float* __restrict__ values, const TX* __restrict__ x, int F,
                                  float* __restrict__ out) {
    const int gid = (int)((blockIdx.x * (long long)blockDim.x + threadIdx.x) / T);
    const int lane = threadIdx.x % T;
    if (gid >= n_items) return;
    const unsigned int mask = gf_group_mask<T>();
    const int4 it = __ldg(items + gid);
    const int row = SLOT ? it.w : it.x, start = it.y, end = it.z;
    const int f0 = blockIdx.y * (T * VEC * CH) + lane * VEC;
    float acc[CH][VEC];
#pragma unroll
    for (int c = 0; c < CH; ++c)
#pragma unroll
        for (int j = 0; j < VEC; ++j) acc[c][j] = 0.f;
    spmm_sum_range<TX, VEC, T, CH>(indices, values, x, start, end, F, f0, mask, lane, acc);
#pragma unroll
    for (int c = 0; c < CH; ++c) {
        const int f = f0 + c * T * VEC;
        if (f < F) {
#pragma unroll
            for (int j = 0; j < VEC; ++j) atomicAdd(out + (long long)row * F + f + j, acc[c][j]);
        }
    }
}

// out[split[h].x, :] = scratch[h, :] for the n_split split rows (split[h] = (row, first chunk,
// chunks, 0)): the one cast of the float partial sums of spmm_chunks<..., SLOT = true>.
template <typename TO>
__global__ void spmm_split_store(const float* __restrict__ scratch, const int4* __restrict__ split, int n_split,
                                 int F, TO* __restrict__ out) {
    const long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (idx >= (long long)n_split * F) return;
    const int h = (int)(idx / F), f = (int)(idx % F);
    gf_st(out + (long long)__ldg(split + h).x * F + f, scratch[idx]);
}

// ---------------------------------------------------------------------------------------
// Per-edge values and their gradient.

// values[k] = c_dst[row(k)] * w[perm[k]] * c_src[indices[k]] in CSR order, with the
// structural degree scales of spmm_degree_scale (src_mode from out_deg, dst_mode from the
// row length). w may be null (weight 1); out_deg may be null when src_mode == 0.
extern "C" __global__ void spmm_edge_values(const int* __restrict__ indptr, const int* __restrict__ indices,
                                               const int* __restrict__ perm, const int* __restrict__ out_deg,
                                               const float* __restrict__ w, int n_rows, int n_edges,
                                               int src_mode, int dst_mode, float* __restrict__ values) {
    const int k = (int)(blockIdx.x * (long long)blockDim.x + threadIdx.x);
    if (k >= n_edges) return;
    float v = w != nullptr ? __ldg(w + __ldg(perm + k)) : 1.f;
    if (dst_mode != 0) {
        const int row = spmm_row_of(indptr, n_rows, k);
        v *= spmm_degree_scale(__ldg(indptr + row + 1) - __ldg(indptr + row), dst_mode);
    }
    if (src_mode != 0) v *= spmm_degree_scale(__ldg(out_deg + __ldg(indices + k)), src_mode);
    values[k] = v;
}

// dw[perm[k]] (+)= c_dst[row] * c_src[col] * <grad_out[row, :], x[col, :]> for CSR edges k, each
// group of T lanes walking the edge range [gid*epg, (gid+1)*epg) with its row's grad_out in
// registers. With several feature blocks (gridDim.y > 1) dw must be zeroed and `accumulate`
// set (partial dot products are atomically added); otherwise each edge is written once.
// grad_out is read as TG (the output's type), x as TX; dw is float (cast by the launcher).
template <typename TG, typename TX, int VEC, int T, int CH>
__global__ void spmm_edge_grad(const int* __restrict__ indptr, const int* __restrict__ indices,
                                  const int* __restrict__ perm, const int* __restrict__ out_deg, int n_rows,
                                  int n_edges, int src_mode, int dst_mode, const TG* __restrict__ grad_out,
                                  const TX* __restrict__ x, int F, int epg, int accumulate,
                                  float* __restrict__ dw) {
    const int gid = (int)((blockIdx.x * (long long)blockDim.x + threadIdx.x) / T);
    const int lane = threadIdx.x % T;
    const long long k0l = (long long)gid * epg;
    if (k0l >= n_edges) return;
    const int k0 = (int)k0l;
    const int k1 = min(n_edges, k0 + epg);
    const unsigned int mask = gf_group_mask<T>();
    const int fb = blockIdx.y * (T * VEC * CH);

    int row = spmm_row_of(indptr, n_rows, k0);
    int row_end = __ldg(indptr + row + 1);
    float g[CH][VEC];
    float c_dst = 1.f;
    bool load = true;
    for (int k = k0; k < k1; ++k) {
        if (k >= row_end) {
            do { ++row; row_end = __ldg(indptr + row + 1); } while (row_end <= k);
            load = true;
        }
        if (load) {
            load = false;
            c_dst = spmm_degree_scale(row_end - __ldg(indptr + row), dst_mode);
            const TG* dr = grad_out + (long long)row * F + fb;
#pragma unroll
            for (int c = 0; c < CH; ++c) {
                const int f = c * T * VEC + lane * VEC;
                if (fb + f < F) gf_load<VEC>(g[c], dr + f);
            }
        }
        const int s = __ldg(indices + k);
        const TX* xr = x + (long long)s * F + fb;
        float dot = 0.f;
#pragma unroll
        for (int c = 0; c < CH; ++c) {
            const int f = c * T * VEC + lane * VEC;
            if (fb + f < F) {
                float v[VEC];
                gf_load<VEC>(v, xr + f);
#pragma unroll
                for (int j = 0; j < VEC; ++j) dot = fmaf(g[c][j], v[j], dot);
            }
        }
        dot = gf_group_sum<T>(dot, mask);
        if (lane == 0) {
            float scale = c_dst;
            if (src_mode != 0) scale *= spmm_degree_scale(__ldg(out_deg + s), src_mode);
            const int e = __ldg(perm + k);
            if (accumulate) atomicAdd(dw + e, dot * scale); else dw[e] = dot * scale;
        }
    }
}

// PyG gcn_norm, step 1: deg[i] = sum of the weights of row i's edges (the in-degree of
// target i, weighted), one warp per row; dinv[i] = deg^-1/2, 0 where deg == 0.
// Without w, an edge weighs `fill` if it is a self loop (indices[k] == row) and 1 otherwise.
extern "C" __global__ void spmm_gcn_degree(const int* __restrict__ indptr, const int* __restrict__ indices,
                                         const int* __restrict__ perm, const float* __restrict__ w, int n_rows,
                                         float fill, float* __restrict__ dinv) {
    const long long tid = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    const int row = (int)(tid >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= n_rows) return;  // whole warps leave together
    const int start = __ldg(indptr + row), end = __ldg(indptr + row + 1);
    float sum = 0.f;
    for (int k = start + lane; k < end; k += 32) {
        sum += w != nullptr ? __ldg(w + __ldg(perm + k)) : (__ldg(indices + k) == row ? fill : 1.f);
    }
    sum = gf_group_sum<32>(sum);
    if (lane == 0) dinv[row] = sum == 0.f ? 0.f : 1.f / sqrtf(sum);
}

// PyG gcn_norm, step 2: out[perm[k]] = dinv[src] * w * dinv[dst] (PyG's multiplication order).
extern "C" __global__ void spmm_gcn_values(const int* __restrict__ indptr, const int* __restrict__ indices,
                                        const int* __restrict__ perm, const float* __restrict__ w, int n_rows,
                                        int n_edges, float fill, const float* __restrict__ dinv,
                                        float* __restrict__ out) {
    const int k = (int)(blockIdx.x * (long long)blockDim.x + threadIdx.x);
    if (k >= n_edges) return;
    const int row = spmm_row_of(indptr, n_rows, k);
    const int col = __ldg(indices + k);
    const int e = __ldg(perm + k);
    const float we = w != nullptr ? __ldg(w + e) : (col == row ? fill : 1.f);
    out[e] = (__ldg(dinv + col) * we) * __ldg(dinv + row);
}
