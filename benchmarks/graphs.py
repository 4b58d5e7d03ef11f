"""Benchmark graphs: real ones from disk and deterministic synthetic stand-ins.

Every graph comes back as a PyG-style ``edge_index`` [2, M] int64 (row 0 sources, row 1
destinations; CSR rows are destinations) plus its node count::

    from benchmarks.graphs import load_graph
    edge_index, num_nodes = load_graph("arxiv-like", device="cuda")

Synthetic graphs (``design.md`` section 7, ``baselines.md``) are generated from a seed with
vectorised numpy (a few seconds even for products-like, 123.7M edges) and cached on disk as
int32 ``.npy`` files under ``.bench_cache/`` (repository root; override with ``cache_dir=``
or ``GNN_FASTPATH_BENCH_CACHE``), keyed by name, seed, scale and generator version.

How they are built
------------------
* A power-law side gets a Zipf degree sequence ``s_r = c * r**-a`` (rank r = 1..N, with
  ``c`` fixing the sum at exactly M edges). The exponent ``a`` is solved by bisection so the
  sequence hits the target skewness (Fisher-Pearson ``m3 / m2**1.5`` of the degrees) or the
  target maximum degree; the floats are rounded to integers summing to exactly M (floor, then
  +1 to the largest remainders), and the degrees are dealt to node ids through a seeded
  random permutation, so heavy nodes are scattered over the id range.
* A uniform side draws every endpoint uniformly at random (near-Poisson degrees).
* Directed graphs pair the two sides at random; undirected graphs use the configuration
  model (stubs matched by a random perfect matching, each pair stored in both directions),
  so in-degree equals out-degree equals the sequence exactly.
* Edge order: directed graphs are grouped by ascending source id (as a coalesced PyG
  ``edge_index`` would be), destinations in random order inside a group; undirected graphs
  list the M/2 pairs in random order, then the same pairs reversed (as tolokers does).
* Self loops and duplicate edges are not removed (a few, from the random pairing); the ops
  must handle both anyway.

Achieved statistics (seed 0, full size) are in ``benchmarks/README.md``; ``load(name).meta``
returns them for any seed and scale.

Determinism: the same name, seed, scale and numpy version give the same graph (numpy's
``Generator`` streams are stable across versions in practice, not by promise).
"""
from __future__ import annotations

import json
import math
import os
import pickle
import sys
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
#: Bump when the generator changes what it produces: cached files of older versions are ignored.
GEN_VERSION = 1


@dataclass(frozen=True)
class Spec:
    """A synthetic graph: counts and the shape of its degree distributions.

    ``kind`` is ``"directed"`` (sides ``src`` and ``dst`` each ``"powerlaw"`` or
    ``"uniform"``) or ``"undirected"`` (one sequence, stored in both directions) or
    ``"regular"`` (undirected, every degree ``regular_degree``). A power-law side targets
    ``skew`` or ``max_degree``. ``family`` seeds the degree sequence and its permutation, so
    ``arxiv-like`` and ``arxiv-skewdst`` share one sequence (out-degrees of one are the
    in-degrees of the other).
    """

    name: str
    nodes: int
    edges: int
    kind: str
    src: str = "uniform"
    dst: str = "uniform"
    skew: Optional[float] = None
    max_degree: Optional[int] = None
    regular_degree: int = 0
    block: int = 0
    intra: float = 0.0
    family: str = ""
    note: str = ""


