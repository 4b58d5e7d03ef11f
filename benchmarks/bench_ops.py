"""Op-level benchmarks: the fused CUDA ops against their byte floor and the reference.

    python -m benchmarks.bench_ops --quick                    # tolokers, arxiv-like, arxiv-skewdst, roads-like
    python -m benchmarks.bench_ops --graphs pokec-like --ops gatv2_attention
    python -m benchmarks.bench_ops --graphs pokec-like --ops gat_attention,gatv2_attention --dtypes float32,bfloat16
    python -m benchmarks.bench_ops --quick --dtypes float32,bfloat16        # + the bf16 / fp32 ratio table
    python -m benchmarks.bench_ops --quick \
        --variant "GNN_FASTPATH_GATV2_BWD=atomic GNN_FASTPATH_DOT_BWD=atomic" \
        --variant "GNN_FASTPATH_GATV2_BWD=transposed GNN_FASTPATH_DOT_BWD=transposed"

For every (graph, op) it times the CUDA backend (when ``gnn_fastpath.ops.backend_for``
gives it one; otherwise the row says so) and the reference backend (under
``gnn_fastpath.ops.force_reference()``, skipped when it would not fit in memory), and puts
each time against the floor: bytes that must move / copy bandwidth measured in the same
run (design.md section 5). Each ``--variant`` (space-separated ``NAME=VALUE`` environment
settings) reruns the ops those variables concern in a subprocess with that environment, so
kernel variants chosen at import time are timed side by side with the default.

``--dtypes`` (default ``float32``) times every op once per dtype: features and outputs in
that dtype (GATv2's ``att`` and GAT's scores stay float32, as under autocast), the floor counted in
that dtype's bytes (indices int32, saved statistics fp32), and, for each 16-bit dtype next to
float32, a table of its time over the fp32 time with the issue-10 target (<= 0.6 where the
features do not fit in L2: ``RATIO_GRAPHS``). The reference backend is timed in float32 only;
16-bit CUDA rows are compared with one reference forward on the same 16-bit inputs.

Without a GPU it times the reference backend on scaled-down synthetic graphs (a smoke run).
Results: ``<out>/bench_ops.json`` and a markdown table (``--md``, default ``<out>/bench_ops.md``).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

import torch

from . import graphs as G
from . import harness as H
from .harness import DTYPES, OOM, SHORT, fmt, free_memory, is_oom, measure, measure_bandwidth, parse_dtypes
from .op_cases import OPS, OpCase
from .report import ratio_table

QUICK_GRAPHS = ["tolokers", "arxiv-like", "arxiv-skewdst", "roads-like"]
FULL_GRAPHS = QUICK_GRAPHS + ["clustered", "pokec-like"]
CPU_GRAPHS = ["arxiv-like", "roads-like"]
CPU_SCALE = 0.01

F32 = 4   # bytes per float32 value (saved statistics, normalised edge values)
IDX = 4   # bytes per CSR index (int32 on the GPU while M < 2**31)
#: Graphs whose features do not fit in the 60 MB L2: there 16-bit data must pay (issue 10).
RATIO_GRAPHS = ("arxiv-like", "arxiv-skewdst", "pokec-like")
RATIO_TARGET = 0.6


# ----------------------------------------------------------------------------- byte floors
def csr_bytes(n: int, m: int) -> int:
    """One destination-major CSR read: indptr [N+1] and indices [M], int32."""
    return (n + 1) * IDX + m * IDX


def floor_bytes(op: str, n: int, m: int, width: int, heads: int = 1, elem: int = F32) -> Dict[str, int]:
    """Bytes an op must move, per design.md section 5 (each input read once, each output
    written once) with every per-edge gather of a node row counted (no cache reuse).

    ``width`` is the feature width of one node row (H*D for attention, F otherwise); ``heads``
    H; ``elem`` the bytes of one feature value (4 fp32, 2 bf16/fp16: features, outputs and their
    gradients move in the input dtype). Returns ``fwd``, ``bwd`` (backward alone), ``fwd_bwd``
    and ``fwd_min`` (the compulsory bytes with every gather hitting cache: node tensors read
    once). Homogeneous graphs (N_src = N_dst = n); int32 indices and arg indices, fp32 saved
    statistics and edge values whatever the dtype. The comments below count fp32 (elem = 4).
    """
    row = width * elem           # one node row, bytes
    nodes = n * row              # one [N, width] tensor
    stat = n * heads * F32       # one per-(node, head) float, e.g. logsumexp L
    csr = csr_bytes(n, m)
    if op == "gatv2_attention":
        # fwd: gather x_src[j] once per edge (M*H*D*4), read x_dst and write out
        # (N*H*D*4*2), write L (N*H*4), read the CSR.
        fwd = m * row + 2 * nodes + stat + csr
        # bwd: a destination pass re-gathers x_src[j] per edge (recompute alpha, <dO_i, x_j>);
        # dx_src needs, per edge, dO_i and x_dst_i (LeakyReLU'(z_ij)) at the source side:
        # two more [H*D] rows per edge (a transposed pass gathers them; an atomic pass
        # instead read-modify-writes dx_src[j], the same 2 rows). Node tensors: read x_dst,
        # dO, write dx_src, dx_dst; read L and G (2*N*H*4); two CSR reads.
        bwd = 3 * m * row + 4 * nodes + 2 * stat + 2 * csr
        fwd_min = 3 * nodes + stat + csr
    elif op == "gat_attention":
        # fwd: gather x_src[j] once per edge (M*H*D*4) and its score s_j (M*H*4: one float
        # per head, the whole logit input of an edge), read t and write out (N*H*D*4) and L
        # (2*N*H*4), read the CSR.
        fwd = m * row + m * heads * F32 + nodes + 2 * stat + csr
        # bwd (the source-major variant, the default on full graphs): a node pass reads O and
        # dO and writes delta; the source pass gathers dO_i per edge (M*H*D*4) and three
        # floats per (edge, head) (L_i, delta_i, t_i), adds d t_i with one float atomic per
        # (edge, head) (read + write), reads x_src, s and the source CSR, writes dx_src and
        # d s. Node tensors: O, dO, x_src, dx_src; stats: delta, s, d s, d t (zeroed).
        bwd = m * row + 5 * m * heads * F32 + 4 * nodes + 4 * stat + csr
        fwd_min = 2 * nodes + 3 * stat + csr
    elif op == "dot_attention":
        # fwd: gather k_j and v_j per edge (2*M*H*D*4), read q, write out (2*N*H*D*4),
        # write L, read the CSR.
        fwd = 2 * m * row + 2 * nodes + stat + csr
        # bwd: destination pass gathers k_j, v_j (dq, and Delta_i = <O_i, dO_i>); source pass
        # gathers q_i and dO_i plus L_i and Delta_i per edge (dk_j, dv_j): 4 rows + 2 stats
        # per edge. Node tensors: read q, k, v, O, dO, write dq, dk, dv (8); read L; two CSRs.
        bwd = 4 * m * row + 2 * m * heads * F32 + 8 * nodes + stat + 2 * csr
        fwd_min = 4 * nodes + stat + csr
    elif op == "spmm":
        # fwd (norm="both"): gather x_j per edge (M*F*4), read the cached normalised edge
        # values (M*4), write out (N*F*4), read the CSR.
        fwd = m * row + m * F32 + nodes + csr
        # bwd: dX = A^T dY: gather dY_i per edge, values again, write dX; transposed CSR.
        bwd = m * row + m * F32 + nodes + csr
        fwd_min = 2 * nodes + m * F32 + csr
    elif op == "segment_reduce":
        # fwd (max): gather x_j per edge (M*F*4), write out and the int32 arg index
        # (2*N*F*4), read the CSR.
        arg = n * width * IDX        # the saved arg index, int32 whatever the dtype
        fwd = m * row + nodes + arg + csr
        # bwd: zero dX, read dY and the arg index, scatter dY into dX (one write per
        # output value): 4*N*F*4.
        bwd = 3 * nodes + arg
        fwd_min = 2 * nodes + arg + csr
    else:
        raise KeyError(op)
    return {"fwd": fwd, "bwd": bwd, "fwd_bwd": fwd + bwd, "fwd_min": fwd_min}


#: Which ops an environment variable concerns (variant runs rerun only those).
ENV_OPS = {"GATV2": ["gatv2_attention"], "GAT_": ["gat_attention"], "DOT": ["dot_attention"], "SPMM": ["spmm"],
           "SEGMENT": ["segment_reduce"], "REDUCE": ["segment_reduce"], "_SR_": ["segment_reduce"]}


def ops_for_env(names: List[str]) -> Optional[List[str]]:
    found: List[str] = []
    for name in names:
        hit = [ops for key, ops in ENV_OPS.items() if key in name.upper()]
        if not hit:
            return None  # unknown variable: rerun everything
        for ops in hit:
            found += [o for o in ops if o not in found]
    return found


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


# ----------------------------------------------------------------------------- runner
class Runner:
    def __init__(self, args, device: torch.device, bandwidth_gb_s: Optional[float]):
        self.args = args
        self.device = device
        self.bw = bandwidth_gb_s
        self.rows: List[dict] = []
        self.graph_info: List[dict] = []
        self.t0 = time.perf_counter()

    def over_budget(self) -> bool:
        return self.args.budget_s is not None and time.perf_counter() - self.t0 > self.args.budget_s

    def floors(self, case: OpCase, n: int, m: int, dtype: torch.dtype = torch.float32) -> dict:
        elem = torch.empty((), dtype=dtype).element_size()
        b = floor_bytes(case.name, n, m, case.width, case.heads, elem=elem)
        out = {"bytes_fwd": b["fwd"], "bytes_fwd_bwd": b["fwd_bwd"], "bytes_fwd_min": b["fwd_min"]}
        if self.bw:
            to_ms = lambda nbytes: nbytes / (self.bw * 1e9) * 1e3  # noqa: E731
            out.update(floor_fwd_ms=to_ms(b["fwd"]), floor_fwd_bwd_ms=to_ms(b["fwd_bwd"]),
                       floor_fwd_min_ms=to_ms(b["fwd_min"]))
        return out

    def _reference_fits(self, case: OpCase, m: int) -> Optional[str]:
        """None when the reference's [M, ...] working set fits, else why it is skipped."""
        need = case.ref_factor * m * case.width * F32
        free = _free_bytes(self.device)
        if free is not None and need > 0.8 * free:
            return f"skipped: reference needs ~{need / 1e9:.0f} GB, {free / 1e9:.0f} GB free"
        return None

    def run_case(self, gname: str, graph, n: int, m: int, case: OpCase, dtype_name: str = "float32") -> None:
        """Time ``case`` on ``graph`` in one dtype: the CUDA backend and (float32 only) the
        reference; a 16-bit CUDA row gets its error against one reference forward on the same
        16-bit inputs (the reference computes in fp32 and rounds once)."""
        from gnn_fastpath import ops as gops

        a = self.args
        dtype = DTYPES[dtype_name]
        fn = case.fn()
        base = {"graph": gname, "nodes": n, "edges": m, "op": case.name, "shape": case.label,
                "dtype": dtype_name, "variant": a.variant_label}
        base.update(self.floors(case, n, m, dtype))
        inputs, kwargs = case.inputs(n, self.device, a.seed, dtype)
        call = lambda: fn(graph, *inputs, **kwargs)  # noqa: E731
        outputs = {}
        backends = [] if a.no_cuda else ["cuda"] + (["static"] if a.static else [])
        # 16-bit references would only re-time the same fp32 math; without CUDA they are the smoke run
        time_reference = not a.no_reference and (dtype_name == "float32" or a.no_cuda)
        if time_reference:
            backends.append("reference")
        default_call = call
        for backend in backends:
            call = default_call
            row = dict(base, backend=backend)
            if self.over_budget():
                row["status"] = "skipped: time budget"
                self.add(row)
                continue
            if backend == "static":  # the launch geometry of the compiled path's operators
                from gnn_fastpath.graph.tensors import as_graph, of_graph

                static_graph = as_graph(of_graph(graph))
                call = lambda: fn(static_graph, *inputs, **kwargs)  # noqa: E731
            if backend in ("cuda", "static"):
                chosen = gops.backend_for(case.name, inputs[0])
                if chosen != "cuda":
                    from gnn_fastpath import cuda as gcuda

                    why = gcuda.unavailable_reason() or "no CUDA kernel registered for this op and dtype"
                    row["status"] = f"no CUDA path (dispatches to reference: {why})"
                    self.add(row)
                    continue
                ctx = _nullcontext()
            else:
                skip = self._reference_fits(case, m)
                if skip:
                    row["status"] = skip
                    self.add(row)
                    continue
                ctx = gops.force_reference()
            tuned_before = _tuned_classes() if backend == "cuda" else None
            with ctx:
                failed = None
                try:
                    with torch.no_grad():
                        outputs[backend] = call().detach()
                except Exception as exc:  # noqa: BLE001
                    failed = OOM if is_oom(exc) else f"error: {type(exc).__name__}: {exc}"[:300]
                if failed is not None:
                    free_memory()
                    row["status"] = failed
                    self.add(row)
                    continue
                res = measure(call, inputs, a.warmup, a.iters, self.device)
            row.update(res)
            err = res.get("error")
            row["status"] = ("ok" if not err and OOM not in (res["fwd_ms"], res["fwd_bwd_ms"], res["peak_mb"])
                             else (f"error: {err}" if err else OOM))
            if tuned_before is not None:
                chose = _tuned_since(tuned_before)
                if chose:
                    row["tuned"] = chose
            if row.get("floor_fwd_ms") and isinstance(res["fwd_ms"], float):
                row["x_floor_fwd"] = res["fwd_ms"] / row["floor_fwd_ms"]
            if row.get("floor_fwd_bwd_ms") and isinstance(res["fwd_bwd_ms"], float):
                row["x_floor_fwd_bwd"] = res["fwd_bwd_ms"] / row["floor_fwd_bwd_ms"]
            self.add(row)
        call = default_call
        if "cuda" in outputs and "reference" not in outputs and not a.no_reference and not time_reference \
                and self._reference_fits(case, m) is None:
            try:
                with gops.force_reference(), torch.no_grad():
                    outputs["reference"] = call().detach()
            except Exception as exc:  # noqa: BLE001 - the error column stays empty
                if not is_oom(exc):
                    print(f"  reference forward for the error check failed: {type(exc).__name__}: {exc}", flush=True)
            free_memory()
        if "cuda" in outputs and "reference" in outputs:
            for r in self.rows:
                if r["graph"] == gname and r["op"] == case.name and r["backend"] == "cuda" \
                        and r.get("dtype", "float32") == dtype_name and r["variant"] == a.variant_label:
                    r["rel_err_vs_reference"] = rel_err(outputs["cuda"], outputs["reference"])
            self.save()

    def add(self, row: dict) -> None:
        self.rows.append(row)
        msg = " ".join(f"{k}={fmt(row.get(k)) if not isinstance(row.get(k), str) else row.get(k)}"
                       for k in ("graph", "op", "dtype", "backend", "variant", "fwd_ms", "fwd_bwd_ms", "peak_mb",
                                 "x_floor_fwd", "status") if row.get(k) is not None)
        print("  " + msg, flush=True)
        self.save()

    def save(self) -> None:
        if self.args.json_out:
            H.write_json(self.args.json_out, self.payload())

    def payload(self) -> dict:
        out = {"benchmark": "ops", "environment": self.env, "settings": self.settings,
               "graphs": self.graph_info, "rows": self.rows}
        ratios = ratio_rows(out)
        if ratios:
            out["ratios"] = ratios
        return out

    def run(self, graph_names: List[str], op_names: List[str]) -> None:
        import gnn_fastpath

        a = self.args
        for gname in graph_names:
            if self.over_budget():
                print(f"time budget ({a.budget_s} s) spent: skipping {gname}", flush=True)
                for op in op_names:
                    self.add({"graph": gname, "op": op, "backend": "-", "variant": a.variant_label,
                              "status": "skipped: time budget"})
                continue
            t = time.perf_counter()
            try:
                bg = G.load(gname, data_dir=a.data_dir, device=self.device, seed=a.seed, scale=a.scale_for(gname))
            except FileNotFoundError as exc:
                print(f"{gname}: {exc}", flush=True)
                for op in op_names:
                    self.add({"graph": gname, "op": op, "backend": "-", "variant": a.variant_label,
                              "status": "missing data"})
                continue
            load_s = time.perf_counter() - t
            t = time.perf_counter()
            graph = gnn_fastpath.Graph.from_edge_index(bg.edge_index, bg.num_nodes)
            if self.device.type == "cuda":
                torch.cuda.synchronize()
            build_ms = (time.perf_counter() - t) * 1e3
            info = dict(bg.meta, load_s=round(load_s, 2), graph_build_ms=round(build_ms, 1))
            self.graph_info.append(info)
            print(f"{gname}: {bg.num_nodes:,} nodes, {bg.num_edges:,} edges, max in-degree {info.get('in_max')}; "
                  f"loaded in {load_s:.1f} s, Graph built in {build_ms:.0f} ms", flush=True)
            for op in op_names:
                for dtype_name in a.dtype_names:
                    self.run_case(gname, graph, bg.num_nodes, bg.num_edges, OPS[op], dtype_name)
                    free_memory()  # run_case's inputs and outputs are gone with its frame
            del graph, bg
            free_memory()


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _free_bytes(device: torch.device) -> Optional[int]:
    if device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(device)
    # memory torch has cached but not allocated is free to it as well
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)


