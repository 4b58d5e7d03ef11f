"""Where a training step's GPU time goes: one bench_train configuration under torch.profiler.

Prints the CUDA kernels by total time over the profiled steps, and the step's time split into
gnn_fastpath kernels, GEMMs, elementwise / cast / reduction kernels and the rest; this is how
the misses of bench_train's targets are explained (issue 10).

    python -m benchmarks.profile_train --graph pokec-like --layer gatv2 --dtype bfloat16 [--mode enabled]
"""
from __future__ import annotations

import argparse
import json
from collections import defaultdict

import torch
import torch.nn.functional as F

from . import bench_train as BT
from .timing import autocast

#: Kernel-name fragments -> category (first match wins).
CATEGORIES = (
    ("gnn_fastpath", ("gatv2_", "dot_", "sr_", "spmm_", "csr_", "cusparse")),
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
    a = p.parse_args(argv)
    device = torch.device("cuda")
    import torch_geometric as pyg

    gf = BT._fastpath()[0]
    data = BT.load_data(a.graph, device, 0, 1.0)
    model = BT.Net(pyg, a.layer, data.x.shape[1], int(data.meta["classes"])).to(device).train()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)

    def step():
        opt.zero_grad(set_to_none=True)
        with autocast(device, a.dtype):
            loss = F.cross_entropy(model(data.x, data.edge_index), data.y)
        loss.backward()
        opt.step()

    with BT._fastpath_context(gf, a.mode, device):
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
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
    print(f"{a.graph} {a.layer} {a.dtype} {a.mode}: {total:.2f} ms of GPU kernels per step "
          f"({torch.cuda.get_device_name()})")
    print("| category | ms / step | share |\n| --- | --- | --- |")
    for cat, ms in sorted(by_cat.items(), key=lambda kv: -kv[1]):
        print(f"| {cat} | {ms:.2f} | {ms / total:.0%} |")
    print("\n| kernel | ms / step | calls / step | category |\n| --- | --- | --- | --- |")
    top = sorted(kernels.items(), key=lambda kv: -kv[1][0])[: a.top]
    for name, (ms, n) in top:
        print(f"| {name[:90]} | {ms:.3f} | {n / a.steps:.0f} | {category(name)} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"config": vars(a), "total_ms": total, "categories": by_cat,
                       "kernels": {k: v for k, v in top}}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
