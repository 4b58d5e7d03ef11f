"""Training under bf16 autocast: 50 full-batch steps on Cora, stock PyG vs ``enable()``.

Two models, each two layers (hidden 8 x 8 heads, ELU between, no dropout so that both runs
draw no random numbers): ``GATv2Conv`` and ``TransformerConv``. Both runs start from the same
parameters and take 50 Adam steps (lr 0.01) on the training nodes, the forward under
``torch.autocast(device, dtype=torch.bfloat16)``, the cross-entropy in float32.

Tolerance. The two runs compute the same function with different rounding: the projections
round to bf16 identically, but stock also rounds its messages and softmax where the fused
ops keep float32, so the parameters drift apart by a few bf16 ulps per step and the losses by
a little more each step. The losses must agree at every step within
``ATOL + RTOL * loss`` = 0.01 + 1 %. For scale: the loss falls from about 1.96 to about 0.005
over the 50 steps; measured on the CPU (CPU autocast, reference ops) the largest difference
over the 50 steps is 2.3e-4 (GATv2Conv) and 5.3e-4 (TransformerConv), so the tolerance leaves
~20x for the GPU's other rounding. A wrong dtype rule or a wrong gradient shows up as a
difference of 0.1 or more within a few steps.

The GPU test (``cuda`` marker) runs on CUDA and also checks that every layer call was fused
on backend "cuda"; the CPU test runs the same loop for 10 steps (CI time) with
``enable(cpu="reference")`` under CPU autocast.
"""
from __future__ import annotations

import contextlib
import copy
import warnings

import pytest
import torch
import torch.nn.functional as F

import gnn_fastpath
from gnn_fastpath import FastpathFallbackWarning

STEPS = 50
CPU_STEPS = 10
ATOL, RTOL = 0.01, 0.01


class Net(torch.nn.Module):
    def __init__(self, layer: str, f_in: int, classes: int, hidden: int = 8, heads: int = 8):
        super().__init__()
        from torch_geometric.nn import GATv2Conv, TransformerConv

        conv = {"GATv2Conv": GATv2Conv, "TransformerConv": TransformerConv}[layer]
        self.conv1 = conv(f_in, hidden, heads=heads)
        self.conv2 = conv(hidden * heads, classes, heads=1)

    def forward(self, x, edge_index):
        return self.conv2(F.elu(self.conv1(x, edge_index)), edge_index)


def _train(model, data, device, enabled: bool, steps: int = STEPS):
    model = copy.deepcopy(model).to(device)
    x, edge_index = data.x.to(device), data.edge_index.to(device)
    y, mask = data.y.to(device), data.train_mask.to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    switch = gnn_fastpath.enabled(frameworks="pyg", cpu="reference") if enabled else contextlib.nullcontext()
    losses = []
    with switch, warnings.catch_warnings():
        warnings.simplefilter("error", FastpathFallbackWarning)
        for _ in range(steps):
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=torch.bfloat16):
                out = model(x, edge_index)
            loss = F.cross_entropy(out.float()[mask], y[mask])
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return losses


def _compare(data, layer: str, device: torch.device, backend: str, steps: int = STEPS):
    torch.manual_seed(0)
    model = Net(layer, data.num_features, int(data.y.max()) + 1)
    stock = _train(model, data, device, enabled=False, steps=steps)
    gnn_fastpath.disable()
    gnn_fastpath.reset_stats()
    fused = _train(model, data, device, enabled=True, steps=steps)
    counts = gnn_fastpath.stats()[f"pyg.{layer}"]
    assert counts["fused"][backend] == 2 * steps and not counts["fallback"], counts
    for step, (s, f) in enumerate(zip(stock, fused)):
        assert abs(f - s) <= ATOL + RTOL * abs(s), f"step {step}: stock loss {s:.4f}, enabled {f:.4f}"
    assert stock[-1] < 0.9 * stock[0] and fused[-1] < 0.9 * fused[0]  # both actually trained


@pytest.fixture(autouse=True)
def _clean(clean_fastpath):
    yield


@pytest.mark.data
@pytest.mark.cuda
@pytest.mark.parametrize("layer", ["GATv2Conv", "TransformerConv"])
def test_train_bf16_autocast_gpu(cora, layer):
    _compare(cora, layer, torch.device("cuda"), "cuda")


@pytest.mark.data
@pytest.mark.parametrize("layer", ["GATv2Conv", "TransformerConv"])
def test_train_bf16_autocast_cpu(cora, layer):
    _compare(cora, layer, torch.device("cpu"), "reference", steps=CPU_STEPS)
