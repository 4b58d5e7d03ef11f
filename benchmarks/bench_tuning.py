"""Do the rules and the tuner pick the faster kernel variant, and what does tuning cost a
training run? One process, one device call, two parts.

**Ops** (per graph, op and dtype): the forward + backward step timed with each variant forced
(``GNN_FASTPATH_{DOT,GAT,GATV2}_BWD``: the attention backwards; ``GNN_FASTPATH_SR_CHUNKS``: the
min/max forward's feature chunks; ``GNN_FASTPATH_SR_BWD``: its backward's atomic or
source-major scatter; ``GNN_FASTPATH_SR_SCATTER``: the atomic scatter's order, a rule the tuner
does not refine), with the rule (nothing forced; these runs have ``GNN_FASTPATH_TUNE=0``) and
tuned (``GNN_FASTPATH_TUNE=1``, a fresh choices file, the race allowed at the class's first
call: the tuner's converged pick).
Variants alternate within each round and the rounds repeat, so clock and thermal drift hit all
of them alike; the table shows the median over rounds of each round's median, what the rule
and the tuner took, rule / best and tuned / best (1.00 = the fastest forced variant), what the
race cost (ms, extra calls: ``gnn_fastpath.stats(tuning=True)``) and after how many calls of
the class the default budget lets it run (the probe's ``t_rule``, :mod:`gnn_fastpath.tuning`).

**Training** (``--train-graph``, default tolokers; ``--train-layers``, default GATv2Conv and
TransformerConv, 3 layers of hidden 64 x 4 heads, fp32, benchmarks/training.py's model): ``--train-steps``
(15) steps timed one by one from the first, no warm-up, each run on a fresh copy of the graph
(nothing cached from the run before), fresh parameters (the same initial ones) and a fresh
tuner (``tuning.forget()``, as a new process), for: ``empty`` (a fresh choices file),
``warm`` (a file the same model's classes were raced into beforehand), ``TUNE=0`` (the
rules) and every backward variant forced (``TUNE=0``); and ``--long-steps`` (150) steps of
``empty`` and ``TUNE=0`` (long enough for the default budget to run the race on tolokers).
Every configuration runs once untimed first (compiles every variant's kernels), then
``--train-rounds`` rounds in a rotating order. Per configuration: median step, total time of
the run, and what ``gnn_fastpath.stats(tuning=True)`` reports (tuning ms, extra calls, each
class's state).

::

    python -m benchmarks.bench_tuning --graphs tolokers,arxiv-like,arxiv-skewdst,roads-like,pokec-like \\
        --dtypes float32,bfloat16 --json-out bench_tuning.json --md bench_tuning.md

Settings are read per call (gnn_fastpath.config), so one process can switch between them.
``--time-budget`` (seconds) skips the op cases left once it is spent (reported as not run);
the training part runs first.
"""
from __future__ import annotations

import argparse
import importlib
import itertools
import math
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional

import torch

from . import graphs as G
from . import harness as H
from .harness import DTYPES, fmt, free_memory, is_oom, parse_dtypes, time_calls
from .op_cases import OPS


def _module(name):
    return importlib.import_module(f"gnn_fastpath.cuda.{name}")


@dataclass(frozen=True)
class Tuned:
    """One tuned decision of an op: the setting that forces a variant, its variants on a graph
    (``variants(graph)``), the rule's pick (``rule(graph, dtype, inputs)``, asked after the
    graph outlived a step), the size class the launcher names the call by
    (``klass(graph, width, dtype)``) and the op case (op_cases.OPS) it is timed on (default:
    the decision's own name)."""
    setting: str
    variants: Callable
    rule: Callable
    klass: Callable
    case: str = ""
    tuned: bool = True   # False: a rule the tuner does not refine (no tuned run)


def _dot_rule(g, dtype, inputs):
    dot = _module("dot_attention")
    q, k, v = (t.detach() for t in inputs[:3])
    block = dot.block_offered(g, q, k, v, None, 0.0, False, None, 0, backward=True)
    return dot.backward_mode(g, block, dtype)


