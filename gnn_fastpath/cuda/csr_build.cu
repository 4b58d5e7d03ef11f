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