# ----------------------------------------------------------------------------- tuner
def _tuned_classes() -> Optional[set]:
    """The size classes the tuner has choices for now (None with GNN_FASTPATH_TUNE off)."""
    from gnn_fastpath import tuning

    return {r["class"] for r in tuning.listing()} if tuning.enabled() else None


def _tuned_since(before: Optional[set]) -> str:
    """What the tuner chose (and timed) for the classes it met since ``before``, e.g.
    ``dot_bwd/...: transposed (atomic 1.92, transposed 1.41 ms)``."""
    from gnn_fastpath import tuning

    if before is None:
        return ""
    new = [r for r in tuning.listing() if r["class"] not in before]
    return "; ".join(f"{r['class']}: {r['choice']} (" + ", ".join(f"{k} {v:.3f}" for k, v in r["times_ms"].items())
                     + " ms)" for r in new)


# ----------------------------------------------------------------------------- variants
def run_variant(spec: str, args, graph_names: List[str], op_names: List[str], bandwidth: Optional[float]) -> List[dict]:
    """Rerun ``op_names`` restricted to those ``spec``'s variables concern, in a subprocess
    whose environment carries ``spec`` (``"NAME=VALUE NAME2=VALUE2"``)."""
    assigns = dict(item.split("=", 1) for item in spec.split())
    ops = ops_for_env(list(assigns))
    ops = [o for o in op_names if ops is None or o in ops]
    if not ops:
        return []
    env = dict(os.environ, **assigns)
    env.setdefault("PYTHONUNBUFFERED", "1")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "variant.json"
        cmd = [sys.executable, "-m", "benchmarks.bench_ops", "--graphs", ",".join(graph_names),
               "--ops", ",".join(ops), "--no-reference", "--warmup", str(args.warmup), "--iters", str(args.iters),
               "--seed", str(args.seed), "--json-out", str(out), "--md", "", "--variant-label", spec,
               "--dtypes", ",".join(args.dtype_names)]
        if bandwidth:
            cmd += ["--bandwidth", str(bandwidth)]
        if args.data_dir:
            cmd += ["--data-dir", args.data_dir]
        if args.budget_s is not None:
            cmd += ["--budget-s", str(max(1.0, args.budget_s - (time.perf_counter() - args.t_start)))]
        print(f"variant [{spec}]: {' '.join(ops)}", flush=True)
        proc = subprocess.run(cmd, env=env, cwd=str(H.REPO_ROOT))
        if out.exists():
            return json.loads(out.read_text())["rows"]
        return [{"graph": g, "op": o, "backend": "cuda", "variant": spec,
                 "status": f"variant run failed (exit {proc.returncode})"} for g in graph_names for o in ops]