def _dot_variants(g, dtype, inputs):
    dot = _module("dot_attention")
    q, k, v = (t.detach() for t in inputs[:3])
    block = dot.block_offered(g, q, k, v, None, 0.0, False, None, 0, backward=True)
    return dot.BACKWARDS if block else dot.BACKWARDS[:2]


def _gatv2_variants(g, dtype, inputs):
    return ("atomic", "transposed", "fused") if g.is_symmetric() else ("atomic", "transposed")


def _gatv2_class(g, width, dt):
    return _module("gatv2_attention").backward_class(g, width, dt, g.is_symmetric())


TUNED_OPS = {
    "dot_attention": Tuned("GNN_FASTPATH_DOT_BWD", _dot_variants, _dot_rule,
                           lambda g, width, dt: _module("dot_attention").backward_class(g, width, dt)),
    "gat_attention": Tuned("GNN_FASTPATH_GAT_BWD", lambda g, dt, ins: ("atomic", "transposed"),
                           lambda g, dt, ins: _module("gat_attention").backward_mode(g, dt),
                           lambda g, width, dt: _module("gat_attention").backward_class(g, width, dt)),
    "gatv2_attention": Tuned("GNN_FASTPATH_GATV2_BWD", _gatv2_variants,
                             lambda g, dt, ins: _module("gatv2_attention").backward_mode(g, dt), _gatv2_class),
    # the forward's feature chunks per lane (the step's backward takes the rule's count)
    "segment_reduce": Tuned("GNN_FASTPATH_SR_CHUNKS", lambda g, dt, ins: ("1", "2", "4"),
                            lambda g, dt, ins: str(_module("segment_reduce").rule_chunks(g, dt)),
                            lambda g, width, dt: _module("segment_reduce").forward_class(g, width, dt, dt, True)),
    # the backward's scatter of single winners: atomics or the source-major pass
    "segment_reduce.backward": Tuned("GNN_FASTPATH_SR_BWD", lambda g, dt, ins: ("atomic", "transposed"),
                                     lambda g, dt, ins: _module("segment_reduce").backward_mode(g, "split"),
                                     lambda g, width, dt: _module("segment_reduce").backward_class(g, width, dt, dt),
                                     case="segment_reduce"),
    # the atomic scatter's order (rows, or feature slices with hub copies): a rule, not tuned
    "segment_reduce.scatter": Tuned("GNN_FASTPATH_SR_SCATTER", lambda g, dt, ins: ("rows", "slices"),
                                    lambda g, dt, ins: _module("segment_reduce").scatter_order(
                                        g, ins[0].shape[1], ins[0].device),
                                    lambda g, width, dt: "", case="segment_reduce", tuned=False),
}
#: The training part's layers: training.py's layer key, the setting forcing the backward of its
#: tuned op, the variants (GATv2's fused one needs an undirected graph: tolokers is).
TRAIN_LAYERS = {"gatv2": ("GNN_FASTPATH_GATV2_BWD", ("atomic", "transposed", "fused")),
                "transformer": ("GNN_FASTPATH_DOT_BWD", ("atomic", "transposed")),
                "sage_max": ("GNN_FASTPATH_SR_BWD", ("atomic", "transposed"))}
#: The decision (the first part of a size class) each op case is about.
DECISIONS = {"dot_attention": "dot_attention.backward", "gat_attention": "gat_attention.backward",
             "gatv2_attention": "gatv2_attention.backward", "segment_reduce": "segment_reduce.forward",
             "segment_reduce.backward": "segment_reduce.backward", "segment_reduce.scatter": None}
#: Graphs with more edges than this get ``--big-warmup`` / ``--big-iters`` (pokec-like: the
#: step is tens of ms, and what is timed is the kernels, not host gaps).
BIG_EDGES = 10_000_000
SETTINGS = ("GNN_FASTPATH_TUNE", "GNN_FASTPATH_TUNE_CACHE") + tuple(t.setting for t in TUNED_OPS.values())


def _environ(values: Dict[str, str]) -> None:
    """The tuning-related settings exactly as ``values`` (the others unset)."""
    for name in SETTINGS:
        os.environ.pop(name, None)
    os.environ.update(values)


