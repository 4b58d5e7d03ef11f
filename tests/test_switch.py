"""enable() / disable() / enabled(): patching is exact, reversible, idempotent and inert
where it should be; patched modules keep their state_dict, pickle, and still script."""
from __future__ import annotations

import logging
import pickle
import sys
import warnings

import pytest
import torch

import gnn_fastpath
from gnn_fastpath import config, switch
from gnn_fastpath.integrations import shim as shim_mod


@pytest.fixture(autouse=True)
def _off():
    gnn_fastpath.disable()
    gnn_fastpath.reset_stats()
    yield
    gnn_fastpath.disable()
    gnn_fastpath.reset_stats()


def _all_shim_classes(frameworks=switch.FRAMEWORKS):
    classes = []
    for f in frameworks:
        try:
            classes += [s.cls for s in switch._shims_for(f)]
        except ImportError as exc:
            if not switch._not_installed(f, exc):
                raise
    return classes


_MISSING = object()


def _call_attrs(classes):
    return {cls: cls.__dict__.get("__call__", _MISSING) for cls in classes}


def test_disable_restores_every_class_exactly():
    classes = _all_shim_classes()
    before = _call_attrs(classes)
    absent = [cls for cls in classes if "__call__" not in cls.__dict__]
    gnn_fastpath.enable()
    assert set(gnn_fastpath.switch.patched_classes()) == set(classes)
    for cls in classes:
        assert cls.__dict__["__call__"].__gnn_fastpath_shim__.cls is cls
    gnn_fastpath.disable()
    after = _call_attrs(classes)
    for cls in classes:
        assert after[cls] is before[cls], cls
    for cls in absent:
        assert "__call__" not in cls.__dict__, cls
    assert not gnn_fastpath.is_enabled() and not switch.patched_classes()


def test_disable_restores_a_class_own_call(monkeypatch):
    class Own(torch.nn.Module):
        def __call__(self, *args, **kwargs):  # a class that defines its own __call__
            return "own"

        def forward(self, x):
            return x

    own_call = Own.__dict__["__call__"]
    fake = shim_mod.Shim(key="test.Own", cls=Own, forward=lambda m, b, x: x, op="spmm", features=lambda x: x)
    monkeypatch.setattr(switch, "_shims_for", lambda framework: [fake] if framework == "pyg" else [])
    gnn_fastpath.enable(frameworks="pyg")
    assert Own.__dict__["__call__"] is not own_call
    gnn_fastpath.disable()
    assert Own.__dict__["__call__"] is own_call


def test_enable_twice_is_harmless():
    gnn_fastpath.enable()
    first = _call_attrs(_all_shim_classes())
    gnn_fastpath.enable()
    assert _call_attrs(_all_shim_classes()) == first
    gnn_fastpath.disable()
    assert not switch.patched_classes()
    for cls in _all_shim_classes():
        assert not hasattr(cls.__dict__.get("__call__"), "__gnn_fastpath_shim__")


def test_env_zero_makes_enable_a_no_op(monkeypatch):
    before = _call_attrs(_all_shim_classes())
    monkeypatch.setenv("GNN_FASTPATH", "0")
    gnn_fastpath.enable()
    with gnn_fastpath.enabled(cpu="reference"):
        assert not gnn_fastpath.is_enabled()
    assert not gnn_fastpath.is_enabled()
    assert _call_attrs(_all_shim_classes()) == before


def test_enabled_restores_the_previous_state(pyg):
    before = _call_attrs(_all_shim_classes())
    with gnn_fastpath.enabled(frameworks="pyg", cpu="reference"):
        assert gnn_fastpath.is_enabled() and config.cpu_mode() == "reference"
    assert not gnn_fastpath.is_enabled()
    assert _call_attrs(_all_shim_classes()) == before

    gnn_fastpath.enable(frameworks="pyg", cpu="stock")
    patched = set(switch.patched_classes())
    with gnn_fastpath.enabled(cpu="reference"):
        assert config.cpu_mode() == "reference"
    assert gnn_fastpath.is_enabled() and config.cpu_mode() == "stock"
    assert set(switch.patched_classes()) == patched

    with pytest.raises(RuntimeError):
        with gnn_fastpath.enabled(frameworks="pyg", cpu="reference"):
            raise RuntimeError("inside")
    assert gnn_fastpath.is_enabled() and config.cpu_mode() == "stock"


