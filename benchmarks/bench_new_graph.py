"""Sampled model steps by how a new graph is built: ``GNN_FASTPATH_NEW_GRAPH=exact`` (one host
synchronisation reads the degree facts back) against ``static`` (no synchronisation, the graph
a compiled layer builds), stock beside them, on the same batches in one process.

    python -m benchmarks.bench_new_graph                                  # arxiv-like, 5 layers, fp32 + bf16
    python -m benchmarks.bench_new_graph --layers gatv2,gcn --dtypes float32 --batches 32
    python -m benchmarks.bench_new_graph --device cpu --batches 6 --layers gcn --dtypes float32   # smoke

Batches: PyG ``NeighborLoader`` (fan-outs 15/10/5, batch ``--batch-size``) over the graph held
on the CPU, sampled once before timing and moved to the device as new tensors per step, so
every step brings a graph no cache has seen. Per (layer, dtype), for each mode:

* ``stock``; ``exact`` and ``static``: enabled with the small-graph rule off (the fused path at
  every size, so the two routes are compared, not the rule); ``rule``: enabled as users run it
  (``exact`` route, rule on).
* ``ms``: a window of steps (zero_grad, [autocast] forward, loss on the seeds, backward, Adam)
  issued back to back, one synchronisation after the last; ``host_ms``: the host clock when the
  last step returned. Best of ``--rounds`` rounds, modes interleaved per round.
* ``syncs``: host synchronisations torch reports in one step (``set_sync_debug_mode``).
* ``build_ms``: what the first layer call's graph lookup does for a new batch, GPU and host
  (synchronised after; mean over the batches). The exact Graph builds its CSR and work lists
  at first use, inside the layers, so its column is a lower bound; the static one is whole.
* ``max_abs``: largest difference from stock of the output and parameter gradients of one
  batch in eval mode (no dropout).

Results: ``--json`` (default ``benchmarks/results/bench_new_graph.json``) with the GPU model,
versions and commit, and a markdown table (``--markdown``).
"""
from __future__ import annotations

import argparse
import contextlib
import time
from typing import Dict, List

import torch

from . import harness as H
from .sampling import BatchSource, _train_step
from .training import IN_FEATURES, NUM_CLASSES, Net, load_data

NAME = "bench_new_graph"
LAYERS = ["gatv2", "transformer", "gat", "gcn", "sage_max"]
MODES = ("stock", "exact", "static", "rule")
FANOUTS = (15, 10, 5)



def _mode(gf, mode: str, device: torch.device):
    """The context a mode's steps run in."""
    if mode == "stock":
        return contextlib.nullcontext()
    stack = contextlib.ExitStack()
    stack.enter_context(H.settings_env(GNN_FASTPATH_NEW_GRAPH="static" if mode == "static" else "exact",
                             GNN_FASTPATH_SMALL_GRAPH="auto" if mode == "rule" else "off"))
    stack.enter_context(gf.enabled(frameworks="pyg", **({} if device.type == "cuda" else {"cpu": "reference"})))
    return stack


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _window(model, opt, source: BatchSource, kept: List[dict], dtype: str, device: torch.device) -> Dict[str, float]:
    batches = [source.from_kept(k) for k in kept]  # new tensors: no graph cache knows them
    _sync(device)
    t0 = time.perf_counter()
    for b in batches:
        _train_step(model, opt, None, b, dtype, device, None)
    host = time.perf_counter()
    _sync(device)
    end = time.perf_counter()
    return {"ms": (end - t0) / len(batches) * 1e3, "host_ms": (host - t0) / len(batches) * 1e3}


def _build_ms(gf, mode: str, source: BatchSource, kept: List[dict], device: torch.device) -> float:
    """One batch's graph, built as the first layer call of ``mode`` builds it (synchronised)."""
    from gnn_fastpath.integrations.pyg.graph import graph_of

    times = []
    like = torch.empty(0, device=device)
    with _mode(gf, mode, device):
        for k in kept:
            ei = source.from_kept(k).graph
            _sync(device)
            t0 = time.perf_counter()
            graph_of(ei, n_src=k["nodes"], n_dst=k["nodes"], like=like)
            _sync(device)
            times.append((time.perf_counter() - t0) * 1e3)
    return sum(times[1:]) / max(len(times) - 1, 1)


