"""The one dispatch: which backend an op call runs on, and why (gnn_fastpath.ops.dispatch)."""
from __future__ import annotations

import types
import warnings

import pytest
import torch

import gnn_fastpath
from gnn_fastpath import config, ops
from gnn_fastpath.ops import dispatch

CUDA0 = torch.device("cuda", 0)
CPU = torch.device("cpu")


def _graph(fits: bool = True):
    return types.SimpleNamespace(fits_int32=lambda: fits, num_edges=2**31 if not fits else 10, n_src=5, n_dst=5)


@pytest.fixture
def kernels_here(monkeypatch):
    """Pretend the CUDA kernels can run (decide only asks cuda.unavailable_reason)."""
    monkeypatch.setattr(gnn_fastpath.cuda, "unavailable_reason", lambda: None)


def test_fused_when_everything_fits(kernels_here):
    assert dispatch.decide(CUDA0, torch.float32, _graph()) == dispatch.Decision("cuda")


@pytest.mark.parametrize("device,dtype,graph,limit,forced,reason", [
    (CUDA0, torch.float64, _graph(), None, False, "dtype"),
    (CUDA0, torch.float64, _graph(False), "too wide", True, "dtype"),  # dtype comes first
    (CUDA0, torch.float32, _graph(False), None, True, "forced"),
    (CPU, torch.float32, _graph(False), None, False, "cpu"),
    (CUDA0, torch.float32, _graph(False), "too wide", False, "int32"),
    (CUDA0, torch.float32, _graph(), "too wide", False, "kernel_limit"),
])
def test_reference_reasons_in_order(kernels_here, device, dtype, graph, limit, forced, reason):
    with config.force_reference(forced):
        d = dispatch.decide(device, dtype, graph, limit)
    assert d.backend == "reference" and d.reason == reason and d.detail


def test_no_kernel_reason_says_why(monkeypatch):
    monkeypatch.setattr(gnn_fastpath.cuda, "unavailable_reason", lambda: "no CuPy here")
    assert dispatch.decide(CUDA0, torch.float32) == dispatch.Decision("reference", "no_kernel", "no CuPy here")


def test_backend_for(kernels_here):
    x = types.SimpleNamespace(device=CUDA0, dtype=torch.float32)
    assert ops.backend_for("spmm", x) == "cuda"
    with ops.force_reference():
        assert ops.backend_for("spmm", x) == "reference"
    with pytest.raises(ValueError, match="op must be one of"):
        ops.backend_for("conv", x)


