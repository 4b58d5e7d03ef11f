"""gnn_fastpath.tuning: measured choices per size class, kept in a file across processes and
used only on the GPU model and versions they were measured for (CPU: fake timings)."""
from __future__ import annotations

import json

import pytest
import torch

from gnn_fastpath import tuning

CPU = torch.device("cpu")


@pytest.fixture
def tune(monkeypatch, tmp_path):
    """Tuning on, with a fresh choices file; yields the file's path."""
    path = tmp_path / "tuning.json"
    monkeypatch.setenv("GNN_FASTPATH_TUNE", "1")
    monkeypatch.setenv("GNN_FASTPATH_TUNE_CACHE", str(path))
    tuning.forget()
    yield path
    tuning.forget()


def fake_timer(times, calls):
    """A timer that runs nothing and reports ``times[name]`` for the candidate it is given."""
    def timer(run, device):
        name = run()
        calls.append(name)
        return times[name]
    return timer


def candidates(*names):
    return {name: (lambda name=name: name) for name in names}


def test_on_by_default(monkeypatch):
    monkeypatch.delenv("GNN_FASTPATH_TUNE", raising=False)
    assert tuning.enabled()


def test_off_uses_the_rule(monkeypatch, tmp_path):
    monkeypatch.setenv("GNN_FASTPATH_TUNE", "0")
    monkeypatch.setenv("GNN_FASTPATH_TUNE_CACHE", str(tmp_path / "t.json"))
    calls = []
    got = tuning.choose("k", candidates("a", "b"), "a", CPU, fake_timer({"a": 5, "b": 1}, calls))
    assert got == "a" and calls == [] and not (tmp_path / "t.json").exists()


def test_measures_once_keeps_the_fastest_and_survives_a_restart(tune):
    calls = []
    timer = fake_timer({"atomic": 3.0, "transposed": 1.0}, calls)
    assert tuning.choose("cls", candidates("atomic", "transposed"), "atomic", CPU, timer) == "transposed"
    assert sorted(set(calls)) == ["atomic", "transposed"] and len(calls) == 2 * tuning.ROUNDS
    assert tuning.choose("cls", candidates("atomic", "transposed"), "atomic", CPU, timer) == "transposed"
    assert len(calls) == 2 * tuning.ROUNDS  # remembered in this process
    data = json.loads(tune.read_text())
    record = data["entries"][tuning.device_key(CPU)]["cls"]
    assert data["format"] == tuning.FORMAT and record["choice"] == "transposed"
    assert record["times_ms"] == {"atomic": 3.0, "transposed": 1.0} and record["default"] == "atomic"
    tuning.forget()  # a new process: read from the file, not timed again
    assert tuning.choose("cls", candidates("atomic", "transposed"), "atomic", CPU, timer) == "transposed"
    assert len(calls) == 2 * tuning.ROUNDS
    # another class is timed on its own
    assert tuning.choose("other", candidates("atomic", "transposed"), "atomic", CPU,
                         fake_timer({"atomic": 1.0, "transposed": 2.0}, calls)) == "atomic"


def test_ignored_on_another_gpu_or_version(tune, monkeypatch):
    here = tuning.device_key(CPU)
    calls = []
    tuning.choose("cls", candidates("a", "b"), "a", CPU, fake_timer({"a": 2, "b": 1}, calls))
    others = ("NVIDIA H100 80GB HBM3|gnn_fastpath 0.1.0|torch 2.11.0", "cpu|gnn_fastpath 9.9|torch 2.11.0")
    for other in others:
        monkeypatch.setattr(tuning, "device_key", lambda device, other=other: other)
        tuning.forget()
        assert tuning.remembered("cls", CPU) is None
        assert tuning.choose("cls", candidates("a", "b"), "a", CPU, fake_timer({"a": 1, "b": 2}, calls)) == "a"
    assert len(calls) == 6 * tuning.ROUNDS  # timed anew for each
    entries = json.loads(tune.read_text())["entries"]  # every device key kept side by side
    assert {k: v["cls"]["choice"] for k, v in entries.items()} == {here: "b", others[0]: "a", others[1]: "a"}


def test_device_key_names_gpu_and_versions():
    key = tuning.device_key(CPU)
    assert key.startswith("cpu|gnn_fastpath ") and f"torch {torch.__version__}" in key


@pytest.mark.parametrize("content", ["not json", json.dumps({"format": 0, "entries": {}}), json.dumps([1, 2])])
def test_unreadable_or_old_files_are_ignored_and_replaced(tune, content):
    tune.write_text(content)
    calls = []
    assert tuning.choose("cls", candidates("a", "b"), "a", CPU, fake_timer({"a": 2, "b": 1}, calls)) == "b"
    assert calls and json.loads(tune.read_text())["format"] == tuning.FORMAT


def test_ties_keep_the_rule(tune):
    assert tuning.choose("cls", candidates("a", "b"), "b", CPU, fake_timer({"a": 1, "b": 1}, [])) == "b"


def test_bad_default():
    with pytest.raises(ValueError, match="default"):
        tuning.choose("cls", candidates("a", "b"), "c", CPU)


