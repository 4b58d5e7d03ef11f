"""The dot-product attention kernel family (``dot_attention.cu``) and the merges of split rows
that both dot-attention launchers run: the CSR kernels' (:mod:`gnn_fastpath.cuda.dot_attention`)
and the block-sparse tensor-core kernels' (:mod:`gnn_fastpath.cuda.block_attention`).

Both launchers import this module: dot_attention picks the block variant (it imports
block_attention), and block_attention merges its split windows with the kernels here, so it
needs nothing of dot_attention and the two form no import circle.
"""
from __future__ import annotations

from typing import Optional

from torch import Tensor

from . import launch, row_attention

SOURCE = "dot_attention.cu"
THREADS = 256
#: The kernels with the dropout key from the seed, offset scalars; KERNELS_RNG: from the rng
#: tensor (row_attention.stream_families), for the kernels that take a dropout stream.
KERNELS, KERNELS_RNG = row_attention.stream_families(SOURCE, {"DOT_THREADS": THREADS})


def blocks(n_threads: int) -> int:
    """Thread blocks of :data:`THREADS` for ``n_threads`` threads."""
    return launch.cdiv(n_threads, THREADS)


#: Grid cap of the split-row merges (grid-stride kernels): a static work list has an entry
#: for every row, and its threads stop at the first one without chunks.
MERGE_MAX_BLOCKS = 4096


def merge_split_rows(split: Tensor, n_split: int, part_acc: Optional[Tensor], part_ml: Optional[Tensor],
                     out: Tensor, lse: Tensor) -> None:
    """Forward of split rows: out [N, H, D] (any storage dtype) and lse [N, H] of each entry
    (row, first slot, slots, _) of ``split`` from the (m, l) [slots, H, 2] and unnormalised
    accumulator [slots, H, D] float32 partial states of its slots (entries of 0 slots, a static
    list's unsplit rows, come after all others: the merge stops at the first)."""
    H, D = out.shape[1:]
    if n_split and H * D:
        KERNELS.kernel(out.device, "dot_fwd_merge", launch.ctype(out.dtype)).launch(
            min(blocks(n_split * H * D), MERGE_MAX_BLOCKS), THREADS, split=split, n_split=n_split,
            part_acc=part_acc, part_ml=part_ml, out=out, lse=lse, H=H, D=D)


def sum_split_rows(split: Tensor, n_split: int, part: Optional[Tensor], dst: Tensor) -> None:
    """Rows of ``dst`` (any storage dtype) named by ``split`` (as :func:`merge_split_rows`) =
    sums of their float32 partial rows, rounded once."""
    row_len = dst[0].numel() if dst.numel() else 0
    if n_split and row_len:
        KERNELS.kernel(dst.device, "dot_sum_partials", launch.ctype(dst.dtype)).launch(
            min(blocks(n_split * row_len), MERGE_MAX_BLOCKS), THREADS, split=split, n_split=n_split, part=part,
            dst=dst, row_len=row_len)
