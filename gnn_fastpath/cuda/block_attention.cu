// Dot-product (Graph Transformer) attention on tensor cores over the block-sparse layout of the
// graph (16-bit q, k, v; no edge term: that takes the CSR kernels of dot_attention.cu). The math,
// the saved statistics and the attention dropout (multiplier s_ij from Philox keyed by the
// caller's edge id: the same edges dropped in both families) are dot_attention.cu's:
//
//   e_ij = c <q_i, k_j>,  alpha_ij = exp(e_ij - lse_i),  o_i = sum_j alpha_ij s_ij v_j,
//   delta_i = <o_i, do_i>,  de_ij = alpha_ij (s_ij <do_i, v_j> - delta_i),
//   dq_i = c sum_j de_ij k_j,  dk_j = c sum_i de_ij q_i,  dv_j = sum_i alpha_ij s_ij do_i,
//
// per head, lse and delta float32 [rows, H]; any pass may follow any forward of either family.
//
// Layout (gnn_fastpath/cuda/block_layout.py): the rows of a CSR in windows of 16, each window's
// distinct columns packed 16 per block (cols, -1 = padding) with one 16-bit mask per (block, row)
// saying which of the block's columns the row has an edge to; on a multigraph, a uint8 count per
// cell multiplies each weight (a softmax over edges counts parallel ones). The forward and the dq
// pass walk the destination-major layout (rows: destinations, columns: sources); the dk/dv pass
// walks the source-major one (the transpose's layout; an undirected graph's is the forward one).
//
// One warp per (work item, head), FlashAttention-style on 16 x 16 tiles (an item: a window, or a
// chunk of a window with many blocks, whose partial rows a merge combines: dot_attention.cu's
// dot_fwd_merge and dot_sum_partials, which the CSR kernels' split rows use too): per block the 16
// column rows of the head are staged in shared memory by cp.async, double-buffered (the next
// block's copies fly while this block's mmas run); the window's 16 rows stay in registers as mma A
// fragments (forward: q; dq pass: q and do) or in shared memory (dk/dv pass: k and v, read per
// k-step, to leave registers to the two accumulators). Logits come from m16n8k16 mmas with float32
// accumulators; the masks and an online softmax in float32 (base 2) turn them into weights, which
// enter the value product as two 16-bit parts (hi + lo, mma.cuh), so that product is
// float32-accurate (relative error ~u^2) and the output is rounded once, as the CSR kernels round
// it. The gradient passes split de and alpha the same way. A column row several window rows use is
// read once per window instead of once per edge: the win over the CSR kernels where neighbourhoods
// are locally dense. Unlike the CSR kernels, a non-finite k or v row (or do row in the dk/dv pass)
// reaches the other rows of the windows whose blocks hold it: the tensor-core product multiplies
// it by the 0 weights of their non-edges (0 x inf = NaN).
//
// Shapes: q [n_dst, H, D], k, v [n_src, H, D] (T), out [n_dst, H, D] (TO: T or float32), do
// [n_dst, H, D] in T (grad_out16: a float32 do rounded to T by the launcher), D in 16..128 a
// multiple of 16, rows 16-byte aligned (the launcher checks).
#include "common.cuh"
#include "attention_common.cuh"
#include "mma.cuh"

#define BA_LOG2E 1.4426950408889634f
#define BA_LN2 0.6931471805599453f

// Warps per thread block: the forward and dq pass keep 2 x 2 staged tiles per warp, the dk/dv
// pass 2 x 2 plus the window's k and v (static shared memory stays under 48 KiB at D = 128).
#ifndef BA_WARPS
#define BA_WARPS 2
#endif
#ifndef BA_SRC_WARPS
#define BA_SRC_WARPS 1
#endif

template <int D>
struct ba_shape {
    static constexpr int ST = D + 8;              // shared row stride in halves (conflict-free fragment reads)
    static constexpr int TILE = 16 * ST;          // halves per staged 16-row tile
    static constexpr int KS = D / 16;             // k-steps over a head
    static constexpr int NT = D / 8;              // n-tiles of 8 over a head
    static constexpr int PARTS = D / 8;           // 16-byte pieces of a head row
    static constexpr int CHUNKS = 16 * PARTS / 32;  // pieces per lane of a 16-row tile
    // dk/dv pass (one warp per block): blocks per SM to leave registers for. For D <= 64 the
    // cap buys occupancy (more loads in flight) over the compiler's own choice; at D = 128 any
    // cap spills, so the compiler's choice stands (1).
    static constexpr int SRC_MIN_BLOCKS = D <= 16 ? 32 : D <= 32 ? 24 : D <= 64 ? 10 : 1;
};

