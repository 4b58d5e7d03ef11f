"""CPU tests of the benchmark graph generators (benchmarks/graphs.py) at reduced scale."""
import os
import sys
import time

import numpy as np
import pytest
import torch

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks import graphs as G  # noqa: E402

SCALE = 0.01


def _load(name, tmp_path, **kw):
    return G.load(name, cache_dir=tmp_path, **kw)


@pytest.mark.parametrize("name", G.SYNTHETIC)
def test_scaled_counts_ids_and_determinism(name, tmp_path):
    spec = G.SPECS[name]
    n, m, _, _ = G._scaled(spec, SCALE)
    a, na, meta = G.generate(name, seed=3, scale=SCALE)
    b, nb, _ = G.generate(name, seed=3, scale=SCALE)
    assert na == nb == n and a.shape == (2, m)
    assert np.array_equal(a, b), "same seed must give the same graph"
    assert a.min() >= 0 and a.max() < n
    assert meta["edges"] == m and meta["nodes"] == n
    c, _, _ = G.generate(name, seed=4, scale=SCALE)
    assert not np.array_equal(a, c), "another seed should give another graph"
    # the torch view: int64 [2, M], row 0 sources
    g = _load(name, tmp_path, seed=3, scale=SCALE)
    assert g.edge_index.dtype == torch.int64 and tuple(g.edge_index.shape) == (2, m)
    assert torch.equal(g.edge_index, torch.from_numpy(a).long())
    assert g.num_nodes == n


def test_full_size_counts_match_the_design_table():
    expected = {"arxiv-like": (169_343, 1_166_243), "arxiv-skewdst": (169_343, 1_166_243),
                "roads-like": (142_257, 284_514), "twitch-like": (168_114, 13_595_114),
                "pokec-like": (1_632_803, 30_622_564), "web-like": (2_890_331, 12_895_369),
                "products-like": (2_449_029, 123_718_280)}
    for name, (n, m) in expected.items():
        assert (G.SPECS[name].nodes, G.SPECS[name].edges) == (n, m)
        assert G._scaled(G.SPECS[name], 1.0)[:2] == (n, m)


def test_roads_like_in_degree_exactly_two(tmp_path):
    for scale in (SCALE, 1.0):
        g = _load("roads-like", tmp_path, scale=scale)
        n = g.num_nodes
        indeg = torch.bincount(g.edge_index[1], minlength=n)
        outdeg = torch.bincount(g.edge_index[0], minlength=n)
        assert (indeg == 2).all() and (outdeg == 2).all()
        assert g.num_edges == 2 * n


def test_undirected_graphs_are_symmetric():
    e, n, _ = G.generate("twitch-like", scale=SCALE)
    half = e.shape[1] // 2
    assert np.array_equal(e[0, :half], e[1, half:]) and np.array_equal(e[1, :half], e[0, half:])
    assert np.array_equal(np.bincount(e[0], minlength=n), np.bincount(e[1], minlength=n))


def test_clustered_is_symmetric_and_locally_dense():
    """The block model: every pair in both directions, and most edges inside one block of
    128 consecutive ids (what a block-sparse layout of row windows can exploit)."""
    e, n, meta = G.generate("clustered", scale=SCALE)
    half = e.shape[1] // 2
    assert np.array_equal(e[0, :half], e[1, half:]) and np.array_equal(e[1, :half], e[0, half:])
    spec = G.SPECS["clustered"]
    inside = (e[0] // spec.block == e[1] // spec.block).mean()
    assert inside > spec.intra - 0.02  # the uniform rest lands inside a block by chance too
    e_full, n_full, _ = G.generate("clustered")
    assert (n_full, e_full.shape[1]) == (131_072, 2_097_152)
    assert (e_full[0] // spec.block == e_full[1] // spec.block).mean() > 0.89


def test_full_arxiv_like_and_skewdst():
    t0 = time.perf_counter()
    e, n, meta = G.generate("arxiv-like")
    assert time.perf_counter() - t0 < 10  # about 0.2 s on an idle core
    assert n == 169_343 and e.shape == (2, 1_166_243)
    indeg = np.bincount(e[1], minlength=n)
    outdeg = np.bincount(e[0], minlength=n)
    assert indeg.max() <= 30                    # destinations near uniform (baselines: 21)
    assert outdeg.max() == 48_353               # the power-law side hits its target max exactly
    assert np.all(np.diff(e[0]) >= 0), "directed graphs are grouped by ascending source"
    s, n2, meta2 = G.generate("arxiv-skewdst")
    indeg2 = np.bincount(s[1], minlength=n2)
    assert indeg2.max() == 48_353 and meta2["in_max"] == 48_353  # super node
    assert np.array_equal(np.sort(indeg2), np.sort(outdeg)), "one degree sequence per family"
    assert meta2["in_skew"] > 100


def test_skewdst_scaled_has_a_super_node():
    e, n, meta = G.generate("arxiv-skewdst", scale=SCALE)
    indeg = np.bincount(e[1], minlength=n)
    assert indeg.max() > 50 * indeg.mean()


def test_powerlaw_sequence_hits_skew_and_sum():
    rng = np.random.default_rng(0)
    deg, a = G.powerlaw_degrees(50_000, 400_000, rng, skew=30.0)
    assert deg.sum() == 400_000 and deg.min() >= 0
    assert abs(G.skewness(deg) - 30.0) < 1.5


def test_cache_roundtrip(tmp_path):
    g1 = _load("web-like", tmp_path, scale=SCALE)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert any(f.endswith(".npy") for f in files) and any(f.endswith(".json") for f in files)
    assert g1.meta["cached"] is False
    g2 = _load("web-like", tmp_path, scale=SCALE)
    assert g2.meta["cached"] is True
    assert torch.equal(g1.edge_index, g2.edge_index)


def test_unknown_and_missing(tmp_path):
    with pytest.raises(KeyError):
        G.load("no-such-graph", cache_dir=tmp_path)
    with pytest.raises(FileNotFoundError, match="tolokers"):
        G.load("tolokers", data_dir=tmp_path)


def test_real_graphs_when_present():
    path = os.path.join(ROOT, "..", "shared", "data")
    if not os.path.isdir(path):
        pytest.skip(f"real graphs not found at {path}")
    ei, n = G.load_graph("tolokers", data_dir=path)
    assert n == 11_758 and tuple(ei.shape) == (2, 1_038_000)
    assert int(torch.bincount(ei[1], minlength=n).max()) == 2_138
    ei, n = G.load_graph("cora", data_dir=path)
    assert n == 2_708 and ei.shape[1] == 10_556
    ei, n = G.load_graph("citeseer", data_dir=path)
    assert n == 3_327 and ei.shape[1] == 9_104
