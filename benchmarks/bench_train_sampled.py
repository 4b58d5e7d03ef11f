"""Sampled mini-batch training steps: stock PyG / DGL against ``gnn_fastpath.enabled()``, with
PyG's ``NeighborLoader`` and DGL's ``NeighborSampler`` (fan-outs 15/10/5, graph on the CPU),
fp32 and 16-bit autocast (the sampled-training targets first).

    python -m benchmarks.bench_train_sampled --time-budget 400 --profile-phases
    python -m benchmarks.bench_train_sampled --samplers pyg --graphs arxiv-like --batch-sizes 1024 \
        --layers gatv2,sage_max --dtypes fp32 --workers 8 --profile-phases all
    python -m benchmarks.bench_train_sampled --quick --samplers pyg --no-whole --pad-batches   # fixed-size batches

Per config (graph, layer, dtype, mode, sampler, batch size): the *model step* (a pre-sampled
batch moved to the GPU as new tensors outside the timing; graph build + forward + loss on the
seeds + backward + optimizer, CUDA events), the *whole step* with the real loader (worker
processes) and the loader alone, so a table can say when sampling bounds the step; optionally
a per-phase profile (:mod:`benchmarks.sampling`). The sampled targets (``SAMPLED_TARGETS``) run
first and are reported met / missed. Results: ``--json`` (default
``benchmarks/results/bench_train_sampled.json``) and ``--markdown``, rewritten after every
config. Prints the tables; exits 0 without PyG.
"""
from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from . import harness as H
from .harness import OOM, SHORT, fmt
from .sampling import (FANOUTS, PAIRED, PAIRED_BLOCK, SAMPLERS, DGL_LAYERS, SampledConfig, SampledRunner, add_sampled_args,
                       finish_sampled_args, run_sampled_configs, sampled_layer_label, sampled_settings)
from .training import (DTYPE_NAMES, LAYER_LABELS, LAYERS, MODES, _fmt_or_status, _ms, _ratio, add_common_args,
                       common_settings, finish_common_args, is_compiled, is_sampled, path_summary)

NAME = "bench_train_sampled"
SAMPLED_GRAPHS = ["arxiv-like", "pokec-like"]

CPU_SAMPLED_GRAPHS = ["arxiv-like"]


# ----------------------------------------------------------------------------- targets
@dataclass(frozen=True)
class SampledTarget:
    """A sampled-training target of the issue: stock / enabled *model step* (the sampled batch
    already on the GPU) >= ``bound`` for (graph, layer, batch size) with ``sampler``, ``dtype``."""

    graph: str
    layer: str
    batch_size: int
    bound: float
    sampler: str = "pyg"
    dtype: str = "float32"

    @property
    def text(self) -> str:
        return (f"{self.graph} batch {self.batch_size} {LAYER_LABELS[self.layer]} ({self.sampler} sampler, "
                f"{SHORT[self.dtype]}): model step enabled >= {self.bound:g}x faster than stock")

    def configs(self) -> List[SampledConfig]:
        return [(self.graph, self.layer, self.dtype, m, self.sampler, self.batch_size) for m in ("enabled", "stock")]


SAMPLED_TARGETS = [
    SampledTarget("arxiv-like", "gatv2", 1024, 2.5),
    SampledTarget("arxiv-like", "transformer", 1024, 2.5),
    SampledTarget("arxiv-like", "sage_max", 1024, 1.5),
    SampledTarget("arxiv-like", "gcn", 1024, 1.5),
    SampledTarget("pokec-like", "gatv2", 4096, 4.0),
    SampledTarget("pokec-like", "transformer", 4096, 4.0),
]