SPECS: Dict[str, Spec] = {s.name: s for s in [
    # baselines.md: source degrees power-law, destinations uniform (max in-degree ~21). The
    # power-law side targets the max degree of the baselines' skewdst graph (48,353); a pure
    # Zipf sequence with that max has skewness ~200 (the paper quotes 111 for ogbn-arxiv).
    Spec("arxiv-like", 169_343, 1_166_243, "directed", src="powerlaw", dst="uniform",
         max_degree=48_353, family="arxiv", note="source power-law, destinations uniform"),
    Spec("arxiv-skewdst", 169_343, 1_166_243, "directed", src="uniform", dst="powerlaw",
         max_degree=48_353, family="arxiv",
         note="destination power-law (super nodes); in-degrees = arxiv-like's out-degrees"),
    # baselines.md: every node in-degree 2 (284,514 edges, not the 279,061 of design.md).
    Spec("roads-like", 142_257, 284_514, "regular", regular_degree=2, family="roads",
         note="random 2-regular undirected graph: every in- and out-degree is 2"),
    # issue 14: locally dense windows (what a block-sparse layout of 16-row windows exploits):
    # a stochastic block model whose blocks are runs of consecutive ids.
    Spec("clustered", 131_072, 2_097_152, "clustered", block=128, intra=0.9, family="clustered",
         note="stochastic block model, undirected: blocks of 128 consecutive ids, 90% of edges inside a block"),
    Spec("twitch-like", 168_114, 13_595_114, "undirected", skew=42.0, family="twitch",
         note="undirected power-law (configuration model)"),
    Spec("pokec-like", 1_632_803, 30_622_564, "directed", src="powerlaw", dst="uniform",
         skew=72.0, family="pokec", note="source power-law, destinations uniform"),
    Spec("pokec-skewdst", 1_632_803, 30_622_564, "directed", src="uniform", dst="powerlaw",
         skew=72.0, family="pokec", note="pokec-like transposed in distribution: destination power-law"),
    Spec("web-like", 2_890_331, 12_895_369, "directed", src="uniform", dst="powerlaw",
         skew=738.0, family="web", note="destination power-law with super nodes"),
    Spec("products-like", 2_449_029, 123_718_280, "undirected", skew=17.5, family="products",
         note="undirected power-law (configuration model)"),
]}

#: Real graphs: (file candidates relative to a data dir, loader).
REAL = ("tolokers", "cora", "citeseer")
SYNTHETIC = tuple(SPECS)
ALL_GRAPHS = REAL + SYNTHETIC


# ----------------------------------------------------------------------------- statistics
def skewness(x: np.ndarray) -> float:
    """Fisher-Pearson moment skewness m3 / m2**1.5 (0 for a constant sequence)."""
    x = np.asarray(x, dtype=np.float64)
    if x.size == 0:
        return 0.0
    d = x - x.mean()
    m2 = float(np.mean(d * d))
    if m2 <= 0:
        return 0.0
    return float(np.mean(d * d * d) / m2 ** 1.5)


def degree_stats(src: np.ndarray, dst: np.ndarray, n: int, symmetric: bool = False) -> Dict[str, float]:
    """In- and out-degree statistics of a graph given as numpy id arrays (``symmetric``:
    the caller knows out-degrees equal in-degrees, which saves one pass)."""
    din = np.bincount(dst, minlength=n)
    dout = din if symmetric else np.bincount(src, minlength=n)
    return {
        "nodes": int(n), "edges": int(src.size),
        "in_max": int(din.max(initial=0)), "in_mean": float(din.mean()) if n else 0.0,
        "in_skew": round(skewness(din), 2), "in_zero": int((din == 0).sum()),
        "out_max": int(dout.max(initial=0)), "out_skew": round(skewness(dout), 2),
        "self_loops": int((src == dst).sum()),
    }


# ----------------------------------------------------------------------------- degree sequences
def _zipf_profile(n: int, a: float, log_r: np.ndarray) -> np.ndarray:
    w = np.exp(-a * log_r)
    return w / w.sum()


def solve_exponent(n: int, m: int, skew: Optional[float] = None, max_degree: Optional[float] = None,
                   lo: float = 0.0, hi: float = 4.0, iters: int = 36) -> float:
    """Zipf exponent ``a`` whose sequence ``m * r**-a / sum(r**-a)`` has the target skewness
    or maximum (both grow with ``a``). Targets out of reach give the nearest bound."""
    if (skew is None) == (max_degree is None):
        raise ValueError("give exactly one of skew and max_degree")
    log_r = np.log(np.arange(1, n + 1, dtype=np.float64))

    def value(a: float) -> float:
        p = _zipf_profile(n, a, log_r)
        return skewness(p) if skew is not None else m * float(p[0])

    target = skew if skew is not None else max_degree
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        if value(mid) < target:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def integer_sequence(weights: np.ndarray, m: int) -> np.ndarray:
    """Non-negative int64 degrees proportional to ``weights`` summing to exactly ``m``
    (floor, then +1 to the largest remainders; ties broken by position, deterministic)."""
    s = weights * (m / weights.sum())
    base = np.floor(s).astype(np.int64)
    rem = int(m - base.sum())
    if rem > 0:
        frac = s - base
        extra = np.argsort(-frac, kind="stable")[:rem]
        base[extra] += 1
    return base


