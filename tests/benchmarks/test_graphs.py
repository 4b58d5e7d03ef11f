"""The benchmark graphs (``python -m benchmarks.graphs``) at reduced scale and, where cheap, full
size: counts as in design.md section 7, determinism by seed, the cache, the degree shapes each
generator promises (its ``--json`` facts) and the errors for unknown or missing graphs."""
import json
import os

import pytest

SCALE = "0.01"
DESIGN = {"arxiv-like": (169_343, 1_166_243), "arxiv-skewdst": (169_343, 1_166_243), "roads-like": (142_257, 284_514),
          "twitch-like": (168_114, 13_595_114), "pokec-like": (1_632_803, 30_622_564),
          "web-like": (2_890_331, 12_895_369), "products-like": (2_449_029, 123_718_280)}


def _graphs(tool, *args):
    """{name: facts} of one ``graphs --json`` run."""
    out = tool("graphs", "--json", *args).stdout
    return {g["name"]: g for g in map(json.loads, out.splitlines())}


def test_full_size_counts_match_the_design_table(tool):
    specs = json.loads(tool("graphs", "--specs").stdout)
    for name, (n, m) in DESIGN.items():
        assert (specs[name]["nodes"], specs[name]["edges"]) == (n, m), name


def test_scaled_graphs_deterministic_cached_and_shaped(tool):
    first = _graphs(tool, "--seed", "3", "--scale", SCALE)           # generated, then cached
    again = _graphs(tool, "--seed", "3", "--scale", SCALE, "--no-cache")
    cached = _graphs(tool, "--seed", "3", "--scale", SCALE)
    other = _graphs(tool, "--seed", "4", "--scale", SCALE, "--no-cache")
    assert set(first) == set(again) == set(cached) >= set(DESIGN)
    for name, g in first.items():
        assert g["cached"] is False and cached[name]["cached"] is True, name
        assert g["checksum"] == again[name]["checksum"] == cached[name]["checksum"], name  # same seed, same graph
        assert g["checksum"] != other[name]["checksum"], name                              # another seed, another
        if name in DESIGN:  # counts scale with the design table's
            n, m = DESIGN[name]
            assert abs(g["nodes"] - round(n * 0.01)) <= 1, name
            if name != "roads-like":
                assert abs(g["edges"] - round(m * 0.01)) <= 1, name
        if g["kind"] == "directed":
            assert g["sources_ascend"], name  # grouped by ascending source
        else:
            assert g["halves_reversed"], name  # undirected: each pair in both directions
    roads = first["roads-like"]
    assert roads["in_min"] == roads["in_max"] == roads["out_min"] == roads["out_max"] == 2
    assert first["clustered"]["inside_block"] > 0.88
    skew = first["arxiv-skewdst"]
    assert skew["in_max"] > 50 * skew["in_mean"]  # a super node
    assert skew["in_degrees_crc"] == first["arxiv-like"]["out_degrees_crc"]  # one sequence per family
    for name in ("twitch-like", "pokec-like", "web-like"):  # the power-law side hits its target skew
        g = first[name]
        side = g["in_skew"] if name == "web-like" else g["out_skew"]
        assert abs(side - g["target_skew"]) < 0.1 * g["target_skew"], (name, side, g["target_skew"])


def test_full_arxiv_roads_and_clustered(tool):
    g = _graphs(tool, "--no-cache", "arxiv-like", "arxiv-skewdst", "roads-like", "clustered")
    a, s = g["arxiv-like"], g["arxiv-skewdst"]
    assert (a["nodes"], a["edges"]) == DESIGN["arxiv-like"] and a["seconds"] < 10
    assert a["in_max"] <= 30 and a["out_max"] == 48_353 and a["sources_ascend"]  # the baselines' max degree
    assert s["in_max"] == 48_353 and s["in_skew"] > 100 and s["in_degrees_crc"] == a["out_degrees_crc"]
    r = g["roads-like"]
    assert r["in_min"] == r["in_max"] == 2 and r["edges"] == 2 * r["nodes"]
    c = g["clustered"]
    assert (c["nodes"], c["edges"]) == (131_072, 2_097_152) and c["inside_block"] > 0.89 and c["halves_reversed"]


def test_unknown_and_missing(tool, tmp_path):
    assert "unknown synthetic graph" in tool("graphs", "no-such-graph", expect=2).stderr
    assert "tolokers" in tool("graphs", "--data-dir", tmp_path, "tolokers", expect=2).stderr


def test_real_graphs_when_present(tool):
    path = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data")
    if not os.path.isdir(path):
        pytest.skip(f"real graphs not found at {path}")
    g = _graphs(tool, "--data-dir", path, "tolokers", "cora", "citeseer")
    assert (g["tolokers"]["nodes"], g["tolokers"]["edges"], g["tolokers"]["in_max"]) == (11_758, 1_038_000, 2_138)
    assert (g["cora"]["nodes"], g["cora"]["edges"]) == (2_708, 10_556)
    assert (g["citeseer"]["nodes"], g["citeseer"]["edges"]) == (3_327, 9_104)
