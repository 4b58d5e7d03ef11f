"""Full-batch training steps: stock PyG against ``gnn_fastpath.enabled()``, in fp32 and under
16-bit autocast, 3-layer models on whole graphs (the issue-10 targets first).

    python -m benchmarks.bench_train_full --quick --time-budget 240
    python -m benchmarks.bench_train_full --graphs pokec-like --layers gatv2,transformer --dtypes fp32,bf16,fp16
    python -m benchmarks.bench_train_full --device cpu --scale 0.005 --hidden 8 --heads 2 --steps 2   # smoke

A config is (graph, layer, dtype, mode); the models, the step and what is recorded are in
:mod:`benchmarks.training`. The issue-10 targets (``TARGETS``) are measured first and reported
met / missed. Results: ``--json`` (default ``benchmarks/results/bench_train_full.json``) and
``--markdown`` (default ``.md`` beside it), both rewritten after every config, so a run cut by
``--time-budget`` or a timeout keeps what it measured. Prints the tables; exits 0 without PyG.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

from . import harness as H
from .harness import OOM, SHORT, fmt
from .training import (DTYPE_NAMES, GRAPHS, CPU_GRAPHS, LAYER_LABELS, LAYERS, MODES, Runner, _ms, _ratio,
                       add_common_args, common_settings, finish_common_args, is_compiled, is_sampled, model_text,
                       path_summary)

NAME = "bench_train_full"


# ----------------------------------------------------------------------------- targets
@dataclass(frozen=True)
class Target:
    """An issue-10 target. ``kind`` ``speedup``: stock / enabled step time in ``dtype`` >= ``bound``;
    ``ratio``: enabled ``dtype`` step / enabled fp32 step <= ``bound``."""

    kind: str
    graph: str
    layer: str
    dtype: str
    bound: float

    @property
    def text(self) -> str:
        d = SHORT[self.dtype]
        if self.kind == "speedup":
            return f"{self.graph} {LAYER_LABELS[self.layer]}: {d} enabled >= {self.bound:g}x faster than stock {d}"
        return f"{self.graph} {LAYER_LABELS[self.layer]}: {d} enabled step <= {self.bound:g}x enabled fp32 step"

    def configs(self) -> List[Tuple[str, str, str, str]]:
        """The (graph, layer, dtype, mode) configs it needs, in the order to measure them."""
        if self.kind == "speedup":
            return [(self.graph, self.layer, self.dtype, "enabled"), (self.graph, self.layer, self.dtype, "stock")]
        return [(self.graph, self.layer, self.dtype, "enabled"), (self.graph, self.layer, "float32", "enabled")]


TARGETS = [
    Target("speedup", "tolokers", "gatv2", "bfloat16", 9.0),
    Target("speedup", "arxiv-like", "transformer", "bfloat16", 3.0),
    Target("speedup", "pokec-like", "sage_max", "bfloat16", 7.0),
    Target("ratio", "pokec-like", "gatv2", "bfloat16", 0.6),
    Target("ratio", "pokec-like", "transformer", "bfloat16", 0.6),
]


def plan(graphs: Sequence[str], layers: Sequence[str], dtypes: Sequence[str]) -> List[Tuple[str, str, str, str]]:
    """Every (graph, layer, dtype, mode) to run: the targets' configs first (those selected),
    then the rest graph by graph, so a run cut short has measured what the issue asks."""
    wanted = [(g, l, d, m) for g in graphs for l in layers for d in dtypes for m in MODES]
    first = [c for t in TARGETS for c in t.configs() if c in wanted]
    order: List[Tuple[str, str, str, str]] = []
    for c in first + wanted:
        if c not in order:
            order.append(c)
    return order


def evaluate_targets(rows: Sequence[dict]) -> List[dict]:
    """Each target of ``TARGETS`` with the measured value and ``met`` / ``missed`` /
    ``not measured (...)`` from the full-batch config rows (sampled rows are ignored)."""
    by = {(r.get("graph"), r.get("layer_key"), r.get("dtype"), r.get("mode")): r for r in rows
          if not is_sampled(r) and not is_compiled(r)}
    out = []
    for t in TARGETS:
        if t.kind == "speedup":
            num, den = by.get((t.graph, t.layer, t.dtype, "stock")), by.get((t.graph, t.layer, t.dtype, "enabled"))
        else:
            num, den = by.get((t.graph, t.layer, t.dtype, "enabled")), by.get((t.graph, t.layer, "float32", "enabled"))
        res = {"target": t.text, "kind": t.kind, "graph": t.graph, "layer": t.layer, "dtype": t.dtype,
               "bound": t.bound, "value": None}
        a, b = (num or {}).get("step_ms"), (den or {}).get("step_ms")
        if isinstance(a, float) and isinstance(b, float) and b > 0:
            res["value"] = a / b
            ok = res["value"] >= t.bound if t.kind == "speedup" else res["value"] <= t.bound
            res["verdict"] = "met" if ok else "missed"
        elif t.kind == "speedup" and (num or {}).get("status") == OOM and isinstance(b, float):
            res["verdict"] = "met (stock out of memory)"
        else:
            why = [f"{r.get('mode')} {SHORT.get(r.get('dtype'), r.get('dtype'))}: {r.get('status')}"
                   for r in (num, den) if r is not None and not isinstance(r.get("step_ms"), float)]
            if num is None or den is None:
                why.append("config not run")
            res["verdict"] = "not measured (" + "; ".join(why) + ")"
        out.append(res)
    return out


# ----------------------------------------------------------------------------- markdown
def summary_rows(payload: dict) -> Tuple[List[dict], List[str], List[str]]:
    """One table row per (graph, layer): per dtype stock / enabled step, speedup and peaks,
    and each 16-bit dtype's enabled step over the fp32 enabled step."""
    dtypes = payload.get("settings", {}).get("dtypes") or DTYPE_NAMES
    graphs = payload.get("settings", {}).get("graphs") or GRAPHS
    full = [r for r in payload.get("rows", []) if not is_sampled(r) and not is_compiled(r)]
    by = {(r.get("graph"), r.get("layer_key"), r.get("dtype"), r.get("mode")): r for r in full}
    pairs = []
    for r in full:
        k = (r.get("graph"), r.get("layer_key"))
        if k not in pairs:
            pairs.append(k)
    pairs.sort(key=lambda k: (graphs.index(k[0]) if k[0] in graphs else 99,
                              LAYERS.index(k[1]) if k[1] in LAYERS else 99))
    cols, heads, out = ["graph", "layer"], ["graph", "layer"], []
    for d in dtypes:
        s = SHORT[d]
        cols += [f"{d}_stock", f"{d}_enabled", f"{d}_x", f"{d}_peak"]
        heads += [f"{s} stock ms", f"{s} enabled ms", f"x {s}", f"{s} peak MB stock / enabled"]
    for d in dtypes:
        if d != "float32" and "float32" in dtypes:
            cols.append(f"{d}_vs_fp32")
            heads.append(f"{SHORT[d]} / fp32 enabled")
    cols += ["path", "notes"]
    heads += ["fused path (enabled, stats)", "notes"]
    for g, l in pairs:
        cell: Dict[str, str] = {"graph": g, "layer": LAYER_LABELS.get(l, l)}
        paths, notes = [], []
        for d in dtypes:
            s, e = by.get((g, l, d, "stock"), {}), by.get((g, l, d, "enabled"), {})
            cell[f"{d}_stock"] = _ms(s.get("step_ms")) if s else ""
            cell[f"{d}_enabled"] = _ms(e.get("step_ms")) if e else ""
            cell[f"{d}_x"] = _ratio(s.get("step_ms"), e.get("step_ms"))
            cell[f"{d}_peak"] = " / ".join(fmt(r.get("peak_mb"), 0) if r.get("peak_mb") is not None else "-"
                                           for r in (s, e)) if (s or e) else ""
            if e and path_summary(e):
                paths.append(f"{SHORT[d]}: {path_summary(e)}")
            for mode, r in (("stock", s), ("enabled", e)):
                st = r.get("status")
                if st and st not in ("ok", OOM):
                    notes.append(f"{mode} {SHORT[d]}: {st[:80]}")
                elif r.get("finite_losses") is False:
                    notes.append(f"{mode} {SHORT[d]}: non-finite loss")
            if d != "float32" and "float32" in dtypes:
                cell[f"{d}_vs_fp32"] = _ratio(e.get("step_ms"), by.get((g, l, "float32", "enabled"), {}).get("step_ms"), "")
        cell["path"] = "; ".join(paths)
        cell["notes"] = "; ".join(notes)
        out.append(cell)
    return out, cols, heads