def powerlaw_degrees(n: int, m: int, rng: np.random.Generator, skew: Optional[float] = None,
                     max_degree: Optional[float] = None) -> Tuple[np.ndarray, float]:
    """Degrees by node id (int64 [n], summing to m) and the Zipf exponent used."""
    a = solve_exponent(n, m, skew=skew, max_degree=max_degree)
    log_r = np.log(np.arange(1, n + 1, dtype=np.float64))
    seq = integer_sequence(_zipf_profile(n, a, log_r), m)
    by_id = np.empty(n, dtype=np.int64)
    by_id[rng.permutation(n)] = seq
    return by_id, a


def _ids(n: int) -> np.ndarray:
    return np.arange(n, dtype=np.int32)


def _uniform_sorted(n: int, m: int, rng: np.random.Generator) -> np.ndarray:
    """m uniform endpoints, ascending (counts, then repeat: no sort needed)."""
    counts = np.bincount(rng.integers(0, n, size=m, dtype=np.int64), minlength=n)
    return np.repeat(_ids(n), counts)


def _configuration_model(deg: np.ndarray, rng: np.random.Generator) -> Tuple[np.ndarray, np.ndarray]:
    """Undirected configuration model: stubs matched by one random shuffle.

    Returns (src, dst) holding every matched pair twice: the first half of the edges are the
    pairs (u, v), the second half the same pairs reversed (v, u), like tolokers. In- and
    out-degree of node i are both exactly ``deg[i]``; ``deg.sum()`` must be even.
    """
    m = int(deg.sum())
    if m % 2:
        raise ValueError("the configuration model needs an even degree sum")
    stubs = np.repeat(_ids(deg.size), deg)
    rng.shuffle(stubs)
    u, v = stubs[0::2], stubs[1::2]
    return np.concatenate([u, v]), np.concatenate([v, u])


