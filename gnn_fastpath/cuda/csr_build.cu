// CSR construction kernels used by the Graph layer.
//
// csr_indptr_from_sorted: given the row ids of M edges sorted ascending, write the row
// offsets indptr[0..n_rows]. Thread e (0 <= e <= M) owns the boundary between edge e-1 and
// edge e and writes indptr[r] = e for every row r in (row[e-1], row[e]], with row[-1] = -1
// and row[M] = n_rows. Total work is O(M + n_rows), no atomics, no sort-order assumptions
// beyond ascending rows.

extern "C" __global__ void csr_indptr_from_sorted(const long long* __restrict__ rows,
                                                  long long num_edges,
                                                  long long n_rows,
                                                  long long* __restrict__ indptr) {
    long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e > num_edges) return;
    long long lo = (e == 0) ? -1 : rows[e - 1];
    long long hi = (e == num_edges) ? n_rows : rows[e];
    if (hi > n_rows) hi = n_rows;  // never write past indptr[n_rows], whatever the input
    for (long long r = lo + 1; r <= hi; ++r) {
        indptr[r] = e;
    }
}

// edge_facts: everything the Graph layer must know on the host about a new edge list, in
// one pass, so that building a graph costs one host synchronisation (reading `facts`):
//
//   facts[0], facts[1]: min and max source id      facts[2], facts[3]: min and max target id
//   facts[4]: pairs (e, e+1) with dst[e] > dst[e+1] (0: already grouped by target, no sort)
//   facts[5]: self loops (src == dst)
//   facts[8]: pairs (e, e+1) with dst[e] == dst[e+1] and src[e] > src[e+1] (0: the sources
//             ascend within each target's run)
//
// and the in- and out-degree of every node (int counts, zeroed by the caller). The ids are
// not validated yet (the host raises on facts[0..3] after reading them), so an id outside
// [0, n) is left out of the degree counts instead of being written out of bounds. `facts`
// starts as {LLONG_MAX, LLONG_MIN, LLONG_MAX, LLONG_MIN, 0, 0, 0, 0, 0} (6 and 7: degree_max).

__device__ __forceinline__ long long warp_min_ll(long long v) {
    for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_down_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ long long warp_max_ll(long long v) {
    for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_down_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ long long warp_sum_ll(long long v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    return v;
}

extern "C" __global__ void edge_facts(const long long* __restrict__ src, const long long* __restrict__ dst,
                                      long long num_edges, long long n_src, long long n_dst,
                                      long long* __restrict__ facts, int* __restrict__ in_degree,
                                      int* __restrict__ out_degree) {
    const long long LL_MAX = 0x7fffffffffffffffLL;
    long long src_lo = LL_MAX, src_hi = -LL_MAX - 1, dst_lo = LL_MAX, dst_hi = -LL_MAX - 1;
    long long unsorted = 0, loops = 0, unsorted_src = 0;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < num_edges; e += stride) {
        const long long s = src[e], d = dst[e];
        src_lo = min(src_lo, s); src_hi = max(src_hi, s);
        dst_lo = min(dst_lo, d); dst_hi = max(dst_hi, d);
        if (e + 1 < num_edges) {
            const long long d1 = dst[e + 1];
            if (d > d1) ++unsorted;
            else if (d == d1 && s > src[e + 1]) ++unsorted_src;
        }
        if (s == d) ++loops;
        if (d >= 0 && d < n_dst) atomicAdd(in_degree + d, 1);
        if (s >= 0 && s < n_src) atomicAdd(out_degree + s, 1);
    }
    src_lo = warp_min_ll(src_lo); src_hi = warp_max_ll(src_hi);
    dst_lo = warp_min_ll(dst_lo); dst_hi = warp_max_ll(dst_hi);
    unsorted = warp_sum_ll(unsorted); loops = warp_sum_ll(loops); unsorted_src = warp_sum_ll(unsorted_src);
    if ((threadIdx.x & 31) == 0) {
        atomicMin(facts + 0, src_lo); atomicMax(facts + 1, src_hi);
        atomicMin(facts + 2, dst_lo); atomicMax(facts + 3, dst_hi);
        if (unsorted) atomicAdd((unsigned long long*)(facts + 4), (unsigned long long)unsorted);
        if (loops) atomicAdd((unsigned long long*)(facts + 5), (unsigned long long)loops);
        if (unsorted_src) atomicAdd((unsigned long long*)(facts + 8), (unsigned long long)unsorted_src);
    }
}

// degree_max: facts[6] = max in-degree, facts[7] = max out-degree (facts[6], facts[7] start at 0).
extern "C" __global__ void degree_max(const int* __restrict__ in_degree, long long n_dst,
                                      const int* __restrict__ out_degree, long long n_src,
                                      long long* __restrict__ facts) {
    long long in_hi = 0, out_hi = 0;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < max(n_dst, n_src); i += stride) {
        if (i < n_dst) in_hi = max(in_hi, (long long)in_degree[i]);
        if (i < n_src) out_hi = max(out_hi, (long long)out_degree[i]);
    }
    in_hi = warp_max_ll(in_hi); out_hi = warp_max_ll(out_hi);
    if ((threadIdx.x & 31) == 0) {
        if (in_hi) atomicMax(facts + 6, in_hi);
        if (out_hi) atomicMax(facts + 7, out_hi);
    }
}
