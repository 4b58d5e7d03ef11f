"""Run every available CUDA op, forward and backward, on small random graphs.

Meant to run under ``compute-sanitizer --tool memcheck`` (benchmarks/device_run.sh does,
with ``PYTORCH_NO_CUDA_MEMORY_CACHING=1`` so each tensor is its own allocation and an
out-of-bounds access is not hidden inside a cached block). It also compares every output
and gradient with the reference backend, so it doubles as a quick GPU smoke test.

The graphs have what kernels get wrong: destinations without in-edges, self loops,
duplicate edges, one super node (700 in-edges: split into chunks by the attention kernels,
"heavy" for degree-aware launches) and a bipartite shape. Attention cases run under every
backward variant (atomic, transposed, and GATv2's one-pass fused; through the GNN_FASTPATH_*_BWD
settings), on the graphs above and on an undirected one (the homogeneous graph both ways), dot attention
in 16 bits also on the block-sparse tensor-core kernels (forced, whole and split windows). Every
graph runs twice: as an eager Graph, and as GraphTensors (the compiled path's custom
operators with their static launch geometry; ``SANITIZE_STATIC=0`` leaves these out), and a
third time as GraphTensors whose loops and every fifth edge sit in the extra row of removed
edges (what a compiled layer that drops self loops builds; memory checking only, not compared:
``tests/ops/test_library.py`` checks those values).
Every case runs per feature dtype (float32, bfloat16, float16; ``SANITIZE_DTYPES`` picks):
16-bit features with float32 parameters, scores and edge weights, as under autocast, and the
attention ops also with ``out_dtype=torch.float32``. Exit status 1 when a case raised or
mismatched.

    python3 benchmarks/sanitize_small.py                       # GPU, compared with the reference
    SANITIZE_DEVICE=cpu python3 benchmarks/sanitize_small.py    # dry run of the harness on the CPU
"""
from __future__ import annotations

import os
import sys
import time
import traceback
from typing import Callable, List, Sequence

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import gnn_fastpath  # noqa: E402
from gnn_fastpath import ops as gops  # noqa: E402
from gnn_fastpath.graph.tensors import from_coo, of_graph  # noqa: E402

#: Relative error (Frobenius norm) allowed against the reference op on the same inputs: the
#: 16-bit outputs differ from it by about one rounding (unit roundoff 2**-8 bf16, 2**-11 fp16).
TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 4e-3}
DTYPES = [getattr(torch, name) for name in os.environ.get("SANITIZE_DTYPES", "float32,bfloat16,float16").split(",")]
#: SANITIZE_DEVICE=cpu is a dry run of this harness (reference against itself, no GPU).
DEVICE = os.environ.get("SANITIZE_DEVICE", "cuda")
#: SANITIZE_COMPARE=0 skips the reference comparison (under memcheck it only adds checked
#: torch kernels; correctness is the GPU tests' job).
COMPARE = os.environ.get("SANITIZE_COMPARE", "1") != "0"
#: SANITIZE_STATIC=0 leaves out the static runs (the compiled path's operators on GraphTensors).
STATIC = os.environ.get("SANITIZE_STATIC", "1") != "0"
#: SANITIZE_OPS=segment_reduce,spmm runs only those ops' cases (default: every op).
OPS = {o for o in os.environ.get("SANITIZE_OPS", "").split(",") if o}
#: graphs to run (``SANITIZE_GRAPHS``, comma list of homog, bipartite, undirected; empty: all)
GRAPHS = {g for g in os.environ.get("SANITIZE_GRAPHS", "").split(",") if g}
failures: List[str] = []


def make_graph(n_src: int, n_dst: int, m: int, heavy: int, seed: int, bipartite: bool):
    g = torch.Generator().manual_seed(seed)
    live = max(1, int(n_dst * 0.8))  # destinations >= live get no in-edges (empty rows)
    src = torch.randint(0, n_src, (m,), generator=g)
    dst = torch.randint(0, live, (m,), generator=g)
    parts_s, parts_d = [src], [dst]
    parts_s.append(torch.randint(0, n_src, (heavy,), generator=g))    # super node 7
    parts_d.append(torch.full((heavy,), 7, dtype=torch.long))
    if not bipartite:
        loops = torch.randint(0, live, (20,), generator=g)           # self loops
        parts_s.append(loops)
        parts_d.append(loops)
    dup = torch.randint(0, m, (50,), generator=g)                    # duplicate edges
    parts_s.append(src[dup])
    parts_d.append(dst[dup])
    ei = torch.stack([torch.cat(parts_s), torch.cat(parts_d)])
    perm = torch.randperm(ei.shape[1], generator=g)                  # caller order != CSR order
    ei = ei[:, perm].to(DEVICE)
    nodes = (n_src, n_dst) if bipartite else n_src
    return gnn_fastpath.Graph.from_edge_index(ei, nodes)


