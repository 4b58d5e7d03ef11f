// Per-edge normalised values for SpMM (DGL GraphConv and PyG gcn_norm) and the SDDMM that
// gives the gradient w.r.t. the edge weights.
//
// CSR conventions: rows are destinations; indptr [n_rows+1], indices [M] (source ids) and
// perm [M] (caller edge id of each CSR position) are int32. Per-edge tensors in the caller's
// order are read and written through perm.
#include "aggregation_common.cuh"

// values[k] = c_dst[row(k)] * w[perm[k]] * c_src[indices[k]] in CSR order, with the
// structural degree scales of ga_degree_scale (src_mode from out_deg, dst_mode from the
// row length). w may be null (weight 1); out_deg may be null when src_mode == 0.
extern "C" __global__ void gf_spmm_edge_values(const int* __restrict__ indptr, const int* __restrict__ indices,
                                               const int* __restrict__ perm, const int* __restrict__ out_deg,
                                               const float* __restrict__ w, int n_rows, int n_edges,
                                               int src_mode, int dst_mode, float* __restrict__ values) {
    const int k = (int)(blockIdx.x * (long long)blockDim.x + threadIdx.x);
    if (k >= n_edges) return;
    float v = w != nullptr ? __ldg(w + __ldg(perm + k)) : 1.f;
    if (dst_mode != 0) {
        const int row = ga_row_of(indptr, n_rows, k);
        v *= ga_degree_scale(__ldg(indptr + row + 1) - __ldg(indptr + row), dst_mode);
    }
    if (src_mode != 0) v *= ga_degree_scale(__ldg(out_deg + __ldg(indices + k)), src_mode);
    values[k] = v;
}

// dw[perm[k]] (+)= c_dst[row] * c_src[col] * <dy[row, :], x[col, :]> for CSR edges k, each
// group of T lanes walking the edge range [gid*epg, (gid+1)*epg) with its row's dy in
// registers. With several feature blocks (gridDim.y > 1) dw must be zeroed and `accumulate`
// set (partial dot products are atomically added); otherwise each edge is written once.
template <int VEC, int T, int CH>
__global__ void gf_spmm_edge_grad(const int* __restrict__ indptr, const int* __restrict__ indices,
                                  const int* __restrict__ perm, const int* __restrict__ out_deg, int n_rows,
                                  int n_edges, int src_mode, int dst_mode, const float* __restrict__ dy,
                                  const float* __restrict__ x, int F, int epg, int accumulate,
                                  float* __restrict__ dw) {
    const int gid = (int)((blockIdx.x * (long long)blockDim.x + threadIdx.x) / T);
    const int lane = threadIdx.x % T;
    const long long k0l = (long long)gid * epg;
    if (k0l >= n_edges) return;
    const int k0 = (int)k0l;
    const int k1 = min(n_edges, k0 + epg);
    const unsigned int mask = ga_group_mask<T>();
    const int fb = blockIdx.y * (T * VEC * CH);

    int row = ga_row_of(indptr, n_rows, k0);
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
            c_dst = ga_degree_scale(row_end - __ldg(indptr + row), dst_mode);
            const float* dr = dy + (long long)row * F + fb;
#pragma unroll
            for (int c = 0; c < CH; ++c) {
                const int f = c * T * VEC + lane * VEC;
                if (fb + f < F) ga_load<VEC>(dr + f, g[c]);
            }
        }
        const int s = __ldg(indices + k);
        const float* xr = x + (long long)s * F + fb;
        float dot = 0.f;
#pragma unroll
        for (int c = 0; c < CH; ++c) {
            const int f = c * T * VEC + lane * VEC;
            if (fb + f < F) {
                float v[VEC];
                ga_load<VEC>(xr + f, v);
#pragma unroll
                for (int j = 0; j < VEC; ++j) dot = fmaf(g[c][j], v[j], dot);
            }
        }
        dot = ga_group_sum<T>(dot, mask);
        if (lane == 0) {
            float scale = c_dst;
            if (src_mode != 0) scale *= ga_degree_scale(__ldg(out_deg + s), src_mode);
            const int e = __ldg(perm + k);
            if (accumulate) atomicAdd(dw + e, dot * scale); else dw[e] = dot * scale;
        }
    }
}

// PyG gcn_norm, step 1: deg[i] = sum of the weights of row i's edges (the in-degree of
// target i, weighted), one warp per row; dinv[i] = deg^-1/2, 0 where deg == 0.
// Without w, an edge weighs `fill` if it is a self loop (indices[k] == row) and 1 otherwise.
extern "C" __global__ void gf_gcn_degree(const int* __restrict__ indptr, const int* __restrict__ indices,
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
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (lane == 0) dinv[row] = sum == 0.f ? 0.f : 1.f / sqrtf(sum);
}

// PyG gcn_norm, step 2: out[perm[k]] = dinv[src] * w * dinv[dst] (PyG's multiplication order).
extern "C" __global__ void gf_gcn_edges(const int* __restrict__ indptr, const int* __restrict__ indices,
                                        const int* __restrict__ perm, const float* __restrict__ w, int n_rows,
                                        int n_edges, float fill, const float* __restrict__ dinv,
                                        float* __restrict__ out) {
    const int k = (int)(blockIdx.x * (long long)blockDim.x + threadIdx.x);
    if (k >= n_edges) return;
    const int row = ga_row_of(indptr, n_rows, k);
    const int col = __ldg(indices + k);
    const int e = __ldg(perm + k);
    const float we = w != nullptr ? __ldg(w + e) : (col == row ? fill : 1.f);
    out[e] = (__ldg(dinv + col) * we) * __ldg(dinv + row);
}