def _check(gf, model, source: BatchSource, kept: dict, dtype: str, device: torch.device) -> Dict[str, float]:
    model.eval()
    b = source.from_kept(kept)
    result = {}
    for mode in MODES:
        model.zero_grad(set_to_none=True)
        with _mode(gf, mode, device), H.autocast(device, dtype):
            out = model(b.x, b.graph).float()
        out.square().mean().backward()
        result[mode] = (out.detach(), [p.grad.detach().clone() for p in model.parameters() if p.grad is not None])
    model.train()
    ref_out, ref_grads = result["stock"]
    return {m: max([(o - ref_out).abs().max().item()] + [(g - r).abs().max().item() for g, r in zip(grads, ref_grads)])
            for m, (o, grads) in result.items() if m != "stock"}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--graph", default="arxiv-like")
    p.add_argument("--layers", default=",".join(LAYERS), help="comma list of " + ", ".join(LAYERS))
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--batches", type=int, default=24, help="batches per window (default 24)")
    p.add_argument("--rounds", type=int, default=3, help="windows per mode, interleaved (default 3)")
    p.add_argument("--device", default="auto")
    p.add_argument("--scale", type=float, default=None, help="synthetic graph scale (default 1; CPU: 0.01)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None)
    p.add_argument("--markdown", default=None)
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    pyg = H.import_pyg()
    if pyg is None:
        print("PyG is not installed: nothing to measure")
        return 0
    import gnn_fastpath as gf

    device = H.pick_device(a.device)
    layers = H.names(a.layers, LAYERS, "--layers")
    dtypes = H.parse_dtypes(a.dtypes)
    scale = a.scale if a.scale is not None else (1.0 if device.type == "cuda" else 0.01)
    out = H.out_dir(a.out)
    json_path = a.json or str(out / f"{NAME}.json")
    md_path = a.markdown if a.markdown is not None else str(out / f"{NAME}.md")

    data = load_data(a.graph, torch.device("cpu"), a.seed, scale)
    source = BatchSource("pyg", data, a.batch_size, FANOUTS, 0, device)
    kept = [source.keep(source.next_raw()) for _ in range(a.batches + 1)]
    env = H.environment()
    rows: List[dict] = []
    payload = {"benchmark": "new_graph", "environment": env,
               "settings": {k: v for k, v in vars(a).items() if k not in ("json", "markdown", "out")},
               "graph": a.graph, "batch_size": a.batch_size, "fanouts": FANOUTS,
               "nodes_mean": sum(k["nodes"] for k in kept) / len(kept),
               "edges_mean": sum(k["edges"] for k in kept) / len(kept), "rows": rows}
    print(H.env_header(env))
    print(f"{a.graph} batch {a.batch_size}: {payload['nodes_mean']:.0f} nodes, {payload['edges_mean']:.0f} edges "
          f"per batch (mean), {a.batches} batches per window")
    for dtype in dtypes:
        for layer in layers:
            torch.manual_seed(a.seed)
            model = Net(pyg, layer, IN_FEATURES.get(a.graph, data.x.shape[1]), NUM_CLASSES.get(a.graph, 8),
                        gcn_cached=False).to(device)
            opt = torch.optim.Adam(model.parameters(), lr=0.01)
            row = {"layer": layer, "dtype": dtype, "max_abs": _check(gf, model, source, kept[0], dtype, device)}
            for mode in MODES:  # warm-up: compile, tune, first-use work
                with _mode(gf, mode, device):
                    _window(model, opt, source, kept[:3], dtype, device)
            for _ in range(a.rounds):
                for mode in MODES:
                    with _mode(gf, mode, device):
                        w = _window(model, opt, source, kept[1:], dtype, device)
                    best = row.setdefault(mode, {"ms": float("inf"), "host_ms": float("inf")})
                    best["ms"], best["host_ms"] = min(best["ms"], w["ms"]), min(best["host_ms"], w["host_ms"])
            for mode in MODES:
                with _mode(gf, mode, device):
                    b = source.from_kept(kept[0])
                    row[mode]["syncs"] = H.count_syncs(lambda: _train_step(model, opt, None, b, dtype, device, None),
                                                       device)
            for mode in ("exact", "static"):
                row[mode]["build_ms"] = _build_ms(gf, mode, source, kept[1:], device)
            rows.append(row)
            H.write_json(json_path, payload)
            s = row["stock"]["ms"]
            print(f"{layer:12s} {dtype:9s} " + " | ".join(
                f"{m} {row[m]['ms']:.2f} ms (x{s / row[m]['ms']:.2f}, host {row[m]['host_ms']:.2f}, "
                f"syncs {row[m]['syncs']})" for m in MODES) + f" | max_abs {row['max_abs']}", flush=True)
    source.close()
    if md_path:
        H.write_text(md_path, _markdown(payload))
    return 0


def _markdown(payload: dict) -> str:
    lines = [H.env_header(payload["environment"]), "",
             "| layer | dtype | stock ms | exact ms (x) | static ms (x) | rule ms (x) | syncs exact / static | "
             "build ms exact / static |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in payload["rows"]:
        s = r["stock"]["ms"]
        cell = lambda m: f"{r[m]['ms']:.2f} ({s / r[m]['ms']:.2f}x)"  # noqa: E731
        lines.append(f"| {r['layer']} | {r['dtype']} | {s:.2f} | {cell('exact')} | {cell('static')} | {cell('rule')} | "
                     f"{r['exact']['syncs']} / {r['static']['syncs']} | "
                     f"{r['exact']['build_ms']:.2f} / {r['static']['build_ms']:.2f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
