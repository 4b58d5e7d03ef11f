"""Fixed-size sampled mini-batches, so that CUDA graphs can record a training step once.

A CUDA graph (``torch.compile(model, mode="reduce-overhead")``) replays the kernels it
recorded on buffers of the sizes it recorded; a ``NeighborLoader`` batch has a new number of
nodes and edges every step, so each one would compile and record anew. :class:`PadToCapacity`
pads every batch to one node capacity and one edge capacity: padding nodes get zero features,
padding edges are self loops among the padding nodes. No real node gains or loses an
in-neighbour, so every real node's output (the seeds' loss included) and every gradient are
unchanged; only the shapes are fixed.

The capacities are given, or grow with the batches: the largest batch seen so far times
``1 + slack``, rounded up to ``multiple``, so that after the first few batches every batch
fits and the compiled step stops recompiling. The padding edges are spread over the padding
nodes in ascending order, so no padding node becomes a row of thousands of edges and an
``edge_index`` sorted by either row stays sorted.
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
from torch import Tensor
from torch_geometric.data import Data, HeteroData
from torch_geometric.transforms import BaseTransform

#: Default capacity headroom over the largest batch seen (see :class:`PadToCapacity`).
SLACK = 0.1
#: Default rounding of the capacities.
MULTIPLE = 1024


def capacity(count: int, slack: float = SLACK, multiple: int = MULTIPLE) -> int:
    """``count * (1 + slack)``, rounded up to a multiple of ``multiple``."""
    need = math.ceil(count * (1.0 + slack))
    return -(-need // multiple) * multiple if multiple > 1 else need


def padding_edges(num_nodes: int, num_edges: int, node_capacity: int, edge_capacity: int, like: Tensor) -> Tensor:
    """The ``edge_capacity - num_edges`` padding edges [2, K] of a graph of ``num_nodes`` nodes
    padded to ``node_capacity``: self loops on the padding nodes ``num_nodes ..
    node_capacity - 1``, ascending, as evenly spread as their number allows (each padding
    node gets ``K / (node_capacity - num_nodes)`` of them, rounded). ``like``: the
    ``edge_index`` whose dtype and device they take. Nothing is read back from the device."""
    k = edge_capacity - num_edges
    spare = node_capacity - num_nodes
    if k < 0:
        raise ValueError(f"edge_capacity {edge_capacity} < num_edges {num_edges}")
    if k and spare < 1:
        raise ValueError(f"{k} padding edges need a padding node: node_capacity {node_capacity} must exceed "
                         f"num_nodes {num_nodes}")
    step = torch.arange(k, device=like.device, dtype=torch.int64)
    ids = num_nodes + torch.div(step * spare, max(k, 1), rounding_mode="floor")
    return ids.to(like.dtype).expand(2, k)


def _pad_rows(value: Tensor, dim: int, rows: int) -> Tensor:
    """``value`` with zero (False) entries appended along ``dim`` up to ``rows``."""
    extra = rows - value.size(dim)
    if extra == 0:
        return value
    shape = list(value.shape)
    shape[dim] = extra
    return torch.cat([value, value.new_zeros(shape)], dim=dim)


class PadToCapacity(BaseTransform):
    r"""Pads a sampled :class:`~torch_geometric.data.Data` batch to fixed node and edge counts,
    for training steps recorded once as CUDA graphs (``torch.compile(model,
    mode="reduce-overhead")``).

    For a batch of :math:`N` nodes and :math:`M` edges and capacities :math:`N_c > N`,
    :math:`M_c \geq M`, every node-level tensor gets :math:`N_c - N` zero rows (``False`` for
    masks), every edge-level tensor :math:`M_c - M` zero rows, and ``edge_index`` [2, M]
    becomes [2, M_c] with the padding edges :math:`(N + \lfloor iP/K \rfloor,\ N + \lfloor
    iP/K \rfloor)`, :math:`i < K = M_c - M`, :math:`P = N_c - N`: self loops among the padding
    nodes, so that for every real node :math:`v < N`

    .. math::
        \mathcal{N}_{\text{padded}}(v) = \mathcal{N}(v), \qquad
        h_v^{\text{padded}} = h_v

    in every message-passing layer, and a loss over the real nodes (``out[:batch.batch_size]``)
    has the gradients of the unpadded batch. Graph-level entries (``batch_size``,
    ``input_id``, ``num_sampled_nodes``, ...) are left as they are.

    Use it as the loader's transform (it then pads on the CPU, in the main process) or on the
    batch once it is on the GPU (cheaper: the padding is a few small device copies)::

        pad = PadToCapacity()
        model = torch.compile(model, mode="reduce-overhead")
        for batch in loader:
            batch = pad(batch.to(device, non_blocking=True))
            out = model(batch.x, batch.edge_index)[:batch.batch_size]

    Args:
        num_nodes (int, optional): the node capacity :math:`N_c`. ``None`` (default): grown
            from the batches, the largest :math:`N` seen times ``1 + slack`` rounded up to
            ``multiple`` (and always above :math:`N`, for the padding nodes).
        num_edges (int, optional): the edge capacity :math:`M_c`; ``None``: grown as the
            nodes'.
        slack (float): headroom of a grown capacity over the largest batch (default 0.1): a
            capacity that grows changes the shapes, so the compiled step compiles and records
            once more; with headroom that happens in the first few batches only.
        multiple (int): grown capacities are multiples of it (default 1024).
        add_pad_mask (bool): also attach ``pad_node_mask`` [N_c] and ``pad_edge_mask``
            [M_c], ``True`` for the real nodes and edges, as PyG's
            :class:`~torch_geometric.transforms.Pad` does.

    Raises:
        TypeError: for a :class:`~torch_geometric.data.HeteroData` or anything but
            :class:`~torch_geometric.data.Data`.
        ValueError: a batch without ``edge_index``, a bipartite ``EdgeIndex``, or a batch that
            does not fit a given capacity (naming ``num_nodes`` / ``num_edges``).

    :attr:`node_capacity` and :attr:`edge_capacity` are the current capacities (``None``
    before the first batch when grown), :attr:`growths` how many times a grown one changed.
    """

    def __init__(self, num_nodes: Optional[int] = None, num_edges: Optional[int] = None, *, slack: float = SLACK,
                 multiple: int = MULTIPLE, add_pad_mask: bool = False):
        for name, value in (("num_nodes", num_nodes), ("num_edges", num_edges)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive int or None, got {value!r}")
        if not (isinstance(slack, (int, float)) and math.isfinite(slack) and slack >= 0):
            raise ValueError(f"slack must be a finite number >= 0, got {slack!r}")
        if isinstance(multiple, bool) or not isinstance(multiple, int) or multiple < 1:
            raise ValueError(f"multiple must be a positive int, got {multiple!r}")
        self.fixed_nodes, self.fixed_edges = num_nodes, num_edges
        self.slack, self.multiple, self.add_pad_mask = float(slack), multiple, bool(add_pad_mask)
        self.node_capacity: Optional[int] = num_nodes
        self.edge_capacity: Optional[int] = num_edges
        self.growths = 0

    def capacities(self, num_nodes: int, num_edges: int) -> Tuple[int, int]:
        """(node capacity, edge capacity) for a batch of ``num_nodes`` / ``num_edges``, growing
        the ones not given; ValueError naming ``num_nodes`` / ``num_edges`` when a given one is
        too small."""
        m_cap = self._edge_cap_for(num_edges)
        n_cap = self.node_capacity
        if self.fixed_nodes is not None:
            # Padding edges need a padding node; without padding edges a full batch fits.
            if num_nodes > n_cap or (num_nodes == n_cap and m_cap > num_edges):
                raise ValueError(f"a batch of {num_nodes} nodes does not fit num_nodes={n_cap} (padding edges need "
                                 "at least one padding node: num_nodes must exceed every batch's node count)")
        elif n_cap is None or num_nodes >= n_cap:
            n_cap = max(capacity(num_nodes, self.slack, self.multiple), num_nodes + 1)
        # the first batch sets a grown capacity; a growth is a change after it
        grew = any(old is not None and new != old
                   for old, new in ((self.node_capacity, n_cap), (self.edge_capacity, m_cap)))
        self.node_capacity, self.edge_capacity = n_cap, m_cap
        self.growths += int(grew)
        return n_cap, m_cap

    def _edge_cap_for(self, num_edges: int) -> int:
        if self.fixed_edges is not None:
            if num_edges > self.fixed_edges:
                raise ValueError(f"a batch of {num_edges} edges does not fit num_edges={self.fixed_edges}")
            return self.fixed_edges
        if self.edge_capacity is None or num_edges > self.edge_capacity:
            return capacity(num_edges, self.slack, self.multiple)
        return self.edge_capacity

    def forward(self, data: Data) -> Data:
        if isinstance(data, HeteroData) or not isinstance(data, Data):
            raise TypeError(f"PadToCapacity pads homogeneous torch_geometric.data.Data batches, got "
                            f"{type(data).__name__}")
        edge_index = data.get("edge_index")
        if not isinstance(edge_index, Tensor):
            raise ValueError("PadToCapacity needs the batch's edge_index (a [2, M] tensor); this batch has "
                             + ("none" if edge_index is None else type(edge_index).__name__))
        n, m = int(data.num_nodes), int(edge_index.size(1))
        n_cap, m_cap = self.capacities(n, m)
        # Classify every tensor before changing any: PyG tells node- from edge-level entries by size.
        node_keys = [k for k, v in data.items() if isinstance(v, Tensor) and k != "edge_index" and data.is_node_attr(k)]
        edge_keys = [k for k, v in data.items() if isinstance(v, Tensor) and k != "edge_index"
                     and k not in node_keys and data.is_edge_attr(k)]
        for key in node_keys:
            data[key] = _pad_rows(data[key], data.__cat_dim__(key, data[key]), n_cap)
        for key in edge_keys:
            data[key] = _pad_rows(data[key], data.__cat_dim__(key, data[key]), m_cap)
        data.edge_index = self._pad_edge_index(edge_index, n, m, n_cap, m_cap)
        if "num_nodes" in data or not node_keys:
            data.num_nodes = n_cap
        if self.add_pad_mask:
            device = edge_index.device
            data.pad_node_mask = torch.arange(n_cap, device=device) < n
            data.pad_edge_mask = torch.arange(m_cap, device=device) < m
        return data

    @staticmethod
    def _pad_edge_index(edge_index: Tensor, n: int, m: int, n_cap: int, m_cap: int) -> Tensor:
        from torch_geometric import EdgeIndex

        if not isinstance(edge_index, EdgeIndex):
            return torch.cat([edge_index, padding_edges(n, m, n_cap, m_cap, edge_index)], dim=1)
        rows, cols = edge_index.sparse_size()
        if rows is not None and cols is not None and rows != cols:
            raise ValueError(f"PadToCapacity pads homogeneous batches; this EdgeIndex is bipartite "
                             f"(sparse_size {(rows, cols)})")
        plain = edge_index.as_tensor()
        padded = torch.cat([plain, padding_edges(n, m, n_cap, m_cap, plain)], dim=1)
        # The padding ids exceed every real one and ascend: a sort by either row still holds.
        return EdgeIndex(padded, sparse_size=(n_cap, n_cap), sort_order=edge_index.sort_order)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(num_nodes={self.node_capacity}, num_edges={self.edge_capacity}, "
                f"slack={self.slack}, multiple={self.multiple})")