def plan_sampled(graphs: Sequence[str], layers: Sequence[str], dtypes: Sequence[str], samplers: Sequence[str],
                 batch_sizes: Sequence[int]) -> List[SampledConfig]:
    """Every sampled config to run. The targets' configs first; then the rest, those sharing
    the targets' (graph, batch size) with the PyG sampler, then with DGL's, then the others;
    inside a tier grouped by (graph, sampler, batch size), the group measured last first,
    so a loader is built (and its batches pre-sampled) as few times as possible."""
    wanted = [(g, l, d, m, s, b) for g in graphs for s in samplers for b in batch_sizes for l in layers
              for d in dtypes for m in MODES if not (s == "dgl" and l not in DGL_LAYERS)]
    first = [c for t in SAMPLED_TARGETS for c in t.configs() if c in wanted]
    target_cases = {(t.graph, t.batch_size) for t in SAMPLED_TARGETS}
    last = (first[-1][0], first[-1][4], first[-1][5]) if first else None
    index = {c: i for i, c in enumerate(wanted)}
    group_order: Dict[Tuple[str, str, int], int] = {}
    for c in wanted:
        group_order.setdefault((c[0], c[4], c[5]), len(group_order))

    def key(c: SampledConfig):
        g, _, _, _, s, b = c
        tier = (0 if s == "pyg" else 1) if (g, b) in target_cases else 2
        group = (g, s, b)
        return tier, group != last, group_order[group], index[c]

    return first + sorted((c for c in wanted if c not in first), key=key)


def alternate_rounds(configs: Sequence[SampledConfig], rounds: int) -> List[SampledConfig]:
    """``configs`` with each stock/enabled pair (adjacent, same config but the mode) run
    ``rounds`` times in a row, the order of the two flipped every round: whichever mode runs
    first in a warm process (or right after a loader is built) has no lasting advantage."""
    out: List[SampledConfig] = []
    i = 0
    while i < len(configs):
        pair = list(configs[i:i + 2])
        if len(pair) == 2 and pair[0][:3] + pair[0][4:] != pair[1][:3] + pair[1][4:]:
            pair = pair[:1]
        for r in range(rounds):
            out.extend(pair if r % 2 == 0 else pair[::-1])
        i += len(pair)
    return out


def paired_configs(configs: Sequence[SampledConfig]) -> List[SampledConfig]:
    """``configs`` with each stock/enabled pair as one :data:`~benchmarks.sampling.PAIRED`
    config (the two modes alternating in blocks of steps), in the order the stock configs had."""
    return [c[:3] + (PAIRED,) + c[4:] for c in configs if c[3] == "stock"]


def paired_rows(payload: dict) -> Tuple[List[dict], List[str], List[str]]:
    """One table row per paired config: the median per-block-pair ratio and how often enabled lost."""
    out = []
    for r in payload.get("rows", []):
        p = r.get("paired")
        if r.get("mode") != "enabled" or not p or not p.get("pairs"):
            continue
        out.append({"graph": r.get("graph"), "batch": r.get("batch_size"),
                    "layer": sampled_layer_label(r.get("sampler"), r.get("layer_key")),
                    "dtype": SHORT.get(r.get("dtype"), r.get("dtype")), "pairs": p["pairs"],
                    "x": f"{p['paired_x']:.3f}x", "slower": f"{100 * p['paired_enabled_slower']:.0f}%",
                    "path": "control: both sides stock" if p.get("control") else path_summary(r)})
    cols = ["graph", "batch", "layer", "dtype", "pairs", "x", "slower", "path"]
    heads = ["graph", "batch", "layer", "dtype", "block pairs", "median of stock / enabled per block pair",
             "block pairs where enabled was slower", "fused path (enabled)"]
    return out, cols, heads


def merge_rounds(rows: Sequence[dict]) -> List[dict]:
    """One row per config from rows run over several rounds (``round`` 1, 2, ...): the first
    round's row with ``step_ms``, ``host_ms``, ``whole_ms`` the medians over the rounds that
    measured them and ``rounds`` the per-round values (``step_ms_rounds``, ...)."""
    keys = ("graph", "layer_key", "dtype", "mode", "sampler", "batch_size", "compile")
    groups: Dict[tuple, List[dict]] = {}
    for r in rows:
        groups.setdefault(tuple(r.get(k) for k in keys), []).append(r)
    out = []
    for group in groups.values():
        if len(group) == 1:
            out.append(group[0])
            continue
        merged = dict(group[0])
        merged["rounds"] = len(group)
        for field in ("step_ms", "host_ms", "whole_ms"):
            values = [r.get(field) for r in group]
            merged[f"{field}_rounds"] = values
            measured = [v for v in values if isinstance(v, float)]
            if measured:
                merged[field] = statistics.median(measured)
        bad = [r.get("status") for r in group if r.get("status") != "ok"]
        if bad:
            merged["status"] = bad[0]
        out.append(merged)
    return out