# ----------------------------------------------------------------------------- output
COLUMNS = ["graph", "op", "dtype", "backend", "variant", "fwd_ms", "fwd_bwd_ms", "peak_mb", "floor_fwd_ms", "x_floor_fwd",
           "floor_fwd_bwd_ms", "x_floor_fwd_bwd", "rel_err_vs_reference", "status", "tuned"]
HEADERS = ["graph", "op", "dtype", "backend", "variant", "fwd ms", "fwd+bwd ms", "fwd peak MB", "floor fwd ms", "x floor",
           "floor f+b ms", "x floor f+b", "rel err", "status", "tuner chose (GNN_FASTPATH_TUNE=1)"]


def _err(v):
    return "" if v is None else f"{v:.1e}"


def markdown(payload: dict) -> str:
    env = payload["environment"]
    ops = list(OPS)
    graphs = payload["settings"]["graphs"]

    dtypes = list(DTYPES)

    def key(r):
        return (ops.index(r["op"]) if r.get("op") in ops else 99,
                graphs.index(r["graph"]) if r.get("graph") in graphs else 99,
                {"cuda": 0, "static": 1}.get(r.get("backend"), 2), r.get("variant") != "default", str(r.get("variant")),
                dtypes.index(r.get("dtype", "float32")) if r.get("dtype", "float32") in dtypes else 9)

    rows = sorted(payload["rows"], key=key)
    ratio = ratio_rows(payload)
    fm = {c: fmt for c in ("fwd_ms", "fwd_bwd_ms", "peak_mb", "floor_fwd_ms", "x_floor_fwd", "floor_fwd_bwd_ms",
                           "x_floor_fwd_bwd")}
    fm["rel_err_vs_reference"] = _err
    fm["status"] = lambda s: "" if s == "ok" else str(s or "")
    fm["variant"] = lambda s: "" if s in (None, "default") else str(s)
    return "\n".join([
        "### Op benchmarks", "", H.env_header(env), "",
        f"warm-up {payload['settings']['warmup']}, timed {payload['settings']['iters']} (median); floor = bytes that "
        "must move / measured copy bandwidth (benchmarks/README.md); 'x floor' = measured / floor.", "",
        H.markdown_table(rows, COLUMNS, HEADERS, fm), ""] + ([
        f"#### 16-bit / fp32 time of the CUDA ops (target <= {RATIO_TARGET} on {', '.join(RATIO_GRAPHS)}: "
        "features beyond L2)", "", ratio_table(ratio), ""] if ratio else []))