class _Free:
    """Within the block, a race runs at its class's first call (``tuning.FREE_MS`` unbounded):
    the tuner's converged pick and what its race costs, without waiting for the allowance."""

    def __enter__(self):
        from gnn_fastpath import tuning

        self.saved = tuning.FREE_MS
        tuning.FREE_MS = float("inf")

    def __exit__(self, *exc):
        from gnn_fastpath import tuning

        tuning.FREE_MS = self.saved


def calls_before_race(t_rule: Optional[float], n_variants: int, probe_ms: Optional[float] = None) -> Optional[int]:
    """Calls of a class after which the default budget lets its race run (the first n with
    FREE_MS + SHARE x n x t_rule - probe >= the race's estimate; probe default 2 x t_rule)."""
    from gnn_fastpath import tuning

    if not t_rule or n_variants < 2:
        return None
    probe = 2 * t_rule if probe_ms is None else probe_ms
    need = tuning.race_estimate_ms(t_rule, n_variants) - tuning.FREE_MS + probe
    return 1 if need <= 0 else max(1, math.ceil(need / (tuning.SHARE * t_rule)))


# ----------------------------------------------------------------------------- ops
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
    import gnn_fastpath
    from gnn_fastpath import tuning

    _environ({})
    device = torch.device(args.device)
    tuned = TUNED_OPS[op]
    case = OPS[tuned.case or op]
    dtype = DTYPES[dtype_name]
    inputs, kwargs = case.inputs(graph.n_src, device, args.seed, dtype)
    fn = case.fn()
    with torch.no_grad():
        shape = fn(graph, *inputs, **kwargs).shape
    grad = torch.randn(shape, device=device, generator=torch.Generator(device).manual_seed(1)).to(dtype)
    step, clear = _step(fn, graph, inputs, kwargs, grad), _zero(inputs)
    _environ({"GNN_FASTPATH_TUNE": "0"})
    clear(), step()
    clear(), step()  # the graph outlived a step: the rules and variants that wait for it apply
    variants = tuple(tuned.variants(graph, dtype, inputs))
    # forced variants and the rule with tuning off (it is on by default): nothing else is timed
    envs = {v: {tuned.setting: v, "GNN_FASTPATH_TUNE": "0"} for v in variants}
    envs["rule"] = {"GNN_FASTPATH_TUNE": "0"}
    if tuned.tuned:
        envs["tuned"] = {"GNN_FASTPATH_TUNE": "1", "GNN_FASTPATH_TUNE_CACHE": str(cache)}
    big = graph.num_edges > BIG_EDGES
    warmup, iters = (args.big_warmup, args.big_iters) if big else (args.warmup, args.iters)
    times: Dict[str, List[float]] = {k: [] for k in envs}
    race = None
    for _ in range(args.rounds):
        for name, env in envs.items():
            _environ(env)
            if name == "tuned" and race is None:
                tuning.forget()  # a fresh tuner on a fresh file: this call's class races now
                gnn_fastpath.reset_stats()
                with _Free():
                    times[name].append(statistics.median(time_calls(step, warmup, iters, device, before=clear)))
                race = gnn_fastpath.stats(tuning=True)["tuning"]
                continue
            times[name].append(statistics.median(time_calls(step, warmup, iters, device, before=clear)))
    klass = tuned.klass(graph, case.width, dtype)
    classes = (race or {}).get("classes", {})
    # the launcher's class (block-sparse dot attention names its own): the one of this decision
    found = [k for k, e in classes.items() if DECISIONS[op] and e["op"] == DECISIONS[op]]
    klass = klass if klass in classes or len(found) != 1 else found[0]
    entry = classes.get(klass, {})
    rule = tuned.rule(graph, dtype, inputs)
    _environ({})
    ms = {k: statistics.median(v) for k, v in times.items()}
    best_name = min(variants, key=lambda v: ms[v])
    best = ms[best_name]
    return {"graph": gname, "op": op, "shape": case.label, "dtype": dtype_name, "rule": rule,
            "best": best_name, "tuned_choice": entry.get("choice"), "tuner_times_ms": entry.get("times_ms"),
            "class": klass, **{f"{k}_ms": v for k, v in ms.items()}, "rounds_ms": times,
            "variants": ", ".join(f"{v} {ms[v]:.3f}" for v in variants),
            "tuned_vs_best": ms["tuned"] / best if "tuned" in ms else None, "rule_vs_best": ms["rule"] / best,
            "warmup": warmup, "iters": iters,
            # the pick against the best, both forced (the same runs): the 5% criterion
            "rule_pick_vs_best": ms[rule] / best if rule in ms else None,
            "tuned_pick_vs_best": ms[entry["choice"]] / best if entry.get("choice") in ms else None,
            "rule_within_5pct": rule in ms and ms[rule] <= 1.05 * best,
            "race_ms": entry.get("ms"), "race_trials": entry.get("trials"), "t_rule_ms": entry.get("t_rule_ms"),
            "race_after_calls": calls_before_race(entry.get("t_rule_ms"), len(variants)),
            "tuning_report": race}