def test_frameworks_narrowing(pyg):
    gnn_fastpath.enable(frameworks="pyg")
    assert switch.patched_classes()
    assert all(cls.__module__.startswith("torch_geometric.") for cls in switch.patched_classes())
    gnn_fastpath.disable()
    gnn_fastpath.enable(frameworks=["pyg"])
    assert set(switch.patched_classes()) == set(_all_shim_classes(("pyg",)))


@pytest.mark.parametrize("kwargs", [dict(frameworks="tf"), dict(frameworks=[]), dict(frameworks=["pyg", "jax"]),
                                    dict(frameworks=("PyG",)), dict(cpu="gpu"), dict(cpu="")])
def test_invalid_arguments_raise(kwargs):
    with pytest.raises(ValueError):
        gnn_fastpath.enable(**kwargs)
    assert not gnn_fastpath.is_enabled() and not switch.patched_classes()


class _Net(torch.nn.Module):
    """A small model over the three PyG layers (module level: it must pickle)."""

    def __init__(self):
        from torch_geometric.nn import GATv2Conv, GCNConv, TransformerConv

        super().__init__()
        self.a = TransformerConv(6, 4, heads=2, edge_dim=3, beta=True)
        self.b = GATv2Conv(8, 4, heads=2, edge_dim=3, residual=True)
        self.c = GCNConv(8, 3, cached=True)

    def forward(self, x, edge_index, edge_attr):
        x = self.a(x, edge_index, edge_attr).relu()
        x = self.b(x, edge_index, edge_attr).relu()
        return self.c(x, edge_index)


def _model():
    return _Net()


def _graph(n=15, m=40):
    gen = torch.Generator().manual_seed(0)
    x, edge_attr = torch.randn(n, 6, generator=gen), torch.randn(m, 3, generator=gen)
    return x, torch.randint(0, n, (2, m), generator=gen), edge_attr


def test_state_dict_unchanged(pyg):
    model = _model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with gnn_fastpath.enabled(frameworks="pyg", cpu="reference"):
        during = model.state_dict()
        model(*_graph())  # a fused forward adds nothing either
        after_call = model.state_dict()
    assert gnn_fastpath.stats()["pyg.TransformerConv"]["fused"]["reference"] == 1
    for sd in (during, after_call, model.state_dict()):
        assert list(sd) == list(before)
        for k, v in before.items():
            assert torch.equal(sd[k], v), k


def test_patched_module_pickles(pyg):
    model = _model()
    inputs = _graph()
    expected = model(*inputs)
    with gnn_fastpath.enabled(frameworks="pyg", cpu="reference"):
        clone = pickle.loads(pickle.dumps(model))
        actual = clone(*inputs)
    assert gnn_fastpath.stats()["pyg.GATv2Conv"]["fused"]["reference"] == 1
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-6)
    assert clone.state_dict().keys() == model.state_dict().keys()
    assert "__call__" not in vars(clone.a)  # the patch lives on the class, never on instances


