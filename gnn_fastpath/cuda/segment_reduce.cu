// Min/max neighbourhood aggregation (SAGE-style), forward and backward.
//
//   out[i, f] = max_{k in row i} m_k,f     with m_k,f = w[perm[k]] * x[indices[k], f]
//
// Storage types (template parameters TX, TO): x is read as TX and out written as TO, each
// float, gf_half or gf_bf16 (common.cuh); weights are float (the launcher converts them),
// every comparison and product is float. TO is promote_types(x, w) as torch computes w * x.
//
// Min runs as max with sign = -1: every kernel works on s_k,f = (sign * w) * x and writes
// sign * max, which is exact (negation is exact) and keeps ties identical.
//
// A message is the product round_TO(fl(sw * x)): one rounded product (no FMA contraction, so
// forward and backward agree bit for bit), rounded once more to the output type when that is
// 16-bit (what torch's w * x in that dtype computes; the max of values of TO is then stored
// exactly, and the backward finds the same ties). Its canonical form adds 0.0f (-0 -> +0, so
// the float compare of the light path and the integer key of the heavy path see the same
// ties) and, under SR_KEEP, makes every NaN the positive quiet NaN: the first/last rules and
// the backward canonicalise every message, the counting and value-only forwards (the common
// rules, where instructions per message bound the speed) only their extreme, once per element
// (float compares treat -0 and +0 alike). Without weights (sw = +-1) both roundings are exact.
//
// Tie rules (MODE, a template parameter): SR_MODE_COUNT = count the tied edges (gradient
// split), SR_MODE_FIRST = first tied edge in caller edge order (aux = its caller edge id),
// SR_MODE_LAST = last, SR_MODE_VALUE = value only (no aux; forward without autograd).
//
// What SR_MODE_COUNT saves (one int32 per output element, so the common case needs no
// re-walk): aux >= 0 is the CSR position of the one edge reaching a finite or infinite
// extreme (the backward scatters along it like first/last, reading the source and caller id
// from the CSR, so no per-graph source table is built), or, unweighted on rows whose sources
// ascend (dup_ties), of the first of several duplicate edges that alone reach a non-zero
// extreme: their shares all reach that one source, so a multigraph's duplicates do not make
// its rows walk; aux < 0 means "walk": n = -1 - aux edges
// tie (n = 0: empty row), or the extreme is NaN, or (zero_walks, the split rule) one edge
// reaches exactly 0, and the backward re-walks the row's edges. So the scatter along single
// winners never reads the output (torch's split rule halves a winner at 0: the walk does it).
// After aux come the "walk all" flag, set when any weighted message is -inf (torch's split
// rule then sends a losing edge 0 * inf = NaN through the product w * x, which only the walk
// gives, so the backward walks every element; inputs with infinities are rare, the flag keeps
// them exact; unweighted messages are x itself, whose losers get an exact 0), and one flag per row,
// set where a row holds a walking element (the walk skips the other rows at one read).
//
// Forward, degree-aware (the row-chunk work list of gnn_fastpath/cuda/worklist.py: the
// launcher cuts every destination with >= 128 in-edges into chunks, so no group walks more
// than that):
// - light rows (sr_fwd_rows_at): a group of T lanes per (row, feature block), each lane
//   VEC features (16-byte loads), running extreme + count/arg in registers, one pass over
//   the row's edges, four rows' loads in flight per lane;
// - heavy rows (sr_fwd_chunks_at): work items (slot, start, end) of a few dozen edges of one
//   heavy row; each item reduces its chunk in registers and merges with one 64-bit atomic
//   per feature into packed[slot, f]:
//     first/last/value: atomicMax on (order key << 32 | tie-break bits), tie-break bits = ~edge id
//                (first: smallest id wins) or edge id (last) or 0;
//     count:      a CAS loop on (order key << 32 | winner or tie count, sr_merge_count):
//                larger key replaces, equal key adds the counts (with dup_ties the chunks are
//                cut at changes of source, so a winner's duplicates are all in its chunk);
//   then sr_fwd_unpack writes out/aux of the heavy rows.
// sr_fwd_rows launches light rows alone (a graph without heavy rows, or the static path's row
// pieces), sr_fwd_split both kinds.
// Backward: first/last, and count's single-winner elements, scatter along the saved arg
// (sr_bwd_arg, float atomics), or for count source-major without atomics on dx (sr_bwd_src:
// each source sums the elements whose saved winner is one of its out-edges; on a symmetric
// graph over the forward CSR itself). Then count's walk (sr_bwd_ties) finds the walking
// elements by walking the CSR edges in ranges (groups of lanes take a batch of items each and
// skip, at one read, those of rows where no element walks): it recomputes each message and,
// where it equals the saved extreme, adds g / (n + [count_zero_as_tie && out == 0])
// (count_zero_as_tie: torch scatter_reduce's include_self=False rule, which counts the
// untouched zero of the output as one more tie; a single winner at 0, which the forward made
// walk, gets g / 2).
#include "common.cuh"

// Tie-rule codes come from the launcher (-D defines), so Python and CUDA agree on them.
#if !defined(SR_MODE_COUNT) || !defined(SR_MODE_FIRST) || !defined(SR_MODE_LAST) || !defined(SR_MODE_VALUE)
#error "the SR_MODE_* codes must be defined by the launcher"
#endif
#if !defined(SR_KEEP) || !defined(SR_DROP)
#error "the non-finite rules SR_KEEP and SR_DROP must be defined by the launcher"
#endif
#if !defined(SR_THREADS)
#error "SR_THREADS, the launcher's threads per block, must be defined by the launcher"
#endif