// Start copying head h of the 16 rows ids[0..15] of x [*, H, D] into a tile (a row id < 0:
// zeros).
template <int D>
__device__ __forceinline__ void ba_stage_rows(unsigned short* tile, const int* __restrict__ ids,
                                              const unsigned short* __restrict__ x, int H, int h, int lane) {
    using S = ba_shape<D>;
#pragma unroll
    for (int i = 0; i < S::CHUNKS; ++i) {
        const int chunk = lane + 32 * i, r = chunk / S::PARTS, part = chunk % S::PARTS;
        const int id = __ldg(ids + r);
        const unsigned short* src = x + ((long long)(id < 0 ? 0 : id) * H + h) * D + part * 8;
        gf_cp_async16(tile + r * S::ST + part * 8, src, id >= 0);
    }
}

// The same for 16 consecutive rows row0.. (rows past n_rows: zeros).
template <int D>
__device__ __forceinline__ void ba_stage_window(unsigned short* tile, long long row0, int n_rows,
                                                const unsigned short* __restrict__ x, int H, int h, int lane) {
    using S = ba_shape<D>;
#pragma unroll
    for (int i = 0; i < S::CHUNKS; ++i) {
        const int chunk = lane + 32 * i, r = chunk / S::PARTS, part = chunk % S::PARTS;
        const bool ok = row0 + r < n_rows;
        const unsigned short* src = x + ((ok ? row0 + r : 0) * H + h) * D + part * 8;
        gf_cp_async16(tile + r * S::ST + part * 8, src, ok);
    }
}

// A fragments of the 16 rows row0.. of head h of x [*, H, D] for every k-step, from global
// memory (rows past n_rows: zeros).
template <int D>
__device__ __forceinline__ void ba_window_fragments(unsigned int (&a)[D / 16][4], const unsigned short* __restrict__ x,
                                                    long long row0, int n_rows, int H, int h, int g, int t) {
    const bool ok0 = row0 + g < n_rows, ok1 = row0 + g + 8 < n_rows;
    const unsigned int* p0 = reinterpret_cast<const unsigned int*>(x + ((row0 + g) * H + h) * D + 2 * t);
    const unsigned int* p1 = reinterpret_cast<const unsigned int*>(x + ((row0 + g + 8) * H + h) * D + 2 * t);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        a[kk][0] = ok0 ? __ldg(p0 + kk * 8) : 0u;
        a[kk][1] = ok1 ? __ldg(p1 + kk * 8) : 0u;
        a[kk][2] = ok0 ? __ldg(p0 + kk * 8 + 4) : 0u;
        a[kk][3] = ok1 ? __ldg(p1 + kk * 8 + 4) : 0u;
    }
}

// C [16 x 16] (two n-tiles) += A [16 x D] Y^T for A in registers (fragments per k-step) and a
// tile of Y's 16 rows.
template <typename T, int D>
__device__ __forceinline__ void ba_logits(float (&c)[2][4], const unsigned int (&a)[D / 16][4],
                                          const unsigned short* tile, int g, int t) {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            unsigned int b0, b1;
            gf_mma_b_n_rows(b0, b1, tile, ba_shape<D>::ST, j * 8, kk * 16, g, t);
            gf_mma<T>::run(c[j], a[kk], b0, b1);
        }
}

// The same with A's 16 rows in a shared tile.
template <typename T, int D>
__device__ __forceinline__ void ba_logits_shared(float (&c)[2][4], const unsigned short* a_tile,
                                                 const unsigned short* tile, int g, int t) {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        unsigned int a[4];
        gf_mma_a_rows(a, a_tile, ba_shape<D>::ST, kk * 16, g, t);
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            unsigned int b0, b1;
            gf_mma_b_n_rows(b0, b1, tile, ba_shape<D>::ST, j * 8, kk * 16, g, t);
            gf_mma<T>::run(c[j], a, b0, b1);
        }
    }
}

// acc [16 x D] += A [16 x 16] Y for a tile of Y's 16 rows, A = hi + lo (gf_mma_a_hi_lo of a
// float32 matrix: two mmas per n-tile on one B fragment).
template <typename T, int D>
__device__ __forceinline__ void ba_accumulate(float (&acc)[D / 8][4], const float (&a)[2][4],
                                              const unsigned short* tile, int g, int t) {
    unsigned int hi[4], lo[4];
    gf_mma_a_hi_lo<T>(hi, lo, a);
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
        unsigned int b0, b1;
        gf_mma_b_k_rows(b0, b1, tile, ba_shape<D>::ST, n * 8, g, t);
        gf_mma<T>::run(acc[n], hi, b0, b1);
        gf_mma<T>::run(acc[n], lo, b0, b1);
    }
}