# ----------------------------------------------------------------------------- generation
def _block_model(n: int, m: int, block: int, intra: float, rng: np.random.Generator) -> Tuple[np.ndarray, np.ndarray]:
    """m // 2 undirected pairs stored in both directions: a share ``intra`` with both ends in
    one block of ``block`` consecutive ids (the block drawn uniformly), the rest uniform."""
    half = m // 2
    k = int(round(half * intra))
    first = rng.integers(0, max(1, -(-n // block)), size=k, dtype=np.int64) * block
    a = np.minimum(first + rng.integers(0, block, size=k), n - 1)
    b = np.minimum(first + rng.integers(0, block, size=k), n - 1)
    a = np.concatenate([a, rng.integers(0, n, size=half - k)])
    b = np.concatenate([b, rng.integers(0, n, size=half - k)])
    return np.concatenate([a, b]), np.concatenate([b, a])


def _scaled(spec: Spec, scale: float) -> Tuple[int, int, Optional[float], Optional[float]]:
    if scale == 1.0:
        return spec.nodes, spec.edges, spec.skew, spec.max_degree
    if not 0 < scale <= 1:
        raise ValueError(f"scale must be in (0, 1], got {scale}")
    n = max(4, int(round(spec.nodes * scale)))
    if spec.kind == "regular":
        m = spec.regular_degree * n
    else:
        m = max(2, int(round(spec.edges * scale)))
        if spec.kind in ("undirected", "clustered"):
            m += m % 2
    skew = None if spec.skew is None else max(1.0, spec.skew * math.sqrt(scale))
    mx = None if spec.max_degree is None else max(2.0, spec.max_degree * scale)
    return n, m, skew, mx


def generate(name: str, seed: int = 0, scale: float = 1.0) -> Tuple[np.ndarray, int, dict]:
    """Generate a synthetic graph (no cache): (int32 edge array [2, M], nodes, meta)."""
    if name not in SPECS:
        raise KeyError(f"unknown synthetic graph {name!r}; known: {', '.join(SYNTHETIC)}")
    spec = SPECS[name]
    t0 = time.perf_counter()
    n, m, skew, mx = _scaled(spec, scale)
    rng = np.random.default_rng([int(seed), zlib.crc32(spec.family.encode())])
    exponent = None
    if spec.kind == "regular":
        src, dst = _configuration_model(np.full(n, spec.regular_degree, dtype=np.int64), rng)
    elif spec.kind == "undirected":
        deg, exponent = powerlaw_degrees(n, m, rng, skew=skew, max_degree=mx)
        src, dst = _configuration_model(deg, rng)
    elif spec.kind == "directed":
        # One power-law sequence per family, drawn first, so both orientations share it.
        deg, exponent = powerlaw_degrees(n, m, rng, skew=skew, max_degree=mx)
        if spec.src == "powerlaw" and spec.dst == "uniform":
            src = np.repeat(_ids(n), deg)
            dst = rng.integers(0, n, size=m, dtype=np.int32)
        elif spec.src == "uniform" and spec.dst == "powerlaw":
            src = _uniform_sorted(n, m, rng)
            dst = np.repeat(_ids(n), deg)
            rng.shuffle(dst)
        else:
            raise ValueError(f"{name}: unsupported sides src={spec.src} dst={spec.dst}")
    elif spec.kind == "clustered":
        src, dst = _block_model(n, m, spec.block, spec.intra, rng)
    else:
        raise ValueError(f"{name}: unknown kind {spec.kind}")
    edges = np.stack([src.astype(np.int32, copy=False), dst.astype(np.int32, copy=False)])
    gen_s = time.perf_counter() - t0
    meta = {"name": name, "seed": int(seed), "scale": float(scale), "generator_version": GEN_VERSION,
            "kind": spec.kind, "note": spec.note, "zipf_exponent": None if exponent is None else round(exponent, 4),
            "target_skew": skew, "target_max_degree": mx, "generate_s": round(gen_s, 3)}
    meta.update(degree_stats(edges[0], edges[1], n, symmetric=spec.kind != "directed"))
    return edges, n, meta


def default_cache_dir() -> Path:
    return Path(os.environ.get("GNN_FASTPATH_BENCH_CACHE", REPO_ROOT / ".bench_cache"))


def _cache_paths(cache_dir: Path, name: str, seed: int, scale: float) -> Tuple[Path, Path]:
    stem = f"{name}_s{seed}_x{scale:g}_v{GEN_VERSION}"
    return cache_dir / f"{stem}.npy", cache_dir / f"{stem}.json"


def synthetic_edges(name: str, seed: int = 0, scale: float = 1.0, cache_dir=None,
                    use_cache: bool = True) -> Tuple[np.ndarray, int, dict]:
    """Cached :func:`generate`: loads ``.npy`` + ``.json`` when present, else generates and saves."""
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    npy, meta_path = _cache_paths(cache_dir, name, seed, scale)
    if use_cache and npy.exists() and meta_path.exists():
        try:
            meta = json.loads(meta_path.read_text())
            edges = np.load(npy)
            if edges.shape == (2, meta["edges"]):
                meta["cached"] = True
                return edges, int(meta["nodes"]), meta
        except (OSError, ValueError, KeyError):
            pass  # unreadable or partial: regenerate
    edges, n, meta = generate(name, seed, scale)
    if use_cache:
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = npy.with_name(npy.name + f".{os.getpid()}.tmp")
        with open(tmp, "wb") as f:
            np.save(f, edges)
        os.replace(tmp, npy)
        tmp = meta_path.with_name(meta_path.name + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(meta, indent=1))
        os.replace(tmp, meta_path)
    meta["cached"] = False
    return edges, n, meta


# ----------------------------------------------------------------------------- real graphs
def data_dirs(data_dir=None) -> List[Path]:
    """Where real graphs are looked for, in order: ``data_dir`` alone when given; else
    ``$GNN_FASTPATH_DATA``, ``../shared/data`` beside the repository, ``./.data`` in the
    repository (the device runner copies files there) and ``./.data`` in the cwd."""
    if data_dir is not None:
        return [Path(data_dir)]
    out = []
    if os.environ.get("GNN_FASTPATH_DATA"):
        out.append(Path(os.environ["GNN_FASTPATH_DATA"]))
    out += [REPO_ROOT.parent / "shared" / "data", REPO_ROOT / ".data", Path.cwd() / ".data"]
    return out


def _find(relpaths: List[str], data_dir) -> Optional[Path]:
    for d in data_dirs(data_dir):
        for rel in relpaths:
            p = d / rel
            if p.is_file():
                return p
    return None


def _missing(name: str, relpaths: List[str], data_dir) -> FileNotFoundError:
    looked = [str(d / r) for d in data_dirs(data_dir) for r in relpaths]
    return FileNotFoundError(
        f"real graph {name!r} not found; looked at: {', '.join(looked)}. On a developer machine it is "
        f"in ../shared/data; for the device machine copy it into ./.data/ (e.g. `mkdir -p .data && cp "
        f"../shared/data/heterophilous/tolokers.npz .data/`) and name .data in the run's carry list.")


def _tolokers(data_dir) -> Tuple[np.ndarray, int]:
    rel = ["heterophilous/tolokers.npz", "tolokers.npz"]
    path = _find(rel, data_dir)
    if path is None:
        raise _missing("tolokers", rel, data_dir)
    with np.load(path) as z:
        pairs = z["edges"]  # [519000, 2] undirected pairs
        n = int(z["node_features"].shape[0])
    a, b = pairs[:, 0], pairs[:, 1]
    edges = np.stack([np.concatenate([a, b]), np.concatenate([b, a])]).astype(np.int32)
    return edges, n


def _planetoid(name: str, data_dir) -> Tuple[np.ndarray, int]:
    rel = [f"planetoid/ind.{name}.graph", f"ind.{name}.graph", f"{name.capitalize()}/raw/ind.{name}.graph"]
    path = _find(rel, data_dir)
    if path is None:
        raise _missing(name, rel, data_dir)
    with open(path, "rb") as f:
        adj = pickle.load(f, encoding="latin1")
    rows = np.fromiter((k for k, vs in adj.items() for _ in vs), dtype=np.int64)
    cols = np.fromiter((v for vs in adj.values() for v in vs), dtype=np.int64)
    n = max(max(adj.keys()), int(cols.max(initial=0))) + 1
    both = np.stack([np.concatenate([rows, cols]), np.concatenate([cols, rows])])
    both = both[:, both[0] != both[1]]  # PyG's Planetoid: symmetric, no self loops, no duplicates
    key = np.unique(both[0] * n + both[1])
    edges = np.stack([key // n, key % n]).astype(np.int32)
    return edges, int(n)


def real_edges(name: str, data_dir=None) -> Tuple[np.ndarray, int, dict]:
    t0 = time.perf_counter()
    if name == "tolokers":
        edges, n = _tolokers(data_dir)
    elif name in ("cora", "citeseer"):
        edges, n = _planetoid(name, data_dir)
    else:
        raise KeyError(f"unknown real graph {name!r}; known: {', '.join(REAL)}")
    meta = {"name": name, "kind": "real", "load_s": round(time.perf_counter() - t0, 3)}
    meta.update(degree_stats(edges[0], edges[1], n, symmetric=True))  # all three are undirected
    return edges, n, meta


# ----------------------------------------------------------------------------- public API
@dataclass
class BenchGraph:
    name: str
    edge_index: torch.Tensor
    num_nodes: int
    meta: dict = field(default_factory=dict)

    @property
    def num_edges(self) -> int:
        return int(self.edge_index.shape[1])


def load(name: str, data_dir=None, device="cpu", seed: int = 0, scale: float = 1.0, cache_dir=None,
         use_cache: bool = True) -> BenchGraph:
    """Any benchmark graph as a :class:`BenchGraph` (edge_index int64 [2, M] on ``device``)."""
    key = name.lower()
    if key in REAL:
        if scale != 1.0:
            raise ValueError("real graphs have no scale parameter")
        edges, n, meta = real_edges(key, data_dir)
    else:
        edges, n, meta = synthetic_edges(key, seed, scale, cache_dir, use_cache)
    ei = torch.from_numpy(np.ascontiguousarray(edges))
    ei = ei.to(device).to(torch.int64)  # int32 over the bus, widened on the device
    return BenchGraph(key, ei, n, meta)


def load_graph(name: str, data_dir=None, device="cpu", seed: int = 0, scale: float = 1.0,
               cache_dir=None) -> Tuple[torch.Tensor, int]:
    """``(edge_index [2, M] int64 on device, num_nodes)`` for a benchmark graph name."""
    g = load(name, data_dir=data_dir, device=device, seed=seed, scale=scale, cache_dir=cache_dir)
    return g.edge_index, g.num_nodes


def facts(name: str, edges: np.ndarray, n: int) -> dict:
    """What the generator promises about a graph, checked on its edges (``--json``): a checksum
    (crc32 of the int32 edge array), the smallest in- and out-degree, crc32 of the sorted in- and
    out-degree sequences (one sequence per family: arxiv-like's out-degrees are
    arxiv-skewdst's in-degrees), whether the second half of the edges is the first half
    reversed (undirected graphs), whether sources ascend (directed graphs) and, for block
    models, the share of edges inside one block."""
    src, dst = edges[0], edges[1]
    din, dout = np.bincount(dst, minlength=n), np.bincount(src, minlength=n)
    half = edges.shape[1] // 2
    out = {"checksum": zlib.crc32(np.ascontiguousarray(edges, dtype=np.int32).tobytes()),
           "in_min": int(din.min()) if n else 0, "out_min": int(dout.min()) if n else 0,
           "in_degrees_crc": zlib.crc32(np.sort(din).astype(np.int64).tobytes()),
           "out_degrees_crc": zlib.crc32(np.sort(dout).astype(np.int64).tobytes()),
           "halves_reversed": bool(edges.shape[1] % 2 == 0 and np.array_equal(src[:half], dst[half:])
                                   and np.array_equal(dst[:half], src[half:])),
           "sources_ascend": bool(np.all(np.diff(src) >= 0))}
    spec = SPECS.get(name)
    if spec is not None and spec.block:
        out["inside_block"] = float((src // spec.block == dst // spec.block).mean())
    return out


def _main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(description="Generate (and cache) benchmark graphs; print their statistics.")
    p.add_argument("names", nargs="*", default=list(SYNTHETIC))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--no-cache", action="store_true")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--json", action="store_true",
                   help="one JSON line per graph: its statistics and :func:`facts` (instead of the table)")
    p.add_argument("--specs", action="store_true", help="print the synthetic graphs' specs as JSON and exit")
    args = p.parse_args(argv)
    if args.specs:
        print(json.dumps({k: vars(s) for k, s in SPECS.items()}))
        return 0
    cols = ["name", "nodes", "edges", "in_max", "in_skew", "out_max", "out_skew", "in_zero", "self_loops",
            "zipf_exponent", "generate_s"]
    if not args.json:
        print("| " + " | ".join(cols) + " | seconds |")
        print("|" + " --- |" * (len(cols) + 1))
    for name in args.names:
        t0 = time.perf_counter()
        try:
            if name in REAL:
                edges, n, meta = real_edges(name, args.data_dir)
            else:
                edges, n, meta = synthetic_edges(name, args.seed, args.scale, use_cache=not args.no_cache)
        except (KeyError, FileNotFoundError, ValueError) as exc:
            print(f"{name}: {exc}", file=sys.stderr)
            return 2
        dt = time.perf_counter() - t0
        if args.json:
            print(json.dumps(dict(meta, seconds=round(dt, 3), **facts(name, edges, n))), flush=True)
        else:
            print("| " + " | ".join(str(meta.get(c, "")) for c in cols) + f" | {dt:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