// Order-preserving 32-bit key of a float: a < b (as floats, -0 == +0 after canonicalisation
// by the caller) iff key(a) < key(b). Key 0 is below every real value.
__device__ __forceinline__ unsigned int sr_order_key(float v) {
    const unsigned int u = __float_as_uint(v);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float sr_order_key_decode(unsigned int k) {
    const unsigned int u = (k & 0x80000000u) ? (k & 0x7fffffffu) : ~k;
    return __uint_as_float(u);
}

// The rounded product of one message: one rounding (no FMA contraction, so forward and
// backward agree bit for bit), rounded once more to the output type when that is 16-bit.
template <typename TO>
__device__ __forceinline__ float sr_product(float sw, float xv) {
    float p = __fmul_rn(sw, xv);
    if constexpr (sizeof(TO) == 2) p = gf_to_float(gf_cast<TO>(p));
    return p;
}

// The canonical form of a value (see the header): -0 -> +0, and under SR_KEEP every NaN ->
// the positive quiet NaN, whose order key is above every other value's (so the heavy path
// lets it win too).
template <int NF>
__device__ __forceinline__ float sr_canonical(float p) {
    const float v = __fadd_rn(p, 0.0f);
    return (NF == SR_KEEP && v != v) ? __int_as_float(0x7fc00000) : v;
}

// One canonical message.
template <int NF, typename TO>
__device__ __forceinline__ float sr_message(float sw, float xv) {
    return sr_canonical<NF>(sr_product<TO>(sw, xv));
}

__device__ __forceinline__ bool sr_finite(float v) {
    return (__float_as_uint(v) & 0x7f800000u) != 0x7f800000u;
}

// Non-finite rules (NF): SR_KEEP (torch, PyG): a NaN message wins and the extreme stays NaN;
// +-inf are values like any other. SR_DROP (DGL): NaN messages never win (every comparison
// with them is false), and a non-finite extreme is written as 0 with no winning edge.
//
// SR_MODE_FIRST / SR_MODE_LAST (a = the winning caller id; NaNs tie with each other), on
// canonical messages:
template <int MODE, int NF>
__device__ __forceinline__ void sr_update(float& m, int& a, float v, int p) {
    if (NF == SR_KEEP && (v != v || m != m)) {  // NaN is the extreme
        if (v != v) {
            if (m != m) a = MODE == SR_MODE_FIRST ? (p < a ? p : a) : (p > a ? p : a);
            else { m = v; a = p; }
        }
        return;
    }
    if (MODE == SR_MODE_FIRST) {
        if (v > m || (v == m && p < a)) { m = v; a = p; }
    } else {
        if (v > m || (v == m && p > a)) { m = v; a = p; }
    }
}

// max with NaN propagation: one instruction (max.NaN, sm_80+) for the extreme of SR_KEEP.
__device__ __forceinline__ float sr_max_nan(float m, float v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    float r;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(m), "f"(v));
    return r;
#else
    return (v > m || v != v) ? v : m;
#endif
}

// SR_MODE_COUNT and SR_MODE_VALUE, the rules of every training and inference step, with the
// fewest instructions per message (the forward issues about as many instructions as it
// moves bytes): raw products, no canonical form per message (float compares see -0 == +0;
// the extreme is made canonical once, at the end). A NaN stays in m (no later message
// compares > or == with it), so under SR_KEEP the extreme is NaN as soon as one message is.
// SR_MODE_COUNT's running state is (a, t): a the CSR position of the edge that last raised
// the extreme (-1 before any), t how many later edges tied with it (or, with a = -1, how many
// -inf messages tied with the initial -inf: the row walks, which is exact); sr_count_aux
// turns it into the saved form of the header. Per message: two compares, one max, two selects.
template <int MODE, int NF>
__device__ __forceinline__ void sr_update_fast(float& m, int& a, int& t, float v, int p) {
    if (MODE == SR_MODE_COUNT) {
        const bool gt = v > m, eq = v == m;
        m = sr_max_nan(m, v);
        a = gt ? p : a;
        t = gt ? 0 : t + (eq ? 1 : 0);
    } else if (NF == SR_KEEP) {
        m = sr_max_nan(m, v);
    } else {
        m = fmaxf(m, v);  // SR_DROP: NaN never wins
    }
}

// The saved form (header) of SR_MODE_COUNT's running state (a, t): the single winner, or
// -1 - n for n = t + 1 tied edges (n = t without a winner).
__device__ __forceinline__ int sr_count_aux(int a, int t) {
    return a < 0 ? -1 - t : (t > 0 ? -2 - t : a);
}

// sr_count_aux of the extreme m, where with dup_ties (non-null: unweighted, each row's sources
// ascend; *dup_ties: the graph holds a duplicate edge, so on simple graphs the lanes with ties
// load no indices) duplicates of the winner that alone tie with it count as one edge: the same
// source sends the same message, so they tie, and their shares of the gradient all reach that
// one source. The t ties are exactly the duplicates when the edge t positions after the winner
// has its source (sorted rows hold equal sources together); they then go along the winner like
// a single edge, without the walk (a multigraph's duplicates would make most of its rows walk).
// Not at an extreme of 0, where torch's split rule counts one more tie, nor at NaN: both walk.
// (Chunks of long rows are cut at changes of source, so a source's duplicates meet in one
// chunk.)
__device__ __forceinline__ int sr_count_aux_dups(const int* __restrict__ indices, float m, int a, int t,
                                                 const int* __restrict__ dup_ties) {
    if (dup_ties != nullptr && t > 0 && a >= 0 && m != 0.f && m == m && __ldg(dup_ties) != 0 &&
        __ldg(indices + a + t) == __ldg(indices + a))
        t = 0;
    return sr_count_aux(a, t);
}

template <int MODE>
__device__ __forceinline__ int sr_init_aux() {
    return MODE == SR_MODE_FIRST ? GF_INT_MAX : -1;
}

// aux rows (int32) of VEC elements: 16-byte accesses for every VEC multiple of 4 (16-bit x
// gives VEC = 8; common.cuh's int accesses vectorise VEC = 4 only). Same alignment as the
// float rows the launcher checked (F % VEC == 0, 16-byte aligned base).
template <int VEC>
__device__ __forceinline__ void sr_store_aux(int* p, const int* r) {
    if constexpr (VEC % 4 == 0) {
#pragma unroll
        for (int i = 0; i < VEC; i += 4) gf_store<4>(p + i, r + i);
    } else {
        gf_store<VEC>(p, r);
    }
}
template <int VEC>
__device__ __forceinline__ void sr_load_aux(int* r, const int* p) {
    if constexpr (VEC % 4 == 0) {
#pragma unroll
        for (int i = 0; i < VEC; i += 4) gf_load<4>(r + i, p + i);
    } else {
        gf_load<VEC>(r, p);
    }
}

// One message (weight sw, feature xv) into the running state (t: SR_MODE_COUNT's tie count,
// see sr_update_fast); with SR_MODE_COUNT and weights also notes a -inf message (see the
// header: the "walk all" flag; without weights a losing message passes no product to
// autograd, so nothing turns its zero gradient into NaN). Without weights (W false) the
// message is x itself, negated for min (NEG: sign = -1; a negation is exact and costs no
// instruction, so sw is not read), and TO is x's own type, so no rounding is needed (for
// 16-bit x, two conversions per message fewer).
template <typename TO, int MODE, int NF, bool W, bool NEG>
__device__ __forceinline__ void sr_take(float& m, int& a, int& t, bool& saw_neg_inf, float sw, float xv, int p) {
    const float prod = W ? sr_product<TO>(sw, xv) : (NEG ? -xv : xv);
    if constexpr (MODE == SR_MODE_COUNT || MODE == SR_MODE_VALUE) {
        sr_update_fast<MODE, NF>(m, a, t, prod, p);
        if (MODE == SR_MODE_COUNT && W) saw_neg_inf |= prod == GF_NEG_INF;
    } else {
        sr_update<MODE, NF>(m, a, sr_canonical<NF>(prod), p);
    }
}

