"""Randomized differential testing of every patched layer against stock.

A *case* is one integer seed. :func:`make_case` draws from it, deterministically:

- a graph: directed or symmetric, homogeneous or bipartite, with duplicate edges, self loops,
  destinations without in-edges, isolated nodes and, sometimes, a super node (one destination
  with many in-edges); occasionally no edges at all;
- a framework (PyG or DGL) and one of its patched layers, with a random *valid* configuration
  of the arguments the fused path covers (heads, concat, edge features, bias, root weight,
  normalisation, aggregators, residuals, attention weights returned; dropout 0 so both runs
  compute the same function);
- a precision: float32 mostly, else bfloat16 or float16, as a half module or (PyG) a float32
  module under autocast, and, for PyG, sometimes a ``torch.compile``d module.

:func:`check_case` runs the stock module and a deep copy under ``gnn_fastpath.enabled()`` on
the same inputs and compares every output (attention weights included) and every gradient
(parameters, features, edge features, edge weights). float32: within ``rtol`` of the largest
entry of stock's tensor (gradients: of the run's largest gradient times ``GRAD_FLOOR``, since
some are mathematically 0 and come out as rounding noise). 16-bit: both runs against a
float64 evaluation of the same module, the fused error at most ``FACTOR`` x stock's plus
``SLACK`` units of roundoff, tensor by tensor. Every case must run fused (counted in
``stats()``) with no fallback: the generator draws only configurations the fused path claims.

Every failure message starts with the case's description and the command that replays it.
"""
from __future__ import annotations

import contextlib
import copy
import math
import os
import random
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch import Tensor, nn

import gnn_fastpath
from gnn_fastpath import FastpathFallbackWarning
from zoo import random_edges

RTOL = {"cpu": 2e-5, "cuda": 1e-4}
GRAD_FLOOR = 1e-2
FACTOR, SLACK = 2.0, 2.0
#: float32 tensors outside ``RTOL`` of stock's are held to float64 with this factor: the fused
#: ops compute some gradients in another formulation than stock (the softmax backward through
#: ``delta = <O, dO>``), which on a gradient that cancels almost to 0 (a softmax's
#: shift-invariant direction over a super node) can be a few times noisier than stock's,
#: where a wrong result is orders of magnitude off.
FACTOR_FP32 = 4.0
#: ... plus this much of the tensor's scale (or of ``GRAD_FLOOR`` x the largest gradient): float32
#: tolerance for sums over thousands of edges, and for the gradients in a softmax's
#: shift-invariant direction (GAT's ``att_dst``, GATv2's destination projection, AGNN's ``beta``),
#: whose true value is a cancelling sum: the fused ops take FlashAttention's ``delta = <O, dO>``
#: and leave rounding noise of about 1e-5 of the largest gradient there, where stock, summing the
#: cancelling terms directly, leaves about 1e-6.
SLACK_FP32 = 2.0 ** -13
UNIT = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}
#: DGL on the GPU: stock DGL cannot run there (CPU-only build), and its CPU bf16 kernels are not
#: what a DGL CUDA user runs; a tensor outside the FACTOR rule against them is held to the
#: suite's DGL GPU bounds against float64 instead (tests/integrations/test_autocast.py): outputs
#: 16u, gradients 128u (gradients through a softmax are ill-conditioned in 16 bits).
DGL_GPU_BOUND, DGL_GPU_GRAD_BOUND = 16.0, 128.0
#: Perturbed float64 runs that estimate a tensor's conditioning noise (:func:`_compare_half`).
NOISE_DRAWS = 3
#: 16-bit gradients that are 0 in float64 (a softmax's shift-invariant direction: TransformerConv's
#: ``lin_key.bias``, GAT's ``att_dst``) are rounding noise on both paths, and their size follows
#: the cancelling terms, not the (zero) result: the fused ops take FlashAttention's
#: ``delta = <O, dO>`` from the 16-bit output, stock sums the terms directly, and the two noises
#: differ by a few times. Such a tensor passes when its noise is at most this many units of
#: roundoff of the run's largest gradient (the float32 analogue is ``SLACK_FP32``).
ZERO_SLACK = 0.5
#: a float64 gradient at most this fraction of the largest gradient is a structural zero
ZERO_TOL = 1e-9
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


# =========================================================================== graphs
@dataclass
class GraphSpec:
    n_src: int
    n_dst: int
    bipartite: bool
    symmetric: bool
    edge_index: Tensor  # [2, M] (row 0 sources, row 1 destinations), caller order

    @property
    def m(self) -> int:
        return int(self.edge_index.size(1))

    def has_empty_rows(self) -> bool:
        return bool(torch.bincount(self.edge_index[1], minlength=self.n_dst).eq(0).any())

    def describe(self) -> str:
        kind = "bipartite" if self.bipartite else ("symmetric" if self.symmetric else "directed")
        deg = torch.bincount(self.edge_index[1], minlength=self.n_dst)
        return (f"{kind} graph n_src={self.n_src} n_dst={self.n_dst} m={self.m} "
                f"max_in_degree={int(deg.max()) if self.n_dst else 0} empty_rows={int(deg.eq(0).sum())}")


