// Block-sparse SpMM on tensor cores, 16-bit features:  C [n_rows, F] = A [n_rows, n_cols] B.
//
// Layout (gnn_fastpath/cuda/block_layout.py builds it on the GPU, once per matrix): rows are cut
// into windows of 16; the distinct columns of a window's entries, sorted, are packed 16 at a
// time into blocks. Block b of window w holds cols[b][16] (column ids, -1 = padding) and
// A's 16 x 16 values on those columns, row-major, in B's 16-bit type (as cuSPARSE takes A in
// B's type). window_ptr [n_windows + 1] gives each window's blocks.
//
// One warp per (window, NT * 8 features): per block it stages the 16 B rows of its features
// in shared memory (16-byte loads; padding columns read as 0) and issues NT mma.sync
// m16n8k16 with float32 accumulators; the next block's B rows and A fragment are loaded into
// registers while the current block's mmas run (the column ids a B load needs make each
// block's loads a dependent pair). The 16 x NT*8 result is written once. A B row that several
// rows of a window use is read once per window instead of once per entry: the win over the
// CSR kernels on graphs whose neighbourhoods are locally dense.
//
// Fragment layouts and the mma: mma.cuh.
#include "common.cuh"
#include "mma.cuh"

#define BS_WARPS 4

// The four A registers of one 16 x 16 block (row-major 16-bit values at p).
__device__ __forceinline__ void bs_load_a(unsigned int (&a)[4], const unsigned short* __restrict__ p, int g, int t) {
    const unsigned int* w = reinterpret_cast<const unsigned int*>(p);
    a[0] = __ldg(w + (g * 16 + 2 * t) / 2);
    a[1] = __ldg(w + ((g + 8) * 16 + 2 * t) / 2);
    a[2] = __ldg(w + (g * 16 + 2 * t + 8) / 2);
    a[3] = __ldg(w + ((g + 8) * 16 + 2 * t + 8) / 2);
}

// The registers one block needs: the lane's CHUNKS 16-byte pieces of the block's B rows
// (chunk lane + 32 i: row chunk / NT, features (chunk % NT) * 8 ..+8) and its A fragment.
template <int NT>
struct bs_stage {
    static constexpr int PARTS = NT;                 // 8-feature pieces per row
    static constexpr int CHUNKS = 16 * PARTS / 32;   // per lane
    uint4 x[CHUNKS];
    unsigned int a[4];
};

template <int NT>
__device__ __forceinline__ void bs_fetch(bs_stage<NT>& st, int blk, const int* __restrict__ cols,
                                         const unsigned short* __restrict__ a, const unsigned short* __restrict__ bb,
                                         int F, int f0, int lane) {
    constexpr int PARTS = bs_stage<NT>::PARTS;
#pragma unroll
    for (int i = 0; i < bs_stage<NT>::CHUNKS; ++i) {
        const int chunk = lane + 32 * i, row = chunk / PARTS, part = chunk % PARTS;
        const int col = __ldg(cols + (long long)blk * 16 + row);
        const int f = f0 + part * 8;
        st.x[i] = make_uint4(0u, 0u, 0u, 0u);
        if (col >= 0 && f < F) st.x[i] = __ldg(reinterpret_cast<const uint4*>(bb + (long long)col * F + f));
    }
    bs_load_a(st.a, a + (long long)blk * 256, lane / 4, lane % 4);
}

// T: B's 16-bit type (gf_bf16 or gf_half; A has the same); TO: C's type (T or float); NT:
// n-tiles of 8 features per warp (8 or 16). b [n_cols, F], c [n_rows, F] row-major,
// F % 8 == 0, 16-byte aligned (the launcher checks).
template <typename T, typename TO, int NT>
__global__ void bs_spmm(const int* __restrict__ window_ptr, const int* __restrict__ cols,
                        const T* __restrict__ a, const T* __restrict__ b, int n_windows, int n_rows, int F,
                        int n_tiles, TO* __restrict__ c) {
    constexpr int STRIDE = NT * 8 + 8;  // shared row stride in halves (conflict-free B reads)
    constexpr int PARTS = bs_stage<NT>::PARTS;
    __shared__ __align__(16) unsigned short stage[BS_WARPS][16 * STRIDE];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const long long item = (long long)blockIdx.x * BS_WARPS + warp;
    if (item >= (long long)n_windows * n_tiles) return;  // whole warps leave together
    const int w = (int)(item / n_tiles), f0 = (int)(item % n_tiles) * NT * 8;
    const int g = lane / 4, t = lane % 4;
    unsigned short* xs = stage[warp];
    const unsigned short* bb = reinterpret_cast<const unsigned short*>(b);
    const unsigned short* aa = reinterpret_cast<const unsigned short*>(a);

    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[j][i] = 0.f;

    const int first = __ldg(window_ptr + w), last = __ldg(window_ptr + w + 1);
    bs_stage<NT> next;
    if (first < last) bs_fetch<NT>(next, first, cols, aa, bb, F, f0, lane);
    for (int blk = first; blk < last; ++blk) {
#pragma unroll
        for (int i = 0; i < bs_stage<NT>::CHUNKS; ++i) {
            const int chunk = lane + 32 * i;
            *reinterpret_cast<uint4*>(xs + (chunk / PARTS) * STRIDE + (chunk % PARTS) * 8) = next.x[i];
        }
        const unsigned int frag[4] = {next.a[0], next.a[1], next.a[2], next.a[3]};
        if (blk + 1 < last) bs_fetch<NT>(next, blk + 1, cols, aa, bb, F, f0, lane);  // in flight meanwhile
        __syncwarp();
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            unsigned int b0, b1;
            gf_mma_b_k_rows(b0, b1, xs, STRIDE, j * 8, g, t);
            gf_mma<T>::run(acc[j], frag, b0, b1);
        }
        __syncwarp();  // the next block overwrites the stage
    }

    // C[g][2t..], C[g+8][2t..] of each n-tile; rows past n_rows (the last window) and
    // features past F are not written
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int row = w * 16 + g + 8 * half;
        if (row >= n_rows) continue;
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            const int f = f0 + j * 8 + 2 * t;
            if (f >= F) continue;
            TO* p = c + (long long)row * F + f;
            gf_st(p, acc[j][2 * half]);
            gf_st(p + 1, acc[j][2 * half + 1]);
        }
    }
}