// Reduce CSR edges [start, end) into m/a for this lane's CH x VEC features (feature
// f0 + c*T*VEC + j of chunk c). Edge metadata (source, caller id, signed weight) is loaded
// T edges at a time, one per lane, then broadcast; rows are loaded U = LOADS/CH edges at a
// time so LOADS loads of VEC features per lane are in flight together. W: w is not null;
// NEG (unweighted only): sign = -1. m/a start from the initial state (GF_NEG_INF,
// sr_init_aux); a leaves in its saved form (SR_MODE_COUNT: sr_count_aux_dups).
template <typename TX, typename TO, int VEC, int T, int CH, int MODE, int NF, int LOADS, bool W, bool NEG>
__device__ __forceinline__ void sr_reduce_edges(const int* __restrict__ indices, const int* __restrict__ perm,
                                                const TX* __restrict__ x, const float* __restrict__ w,
                                                int start, int end, int F, int f0, float sign,
                                                const int* __restrict__ dup_ties,
                                                unsigned int mask, int lane, float (&m)[CH][VEC], int (&a)[CH][VEC],
                                                bool& saw_neg_inf) {
    constexpr int U = CH >= LOADS ? 1 : LOADS / CH;
    int tied[CH][VEC];  // SR_MODE_COUNT's tie counts (sr_update_fast)
#pragma unroll
    for (int c = 0; c < CH; ++c)
#pragma unroll
        for (int j = 0; j < VEC; ++j) tied[c][j] = 0;
    for (int e0 = start; e0 < end; e0 += T) {
        const int k = e0 + lane;
        int s = 0, p = 0;
        float sw = sign;
        if (k < end) {
            s = __ldg(indices + k);
            if (MODE == SR_MODE_FIRST || MODE == SR_MODE_LAST || W) p = __ldg(perm + k);
            if (W) sw = sign * __ldg(w + p);
        }
        const int nb = min(T, end - e0);
        int t = 0;
        for (; t + U - 1 < nb; t += U) {
            int ss[U], pp[U];
            float ww[U], v[U][CH][VEC];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                ss[u] = __shfl_sync(mask, s, t + u, T);
                // SR_MODE_COUNT tags an edge by its CSR position (the same in every lane)
                pp[u] = MODE == SR_MODE_VALUE ? 0 : MODE == SR_MODE_COUNT ? e0 + t + u : __shfl_sync(mask, p, t + u, T);
                ww[u] = W ? __shfl_sync(mask, sw, t + u, T) : sign;
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
                    if (f0 + c * T * VEC < F)
#pragma unroll
                        for (int j = 0; j < VEC; ++j)
                            sr_take<TO, MODE, NF, W, NEG>(m[c][j], a[c][j], tied[c][j], saw_neg_inf, ww[u], v[u][c][j], pp[u]);
        }
        for (; t < nb; ++t) {
            const int s0 = __shfl_sync(mask, s, t, T);
            const int p0 = MODE == SR_MODE_VALUE ? 0 : MODE == SR_MODE_COUNT ? e0 + t : __shfl_sync(mask, p, t, T);
            const float w0 = W ? __shfl_sync(mask, sw, t, T) : sign;
#pragma unroll
            for (int c = 0; c < CH; ++c) {
                if (f0 + c * T * VEC < F) {
                    float v0[VEC];
                    gf_load<VEC>(v0, x + (long long)s0 * F + f0 + c * T * VEC);
#pragma unroll
                    for (int j = 0; j < VEC; ++j)
                        sr_take<TO, MODE, NF, W, NEG>(m[c][j], a[c][j], tied[c][j], saw_neg_inf, w0, v0[j], p0);
                }
            }
        }
    }
    if (MODE == SR_MODE_COUNT) {
        // the saved form: a itself where no element of the lane tied (the common case, one
        // test per lane), else sr_count_aux_dups per element
        int any = 0;
#pragma unroll
        for (int c = 0; c < CH; ++c)
#pragma unroll
            for (int j = 0; j < VEC; ++j) any |= tied[c][j];
        if (any != 0) {
#pragma unroll
            for (int c = 0; c < CH; ++c)
#pragma unroll
                for (int j = 0; j < VEC; ++j)
                    a[c][j] = sr_count_aux_dups(indices, m[c][j], a[c][j], tied[c][j], dup_ties);
        }
    }
}

// sr_reduce_edges with the weighted loop, or the unweighted one for max or for min (one branch
// per call, not per edge).
template <typename TX, typename TO, int VEC, int T, int CH, int MODE, int NF, int LOADS>
__device__ __forceinline__ void sr_reduce_range(const int* __restrict__ indices, const int* __restrict__ perm,
                                                const TX* __restrict__ x, const float* __restrict__ w,
                                                int start, int end, int F, int f0, float sign,
                                                const int* __restrict__ dup_ties,
                                                unsigned int mask, int lane, float (&m)[CH][VEC], int (&a)[CH][VEC],
                                                bool& saw_neg_inf) {
    if (w != nullptr)
        sr_reduce_edges<TX, TO, VEC, T, CH, MODE, NF, LOADS, true, false>(
            indices, perm, x, w, start, end, F, f0, sign, dup_ties, mask, lane, m, a, saw_neg_inf);
    else if (sign < 0.f)
        sr_reduce_edges<TX, TO, VEC, T, CH, MODE, NF, LOADS, false, true>(
            indices, perm, x, w, start, end, F, f0, sign, dup_ties, mask, lane, m, a, saw_neg_inf);
    else
        sr_reduce_edges<TX, TO, VEC, T, CH, MODE, NF, LOADS, false, false>(
            indices, perm, x, w, start, end, F, f0, sign, dup_ties, mask, lane, m, a, saw_neg_inf);
}

