"""Long-run parity: 300 full-batch training steps of every attention layer on Cora, stock vs
``enable()``, float32 and bfloat16.

Models: two layers of the attention layer (hidden 8 x 8 heads, ELU between; AGNN as in PyG's
example: Linear, two AGNN propagations, Linear), feature dropout 0.5 on the input and the
hidden layer with masks drawn from a CPU generator (``_masks``; so stock and enabled, CPU and GPU, drop the
same features at every step; the layers' own attention dropout is 0), Adam (lr 0.005, weight
decay 5e-4), cross-entropy in float32 on the training nodes. Both runs start from the same
parameters.

bfloat16: PyG under ``torch.autocast``; DGL as a bfloat16 module (DGL's CPU build, which stock
runs on here, does not cast under CPU autocast).

Checked, per layer and precision:

- the loss curves agree at every step within ``ATOL + RTOL * loss`` (float32: 0.005 + 0.5 %;
  bfloat16: 0.03 + 3 %): both runs compute the same function with different rounding, which
  Adam's updates carry forward, so the curves drift apart slowly; a wrong gradient moves them
  by 0.1 or more within a few steps;
- the final test accuracy agrees within seed noise: over ``SEEDS`` (different initial
  parameters and dropout masks), the mean accuracy enabled is within the spread (max - min) of
  stock's accuracies of the mean of stock's, and at least 1 point apart is always allowed;
- every layer call ran fused, with no fallback.

On the GPU (``cuda`` marker) the whole thing runs (PyG stock on the GPU; DGL stock on CPU copies,
DGL's PyPI build being CPU-only). On the CPU (CI) one PyG and one DGL layer run ``CPU_STEPS``
steps and one seed on the reference ops. ``GNN_FASTPATH_PARITY_JSON`` set: the curves' largest
differences and the accuracies are appended there, one JSON line per layer and precision.
"""
from __future__ import annotations

import contextlib
import copy
import json
import os
import warnings
from typing import Dict, List

import pytest
import torch
import torch.nn.functional as F

import gnn_fastpath
from gnn_fastpath import FastpathFallbackWarning

STEPS = 300
CPU_STEPS = 10
SEEDS = (0, 1, 2)
MASK_POOL = 16
HIDDEN, HEADS, DROPOUT = 8, 8, 0.5
TOL = {"float32": (0.005, 0.005), "bfloat16": (0.03, 0.03)}  # (ATOL, RTOL) per step
PYG_LAYERS = ["GATv2Conv", "GATConv", "TransformerConv", "AGNNConv"]
DGL_LAYERS = ["GATv2Conv", "GATConv", "AGNNConv"]
_RESULTS: List[dict] = []


# --------------------------------------------------------------------------- models
class PygNet(torch.nn.Module):
    def __init__(self, layer: str, f_in: int, classes: int):
        super().__init__()
        import torch_geometric.nn as gnn

        self.layer = layer
        if layer == "AGNNConv":
            self.lin1, self.lin2 = torch.nn.Linear(f_in, 16), torch.nn.Linear(16, classes)
            self.conv1, self.conv2 = gnn.AGNNConv(requires_grad=False), gnn.AGNNConv(requires_grad=True)
        else:
            conv = getattr(gnn, layer)
            self.conv1 = conv(f_in, HIDDEN, heads=HEADS)
            self.conv2 = conv(HIDDEN * HEADS, classes, heads=1)

    def forward(self, x, edge_index, masks):
        x = x * masks[0]
        if self.layer == "AGNNConv":
            x = F.relu(self.lin1(x))
            x = self.conv2(self.conv1(x, edge_index), edge_index)
            return self.lin2(x * masks[1][:, : x.size(1)])
        x = F.elu(self.conv1(x, edge_index))
        return self.conv2(x * masks[1], edge_index)