def _ratio(a, b) -> Optional[float]:
    if isinstance(a, float) and isinstance(b, float) and b > 0:
        return a / b
    return None


def ratio_rows(payload: dict) -> List[dict]:
    """Per (graph, op, variant, 16-bit dtype) with a float32 CUDA row beside it: the two
    times, their ratios (fwd, fwd+bwd) and the issue-10 verdict: ``met`` when both are
    <= ``RATIO_TARGET`` on a ``RATIO_GRAPHS`` graph, ``missed (...)`` otherwise, ``-`` on
    graphs whose features fit in L2 (no target there)."""
    rows = [r for r in payload.get("rows", []) if r.get("backend") == "cuda"]
    fp32 = {(r["graph"], r["op"], r.get("variant")): r for r in rows if r.get("dtype", "float32") == "float32"}
    graphs = payload.get("settings", {}).get("graphs", [])
    ops = list(OPS)
    out = []
    for r in rows:
        d = r.get("dtype", "float32")
        base = fp32.get((r["graph"], r["op"], r.get("variant")))
        if d == "float32" or base is None:
            continue
        rf, rfb = _ratio(r.get("fwd_ms"), base.get("fwd_ms")), _ratio(r.get("fwd_bwd_ms"), base.get("fwd_bwd_ms"))
        if r["graph"] not in RATIO_GRAPHS:
            verdict = "- (fits in L2: no target)"
        elif rf is None or rfb is None:
            verdict = f"not measured ({SHORT[d]}: {r.get('status')}; fp32: {base.get('status')})"
        elif rf <= RATIO_TARGET and rfb <= RATIO_TARGET:
            verdict = "met"
        else:
            verdict = "missed (" + ", ".join(f"{name} {v:.2f}" for name, v in (("fwd", rf), ("f+b", rfb))
                                             if v > RATIO_TARGET) + ")"
        out.append({"graph": r["graph"], "op": r["op"], "dtype": SHORT[d],
                    "variant": "" if r.get("variant") in (None, "default") else r["variant"],
                    "fp32_fwd": fmt(base.get("fwd_ms")), "fwd": fmt(r.get("fwd_ms")),
                    "ratio_fwd": "" if rf is None else f"{rf:.2f}",
                    "fp32_fb": fmt(base.get("fwd_bwd_ms")), "fb": fmt(r.get("fwd_bwd_ms")),
                    "ratio_fb": "" if rfb is None else f"{rfb:.2f}",
                    "x_floor": fmt(r.get("x_floor_fwd")), "x_floor_fb": fmt(r.get("x_floor_fwd_bwd")),
                    "verdict": verdict, "_key": (ops.index(r["op"]) if r["op"] in ops else 9,
                                                 graphs.index(r["graph"]) if r["graph"] in graphs else 99,
                                                 str(r.get("variant")), d)})
    out.sort(key=lambda x: x.pop("_key"))
    return out