// Writes VEC results of one row: out = sign * the extreme (0 for an empty row; under SR_DROP
// 0 for a non-finite one) and, unless MODE is SR_MODE_VALUE, the saved state of the header
// (first/last: the winner or -1; count: the winner, or -1 - n where the element walks).
// Returns whether one of the elements walks (SR_MODE_COUNT).
template <typename TO, int MODE, int NF, int VEC>
__device__ __forceinline__ bool sr_store_result(const float (&m)[VEC], const int (&a)[VEC], bool empty, float sign,
                                                int zero_walks, TO* __restrict__ out, int* __restrict__ aux) {
    float r[VEC];
    int q[VEC];
    bool walks = false;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
        r[j] = empty ? 0.f : sign * sr_canonical<NF>(m[j]);
        int v = a[j];
        const bool no_winner = empty || (NF == SR_DROP ? !sr_finite(r[j]) : r[j] != r[j]);
        if (NF == SR_DROP && !sr_finite(r[j])) r[j] = 0.f;
        if (MODE != SR_MODE_COUNT && (no_winner || v == GF_INT_MAX)) v = -1;
        // a NaN extreme walks too, and with zero_walks an extreme of exactly 0
        if (MODE == SR_MODE_COUNT && !empty && (v < 0 || no_winner || (zero_walks && r[j] == 0.f))) {
            v = v < 0 ? v : -2;
            walks = true;
        }
        q[j] = v;
    }
    gf_store<VEC>(out, r);
    if (MODE != SR_MODE_VALUE) sr_store_aux<VEC>(aux, q);
    return walks;
}

// Light rows: one group per row of `rows` (or row = group id when rows is null).
// out [n_dst, F]; aux [n_dst, F] (the caller id of the winning edge, or for SR_MODE_COUNT
// the single winner or -1 - n, see the header; -1 for empty rows), unused with MODE 3;
// walk_all: the "walk all" flag, row_walks [n_dst]: set to 1 for a row with a walking
// element (zero-initialised; SR_MODE_COUNT only, row_walks may be null).
// bx: the block's index among the light rows' blocks (sr_fwd_split launches both kinds).
template <typename TX, typename TO, int VEC, int T, int CH, int MODE, int NF, int LOADS>
__device__ __forceinline__ void sr_fwd_rows_at(int bx, const int* __restrict__ indptr, const int* __restrict__ indices,
                                               const int* __restrict__ perm, const TX* __restrict__ x,
                                               const float* __restrict__ w, const int* __restrict__ rows, int n_rows,
                                               int F, float sign, const int* __restrict__ dup_ties, int zero_walks,
                                               TO* __restrict__ out, int* __restrict__ aux, int* __restrict__ walk_all,
                                               int* __restrict__ row_walks) {
    const int gid = (int)((bx * (long long)blockDim.x + threadIdx.x) / T);
    const int lane = threadIdx.x % T;
    if (gid >= n_rows) return;  // whole groups leave together
    const unsigned int mask = gf_group_mask<T>();
    const int row = rows != nullptr ? __ldg(rows + gid) : gid;
    const int start = __ldg(indptr + row), end = __ldg(indptr + row + 1);
    const int f0 = blockIdx.y * (T * VEC * CH) + lane * VEC;

    float m[CH][VEC];
    int a[CH][VEC];
    bool saw_neg_inf = false;
#pragma unroll
    for (int c = 0; c < CH; ++c)
#pragma unroll
        for (int j = 0; j < VEC; ++j) { m[c][j] = GF_NEG_INF; a[c][j] = sr_init_aux<MODE>(); }

    sr_reduce_range<TX, TO, VEC, T, CH, MODE, NF, LOADS>(indices, perm, x, w, start, end, F, f0, sign,
                                                         dup_ties, mask, lane, m, a, saw_neg_inf);
    if (MODE == SR_MODE_COUNT && saw_neg_inf) *walk_all = 1;

    bool walks = false;
#pragma unroll
    for (int c = 0; c < CH; ++c) {
        const int f = f0 + c * T * VEC;
        if (f < F) {
            const long long o = (long long)row * F + f;
            walks |= sr_store_result<TO, MODE, NF, VEC>(m[c], a[c], start == end, sign, zero_walks, out + o, aux + o);
        }
    }
    if (MODE == SR_MODE_COUNT && row_walks != nullptr && __any_sync(mask, walks) && lane == 0) row_walks[row] = 1;
}

template <typename TX, typename TO, int VEC, int T, int CH, int MODE, int NF, int LOADS>
__global__ void sr_fwd_rows(const int* __restrict__ indptr, const int* __restrict__ indices,
                            const int* __restrict__ perm, const TX* __restrict__ x,
                            const float* __restrict__ w, const int* __restrict__ rows, int n_rows,
                            int F, float sign, const int* __restrict__ dup_ties, int zero_walks,
                            TO* __restrict__ out, int* __restrict__ aux, int* __restrict__ walk_all,
                            int* __restrict__ row_walks) {
    sr_fwd_rows_at<TX, TO, VEC, T, CH, MODE, NF, LOADS>(blockIdx.x, indptr, indices, perm, x, w, rows, n_rows, F, sign,
                                                        dup_ties, zero_walks, out, aux, walk_all, row_walks);
}

// SR_MODE_COUNT's packed word: order key << 32 | low, low = the CSR position of the one tied
// edge (bit 31 clear), or SR_TIES | n for n != 1 tied edges. A larger key replaces, an equal
// key adds the counts (skipped without an atomic when the stored key is already larger).
#define SR_TIES 0x80000000u

__device__ __forceinline__ unsigned int sr_tie_count(unsigned int low) {
    return (low & SR_TIES) ? (low & ~SR_TIES) : 1u;
}

// The edges a chunk's low word stands for when it merges with an equal key: n for SR_TIES | n;
// for one position p, one edge, or with dup_ties the run of p's source from p on (the chunks
// were cut at changes of source, sr_align_chunks, so a source's edges all reach the extreme
// in the one chunk that reported it: that chunk counted them as duplicates of its winner).
__device__ __forceinline__ unsigned int sr_merge_tie_count(unsigned int low, const int* __restrict__ indices,
                                                           int row_end, const int* __restrict__ dup_ties) {
    if ((low & SR_TIES) || dup_ties == nullptr) return sr_tie_count(low);
    const int p = (int)low, s = __ldg(indices + p);
    int q = p + 1;
    while (q < row_end && __ldg(indices + q) == s) ++q;
    return (unsigned int)(q - p);
}

__device__ __forceinline__ void sr_merge_count(unsigned long long* addr, unsigned int key, unsigned int low,
                                               const int* __restrict__ indices, int row_end,
                                               const int* __restrict__ dup_ties) {
    unsigned long long old = *((volatile unsigned long long*)addr);
    while (true) {
        const unsigned int old_key = (unsigned int)(old >> 32);
        if (old_key > key) return;
        const unsigned int next_low =
            old_key == key ? (SR_TIES | (sr_merge_tie_count((unsigned int)old, indices, row_end, dup_ties) +
                                         sr_merge_tie_count(low, indices, row_end, dup_ties)))
                           : low;
        const unsigned long long next = ((unsigned long long)key << 32) | (unsigned long long)next_low;
        const unsigned long long prev = atomicCAS(addr, old, next);
        if (prev == old) return;
        old = prev;
    }
}