def targets_table(targets: Sequence[dict]) -> str:
    rows = [{"target": t["target"], "value": "" if t.get("value") is None else
             (f"{t['value']:.2f}x" if t["kind"] == "speedup" else f"{t['value']:.2f}"),
             "verdict": t.get("verdict", "")} for t in targets]
    return H.markdown_table(rows, ["target", "value", "verdict"], ["target (issue 10)", "measured", "verdict"])


def markdown(payload: dict, header: bool = True) -> str:
    """The targets table and one row per (graph, layer); ``header``: title and environment first."""
    st = payload.get("settings", {})
    rows, cols, heads = summary_rows(payload)
    top = ["### Training steps, full batch (PyG stock vs gnn_fastpath.enabled())", "",
           H.env_header(payload.get("environment", {})), ""] if header else []
    return "\n".join(top + [model_text(st), "",
                            targets_table(payload.get("targets") or evaluate_targets(payload.get("rows", []))), "",
                            H.markdown_table(rows, cols, heads), ""])


class FullRunner(Runner):
    benchmark = "train_full"

    def extend(self, payload: dict) -> None:
        payload["targets"] = evaluate_targets(self.rows)

    def render(self, payload: dict) -> str:
        return markdown(payload)


# ----------------------------------------------------------------------------- main
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(p, NAME)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    pyg = H.import_pyg()
    if pyg is None:
        return 0
    device = finish_common_args(args, NAME)
    graphs = args.graph_names or (CPU_GRAPHS if device.type != "cuda" else GRAPHS)
    gf, reason = H.fastpath()
    runner = FullRunner(args, device, pyg, gf, reason)
    runner.env = H.environment(None)
    configs = plan(graphs, args.layer_keys, args.dtype_names)
    runner.settings = dict(common_settings(args, device), graphs=graphs, modes=["full"],
                           order=[list(c) for c in configs])
    if reason:
        print(f"note: {reason}: stock numbers only", flush=True)
    runner.run(configs)
    runner.finish()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