# ----------------------------------------------------------------------------- main
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--graphs", default=None, help=f"comma list (default quick: {','.join(QUICK_GRAPHS)}; "
                                                  f"full: {','.join(FULL_GRAPHS)})")
    p.add_argument("--ops", default=",".join(OPS), help="comma list of " + ", ".join(OPS))
    p.add_argument("--quick", action="store_true", help="quick graph set and 3 warm-up / 10 timed calls")
    p.add_argument("--warmup", type=int, default=None, help="default 5 (quick: 3)")
    p.add_argument("--iters", type=int, default=None, help="default 20 (quick: 10)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--scale", type=float, default=None, help="synthetic graph scale (default 1; CPU: 0.01)")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--out", default=None, help="results directory (default benchmarks/results/)")
    p.add_argument("--json-out", default=None, help="JSON path (default <out>/bench_ops.json)")
    p.add_argument("--md", default=None, help="markdown path (default <out>/bench_ops.md; '' for none)")
    p.add_argument("--dtypes", default="float32",
                   help="comma list of float32, bfloat16, float16: every op timed per dtype (default float32)")
    p.add_argument("--no-reference", action="store_true", help="skip the reference backend")
    p.add_argument("--no-cuda", action="store_true", help="skip the CUDA backend")
    p.add_argument("--static", action="store_true",
                   help="also time the CUDA kernels with the compiled path's static launch geometry (backend "
                        "'static': no row splitting, own SpMM kernel; see gnn_fastpath/graph/tensors.py)")
    p.add_argument("--variant", action="append", default=[],
                   help="'NAME=VALUE ...' environment for a rerun of the ops it concerns (repeatable)")
    p.add_argument("--variant-label", default="default", help=argparse.SUPPRESS)
    p.add_argument("--bandwidth", type=float, default=None, help="GB/s to use instead of measuring")
    p.add_argument("--budget-s", type=float, default=None, help="start no new measurement after this many seconds")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    args.t_start = time.perf_counter()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    if args.graphs:
        graph_names = [g.strip() for g in args.graphs.split(",") if g.strip()]
    else:
        graph_names = QUICK_GRAPHS if args.quick else FULL_GRAPHS
    op_names = [o.strip() for o in args.ops.split(",") if o.strip()]
    args.dtype_names = parse_dtypes(args.dtypes)
    bad = [o for o in op_names if o not in OPS]
    if bad:
        raise SystemExit(f"unknown ops {bad}; known: {', '.join(OPS)}")
    args.warmup = args.warmup if args.warmup is not None else (3 if args.quick else 5)
    args.iters = args.iters if args.iters is not None else (10 if args.quick else 20)
    scale = args.scale
    if not cuda:
        print("no GPU: timing the reference backend on scaled-down synthetic graphs (a smoke run, not a benchmark)",
              flush=True)
        if scale is None:
            scale = CPU_SCALE
        if not args.graphs:
            graph_names = CPU_GRAPHS
        args.no_cuda = True
        args.warmup, args.iters = min(args.warmup, 1), min(args.iters, 3)
        args.variant = []
    scale = 1.0 if scale is None else scale
    args.scale_for = lambda name: 1.0 if name in G.REAL else scale
    out_dir = H.out_dir(args.out)
    if args.json_out is None:
        args.json_out = str(out_dir / "bench_ops.json")
    md_path = str(out_dir / "bench_ops.md") if args.md is None else args.md

    bw = None
    if args.bandwidth:
        bw = {"gb_s": args.bandwidth, "bytes": None, "ms": None, "note": "given by --bandwidth"}
    elif cuda:
        bw = measure_bandwidth()
        print(f"copy bandwidth: {bw['gb_s']:,.0f} GB/s (read + write)", flush=True)
    runner = Runner(args, device, bw["gb_s"] if bw else None)
    runner.env = H.environment(bw)
    runner.settings = {"warmup": args.warmup, "iters": args.iters, "seed": args.seed, "scale": scale,
                       "graphs": graph_names, "ops": op_names, "dtypes": args.dtype_names, "variants": args.variant, "quick": args.quick,
                       "device": str(device)}
    runner.run(graph_names, op_names)
    free_memory()
    for spec in args.variant:
        runner.rows += run_variant(spec, args, graph_names, op_names, bw["gb_s"] if bw else None)
        runner.save()
    runner.save()
    text = markdown(runner.payload())
    if md_path:
        Path(md_path).parent.mkdir(parents=True, exist_ok=True)
        Path(md_path).write_text(text)
    if args.variant_label == "default":
        print()
        print(text, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