// float16's de. The gradient products take de as two float16 parts, whose range (65504) a
// large grad_out exceeds (a GradScaler multiplies the loss by up to 2**16), where bfloat16 has
// float32's. So under float16 each window row r keeps a power-of-two divisor scl[r] of its de,
// as small as the row's largest |de| so far allows (the parts stay below 2**15): when a block's
// de needs a larger one, the row's accumulator, which holds sums at the old divisor, is scaled
// down to the new one (exact: powers of two), and the store multiplies scl back. A non-finite
// de leaves the divisor alone (its row is non-finite whatever the divisor). bfloat16: nothing.
template <typename T>
struct BaScalesDe {
    static constexpr bool value = false;
};
template <>
struct BaScalesDe<gf_half> {
    static constexpr bool value = true;
};

template <typename T, int NT>
__device__ __forceinline__ void ba_scale_de(float (&de)[2][4], float (&acc)[NT][4], float (&scl)[2]) {
    if constexpr (BaScalesDe<T>::value) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float mx = fmaxf(fmaxf(fabsf(de[0][2 * r]), fabsf(de[0][2 * r + 1])),
                             fmaxf(fabsf(de[1][2 * r]), fabsf(de[1][2 * r + 1])));
            mx = fmaxf(mx, __shfl_xor_sync(GF_FULL_MASK, mx, 1));  // the 4 lanes of row g + 8 r
            mx = fmaxf(mx, __shfl_xor_sync(GF_FULL_MASK, mx, 2));
            if (mx >= 32768.f * scl[r] && mx <= 3.402823466e38f) {
                const int e = (__float_as_int(mx) >> 23) - 127;                // mx < 2**(e + 1)
                const float grown = __int_as_float((e - 14 + 127) << 23);       // 2**(e - 14)
                const float shrink = scl[r] / grown;
#pragma unroll
                for (int n = 0; n < NT; ++n) {
                    acc[n][2 * r] *= shrink;
                    acc[n][2 * r + 1] *= shrink;
                }
                scl[r] = grown;
            }
            const float inv = 1.f / scl[r];  // exact: a power of two
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                de[j][2 * r] *= inv;
                de[j][2 * r + 1] *= inv;
            }
        }
    }
}

// Whether the lane's cell (row g + 8 r, column j * 8 + 2 t + e) of a block has an edge.
__device__ __forceinline__ bool ba_edge(const unsigned int (&mask)[2], int j, int r, int e, int t) {
    return (mask[r] >> (j * 8 + 2 * t + e)) & 1u;
}

// A cell's weight times its number of parallel edges (counts: uint8 per cell of the layout,
// null when every cell holds at most one edge, as in a simple graph).
__device__ __forceinline__ float ba_times_count(float p, const unsigned char* __restrict__ counts, int blk, int row,
                                                int col) {
    return counts == nullptr ? p : p * (float)__ldg(counts + ((long long)blk * 16 + row) * 16 + col);
}

// Two neighbouring elements of a row as float, and stored from float (T: float or 16-bit).
template <typename T>
__device__ __forceinline__ void ba_ld2(float (&v)[2], const T* __restrict__ p) {
    if constexpr (sizeof(T) == 4) {
        const float2 x = __ldg(reinterpret_cast<const float2*>(p));
        v[0] = x.x;
        v[1] = x.y;
    } else {
        gf_unpack2<T>(v, __ldg(reinterpret_cast<const unsigned int*>(p)));
    }
}
template <typename T>
__device__ __forceinline__ void ba_st2(T* __restrict__ p, float a, float b) {
    if constexpr (sizeof(T) == 4) {
        *reinterpret_cast<float2*>(p) = make_float2(a, b);
    } else {
        const float two[2] = {a, b};
        *reinterpret_cast<unsigned int*>(p) = gf_pack2<T>(two);
    }
}

// Attention dropout: ba_keep_bits draws every edge's multiplier once per call (Philox keyed by
// (seed, offset, caller edge id, head), as the CSR kernels draw it, so both families drop the same
// edges) into one bit per cell and head, keep[(block * 16 + row) * H + head]; a pass reads the
// words of its lane's rows g and g + 8 (ba_keep_words) and multiplies a cell's weight by `scale` =
// 1 / (1 - p) where its bit is set, else 0 (ba_kept; without dropout all bits set and scale 1).
__device__ __forceinline__ float ba_kept(const unsigned int (&keep)[2], int r, int col, float scale) {
    return (keep[r] >> col) & 1u ? scale : 0.f;
}

__device__ __forceinline__ void ba_keep_words(unsigned int (&keep)[2], const unsigned int* __restrict__ bits, int blk,
                                              int H, int h, int g) {
    keep[0] = keep[1] = ~0u;
    if (bits == nullptr) return;
    keep[0] = __ldg(bits + ((long long)blk * 16 + g) * H + h);
    keep[1] = __ldg(bits + ((long long)blk * 16 + g + 8) * H + h);
}