class DglNet(torch.nn.Module):
    def __init__(self, layer: str, f_in: int, classes: int):
        super().__init__()
        import dgl.nn as dglnn

        self.layer = layer
        if layer == "AGNNConv":
            self.lin1, self.lin2 = torch.nn.Linear(f_in, 16), torch.nn.Linear(16, classes)
            self.conv1, self.conv2 = dglnn.AGNNConv(learn_beta=False), dglnn.AGNNConv(learn_beta=True)
        else:
            conv = getattr(dglnn, layer)
            self.conv1 = conv(f_in, HIDDEN, HEADS)
            self.conv2 = conv(HIDDEN * HEADS, classes, 1)

    def forward(self, g, x, masks):
        x = x * masks[0]
        if self.layer == "AGNNConv":
            x = F.relu(self.lin1(x))
            x = self.conv2(g, self.conv1(g, x))
            return self.lin2(x * masks[1][:, : x.size(1)])
        x = F.elu(self.conv1(g, x).flatten(1))
        return self.conv2(g, x * masks[1]).mean(1)


# --------------------------------------------------------------------------- training
def _masks(n: int, f_in: int, steps: int, seed: int, device: torch.device, dtype: torch.dtype):
    """Per step, the two dropout masks (scaled): one of ``MASK_POOL`` masks drawn once from a CPU
    generator, its rows rolled by a random shift, both picked per step by that generator. The
    same for every run, and cheap: a fresh CPU draw of the input-wide mask at every step costs
    more than the step."""
    gen = torch.Generator().manual_seed(10_000 + seed)
    keep = 1.0 - DROPOUT
    pools = [(torch.rand(MASK_POOL, n, width, generator=gen) < keep).to(device) for width in (f_in, HIDDEN * HEADS)]
    for _ in range(steps):
        picks, shifts = torch.randint(MASK_POOL, (2,), generator=gen).tolist(), torch.randint(n, (2,), generator=gen).tolist()
        yield [pool[p].roll(shift, 0).to(dtype) / keep for pool, p, shift in zip(pools, picks, shifts)]


def _train(framework: str, model, data, device: torch.device, dtype: str, enabled: bool, steps: int, seed: int):
    """(losses per step, final test accuracy, stats of the layer classes)."""
    model = copy.deepcopy(model).to(device)
    half = framework == "dgl" and dtype == "bfloat16"  # DGL: a bfloat16 module
    if half:
        model = model.to(torch.bfloat16)
    x, y = data["x"].to(device), data["y"].to(device)
    if half:
        x = x.to(torch.bfloat16)
    graph = data["graph"] if framework == "dgl" else data["edge_index"].to(device)
    train, test = data["train_mask"].to(device), data["test_mask"].to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.005, weight_decay=5e-4)
    autocast = (torch.autocast(device.type, dtype=torch.bfloat16) if dtype == "bfloat16" and not half
                else contextlib.nullcontext())
    switch = gnn_fastpath.enabled(frameworks=framework, cpu="reference") if enabled else contextlib.nullcontext()
    gnn_fastpath.reset_stats()
    losses = []
    with switch, warnings.catch_warnings():
        warnings.simplefilter("error", FastpathFallbackWarning)
        model.train()
        for masks in _masks(x.size(0), x.size(1), steps, seed, device, x.dtype):
            optimizer.zero_grad(set_to_none=True)
            with autocast:
                out = model(graph, x, masks) if framework == "dgl" else model(x, graph, masks)
            loss = F.cross_entropy(out.float()[train], y[train])
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        model.eval()
        ones = [torch.ones(x.size(0), w, device=device, dtype=x.dtype) for w in (x.size(1), HIDDEN * HEADS)]
        with torch.no_grad(), autocast:
            out = model(graph, x, ones) if framework == "dgl" else model(x, graph, ones)
        acc = (out.float().argmax(1)[test] == y[test]).float().mean().item()
    return losses, acc, gnn_fastpath.stats()