def rnd(*shape, scale=1.0, grad=True, dtype=torch.float32):
    t = (torch.randn(*shape, device=DEVICE) * scale).to(dtype)
    return t.requires_grad_(grad)


#: Backward variants of the attention ops; "fused" is GATv2's alone (the one-pass backward of
#: an undirected graph; on a directed one it runs "transposed").
VARIANTS = ("atomic", "transposed", "fused")


def set_attention_variant(kind: str) -> None:
    """Backward variant of the attention ops (settings read per call); dot and GAT attention
    take "transposed" for "fused"."""
    os.environ["GNN_FASTPATH_DOT_BWD"] = os.environ["GNN_FASTPATH_GAT_BWD"] = \
        "transposed" if kind == "fused" else kind
    os.environ["GNN_FASTPATH_GATV2_BWD"] = kind


def _flat(out) -> List[torch.Tensor]:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def run_op_case(name: str, op: str, fn: Callable, inputs: Sequence[torch.Tensor], graph, ref_graph,
                compare: bool = True) -> None:
    """``fn(graph, *inputs)`` forward and backward, checked against ``fn(ref_graph, *inputs)``
    on the reference backend."""
    if OPS and op not in OPS:
        return
    tol = TOL[inputs[0].dtype]
    probe = inputs[0]
    backend = gops.backend_for(op, probe)
    if backend != "cuda" and DEVICE == "cuda":
        print(f"SKIP {name}: {op} dispatches to {backend} here", flush=True)
        return
    t0 = time.perf_counter()
    try:
        outs = _flat(fn(graph, *inputs))
        grads_out = [torch.randn_like(o) for o in outs]
        diff = [x for x in inputs if x.requires_grad]
        grads = torch.autograd.grad(outs, diff, grads_out, allow_unused=True)
        if DEVICE == "cuda":
            torch.cuda.synchronize()
        worst = 0.0
        if compare and COMPARE:
            with gops.force_reference():
                ref_outs = _flat(fn(ref_graph, *inputs))
                ref_grads = torch.autograd.grad(ref_outs, diff, grads_out, allow_unused=True)
            for a, b in list(zip(outs, ref_outs)) + list(zip(grads, ref_grads)):
                if a is None and b is None:
                    continue
                if a is None or b is None:
                    raise AssertionError("a gradient is None on one backend only")
                a, b = a.detach().double(), b.detach().double()
                if not torch.isfinite(a).all():
                    raise AssertionError("non-finite values")
                err = float((a - b).norm() / b.norm().clamp_min(1e-12))
                worst = max(worst, err)
            if worst > tol:
                raise AssertionError(f"relative error {worst:.2e} > {tol:.0e}")
        checked = f"max rel err {worst:.1e}" if compare and COMPARE else "ran (not compared)"
        print(f"OK   {name}: {checked} ({(time.perf_counter() - t0) * 1e3:.0f} ms)", flush=True)
    except Exception as exc:  # noqa: BLE001
        failures.append(name)
        print(f"FAIL {name}: {type(exc).__name__}: {exc}", flush=True)
        traceback.print_exc(limit=4)