// The double-buffered walk over a window's blocks [first, last), which every pass shares: the
// two 16-row tiles of block blk (k and v, or q and do) staged by cp.async into stage[buffer].
template <int D>
__device__ __forceinline__ void ba_stage_block(unsigned short (&tiles)[2][ba_shape<D>::TILE],
                                               const int* __restrict__ cols, int blk,
                                               const unsigned short* __restrict__ a,
                                               const unsigned short* __restrict__ b, int H, int h, int lane) {
    ba_stage_rows<D>(tiles[0], cols + (long long)blk * 16, a, H, h, lane);
    ba_stage_rows<D>(tiles[1], cols + (long long)blk * 16, b, H, h, lane);
    gf_cp_async_commit();
}

// At block blk: stage block blk + 1 into the other buffer, wait for blk's tiles; returns blk's
// buffer (ba_stage_block staged `first` into buffer 0 before the loop).
template <int D>
__device__ __forceinline__ int ba_advance(unsigned short (&stage)[2][2][ba_shape<D>::TILE],
                                          const int* __restrict__ cols, int blk, int first, int last,
                                          const unsigned short* __restrict__ a, const unsigned short* __restrict__ b,
                                          int H, int h, int lane) {
    const int buf = (blk - first) & 1;
    if (blk + 1 < last) {
        ba_stage_block<D>(stage[buf ^ 1], cols, blk + 1, a, b, H, h, lane);
        gf_cp_async_wait<1>();
    } else {
        gf_cp_async_wait<0>();
    }
    __syncwarp();
    return buf;
}

// Block blk's edge masks of the lane's rows g and g + 8, and (dropout) their kept cells.
__device__ __forceinline__ void ba_block_rows(unsigned int (&mask)[2], unsigned int (&keep)[2],
                                              const int* __restrict__ masks, const unsigned int* __restrict__ bits,
                                              int blk, int H, int h, int g) {
    mask[0] = (unsigned int)__ldg(masks + (long long)blk * 16 + g);
    mask[1] = (unsigned int)__ldg(masks + (long long)blk * 16 + g + 8);
    ba_keep_words(keep, bits, blk, H, h, g);
}

// Store the lane's part of a 16 x D float tile (times `factor[r]` for rows g + 8 r) as rows of
// head h of y [n_rows, H, D] (TY: float or 16-bit); rows past n_rows are not written.
template <typename TY, int D>
__device__ __forceinline__ void ba_store_rows(TY* __restrict__ y, const float (&acc)[D / 8][4],
                                              const float (&factor)[2], long long row0, int n_rows, int H, int h,
                                              int g, int t) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const long long row = row0 + g + 8 * r;
        if (row >= n_rows) continue;
        TY* p = y + (row * H + h) * D + 2 * t;
#pragma unroll
        for (int n = 0; n < D / 8; ++n) ba_st2(p + n * 8, acc[n][2 * r] * factor[r], acc[n][2 * r + 1] * factor[r]);
    }
}

// This lane's part of <x_i, y_i> for the window's rows g and g + 8 (the elements of its A
// fragments: columns 2t, 2t + 1 of every 8), in float32 (TX, TY: float or 16-bit).
template <typename TX, typename TY, int D>
__device__ __forceinline__ void ba_row_dots(float (&dot)[2], const TX* __restrict__ x, const TY* __restrict__ y,
                                            long long row0, int n_rows, int H, int h, int g, int t) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        dot[r] = 0.f;
        const long long row = row0 + g + 8 * r;
        if (row >= n_rows) continue;
        const long long at = (row * H + h) * D + 2 * t;
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
            float a[2], b[2];
            ba_ld2(a, x + at + n * 8);
            ba_ld2(b, y + at + n * 8);
            dot[r] = fmaf(a[0], b[0], fmaf(a[1], b[1], dot[r]));
        }
    }
}

// Sum over the 4 lanes of a row (t = 0..3).
__device__ __forceinline__ float ba_row_sum(float v) {
    v += __shfl_xor_sync(GF_FULL_MASK, v, 1);
    return v + __shfl_xor_sync(GF_FULL_MASK, v, 2);
}

// A work item (gnn_fastpath.cuda.worklist's row chunks over the layout's windows, a window's
// blocks counting as its edges): window w's blocks [first, last). A window with more than
// `chunk_blocks` blocks is cut into chunks, one warp each, whose rows keep partial states in
// float32 workspace rows part_row(r), contiguous per row (base: 16 x the window's first chunk
// slot); `base` < 0: a whole window, whose rows are written final.
struct BaItem {
    int w, first, last, base, chunks, chunk;
    __device__ __forceinline__ long long part_row(int r) const { return (long long)base + r * chunks + chunk; }
};