COLUMNS = ["graph", "op", "dtype", "variants", "best", "rule", "rule_pick_vs_best", "rule_ms", "rule_vs_best",
           "tuned_choice", "tuned_pick_vs_best", "tuned_ms", "tuned_vs_best", "race_ms", "race_trials",
           "race_after_calls"]
HEADERS = ["graph", "op", "dtype", "each variant forced: f+b ms", "fastest", "rule picks", "its forced / best",
           "rule run ms", "rule run / best", "tuner picks", "its forced / best", "tuned run ms", "tuned run / best",
           "race ms (probe incl.)", "extra calls", "default budget: race after calls"]


# ----------------------------------------------------------------------------- training
@dataclass(frozen=True)
class TrainConfig:
    name: str
    env: Dict[str, str]
    steps: int
    cache: str = ""      # "fresh": a new empty choices file per run; "warm": the primed file


def train_configs(layer: str, steps: int, long_steps: int) -> List[TrainConfig]:
    setting, variants = TRAIN_LAYERS[layer]
    out = [TrainConfig("empty", {"GNN_FASTPATH_TUNE": "1"}, steps, "fresh"),
           TrainConfig("warm", {"GNN_FASTPATH_TUNE": "1"}, steps, "warm"),
           TrainConfig("TUNE=0", {"GNN_FASTPATH_TUNE": "0"}, steps)]
    out += [TrainConfig(f"forced {v}", {setting: v, "GNN_FASTPATH_TUNE": "0"}, steps) for v in variants]
    if long_steps:
        out += [TrainConfig(f"empty, {long_steps} steps", {"GNN_FASTPATH_TUNE": "1"}, long_steps, "fresh"),
                TrainConfig(f"TUNE=0, {long_steps} steps", {"GNN_FASTPATH_TUNE": "0"}, long_steps)]
    return out


def _class_summary(rep: Optional[dict]) -> str:
    """'op (state, calls, extra calls, ms; choice)' per tuned class of a run's report."""
    if not rep:
        return ""
    parts = []
    for klass, e in rep.get("classes", {}).items():
        bits = [e["state"], f"{e['calls']} calls", f"{e['trials']} extra", f"{e['ms']:.2f} ms"]
        if e.get("choice"):
            bits.append(f"-> {e['choice']}")
        elif e.get("race_estimate_ms") is not None:
            bits.append(f"race {e['race_estimate_ms']:.1f} ms > allowance {e['allowance_ms']:.1f}")
        width = next((p for p in klass.split("|") if p.startswith("width")), "")
        parts.append(f"{e['op']} [{width}] ({', '.join(bits)})")
    return "; ".join(parts)


