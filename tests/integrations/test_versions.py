"""Each integration declares the framework versions whose layer semantics its shims reproduce
(``TESTED_VERSIONS``), and ``enable()`` warns once per process per framework when the
installed version is none of them (the layers are patched all the same)."""
from __future__ import annotations

import re
import warnings

import pytest

import gnn_fastpath
from gnn_fastpath import registry, switch

FRAMEWORKS = tuple(registry.FRAMEWORKS)


def _version_warnings(caught):
    return [w for w in caught if "gnn_fastpath.enable()" in str(w.message) and "is installed, but" in str(w.message)]


@pytest.fixture
def fresh_version_warnings(monkeypatch, clean_fastpath):
    """No framework warned about yet in this process (restored after the test)."""
    monkeypatch.setattr(switch, "_version_warned", set())


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_each_integration_declares_its_tested_versions(framework):
    entry = registry.integration(framework)
    module = __import__(registry.FRAMEWORKS[framework].module, fromlist=["TESTED_VERSIONS"])
    assert isinstance(module.TESTED_VERSIONS, tuple) and module.TESTED_VERSIONS
    assert all(re.fullmatch(r"\d+\.\d+", v) for v in module.TESTED_VERSIONS), module.TESTED_VERSIONS
    assert entry.tested_versions == module.TESTED_VERSIONS and callable(entry.version)


@pytest.mark.parametrize("installed, prefix, expected", [
    ("2.8.1", "2.8", True), ("2.8", "2.8", True), ("2.8.0.dev20250101", "2.8", True),
    ("2.1.0+cu121", "2.1", True), ("2.10.0", "2.1", False), ("2.80.0", "2.8", False),
    ("3.8.1", "2.8", False), ("2.7.0", "2.8", False),
])
def test_version_matches_major_minor_prefixes(installed, prefix, expected):
    assert registry.version_matches(installed, prefix) is expected


def _enable_twice(framework):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert gnn_fastpath.enable(frameworks=framework) == (framework,)
        gnn_fastpath.disable()
        assert gnn_fastpath.enable(frameworks=framework) == (framework,)  # same process: no second warning
    return _version_warnings(caught)


#: framework -> (the module its layers come from, a tested version's suffix as builds name it)
_BUILDS = {"pyg": ("torch_geometric.", ".1"), "dgl": ("dgl.", ".0+cu121")}
_EACH = [pytest.param(f, marks=pytest.mark.dgl) if f == "dgl" else f for f in FRAMEWORKS]


@pytest.mark.parametrize("framework", _EACH)
def test_untested_version_warns_once(framework, request, monkeypatch, fresh_version_warnings):
    module = request.getfixturevalue(framework)
    monkeypatch.setattr(module, "__version__", "9.9.0")
    (warning,) = _enable_twice(framework)
    assert warning.category is UserWarning and warning.filename == __file__
    text = str(warning.message)
    tested = registry.integration(framework).tested_versions
    title = registry.FRAMEWORKS[framework].title
    assert f"{title} 9.9.0 is installed" in text and all(f"{v}.x" in text for v in tested), text
    assert "patched anyway" in text
    assert any(cls.__module__.startswith(_BUILDS[framework][0]) for cls in switch.patched_classes())


@pytest.mark.parametrize("framework", _EACH)
def test_tested_version_does_not_warn(framework, request, monkeypatch, fresh_version_warnings):
    module = request.getfixturevalue(framework)
    tested = registry.integration(framework).tested_versions[0]
    monkeypatch.setattr(module, "__version__", f"{tested}{_BUILDS[framework][1]}")
    assert _enable_twice(framework) == []


@pytest.mark.dgl
def test_version_warning_names_only_the_frameworks_enabled(pyg, dgl, monkeypatch, fresh_version_warnings):
    """An untested DGL is not warned about by ``enable(frameworks="pyg")``; each framework is
    warned about once, by the first call that patches it."""
    monkeypatch.setattr(dgl, "__version__", "9.9.0")
    monkeypatch.setattr(pyg, "__version__", "9.9.0")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gnn_fastpath.enable(frameworks="pyg")
        first = _version_warnings(caught)
        gnn_fastpath.enable()
        gnn_fastpath.enable()
        both = _version_warnings(caught)
    assert [str(w.message).split(" is installed")[0] for w in first] == ["gnn_fastpath.enable(): PyG 9.9.0"]
    assert len(both) == 2 and "DGL 9.9.0 is installed" in str(both[1].message)


def test_readme_names_the_tested_versions():
    """The README's Troubleshooting entry about the version warning names every declared version."""
    from pathlib import Path

    text = " ".join((Path(__file__).resolve().parents[2] / "README.md").read_text().split())
    for framework in FRAMEWORKS:
        entry = registry.integration(framework)
        for version in entry.tested_versions:
            assert f"{registry.FRAMEWORKS[framework].title} {version}.x" in text, (framework, version)
