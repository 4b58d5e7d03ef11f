// Row-major CSR SpMM, out = A @ x with A's values in CSR order: an autotune candidate next to
// cuSPARSE's algorithms (cusparse_spmm.py keeps whichever is fastest per graph and width).
//
// Same mapping as the min/max kernels (aggregation_common.cuh): a group of T lanes per
// (row, feature block), CH chunks of VEC features per lane, edge metadata loaded T edges at
// a time and broadcast, U = 4/CH rows' loads in flight per lane. Light rows are written
// whole; heavy rows arrive as work items (row, start, end) whose partial sums are added
// atomically into rows the caller zeroed first.
#include "aggregation_common.cuh"

template <int VEC, int T, int CH>
__device__ __forceinline__ void cs_sum_range(const int* __restrict__ indices, const float* __restrict__ values,
                                             const float* __restrict__ x, int start, int end, int F, int f0,
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
                    if (f0 + c * T * VEC < F) ga_load<VEC>(x + (long long)ss[u] * F + f0 + c * T * VEC, v[u][c]);
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
                    ga_load<VEC>(x + (long long)s0 * F + f0 + c * T * VEC, v0);
#pragma unroll
                    for (int j = 0; j < VEC; ++j) acc[c][j] = fmaf(a0, v0[j], acc[c][j]);
                }
            }
        }
    }
}

// One group per row of `rows` (row = group id when rows is null); writes the whole row.
template <int VEC, int T, int CH>
__global__ void gf_csr_spmm_rows(const int* __restrict__ indptr, const int* __restrict__ indices,
                                 const float* __restrict__ values, const int* __restrict__ rows, int n_rows,
                                 const float* __restrict__ x, int F, float* __restrict__ out) {
    const int gid = (int)((blockIdx.x * (long long)blockDim.x + threadIdx.x) / T);
    const int lane = threadIdx.x % T;
    if (gid >= n_rows) return;
    const unsigned int mask = ga_group_mask<T>();
    const int row = rows != nullptr ? __ldg(rows + gid) : gid;
    const int f0 = blockIdx.y * (T * VEC * CH) + lane * VEC;
    float acc[CH][VEC];
#pragma unroll
    for (int c = 0; c < CH; ++c)
#pragma unroll
        for (int j = 0; j < VEC; ++j) acc[c][j] = 0.f;
    cs_sum_range<VEC, T, CH>(indices, values, x, __ldg(indptr + row), __ldg(indptr + row + 1), F, f0, mask, lane,
                             acc);
#pragma unroll
    for (int c = 0; c < CH; ++c) {
        const int f = f0 + c * T * VEC;
        if (f < F) ga_store<VEC>(out + (long long)row * F + f, acc[c]);
    }
}

// Heavy rows: items [n_items, 3] = (row, edge start, edge end); out's heavy rows pre-zeroed.
template <int VEC, int T, int CH>
__global__ void gf_csr_spmm_items(const int* __restrict__ items, int n_items, const int* __restrict__ indices,
                                  const float* __restrict__ values, const float* __restrict__ x, int F,
                                  float* __restrict__ out) {
    const int gid = (int)((blockIdx.x * (long long)blockDim.x + threadIdx.x) / T);
    const int lane = threadIdx.x % T;
    if (gid >= n_items) return;
    const unsigned int mask = ga_group_mask<T>();
    const int row = __ldg(items + 3 * gid), start = __ldg(items + 3 * gid + 1), end = __ldg(items + 3 * gid + 2);
    const int f0 = blockIdx.y * (T * VEC * CH) + lane * VEC;
    float acc[CH][VEC];
#pragma unroll
    for (int c = 0; c < CH; ++c)
#pragma unroll
        for (int j = 0; j < VEC; ++j) acc[c][j] = 0.f;
    cs_sum_range<VEC, T, CH>(indices, values, x, start, end, F, f0, mask, lane, acc);
#pragma unroll
    for (int c = 0; c < CH; ++c) {
        const int f = f0 + c * T * VEC;
        if (f < F) {
#pragma unroll
            for (int j = 0; j < VEC; ++j) atomicAdd(out + (long long)row * F + f + j, acc[c][j]);
        }
    }
}