__device__ __forceinline__ BaItem ba_item(const int4* __restrict__ items, long long it,
                                          const int* __restrict__ window_ptr, int chunk_blocks) {
    const int4 x = items[it];
    BaItem b;
    b.w = x.x;
    b.first = x.y;
    b.last = x.z;
    b.base = -1;
    b.chunks = 1;
    b.chunk = 0;
    if (x.w >= 0) {  // the chunk's slot
        const int w0 = __ldg(window_ptr + b.w), blocks = __ldg(window_ptr + b.w + 1) - w0;
        b.chunks = (blocks + chunk_blocks - 1) / chunk_blocks;
        b.chunk = (b.first - w0) / chunk_blocks;
        b.base = (x.w - b.chunk) * 16;
    }
    return b;
}

// Store the lane's part of a 16 x D float tile (times factor[r]) as float32 partial rows of a
// chunk item (rows past n_rows are not written).
template <int D>
__device__ __forceinline__ void ba_store_partial(float* __restrict__ part, const float (&acc)[D / 8][4],
                                                 const float (&factor)[2], const BaItem& b, long long row0, int n_rows,
                                                 int H, int h, int g, int t) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        if (row0 + g + 8 * r >= n_rows) continue;
        float2* p = reinterpret_cast<float2*>(part + (b.part_row(g + 8 * r) * H + h) * D + 2 * t);
#pragma unroll
        for (int n = 0; n < D / 8; ++n)
            p[n * 4] = make_float2(acc[n][2 * r] * factor[r], acc[n][2 * r + 1] * factor[r]);
    }
}

// ---------------------------------------------------------------------------------------
// Forward: out, lse. Every row of out and lse is written (a row without in-edges: 0, -inf).
template <typename T, typename TO, int D>
__global__ void __launch_bounds__(BA_WARPS * 32)
    ba_fwd(const int* __restrict__ window_ptr, const int* __restrict__ cols, const int* __restrict__ masks,
           const unsigned char* __restrict__ counts, const T* __restrict__ q, const T* __restrict__ k,
           const T* __restrict__ v, const int4* __restrict__ items, long long n_items, int chunk_blocks, int n_rows,
           int H, float scale, const unsigned int* __restrict__ keep_bits, float p, TO* __restrict__ out,
           float* __restrict__ lse, float* __restrict__ part_acc, float* __restrict__ part_ml) {
    using S = ba_shape<D>;
    __shared__ __align__(16) unsigned short stage[BA_WARPS][2][2][S::TILE];  // [warp][buffer][k, v]
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const long long item = (long long)blockIdx.x * BA_WARPS + warp;
    if (item >= n_items * H) return;  // whole warps leave together
    const int h = (int)(item % H);
    const BaItem b = ba_item(items, item / H, window_ptr, chunk_blocks);
    const long long row0 = (long long)b.w * 16;
    const unsigned short* ks = reinterpret_cast<const unsigned short*>(k);
    const unsigned short* vs = reinterpret_cast<const unsigned short*>(v);

    unsigned int qa[S::KS][4];
    ba_window_fragments<D>(qa, reinterpret_cast<const unsigned short*>(q), row0, n_rows, H, h, g, t);
    float acc[S::NT][4];
#pragma unroll
    for (int n = 0; n < S::NT; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
    float m[2] = {GF_NEG_INF, GF_NEG_INF}, l[2] = {0.f, 0.f};  // per row g + 8 r; l: this lane's part
    const float c = scale * BA_LOG2E;  // logits in base 2
    const float kept_scale = keep_bits != nullptr ? 1.f / (1.f - p) : 1.f;

    const int first = b.first, last = b.last;
    if (first < last) ba_stage_block<D>(stage[warp][0], cols, first, ks, vs, H, h, lane);
    for (int blk = first; blk < last; ++blk) {
        const int buf = ba_advance<D>(stage[warp], cols, blk, first, last, ks, vs, H, h, lane);
        unsigned int mask[2], keep[2];  // keep: dropout's kept cells of the lane's rows
        ba_block_rows(mask, keep, masks, keep_bits, blk, H, h, g);
        float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
        ba_logits<T, D>(s, qa, stage[warp][buf][0], g, t);
        float bm[2] = {GF_NEG_INF, GF_NEG_INF};
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
            for (int r = 0; r < 2; ++r)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    float& x = s[j][2 * r + e];
                    x = ba_edge(mask, j, r, e, t) ? x * c : GF_NEG_INF;
                    bm[r] = gf_nan_max(bm[r], x);
                }
        float corr[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            bm[r] = gf_nan_max(bm[r], __shfl_xor_sync(GF_FULL_MASK, bm[r], 1));
            bm[r] = gf_nan_max(bm[r], __shfl_xor_sync(GF_FULL_MASK, bm[r], 2));
            const float m_new = gf_nan_max(m[r], bm[r]);
            corr[r] = m_new == GF_NEG_INF ? 1.f : exp2f(m[r] - m_new);  // exp2(-inf) = 0 at first
            m[r] = m_new;
            l[r] *= corr[r];
        }
        // weights: 0 off the edges and for -inf logits (then m may still be -inf); l sums them
        // before dropout, the value product takes them after (as the CSR kernels)
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
            for (int r = 0; r < 2; ++r)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    float& x = s[j][2 * r + e];
                    const int row = g + 8 * r, col = j * 8 + 2 * t + e;
                    x = x == GF_NEG_INF ? 0.f : ba_times_count(exp2f(x - m[r]), counts, blk, row, col);
                    l[r] += x;
                    if (x != 0.f) x *= ba_kept(keep, r, col, kept_scale);
                }
#pragma unroll
        for (int n = 0; n < S::NT; ++n) {
            acc[n][0] *= corr[0];
            acc[n][1] *= corr[0];
            acc[n][2] *= corr[1];
            acc[n][3] *= corr[1];
        }
        ba_accumulate<T, D>(acc, s, stage[warp][buf][1], g, t);
        __syncwarp();  // the next block's copies overwrite this buffer
    }

    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        l[r] = ba_row_sum(l[r]);
        inv[r] = l[r] != 0.f ? 1.f / l[r] : 0.f;
        const long long row = row0 + g + 8 * r;
        if (t != 0 || row >= n_rows) continue;
        if (b.base < 0) {
            lse[row * H + h] = l[r] != 0.f ? (m[r] + __log2f(l[r])) * BA_LN2 : GF_NEG_INF;
        } else {  // a chunk's (m, l) in dot_fwd_merge's form: natural-log max, the sum
            float* ml = part_ml + (b.part_row(g + 8 * r) * H + h) * 2;
            ml[0] = m[r] * BA_LN2;
            ml[1] = l[r];
        }
    }
    if (b.base < 0) {
        ba_store_rows<TO, D>(out, acc, inv, row0, n_rows, H, h, g, t);
    } else {
        const float one[2] = {1.f, 1.f};
        ba_store_partial<D>(part_acc, acc, one, b, row0, n_rows, H, h, g, t);
    }
}