def dominant_phase(phases: Optional[dict]) -> str:
    """What dominates the enabled model step, from ``--profile-phases``: the largest of graph
    build (cold minus warm step), optimizer, and, when kernel times were captured, the fwd+bwd
    kernels vs the host glue (fwd+bwd elapsed minus kernels: the GPU waiting for the host)."""
    if not phases or "warm" not in phases:
        return ""
    warm, build = phases["warm"], phases.get("build_ms", {}).get("total")
    parts: Dict[str, float] = {}
    if isinstance(build, float):
        parts["graph build"] = max(build, 0.0)
    if isinstance(warm.get("opt_ms"), float):
        parts["optimizer"] = warm["opt_ms"]
    fb = (warm.get("fwd_ms") or 0.0) + (warm.get("bwd_ms") or 0.0)
    km = phases.get("kernel_ms") or {}
    if isinstance(km.get("forward"), float) and isinstance(km.get("backward"), float):
        k = km["forward"] + km["backward"]
        parts["fwd+bwd kernels"] = k
        parts["fwd+bwd host glue"] = max(fb - k, 0.0)
    else:
        host = (warm.get("fwd_host_ms") or 0.0) + (warm.get("bwd_host_ms") or 0.0)
        parts["fwd+bwd (host-bound)" if host >= 0.9 * fb else "fwd+bwd (GPU-bound)"] = fb
    if not parts:
        return ""
    name = max(parts, key=parts.get)
    total = phases.get("cold", {}).get("total_ms")
    return f"{name} {parts[name]:.2f} ms" + (f" of {total:.2f}" if isinstance(total, float) else "")


def evaluate_sampled_targets(rows: Sequence[dict]) -> List[dict]:
    """Each of ``SAMPLED_TARGETS`` with the measured model-step speedup and ``met`` / ``missed``
    / ``not measured (...)``, the whole-step times, what bounds the step and, where phases were
    profiled, what dominates the enabled step."""
    by = {(r.get("graph"), r.get("layer_key"), r.get("dtype"), r.get("mode"), r.get("sampler"), r.get("batch_size")): r
          for r in rows if is_sampled(r) and not is_compiled(r)}
    out = []
    for t in SAMPLED_TARGETS:
        stock = by.get((t.graph, t.layer, t.dtype, "stock", t.sampler, t.batch_size))
        en = by.get((t.graph, t.layer, t.dtype, "enabled", t.sampler, t.batch_size))
        res = {"target": t.text, "kind": "sampled_speedup", "graph": t.graph, "layer": t.layer, "dtype": t.dtype,
               "sampler": t.sampler, "batch_size": t.batch_size, "bound": t.bound, "value": None}
        a, b = (stock or {}).get("step_ms"), (en or {}).get("step_ms")
        res["stock_ms"], res["enabled_ms"] = a if isinstance(a, float) else None, b if isinstance(b, float) else None
        if isinstance(a, float) and isinstance(b, float) and b > 0:
            res["value"] = a / b
            res["verdict"] = "met" if res["value"] >= t.bound else "missed"
        elif (stock or {}).get("status") == OOM and isinstance(b, float):
            res["verdict"] = "met (stock out of memory)"
        else:
            why = [f"{r.get('mode')}: {r.get('status')}" for r in (stock, en)
                   if r is not None and not isinstance(r.get("step_ms"), float)]
            if stock is None or en is None:
                why.append("config not run")
            res["verdict"] = "not measured (" + "; ".join(why) + ")"
        ws, we = (stock or {}).get("whole_ms"), (en or {}).get("whole_ms")
        res["whole_stock_ms"] = ws if isinstance(ws, float) else None
        res["whole_enabled_ms"] = we if isinstance(we, float) else None
        res["whole_x"] = ws / we if isinstance(ws, float) and isinstance(we, float) and we > 0 else None
        res["loader_ms"] = (en or stock or {}).get("loader_ms")
        res["bound_by"] = {m: r.get("bound") for m, r in (("stock", stock), ("enabled", en)) if r and r.get("bound")}
        res["dominant"] = dominant_phase((en or {}).get("phases"))
        if (en or stock or {}).get("padded"):
            res["padded"] = True  # measured on fixed-size (padded) batches: a compile run
        out.append(res)
    return out


