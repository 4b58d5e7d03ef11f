"""gnn_fastpath.config: every GNN_FASTPATH_* variable in one table, read per use, validated,
and the README's Switches table in step with it."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

import gnn_fastpath
from gnn_fastpath import config

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_SOURCES = sorted((ROOT / "gnn_fastpath").rglob("*.py")) + sorted((ROOT / "integrations").rglob("*.py"))


def test_no_variable_is_read_outside_config():
    """One place reads the environment: config.py (and the names it reads are its table's)."""
    for path in PACKAGE_SOURCES:
        if path.name == "config.py":
            continue
        text = path.read_text()
        assert "os.environ" not in text and "getenv" not in text, f"{path} reads the environment"


def test_every_variable_the_package_names_is_in_the_table():
    names = {s.name for s in config.SETTINGS}
    for path in PACKAGE_SOURCES:
        for name in re.findall(r"GNN_FASTPATH(?:_[A-Z0-9]+)*\b", path.read_text()):
            assert name in names, f"{path} names {name}, which config.SETTINGS does not define"


def test_readme_switches_table_matches():
    readme = (ROOT / "README.md").read_text()
    rows = re.findall(r"^\| `(GNN_FASTPATH[A-Z0-9_]*)` \| (.*?) \| (.*?) \| (.*?) \|$", readme, re.M)
    assert [r[0] for r in rows] == [s.name for s in config.SETTINGS]
    for (name, values, default, effect), s in zip(rows, config.SETTINGS):
        assert values == s.values, name
        assert default == (f"`{s.default}`" if s.default else "(empty)"), name
        assert effect == s.effect, name


@pytest.mark.parametrize("spec", config.SETTINGS, ids=lambda s: s.name)
def test_default_when_unset_or_empty(monkeypatch, spec):
    monkeypatch.delenv(spec.name, raising=False)
    unset = config.setting(spec.name)
    monkeypatch.setenv(spec.name, "  ")
    assert config.setting(spec.name) == unset


@pytest.mark.parametrize("name,text,value", [
    ("GNN_FASTPATH", "0", False), ("GNN_FASTPATH", "off", False), ("GNN_FASTPATH", "True", True),
    ("GNN_FASTPATH_GATV2_BWD", "Transposed", "transposed"), ("GNN_FASTPATH_DOT_BWD", "", None),
    ("GNN_FASTPATH_DOT_BWD", "atomic", "atomic"), ("GNN_FASTPATH_SR_CHUNKS", "4", 4),
    ("GNN_FASTPATH_GATV2_CHUNK", "64", 64), ("GNN_FASTPATH_SPMM_ALG", "alg2", "alg2"),
])
def test_values_are_parsed(monkeypatch, name, text, value):
    monkeypatch.setenv(name, text)
    assert config.setting(name) == value


@pytest.mark.parametrize("name,text", [
    ("GNN_FASTPATH", "maybe"), ("GNN_FASTPATH_GATV2_BWD", "sideways"), ("GNN_FASTPATH_SR_CHUNKS", "3"),
    ("GNN_FASTPATH_GATV2_CHUNK", "0"), ("GNN_FASTPATH_GATV2_CHUNK", "big"), ("GNN_FASTPATH_SPMM_BWD", "x"),
])
def test_bad_values_name_the_variable(monkeypatch, name, text):
    monkeypatch.setenv(name, text)
    with pytest.raises(ValueError, match=name):
        config.setting(name)


def test_read_at_each_use(monkeypatch):
    monkeypatch.setenv("GNN_FASTPATH_GATV2_BWD", "atomic")
    assert config.setting("GNN_FASTPATH_GATV2_BWD") == "atomic"
    monkeypatch.setenv("GNN_FASTPATH_GATV2_BWD", "transposed")
    assert config.setting("GNN_FASTPATH_GATV2_BWD") == "transposed"


def test_several_settings_are_read_at_each_use(monkeypatch):
    """settings() (what plan keys snapshot) sees a set, changed or removed variable at the
    next call, as setting() does, and validates each value."""
    names = ("GNN_FASTPATH_GATV2_BWD", "GNN_FASTPATH_GATV2_CHUNK")
    monkeypatch.delenv("GNN_FASTPATH_GATV2_BWD", raising=False)
    monkeypatch.setenv("GNN_FASTPATH_GATV2_CHUNK", "64")
    assert config.settings(names) == (None, 64)
    monkeypatch.setenv("GNN_FASTPATH_GATV2_BWD", "Atomic")
    assert config.settings(names) == ("atomic", 64)
    monkeypatch.setenv("GNN_FASTPATH_GATV2_CHUNK", "128")
    assert config.settings(names) == ("atomic", 128)
    assert [config.setting(n) for n in names] == ["atomic", 128]
    monkeypatch.delenv("GNN_FASTPATH_GATV2_CHUNK")
    assert config.settings(names) == ("atomic", 256)
    monkeypatch.setenv("GNN_FASTPATH_GATV2_CHUNK", "big")
    for _ in range(2):  # a bad value is never remembered
        with pytest.raises(ValueError, match="GNN_FASTPATH_GATV2_CHUNK"):
            config.settings(names)


def test_unknown_setting():
    with pytest.raises(KeyError, match="GNN_FASTPATH_NOPE"):
        config.setting("GNN_FASTPATH_NOPE")


def test_cpu_mode_follows_enable_and_force_reference_is_per_thread():
    import threading

    gnn_fastpath.disable()
    assert config.cpu_mode() == "stock"
    with gnn_fastpath.enabled(cpu="reference"):
        assert config.cpu_mode() == "reference"
    assert config.cpu_mode() == "stock"
    with pytest.raises(ValueError, match="cpu must be one of"):
        config.set_cpu_mode("gpu")
    seen = []
    with config.force_reference():
        assert config.reference_forced()
        t = threading.Thread(target=lambda: seen.append(config.reference_forced()))
        t.start()
        t.join()
    assert seen == [False] and not config.reference_forced()


def test_force_contexts_counts_the_open_contexts_of_every_thread():
    """force_contexts() counts force_reference() contexts open in any thread (nested ones, ones
    left by an exception), so a hot path can tell that none is open with one read."""
    import threading

    count = config.force_contexts()
    assert count == [0]
    with config.force_reference():
        with config.force_reference(False):
            assert count == [2] and not config.reference_forced()
        inside, leave = threading.Event(), threading.Event()

        def other():
            with config.force_reference():
                inside.set()
                leave.wait()

        t = threading.Thread(target=other)
        t.start()
        inside.wait()
        assert count == [2]
        leave.set()
        t.join()
        assert count == [1]
    with pytest.raises(RuntimeError):
        with config.force_reference():
            raise RuntimeError
    assert count == [0] and not config.reference_forced()
