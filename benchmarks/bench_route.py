"""Host cost of the two ways an op can carry its autograd: a ``torch.autograd.Function`` or a
``torch.library`` custom operator with ``register_autograd``, with the same trivial body and an
argument list the size of the attention ops' (graph operands, features, optional tensors,
scalars), so that only the route differs.

    python -m benchmarks.bench_route                   # on the CPU (the host path is the subject)
    python -m benchmarks.bench_route --device cuda

Per route: ``fwd`` = one call with autograd recording; ``fwd_bwd`` = that and ``backward()``.
Microseconds per call, best of ``--rounds`` rounds of ``--calls`` calls (host clock; on CUDA the
device is synchronised around each round). ``baseline`` is the same body called directly.
"""
from __future__ import annotations

import argparse
import time

import torch

from benchmarks import harness

NS = "gnn_fastpath_route_bench"
_lib = None


def _register():
    global _lib
    if _lib is not None:
        return
    _lib = torch.library.Library(NS, "DEF")
    _lib.define("fwd(Tensor indptr, Tensor indices, Tensor perm, Tensor? a, Tensor? b, Tensor? c, Tensor? d, "
                "SymInt n, Tensor x, Tensor s, Tensor t, Tensor? u, Tensor? w, float slope, float p, Tensor? rng, "
                "int code, ScalarType dt) -> (Tensor, Tensor, Tensor)")
    _lib.define("bwd(Tensor indptr, Tensor x, Tensor out, Tensor lse, Tensor g, bool[] needs) -> (Tensor, Tensor)")
    torch.library.impl(f"{NS}::fwd", ("CPU", "CUDA"), lambda *a: (a[8].clone(), a[9].clone(), a[8].new_empty(0)),
                       lib=_lib)
    torch.library.impl(f"{NS}::bwd", ("CPU", "CUDA"), lambda ip, x, out, lse, g, needs: (g.clone(), lse.clone()),
                       lib=_lib)
    torch.library.register_fake(f"{NS}::fwd", lambda *a: (torch.empty_like(a[8]), torch.empty_like(a[9]),
                                                         a[8].new_empty(0)), lib=_lib)

    def setup(ctx, inputs, output):
        ctx.inputs, ctx.output = inputs, output

    def backward(ctx, grad_out, grad_lse, grad_alpha):
        gx, gs = getattr(torch.ops, NS).bwd(ctx.inputs[0], ctx.inputs[8], ctx.output[0], ctx.output[1], grad_out,
                                            [True, True])
        grads = [None] * 18
        grads[8], grads[9] = gx, gs
        return tuple(grads)

    torch.library.register_autograd(f"{NS}::fwd", backward, setup_context=setup, lib=_lib)


class _Function(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, s, t, u, w, graph, slope, ret, p, seed, offset, out_dtype):
        out, lse = x.clone(), s.clone()
        ctx.save_for_backward(x, out, lse)
        ctx.graph = graph
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        _, _, lse = ctx.saved_tensors
        return (grad_out.clone(), lse.clone()) + (None,) * 10


def _time(fn, backward: bool, calls: int, rounds: int, device: torch.device) -> float:
    def once():
        out = fn()
        if backward:
            out.sum().backward()

    for _ in range(max(calls // 10, 10)):
        once()
    best = float("inf")
    for _ in range(rounds):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            once()
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json-out", default=None)
    parser.add_argument("--md", default=None)
    args = parser.parse_args(argv)
    device = harness.pick_device(args.device)
    _register()
    n, heads, width = 64, 4, 16
    x = torch.randn(n, heads, width, device=device, requires_grad=True)
    s = torch.randn(n, heads, device=device, requires_grad=True)
    t = torch.randn(n, heads, device=device)
    indptr = torch.zeros(n + 1, dtype=torch.int32, device=device)
    indices = torch.zeros(4 * n, dtype=torch.int32, device=device)
    op = getattr(torch.ops, NS).fwd.default
    routes = {
        "baseline": lambda: x.clone(),
        "autograd.Function": lambda: _Function.apply(x, s, t, None, None, object(), 0.2, False, 0.0, 0, 0,
                                                     torch.float32),
        "custom op + register_autograd": lambda: op(indptr, indices, indices, None, None, None, None, n, x, s, t,
                                                    None, None, 0.2, 0.0, None, 0, torch.float32)[0],
    }
    rows = []
    for name, fn in routes.items():
        rows.append({"route": name,
                     "fwd_us": _time(fn, False, args.calls, args.rounds, device),
                     "fwd_bwd_us": _time(fn, True, args.calls, args.rounds, device)})
    env = harness.environment()
    env["device"] = str(device)
    text = "\n\n".join([harness.env_header(env) + f"; device {device}",
                        harness.markdown_table(rows, ["route", "fwd_us", "fwd_bwd_us"],
                                               ["route", "fwd (us)", "fwd+bwd (us)"],
                                               {"fwd_us": harness.fmt, "fwd_bwd_us": harness.fmt})])
    harness.publish({"benchmark": "route", "environment": env, "settings": vars(args), "rows": rows}, text,
                    args.json_out, args.md)


if __name__ == "__main__":
    main()
