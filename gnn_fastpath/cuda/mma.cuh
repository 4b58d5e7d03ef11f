// Tensor-core helpers of the block-sparse kernels (block_spmm.cu, block_attention.cu): the
// m16n8k16 mma with float32 accumulators on 16-bit operands, its fragment layouts, and
// asynchronous 16-byte copies from global to shared memory (sm_80+).
//
// Fragments (PTX ISA, mma.m16n8k16 with .f16/.bf16; g = lane / 4, t = lane % 4; two 16-bit
// elements per 32-bit register, the lower index in the lower half):
//   A (16 x 16, row): a0 = A[g][2t..2t+1], a1 = A[g+8][2t..], a2 = A[g][2t+8..], a3 = A[g+8][2t+8..]
//   B (16 x 8, col):  b0 = B[2t..2t+1][g], b1 = B[2t+8..2t+9][g]
//   C (16 x 8):       c0,c1 = C[g][2t..2t+1], c2,c3 = C[g+8][2t..2t+1]
// So the C fragments of two neighbouring n-tiles (columns 0..7 and 8..15), rounded to 16 bits,
// are the A fragment of a 16 x 16 product: a0 = (c0,c1) of tile 0, a1 = (c2,c3) of tile 0,
// a2 = (c0,c1) of tile 1, a3 = (c2,c3) of tile 1 (gf_mma_a_hi_lo).
#pragma once

#include "common.cuh"

template <typename T>
struct gf_mma;

// gf_mma<T>::run(c, a, b0, b1): c += A B for one 16 x 16 A and 16 x 8 B fragment of type T.
#define GF_MMA(T, PTX_T)                                                                                  \
    template <>                                                                                          \
    struct gf_mma<T> {                                                                                   \
        static __device__ __forceinline__ void run(float (&c)[4], const unsigned int (&a)[4], unsigned int b0, \
                                                   unsigned int b1) {                                   \
            asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." PTX_T "." PTX_T                          \
                         ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"                   \
                         : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                                  \
                         : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));                  \
        }                                                                                                \
    };
GF_MMA(gf_bf16, "bf16")
GF_MMA(gf_half, "f16")
#undef GF_MMA

// A fragments of the 16 x 16 float matrix whose two 16 x 8 C tiles are c[0], c[1], split in
// two 16-bit parts, hi = c rounded to T and lo = (c - hi) rounded to T: products with hi + lo
// carry a relative error of about u^2 (2^-16 bf16, 2^-22 fp16) instead of u, so a float32
// operand computed in registers (softmax weights, their gradients) enters a tensor-core
// product as if it were float32, for the price of a second mma.
template <typename T>
__device__ __forceinline__ void gf_mma_a_hi_lo(unsigned int (&hi)[4], unsigned int (&lo)[4], const float (&c)[2][4]) {
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            hi[j * 2 + r] = gf_pack2<T>(&c[j][2 * r]);
            float h[2];
            gf_unpack2<T>(h, hi[j * 2 + r]);
            const float rest[2] = {c[j][2 * r] - h[0], c[j][2 * r + 1] - h[1]};
            lo[j * 2 + r] = gf_pack2<T>(rest);
        }
}

// B fragment (b0, b1) of the 8 columns n0..n0+7 from a 16-bit tile in shared memory whose row
// r holds B[r][*] (k along the tile's rows, n along a row; `stride` in elements).
__device__ __forceinline__ void gf_mma_b_k_rows(unsigned int& b0, unsigned int& b1, const unsigned short* tile,
                                                int stride, int n0, int g, int t) {
    const unsigned short* p = tile + (2 * t) * stride + n0 + g;
    b0 = (unsigned int)p[0] | ((unsigned int)p[stride] << 16);
    b1 = (unsigned int)p[8 * stride] | ((unsigned int)p[9 * stride] << 16);
}

// B fragment of k-step k0..k0+15 when the tile's row n holds B[*][n] (B = Y^T for a tile of
// Y's rows: the two elements of a register are neighbours in a row).
__device__ __forceinline__ void gf_mma_b_n_rows(unsigned int& b0, unsigned int& b1, const unsigned short* tile,
                                                int stride, int n0, int k0, int g, int t) {
    const unsigned int* p = reinterpret_cast<const unsigned int*>(tile + (n0 + g) * stride + k0 + 2 * t);
    b0 = p[0];
    b1 = p[4];
}

// A fragment of k-step k0..k0+15 from a 16-row tile in shared memory (row r holds A[r][*]).
__device__ __forceinline__ void gf_mma_a_rows(unsigned int (&a)[4], const unsigned short* tile, int stride, int k0,
                                              int g, int t) {
    const unsigned short* p = tile + g * stride + k0 + 2 * t;
    a[0] = *reinterpret_cast<const unsigned int*>(p);
    a[1] = *reinterpret_cast<const unsigned int*>(p + 8 * stride);
    a[2] = *reinterpret_cast<const unsigned int*>(p + 8);
    a[3] = *reinterpret_cast<const unsigned int*>(p + 8 * stride + 8);
}

// ---------------------------------------------------------------------------------------
// Asynchronous copies (cp.async, sm_80+): 16 bytes from global to shared memory without a
// register round trip; `valid` false fills the 16 bytes with zeros and reads nothing.
__device__ __forceinline__ void gf_cp_async16(void* shared, const void* global, bool valid) {
    unsigned int s;
    asm volatile("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }\n" : "=r"(s) : "l"(shared));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(global), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void gf_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Wait until at most N committed groups of this thread are in flight (N an immediate).
template <int N>
__device__ __forceinline__ void gf_cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