def _compare(framework: str, layer: str, data, device: torch.device, dtype: str, steps: int, seeds) -> dict:
    backend = "cuda" if device.type == "cuda" else "reference"
    # DGL's PyPI build is CPU-only: stock DGL runs on CPU copies
    stock_device = torch.device("cpu") if framework == "dgl" else device
    atol, rtol = TOL[dtype]
    net = DglNet if framework == "dgl" else PygNet
    row = {"framework": framework, "layer": layer, "dtype": dtype, "steps": steps, "device": str(device),
           "seeds": list(seeds), "stock_acc": [], "enabled_acc": [], "max_loss_diff": 0.0, "first_loss": None,
           "last_loss_stock": [], "last_loss_enabled": []}
    problems = []
    for seed in seeds:
        torch.manual_seed(seed)
        model = net(layer, data["x"].size(1), int(data["y"].max()) + 1)
        stock, acc_s, _ = _train(framework, model, data, stock_device, dtype, False, steps, seed)
        fused, acc_f, stats = _train(framework, model, data, device, dtype, True, steps, seed)
        key = f"{framework}.{layer}"
        counts = stats[key]
        if counts["fused"][backend] != 2 * (steps + 1) or counts["fallback"]:  # + the evaluation
            problems.append(f"seed {seed}: not every call fused: {counts}")
        for step, (s, f) in enumerate(zip(stock, fused)):
            if abs(f - s) > atol + rtol * abs(s):
                problems.append(f"seed {seed} step {step}: stock loss {s:.5f}, enabled {f:.5f}")
                break
        if not (stock[-1] < 0.9 * stock[0] and fused[-1] < 0.9 * fused[0]):
            problems.append(f"seed {seed}: did not train ({stock[0]:.3f} -> {stock[-1]:.3f} stock, "
                            f"{fused[-1]:.3f} enabled)")
        row["max_loss_diff"] = max(row["max_loss_diff"], max(abs(f - s) for s, f in zip(stock, fused)))
        row["first_loss"] = stock[0]
        row["last_loss_stock"].append(stock[-1])
        row["last_loss_enabled"].append(fused[-1])
        row["stock_acc"].append(acc_s)
        row["enabled_acc"].append(acc_f)
    mean = lambda v: sum(v) / len(v)  # noqa: E731
    row["stock_spread"] = max(row["stock_acc"]) - min(row["stock_acc"])
    row["acc_gap"] = mean(row["enabled_acc"]) - mean(row["stock_acc"])
    if abs(row["acc_gap"]) > max(row["stock_spread"], 0.01):
        problems.append(f"accuracy {row['enabled_acc']} enabled vs {row['stock_acc']} stock")
    row["problems"] = problems
    _RESULTS.append(row)
    _write_results()  # whether or not it passes, and before a time limit can cut the run
    assert not problems, f"{framework}.{layer} {dtype}: " + "; ".join(problems)
    return row


# --------------------------------------------------------------------------- data
@pytest.fixture(scope="module")
def cora_data(cora):
    return {"x": cora.x, "y": cora.y, "edge_index": cora.edge_index, "train_mask": cora.train_mask,
            "test_mask": cora.test_mask}


@pytest.fixture(scope="module")
def cora_dgl(cora_data, dgl):
    src, dst = cora_data["edge_index"]
    g = dgl.add_self_loop(dgl.remove_self_loop(dgl.graph((src, dst), num_nodes=cora_data["x"].size(0))))
    return dict(cora_data, graph=g)


@pytest.fixture(autouse=True)
def _clean(clean_fastpath):
    yield


def _write_results():
    """Every row so far into ``GNN_FASTPATH_PARITY_JSON`` (JSON lines; pytest-xdist workers
    append to one file)."""
    path = os.environ.get("GNN_FASTPATH_PARITY_JSON")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(_RESULTS[-1]) + "\n")


# --------------------------------------------------------------------------- tests
@pytest.mark.data
@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("layer", PYG_LAYERS)
def test_pyg_long_run_gpu(cora_data, layer, dtype, no_cpu_only_torch_sparse):
    _compare("pyg", layer, cora_data, torch.device("cuda"), dtype, STEPS, SEEDS)


@pytest.mark.data
@pytest.mark.cuda
@pytest.mark.dgl
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("layer", DGL_LAYERS)
def test_dgl_long_run_gpu(cora_dgl, layer, dtype):
    _compare("dgl", layer, cora_dgl, torch.device("cuda"), dtype, STEPS, SEEDS)


@pytest.mark.data
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_pyg_parity_cpu(cora_data, dtype):
    _compare("pyg", "GATv2Conv", cora_data, torch.device("cpu"), dtype, CPU_STEPS, SEEDS[:1])


@pytest.mark.data
@pytest.mark.dgl
def test_dgl_parity_cpu(cora_dgl):
    _compare("dgl", "GATConv", cora_dgl, torch.device("cpu"), "float32", CPU_STEPS, SEEDS[:1])