# ----------------------------------------------------------------------------- markdown
def sampled_targets_table(targets: Sequence[dict]) -> str:
    rows = []
    for t in targets:
        bound = ", ".join(f"{m} {b}" for m, b in (t.get("bound_by") or {}).items())
        rows.append({"target": t["target"] + (" [padded batches]" if t.get("padded") else ""),
                     "stock": _ms(t.get("stock_ms")), "enabled": _ms(t.get("enabled_ms")),
                     "value": "" if t.get("value") is None else f"{t['value']:.2f}x", "verdict": t.get("verdict", ""),
                     "whole": " / ".join(_ms(t.get(k)) or "-" for k in ("whole_stock_ms", "whole_enabled_ms"))
                     if (t.get("whole_stock_ms") or t.get("whole_enabled_ms")) else "",
                     "whole_x": "" if t.get("whole_x") is None else f"{t['whole_x']:.2f}x",
                     "loader": _fmt_or_status(t.get("loader_ms")), "bound": bound, "dominant": t.get("dominant", "")})
    cols = ["target", "stock", "enabled", "value", "verdict", "whole", "whole_x", "loader", "bound", "dominant"]
    heads = ["target (sampled training)", "model step stock ms", "enabled ms", "measured", "verdict",
             "whole step stock / enabled ms", "x whole", "loader alone ms", "bound by", "dominant (enabled, phases)"]
    return H.markdown_table(rows, cols, heads)