def test_torchscript_while_enabled(pyg):
    import warnings

    from torch_geometric.nn.models import GCN

    model = GCN(6, 8, num_layers=2, out_channels=3)
    x, edge_index, _ = _graph()
    expected = model(x, edge_index)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit.script is deprecated in torch 2.13
        with gnn_fastpath.enabled(frameworks="pyg", cpu="reference"):
            scripted = torch.jit.script(model)
            torch.testing.assert_close(scripted(x, edge_index), expected, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(model(x, edge_index), expected, rtol=1e-5, atol=1e-6)
    assert gnn_fastpath.stats()["pyg.GCNConv"]["fused"]["reference"] == 2  # the eager call only
    torch.testing.assert_close(scripted(x, edge_index), expected, rtol=1e-5, atol=1e-6)  # after disable()


def test_cpu_mode_kept_by_later_enable(pyg):
    """enable(frameworks=...) without cpu= keeps the mode an earlier call chose."""

    gnn_fastpath.enable(frameworks="pyg", cpu="reference")
    gnn_fastpath.enable(frameworks="pyg")
    assert config.cpu_mode() == "reference"
    with gnn_fastpath.enabled(frameworks="pyg"):
        assert config.cpu_mode() == "reference"
    assert config.cpu_mode() == "reference"
    gnn_fastpath.disable()
    assert config.cpu_mode() == "stock"


def test_overridden_message_passing_methods_run_stock(pyg):
    """A subclass or an instance that overrides what the fused forward replaces (message,
    update, propagate, forward...) runs its own code: the fused math would skip it."""
    import warnings

    from torch_geometric.nn import GCNConv

    class Doubled(GCNConv):
        def message(self, x_j, edge_weight):
            return 2 * super().message(x_j, edge_weight)

    torch.manual_seed(0)
    edge_index = torch.randint(0, 10, (2, 40))
    x = torch.randn(10, 6)
    subclass = Doubled(6, 4)
    instance = GCNConv(6, 4)
    instance.update = lambda inputs: 3 * inputs
    expected = [subclass(x, edge_index), instance(x, edge_index)]
    gnn_fastpath.reset_stats()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with gnn_fastpath.enabled(frameworks="pyg", cpu="reference"):
            got = [subclass(x, edge_index), instance(x, edge_index)]
    for a, b in zip(got, expected):
        assert torch.equal(a, b)
    assert gnn_fastpath.stats()["pyg.GCNConv"]["fallback"] == {"subclass": 2}


def test_reset_stats_rearms_the_warning(pyg):
    import warnings

    from torch_geometric.nn import GCNConv

    conv = GCNConv(6, 4).double()
    x, edge_index = torch.randn(10, 6, dtype=torch.float64), torch.randint(0, 10, (2, 30))
    with gnn_fastpath.enabled(frameworks="pyg", cpu="reference"):
        for _ in range(2):
            gnn_fastpath.reset_stats()
            with warnings.catch_warnings(record=True) as caught:
                conv(x, edge_index)
            assert sum(issubclass(w.category, gnn_fastpath.FastpathFallbackWarning) for w in caught) == 1


def test_torch_compile_sees_no_extra_graph_breaks(pyg):
    """Under torch.compile the patched layers trace onto the custom operators
    (torch.ops.gnn_fastpath.*) instead of stepping aside: no more graph breaks than stock,
    and the fused path is what was traced (stats()[layer]["compiled"]). The per-layer
    compile tests live in tests/integrations/pyg/test_compile.py."""
    import warnings

    from torch_geometric.nn import SAGEConv

    class Net(torch.nn.Module):  # traces as one graph when stock
        def __init__(self):
            super().__init__()
            self.c1, self.c2 = SAGEConv(8, 8), SAGEConv(8, 4)

        def forward(self, x, edge_index):
            return self.c2(self.c1(x, edge_index).relu(), edge_index)

    net, x, edge_index = Net(), torch.randn(20, 8), torch.randint(0, 20, (2, 60))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch._dynamo.reset()
        stock = torch._dynamo.explain(net)(x, edge_index).graph_break_count
        torch._dynamo.reset()
        with gnn_fastpath.enabled(frameworks="pyg", cpu="reference"):
            explained = torch._dynamo.explain(net)(x, edge_index)
        torch._dynamo.reset()
    assert explained.graph_break_count <= stock
    counts = gnn_fastpath.stats()["pyg.SAGEConv"]
    assert counts["compiled"] == {"reference": 2}, counts  # both layers traced fused
    assert counts["fused"] == {"cuda": 0, "reference": 0} and counts["fallback"] == {}, counts
    targets = {str(n.target) for g in explained.graphs for n in g.graph.nodes}
    assert "gnn_fastpath.spmm.default" in targets, targets


# ----------------------------------------------------------------------------------------
# What enable() reports: its return value, its log line, frameworks that cannot be imported.

# What ``import dgl`` raises for PyPI's DGL 2.1.0 on torch 2.13 (its GraphBolt imports
# torchdata.datapipes); tests/conftest.py imports DGL through the harness's stub, so a test
# simulates the failure itself.
_GRAPHBOLT_ERROR = "No module named 'torchdata.datapipes'"


@pytest.fixture
def broken_dgl(monkeypatch, tmp_path):
    """DGL installed but failing to import: ``import dgl`` finds a ``dgl`` package whose
    import raises what the PyPI wheel raises on new torch (the real DGL modules come back after
    the test)."""
    package = tmp_path / "dgl"
    package.mkdir()
    (package / "__init__.py").write_text(
        f"raise ModuleNotFoundError({_GRAPHBOLT_ERROR!r}, name='torchdata.datapipes')\n")
    monkeypatch.delitem(sys.modules, "dgl", raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(switch, "_warned", set())


@pytest.fixture
def no_dgl(monkeypatch):
    """DGL not installed (``import dgl`` raises ModuleNotFoundError for ``dgl`` itself)."""
    monkeypatch.setitem(sys.modules, "dgl", None)
    monkeypatch.setattr(switch, "_warned", set())


def _log_records(caplog):
    return [r for r in caplog.records if r.name == "gnn_fastpath"]


def test_enable_returns_the_frameworks_it_patched(pyg, dgl):
    assert gnn_fastpath.enable(frameworks="pyg") == ("pyg",)
    assert gnn_fastpath.enable() == ("dgl", "pyg")
    assert gnn_fastpath.enable() == ("dgl", "pyg")  # idempotent, same answer
    assert gnn_fastpath.enable(frameworks=["pyg"]) == ("pyg",)  # of those asked for
    gnn_fastpath.disable()
    assert gnn_fastpath.enable(frameworks=("pyg", "dgl")) == ("dgl", "pyg")
    gnn_fastpath.disable()
    with gnn_fastpath.enabled(frameworks="pyg") as patched:
        assert patched == ("pyg",)
    assert not gnn_fastpath.is_enabled()


def test_enable_logs_one_info_line(pyg, caplog):
    caplog.set_level(logging.INFO, logger="gnn_fastpath")
    gnn_fastpath.enable(frameworks="pyg", cpu="reference")
    (record,) = _log_records(caplog)
    assert record.levelno == logging.INFO
    message = record.getMessage()
    assert "patched pyg" in message and "\n" not in message
    for name in ("TransformerConv", "GATv2Conv", "GCNConv", "SAGEConv"):
        assert name in message
    assert "reference" in message


def test_named_framework_that_cannot_import_raises(pyg, broken_dgl):
    with pytest.raises(ImportError) as info:
        gnn_fastpath.enable(frameworks="dgl")
    message = str(info.value)
    assert _GRAPHBOLT_ERROR in message and "installed but cannot be imported" in message
    assert "https://www.dgl.ai/pages/start.html" in message and "Installing DGL" in message
    cause = info.value.__cause__
    assert isinstance(cause, ModuleNotFoundError) and cause.name == "torchdata.datapipes"
    assert not gnn_fastpath.is_enabled() and not switch.patched_classes()
    # Named together with PyG: raises before patching anything.
    with pytest.raises(ImportError, match="torchdata"):
        gnn_fastpath.enable(frameworks=["pyg", "dgl"])
    assert not switch.patched_classes()


def test_named_framework_not_installed_raises(pyg, no_dgl):
    with pytest.raises(ImportError, match="DGL is not installed") as info:
        gnn_fastpath.enable(frameworks="dgl")
    assert "dgl.ai" in str(info.value) and isinstance(info.value.__cause__, ModuleNotFoundError)
    assert not switch.patched_classes()


def test_broken_framework_warns_once_and_the_other_is_patched(pyg, broken_dgl, caplog):
    caplog.set_level(logging.INFO, logger="gnn_fastpath")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert gnn_fastpath.enable() == ("pyg",)
        assert gnn_fastpath.enable() == ("pyg",)  # already warned: no second warning
    (warning,) = [w for w in caught if "gnn_fastpath.enable()" in str(w.message)]
    assert warning.category is UserWarning and warning.filename == __file__
    text = str(warning.message)
    assert "DGL ('dgl') is installed but cannot be imported" in text and _GRAPHBOLT_ERROR in text
    assert "https://www.dgl.ai/pages/start.html" in text and "patched: pyg" in text
    assert switch.patched_classes()
    assert all(cls.__module__.startswith("torch_geometric.") for cls in switch.patched_classes())
    records = _log_records(caplog)
    assert len(records) == 2 and all(r.levelno == logging.INFO for r in records)  # one line per call
    assert "skipped dgl" in records[0].getMessage() and _GRAPHBOLT_ERROR in records[0].getMessage()


def test_integration_raises_the_import_error(broken_dgl):
    """The integration never swallows the framework's import error; not_installed() tells
    "installed but broken" from "not installed"."""
    from gnn_fastpath.integrations import dgl as dgl_integration

    with pytest.raises(ModuleNotFoundError, match="torchdata") as info:
        dgl_integration.shims()
    assert not dgl_integration.not_installed(info.value)
    sys.modules["dgl"] = None  # restored by the fixture's monkeypatch
    with pytest.raises(ModuleNotFoundError) as info:
        dgl_integration.shims()
    assert dgl_integration.not_installed(info.value)


def test_framework_not_installed_is_skipped_silently(pyg, no_dgl, caplog):
    caplog.set_level(logging.INFO, logger="gnn_fastpath")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert gnn_fastpath.enable() == ("pyg",)
    assert not [w for w in caught if "gnn_fastpath" in str(w.message)]
    (record,) = _log_records(caplog)
    assert record.levelno == logging.INFO and "dgl" not in record.getMessage()


def test_nothing_importable_logs_a_warning(no_dgl, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "torch_geometric", None)
    caplog.set_level(logging.INFO, logger="gnn_fastpath")
    assert gnn_fastpath.enable() == ()
    assert not gnn_fastpath.is_enabled()
    (record,) = _log_records(caplog)
    assert record.levelno == logging.WARNING and "patched nothing" in record.getMessage()


@pytest.mark.parametrize("value", ["0", "false", "off", "No"])
def test_env_off_disables_with_one_log_line(monkeypatch, caplog, value):
    monkeypatch.setenv("GNN_FASTPATH", value)
    caplog.set_level(logging.INFO, logger="gnn_fastpath")
    assert gnn_fastpath.enable() == ()
    assert not gnn_fastpath.is_enabled() and not switch.patched_classes()
    (record,) = _log_records(caplog)
    assert record.levelno == logging.WARNING
    assert record.getMessage() == "GNN_FASTPATH=0: enable() does nothing"


def test_help_of_enable_fits_a_terminal():
    """help(gnn_fastpath.enable): no line wider than 79 columns, the layers listed, the
    fallback warning and the return value documented."""
    import pydoc

    text = pydoc.plain(pydoc.render_doc(gnn_fastpath.enable))
    assert max(len(line) for line in text.splitlines()) <= 79
    for name in ("TransformerConv", "GATv2Conv", "GCNConv", "SAGEConv", "GraphConv",
                 "FastpathFallbackWarning", "stats()", "Returns:", "GNN_FASTPATH=0"):
        assert name in text
