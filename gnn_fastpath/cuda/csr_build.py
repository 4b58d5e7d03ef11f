"""Launchers of the graph-build kernels (``csr_build.cu``): CSR row offsets from sorted rows,
and the facts about a new edge list that the host must read (one transfer)."""
from __future__ import annotations

from typing import Dict, Tuple

import torch
from torch import Tensor

from . import launch

SOURCE = "csr_build.cu"
THREADS = 256
#: Grid cap of the grid-stride passes (a few blocks per SM of an H100/H200).
MAX_BLOCKS = 1024
KERNELS = launch.Family(SOURCE)

_LL_MAX = 2**63 - 1
#: facts[0..8] before the passes: min/max source id, min/max target id, unsorted pairs,
#: self loops, max in-degree, max out-degree, pairs of one target whose sources descend.
_FACTS_START = (_LL_MAX, -_LL_MAX - 1, _LL_MAX, -_LL_MAX - 1, 0, 0, 0, 0, 0)
_facts_start: Dict[torch.device, Tensor] = {}


def csr_indptr(sorted_rows: Tensor, n_rows: int) -> Tensor:
    """indptr [n_rows+1] (int64) from CUDA row ids [M] sorted ascending, all < n_rows."""
    rows = sorted_rows.to(torch.int64).contiguous()
    m = rows.numel()
    indptr = torch.empty(n_rows + 1, dtype=torch.int64, device=rows.device)
    KERNELS.kernel(rows.device, "csr_indptr_from_sorted").launch(
        launch.cdiv(m + 1, THREADS), THREADS, rows=rows, num_edges=m, n_rows=n_rows, indptr=indptr)
    return indptr


def _start(device: torch.device) -> Tensor:
    # Made once per device and copied on the device per graph: a fresh host tensor would
    # cost a host-to-device copy per graph.
    t = _facts_start.get(device)
    if t is None:
        with torch.inference_mode(False):
            t = _facts_start[device] = torch.tensor(_FACTS_START, dtype=torch.int64, device=device)
    return t


def edge_facts(src: Tensor, dst: Tensor, n_src: int, n_dst: int) -> Tuple[Tensor, Tensor, Tensor]:
    """(facts int64 [9], in_degree int32 [n_dst], out_degree int32 [n_src]) of CUDA int64
    edge ids ``src``/``dst`` [M] (M >= 1), enqueued without a host sync.

    ``facts``: min and max source id, min and max target id, the number of adjacent pairs
    out of target order (0: grouped by target), self loops, max in-degree, max out-degree,
    the number of adjacent pairs of one target whose sources descend (0: sorted within rows).
    Ids outside ``[0, n)`` are not counted in the degrees (the caller raises on them).
    """
    src, dst = src.contiguous(), dst.contiguous()
    device, m = src.device, src.numel()
    facts = _start(device).clone()
    in_degree = torch.zeros(n_dst, dtype=torch.int32, device=device)
    out_degree = torch.zeros(n_src, dtype=torch.int32, device=device)
    KERNELS.kernel(device, "edge_facts").launch(
        min(launch.cdiv(m, THREADS), MAX_BLOCKS), THREADS, src=src, dst=dst, num_edges=m, n_src=n_src,
        n_dst=n_dst, facts=facts, in_degree=in_degree, out_degree=out_degree)
    n = max(n_src, n_dst)
    if n:
        KERNELS.kernel(device, "degree_max").launch(
            min(launch.cdiv(n, THREADS), MAX_BLOCKS), THREADS, in_degree=in_degree, n_dst=n_dst,
            out_degree=out_degree, n_src=n_src, facts=facts)
    return facts, in_degree, out_degree
