"""The block-sparse layout per benchmark graph: how much the rows of a 16-row window share
their columns, block fill, build time and memory against the CSR, for SpMM (one layout with
bf16 values) and for dot attention (the destination- and source-major layouts with their masks,
parallel-edge counts and work lists; one layout on an undirected graph) (issue 14).

    python -m benchmarks.bench_block_layout --graphs tolokers,arxiv-like,clustered --json-out x.json
"""
from __future__ import annotations

import argparse
import sys
import time

import torch

from . import graphs as G
from . import harness as H
from .harness import fmt

COLUMNS = ["graph", "edges", "sharing", "fill", "blocks", "offered", "build_ms", "layout_mb", "csr_mb", "x_csr",
           "att_build_ms", "att_mb", "att_x_csr"]
HEADERS = ["graph", "edges", "entries per (window, column)", "block fill", "blocks", "SpMM: offered (>= MIN_SHARING)",
           "SpMM build ms", "SpMM layout MB (bf16 values)", "CSR MB", "SpMM layout / CSR", "attention build ms",
           "attention layouts MB", "attention layouts / CSR"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--graphs", default="tolokers,arxiv-like,arxiv-skewdst,roads-like,clustered")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--json-out", default=None)
    p.add_argument("--md", default=None)
    args = p.parse_args(argv)
    from gnn_fastpath import Graph
    from gnn_fastpath.cuda import block_attention, block_spmm

    device = "cuda" if torch.cuda.is_available() else "cpu"
    rows = []
    for name in args.graphs.split(","):
        bg = G.load(name, data_dir=args.data_dir, device=device)
        g = Graph.from_edge_index(bg.edge_index, bg.num_nodes)
        kc = g.kernel_csr()
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        layout = block_spmm.BlockLayout(kc.indptr, kc.indices, g.n_dst, g.n_src)
        layout.values(torch.ones(g.num_edges, device=device), torch.bfloat16)
        if device == "cuda":
            torch.cuda.synchronize()
        build = (time.perf_counter() - t0) * 1e3
        csr = kc.indptr.numel() * 4 + kc.indices.numel() * 4 + kc.perm.numel() * 4 + g.num_edges * 4  # + fp32 values
        att_build, att_bytes = _attention_layouts(g, device)
        rows.append({"graph": name, "edges": g.num_edges, "sharing": layout.sharing, "fill": layout.fill,
                     "blocks": layout.n_blocks, "offered": layout.sharing >= block_spmm.MIN_SHARING,
                     "build_ms": build, "layout_mb": layout.nbytes() / 1e6, "csr_mb": csr / 1e6,
                     "x_csr": layout.nbytes() / csr, "att_build_ms": att_build, "att_mb": att_bytes / 1e6,
                     "att_x_csr": att_bytes / csr})
        print("  " + " ".join(f"{k}={fmt(v) if isinstance(v, float) else v}" for k, v in rows[-1].items()), flush=True)
    payload = {"benchmark": "block_layout", "environment": H.environment(), "rows": rows}
    text = "\n".join(["### Block-sparse layout per graph", "", H.env_header(payload["environment"]), "",
                      H.markdown_table(rows, COLUMNS, HEADERS, {c: fmt for c in COLUMNS[2:] if c != "offered"}),
                      ""])
    H.publish(payload, text, args.json_out, args.md)
    return 0


def _attention_layouts(g, device):
    """(build ms, bytes) of block attention's layouts on a fresh copy of ``g`` (its CSR and
    transpose built first: the CSR kernels need them too)."""
    from gnn_fastpath import Graph
    from gnn_fastpath.cuda import block_attention

    src, dst = g.caller_coo()
    g = Graph.from_edge_index(torch.stack([src, dst]), (g.n_src, g.n_dst))
    g.kernel_csr(), g.kernel_source_csr()
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    layouts = {id(lay): lay for lay in (block_attention.layout(g), block_attention.source_layout(g))}
    total = 0
    for lay in layouts.values():
        lay.masks()
        counts = lay.counts()
        wk = block_attention.work(g, lay)
        total += (lay.nbytes(None) + (counts.numel() if counts is not None else 0) + wk.chunks.items.numel() * 4
                  + wk.split.numel() * 4)
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3, total


if __name__ == "__main__":
    sys.exit(main())