def test_choose_warns_once_per_op_and_reason_for_cuda_inputs(kernels_here, monkeypatch):
    monkeypatch.setattr(dispatch, "_warned", set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            assert dispatch.choose("dot_attention", CUDA0, torch.float32, _graph(), heads=(4, 600)) == "reference"
        assert dispatch.choose("dot_attention", CPU, torch.float32) == "reference"  # CPU: silent
        with config.force_reference():
            assert dispatch.choose("spmm", CUDA0, torch.float32) == "reference"  # forced: silent
    assert [str(w.message) for w in caught] == [
        "gnn_fastpath: dot_attention runs its reference op on CUDA tensors (kernel_limit: head width D=600 "
        "above 512); "
        "warned once per op and reason"]


def test_recording_inside_a_layer(kernels_here, monkeypatch):
    monkeypatch.setattr(config, "_cpu", {"mode": "reference"})
    with dispatch.recording() as ran:
        assert dispatch.choose("spmm", CPU, torch.float32) == "reference"  # accepted: cpu="reference"
        assert ran.backend == "reference"
        with pytest.raises(dispatch.Unsupported) as exc:
            dispatch.choose("spmm", CUDA0, torch.float32, _graph(False))
        assert exc.value.reason == "int32"
    with dispatch.recording() as ran:
        assert dispatch.choose("spmm", CUDA0, torch.float32, _graph()) == "cuda"
    assert ran.backend == "cuda"
    monkeypatch.setattr(config, "_cpu", {"mode": "stock"})
    with dispatch.recording(), pytest.raises(dispatch.Unsupported, match="cpu"):
        dispatch.choose("spmm", CPU, torch.float32)
    assert getattr(dispatch._local, "call", None) is None  # closed


def test_require_only_inside_a_layer_and_before_any_work(kernels_here, monkeypatch):
    """require() raises what the op would raise, at the point the layer calls it; outside a
    layer (a direct op call) it does nothing."""
    dispatch.require("gatv2_attention", CUDA0, torch.float32, _graph(False), heads=(2, 64))  # no layer: nothing
    with dispatch.recording() as ran:
        dispatch.require("spmm", CUDA0, torch.float32, _graph())  # fits: nothing, nothing recorded
        assert ran.backend is None
        with pytest.raises(dispatch.Unsupported) as exc:
            dispatch.require("gatv2_attention", CUDA0, torch.float32, _graph(), heads=(2, 600))
        assert exc.value.reason == "kernel_limit"
        with pytest.raises(dispatch.Unsupported, match="int32"):
            dispatch.require("spmm", CUDA0, torch.float32, _graph(False))


def _compile_and_run(f, arg=None, **compile_kwargs) -> None:
    """``torch.compile(f, **compile_kwargs)`` called once on ``arg`` (a tensor of two ones by
    default), between two dynamo resets."""
    torch._dynamo.reset()
    try:
        torch.compile(f, **compile_kwargs)(torch.ones(2) if arg is None else arg)
    finally:
        torch._dynamo.reset()


def _seen_while_compiling(**compile_kwargs) -> list:
    """What compiling_with_cuda_graphs() said while dynamo traced a function compiled with
    ``compile_kwargs`` (the function never runs under CUDA graphs on the CPU, but inductor is
    told to record them)."""
    seen = []

    def f(x):
        seen.append(dispatch.compiling_with_cuda_graphs())
        return x + 1

    _compile_and_run(f, **compile_kwargs)
    return seen


@pytest.mark.parametrize("compile_kwargs, expected", [
    ({}, False),
    ({"mode": "reduce-overhead"}, True),
    ({"mode": "max-autotune-no-cudagraphs"}, False),
    ({"options": {"triton.cudagraphs": True}}, True),
    ({"backend": "aot_eager"}, False),
    ({"backend": "cudagraphs"}, True),
], ids=["default", "reduce-overhead", "max-autotune-no-cudagraphs", "options", "aot_eager", "cudagraphs"])
def test_compiling_with_cuda_graphs_reads_the_compile_call(compile_kwargs, expected):
    """Read while dynamo traces, from the torch.compile call's mode, options or backend."""
    assert _seen_while_compiling(**compile_kwargs) == [expected]


def test_compiling_with_cuda_graphs_follows_inductors_global_config():
    from torch._inductor import config as inductor_config

    with inductor_config.patch({"triton.cudagraphs": True}):
        assert _seen_while_compiling() == [True]
    assert dispatch.compiling_with_cuda_graphs() is False  # eager: not tracing at all


def test_compiling_with_cuda_graphs_per_compiled_function_in_one_process():
    """One function compiled both ways, no reset between: each compiled version keeps its own
    answer (dynamo keys its cache on the backend; the answer is no guard)."""
    def f(x):
        return x + (10 if dispatch.compiling_with_cuda_graphs() else 0)

    torch._dynamo.reset()
    try:
        default, graphs = torch.compile(f), torch.compile(f, mode="reduce-overhead")
        for _ in range(2):
            assert default(torch.zeros(2)).tolist() == [0, 0]
            assert graphs(torch.zeros(2)).tolist() == [10, 10]
    finally:
        torch._dynamo.reset()


def _running_callback(**compile_kwargs):
    """The frame-evaluation callback of a compiled function while it runs, read from a frame
    that dynamo runs in Python (``recursive=False``: a graph break around it, the callback kept
    for what it calls), as a layer call the model's frame breaks around is run. Called on a
    plain int: no graph, so the backend (CUDA graphs included) never compiles or runs anything."""
    from torch._C._dynamo.eval_frame import get_eval_frame_callback

    seen = []

    @torch.compiler.disable(recursive=False)
    def probe():
        seen.append(get_eval_frame_callback())

    def f(x):
        probe()
        return x + 1

    _compile_and_run(f, 1, **compile_kwargs)
    return seen[0]


@pytest.mark.parametrize("compile_kwargs, expected", [
    ({}, False),
    ({"mode": "reduce-overhead"}, True),
    ({"options": {"triton.cudagraphs": True}}, True),
    ({"backend": "aot_eager"}, False),
    ({"backend": "cudagraphs"}, True),
], ids=["default", "reduce-overhead", "options", "aot_eager", "cudagraphs"])
def test_records_cuda_graphs_reads_a_running_compiled_function(compile_kwargs, expected):
    """The same answer from the callback of a compiled function that is running (what a layer
    call that dynamo enters as a frame of its own reads) as from the traced compile call."""
    callback = _running_callback(**compile_kwargs)
    assert callback
    assert dispatch.records_cuda_graphs(callback) is expected
    assert dispatch.records_cuda_graphs(None) is False