def sampled_rows(payload: dict) -> Tuple[List[dict], List[str], List[str]]:
    """One table row per (graph, sampler, batch size, layer, dtype): model step and whole step,
    stock and enabled, the loader alone and what bounds each mode."""
    st = payload.get("settings", {})
    sampled = [r for r in payload.get("rows", []) if is_sampled(r) and not is_compiled(r)]
    by = {(r.get("graph"), r.get("sampler"), r.get("batch_size"), r.get("layer_key"), r.get("dtype"), r.get("mode")): r
          for r in sampled}
    graphs = (st.get("sampled") or {}).get("graphs") or SAMPLED_GRAPHS
    dtypes = st.get("dtypes") or DTYPE_NAMES
    keys = []
    for r in sampled:
        k = (r.get("graph"), r.get("sampler"), r.get("batch_size"), r.get("layer_key"), r.get("dtype"))
        if k not in keys:
            keys.append(k)
    keys.sort(key=lambda k: (graphs.index(k[0]) if k[0] in graphs else 99, SAMPLERS.index(k[1]) if k[1] in SAMPLERS else 9,
                             k[2] or 0, LAYERS.index(k[3]) if k[3] in LAYERS else 99,
                             dtypes.index(k[4]) if k[4] in dtypes else 9))
    out = []
    for g, s, b, l, d in keys:
        so, en = by.get((g, s, b, l, d, "stock"), {}), by.get((g, s, b, l, d, "enabled"), {})
        any_row = en or so
        nodes, edges = any_row.get("batch_nodes"), any_row.get("batch_edges")
        notes = []
        for mode, r in (("stock", so), ("enabled", en)):
            stt = r.get("status")
            if stt and stt not in ("ok", OOM):
                notes.append(f"{mode}: {stt[:90]}")
            elif r.get("finite_losses") is False:
                notes.append(f"{mode}: non-finite loss")
            ws = r.get("whole_status")
            if ws and ws != "ok":
                notes.append(f"{mode} whole: {ws[:60]}")
        out.append({
            "graph": g, "sampler": s, "batch": b, "layer": sampled_layer_label(s, l) if s else l, "dtype": SHORT.get(d, d),
            "sub": f"{nodes:,.0f} / {edges:,.0f}" if isinstance(nodes, (int, float)) and isinstance(edges, (int, float)) else "",
            "s_step": _fmt_or_status(so.get("step_ms")), "e_step": _fmt_or_status(en.get("step_ms")),
            "x": _ratio(so.get("step_ms"), en.get("step_ms")),
            "host": " / ".join(_ms(r.get("host_ms")) or "-" for r in (so, en)) if (so.get("host_ms") or en.get("host_ms")) else "",
            "s_whole": _fmt_or_status(so.get("whole_ms")), "e_whole": _fmt_or_status(en.get("whole_ms")),
            "xw": _ratio(so.get("whole_ms"), en.get("whole_ms")),
            "loader": _fmt_or_status(any_row.get("loader_ms")),
            "bound": " / ".join(r.get("bound") or "-" for r in (so, en)) if (so.get("bound") or en.get("bound")) else "",
            "peak": " / ".join(fmt(r.get("peak_mb"), 0) if r.get("peak_mb") is not None else "-" for r in (so, en)),
            "path": path_summary(en) if en else "", "notes": "; ".join(notes)})
    cols = ["graph", "sampler", "batch", "layer", "dtype", "sub", "s_step", "e_step", "x", "host", "s_whole", "e_whole",
            "xw", "loader", "bound", "peak", "path", "notes"]
    heads = ["graph", "sampler", "batch", "layer", "dtype", "nodes / edges per batch", "model step stock ms",
             "model step enabled ms", "x model", "host ms stock / enabled", "whole step stock ms", "whole step enabled ms",
             "x whole", "loader alone ms", "bound by (stock / enabled)", "peak MB stock / enabled",
             "fused path (enabled)", "notes"]
    return out, cols, heads


def phase_rows(payload: dict) -> Tuple[List[dict], List[str], List[str]]:
    """The ``--profile-phases`` breakdown, one row per profiled config."""
    out = []
    for r in payload.get("rows", []):
        ph = r.get("phases")
        if not is_sampled(r) or not ph:
            continue
        if "error" in ph:
            out.append({"config": f"{r['graph']} {r['sampler']} b{r['batch_size']} {r['layer']} "
                                  f"{SHORT.get(r['dtype'], r['dtype'])} {r['mode']}", "dominant": f"error: {ph['error'][:80]}"})
            continue
        warm, build, km = ph.get("warm", {}), ph.get("build_ms", {}), ph.get("kernel_ms") or {}

        def gh(k):
            return f"{_ms(warm.get(f'{k}_ms'))} / {_ms(warm.get(f'{k}_host_ms'))}"

        out.append({"config": f"{r['graph']} {r['sampler']} b{r['batch_size']} {r['layer']} {SHORT.get(r['dtype'], r['dtype'])} "
                              f"{r['mode']}",
                    "cold": _ms(ph.get("cold", {}).get("total_ms")), "warm": _ms(warm.get("total_ms")),
                    "build": " / ".join(_ms(build.get(k)) for k in ("fwd", "bwd")),
                    "fwd": gh("fwd"), "bwd": gh("bwd"), "opt": gh("opt"),
                    "kern": (" / ".join(_ms(km.get(k)) for k in ("forward", "backward", "optimizer"))
                             if "error" not in km and km else (km.get("error", "")[:40] if km else "")),
                    "loader": _fmt_or_status(r.get("loader_ms")),
                    "dominant": dominant_phase(ph) if r.get("mode") == "enabled" else ""})
    cols = ["config", "cold", "warm", "build", "fwd", "bwd", "opt", "kern", "loader", "dominant"]
    heads = ["config", "cold step ms", "warm step ms", "graph build ms fwd / bwd (cold - warm)",
             "fwd ms GPU / host", "bwd ms GPU / host", "optimizer ms GPU / host", "kernels ms fwd / bwd / opt",
             "sampling (loader alone) ms", "dominant"]
    return out, cols, heads