// Chunks of split rows: items [n_items] = (row, edge start, edge end, split row index)
// (gnn_fastpath/cuda/worklist.py, tag "split_row"; with dup_ties cut at changes of source,
// sr_align_chunks); packed [n_split, F] zero-initialised. MODE 3 merges like MODE 2.
// walk_all: as in sr_fwd_rows. bx: the block's index among the chunks' blocks.
template <typename TX, typename TO, int VEC, int T, int CH, int MODE, int NF, int LOADS>
__device__ __forceinline__ void sr_fwd_chunks_at(int bx, const int* __restrict__ indptr,
                                                 const int* __restrict__ indices, const int* __restrict__ perm,
                                                 const TX* __restrict__ x, const float* __restrict__ w,
                                                 const int4* __restrict__ items, int n_items, int F, float sign,
                                                 const int* __restrict__ dup_ties,
                                                 unsigned long long* __restrict__ packed, int* __restrict__ walk_all) {
    const int gid = (int)((bx * (long long)blockDim.x + threadIdx.x) / T);
    const int lane = threadIdx.x % T;
    if (gid >= n_items) return;
    const unsigned int mask = gf_group_mask<T>();
    const int4 it = __ldg(items + gid);
    const int start = it.y, end = it.z, slot = it.w;
    const int row_end = dup_ties != nullptr ? __ldg(indptr + it.x + 1) : 0;
    const int f0 = blockIdx.y * (T * VEC * CH) + lane * VEC;

    float m[CH][VEC];
    int a[CH][VEC];
    bool saw_neg_inf = false;
#pragma unroll
    for (int c = 0; c < CH; ++c)
#pragma unroll
        for (int j = 0; j < VEC; ++j) { m[c][j] = GF_NEG_INF; a[c][j] = sr_init_aux<MODE>(); }

    sr_reduce_range<TX, TO, VEC, T, CH, MODE, NF, LOADS>(indices, perm, x, w, start, end, F, f0, sign,
                                                         dup_ties, mask, lane, m, a, saw_neg_inf);
    if (MODE == SR_MODE_COUNT && saw_neg_inf) *walk_all = 1;

#pragma unroll
    for (int c = 0; c < CH; ++c) {
        const int f = f0 + c * T * VEC;
        if (f < F) {
            unsigned long long* prow = packed + (long long)slot * F + f;
#pragma unroll
            for (int j = 0; j < VEC; ++j) {
                const unsigned int key = sr_order_key(sr_canonical<NF>(m[c][j]));
                if (MODE == SR_MODE_COUNT) {
                    const int e = a[c][j];
                    sr_merge_count(prow + j, key, e >= 0 ? (unsigned int)e : SR_TIES | (unsigned int)(-1 - e),
                                   indices, row_end, dup_ties);
                } else {
                    const unsigned int low =
                        MODE == SR_MODE_FIRST ? ~(unsigned int)a[c][j] : (MODE == SR_MODE_LAST ? (unsigned int)a[c][j] : 0u);
                    atomicMax(prow + j, ((unsigned long long)key << 32) | (unsigned long long)low);
                }
            }
        }
    }
}

// Both in one launch: blocks [0, chunk_blocks) take the long rows' chunks (even work, a few
// dozen edges each), the others the light rows, whose ragged lengths then fill the chunks'
// last wave instead of leaving a tail of their own.
template <typename TX, typename TO, int VEC, int T, int CH, int MODE, int NF, int LOADS>
__global__ void sr_fwd_split(const int* __restrict__ indptr, const int* __restrict__ indices,
                             const int* __restrict__ perm, const TX* __restrict__ x, const float* __restrict__ w,
                             const int* __restrict__ rows, int n_rows, const int4* __restrict__ items, int n_items,
                             int chunk_blocks, int F, float sign, const int* __restrict__ dup_ties, int zero_walks,
                             TO* __restrict__ out, int* __restrict__ aux, unsigned long long* __restrict__ packed,
                             int* __restrict__ walk_all, int* __restrict__ row_walks) {
    if ((int)blockIdx.x < chunk_blocks)
        sr_fwd_chunks_at<TX, TO, VEC, T, CH, MODE, NF, LOADS>(blockIdx.x, indptr, indices, perm, x, w, items, n_items,
                                                              F, sign, dup_ties, packed, walk_all);
    else
        sr_fwd_rows_at<TX, TO, VEC, T, CH, MODE, NF, LOADS>(blockIdx.x - chunk_blocks, indptr, indices, perm, x, w,
                                                            rows, n_rows, F, sign, dup_ties, zero_walks, out, aux,
                                                            walk_all, row_walks);
}

// Moves a chunk bound b of a row forward to the next change of source (rows whose sources
// ascend), so that all the edges of one source fall in one chunk (what dup_ties needs of the
// chunks: sr_merge_tie_count). A chunk may come out empty, which merges nothing.
__device__ __forceinline__ int sr_source_bound(const int* __restrict__ indices, int b, int row_start, int row_end) {
    while (b > row_start && b < row_end && __ldg(indices + b) == __ldg(indices + b - 1)) ++b;
    return b;
}

// items [n_items] = (row, begin, end, tag) of split rows' chunks, aligned in place (the
// launcher's own copy): each bound moves the same way from both chunks it separates.
extern "C" __global__ void sr_align_chunks(int4* __restrict__ items, int n_items, const int* __restrict__ indptr,
                                           const int* __restrict__ indices) {
    const int i = (int)(blockIdx.x * (long long)blockDim.x + threadIdx.x);
    if (i >= n_items) return;
    int4 it = items[i];
    const int row_start = __ldg(indptr + it.x), row_end = __ldg(indptr + it.x + 1);
    it.y = sr_source_bound(indices, it.y, row_start, row_end);
    it.z = sr_source_bound(indices, it.z, row_start, row_end);
    items[i] = it;
}

// Writes out/aux of the split rows (split[h] = (row, first chunk, chunks, 0)) from packed.
// The packed key holds a message value of TO exactly, so the store is exact.
template <typename TO>
__global__ void sr_fwd_unpack(const unsigned long long* __restrict__ packed,
                              const int4* __restrict__ split, int n_split, int F, float sign,
                              int mode, int non_finite, int zero_walks, TO* __restrict__ out,
                              int* __restrict__ aux, int* __restrict__ row_walks) {
    const long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (idx >= (long long)n_split * F) return;
    const int h = (int)(idx / F), f = (int)(idx % F);
    const int row = __ldg(split + h).x;
    const unsigned long long p = packed[idx];
    const unsigned int key = (unsigned int)(p >> 32), low = (unsigned int)p;
    const long long o = (long long)row * F + f;
    float r = sign * sr_order_key_decode(key);
    const bool no_winner = non_finite == SR_DROP ? !sr_finite(r) : r != r;
    if (non_finite == SR_DROP && !sr_finite(r)) r = 0.f;
    gf_st(out + o, r);
    if (aux != nullptr) {
        int v = mode == SR_MODE_FIRST ? (int)(~low) : (int)low;
        if (mode != SR_MODE_COUNT && (no_winner || v < 0 || v == GF_INT_MAX)) v = -1;
        if (mode == SR_MODE_COUNT && ((low & SR_TIES) || no_winner || (zero_walks && r == 0.f))) {
            v = -1 - (int)sr_tie_count(low);
            row_walks[row] = 1;
        }
        aux[o] = v;
    }
}