// ---------------------------------------------------------------------------------------
// Backward, destination pass: dq, and delta [n_rows, H] for the source pass. Every row written.
template <typename T, typename TO, int D>
__global__ void __launch_bounds__(BA_WARPS * 32)
    ba_bwd_dst(const int* __restrict__ window_ptr, const int* __restrict__ cols, const int* __restrict__ masks,
               const unsigned char* __restrict__ counts, const T* __restrict__ q, const T* __restrict__ k,
               const T* __restrict__ v, const TO* __restrict__ out, const T* __restrict__ grad_out16,
               const float* __restrict__ lse, const int4* __restrict__ items,
               long long n_items, int chunk_blocks, int n_rows, int H, float scale,
               const unsigned int* __restrict__ keep_bits,
               float p, T* __restrict__ dq,
               float* __restrict__ delta, float* __restrict__ part_dq) {
    using S = ba_shape<D>;
    __shared__ __align__(16) unsigned short stage[BA_WARPS][2][2][S::TILE];  // [warp][buffer][k, v]
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const long long item = (long long)blockIdx.x * BA_WARPS + warp;
    if (item >= n_items * H) return;  // whole warps leave together
    const int h = (int)(item % H);
    const BaItem b = ba_item(items, item / H, window_ptr, chunk_blocks);
    const long long row0 = (long long)b.w * 16;
    const unsigned short* ks = reinterpret_cast<const unsigned short*>(k);
    const unsigned short* vs = reinterpret_cast<const unsigned short*>(v);

    unsigned int qa[S::KS][4], da[S::KS][4];
    ba_window_fragments<D>(qa, reinterpret_cast<const unsigned short*>(q), row0, n_rows, H, h, g, t);
    ba_window_fragments<D>(da, reinterpret_cast<const unsigned short*>(grad_out16), row0, n_rows, H, h, g, t);
    // delta = <out, do> per row in float32, with do as the products take it: for a row whose
    // gradient cancels exactly (one in-edge) de then cancels too
    float dl[2], lse2[2];
    ba_row_dots<TO, T, D>(dl, out, grad_out16, row0, n_rows, H, h, g, t);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        dl[r] = ba_row_sum(dl[r]);
        const long long row = row0 + g + 8 * r;
        lse2[r] = row < n_rows ? lse[row * H + h] * BA_LOG2E : 0.f;
        if (t == 0 && row < n_rows && b.chunk == 0) delta[row * H + h] = dl[r];
    }
    float acc[S::NT][4];
