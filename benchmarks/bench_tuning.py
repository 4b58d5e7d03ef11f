"""Does the tuner pick the faster kernel variant? Every variant and the tuner's choice, timed
side by side in one process.

For each graph, op and dtype the forward + backward step is timed with each variant forced
(``GNN_FASTPATH_{DOT,GAT}_BWD``: the attention backwards; ``GNN_FASTPATH_SR_CHUNKS``: the
min/max forward's feature chunks; ``GNN_FASTPATH_SR_BWD``: its backward's scatter), with the
rule (nothing set; these runs have ``GNN_FASTPATH_TUNE=0``) and with
``GNN_FASTPATH_TUNE=1`` (a fresh choices file: the first, untimed, warm-up call of a size
class measures). Variants alternate within each round and the rounds repeat, so clock and
thermal drift hit all of them alike; the table shows the median over rounds of each
round's median, the variant the rule and the tuner took, and the tuned step against the
fastest forced one (1.00 = the tuner found the best)::

    python -m benchmarks.bench_tuning --graphs tolokers,arxiv-like,arxiv-skewdst,roads-like \
        --dtypes float32,bfloat16 --json-out bench_tuning.json --md bench_tuning.md

Settings are read per call (gnn_fastpath.config), so one process can switch between them.
"""
from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Tuple

import torch

from . import graphs as G
from . import report
from .bench_ops import OPS
from .timing import DTYPES, fmt, parse_dtypes, time_calls

@dataclass(frozen=True)
class Tuned:
    """One tuned decision of an op: the setting that forces a variant, the variants, the
    rule's pick on a graph, the size class the launcher names the call by, and the op case
    (bench_ops.OPS) it is timed on (default: the decision's own name)."""
    setting: str
    variants: Tuple[str, ...]
    rule: Callable
    klass: Callable
    case: str = ""


def _module(name):
    return importlib.import_module(f"gnn_fastpath.cuda.{name}")


TUNED_OPS = {
    "dot_attention": Tuned("GNN_FASTPATH_DOT_BWD", ("atomic", "transposed"),
                           lambda g: _module("dot_attention").backward_mode(g),
                           lambda g, width, dt: _module("dot_attention").backward_class(g, width, dt)),
    "gat_attention": Tuned("GNN_FASTPATH_GAT_BWD", ("atomic", "transposed"),
                           lambda g: _module("gat_attention").backward_mode(g),
                           lambda g, width, dt: _module("gat_attention").backward_class(g, width, dt)),
    # the forward's feature chunks per lane (the step's backward does not depend on them)
    "segment_reduce": Tuned("GNN_FASTPATH_SR_CHUNKS", ("1", "2", "4"),
                            lambda g: str(_module("segment_reduce").rule_chunks(g)),
                            lambda g, width, dt: _module("segment_reduce").forward_class(g, width, dt, dt, True)),
    # the backward's scatter of single winners: atomics or the source-major pass
    "segment_reduce.backward": Tuned("GNN_FASTPATH_SR_BWD", ("atomic", "transposed"),
                                     lambda g: _module("segment_reduce").backward_mode(g, "split"),
                                     lambda g, width, dt: _module("segment_reduce").backward_class(g, width, dt, dt),
                                     case="segment_reduce"),
}
SETTINGS = ("GNN_FASTPATH_TUNE", "GNN_FASTPATH_TUNE_CACHE") + tuple(t.setting for t in TUNED_OPS.values())


def _environ(values: Dict[str, str]) -> None:
    """The tuning-related settings exactly as ``values`` (the others unset)."""
    for name in SETTINGS:
        os.environ.pop(name, None)
    os.environ.update(values)


def _step(fn, graph, inputs, kwargs, grad):
    def run():
        out = fn(graph, *inputs, **kwargs)
        out.backward(grad)
    return run


def _zero(inputs):
    def clear():
        for t in inputs:
            t.grad = None
    return clear