// Backward along the saved arg, n_dst * F elements: arg [n_dst, F] caller edge ids, or
// with by_position (SR_MODE_COUNT) CSR positions (< 0: no winning edge, or for SR_MODE_COUNT
// an element the walk does). src [M] the scatter target of an arg: its source (the CSR's
// indices with by_position, else the source per caller edge), or -1 - h for hub h (below);
// perm gives a CSR position's caller id. dx [n_src, F] and dw [M] are zero-initialised float
// accumulators (either may be null; for 16-bit x or weights they are float scratch buffers the
// launcher casts once: atomics into 16-bit memory would round at every add). grad_out is read
// as TO (the output's type), x as TX.
//
// Thread order (slice): 0 = row-major, one thread per element, so the concurrent atomics
// spread over whole rows; else feature slices of `slice` columns, every row of one slice
// before the next, so that dx[:, slice] stays in the L2 (the launcher takes it where dx does
// not fit there). The sources with the most out-edges (hubs) would then take every concurrent
// atomic on the one line of their slice (slower than row-major where a few sources win a
// large share of all elements): their elements go to `replicas` copies of the hub
// rows instead, rep [replicas, n_hubs, F] (copy = the element's row mod replicas), which
// sr_hub_sum adds into dx (hub_src: the source of each hub). Row-major passes no hubs.
template <typename TX, typename TO>
__device__ __forceinline__ void sr_scatter_one(int a, float g, long long el, int F, const int* __restrict__ src,
                                               const int* __restrict__ perm, int by_position,
                                               const float* __restrict__ w, const TX* __restrict__ x,
                                               float* __restrict__ dx, float* __restrict__ dw,
                                               float* __restrict__ rep, const int* __restrict__ hub_src,
                                               int n_hubs, int replicas) {
    if (a < 0) return;
    const int f = (int)(el % F);
    int s = __ldg(src + a);
    float* target = dx;
    if (s >= 0) {
        if (dx != nullptr) target = dx + (long long)s * F + f;
    } else {  // a hub: its row copy for this element's row
        const int h = -1 - s;
        target = rep + ((long long)((el / F) % replicas) * n_hubs + h) * F + f;
        s = __ldg(hub_src + h);
    }
    if (w == nullptr && dw == nullptr) {  // unweighted, x's gradient only (SAGE's max): no caller id needed
        if (dx != nullptr) atomicAdd(target, g);
        return;
    }
    const int e = by_position ? __ldg(perm + a) : a;
    if (dx != nullptr) atomicAdd(target, w != nullptr ? g * __ldg(w + e) : g);
    if (dw != nullptr) atomicAdd(dw + e, g * gf_ldg(x + (long long)s * F + f));
}

// One thread per element (slice 0) or per (slice, row, column of the slice), the last slice
// padded to `slice` columns: total = n_dst * F, or n_slices * n_dst * slice. walk_all
// (non-null, set): the walk does every element.
template <typename TX, typename TO>
__global__ void sr_bwd_arg(const int* __restrict__ arg, const TO* __restrict__ grad_out,
                           const int* __restrict__ src, const int* __restrict__ perm, int by_position,
                           const float* __restrict__ w, const TX* __restrict__ x, long long total, int n_dst,
                           int F, int slice, const int* __restrict__ walk_all, float* __restrict__ dx,
                           float* __restrict__ dw, float* __restrict__ rep, const int* __restrict__ hub_src,
                           int n_hubs, int replicas) {
    const long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (idx >= total) return;
    if (walk_all != nullptr && __ldg(walk_all) != 0) return;
    long long el = idx;
    if (slice != 0) {
        const long long per = (long long)n_dst * slice;
        const int part = (int)(idx / per);
        const long long r = idx - part * per;
        const int f = part * slice + (int)(r % slice);
        if (f >= F) return;
        el = (r / slice) * F + f;
    }
    sr_scatter_one<TX, TO>(__ldg(arg + el), gf_ldg(grad_out + el), el, F, src, perm, by_position, w, x, dx, dw,
                           rep, hub_src, n_hubs, replicas);
}

// dx[hub_src[h], f] += sum over copies r of rep[r, h, f], one thread per (hub, feature).
extern "C" __global__ void sr_hub_sum(const float* __restrict__ rep, const int* __restrict__ hub_src, int n_hubs,
                                      int replicas, int F, float* __restrict__ dx) {
    const long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (idx >= (long long)n_hubs * F) return;
    const int h = (int)(idx / F), f = (int)(idx % F);
    float sum = 0.0f;
    for (int r = 0; r < replicas; ++r) sum += rep[((long long)r * n_hubs + h) * F + f];
    dx[(long long)__ldg(hub_src + h) * F + f] += sum;
}

// The same scatter done source-major, with no atomics on dx (the "transposed" backward of
// split/even): items [n_items] = (source row, begin, end, tag) over the out-edges of each
// source (tag -1: the whole row in one item, else a chunk of a long row); for out-edge k,
// dst[k] is its destination and pos[k] its position in the destination-major CSR (the
// source-major CSR's csr_pos, or for a symmetric graph the forward CSR itself with pos = the
// reverse edge's position, so no transpose is built). Element (dst, f) goes to the source of
// the edge at aux[dst, f], so a source row sums g[dst, f] over its out-edges k with
// aux[dst[k], f] == pos[k]: reading aux costs 4 bytes per edge and feature, against one
// scattered atomic per element for the atomic scatter, which wins where out-degrees are small and
// atomics contend or miss the L2. A whole row stores its sum (dx is zero-initialised and the
// tie walk adds after), a chunk adds it. walk_all set: nothing here (the walk does all).
// perm: caller id of a CSR position (weights and dw); x is read for dw only.
#define SR_NO_POSITION ((int)0x80000000)

