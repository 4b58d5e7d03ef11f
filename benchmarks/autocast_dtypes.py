"""What stock PyG layers do under ``torch.autocast`` and as half-precision modules: the dtype
of every output, of the messages and of the aggregation, and of the gradients.

The fused shims must return what stock returns; this script is how those rules were found
(issue 10) and how to re-check them on a new PyG or torch. Run on a CUDA machine:

    python benchmarks/autocast_dtypes.py [--json out.json]

DGL's stock layers cannot run on CUDA with the PyPI build; their rules come from DGL's code
(its sparse ops cast their inputs to the autocast dtype: ``dgl/backend/pytorch/sparse.py``).
"""
from __future__ import annotations

import argparse
import json

import torch


def _layers():
    from torch_geometric.nn import GATv2Conv, GCNConv, SAGEConv, TransformerConv

    return {
        "GATv2Conv": lambda: GATv2Conv(16, 8, heads=2),
        "GATv2Conv(edge_dim, residual)": lambda: GATv2Conv(16, 8, heads=2, edge_dim=4, residual=True),
        "GATv2Conv(concat=False)": lambda: GATv2Conv(16, 8, heads=2, concat=False),
        "TransformerConv": lambda: TransformerConv(16, 8, heads=2),
        "TransformerConv(edge_dim, beta)": lambda: TransformerConv(16, 8, heads=2, edge_dim=4, beta=True),
        "TransformerConv(concat=False, no root)": lambda: TransformerConv(16, 8, heads=2, concat=False,
                                                                          root_weight=False),
        "GCNConv": lambda: GCNConv(16, 8),
        "GCNConv(normalize=False)": lambda: GCNConv(16, 8, normalize=False),
        "SAGEConv(mean)": lambda: SAGEConv(16, 8),
        "SAGEConv(max)": lambda: SAGEConv(16, 8, aggr="max"),
        "SAGEConv(min, project, normalize)": lambda: SAGEConv(16, 8, aggr="min", project=True, normalize=True),
        "SAGEConv(sum)": lambda: SAGEConv(16, 8, aggr="sum"),
    }


def _probe(module, x, edge_index, edge_attr, autocast_dtype):
    seen = {}

    def hook(key):
        def record(module, inputs, output):
            seen.setdefault(key, str(output.dtype))  # returns None: the output stays as it is
        return record

    module.register_message_forward_hook(hook("message"))
    module.register_aggregate_forward_hook(hook("aggregate"))
    x = x.clone().requires_grad_()
    kwargs = {}
    if edge_attr is not None and getattr(module, "lin_edge", None) is not None:
        kwargs["edge_attr"] = edge_attr
    attention = "Conv" in type(module).__name__ and type(module).__name__ in ("GATv2Conv", "TransformerConv")
    if attention:
        kwargs["return_attention_weights"] = True
    with torch.autocast(x.device.type, dtype=autocast_dtype or torch.bfloat16, enabled=autocast_dtype is not None):
        out = module(x, edge_index, **kwargs)
        alpha = None
        if attention:
            out, (_, alpha) = out
        loss = out.float().square().mean()
    loss.backward()
    seen["out"] = str(out.dtype)
    if alpha is not None:
        seen["alpha"] = str(alpha.dtype)
    seen["x.grad"] = str(x.grad.dtype)
    seen["param grads"] = sorted({str(p.grad.dtype) for p in module.parameters() if p.grad is not None})
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=None)
    parser.add_argument("--device", default="cuda", help="cpu only checks that the script runs")
    args = parser.parse_args()
    torch.manual_seed(0)
    dev = args.device
    x = torch.randn(50, 16, device=dev)
    edge_index = torch.randint(0, 50, (2, 200), device=dev)
    edge_attr = torch.randn(200, 4, device=dev)
    rows = []
    for name, make in _layers().items():
        for mode in ("autocast bf16", "autocast fp16", "module bf16", "module fp16"):
            half = torch.bfloat16 if "bf16" in mode else torch.float16
            module = make().to(dev)
            xin, ea = x, edge_attr
            if mode.startswith("module"):
                module = module.to(half)
                xin, ea = x.to(half), edge_attr.to(half)
            seen = _probe(module, xin, edge_index, ea, half if mode.startswith("autocast") else None)
            rows.append({"layer": name, "mode": mode, **seen})
            print(f"{name:40s} {mode:14s} " + " ".join(f"{k}={v}" for k, v in seen.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "device": torch.cuda.get_device_name() if dev == "cuda" else dev, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