def run_graph(gname: str, g, dtype: torch.dtype, static=False) -> None:
    """Every op on graph ``g`` with features of ``dtype`` (parameters, edge weights float32).
    ``static``: the ops take ``g`` as GraphTensors (the compiled path's custom operators and
    static launch geometry: long rows split by lists sized from shapes), compared with the
    reference on the eager Graph; ``"extra_row"``: GraphTensors with its loops and every fifth
    edge removed into the extra row, not compared."""
    ns, nd, m = g.n_src, g.n_dst, g.num_edges
    dt = str(dtype).replace("torch.", "")
    gop = of_graph(g) if static else g
    if static == "extra_row":
        src, dst = g.caller_coo()
        gop = from_coo(src, dst, ns, nd, removed=(src == dst) | (torch.arange(m, device=src.device) % 5 == 0))
        gname += " extra-row"
    elif static:
        gname += " static"

    variant = None

    def run_case(name, op, fn, inputs, compare=True):
        if variant == "fused" and op != "gatv2_attention":
            return  # the same as its "transposed" run
        run_op_case(name, op, fn, inputs, gop, g, compare and static != "extra_row")

    def feat(*shape, scale=1.0):
        return rnd(*shape, scale=scale, dtype=dtype)

    for variant in VARIANTS:
        set_attention_variant(variant)
        for h, d in ((2, 64), (1, 32), (4, 128), (3, 20)):
            tag = f"{gname} {dt} H{h} D{d} bwd={variant}"
            run_case(f"gatv2 {tag}", "gatv2_attention",
                     lambda G, xs, xd, a: gnn_fastpath.gatv2_attention(G, xs, xd, a),
                     [feat(ns, h, d), feat(nd, h, d), rnd(h, d, scale=d ** -0.5)])
            run_case(f"dot {tag}", "dot_attention",
                     lambda G, q, k, v: gnn_fastpath.dot_attention(G, q, k, v),
                     [feat(nd, h, d), feat(ns, h, d), feat(ns, h, d)])
            run_case(f"gat {tag}", "gat_attention",
                     lambda G, xs, s, t: gops.gat_attention(G, xs, s, t),
                     [feat(ns, h, d), rnd(ns, h), rnd(nd, h)])
        tag = f"{gname} {dt} H2 D64 bwd={variant}"
        if dtype != torch.float32:  # 16-bit features, float32 results (what PyG layers get under autocast)
            run_case(f"gatv2 out_dtype=float32 {tag}", "gatv2_attention",
                     lambda G, xs, xd, a: gnn_fastpath.gatv2_attention(G, xs, xd, a, return_attention=True,
                                                                   out_dtype=torch.float32),
                     [feat(ns, 2, 64), feat(nd, 2, 64), rnd(2, 64, scale=0.125)])
            run_case(f"gat out_dtype=float32 16-bit scores {tag}", "gat_attention",
                     lambda G, xs, s, t: gops.gat_attention(G, xs, s, t, return_attention=True,
                                                         out_dtype=torch.float32),
                     [feat(ns, 2, 64), feat(ns, 2), feat(nd, 2)])
            run_case(f"dot out_dtype=float32 {tag}", "dot_attention",
                     lambda G, q, k, v: gnn_fastpath.dot_attention(G, q, k, v, return_attention=True,
                                                               out_dtype=torch.float32),
                     [feat(nd, 2, 64), feat(ns, 2, 64), feat(ns, 2, 64)])
        run_case(f"gatv2 edge_term+attention {tag}", "gatv2_attention",
                 lambda G, xs, xd, a, et: gnn_fastpath.gatv2_attention(G, xs, xd, a, edge_term=et, return_attention=True),
                 [feat(ns, 2, 64), feat(nd, 2, 64), rnd(2, 64, scale=0.125), feat(m, 2, 64)])
        run_case(f"gat edge_score+edge_weight+attention {tag}", "gat_attention",
                 lambda G, xs, s, t, u, w: gops.gat_attention(G, xs, s, t, u, return_attention=True, edge_weight=w),
                 [feat(ns, 2, 64), rnd(ns, 2), rnd(nd, 2), rnd(m, 2), torch.rand(m, device=DEVICE).requires_grad_()])
        run_case(f"dot edge_term+attention {tag}", "dot_attention",
                 lambda G, q, k, v, et: gnn_fastpath.dot_attention(G, q, k, v, edge_term=et, return_attention=True),
                 [feat(nd, 2, 64), feat(ns, 2, 64), feat(ns, 2, 64), feat(m, 2, 64)])
        # dropout: random streams differ from the reference, so memory checking only
        run_case(f"gatv2 dropout {tag}", "gatv2_attention",
                 lambda G, xs, xd, a: gnn_fastpath.gatv2_attention(G, xs, xd, a, dropout=0.2, return_attention="dropped"),
                 [feat(ns, 2, 64), feat(nd, 2, 64), rnd(2, 64, scale=0.125)], compare=False)
        run_case(f"gat dropout {tag}", "gat_attention",
                 lambda G, xs, s, t, w: gops.gat_attention(G, xs, s, t, dropout=0.2, return_attention="dropped",
                                                        edge_weight=w),
                 [feat(ns, 2, 64), rnd(ns, 2), rnd(nd, 2), torch.rand(m, device=DEVICE).requires_grad_()],
                 compare=False)
        run_case(f"dot dropout {tag}", "dot_attention",
                 lambda G, q, k, v: gnn_fastpath.dot_attention(G, q, k, v, dropout=0.2),
                 [feat(nd, 2, 64), feat(ns, 2, 64), feat(ns, 2, 64)], compare=False)
    variant = None
    set_attention_variant("atomic")
    if dtype != torch.float32 and not static:  # the block-sparse tensor-core kernels, forced
        from gnn_fastpath.cuda import block_attention

        os.environ["GNN_FASTPATH_DOT_FWD"] = os.environ["GNN_FASTPATH_DOT_BWD"] = "block"
        for chunk in (block_attention.CHUNK_BLOCKS, 2):  # 2: most windows split, merged after
            saved, block_attention.CHUNK_BLOCKS = block_attention.CHUNK_BLOCKS, chunk
            for h, d in ((2, 64), (1, 32), (4, 128), (3, 16)):
                run_case(f"dot block chunk={chunk} {gname} {dt} H{h} D{d}", "dot_attention",
                         lambda G, q, k, v: gnn_fastpath.dot_attention(G, q, k, v),
                         [feat(nd, h, d), feat(ns, h, d), feat(ns, h, d)])
            run_case(f"dot block chunk={chunk} out_dtype=float32 {gname} {dt} H2 D64", "dot_attention",
                     lambda G, q, k, v: gnn_fastpath.dot_attention(G, q, k, v, out_dtype=torch.float32),
                     [feat(nd, 2, 64), feat(ns, 2, 64), feat(ns, 2, 64)])
            # dropout keys one edge per cell: the graph without its parallel edges
            src, dst = g.caller_coo()
            simple = gnn_fastpath.Graph.from_edge_index(torch.unique(torch.stack([src, dst]), dim=1), (ns, nd))
            run_op_case(f"dot block chunk={chunk} dropout {gname} {dt} H2 D64", "dot_attention",
                        lambda G, q, k, v: gnn_fastpath.dot_attention(G, q, k, v, dropout=0.2),
                        [feat(nd, 2, 64), feat(ns, 2, 64), feat(ns, 2, 64)], simple, simple, compare=False)
            block_attention.CHUNK_BLOCKS = saved
        os.environ["GNN_FASTPATH_DOT_BWD"] = "atomic"
        del os.environ["GNN_FASTPATH_DOT_FWD"]
    for f in (64, 512, 33):
        for norm in ("none", "left", "right", "both"):
            run_case(f"spmm {gname} {dt} F{f} norm={norm}", "spmm",
                     lambda G, x: gnn_fastpath.spmm(G, x, norm=norm), [feat(ns, f)])
        run_case(f"spmm {gname} {dt} F{f} edge_weight norm=both", "spmm",
                 lambda G, x, w: gnn_fastpath.spmm(G, x, edge_weight=w, norm="both"),
                 [feat(ns, f), torch.rand(m, device=DEVICE).requires_grad_(True)])
        for reduce in ("max", "min"):
            run_case(f"segment_reduce {gname} {dt} F{f} {reduce}", "segment_reduce",
                     lambda G, x: gnn_fastpath.segment_reduce(G, x, reduce=reduce), [feat(ns, f)])
        run_case(f"segment_reduce {gname} {dt} F{f} max edge_weight", "segment_reduce",
                 lambda G, x, w: gnn_fastpath.segment_reduce(G, x, reduce="max", edge_weight=w),
                 [feat(ns, f), torch.rand(m, device=DEVICE).requires_grad_(True)])
        # ReLU'd small integers: ties everywhere, so the backward walks rows (split, even) and
        # scatters along saved winners (first) on the same graph
        for tie_break in ("split", "even", "first"):
            ties = torch.relu(torch.randint(-2, 3, (ns, f), device=DEVICE).to(dtype)).requires_grad_(True)
            run_case(f"segment_reduce {gname} {dt} F{f} ties {tie_break}", "segment_reduce",
                     lambda G, x, t=tie_break: gnn_fastpath.segment_reduce(G, x, reduce="max", tie_break=t), [ties])