def random_graph(rng: random.Random, *, bipartite: bool, big: bool) -> GraphSpec:
    """A graph with the awkward cases: duplicates, self loops, empty rows, isolated nodes and,
    where ``big``, sometimes a super node with thousands of in-edges."""
    seed = rng.randrange(2 ** 31)
    n_src = rng.randint(1, 60)
    n_dst = rng.randint(1, 40) if bipartite else n_src
    if rng.random() < 0.04:
        m = 0
    else:
        m = rng.randint(1, 6 * max(n_src, n_dst))
    empty = rng.randint(0, max(n_dst // 4, 0)) if rng.random() < 0.5 else 0
    super_degree = 0
    if rng.random() < 0.08 and m:
        super_degree = rng.choice([300, 2000] + ([20000] if big else []))
    edge_index, _ = random_edges(n_src, n_dst, m, seed, self_loops=rng.random() < 0.7,
                                 duplicates=rng.random() < 0.7, empty_rows=empty,
                                 super_node_degree=super_degree)
    symmetric = not bipartite and rng.random() < 0.35 and edge_index.size(1) > 0
    if symmetric:
        edge_index = torch.cat([edge_index, edge_index.flip(0)], 1)
        edge_index = edge_index[:, torch.randperm(edge_index.size(1), generator=torch.Generator().manual_seed(seed))]
    if not bipartite and rng.random() < 0.3:  # isolated nodes: no in- and no out-edges
        extra = rng.randint(1, 5)
        n_src = n_dst = n_src + extra
    return GraphSpec(n_src, n_dst, bipartite, symmetric, edge_index)


# =========================================================================== cases
@dataclass
class Case:
    seed: int
    framework: str
    layer: str
    config: Dict[str, Any]  # constructor arguments (printable)
    call: Dict[str, Any]  # call options (printable)
    graph: GraphSpec
    dtype: str = "float32"
    precision: str = "module"  # 16-bit: "module" (a half module) or "autocast" (PyG: float32 module under autocast)
    compiled: bool = False
    build: Callable = field(default=None, repr=False)  # (case) -> (module, inputs, forward)

    @property
    def key(self) -> str:
        return f"{self.framework}.{self.layer}"

    def describe(self) -> str:
        precision = f" {self.precision}" if self.dtype != "float32" else ""
        return (f"case {self.seed}: {self.framework} {self.layer}({self.config}) call {self.call}; "
                f"{self.graph.describe()}; {self.dtype}{precision}{', compiled' if self.compiled else ''}")


def _width(rng):
    return rng.choice([1, 3, 4, 8, 16, 33])


def _features(n: int, f, seed: int, dtype=torch.float32) -> Tensor:
    shape = (n,) + (tuple(f) if isinstance(f, tuple) else (f,))
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


# --------------------------------------------------------------------------- PyG layers
# Each drawer returns (config, call, build) where build(case, seed) -> (module, inputs, forward):
# ``inputs`` a dict of tensors (float ones get gradients), ``forward(module, inputs)`` the call.

def _pyg_edge_attr(rng, case_call, g, seed, inputs, edge_dim):
    if edge_dim:
        inputs["edge_attr"] = _features(g.m, edge_dim, seed + 3)


def _pyg_x(g: GraphSpec, f_src, f_dst, seed, inputs, pair: bool):
    inputs["x"] = _features(g.n_src, f_src, seed)
    if pair:
        inputs["x_dst"] = _features(g.n_dst, f_dst, seed + 1)


def _pyg_x_arg(inputs, x_dst_none=False):
    if "x_dst" in inputs:
        return (inputs["x"], inputs["x_dst"])
    if x_dst_none:
        return (inputs["x"], None)
    return inputs["x"]


def _pyg_size(g: GraphSpec, call):
    return (g.n_src, g.n_dst) if g.bipartite else None


def _pyg_attention(name):
    def draw(rng, g: GraphSpec):
        f_src, f_dst = _width(rng), _width(rng)
        heads, out = rng.choice([1, 2, 4]), rng.choice([1, 4, 8, 16])
        config = dict(out_channels=out, heads=heads, concat=rng.random() < 0.7, bias=rng.random() < 0.8)
        edge_dim = rng.choice([None, None, 2, 5])
        config["edge_dim"] = edge_dim
        if name in ("GATv2Conv", "GATConv"):
            config["negative_slope"] = rng.choice([0.2, 0.01, 0.5])
            config["add_self_loops"] = rng.random() < 0.6
            if config["add_self_loops"] and rng.random() < 0.5:
                config["fill_value"] = rng.choice(["mean", "add", "max", "min", 0.5])
            config["residual"] = rng.random() < 0.3
            if name == "GATv2Conv":
                config["share_weights"] = (not g.bipartite or f_src == f_dst) and rng.random() < 0.3
        else:
            config["beta"] = rng.random() < 0.4
            config["root_weight"] = rng.random() < 0.7
        if config.get("add_self_loops") and g.bipartite and edge_dim and g.n_dst > g.n_src:
            # stock fills the self loops' edge features by a scatter over the destinations into
            # min(n_src, n_dst) rows: out of range here (a device-side assert on the GPU)
            config["add_self_loops"] = False
            config.pop("fill_value", None)
        pair = g.bipartite or rng.random() < 0.15
        if config.get("share_weights"):
            f_dst = f_src
        in_channels = (f_src, f_dst) if pair else f_src
        x_dst_none = name == "GATConv" and g.bipartite and not config.get("add_self_loops") and rng.random() < 0.3
        call = dict(return_attention_weights=rng.random() < 0.4, pair=pair, x_dst_none=x_dst_none,
                    edge_index=_pyg_edge_format(rng, config.get("add_self_loops", False)))

        def build(case, seed):
            import torch_geometric.nn as gnn

            torch.manual_seed(seed)
            module = getattr(gnn, name)(in_channels, dropout=0.0, **config)
            inputs = {}
            _pyg_x(g, f_src, f_dst, seed, inputs, pair and not x_dst_none)
            _pyg_edge_attr(rng, call, g, seed, inputs, edge_dim)

            def forward(module, t):
                kwargs = {}
                if "edge_attr" in t:
                    kwargs["edge_attr"] = t["edge_attr"]
                if call["return_attention_weights"]:
                    kwargs["return_attention_weights"] = True
                adj = _pyg_adjacency(call["edge_index"], g, t)
                if name == "GATConv" and g.bipartite:
                    kwargs["size"] = _pyg_size(g, call)
                return module(_pyg_x_arg(t, x_dst_none), adj, **kwargs)

            return module, inputs, forward

        return config, call, build
    return draw


def _pyg_edge_format(rng, self_loops: bool) -> str:
    """How the graph is passed: a plain edge_index Tensor or an EdgeIndex (torch.sparse adjacencies
    fall back for layers adding self loops, and have their own tests)."""
    return rng.choice(["tensor", "tensor", "edge_index"])


def _pyg_adjacency(fmt: str, g: GraphSpec, t: Dict[str, Tensor]):
    """The graph as the layer gets it, on the features' device."""
    edge_index = g.edge_index.to(t["x"].device)
    if fmt == "edge_index":
        from torch_geometric import EdgeIndex

        return EdgeIndex(edge_index, sparse_size=(g.n_src, g.n_dst))
    return edge_index


def _pyg_gcn(rng, g):
    f, out = _width(rng), rng.choice([1, 4, 16])
    normalize = rng.random() < 0.8
    config = dict(out_channels=out, improved=rng.random() < 0.3, add_self_loops=normalize and rng.random() < 0.8,
                  normalize=normalize, bias=rng.random() < 0.8)  # self loops come with normalisation
    call = dict(edge_weight=rng.random() < 0.5, edge_index=_pyg_edge_format(rng, config["add_self_loops"]))

    def build(case, seed):
        from torch_geometric.nn import GCNConv

        torch.manual_seed(seed)
        module = GCNConv(f, **config)
        inputs = {"x": _features(g.n_src, f, seed)}
        if call["edge_weight"]:
            inputs["edge_weight"] = torch.rand(g.m, generator=torch.Generator().manual_seed(seed + 5)) + 0.5

        def forward(module, t):
            return module(t["x"], _pyg_adjacency(call["edge_index"], g, t), t.get("edge_weight"))

        return module, inputs, forward

    return config, call, build


def _pyg_sage(rng, g):
    f_src, f_dst, out = _width(rng), _width(rng), rng.choice([1, 4, 16])
    pair = g.bipartite or rng.random() < 0.15
    aggr = rng.choice(["mean", "sum", "max", "min"])
    config = dict(out_channels=out, aggr=aggr, normalize=rng.random() < 0.3, root_weight=rng.random() < 0.8,
                  project=rng.random() < 0.2, bias=rng.random() < 0.8)
    if config["project"]:
        f_dst = f_src  # project maps the source width onto itself; PyG requires equal widths then
    call = dict(pair=pair, edge_index=_pyg_edge_format(rng, False))

    def build(case, seed):
        from torch_geometric.nn import SAGEConv

        torch.manual_seed(seed)
        module = SAGEConv((f_src, f_dst) if pair else f_src, **config)
        inputs = {}
        _pyg_x(g, f_src, f_dst, seed, inputs, pair)

        def forward(module, t):
            return module(_pyg_x_arg(t), _pyg_adjacency(call["edge_index"], g, t),
                          size=_pyg_size(g, call))

        return module, inputs, forward

    return config, call, build


def _pyg_agnn(rng, g):
    f = _width(rng)
    config = dict(requires_grad=rng.random() < 0.7, add_self_loops=rng.random() < 0.7)
    call = dict(edge_index=_pyg_edge_format(rng, config["add_self_loops"]))

    def build(case, seed):
        from torch_geometric.nn import AGNNConv

        torch.manual_seed(seed)
        module = AGNNConv(**config)
        if config["requires_grad"]:
            with torch.no_grad():
                module.beta.fill_(rng.uniform(0.3, 2.0))
        inputs = {"x": _features(g.n_src, f, seed)}
        return module, inputs, lambda module, t: module(t["x"], _pyg_adjacency(call["edge_index"], g, t))

    return config, call, build


def _pyg_gin(rng, g):
    f, hidden, out = _width(rng), rng.choice([4, 8]), rng.choice([1, 4, 16])
    pair = g.bipartite or rng.random() < 0.15
    config = dict(eps=rng.choice([0.0, 0.1, -0.3]), train_eps=rng.random() < 0.5,
                  aggr=rng.choice(["add", "sum", "mean", "max", "min"]))
    call = dict(pair=pair, edge_index=_pyg_edge_format(rng, False))

    def build(case, seed):
        from torch_geometric.nn import GINConv

        torch.manual_seed(seed)
        net = nn.Sequential(nn.Linear(f, hidden), nn.ReLU(), nn.Linear(hidden, out))
        module = GINConv(net, **config)
        inputs = {}
        _pyg_x(g, f, f, seed, inputs, pair)

        def forward(module, t):
            return module(_pyg_x_arg(t), _pyg_adjacency(call["edge_index"], g, t), size=_pyg_size(g, call))

        return module, inputs, forward

    return config, call, build


def _pyg_graph_conv(rng, g):
    f_src, f_dst, out = _width(rng), _width(rng), rng.choice([1, 4, 16])
    pair = g.bipartite or rng.random() < 0.15
    config = dict(out_channels=out, aggr=rng.choice(["add", "mean", "max", "min"]), bias=rng.random() < 0.8)
    call = dict(pair=pair, edge_weight=rng.random() < 0.5, edge_index="tensor")

    def build(case, seed):
        from torch_geometric.nn import GraphConv

        torch.manual_seed(seed)
        module = GraphConv((f_src, f_dst) if pair else f_src, **config)
        inputs = {}
        _pyg_x(g, f_src, f_dst, seed, inputs, pair)
        if call["edge_weight"]:
            inputs["edge_weight"] = torch.rand(g.m, generator=torch.Generator().manual_seed(seed + 5)) + 0.5

        def forward(module, t):
            return module(_pyg_x_arg(t), _pyg_adjacency("tensor", g, t), t.get("edge_weight"), size=_pyg_size(g, call))

        return module, inputs, forward

    return config, call, build


def _pyg_edge_conv(rng, g):
    f, out = _width(rng), rng.choice([1, 4, 16])
    kind = rng.choice(["linear", "sequential"])
    hidden = rng.randint(1, 2 * f)  # a first Linear that does not widen runs fused under "auto"
    config = dict(nn=kind, hidden=hidden if kind == "sequential" else None,
                  aggr=rng.choice(["max", "min", "add", "mean"]))
    pair = g.bipartite or rng.random() < 0.15
    call = dict(pair=pair, edge_index=_pyg_edge_format(rng, False))

    def build(case, seed):
        from torch_geometric.nn import EdgeConv

        torch.manual_seed(seed)
        if kind == "linear":
            net = nn.Linear(2 * f, out)
        else:
            net = nn.Sequential(nn.Linear(2 * f, hidden), nn.ReLU(), nn.Linear(hidden, out))
        module = EdgeConv(net, aggr=config["aggr"])
        inputs = {}
        _pyg_x(g, f, f, seed, inputs, pair)
        return module, inputs, lambda module, t: module(_pyg_x_arg(t), _pyg_adjacency(call["edge_index"], g, t))

    return config, call, build


PYG_LAYERS = {
    "GATv2Conv": (_pyg_attention("GATv2Conv"), True),
    "GATConv": (_pyg_attention("GATConv"), True),
    "TransformerConv": (_pyg_attention("TransformerConv"), True),
    "GCNConv": (_pyg_gcn, False),
    "SAGEConv": (_pyg_sage, True),
    "AGNNConv": (_pyg_agnn, False),
    "GINConv": (_pyg_gin, True),
    "GraphConv": (_pyg_graph_conv, True),
    "EdgeConv": (_pyg_edge_conv, True),
}  # name -> (drawer, takes bipartite graphs)


# --------------------------------------------------------------------------- DGL layers
def _dgl_graph(dgl, g: GraphSpec, block: bool):
    """A homogeneous graph, a block (bipartite, destinations the first sources: n_dst <= n_src)
    or a one-relation bipartite graph (then the layer takes a feature pair)."""
    src, dst = g.edge_index
    if block:
        return dgl.create_block((src, dst), num_src_nodes=g.n_src, num_dst_nodes=g.n_dst)
    if g.bipartite:
        return dgl.heterograph({("_U", "_E", "_V"): (src, dst)}, {"_U": g.n_src, "_V": g.n_dst})
    return dgl.graph((src, dst), num_nodes=g.n_src)


def _dgl_block(g: GraphSpec) -> bool:
    """Bipartite graphs go as blocks where a block can hold them (n_dst <= n_src), else as a
    bipartite graph with a feature pair."""
    return g.bipartite and g.n_dst <= g.n_src


def _dgl_common(rng, g: GraphSpec):
    """(block, allow_zero_in_degree): destinations without in-edges need
    ``allow_zero_in_degree`` (stock raises otherwise)."""
    return _dgl_block(g), g.has_empty_rows() or rng.random() < 0.3


def _dgl_feat(g: GraphSpec, f_src, f_dst, seed, inputs, pair: bool):
    inputs["x"] = _features(g.n_src, f_src, seed)
    if pair:
        inputs["x_dst"] = _features(g.n_dst, f_dst, seed + 1)


def _dgl_feat_arg(t):
    return (t["x"], t["x_dst"]) if "x_dst" in t else t["x"]


def _dgl_attention(name):
    def draw(rng, g):
        block, allow_zero = _dgl_common(rng, g)
        f_src, f_dst = _width(rng), _width(rng)
        heads, out = rng.choice([1, 2, 4]), rng.choice([1, 4, 8])
        pair = (g.bipartite and not block) or (not g.bipartite and rng.random() < 0.2)
        config = dict(out_feats=out, num_heads=heads, negative_slope=rng.choice([0.2, 0.05]),
                      residual=rng.random() < 0.4, allow_zero_in_degree=allow_zero, bias=rng.random() < 0.8,
                      activation=rng.choice([None, "elu"]))
        if name == "GATv2Conv":
            config["share_weights"] = rng.random() < 0.3
        if config.get("share_weights") or not pair:
            f_dst = f_src
        call = dict(get_attention=rng.random() < 0.4, pair=pair, block=block,
                    edge_weight=name == "GATConv" and rng.random() < 0.3)

        def build(case, seed):
            import dgl
            import dgl.nn as dglnn
            import torch.nn.functional as F

            torch.manual_seed(seed)
            kw = dict(config, activation=F.elu if config["activation"] == "elu" else None)
            module = getattr(dglnn, name)((f_src, f_dst) if pair else f_src, **kw)
            graph = _dgl_graph(dgl, g, block)
            inputs = {}
            _dgl_feat(g, f_src, f_dst, seed, inputs, pair)
            if call["edge_weight"]:
                inputs["edge_weight"] = torch.rand(g.m, generator=torch.Generator().manual_seed(seed + 5)) + 0.5

            def forward(module, t):
                kwargs = {"get_attention": True} if call["get_attention"] else {}
                if "edge_weight" in t:
                    kwargs["edge_weight"] = t["edge_weight"]
                return module(graph, _dgl_feat_arg(t), **kwargs)

            return module, inputs, forward

        return config, call, build
    return draw


def _dgl_graph_conv(rng, g):
    block, allow_zero = _dgl_common(rng, g)
    pair = g.bipartite and not block
    f, out = _width(rng), rng.choice([1, 4, 16])
    config = dict(out_feats=out, norm=rng.choice(["none", "both", "right", "left"]), bias=rng.random() < 0.8,
                  allow_zero_in_degree=allow_zero, activation=rng.choice([None, "relu"]))
    call = dict(block=block, pair=pair, edge_weight=rng.random() < 0.5)

    def build(case, seed):
        import dgl
        from dgl.nn import GraphConv

        torch.manual_seed(seed)
        module = GraphConv(f, **dict(config, activation=torch.relu if config["activation"] else None))
        graph = _dgl_graph(dgl, g, block)
        inputs = {}
        _dgl_feat(g, f, f, seed, inputs, pair)
        if call["edge_weight"]:
            inputs["edge_weight"] = torch.rand(g.m, generator=torch.Generator().manual_seed(seed + 5)) + 0.5
        return module, inputs, lambda module, t: module(graph, _dgl_feat_arg(t), edge_weight=t.get("edge_weight"))

    return config, call, build


def _dgl_sage(rng, g):
    block = _dgl_block(g)
    aggr = rng.choice(["mean", "gcn", "pool"])
    f_src, f_dst, out = _width(rng), _width(rng), rng.choice([1, 4, 16])
    # a gcn pair on a graph with one node type runs stock (its own test): not drawn
    pair = (g.bipartite and not block) or (not g.bipartite and aggr != "gcn" and rng.random() < 0.2)
    if not pair or aggr == "gcn":  # gcn adds the destination's own features: equal widths
        f_dst = f_src
    config = dict(out_feats=out, aggregator_type=aggr, bias=rng.random() < 0.8,
                  activation=rng.choice([None, "relu"]))
    call = dict(block=block, pair=pair, edge_weight=rng.random() < 0.4 and g.m > 0)

    def build(case, seed):
        import dgl
        from dgl.nn import SAGEConv

        torch.manual_seed(seed)
        module = SAGEConv((f_src, f_dst) if pair else f_src,
                          **dict(config, activation=torch.relu if config["activation"] else None))
        graph = _dgl_graph(dgl, g, block)
        inputs = {}
        _dgl_feat(g, f_src, f_dst, seed, inputs, pair)
        if call["edge_weight"]:
            inputs["edge_weight"] = torch.rand(g.m, generator=torch.Generator().manual_seed(seed + 5)) + 0.5
        return module, inputs, lambda module, t: module(graph, _dgl_feat_arg(t), edge_weight=t.get("edge_weight"))

    return config, call, build


def _dgl_agnn(rng, g):
    block, allow_zero = _dgl_common(rng, g)
    pair = g.bipartite and not block
    f = _width(rng)
    shape = rng.choice([(f,), (2, f)])
    config = dict(init_beta=rng.uniform(0.3, 2.0), learn_beta=rng.random() < 0.7, allow_zero_in_degree=allow_zero)
    call = dict(block=block, pair=pair, feature_shape=shape)

    def build(case, seed):
        import dgl
        from dgl.nn import AGNNConv

        torch.manual_seed(seed)
        module = AGNNConv(**config)
        graph = _dgl_graph(dgl, g, block)
        inputs = {}
        _dgl_feat(g, shape, shape, seed, inputs, pair)
        return module, inputs, lambda module, t: module(graph, _dgl_feat_arg(t))

    return config, call, build


def _dgl_gin(rng, g):
    block = _dgl_block(g)
    pair = g.bipartite and not block
    f, out = _width(rng), rng.choice([1, 4, 16])
    aggr = rng.choice(["sum", "mean", "max"])
    config = dict(apply_func=rng.choice(["linear", None]), aggregator_type=aggr, init_eps=rng.choice([0.0, 0.2]),
                  learn_eps=rng.random() < 0.5, activation=rng.choice([None, "relu"]))
    call = dict(block=block, pair=pair, edge_weight=rng.random() < 0.4)

    def build(case, seed):
        import dgl
        from dgl.nn import GINConv

        torch.manual_seed(seed)
        apply = nn.Linear(f, out) if config["apply_func"] else None
        module = GINConv(apply, aggr, init_eps=config["init_eps"], learn_eps=config["learn_eps"],
                         activation=torch.relu if config["activation"] else None)
        graph = _dgl_graph(dgl, g, block)
        inputs = {}
        _dgl_feat(g, f, f, seed, inputs, pair)
        if call["edge_weight"]:
            inputs["edge_weight"] = torch.rand(g.m, generator=torch.Generator().manual_seed(seed + 5)) + 0.5
        return module, inputs, lambda module, t: module(graph, _dgl_feat_arg(t), edge_weight=t.get("edge_weight"))

    return config, call, build


def _dgl_edge_conv(rng, g):
    block, allow_zero = _dgl_common(rng, g)
    pair = g.bipartite and not block
    f, out = _width(rng), rng.choice([1, 4, 16])
    config = dict(out_feat=out, batch_norm=False, allow_zero_in_degree=allow_zero)
    call = dict(block=block, pair=pair)

    def build(case, seed):
        import dgl
        from dgl.nn import EdgeConv

        torch.manual_seed(seed)
        module = EdgeConv(f, **config)
        graph = _dgl_graph(dgl, g, block)
        inputs = {}
        _dgl_feat(g, f, f, seed, inputs, pair)
        return module, inputs, lambda module, t: module(graph, _dgl_feat_arg(t))

    return config, call, build


DGL_LAYERS = {
    "GATv2Conv": (_dgl_attention("GATv2Conv"), True),
    "GATConv": (_dgl_attention("GATConv"), True),
    "GraphConv": (_dgl_graph_conv, True),
    "SAGEConv": (_dgl_sage, True),
    "AGNNConv": (_dgl_agnn, True),
    "GINConv": (_dgl_gin, True),
    "EdgeConv": (_dgl_edge_conv, True),
}

#: Layers whose max/min aggregation or empty graph has no fused rule: redraw the graph.
_NEEDS_EDGES = {("dgl", "SAGEConv"), ("dgl", "GINConv"), ("dgl", "EdgeConv")}


def make_case(seed: int, *, frameworks=("pyg", "dgl"), device: str = "cpu", compile_rate: float = 0.08) -> Case:
    """The case of ``seed`` (see the module docstring); ``compile_rate``: the share of PyG cases
    run as ``torch.compile``d modules (compiling costs seconds a case on the CPU)."""
    rng = random.Random(seed)
    framework = frameworks[0] if len(frameworks) == 1 else ("pyg" if rng.random() < 0.6 else "dgl")
    layers = PYG_LAYERS if framework == "pyg" else DGL_LAYERS
    layer = rng.choice(sorted(layers))
    draw, bipartite_ok = layers[layer]
    bipartite = bipartite_ok and rng.random() < 0.3
    while True:
        graph = random_graph(rng, bipartite=bipartite, big=device == "cuda")
        if graph.m or (framework, layer) not in _NEEDS_EDGES:
            break
    config, call, build = draw(rng, graph)
    r = rng.random()
    half = ["bfloat16"] if framework == "dgl" else ["bfloat16", "float16"]  # DGL 2.1: no float16 CPU kernels
    dtype = "float32" if r < 0.75 else rng.choice(half)
    # DGL's sparse ops cast only under CUDA autocast: its 16-bit cases are half modules
    precision = "autocast" if framework == "pyg" and rng.random() < 0.5 else "module"
    compiled = framework == "pyg" and rng.random() < compile_rate
    if call.get("return_attention_weights") and config.get("add_self_loops"):
        compiled = False  # compacted attention weights have a data-dependent shape: stock under compile
    if compiled:
        call["edge_index"] = "tensor"  # PyG's EdgeIndex does not trace in stock under this torch
    return Case(seed, framework, layer, config, call, graph, dtype, precision, compiled, build)


# =========================================================================== running
@dataclass
class Result:
    outs: List[Tensor]
    grads: Dict[str, Optional[Tensor]]


def _float_leaves(obj) -> List[Tensor]:
    if isinstance(obj, (tuple, list)):
        return [t for item in obj for t in _float_leaves(item)]
    if isinstance(obj, Tensor) and obj.is_floating_point():
        return [obj]
    return []


def _index_leaves(obj) -> List[Tensor]:
    if isinstance(obj, (tuple, list)):
        return [t for item in obj for t in _index_leaves(item)]
    if isinstance(obj, Tensor) and not obj.is_floating_point():
        return [obj.as_subclass(Tensor) if type(obj) is not Tensor else obj]
    return []


def _to(inputs: Dict[str, Tensor], device, dtype) -> Dict[str, Tensor]:
    """Fresh leaves on ``device``; float tensors cast to ``dtype`` (None: kept)."""
    out = {}
    for k, v in inputs.items():
        v = v.to(device)
        if dtype is not None and v.is_floating_point():
            v = v.to(dtype)
        out[k] = v.detach().clone().requires_grad_(v.is_floating_point())
    return out


def run_once(case: Case, module: nn.Module, inputs: Dict[str, Tensor], forward, *, device: str,
             mode: str, enabled: bool, perturb: float = 0.0, draw: int = 0) -> Tuple[Result, List[Tensor]]:
    """One forward and backward. ``mode``: "float32", "half" (module and float inputs in the
    case's 16-bit dtype), "autocast" (float32 module and inputs under autocast) or "float64".
    ``perturb``: every parameter and float input multiplied by 1 + ``perturb`` x U(-1, 1) first
    (draw number ``draw`` of the case). Returns the result and the output's index tensors (e.g. attention edge_index)."""
    dtype = DTYPES[case.dtype]
    cast = {"float32": None, "half": dtype, "autocast": None, "float64": torch.float64}[mode]
    m = copy.deepcopy(module).to(device)
    if cast is not None:
        m = m.to(cast)
    t = _to(inputs, device, cast)
    if perturb:
        gen = torch.Generator().manual_seed(case.seed * 8 + draw + 29)
        with torch.no_grad():
            for v in list(m.parameters()) + list(t.values()):
                if v.is_floating_point():
                    v.mul_(1 + perturb * (2 * torch.rand(v.shape, generator=gen, dtype=v.dtype).to(v.device) - 1))
    autocast = torch.autocast(device, dtype=dtype) if mode == "autocast" else contextlib.nullcontext()
    switch = gnn_fastpath.enabled(cpu="reference") if enabled else contextlib.nullcontext()
    torch.manual_seed(case.seed)
    with warnings.catch_warnings():
        if enabled:
            warnings.simplefilter("error", FastpathFallbackWarning)
        with autocast, switch:
            if case.compiled:  # compiled after enable(), the documented order
                torch._dynamo.reset()
                backend = "inductor" if device == "cuda" else "aot_eager"
                out = forward(torch.compile(m, backend=backend, dynamic=False), t)
            else:
                out = forward(m, t)
    leaves = _float_leaves(out)
    gen = torch.Generator().manual_seed(case.seed + 17)
    loss = sum((o.double() * torch.randn(o.shape, generator=gen, dtype=torch.float64).to(o.device)).sum()
               for o in leaves if o.requires_grad)
    if isinstance(loss, Tensor):
        loss.backward()
    grads = {f"param {n}": p.grad for n, p in m.named_parameters()}
    grads.update({f"input {k}": v.grad for k, v in t.items() if v.is_floating_point()})
    return Result([o.detach() for o in leaves], grads), _index_leaves(out)


def _stats_total(key: str) -> Tuple[int, dict]:
    """(fused calls and fused traces, fallbacks by reason) of one layer class."""
    s = gnn_fastpath.stats().get(key, {"fused": {}, "fallback": {}})
    fallbacks = dict(s.get("fallback", {}))
    fused = sum(s.get("fused", {}).values())
    for outcome, n in s.get("compiled", {}).items():
        if outcome.startswith("fallback:"):
            fallbacks[outcome] = n
        else:
            fused += n
    return fused, fallbacks


def _rel_err(a: Tensor, e: Tensor) -> Tuple[float, float]:
    a, e = a.detach().double().cpu(), e.detach().double().cpu()
    if e.numel() == 0:
        return 0.0, 0.0
    return (a - e).abs().max().item(), e.abs().max().item()


class Mismatch(AssertionError):
    pass


def _fail(case: Case, what: str, detail: str):
    message = f"{case.describe()}\n  {what}: {detail}\n  replay: {replay_command(case)}"
    log = os.environ.get("GNN_FASTPATH_DIFF_LOG")
    if log:  # appended as it happens: a run cut by a time limit still says what failed
        with open(log, "a") as f:
            f.write(message + "\n")
    raise Mismatch(message)


def replay_command(case: Case) -> str:
    return f"GNN_FASTPATH_DIFF_FIRST={case.seed} GNN_FASTPATH_DIFF_CASES=1 pytest tests/integrations/test_differential.py"


def _pairs(fused: Result, stock: Result):
    """(name, fused tensor, stock tensor) for every output and gradient; structure checked."""
    if len(fused.outs) != len(stock.outs):
        return None, f"{len(fused.outs)} float outputs, stock {len(stock.outs)}"
    if fused.grads.keys() != stock.grads.keys():
        return None, f"gradients {sorted(fused.grads)} vs stock {sorted(stock.grads)}"
    pairs = [(f"output {i}", a, e) for i, (a, e) in enumerate(zip(fused.outs, stock.outs))]
    pairs += [(f"grad of {n}", fused.grads[n], e) for n, e in stock.grads.items()]
    return pairs, ""


def _ref_tensor(ref: Result, name: str) -> Optional[Tensor]:
    if name.startswith("output "):
        return ref.outs[int(name.split()[1])]
    return ref.grads.get(name[len("grad of "):])


def _grad_floor(result: Result) -> float:
    """``GRAD_FLOOR`` x the run's largest gradient: the scale below which a gradient entry is
    rounding noise (some are mathematically 0, e.g. a softmax's shift-invariant direction)."""
    return GRAD_FLOOR * _largest_grad(result)


def _compare_fp32(case, fused: Result, stock: Result, rtol: float, reference: Callable[[], Result]):
    """float32: every tensor within ``rtol`` of stock's (relative to its largest entry, gradients
    to at least ``GRAD_FLOOR`` of the largest gradient). A tensor outside that is held to the
    float64 evaluation instead (``reference()``): the fused error at most ``FACTOR_FP32`` x stock's
    plus ``SLACK_FP32``: ill-conditioned sums (a softmax gradient that cancels over a super node's
    thousands of edges) are noisy on both paths."""
    pairs, problem = _pairs(fused, stock)
    if pairs is None:
        _fail(case, "structure", problem)
    floor = GRAD_FLOOR * max([e.abs().max().item() for name, _, e in pairs
                              if name.startswith("grad") and e is not None and e.numel()] + [0.0])
    suspects = []
    for name, a, e in pairs:
        if (a is None) != (e is None):
            present = a if a is not None else e  # None on one path must be all zeros on the other
            if present.abs().max().item() != 0:
                _fail(case, name, f"None on one path only ({'fused' if a is None else 'stock'})")
            continue
        if e is None:
            continue
        _check_layout(case, name, a, e)
        err, scale = _rel_err(a.nan_to_num(), e.nan_to_num())
        bound = rtol * max(scale, floor if name.startswith("grad") else 0.0)
        if err > bound:
            suspects.append((name, a, e, f"max |fused - stock| = {err:.3e} > {bound:.3e}"))
    if suspects:
        ref = reference()
        floor = _grad_floor(ref)
        for name, a, e, detail in suspects:
            r = _ref_tensor(ref, name)
            f = floor if name.startswith("grad") else 0.0
            ef, es = _err_vs(a, r, f), _err_vs(e, r, f)
            if not ef <= FACTOR_FP32 * es + SLACK_FP32:
                _fail(case, name, f"{detail}; vs float64: fused error {ef:.3e}, stock's {es:.3e}")


def _check_layout(case, what, a: Tensor, e: Tensor):
    if a.shape != e.shape:
        _fail(case, what, f"shape {tuple(a.shape)} != stock's {tuple(e.shape)}")
    if a.dtype != e.dtype:
        _fail(case, what, f"dtype {a.dtype} != stock's {e.dtype}")
    if not torch.equal(torch.isnan(a.cpu()), torch.isnan(e.cpu())):
        _fail(case, what, "NaN pattern differs")


def _compare_half(case, fused: Result, stock: Result, ref: Result, device: str = "cpu",
                  perturbed: Optional[Callable[[int], Result]] = None,
                  stock_perturbed: Optional[Callable[[int], Result]] = None):
    """16-bit: per tensor, the fused error against float64 at most ``FACTOR`` x stock's plus
    ``SLACK`` units of the dtype's roundoff, plus ``FACTOR`` x the tensor's *conditioning
    noise*: the most the float64 result moves when every parameter and input is perturbed by
    up to a unit of roundoff (``perturbed(k)``, ``NOISE_DRAWS`` draws, run only for a tensor
    outside the first bound), and stock's error taken as the most of its run and of
    ``NOISE_DRAWS`` stock runs on inputs and parameters perturbed by k + 1 units of the 16-bit
    roundoff (``stock_perturbed(k)``; a structural zero is rounding noise on both paths, which
    the float64 perturbations cannot see). Where that dominates, both errors are large and their ratio is
    luck: a gradient through a softmax over thousands of edges, or a LeakyReLU kink that a
    rounding of the same size puts on the other side for one path and not the other (e.g. a
    self loop's mean edge attribute, rounded to 16 bits in another order). DGL on the GPU: or within ``DGL_GPU_BOUND`` /
    ``DGL_GPU_GRAD_BOUND`` units. Dtypes equal stock's."""
    u = UNIT[DTYPES[case.dtype]]
    pairs, problem = _pairs(fused, stock)
    if pairs is None:
        _fail(case, "structure", problem)
    floor = _grad_floor(ref)
    noisy: List[Result] = []
    stock_runs: List[Result] = []
    for name, f, s in pairs:
        r = _ref_tensor(ref, name)
        if s is None or r is None:
            continue
        if f is None:
            if s.abs().max().item() != 0:
                _fail(case, name, "None on the fused path only")
            continue
        if f.dtype != s.dtype:
            _fail(case, name, f"dtype {f.dtype} != stock's {s.dtype}")
        fl = floor if name.startswith("grad") else 0.0
        ef, es = _err_vs(f, r, fl), _err_vs(s, r, fl)
        if case.framework == "dgl" and device == "cuda":
            if ef <= (DGL_GPU_GRAD_BOUND if name.startswith("grad") else DGL_GPU_BOUND) * u:
                continue
        if ef <= FACTOR * es + SLACK * u:
            continue
        if name.startswith("grad") and _structural_zero(r, ref) and _err_vs(f, r, _largest_grad(ref)) <= ZERO_SLACK * u:
            continue
        noise = 0.0
        for k in range(NOISE_DRAWS if perturbed is not None else 0):
            if len(noisy) <= k:
                noisy.append(perturbed(k))
            noise = max(noise, _err_vs(_ref_tensor(noisy[k], name), r, fl))
            if ef <= FACTOR * es + SLACK * u + FACTOR * noise:
                break
        # stock's own spread: its error on inputs moved by (k + 1) units of roundoff. A gradient
        # that is a structural zero (a softmax's shift-invariant direction, the gradient through
        # normalize() of one channel) is pure rounding noise on both paths, and the float64
        # perturbations cannot see that noise: stock's error is then one draw of it.
        for k in range(NOISE_DRAWS if stock_perturbed is not None else 0):
            if ef <= FACTOR * es + SLACK * u + FACTOR * noise:
                break
            if len(stock_runs) <= k:
                stock_runs.append(stock_perturbed(k))
            es = max(es, _err_vs(_ref_tensor(stock_runs[k], name), r, fl))
        if not ef <= FACTOR * es + SLACK * u + FACTOR * noise:
            _fail(case, name, f"error vs float64 {ef:.3e} > {FACTOR} x stock's {es:.3e} (the most of "
                              f"{1 + len(stock_runs)} stock runs) + {SLACK}u + {FACTOR} x the conditioning "
                              f"noise {noise:.3e}")


def _largest_grad(result: Result) -> float:
    return max([g.detach().abs().max().item() for g in result.grads.values() if g is not None and g.numel()] + [0.0])


def _structural_zero(r: Tensor, ref: Result) -> bool:
    """``r`` (a float64 gradient of ``ref``) is 0 up to float64 rounding: a cancelling sum."""
    largest = _largest_grad(ref)
    return largest > 0 and r.numel() > 0 and r.detach().abs().max().item() <= ZERO_TOL * largest


def _err_vs(x: Tensor, ref: Tensor, floor: float = 0.0) -> float:
    """max |x - ref| / max(max |ref|, floor) over ref's finite entries (inf if x is not finite
    exactly where ref is)."""
    x, ref = x.detach().double().cpu(), ref.detach().double().cpu()
    if ref.numel() == 0:
        return 0.0
    finite = torch.isfinite(ref)
    if not torch.equal(torch.isfinite(x), finite):
        return math.inf
    diff = (x[finite] - ref[finite]).abs().max().item() if finite.any() else 0.0
    scale = max(ref[finite].abs().max().item() if finite.any() else 0.0, floor)
    return diff / scale if scale > 0 else diff


def check_case(case: Case, device: str = "cpu") -> str:
    """Run ``case`` stock and enabled on ``device`` and compare (see the module docstring);
    returns the backend that ran fused. Raises :class:`Mismatch` with the case's description."""
    module, inputs, forward = case.build(case, case.seed)
    gnn_fastpath.reset_stats()
    # DGL's CPU build cannot run CUDA features: on the GPU, stock DGL runs on CPU copies
    stock_device = "cpu" if case.framework == "dgl" else device
    half = case.dtype != "float32"
    mode = "float32" if not half else ("autocast" if case.precision == "autocast" else "half")
    try:
        stock, stock_index = run_once(case, module, inputs, forward, device=stock_device, mode=mode, enabled=False)
    except Exception as exc:  # noqa: BLE001 - the generator drew something stock rejects: its bug
        _fail(case, "stock raised", f"{type(exc).__name__}: {exc}")
    try:
        fused, fused_index = run_once(case, module, inputs, forward, device=device, mode=mode, enabled=True)
    except FastpathFallbackWarning as exc:
        _fail(case, "fell back", str(exc))
    except Exception as exc:  # noqa: BLE001 - stock ran, so this is ours
        _fail(case, "enabled raised", f"{type(exc).__name__}: {exc}")
    count, fallbacks = _stats_total(case.key)
    if fallbacks or count == 0:
        _fail(case, "not fused", f"stats {gnn_fastpath.stats().get(case.key)}")
    if len(fused_index) != len(stock_index) or not all(
            torch.equal(a.cpu(), b.cpu()) for a, b in zip(fused_index, stock_index)):
        _fail(case, "index outputs", "attention edge_index (or another index output) differs")
    def reference(perturb: float = 0.0, draw: int = 0) -> Result:
        """The float64 evaluation of the same module: for a half module, of its rounded
        parameters and inputs."""
        dtype = DTYPES[case.dtype]
        base = copy.deepcopy(module).to(dtype) if mode == "half" else module
        base_inputs = _to(inputs, "cpu", dtype) if mode == "half" else inputs
        return run_once(case, base, base_inputs, forward, device="cpu", mode="float64", enabled=False,
                        perturb=perturb, draw=draw)[0]

    if not half:
        _compare_fp32(case, fused, stock, RTOL[device], reference)
    else:
        u = UNIT[DTYPES[case.dtype]]
        _compare_half(case, fused, stock, reference(), device,
                      perturbed=lambda k: reference(u * (k + 1) / NOISE_DRAWS, k),
                      stock_perturbed=lambda k: run_once(case, module, inputs, forward, device=stock_device, mode=mode,
                                                         enabled=False, perturb=u * (k + 1), draw=100 + k)[0])
    return "cuda" if device == "cuda" else "reference"