def loader_rows(payload: dict) -> Tuple[List[dict], List[str], List[str]]:
    rows = [{"graph": i.get("graph"), "sampler": i.get("sampler"), "batch": i.get("batch_size"),
             "workers": i.get("workers"), "loader": _fmt_or_status(i.get("loader_ms")),
             "sub": (f"{i['batch_nodes']:,.0f} / {i['batch_edges']:,.0f}" if isinstance(i.get("batch_nodes"), (int, float))
                     else ""), "pre": _fmt_or_status(i.get("presample_s")),
             "status": ("" if i.get("status") == "ok" else (i.get("status") or "")[:100]) +
             (f" (with workers: {i['workers_error'][:80]}; ran without)" if i.get("workers_error") else "")}
            for i in payload.get("loaders") or []]
    cols = ["graph", "sampler", "batch", "workers", "loader", "sub", "pre", "status"]
    heads = ["graph", "sampler", "batch", "workers", "loader alone ms / batch", "nodes / edges per batch (mean)",
             "build + pre-sample s", "status"]
    padded = [i for i in payload.get("loaders") or [] if i.get("padded")]
    if padded:  # fixed-size batches: the largest kept batch and the caps every model step ran at
        for r, i in zip(rows, payload.get("loaders") or []):
            r["pad"] = (f"{i['batch_nodes_max']:,} / {i['batch_edges_max']:,} -> {i['padded_nodes']:,} / "
                        f"{i['padded_edges']:,}" + _pad_check(i.get("pad_check"))) if i.get("padded") else ""
        cols.insert(6, "pad")
        heads.insert(6, "max nodes / edges -> padded to (seed outputs padded vs not)")
    return rows, cols, heads


def _pad_check(value) -> str:
    """The loader's padding check as a cell suffix: the seeds' outputs' largest difference."""
    if value is None:
        return ""
    return f" (max diff {value:.0e})" if isinstance(value, float) else f" ({value})"


def sampled_markdown(payload: dict, header: bool = True) -> str:
    """The sampled mini-batch section: targets, loaders, one row per config pair, phases."""
    st = payload.get("settings", {})
    ss = st.get("sampled") or {}
    rows, cols, heads = sampled_rows(payload)
    lrows, lcols, lheads = loader_rows(payload)
    top = ["### Training steps, sampled mini-batches (stock vs gnn_fastpath.enabled())", "",
           H.env_header(payload.get("environment", {})), ""] if header else \
        ["#### Sampled mini-batches", ""]
    fan = ",".join(str(f) for f in ss.get("fanouts") or FANOUTS)
    parts = top + [
        f"{st.get('num_layers', 3)}-layer models as in full batch (GCNConv cached=False; DGL: GATv2Conv, GraphConv, "
        f"SAGEConv(pool)); fan-outs {fan} (hop next to the seeds first), seeds shuffled over every node. "
        f"Model step = the sampled batch already on the GPU (moved as new tensors, outside the timing): graph build + "
        f"forward + loss on the seeds + backward + optimizer, CUDA events, median of {st.get('steps')} after "
        f"{st.get('warmup')} warm-ups. Whole step = the real loader ({ss.get('workers')} workers, persistent, pinned) "
        f"+ .to(device, non_blocking) + the model step, window wall time / {ss.get('whole_steps')} steps. Loader alone = "
        "the same without the model; bound by 'sampler' when loader alone >= model step.", "",
        sampled_targets_table(payload.get("sampled_targets") or evaluate_sampled_targets(payload.get("rows", []))), "",
        H.markdown_table(lrows, lcols, lheads), "",
        H.markdown_table(rows, cols, heads), ""]
    qrow, qcols, qheads = paired_rows(payload)
    if qrow:
        parts += ["Paired steps (--paired): stock and enabled models (same parameters) take turns on the same "
                  f"batches in blocks of {PAIRED_BLOCK} timed steps (stock, enabled, enabled, stock, ...), each block "
                  "after one untimed step; each step timed alone from an idle device; a block pair's ratio is "
                  "of the two blocks' medians.", "",
                  H.markdown_table(qrow, qcols, qheads), ""]
    prow, pcols, pheads = phase_rows(payload)
    if prow:
        parts += ["Per-phase breakdown (--profile-phases): cold = a step on a new batch, warm = the same step again "
                  "on the same batch objects (graph caches hit); build = cold - warm; GPU = CUDA-event ms, host = "
                  "host ms issuing the phase; kernels = GPU busy time per phase (torch.profiler, one warm step).", "",
                  H.markdown_table(prow, pcols, pheads), ""]
    return "\n".join(parts)