#pragma unroll
    for (int n = 0; n < S::NT; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
    float scl[2] = {1.f, 1.f};  // float16: the rows' divisors of de (ba_scale_de)
    const float c = scale * BA_LOG2E;
    const float kept_scale = keep_bits != nullptr ? 1.f / (1.f - p) : 1.f;

    const int first = b.first, last = b.last;
    if (first < last) ba_stage_block<D>(stage[warp][0], cols, first, ks, vs, H, h, lane);
    for (int blk = first; blk < last; ++blk) {
        const int buf = ba_advance<D>(stage[warp], cols, blk, first, last, ks, vs, H, h, lane);
        unsigned int mask[2], keep[2];  // keep: dropout's kept cells of the lane's rows
        ba_block_rows(mask, keep, masks, keep_bits, blk, H, h, g);
        float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
        float dp[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
        ba_logits<T, D>(s, qa, stage[warp][buf][0], g, t);
        ba_logits<T, D>(dp, da, stage[warp][buf][1], g, t);
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
            for (int r = 0; r < 2; ++r)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const float x = s[j][2 * r + e] * c;
                    const int row = g + 8 * r, col = j * 8 + 2 * t + e;
                    const float a = ba_edge(mask, j, r, e, t) && x != GF_NEG_INF
                                        ? ba_times_count(exp2f(x - lse2[r]), counts, blk, row, col)
                                        : 0.f;
                    const float mult = a != 0.f ? ba_kept(keep, r, col, kept_scale) : 1.f;
                    // de; exactly 0 off the edges, whatever dp or delta (a non-finite one stays in its row)
                    s[j][2 * r + e] = a != 0.f ? a * (mult * dp[j][2 * r + e] - dl[r]) : 0.f;
                }
        ba_scale_de<T>(s, acc, scl);
        ba_accumulate<T, D>(acc, s, stage[warp][buf][0], g, t);
        __syncwarp();
    }
    const float factor[2] = {scale * scl[0], scale * scl[1]};
    if (b.base < 0) {
        ba_store_rows<T, D>(dq, acc, factor, row0, n_rows, H, h, g, t);
    } else {
        ba_store_partial<D>(part_dq, acc, factor, b, row0, n_rows, H, h, g, t);
    }
}

