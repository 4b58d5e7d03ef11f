// Block-sparse SpMM on tensor cores, 16-bit features:  C [n_rows, F] = A [n_rows, n_cols] B.
//
// Layout (gnn_fastpath/cuda/block_spmm.py builds it on the GPU, once per matrix): rows are cut
// into windows of 16; the distinct columns of a window's entries, sorted, are packed 16 at a
// time into blocks. Block b of window w holds cols[b][16] (column ids, -1 = padding) and
// A's 16 x 16 values on those columns, row-major, as two 16-bit matrices hi + lo (lo = the
// rounding error of hi: every product is fp32-exact up to 2^-16 relative, as the CSR kernels'
// float32 values). window_ptr [n_windows + 1] gives each window's blocks.
//
// One warp per (window, 64-feature tile): per block it stages the 16 B rows of the tile in
// shared memory (16-byte loads; padding columns read as 0), then issues 8 n-tiles x 2
// (hi, lo) mma.sync m16n8k16 with float32 accumulators; the 16 x 64 result is written once.
// A B row that several rows of a window use is read once per window instead of once per
// entry: the win over the CSR kernels on graphs whose neighbourhoods are locally dense.
//
// Fragments (PTX ISA, mma.m16n8k16 with .f16/.bf16; g = lane / 4, t = lane % 4):
//   A (row): a0 = A[g][2t..2t+1], a1 = A[g+8][2t..], a2 = A[g][2t+8..], a3 = A[g+8][2t+8..]
//   B (col): b0 = B[2t..2t+1][g], b1 = B[2t+8..2t+9][g]
//   C:       c0,c1 = C[g][2t..2t+1], c2,c3 = C[g+8][2t..2t+1]
// (two 16-bit elements per 32-bit register, the lower index in the lower half).
#include "common.cuh"

#define BS_WARPS 4
#define BS_TILE 64             // features per warp
#define BS_STRIDE (BS_TILE + 8)  // shared row stride in halves (conflict-free B reads)

template <typename T>
struct bs_mma;

template <>
struct bs_mma<gf_bf16> {
    static __device__ __forceinline__ void run(float (&c)[4], const unsigned int (&a)[4], unsigned int b0,
                                               unsigned int b1) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

template <>
struct bs_mma<gf_half> {
    static __device__ __forceinline__ void run(float (&c)[4], const unsigned int (&a)[4], unsigned int b0,
                                               unsigned int b1) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

// The four A registers of one 16 x 16 block (row-major 16-bit values at p).
__device__ __forceinline__ void bs_load_a(unsigned int (&a)[4], const unsigned short* __restrict__ p, int g, int t) {
    const unsigned int* w = reinterpret_cast<const unsigned int*>(p);
    a[0] = __ldg(w + (g * 16 + 2 * t) / 2);
    a[1] = __ldg(w + ((g + 8) * 16 + 2 * t) / 2);
    a[2] = __ldg(w + (g * 16 + 2 * t + 8) / 2);
    a[3] = __ldg(w + ((g + 8) * 16 + 2 * t + 8) / 2);
}

// T: B's 16-bit type (gf_bf16 or gf_half; A has the same); TO: C's type (T or float).
// b [n_cols, F], c [n_rows, F] row-major, F % 8 == 0, 16-byte aligned (the launcher checks).
template <typename T, typename TO>
__global__ void bs_spmm(const int* __restrict__ window_ptr, const int* __restrict__ cols,
                        const T* __restrict__ a_hi, const T* __restrict__ a_lo, const T* __restrict__ b,
                        int n_windows, int n_rows, int F, int n_tiles, TO* __restrict__ c) {
    __shared__ __align__(16) unsigned short stage[BS_WARPS][16 * BS_STRIDE];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const long long item = (long long)blockIdx.x * BS_WARPS + warp;
    if (item >= (long long)n_windows * n_tiles) return;  // whole warps leave together
    const int w = (int)(item / n_tiles), f0 = (int)(item % n_tiles) * BS_TILE;
    const int g = lane / 4, t = lane % 4;
    unsigned short* xs = stage[warp];
    const unsigned short* bb = reinterpret_cast<const unsigned short*>(b);

    float acc[8][4];
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[j][i] = 0.f;

    const int first = __ldg(window_ptr + w), last = __ldg(window_ptr + w + 1);
    for (int blk = first; blk < last; ++blk) {
        // stage the block's 16 B rows of this tile: 16 rows x 8 chunks of 8 halves, 4 per lane
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int chunk = lane + 32 * i, row = chunk / 8, part = chunk % 8;
            const int col = __ldg(cols + (long long)blk * 16 + row);
            const int f = f0 + part * 8;
            uint4 v = make_uint4(0u, 0u, 0u, 0u);
            if (col >= 0 && f < F) v = __ldg(reinterpret_cast<const uint4*>(bb + (long long)col * F + f));
            *reinterpret_cast<uint4*>(xs + row * BS_STRIDE + part * 8) = v;
        }
        unsigned int ahi[4], alo[4];
        bs_load_a(ahi, reinterpret_cast<const unsigned short*>(a_hi) + (long long)blk * 256, g, t);
        bs_load_a(alo, reinterpret_cast<const unsigned short*>(a_lo) + (long long)blk * 256, g, t);
        __syncwarp();
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const int n = j * 8 + g;
            const unsigned int b0 = (unsigned int)xs[(2 * t) * BS_STRIDE + n] |
                                    ((unsigned int)xs[(2 * t + 1) * BS_STRIDE + n] << 16);
            const unsigned int b1 = (unsigned int)xs[(2 * t + 8) * BS_STRIDE + n] |
                                    ((unsigned int)xs[(2 * t + 9) * BS_STRIDE + n] << 16);
            bs_mma<T>::run(acc[j], ahi, b0, b1);
            bs_mma<T>::run(acc[j], alo, b0, b1);
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
        for (int j = 0; j < 8; ++j) {
            const int f = f0 + j * 8 + 2 * t;
            if (f >= F) continue;
            TO* p = c + (long long)row * F + f;
            gf_st(p, acc[j][2 * half]);
            gf_st(p + 1, acc[j][2 * half + 1]);
        }
    }
}