class Trainer:
    """The training part for one graph: data, the models' shared initial weights, runs."""

    def __init__(self, args, tmp: Path):
        from . import training
        from .harness import import_pyg

        self.bt = training
        self.args = args
        self.tmp = tmp
        self.device = torch.device(args.device)
        self.pyg = import_pyg()
        self.data = training.load_data(args.train_graph, self.device, args.seed, args.scale, args.data_dir)
        self.init: Dict[str, dict] = {}
        self.runs = 0

    def model(self, layer: str):
        m = self.bt.Net(self.pyg, layer, self.data.meta["in_features"], self.data.meta["classes"], hidden=64,
                        heads=4, gcn_cached=False)
        if layer not in self.init:
            self.init[layer] = {k: v.clone() for k, v in m.state_dict().items()}
        m.load_state_dict(self.init[layer])
        return m.to(self.device).train()

    def run(self, layer: str, cfg: TrainConfig, cache: Optional[Path], free: bool = False) -> dict:
        """One run of ``cfg``: a fresh graph copy, model, optimizer and tuner; steps timed one by one."""
        import torch.nn.functional as F

        import gnn_fastpath
        from gnn_fastpath import tuning

        env = dict(cfg.env)
        if cache is not None:
            env["GNN_FASTPATH_TUNE_CACHE"] = str(cache)
        _environ(env)
        tuning.forget()  # as a new process: the tuner's state and budget start over
        model = self.model(layer)
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        x, y = self.data.x, self.data.y
        edge_index = self.data.edge_index.clone()  # a new framework graph: nothing cached from the last run
        gnn_fastpath.reset_stats()
        torch.manual_seed(self.args.seed)

        def step():
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x, edge_index), y)
            loss.backward()
            opt.step()

        saved = tuning.FREE_MS
        if free:
            tuning.FREE_MS = float("inf")
        try:
            cpu = {} if self.device.type == "cuda" else {"cpu": "reference"}  # a CPU smoke run: the shims
            with gnn_fastpath.enabled(frameworks="pyg", **cpu):
                times = time_calls(step, 0, cfg.steps, self.device)
            stats = gnn_fastpath.stats(tuning=True)
        finally:
            tuning.FREE_MS = saved
            _environ({})
        self.runs += 1
        rep = stats.pop("tuning")
        fused = {b: sum(e["fused"][b] for e in stats.values()) for b in ("cuda", "reference")}
        fallback = {r: n for e in stats.values() for r, n in e["fallback"].items()}
        del model, opt
        return {"steps": cfg.steps, "step_ms_all": [round(t, 4) for t in times], "step_ms": statistics.median(times),
                "total_ms": sum(times), "first_ms": times[0] if times else None,
                "tuning_ms": rep["ms"], "tuning_trials": rep["trials"], "tuning_classes": rep["classes"],
                "tuning": _class_summary(rep), "fused": fused, "fallback": fallback}

    def layer_rows(self, layer: str) -> List[dict]:
        args = self.args
        configs = train_configs(layer, args.train_steps, args.long_steps)
        warm = self.tmp / f"warm_{layer}.json"
        # compile every variant's kernels and fill the warm file: the forced runs, then a run
        # whose races run at their classes' first calls into the warm file
        for cfg in configs:
            if cfg.cache == "" and cfg.steps == args.train_steps:
                self.run(layer, TrainConfig(cfg.name, cfg.env, 3), None)
        primed = self.run(layer, TrainConfig("prime", {"GNN_FASTPATH_TUNE": "1"}, 3), warm, free=True)
        results: Dict[str, List[dict]] = {c.name: [] for c in configs}
        for r in range(args.train_rounds):
            order = configs[r % len(configs):] + configs[:r % len(configs)]
            for cfg in order:
                cache = {"fresh": self.tmp / f"fresh_{layer}_{self.runs}.json", "warm": warm}.get(cfg.cache)
                results[cfg.name].append(self.run(layer, cfg, cache))
        rows = []
        for cfg in configs:
            runs = results[cfg.name]
            row = {"graph": args.train_graph, "layer": layer, "config": cfg.name, "steps": cfg.steps,
                   "step_ms": statistics.median(r["step_ms"] for r in runs),
                   "total_ms": statistics.median(r["total_ms"] for r in runs),
                   "first_ms": statistics.median(r["first_ms"] for r in runs),
                   "tuning_ms": statistics.median(r["tuning_ms"] for r in runs),
                   "tuning_trials": statistics.median(r["tuning_trials"] for r in runs),
                   "tuning": runs[-1]["tuning"], "runs": runs,
                   "warm_file": primed["tuning"] if cfg.cache == "warm" else None}
            rows.append(row)
        forced = [r for r in rows if r["config"].startswith("forced")]
        best = min(forced, key=lambda r: r["step_ms"]) if forced else None
        by_steps: Dict[int, float] = {r["steps"]: r["total_ms"] for r in rows if r["config"].startswith("TUNE=0")}
        for r in rows:
            r["best_forced"] = best["config"] if best else None
            r["step_vs_best_forced"] = r["step_ms"] / best["step_ms"] if best else None
            base = by_steps.get(r["steps"])
            r["total_vs_tune0"] = r["total_ms"] / base if base else None
        return rows