class TrainSampledRunner(SampledRunner):
    benchmark = "train_sampled"

    def extend(self, payload: dict) -> None:
        if getattr(self.args, "rounds", 1) > 1:
            payload["round_rows"], payload["rows"] = payload["rows"], merge_rounds(payload["rows"])
        payload["sampled_targets"] = evaluate_sampled_targets(payload["rows"])
        payload["loaders"] = self.loaders

    def render(self, payload: dict) -> str:
        return sampled_markdown(payload)


# ----------------------------------------------------------------------------- main
def sampled_graphs(args, cpu: bool) -> List[str]:
    """``--sampled-graphs``, else ``--graphs``, else the defaults."""
    if args.sampled_graphs:
        return [g.strip() for g in args.sampled_graphs.split(",") if g.strip()]
    return args.graph_names or (CPU_SAMPLED_GRAPHS if cpu else SAMPLED_GRAPHS)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(p, NAME, graphs_help=f"comma list (default {','.join(SAMPLED_GRAPHS)}; CPU: "
                                         f"{','.join(CPU_SAMPLED_GRAPHS)})")
    p.add_argument("--sampled-graphs", default=None, help="the same as --graphs (the name bench_compile uses)")
    add_sampled_args(p)
    p.add_argument("--pad-batches", action="store_true",
                   help="pad PyG-sampler batches to fixed sizes (N_cap nodes, M_cap edges), as bench_compile's "
                        "sampled rows are")
    p.add_argument("--rounds", type=int, default=1,
                   help="run each stock/enabled pair this many times, flipping which runs first every round; "
                        "rows report the median over the rounds (default 1)")
    p.add_argument("--paired", action="store_true",
                   help="stock and enabled steps take turns in short blocks in one run (model step only; rows also "
                        "give the median per-block-pair ratio and the share of block pairs the enabled side lost)")
    p.add_argument("--paired-control", action="store_true",
                   help="with --paired: the enabled side's blocks run stock too, an A/A control of the ratio's "
                        "spread when nothing differs (read a small paired difference against it)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    pyg = H.import_pyg()
    if pyg is None:
        return 0
    device = finish_common_args(args, NAME)
    finish_sampled_args(args, device)
    graphs = sampled_graphs(args, device.type != "cuda")
    gf, reason = H.fastpath()
    runner = TrainSampledRunner(args, device, pyg, gf, reason)
    runner.target_configs = {c for t in SAMPLED_TARGETS for c in t.configs()}
    runner.env = H.environment(None)
    if args.rounds < 1:
        raise SystemExit("--rounds must be at least 1")
    if args.paired and args.rounds > 1:
        raise SystemExit("--paired alternates the modes in blocks of steps: --rounds does not apply")
    if args.paired_control and not args.paired:
        raise SystemExit("--paired-control is a control for --paired: give both")
    configs = plan_sampled(graphs, args.layer_keys, args.dtype_names, args.samplers, args.batch_sizes)
    configs = paired_configs(configs) if args.paired else alternate_rounds(configs, args.rounds)
    runner.settings = dict(common_settings(args, device), modes=["sampled"], rounds=args.rounds, paired=args.paired,
                           paired_control=args.paired_control,
                           sampled=sampled_settings(args, graphs, configs))
    if reason:
        print(f"note: {reason}: stock numbers only", flush=True)
    run_sampled_configs(runner, configs)
    runner.finish()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