// ---------------------------------------------------------------------------------------
// Backward, source pass over the source-major layout (rows: sources, columns: destinations):
// dk, dv without atomics. Needs delta from ba_bwd_dst (or the CSR destination pass). Every
// row written.
template <typename T, int D>
__global__ void __launch_bounds__(BA_SRC_WARPS * 32, ba_shape<D>::SRC_MIN_BLOCKS)
    ba_bwd_src(const int* __restrict__ window_ptr, const int* __restrict__ cols, const int* __restrict__ masks,
               const unsigned char* __restrict__ counts, const T* __restrict__ q, const T* __restrict__ k,
               const T* __restrict__ v, const T* __restrict__ grad_out16, const float* __restrict__ lse,
               const float* __restrict__ delta,
               const int4* __restrict__ items, long long n_items, int chunk_blocks, int n_src, int H, float scale,
               const unsigned int* __restrict__ keep_bits, float p, T* __restrict__ dk, T* __restrict__ dv,
               float* __restrict__ part_dk, float* __restrict__ part_dv) {
    using S = ba_shape<D>;
    __shared__ __align__(16) unsigned short window[BA_SRC_WARPS][2][S::TILE];   // [warp][k, v] of the sources
    __shared__ __align__(16) unsigned short stage[BA_SRC_WARPS][2][2][S::TILE];  // [warp][buffer][q, do]
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const long long item = (long long)blockIdx.x * BA_SRC_WARPS + warp;
    if (item >= n_items * H) return;  // whole warps leave together
    const int h = (int)(item % H);
    const BaItem b = ba_item(items, item / H, window_ptr, chunk_blocks);
    const long long row0 = (long long)b.w * 16;
    const unsigned short* qs = reinterpret_cast<const unsigned short*>(q);
    const unsigned short* dos = reinterpret_cast<const unsigned short*>(grad_out16);

    ba_stage_window<D>(window[warp][0], row0, n_src, reinterpret_cast<const unsigned short*>(k), H, h, lane);
    ba_stage_window<D>(window[warp][1], row0, n_src, reinterpret_cast<const unsigned short*>(v), H, h, lane);
    gf_cp_async_commit();
    float ak[S::NT][4], av[S::NT][4];  // dk / s, dv
#pragma unroll
    for (int n = 0; n < S::NT; ++n) {
        ak[n][0] = ak[n][1] = ak[n][2] = ak[n][3] = 0.f;
        av[n][0] = av[n][1] = av[n][2] = av[n][3] = 0.f;
    }
    float scl[2] = {1.f, 1.f};  // float16: the rows' divisors of de (ba_scale_de)
    const float c = scale * BA_LOG2E;
    const float kept_scale = keep_bits != nullptr ? 1.f / (1.f - p) : 1.f;

    const int first = b.first, last = b.last;
    if (first < last) ba_stage_block<D>(stage[warp][0], cols, first, qs, dos, H, h, lane);
    for (int blk = first; blk < last; ++blk) {
        const int buf = ba_advance<D>(stage[warp], cols, blk, first, last, qs, dos, H, h, lane);
        unsigned int mask[2], keep[2];  // keep: dropout's kept cells of the lane's rows
        ba_block_rows(mask, keep, masks, keep_bits, blk, H, h, g);
        // the statistics of the lane's destination columns j * 8 + 2 t + e
        float lse2[2][2], dl[2][2];
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int dst = __ldg(cols + (long long)blk * 16 + j * 8 + 2 * t + e);
                lse2[j][e] = dst >= 0 ? lse[(long long)dst * H + h] * BA_LOG2E : 0.f;
                dl[j][e] = dst >= 0 ? delta[(long long)dst * H + h] : 0.f;
            }
        float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};   // logits, transposed: [source][destination]
        float dp[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};  // <v_j, do_i>
        ba_logits_shared<T, D>(s, window[warp][0], stage[warp][buf][0], g, t);
        ba_logits_shared<T, D>(dp, window[warp][1], stage[warp][buf][1], g, t);
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
            for (int r = 0; r < 2; ++r)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const float x = s[j][2 * r + e] * c;
                    const int row = g + 8 * r, col = j * 8 + 2 * t + e;
                    const float a = ba_edge(mask, j, r, e, t) && x != GF_NEG_INF
                                        ? ba_times_count(exp2f(x - lse2[j][e]), counts, blk, row, col)
                                        : 0.f;
                    const float mult = a != 0.f ? ba_kept(keep, r, col, kept_scale) : 1.f;
                    s[j][2 * r + e] = a * mult;                                     // dropped alpha
                    dp[j][2 * r + e] = a != 0.f ? a * (mult * dp[j][2 * r + e] - dl[j][e]) : 0.f;  // de
                }
        ba_accumulate<T, D>(av, s, stage[warp][buf][1], g, t);
        ba_scale_de<T>(dp, ak, scl);
        ba_accumulate<T, D>(ak, dp, stage[warp][buf][0], g, t);
        __syncwarp();
    }
    if (first >= last) {  // no block: the window's copies are still to be waited for
        gf_cp_async_wait<0>();
    }
    const float factor_k[2] = {scale * scl[0], scale * scl[1]}, one[2] = {1.f, 1.f};
    if (b.base < 0) {
        ba_store_rows<T, D>(dk, ak, factor_k, row0, n_src, H, h, g, t);
        ba_store_rows<T, D>(dv, av, one, row0, n_src, H, h, g, t);
    } else {
        ba_store_partial<D>(part_dk, ak, factor_k, b, row0, n_src, H, h, g, t);
        ba_store_partial<D>(part_dv, av, one, b, row0, n_src, H, h, g, t);
    }
}

// ---------------------------------------------------------------------------------------
// Attention dropout, drawn once per call: for CSR entry k (caller edge id perm[k]) and head h,
// where the multiplier keeps the edge, set its cell's bit in keep (cells: the entry's cell in the
// destination-major layout) and in keep_src (cells_src: its cell in the source-major layout; null
// in a forward). keep and keep_src zeroed, [n_blocks * 16 * H] of their layouts. One thread per
// (entry, head).
extern "C" __global__ void ba_keep_bits(const long long* __restrict__ cells, const long long* __restrict__ cells_src,
                             const int* __restrict__ perm, long long n_edges, int H, float p, unsigned long long seed,
                             unsigned long long offset, unsigned int* __restrict__ keep,
                             unsigned int* __restrict__ keep_src) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_edges * H) return;
    const long long k = i / H;
    const int h = (int)(i - k * H);
    if (gf_philox_uniform(seed, offset, (unsigned int)__ldg(perm + k), (unsigned int)h) < p) return;
    const long long c = __ldg(cells + k);
    atomicOr(keep + (c >> 4) * H + h, 1u << (c & 15));
    if (keep_src != nullptr) {
        const long long cs = __ldg(cells_src + k);
        atomicOr(keep_src + (cs >> 4) * H + h, 1u << (cs & 15));
    }
}