template <typename TX, typename TO, int VEC, int T, int CH>
__global__ void sr_bwd_src(const int4* __restrict__ items, int n_items, const int* __restrict__ dst,
                           const int* __restrict__ pos, const int* __restrict__ perm,
                           const float* __restrict__ w, const TX* __restrict__ x, int F,
                           const int* __restrict__ aux, const int* __restrict__ walk_all,
                           const TO* __restrict__ grad_out, float* __restrict__ dx, float* __restrict__ dw) {
    constexpr int U = CH >= 4 ? 1 : 4 / CH;
    const int gid = (int)((blockIdx.x * (long long)blockDim.x + threadIdx.x) / T);
    const int lane = threadIdx.x % T;
    if (gid >= n_items) return;
    if (__ldg(walk_all) != 0) return;  // whole groups leave together
    const unsigned int mask = gf_group_mask<T>();
    const int4 it = __ldg(items + gid);
    const int src = it.x, start = it.y, end = it.z;
    const bool whole = it.w < 0;
    const int f0 = blockIdx.y * (T * VEC * CH) + lane * VEC;
    const bool weighted = w != nullptr, need_ids = weighted || dw != nullptr;

    float acc[CH][VEC], xs[CH][VEC];
#pragma unroll
    for (int c = 0; c < CH; ++c) {
#pragma unroll
        for (int j = 0; j < VEC; ++j) { acc[c][j] = 0.f; xs[c][j] = 0.f; }
        if (dw != nullptr && f0 + c * T * VEC < F) gf_load<VEC>(xs[c], x + (long long)src * F + f0 + c * T * VEC);
    }
    for (int e0 = start; e0 < end; e0 += T) {
        const int k = e0 + lane;
        int d = 0, q = -1, e = 0;
        float ww = 1.f;
        if (k < end) {
            d = __ldg(dst + k);
            q = __ldg(pos + k);
            if (need_ids) e = __ldg(perm + q);
            if (weighted) ww = __ldg(w + e);
        }
        const int nb = min(T, end - e0);
        for (int t = 0; t < nb; t += U) {
            int dd[U], qq[U], ee[U];
            float wu[U];
            int a[U][CH][VEC];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int tu = min(t + u, nb - 1);  // clamp: duplicates of the last edge are skipped below
                dd[u] = __shfl_sync(mask, d, tu, T);
                // a padding slot gets a position no saved state holds (aux is >= -1 - degree)
                qq[u] = t + u < nb ? __shfl_sync(mask, q, tu, T) : SR_NO_POSITION;
                ee[u] = __shfl_sync(mask, e, tu, T);
                wu[u] = __shfl_sync(mask, ww, tu, T);
            }
#pragma unroll
            for (int u = 0; u < U; ++u)
#pragma unroll
                for (int c = 0; c < CH; ++c)
                    if (f0 + c * T * VEC < F) sr_load_aux<VEC>(a[u][c], aux + (long long)dd[u] * F + f0 + c * T * VEC);
#pragma unroll
            for (int u = 0; u < U; ++u) {
                float dwp = 0.f;
#pragma unroll
                for (int c = 0; c < CH; ++c) {
                    if (f0 + c * T * VEC >= F) continue;
                    bool hit = false;
#pragma unroll
                    for (int j = 0; j < VEC; ++j) hit |= a[u][c][j] == qq[u];
                    if (hit) {  // only then is the gradient row read
                        float g[VEC];
                        gf_load<VEC>(g, grad_out + (long long)dd[u] * F + f0 + c * T * VEC);
#pragma unroll
                        for (int j = 0; j < VEC; ++j) {
                            if (a[u][c][j] == qq[u]) {
                                acc[c][j] += weighted ? g[j] * wu[u] : g[j];
                                dwp += g[j] * xs[c][j];
                            }
                        }
                    }
                }
                if (dw != nullptr && t + u < nb) {  // uniform across the group
                    dwp = gf_group_sum<T>(dwp, mask);
                    if (lane == 0 && dwp != 0.f) atomicAdd(dw + ee[u], dwp);
                }
            }
        }
    }
    if (dx == nullptr) return;
#pragma unroll
    for (int c = 0; c < CH; ++c) {
        const int f = f0 + c * T * VEC;
        if (f < F) {
            float* p = dx + (long long)src * F + f;
            if (whole) {
                gf_store<VEC>(p, acc[c]);
            } else {
#pragma unroll
                for (int j = 0; j < VEC; ++j)
                    if (acc[c][j] != 0.f) atomicAdd(p + j, acc[c][j]);
            }
        }
    }
}

