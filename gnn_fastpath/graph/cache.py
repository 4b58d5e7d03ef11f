"""Graph.of: one Graph per framework graph object, never stale, bounded per device.

Each entry is keyed by the source object's identity and holds it only weakly, so a cached
Graph dies with its source. A *version* of the source is stored with the entry and checked
on every hit; any difference rebuilds:

- tensors (``edge_index``, ``EdgeIndex``, sparse adjacencies): the autograd version
  counter ``tensor._version`` (bumped by every in-place write), storage pointer, shape,
  dtype and device;
- DGL graphs: node and edge counts, id type, device, and the identity of the graph's
  structure object (DGL swaps it whenever edges or nodes are added or removed).

Mini-batch training builds a new graph every step, so each device keeps at most
:func:`cache_size` entries (least recently used first out).
"""
from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import Hashable, Tuple

import torch
from torch import Tensor

from .convert import is_dgl_graph
from .graph import Graph

_DEFAULT_SIZE = 32
_lock = threading.Lock()
_size = _DEFAULT_SIZE
# device -> OrderedDict[id(obj) -> (weakref, version, num_nodes key, Graph)]
_caches: "dict[str, OrderedDict]" = {}


def cache_size() -> int:
    """How many Graphs each device's cache keeps."""
    return _size


def set_cache_size(n: int) -> None:
    """Bound each device's cache to ``n`` Graphs (``n >= 1``); evicts the oldest."""
    global _size
    if int(n) < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    with _lock:
        _size = int(n)
        for cache in _caches.values():
            while len(cache) > _size:
                cache.popitem(last=False)


def clear_cache() -> None:
    """Drop every cached Graph."""
    with _lock:
        _caches.clear()


def cached_count(device=None) -> int:
    """Entries cached for ``device`` (all devices when None)."""
    if device is None:
        return sum(len(c) for c in _caches.values())
    return len(_caches.get(str(torch.device(device)), ()))


def _tensor_version(t: Tensor) -> Tuple:
    if t.layout == torch.sparse_csr:
        parts = (t.crow_indices(), t.col_indices())
    elif t.layout == torch.sparse_coo:
        parts = (t._indices(),)
    else:
        parts = (t,)
    # Inference tensors have no version counter; they cannot be written outside inference
    # mode, so their storage identity stands in (an in-place write inside inference mode is
    # not noticed: build the Graph with Graph.from_edge_index there).
    version = tuple((_version_of(p), p.data_ptr(), tuple(p.shape), p.dtype) for p in parts)
    sparse_size = getattr(t, "sparse_size", None)  # a PyG EdgeIndex can be resized in place
    return version + (_version_of(t), tuple(t.shape), sparse_size() if callable(sparse_size) else None)


def _version_of(t: Tensor) -> int:
    return -1 if t.is_inference() else t._version


def _dgl_version(g) -> Tuple:
    # DGL replaces its structure object on add_edges/remove_edges/add_nodes; counting
    # alone would miss a remove followed by an add of the same number of edges.
    structure = getattr(g, "_graph", None)
    return (g.num_src_nodes(), g.num_dst_nodes(), g.num_edges(), str(g.idtype), id(structure), structure)


def _describe(obj) -> Tuple[str, Hashable, callable]:
    """(device key, version, builder) for a supported framework graph object."""
    if is_dgl_graph(obj):
        return str(obj.device), _dgl_version(obj), lambda nn: Graph.from_dgl(obj)
    if isinstance(obj, Tensor):
        if obj.layout in (torch.sparse_csr, torch.sparse_coo):
            return str(obj.device), _tensor_version(obj), lambda nn: Graph.from_sparse(obj)
        return str(obj.device), _tensor_version(obj), lambda nn: Graph.from_edge_index(obj, nn)
    raise ValueError(f"obj must be an edge_index tensor, a PyG EdgeIndex, a torch.sparse adjacency "
                     f"or a DGL graph, got {type(obj).__name__}")


def _forget(device: str, key: int, ref) -> None:
    with _lock:
        cache = _caches.get(device)
        if cache is not None:
            entry = cache.get(key)
            if entry is not None and entry[0] is ref:
                del cache[key]


def graph_of(obj, num_nodes=None) -> Graph:
    """See :meth:`Graph.of`."""
    if isinstance(obj, Graph):
        return obj
    if isinstance(num_nodes, Tensor):
        num_nodes = int(num_nodes)
    device, version, build = _describe(obj)
    nn_key = tuple(num_nodes) if isinstance(num_nodes, (tuple, list)) else num_nodes
    key = id(obj)
    with _lock:
        cache = _caches.setdefault(device, OrderedDict())
        entry = cache.get(key)
        if entry is not None:
            ref, old_version, old_nn, graph = entry
            if ref() is obj and old_version == version and old_nn == nn_key:
                cache.move_to_end(key)
                return graph
            del cache[key]
    graph = build(num_nodes)  # outside the lock: building may take a while
    ref = weakref.ref(obj, lambda r, d=device, k=key: _forget(d, k, r))
    with _lock:
        cache = _caches.setdefault(device, OrderedDict())
        cache[key] = (ref, version, nn_key, graph)
        cache.move_to_end(key)
        while len(cache) > _size:
            cache.popitem(last=False)
    return graph
