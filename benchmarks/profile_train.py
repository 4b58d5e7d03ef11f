"""Where a training step's GPU time goes: one training-benchmark configuration under torch.profiler.

Prints the CUDA kernels by total time over the profiled steps, and the step's time split into
gnn_fastpath kernels, GEMMs, elementwise / cast / reduction kernels and the rest; this is how
the misses of bench_train_full's targets are explained (issue 10). ``--compile default`` (or
``reduce-overhead``) profiles ``torch.compile(model, mode=...)`` after its compile steps;
``--host`` adds the host (CPU) operators by self time, the wall time per step and the GPU
busy share, which says whether a step is bound by host glue or by kernels (issue 13).

    python -m benchmarks.profile_train --graph pokec-like --layer gatv2 --dtype bfloat16 [--mode enabled]
    python -m benchmarks.profile_train --graph tolokers --layer gcn --dtype float32 --compile default --host
"""
from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict

import torch
import torch.nn.functional as F

from . import harness as H
from . import training as BT
from .harness import autocast

#: Kernel-name fragments -> category (first match wins).
CATEGORIES = (
    ("gnn_fastpath", ("gatv2_", "gat_", "dot_", "sr_", "spmm_", "csr_", "cusparse")),
    ("gemm", ("gemm", "sm90_xmma", "cutlass", "ampere_", "sm80_", "nvjet", "cublas")),
    ("cast/copy", ("copy", "convert", "cast")),
    ("elementwise", ("elementwise", "vectorized", "unrolled")),
    ("reduction/scatter", ("reduce", "scatter", "index", "softmax", "nll", "cross_entropy")),
    ("optimizer", ("adam", "multi_tensor", "foreach")),
)


def category(name: str) -> str:
    low = name.lower()
    for cat, keys in CATEGORIES:
        if any(k in low for k in keys):
            return cat
    return "other"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--graph", default="pokec-like")
    p.add_argument("--layer", default="gatv2", choices=BT.LAYERS)
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--mode", default="enabled", choices=BT.MODES)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--json", default=None)
    p.add_argument("--compile", default="none", choices=BT.COMPILE_MODES,
                   help="profile torch.compile(model, mode=...) after its compile steps (default none: eager)")
    p.add_argument("--host", action="store_true", help="also the host operators by self CPU time")
    a = p.parse_args(argv)
    device = torch.device("cuda")
    import torch_geometric as pyg

    gf = H.fastpath()[0]
    data = BT.load_data(a.graph, device, 0, 1.0)
    model = BT.Net(pyg, a.layer, data.x.shape[1], int(data.meta["classes"])).to(device).train()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    compiled = a.compile != "none"
    forward = BT.compile_model(model, a.compile) if compiled else model
    mark = a.compile == "reduce-overhead"

    def step():
        if mark:
            torch.compiler.cudagraph_mark_step_begin()
        opt.zero_grad(set_to_none=True)
        with autocast(device, a.dtype):
            loss = F.cross_entropy(forward(data.x, data.edge_index), data.y)
        loss.backward()
        opt.step()

    activities = [torch.profiler.ProfilerActivity.CUDA]
    if a.host:
        activities.append(torch.profiler.ProfilerActivity.CPU)
    with BT._fastpath_context(gf, a.mode, device):
        for _ in range(BT.COMPILE_WARMUP + 2 if compiled else 3):
            step()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(a.steps):
            step()
        torch.cuda.synchronize()
        wall_ms = (time.perf_counter() - t0) * 1e3 / a.steps
        with torch.profiler.profile(activities=activities) as prof:
            for _ in range(a.steps):
                step()
            torch.cuda.synchronize()
    kernels = defaultdict(lambda: [0.0, 0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            k = kernels[e.name]
            k[0] += e.device_time_total / 1e3 / a.steps  # ms per step
            k[1] += 1
    total = sum(v[0] for v in kernels.values())
    by_cat = defaultdict(float)
    for name, (ms, _) in kernels.items():
        by_cat[category(name)] += ms
    label = f"{a.graph} {a.layer} {a.dtype} {a.mode}" + (f" compiled {a.compile}" if compiled else "")
    print(f"{label}: {total:.2f} ms of GPU kernels per step, {wall_ms:.2f} ms wall per step unprofiled "
          f"(GPU busy {total / wall_ms:.0%}; {torch.cuda.get_device_name()})")
    print("| category | ms / step | share |\n| --- | --- | --- |")
    for cat, ms in sorted(by_cat.items(), key=lambda kv: -kv[1]):
        print(f"| {cat} | {ms:.2f} | {ms / total:.0%} |")
    print("\n| kernel | ms / step | calls / step | category |\n| --- | --- | --- | --- |")
    top = sorted(kernels.items(), key=lambda kv: -kv[1][0])[: a.top]
    for name, (ms, n) in top:
        print(f"| {name[:90]} | {ms:.3f} | {n / a.steps:.0f} | {category(name)} |")
    host = []
    if a.host:
        host = sorted(((e.key, e.self_cpu_time_total / 1e3 / a.steps, e.count / a.steps)
                       for e in prof.key_averages()), key=lambda r: -r[1])[: a.top]
        print("\n| host operator | self CPU ms / step | calls / step |\n| --- | --- | --- |")
        for name, ms, n in host:
            print(f"| {name[:90]} | {ms:.3f} | {n:.0f} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"config": vars(a), "total_ms": total, "wall_ms": wall_ms, "categories": by_cat,
                       "kernels": {k: v for k, v in top}, "host": host}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