TRAIN_COLUMNS = ["layer", "config", "steps", "step_ms", "step_vs_best_forced", "first_ms", "total_ms",
                 "total_vs_tune0", "tuning_ms", "tuning_trials", "tuning"]
TRAIN_HEADERS = ["layer", "config", "steps", "median step ms", "/ best forced step", "first step ms", "run total ms",
                 "total / TUNE=0 total", "tuning ms", "extra calls", "tuner (last round)"]


# ----------------------------------------------------------------------------- output
def markdown(payload: dict) -> str:
    s = payload["settings"]
    fm = {c: fmt for c in COLUMNS if c.endswith("_ms") or c.endswith("_best")}
    fm["race_trials"] = lambda v: "" if v is None else str(v)
    tm = {c: fmt for c in TRAIN_COLUMNS if c.endswith("_ms") or c.startswith("step_vs") or c.startswith("total_vs")}
    lines = ["### Rules and tuner against every variant, and what tuning costs", "",
             H.env_header(payload["environment"]), "",
             f"Tuner constants: SHARE {payload['tuner']['SHARE']}, FREE_MS {payload['tuner']['FREE_MS']}, "
             f"BUDGET_MS {payload['tuner']['BUDGET_MS']}, ROUNDS {payload['tuner']['ROUNDS']}, "
             f"CALLS {payload['tuner']['CALLS']}, CLEAR {payload['tuner']['CLEAR']}, TIE {payload['tuner']['TIE']}.",
             ""]
    if payload.get("train"):
        lines += [f"#### Training, {s['train_graph']} full batch, 3 layers hidden 64 x 4 heads, fp32 "
                  f"({s['train_rounds']} rounds, median; each run from its first step, no warm-up)", "",
                  H.markdown_table(payload["train"], TRAIN_COLUMNS, TRAIN_HEADERS, tm), ""]
    if payload.get("rows"):
        lines += ["#### Ops: forward + backward step, ms", "",
                  f"{s['rounds']} rounds of {s['iters']} timed steps after {s['warmup']} warm-ups ({s['big_iters']} "
                  f"after {s['big_warmup']} on graphs of more than {BIG_EDGES:,} edges), variants "
                  "alternating; median of round medians. 'tuned': a fresh tuner whose race runs at the class's "
                  "first call; 'race after calls': when the default budget would let it run.", "",
                  H.markdown_table(payload["rows"], COLUMNS, HEADERS, fm), ""]
        missed = [r for r in payload["rows"] if not r.get("rule_within_5pct")]
        lines += ["Rule's pick more than 5% off the fastest variant (both forced): " + (
            "; ".join(f"{r['graph']} {r['op']} {r['dtype']} ({r['rule']} {fmt(r['rule_pick_vs_best'])}x, "
                      f"fastest {r['best']})" for r in missed) or "none") + ".", ""]
    if payload.get("skipped"):
        lines += ["Not run (time budget or error): " + "; ".join(payload["skipped"]), ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--graphs", default="tolokers,arxiv-like,arxiv-skewdst,roads-like,pokec-like")
    p.add_argument("--ops", default=",".join(TUNED_OPS))
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--big-warmup", type=int, default=1, help=f"warm-ups on graphs of more than {BIG_EDGES:,} edges")
    p.add_argument("--big-iters", type=int, default=3, help=f"timed steps on graphs of more than {BIG_EDGES:,} edges")
    p.add_argument("--train-graph", default="tolokers")
    p.add_argument("--train-layers", default="gatv2,transformer", help="'' for no training part")
    p.add_argument("--train-steps", type=int, default=15)
    p.add_argument("--long-steps", type=int, default=150, help="0: no long runs")
    p.add_argument("--train-rounds", type=int, default=3)
    p.add_argument("--time-budget", type=float, default=230.0, help="seconds; op cases left after it are skipped")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda", help="cpu: a smoke run of the plumbing (reference ops, nothing tuned)")
    p.add_argument("--scale", type=float, default=1.0, help="synthetic graphs' scale (smoke runs)")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--json-out", default=None)
    p.add_argument("--md", default=None)
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench_tuning needs a CUDA GPU (--device cpu: a smoke run)", file=sys.stderr)
        return 2
    import gnn_fastpath
    from gnn_fastpath import tuning

    t0 = time.monotonic()
    env = H.environment()
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    constants = {k: getattr(tuning, k) for k in ("SHARE", "FREE_MS", "BUDGET_MS", "ROUNDS", "CALLS", "CLEAR", "TIE")}
    payload = {"benchmark": "tuning", "environment": env, "started": started, "tuner": constants,
               "settings": {k: getattr(args, k) for k in ("graphs", "ops", "dtypes", "rounds", "warmup", "iters",
                                                          "big_warmup", "big_iters",
                                                          "train_graph", "train_layers", "train_steps", "long_steps",
                                                          "train_rounds", "time_budget")},
               "train": [], "rows": [], "skipped": []}

    def save():
        if args.json_out:
            H.write_json(args.json_out, payload)

    case_ids = itertools.count()
    with tempfile.TemporaryDirectory() as tmp:
        layers = [layer for layer in args.train_layers.split(",") if layer]
        if layers:
            trainer = Trainer(args, Path(tmp))
            for layer in layers:
                try:
                    rows = trainer.layer_rows(layer)
                except Exception as exc:  # noqa: BLE001 - a failed part is reported, the rest runs
                    payload["skipped"].append(f"training {layer}: {type(exc).__name__}: {str(exc)[:300]}")
                    print(payload["skipped"][-1], flush=True)
                    continue
                payload["train"] += rows
                for r in rows:
                    print("  train " + " ".join(f"{k}={fmt(r[k]) if isinstance(r[k], float) else r[k]}"
                                                for k in TRAIN_COLUMNS), flush=True)
                save()
            del trainer
            free_memory()
        for gname in [g for g in args.graphs.split(",") if g]:
            if time.monotonic() - t0 > args.time_budget:
                payload["skipped"].append(f"{gname}: every op (time budget)")
                continue
            scale = 1.0 if gname in G.REAL else args.scale
            bg = G.load(gname, data_dir=args.data_dir, device=args.device, seed=args.seed, scale=scale)
            graph = gnn_fastpath.Graph.from_edge_index(bg.edge_index, bg.num_nodes)
            for op in args.ops.split(","):
                for dtype_name in parse_dtypes(args.dtypes):
                    label = f"{gname} {op} {dtype_name}"
                    if time.monotonic() - t0 > args.time_budget:
                        payload["skipped"].append(f"{label} (time budget)")
                        continue
                    try:
                        row = run_case(graph, gname, op, dtype_name, args, Path(tmp) / f"tuning_{next(case_ids)}.json")
                    except Exception as exc:  # noqa: BLE001 - OOM and errors are results
                        why = "OOM" if is_oom(exc) else f"{type(exc).__name__}: {str(exc)[:300]}"
                        payload["skipped"].append(f"{label} ({why})")
                        print(f"  {label}: {why}", flush=True)
                        _environ({})
                        free_memory()
                        continue
                    payload["rows"].append(row)
                    print("  " + " ".join(f"{k}={fmt(row.get(k)) if isinstance(row.get(k), float) else row.get(k)}"
                                          for k in COLUMNS), flush=True)
                    save()
            del graph, bg
            free_memory()
    payload["wall_s"] = round(time.monotonic() - t0, 1)
    text = markdown(payload)
    H.publish(payload, text, args.json_out, args.md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