def main() -> int:
    if DEVICE == "cuda" and not torch.cuda.is_available():
        print("no GPU: nothing to sanitize")
        return 0
    reason = gnn_fastpath.cuda.unavailable_reason()
    if reason and DEVICE == "cuda":
        print(f"CUDA kernels unavailable: {reason}")
        return 1
    torch.manual_seed(0)
    graphs = {
        "homog": make_graph(300, 300, 2500, 700, seed=1, bipartite=False),
        "bipartite": make_graph(200, 120, 1500, 400, seed=2, bipartite=True),
    }
    homog = graphs["homog"]
    both_ways = torch.stack([homog.indices, homog.dst_index()])
    graphs["undirected"] = gnn_fastpath.Graph.from_edge_index(torch.cat([both_ways, both_ways.flip(0)], 1),
                                                              homog.n_dst)
    for gname, g in graphs.items():
        if GRAPHS and gname not in GRAPHS:
            continue
        print(f"graph {gname}: n_src={g.n_src} n_dst={g.n_dst} M={g.num_edges}", flush=True)
        for dtype in DTYPES:
            run_graph(gname, g, dtype)
            if STATIC:
                run_graph(gname, g, dtype, static=True)
                run_graph(gname, g, dtype, static="extra_row")
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    if failures:
        print(f"SANITIZE_SMALL: {len(failures)} case(s) failed: {', '.join(failures)}")
        return 1
    print("SANITIZE_SMALL: all available cases ran" + (" and matched the reference" if COMPARE else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