def test_no_measuring_while_capturing(tune, monkeypatch):
    """During CUDA-graph capture nothing is timed: the remembered choice, else the rule."""
    monkeypatch.setattr(tuning, "may_measure", lambda device: False)
    calls = []
    assert tuning.choose("cls", candidates("a", "b"), "a", CPU, fake_timer({"a": 2, "b": 1}, calls)) == "a"
    assert calls == []
    monkeypatch.undo()
    monkeypatch.setenv("GNN_FASTPATH_TUNE", "1")
    monkeypatch.setenv("GNN_FASTPATH_TUNE_CACHE", str(tune))
    tuning.choose("cls", candidates("a", "b"), "a", CPU, fake_timer({"a": 2, "b": 1}, calls))
    monkeypatch.setattr(tuning, "may_measure", lambda device: False)
    assert tuning.choose("cls", candidates("a", "b"), "a", CPU) == "b"  # remembered, not timed


def test_unwritable_file_keeps_the_choice_in_the_process(monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("GNN_FASTPATH_TUNE", "1")
    monkeypatch.setenv("GNN_FASTPATH_TUNE_CACHE", str(blocker / "sub" / "tuning.json"))  # parent is a file
    tuning.forget()
    calls = []
    assert tuning.choose("cls", candidates("a", "b"), "a", CPU, fake_timer({"a": 2, "b": 1}, calls)) == "b"
    assert tuning.choose("cls", candidates("a", "b"), "a", CPU, fake_timer({"a": 2, "b": 1}, calls)) == "b"
    assert len(calls) == 2 * tuning.ROUNDS
    tuning.forget()


def test_listing(tune, monkeypatch):
    tuning.choose("c1", candidates("a", "b"), "a", CPU, fake_timer({"a": 2, "b": 1}, []))
    monkeypatch.setattr(tuning, "device_key", lambda device: "Some GPU|gnn_fastpath 0.1.0|torch x")
    tuning.choose("c2", candidates("a", "b"), "a", CPU, fake_timer({"a": 1, "b": 2}, []))
    rows = tuning.listing(all_devices=True)
    assert {(r["class"], r["choice"]) for r in rows} == {("c1", "b"), ("c2", "a")}
    assert all({"device", "class", "choice", "default", "times_ms", "measured"} <= set(r) for r in rows)
    # by default only what is valid here: the GPU this process sees (none on a CPU machine)
    here = tuning.listing()
    assert all(r["device"] == tuning.device_key(torch.device("cuda")) for r in here)


def test_size_classes():
    c = tuning.size_class
    base = c("dot_attention.backward", 1000, 1000, 20000, 256, torch.float32)
    assert c("dot_attention.backward", 1100, 1050, 21000, 256, torch.float32) == base  # same powers of two
    assert c("dot_attention.backward", 1000, 1000, 200000, 256, torch.float32) != base  # 10x the degree
    assert c("dot_attention.backward", 1000, 1000, 20000, 128, torch.float32) != base
    assert c("dot_attention.backward", 1000, 1000, 20000, 256, torch.bfloat16) != base
    assert c("gat_attention.backward", 1000, 1000, 20000, 256, torch.float32) != base
    assert "float32" in base and "width 256" in base
    assert c("x", 0, 0, 0, 1, torch.float16)  # empty graphs have a class too


def test_size_class_sees_degree_skew():
    """Same counts and mean degrees, one graph with super nodes (its work list cuts long rows
    into chunks): two classes, so the uniform graph's choice is not reused for the skewed one."""
    c = tuning.size_class
    uniform = c("dot_attention.backward", 169343, 169343, 1166243, 512, torch.float32, 0)
    skewed = c("dot_attention.backward", 169343, 169343, 1166243, 512, torch.float32, 9000)
    assert uniform != skewed and "long-row chunks~0" in uniform
    assert c("dot_attention.backward", 169343, 169343, 1166243, 512, torch.float32, 8500) == skewed


def test_out_of_memory_while_timing_takes_the_rule(tune):
    """A variant that runs out of GPU memory while timed: the call takes the rule, and nothing
    is remembered (a call that fits without tuning must not fail because of it)."""
    def timer(run, device):
        if run() == "b":
            raise torch.OutOfMemoryError("CUDA out of memory (test)")
        return 1.0

    assert tuning.choose("cls", candidates("a", "b"), "a", CPU, timer) == "a"
    assert tuning.remembered("cls", CPU) is None and not tune.exists()


def test_remember_keeps_a_choice_measured_elsewhere(tune):
    """What the SpMM algorithm search measured is kept like a timed choice: read back by a new
    process, listed."""
    tuning.remember("spmm.algorithm|plain|F 64", CPU, "alg2", {"default": 2.0, "alg2": 1.0}, "default")
    tuning.forget()
    assert tuning.remembered("spmm.algorithm|plain|F 64", CPU) == "alg2"
    record = json.loads(tune.read_text())["entries"][tuning.device_key(CPU)]["spmm.algorithm|plain|F 64"]
    assert record["times_ms"] == {"default": 2.0, "alg2": 1.0} and record["default"] == "default"


def test_spmm_classes():
    """SpMM calls of one signature (power-of-two buckets of nnz, rows, columns; width; dtypes)
    share a class; the direction, width or dtypes make another; every algorithm code has its
    name."""
    from gnn_fastpath.cuda import cusparse

    sig = (0, 64, 17, 12, 12, torch.float32, torch.float32)
    plain = cusparse._tuning_class(sig, False)
    assert plain.startswith("spmm.algorithm|plain|F 64") and "float32->float32" in plain
    assert cusparse._tuning_class(sig, True) != plain
    assert cusparse._tuning_class((0, 128) + sig[2:], False) != plain
    assert cusparse._tuning_class(sig[:5] + (torch.bfloat16, torch.float32), False) != plain
    assert {cusparse._name(code) for code in cusparse.algorithms(block=True).values()} == {
        "default", "alg2", "custom", "block"}
