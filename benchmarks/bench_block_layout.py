"""The block-sparse SpMM layout per benchmark graph: how much the rows of a 16-row window share
their columns, block fill, build time and memory against the CSR (issue 14).

    python -m benchmarks.bench_block_layout --graphs tolokers,arxiv-like,clustered --json-out x.json
"""
from __future__ import annotations

import argparse
import sys
import time

import torch

from . import graphs as G
from . import report
from .timing import fmt

COLUMNS = ["graph", "edges", "sharing", "fill", "blocks", "offered", "build_ms", "layout_mb", "csr_mb", "x_csr"]
HEADERS = ["graph", "edges", "entries per (window, column)", "block fill", "blocks", "offered (>= MIN_SHARING)",
           "build ms", "layout MB (bf16 values)", "CSR MB", "layout / CSR"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--graphs", default="tolokers,arxiv-like,arxiv-skewdst,roads-like,clustered")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--json-out", default=None)
    p.add_argument("--md", default=None)
    args = p.parse_args(argv)
    from gnn_fastpath import Graph
    from gnn_fastpath.cuda import block_spmm

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
        rows.append({"graph": name, "edges": g.num_edges, "sharing": layout.sharing, "fill": layout.fill,
                     "blocks": layout.n_blocks, "offered": layout.sharing >= block_spmm.MIN_SHARING,
                     "build_ms": build, "layout_mb": layout.nbytes() / 1e6, "csr_mb": csr / 1e6,
                     "x_csr": layout.nbytes() / csr})
        print("  " + " ".join(f"{k}={fmt(v) if isinstance(v, float) else v}" for k, v in rows[-1].items()), flush=True)
    payload = {"benchmark": "block_layout", "environment": report.environment(), "rows": rows}
    text = "\n".join(["### Block-sparse layout per graph", "", report.env_header(payload["environment"]), "",
                      report.markdown_table(rows, COLUMNS, HEADERS, {c: fmt for c in COLUMNS[2:] if c != "offered"}),
                      ""])
    report.publish(payload, text, args.json_out, args.md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
