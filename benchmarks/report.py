"""Benchmark results: environment header, JSON files and markdown tables."""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Dict, Optional, Sequence

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO_ROOT / "benchmarks" / "results"


def _version(dist: str) -> Optional[str]:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None
    except Exception:  # noqa: BLE001 - broken metadata must not stop a benchmark
        return None


def git_commit() -> Optional[str]:
    """``GNN_FASTPATH_COMMIT`` when set (the device copy has no .git), else ``git rev-parse HEAD``."""
    env = os.environ.get("GNN_FASTPATH_COMMIT")
    if env:
        return env
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10)
        if out.returncode == 0:
            sha = out.stdout.strip()
            dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT,
                                   capture_output=True, text=True, timeout=10)
            return sha + ("-dirty" if dirty.returncode == 0 and dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return None


def cupy_info() -> Dict[str, Optional[str]]:
    info: Dict[str, Optional[str]] = {"cupy": _version("cupy-cuda13x") or _version("cupy-cuda12x") or _version("cupy")}
    try:
        import cupy

        info["cupy"] = cupy.__version__
        if torch.cuda.is_available():
            info["cupy_cuda_runtime"] = str(cupy.cuda.runtime.runtimeGetVersion())
    except Exception:  # noqa: BLE001
        pass
    return info


def environment(bandwidth: Optional[dict] = None) -> dict:
    """What the numbers were measured on: GPU, versions, commit, time, measured bandwidth."""
    env = {
        "timestamp_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": git_commit(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "torch_geometric": _version("torch_geometric") or _version("torch-geometric"),
        "dgl": _version("dgl"),
        "numpy": _version("numpy"),
        "gnn_fastpath": None,
        "gpu": None,
        "gpu_count": 0,
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "tf32_cudnn": torch.backends.cudnn.allow_tf32,
    }
    env.update(cupy_info())
    try:
        import gnn_fastpath

        env["gnn_fastpath"] = getattr(gnn_fastpath, "__version__", None)
        env["gnn_fastpath_cuda"] = gnn_fastpath.cuda.unavailable_reason() or "available"
    except Exception as exc:  # noqa: BLE001
        env["gnn_fastpath"] = f"import failed: {type(exc).__name__}: {exc}"
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env.update(gpu=torch.cuda.get_device_name(0), gpu_count=torch.cuda.device_count(),
                   gpu_memory_gib=round(props.total_memory / 2**30, 1),
                   sm_count=props.multi_processor_count,
                   l2_mb=round(getattr(props, "L2_cache_size", 0) / 1e6, 1),
                   capability=f"{props.major}.{props.minor}")
    env["gnn_fastpath_env"] = {k: v for k, v in os.environ.items() if k.startswith("GNN_FASTPATH_")}
    if bandwidth:
        env["bandwidth_gb_s"] = round(bandwidth["gb_s"], 1)
        env["bandwidth_probe"] = bandwidth
    return env


def out_dir(path=None) -> Path:
    """The results directory (created by the first write into it)."""
    return Path(path) if path is not None else DEFAULT_OUT


def write_json(path, payload: dict) -> Path:
    """Write atomically (a partial file never replaces a complete one)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=1, default=str))
    os.replace(tmp, path)
    return path


def publish(payload: dict, text: str, json_path=None, md_path=None) -> None:
    """Print a benchmark's markdown ``text`` and write its JSON ``payload`` and the text where
    asked (paths None or empty: not written)."""
    print(text)
    if json_path:
        write_json(json_path, payload)
    if md_path:
        Path(md_path).write_text(text)


def markdown_table(rows: Sequence[dict], columns: Sequence[str], headers: Optional[Sequence[str]] = None,
                   formatters: Optional[Dict[str, callable]] = None) -> str:
    """A GitHub markdown table of ``rows`` (dicts) over ``columns``."""
    headers = list(headers or columns)
    formatters = formatters or {}
    lines = ["| " + " | ".join(headers) + " |", "|" + " --- |" * len(headers)]
    for r in rows:
        cells = []
        for c in columns:
            v = r.get(c)
            f = formatters.get(c)
            cells.append(f(v) if f is not None else ("" if v is None else str(v)))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def env_header(env: dict) -> str:
    """One markdown paragraph naming the machine and versions."""
    bw = env.get("bandwidth_gb_s")
    parts = [
        f"GPU: {env.get('gpu') or 'none'}",
        f"torch {env.get('torch')} (CUDA {env.get('torch_cuda')})",
        f"CuPy {env.get('cupy')}",
        f"PyG {env.get('torch_geometric')}",
        f"commit {env.get('git_commit')}",
        f"{env.get('timestamp_utc')}",
    ]
    if bw:
        parts.append(f"measured copy bandwidth {bw:,.0f} GB/s")
    if env.get("gnn_fastpath_env"):
        parts.append("env " + " ".join(f"{k}={v}" for k, v in sorted(env["gnn_fastpath_env"].items())))
    return "; ".join(parts)


# ----------------------------------------------------------------------------- compact summary
def _f(v, digits=2):
    from .timing import fmt

    return fmt(v, digits)


def compact_ops(payload: dict) -> str:
    """One row per (graph, op, variant) of the CUDA backend, the reference beside it."""
    rows = payload.get("rows", [])
    ref = {(r["graph"], r["op"], r.get("dtype", "float32")): r for r in rows if r.get("backend") == "reference"}
    main = "cuda" if any(r.get("backend") == "cuda" for r in rows) else "reference"
    graphs = payload.get("settings", {}).get("graphs", [])
    ops = ["gatv2_attention", "dot_attention", "spmm", "segment_reduce"]

    dtypes = ["float32", "bfloat16", "float16"]

    def key(r):
        return (ops.index(r["op"]) if r.get("op") in ops else 9, graphs.index(r["graph"]) if r.get("graph") in graphs else 99,
                r.get("variant") != "default", str(r.get("variant")),
                dtypes.index(r.get("dtype", "float32")) if r.get("dtype", "float32") in dtypes else 9)

    out = []
    for r in sorted(rows, key=key):
        if r.get("backend") != main:
            continue
        if main == "reference":
            rr = {}
        else:
            rr = ref.get((r["graph"], r["op"], r.get("dtype", "float32")), {})
        status = r.get("status") or ""
        if status.startswith("no CUDA path"):
            status = "no CUDA path"
        out.append({"graph": r["graph"], "op": r["op"], "dtype": _short(r.get("dtype", "float32")), "variant": "" if r.get("variant") == "default" else str(r.get("variant")).replace("GNN_FASTPATH_", ""),
                    "fwd": _f(r.get("fwd_ms")), "fb": _f(r.get("fwd_bwd_ms")), "mb": _f(r.get("peak_mb")),
                    "xf": _f(r.get("x_floor_fwd")), "xfb": _f(r.get("x_floor_fwd_bwd")),
                    "rfwd": _f(rr.get("fwd_ms")) or (rr.get("status") or "")[:12], "rfb": _f(rr.get("fwd_bwd_ms")),
                    "err": "" if r.get("rel_err_vs_reference") is None else f"{r['rel_err_vs_reference']:.0e}",
                    "status": "" if status == "ok" else status[:60]})
    cols = ["graph", "op", "dtype", "variant", "fwd", "fb", "mb", "xf", "xfb", "rfwd", "rfb", "err", "status"]
    heads = ["graph", "op", "dtype", "variant", "fwd ms", "f+b ms", "peak MB", "x floor", "x floor f+b", "ref fwd", "ref f+b",
             "err", "status"]
    return markdown_table(out, cols, heads)


def _short(dtype_name) -> str:
    from .timing import SHORT

    return SHORT.get(dtype_name, str(dtype_name or ""))


def compact_layers(payload: dict) -> str:
    out = []
    for r in payload.get("rows", []):
        sx = r.get("speedup_fwd")
        sxb = r.get("speedup_fwd_bwd")
        out.append({"graph": r.get("graph"), "layer": (r.get("layer") or "").split("(")[0],
                    "ac": "" if r.get("autocast", "off") == "off" else _short(r.get("autocast")),
                    "sf": _f(r.get("stock_fwd_ms")), "ff": _f(r.get("fused_fwd_ms")),
                    "x": "" if sx is None else f"{sx:.2f}", "sfb": _f(r.get("stock_fwd_bwd_ms")),
                    "ffb": _f(r.get("fused_fwd_bwd_ms")), "xb": "" if sxb is None else f"{sxb:.2f}",
                    "smb": _f(r.get("stock_peak_mb"), 0), "fmb": _f(r.get("fused_peak_mb"), 0),
                    "err": "" if r.get("rel_err") is None else f"{r['rel_err']:.0e}",
                    "path": (r.get("fused_path") or "")[:50],
                    "status": "" if r.get("status") == "ok" else (r.get("status") or "")[:50]})
    cols = ["graph", "layer", "ac", "sf", "ff", "x", "sfb", "ffb", "xb", "smb", "fmb", "err", "path", "status"]
    heads = ["graph", "layer", "autocast", "stock fwd", "fused fwd", "x", "stock f+b", "fused f+b", "x f+b", "stock MB",
             "fused MB", "err", "fused path", "status"]
    return markdown_table(out, cols, heads)


def summarize(paths: Sequence[str]) -> str:
    """Compact markdown of bench_ops / bench_layers / bench_train JSON files (missing files are named)."""
    parts = []
    for p in paths:
        path = Path(p)
        if not path.exists():
            parts.append(f"({path.name}: not written)")
            continue
        try:
            payload = json.loads(path.read_text())
        except ValueError as exc:
            parts.append(f"({path.name}: unreadable: {exc})")
            continue
        if payload.get("benchmark") == "ops":
            parts += [f"#### ops ({path.name}): {env_header(payload.get('environment', {}))}", "",
                      compact_ops(payload), ""]
            from .bench_ops import RATIO_COLUMNS, RATIO_HEADERS, ratio_rows

            ratio = ratio_rows(payload)
            if ratio:
                parts += [f"#### ops: 16-bit / fp32 ({path.name})", "",
                          markdown_table(ratio, RATIO_COLUMNS, RATIO_HEADERS), ""]
        elif payload.get("benchmark") == "train":
            from .bench_train import markdown as train_markdown

            parts += [f"#### training steps ({path.name})", "", train_markdown(payload, header=False), ""]
        elif payload.get("benchmark") == "layers":
            parts += [f"#### layers ({path.name})", "", compact_layers(payload), ""]
    return "\n".join(parts)


if __name__ == "__main__":
    import sys

    if len(sys.argv) >= 2 and sys.argv[1] == "summary":
        print(summarize(sys.argv[2:]))
    else:
        print("usage: python -m benchmarks.report summary RESULT.json [...]")