def run_case(graph, gname: str, op: str, dtype_name: str, args, cache: Path) -> dict:
    from gnn_fastpath import tuning

    _environ({})
    tuned = TUNED_OPS[op]
    case = OPS[tuned.case or op]
    dtype = DTYPES[dtype_name]
    inputs, kwargs = case.inputs(graph.n_src, torch.device("cuda"), args.seed, dtype)
    fn = case.fn()
    with torch.no_grad():
        shape = fn(graph, *inputs, **kwargs).shape
    grad = torch.randn(shape, device="cuda", generator=torch.Generator("cuda").manual_seed(1)).to(dtype)
    # forced variants and the rule with tuning off (it is on by default): nothing else is timed
    envs = {v: {tuned.setting: v, "GNN_FASTPATH_TUNE": "0"} for v in tuned.variants}
    envs["rule"] = {"GNN_FASTPATH_TUNE": "0"}
    envs["tuned"] = {"GNN_FASTPATH_TUNE": "1", "GNN_FASTPATH_TUNE_CACHE": str(cache)}
    times: Dict[str, List[float]] = {k: [] for k in envs}
    step, clear = _step(fn, graph, inputs, kwargs, grad), _zero(inputs)
    for _ in range(args.rounds):
        for name, env in envs.items():
            _environ(env)
            tuning.forget()
            times[name].append(statistics.median(time_calls(step, args.warmup, args.iters, torch.device("cuda"),
                                                            before=clear)))
    _environ({"GNN_FASTPATH_TUNE": "1", "GNN_FASTPATH_TUNE_CACHE": str(cache)})
    tuning.forget()
    klass = tuned.klass(graph, case.width, dtype)
    chosen = [r for r in tuning.listing() if r["class"] == klass]
    _environ({})
    ms = {k: statistics.median(v) for k, v in times.items()}
    best = min(ms[v] for v in tuned.variants)
    return {"graph": gname, "op": op, "shape": case.label, "dtype": dtype_name, "rule": tuned.rule(graph),
            "tuned_choice": chosen[0]["choice"] if chosen else None,
            "tuner_times_ms": chosen[0]["times_ms"] if chosen else None, "class": klass,
            **{f"{k}_ms": v for k, v in ms.items()}, "rounds_ms": times,
            "variants": ", ".join(f"{v} {ms[v]:.3f}" for v in tuned.variants),
            "tuned_vs_best": ms["tuned"] / best, "rule_vs_best": ms["rule"] / best}


COLUMNS = ["graph", "op", "dtype", "variants", "rule", "rule_ms", "tuned_choice", "tuned_ms", "rule_vs_best",
           "tuned_vs_best"]
HEADERS = ["graph", "op", "dtype", "each variant forced: f+b ms", "rule picks", "rule ms", "tuner picks", "tuned ms",
           "rule / best", "tuned / best"]


def markdown(payload: dict) -> str:
    fm = {c: fmt for c in COLUMNS if c.endswith("_ms") or c.endswith("_best")}
    return "\n".join(["### Tuned backward variants (forward + backward step, ms)", "",
                      report.env_header(payload["environment"]), "",
                      f"{payload['settings']['rounds']} rounds of {payload['settings']['iters']} timed steps after "
                      f"{payload['settings']['warmup']} warm-ups, variants alternating; median of round medians.", "",
                      report.markdown_table(payload["rows"], COLUMNS, HEADERS, fm), ""])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--graphs", default="tolokers,arxiv-like,arxiv-skewdst,roads-like")
    p.add_argument("--ops", default=",".join(TUNED_OPS))
    p.add_argument("--dtypes", default="float32")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--json-out", default=None)
    p.add_argument("--md", default=None)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_tuning needs a CUDA GPU", file=sys.stderr)
        return 2
    import gnn_fastpath

    rows = []
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    with tempfile.TemporaryDirectory() as tmp:
        for gname in args.graphs.split(","):
            bg = G.load(gname, data_dir=args.data_dir, device="cuda", seed=args.seed)
            graph = gnn_fastpath.Graph.from_edge_index(bg.edge_index, bg.num_nodes)
            for op in args.ops.split(","):
                for dtype_name in parse_dtypes(args.dtypes):
                    row = run_case(graph, gname, op, dtype_name, args, Path(tmp) / "tuning.json")
                    rows.append(row)
                    print("  " + " ".join(f"{k}={fmt(row[k]) if isinstance(row[k], float) else row[k]}"
                                          for k in COLUMNS), flush=True)
            del graph, bg
            torch.cuda.empty_cache()
    payload = {"benchmark": "tuning", "environment": report.environment(), "started": started,
               "settings": {k: getattr(args, k) for k in ("graphs", "ops", "dtypes", "rounds", "warmup", "iters")},
               "rows": rows}
    text = markdown(payload)
    report.publish(payload, text, args.json_out, args.md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