// Backward of the counting tie rules (non-finite rule SR_KEEP) for the elements that walk
// (aux < 0, or every element when walk_all is set; the others went along their arg), over the
// work items: items [n_items] = (row, edge start, edge end, tag),
// every CSR edge in exactly one item (short rows whole, long rows in chunks). A group keeps
// its row's extreme and gradient share in registers, leaves at once when none of its
// elements walks, else walks the item's edges (metadata T at a time, U = 4/CH rows' loads in
// flight) and, for each message equal to the extreme, adds share * w to dx[src] and share * x
// to dw (reduced over the group).
// With count_zero_as_tie (torch's split rule) a losing message still passes torch's 0 * x to
// dw and 0 * w to dx: NaN where x (or w) is not finite, as the reference's autograd gives.
// x is read as TX, out and grad_out as TO; dx and dw are float (scratch buffers for 16-bit
// tensors, see sr_bwd_arg). This is one item's walk (row, start, end), by the whole
// group (uniform control flow); sr_bwd_ties below hands out the items.
template <typename TX, typename TO, int VEC, int T, int CH>
__device__ __forceinline__ void sr_walk_item(int4 it, bool all, unsigned int mask, int lane,
                                             const int* __restrict__ indices, const int* __restrict__ perm,
                                             const TX* __restrict__ x, const float* __restrict__ w, int F,
                                             float sign, int count_zero_as_tie, const TO* __restrict__ out,
                                             const int* __restrict__ aux, const TO* __restrict__ grad_out,
                                             float* __restrict__ dx, float* __restrict__ dw) {
    constexpr int U = CH >= 4 ? 1 : 4 / CH;
    const int row = it.x, start = it.y, end = it.z;
    const int f0 = blockIdx.y * (T * VEC * CH) + lane * VEC;

    float mo[CH][VEC], share[CH][VEC];
    bool walks[CH][VEC], lane_walks[CH], any = false;  // lane_walks[c]: this lane loads chunk c's rows
#pragma unroll
    for (int c = 0; c < CH; ++c) {
        const int f = f0 + c * T * VEC;
        lane_walks[c] = false;
        if (f < F) {
            const long long ro = (long long)row * F + f;
            float o[VEC], g[VEC];
            int a[VEC];
            gf_load<VEC>(o, out + ro);
            gf_load<VEC>(g, grad_out + ro);
            sr_load_aux<VEC>(a, aux + ro);
#pragma unroll
            for (int j = 0; j < VEC; ++j) {
                walks[c][j] = all || a[j] < 0;
                lane_walks[c] |= walks[c][j];
                mo[c][j] = sign * o[j];
                const int n = a[j] < 0 ? -1 - a[j] : 1;
                const int total = n + ((count_zero_as_tie && o[j] == 0.f) ? 1 : 0);
                share[c][j] = total > 0 ? g[j] / (float)total : 0.f;
                // torch's rule for a NaN extreme: no message equals it, and every edge of the
                // row gets NaN (its mask 0 times g / 0 tied edges)
                if (count_zero_as_tie && o[j] != o[j]) share[c][j] = __int_as_float(0x7fc00000);
            }
        } else {
#pragma unroll
            for (int j = 0; j < VEC; ++j) { walks[c][j] = false; mo[c][j] = 0.f; share[c][j] = 0.f; }
        }
        any |= lane_walks[c];
    }
    if (!__any_sync(mask, any)) return;  // uniform over the group: every element went along its arg

    for (int e0 = start; e0 < end; e0 += T) {
        const int k = e0 + lane;
        int s = 0, p = 0;
        float ww = 1.f;
        if (k < end) {
            s = __ldg(indices + k);
            p = __ldg(perm + k);
            if (w != nullptr) ww = __ldg(w + p);
        }
        const int nb = min(T, end - e0);
        for (int t = 0; t < nb; t += U) {
            int ss[U], pp[U];
            float wu[U], v[U][CH][VEC];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int tu = min(t + u, nb - 1);  // clamp: duplicates of the last edge are skipped below
                ss[u] = __shfl_sync(mask, s, tu, T);
                pp[u] = __shfl_sync(mask, p, tu, T);
                wu[u] = __shfl_sync(mask, ww, tu, T);
            }
            // only the lanes holding a walking element load (with 16-bit features ties are
            // common, but most lanes of a walking row still have none)
#pragma unroll
            for (int u = 0; u < U; ++u)
#pragma unroll
                for (int c = 0; c < CH; ++c)
                    if (lane_walks[c]) gf_load<VEC>(v[u][c], x + (long long)ss[u] * F + f0 + c * T * VEC);
#pragma unroll
            for (int u = 0; u < U; ++u) {
                if (t + u >= nb) break;  // uniform across the group
                const float sw = sign * wu[u];
                float dwp = 0.f;
#pragma unroll
                for (int c = 0; c < CH; ++c) {
                    const int f = f0 + c * T * VEC;
                    if (f < F) {
#pragma unroll
                        for (int j = 0; j < VEC; ++j) {
                            if (!walks[c][j]) continue;
                            if (sr_message<SR_KEEP, TO>(sw, v[u][c][j]) == mo[c][j] || share[c][j] != share[c][j]) {
                                if (dx != nullptr) atomicAdd(dx + (long long)ss[u] * F + f + j, share[c][j] * wu[u]);
                                dwp += share[c][j] * v[u][c][j];
                            } else if (count_zero_as_tie) {
                                // torch's rule: a losing message's gradient is 0, and autograd
                                // still multiplies it by the other factor (dw += 0 * x, dx += 0 * w),
                                // which is NaN where that factor is not finite
                                if (!sr_finite(v[u][c][j])) dwp = __int_as_float(0x7fc00000);
                                if (dx != nullptr && !sr_finite(wu[u]))
                                    atomicAdd(dx + (long long)ss[u] * F + f + j, __int_as_float(0x7fc00000));
                            }
                        }
                    }
                }
                if (dw != nullptr) {
                    dwp = gf_group_sum<T>(dwp, mask);
                    if (lane == 0 && dwp != 0.f) atomicAdd(dw + pp[u], dwp);
                }
            }
        }
    }
}

// The walk: group gid of n_groups (grid: groups, feature blocks) takes up to `batch` items
// (batch <= T): gid, gid + n_groups, gid + 2 n_groups, ... (strided: the walking items of a
// few long rows, or of the rows with 16-bit ties, sit together in the list and would otherwise
// fall to a few groups). One lane reads one item's row flag and the group walks only the
// items whose row walks (every non-empty one when walk_all is set). Most items walk nowhere on
// most steps: batching lets a few threads skip them where one group per item cost a whole
// grid of exits (the launcher picks batch so that the grid still fills the GPU several times
// over when every row walks).
// Launch bounds: the occupancy of a walk of one item per group (7 blocks of 128 threads per
// SM with one feature chunk per lane, 5 with two), which the batch's few extra live values
// would otherwise cost with 16-lane groups.
template <int CH>
struct sr_walk_shape {
    static constexpr int MIN_BLOCKS = CH == 1 ? 7 : CH == 2 ? 5 : 3;
};

template <typename TX, typename TO, int VEC, int T, int CH>
__global__ void __launch_bounds__(SR_THREADS, sr_walk_shape<CH>::MIN_BLOCKS)
sr_bwd_ties(const int4* __restrict__ items, int n_items, int batch,
                            const int* __restrict__ indices, const int* __restrict__ perm, const TX* __restrict__ x,
                            const float* __restrict__ w, int F, float sign, int count_zero_as_tie,
                            const TO* __restrict__ out, const int* __restrict__ aux,
                            const int* __restrict__ walk_all, const int* __restrict__ row_walks,
                            const TO* __restrict__ grad_out, float* __restrict__ dx, float* __restrict__ dw) {
    const int gid = (int)((blockIdx.x * (long long)blockDim.x + threadIdx.x) / T);
    const int n_groups = (n_items + batch - 1) / batch;
    const int lane = threadIdx.x % T;
    if (gid >= n_groups) return;  // whole groups leave together
    const unsigned int mask = gf_group_mask<T>();
    const bool all = __ldg(walk_all) != 0;
    bool walks = false;
    // lane < batch: gid + lane * n_groups < n_groups * batch < n_items + batch, an int
    if (lane < batch && gid + lane * n_groups < n_items) {
        const int4 it = __ldg(items + gid + lane * n_groups);
        // a row without edges has no gradient to route; a row without a walking element
        // sent every element along its arg
        walks = it.y != it.z && (all || __ldg(row_walks + it.x) != 0);
    }
    // the group's bits of the warp's ballot, lane i's at bit i
    unsigned int todo = __ballot_sync(mask, walks) >> ((threadIdx.x & 31u) & ~(unsigned int)(T - 1));
    if constexpr (T < 32) todo &= (1u << T) - 1u;
    while (todo != 0u) {
        const int i = __ffs(todo) - 1;
        todo &= todo - 1u;
        sr_walk_item<TX, TO, VEC, T, CH>(__ldg(items + gid + i * n_groups), all, mask, lane, indices, perm, x, w,
                                         F, sign, count_zero_as_tie, out, aux, grad_out, dx, dw);
    }
}
