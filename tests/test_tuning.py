"""gnn_fastpath.tuning: measured choices per size class, kept in a file across processes and
used only on the GPU model and versions they were measured for; what measuring costs is
bounded (a probe, then a race only once it fits the class's allowance and the process
budget) and reported (CPU: fake timings)."""
from __future__ import annotations

import json

import pytest
import torch

import gnn_fastpath
from gnn_fastpath import Graph, tuning

CPU = torch.device("cpu")


@pytest.fixture
def tune(monkeypatch, tmp_path):
    """Tuning on, with a fresh choices file and a fresh tuner (a new process); yields the
    file's path."""
    path = tmp_path / "tuning.json"
    monkeypatch.setenv("GNN_FASTPATH_TUNE", "1")
    monkeypatch.setenv("GNN_FASTPATH_TUNE_CACHE", str(path))
    tuning.forget()
    yield path
    tuning.forget()


def fake_timer(times, calls):
    """A timer that runs nothing and reports ``times[name]`` ms per call for the candidate it
    is given; ``calls`` gets (name, calls per sample) of every sample."""
    def timer(run, device, n):
        name = run()
        calls.append((name, n))
        return times[name]
    return timer


def candidates(*names):
    return {name: (lambda name=name: name) for name in names}


def spent(calls):
    """(extra op calls, of which timed samples) in a fake timer's log."""
    return sum(n for _, n in calls), sum(1 for _, n in calls if n == tuning.CALLS)


def cheap(**times):
    """Times small enough that the race fits FREE_MS at the first call."""
    return {k: v * 1e-3 for k, v in times.items()}


def test_on_by_default(monkeypatch):
    monkeypatch.delenv("GNN_FASTPATH_TUNE", raising=False)
    assert tuning.enabled()


def test_off_uses_the_rule(monkeypatch, tmp_path):
    monkeypatch.setenv("GNN_FASTPATH_TUNE", "0")
    monkeypatch.setenv("GNN_FASTPATH_TUNE_CACHE", str(tmp_path / "t.json"))
    calls = []
    got = tuning.choose("k", candidates("a", "b"), "a", CPU, fake_timer({"a": 5, "b": 1}, calls))
    assert got == "a" and calls == [] and not (tmp_path / "t.json").exists()
    assert tuning.report()["classes"] == {}


def test_small_class_is_measured_at_its_first_call_and_survives_a_restart(tune):
    """A race estimated under FREE_MS runs at the first call: the probe (the rule's variant
    warmed and timed once), a warm-up of the other, then rounds; the fastest is kept in the
    process and in the file, with what measuring it cost."""
    calls = []
    times = cheap(atomic=3.0, transposed=1.0)
    timer = fake_timer(times, calls)
    assert tuning.choose("cls", candidates("atomic", "transposed"), "atomic", CPU, timer) == "transposed"
    assert calls[:3] == [("atomic", 1), ("atomic", 1), ("transposed", 1)]  # probe, then the warm-up
    assert set(name for name, n in calls[3:]) == {"atomic", "transposed"} and all(n == tuning.CALLS
                                                                                for _, n in calls[3:])
    n_calls = len(calls)
    assert tuning.choose("cls", candidates("atomic", "transposed"), "atomic", CPU, timer) == "transposed"
    assert len(calls) == n_calls  # kept in this process
    data = json.loads(tune.read_text())
    record = data["entries"][tuning.device_key(CPU)]["cls"]
    assert data["format"] == tuning.FORMAT and record["choice"] == "transposed" and record["default"] == "atomic"
    assert record["times_ms"] == pytest.approx(times)
    trials, _ = spent(calls)
    assert record["trials"] == trials
    assert record["cost_ms"] == pytest.approx(sum(times[name] * n for name, n in calls), abs=1e-3)
    tuning.forget()  # a new process: read from the file, not timed again
    assert tuning.choose("cls", candidates("atomic", "transposed"), "atomic", CPU, timer) == "transposed"
    assert len(calls) == n_calls
    assert tuning.report()["classes"]["cls"]["state"] == tuning.REMEMBERED
    # another class is timed on its own
    assert tuning.choose("other", candidates("atomic", "transposed"), "atomic", CPU,
                         fake_timer(cheap(atomic=1.0, transposed=2.0), calls)) == "atomic"


def test_large_class_waits_for_its_allowance(tune):
    """A race estimated above FREE_MS: the first call probes (two calls of the rule's variant)
    and every call takes the rule's variant, with nothing more timed, until FREE_MS + SHARE x
    calls x t_rule, less the probe, covers the estimate; then one call runs the race."""
    calls = []
    t_rule = 1.0
    timer = fake_timer({"a": t_rule, "b": 0.5}, calls)
    estimate = tuning.race_estimate_ms(t_rule, 2)
    assert estimate > tuning.FREE_MS
    # the first call n at which FREE_MS + SHARE * n * t_rule - 2 * t_rule >= estimate
    n_race = next(n for n in range(1, 100000) if tuning.allowance_ms(n, t_rule, 2 * t_rule) >= estimate)
    assert n_race > 2
    for n in range(1, n_race):
        assert tuning.choose("big", candidates("a", "b"), "a", CPU, timer) == "a"
        assert calls == [("a", 1), ("a", 1)], n  # the probe alone
    entry = tuning.report()["classes"]["big"]
    assert entry["state"] == tuning.WAITING and entry["calls"] == n_race - 1 and entry["trials"] == 2
    assert entry["ms"] == pytest.approx(2 * t_rule) and entry["t_rule_ms"] == t_rule
    assert entry["race_estimate_ms"] == pytest.approx(estimate) and entry["allowance_ms"] < estimate
    assert tuning.listing(all_devices=True) == []  # nothing measured, nothing written
    assert tuning.choose("big", candidates("a", "b"), "a", CPU, timer) == "b"  # call n_race: the race
    entry = tuning.report()["classes"]["big"]
    assert entry["state"] == tuning.MEASURED and entry["choice"] == "b"
    race = sum({"a": 1.0, "b": 0.5}[name] * n for name, n in calls[2:])
    assert entry["ms"] == pytest.approx(2 * t_rule + race)
    # the race cost no more than its estimate: no variant slower than the rule's
    assert race <= estimate


def test_a_cold_probe_costs_two_calls(tune):
    """The probe's warm-up compiles and builds what the rule's variant needs, which the call
    itself would have done: it counts as one call, so a cold first call does not push a cheap
    race back."""
    calls = []
    seen = set()

    def timer(run, device, n):
        name = run()
        calls.append((name, n))
        cold = name not in seen
        seen.add(name)
        return 100.0 if cold and name == "a" else {"a": 2e-3, "b": 1e-3}[name]

    assert tuning.choose("k", candidates("a", "b"), "a", CPU, timer) == "b"  # the race ran at once
    entry = tuning.report()["classes"]["k"]
    assert entry["t_rule_ms"] == 2e-3
    race = sum({"a": 2e-3, "b": 1e-3}[name] * n for name, n in calls[2:])
    assert entry["ms"] == pytest.approx(2 * 2e-3 + race, abs=1e-4)


def test_the_race_stays_within_the_class_allowance_and_share(tune):
    """Over a long run, what a class spent (probe + race) is at most FREE_MS + SHARE of the
    time its calls took before the race, when no variant is slower than the rule's."""
    calls = []
    t_rule = 2.0
    timer = fake_timer({"a": t_rule, "b": 1.9, "c": 2.0}, calls)
    n = 0
    while tuning.report()["classes"].get("k", {}).get("state") != tuning.MEASURED:
        tuning.choose("k", candidates("a", "b", "c"), "a", CPU, timer)
        n += 1
        assert n < 100000
    entry = tuning.report()["classes"]["k"]
    assert entry["ms"] <= tuning.FREE_MS + tuning.SHARE * n * t_rule + 1e-9
    assert entry["calls"] == n


def test_a_clear_loser_leaves_the_race_after_one_round(tune):
    calls = []
    tuning.choose("k", candidates("a", "b", "c"), "a", CPU, fake_timer(cheap(a=1.0, b=2.0, c=1.05), calls))
    samples = [name for name, n in calls[2 + 2:]]  # after the probe and the two warm-ups
    assert samples.count("b") == 1  # more than CLEAR slower: out after round 1
    assert samples.count("a") == samples.count("c") == tuning.ROUNDS  # within CLEAR: every round


def test_a_variant_that_left_early_does_not_win_on_its_stale_median(tune):
    """Drift after round 1 (the GPU got busier) makes the finalists' medians exceed the median
    of the variant that left in round 1; the winner is still judged among the finalists, and the
    record says how many rounds each variant ran."""
    seq = {"a": [1.0, 1.0, 1.0] + [1.6] * 9, "b": [1.0, 0.99] + [1.6] * 9, "c": [1.0, 1.3]}
    calls = []

    def timer(run, device, n):
        name = run()
        calls.append(name)
        return seq[name].pop(0) * 1e-3

    assert tuning.choose("k", candidates("a", "b", "c"), "a", CPU, timer) == "a"
    record = json.loads(tune.read_text())["entries"][tuning.device_key(CPU)]["k"]
    assert record["rounds"] == {"a": tuning.ROUNDS, "b": tuning.ROUNDS, "c": 1}
    assert record["times_ms"]["c"] < record["times_ms"]["a"]  # stale, and not the choice


def test_a_variant_must_beat_the_rule_by_more_than_the_tie_margin(tune):
    close = 1 - tuning.TIE / 2
    assert tuning.choose("k1", candidates("a", "b"), "a", CPU, fake_timer(cheap(a=1.0, b=close), [])) == "a"
    clear = 1 - 2 * tuning.TIE
    assert tuning.choose("k2", candidates("a", "b"), "a", CPU, fake_timer(cheap(a=1.0, b=clear), [])) == "b"
    assert tuning.choose("k3", candidates("a", "b"), "b", CPU, fake_timer(cheap(a=1.0, b=1.0), [])) == "b"
    record = json.loads(tune.read_text())["entries"][tuning.device_key(CPU)]["k1"]
    assert record["choice"] == "a" and record["times_ms"]["b"] < record["times_ms"]["a"]


def test_process_budget(tune, monkeypatch):
    """Once the process budget is spent, a class not yet decided keeps the rule for the rest
    of the process, nothing is written, nothing more timed; choices made before stay."""
    calls = []
    assert tuning.choose("k1", candidates("a", "b"), "a", CPU, fake_timer(cheap(a=2.0, b=1.0), calls)) == "b"
    monkeypatch.setattr(tuning, "BUDGET_MS", tuning.report()["ms"] / 2)  # spent
    assert tuning.report()["budget_left_ms"] == 0
    n = len(calls)
    assert tuning.choose("k2", candidates("a", "b"), "a", CPU, fake_timer(cheap(a=2.0, b=1.0), calls)) == "a"
    assert tuning.choose("k2", candidates("a", "b"), "a", CPU, fake_timer(cheap(a=2.0, b=1.0), calls)) == "a"
    assert len(calls) == n
    assert tuning.report()["classes"]["k2"]["state"] == tuning.OVER_BUDGET
    assert [r["class"] for r in tuning.listing(all_devices=True)] == ["k1"]
    assert tuning.choose("k1", candidates("a", "b"), "a", CPU, fake_timer(cheap(a=2.0, b=1.0), calls)) == "b"


def test_a_race_that_cannot_fit_the_budget_left_is_not_started(tune, monkeypatch):
    """The estimate is checked against what the budget has left before the race starts."""
    monkeypatch.setattr(tuning, "FREE_MS", 1e9)
    monkeypatch.setattr(tuning, "BUDGET_MS", 10.0)
    calls = []
    assert tuning.choose("k", candidates("a", "b"), "a", CPU, fake_timer({"a": 1.0, "b": 0.5}, calls)) == "a"
    assert calls == [("a", 1), ("a", 1)]  # the probe; the race (estimated 13 ms) does not fit the 8 left
    assert tuning.report()["classes"]["k"]["state"] == tuning.OVER_BUDGET


def test_ignored_on_another_gpu_or_version(tune, monkeypatch):
    here = tuning.device_key(CPU)
    calls = []
    tuning.choose("cls", candidates("a", "b"), "a", CPU, fake_timer(cheap(a=2, b=1), calls))
    others = ("NVIDIA H100 80GB HBM3|gnn_fastpath 0.1.0|torch 2.11.0", "cpu|gnn_fastpath 9.9|torch 2.11.0")
    n = len(calls)
    for other in others:
        monkeypatch.setattr(tuning, "device_key", lambda device, other=other: other)
        tuning.forget()
        assert tuning.remembered("cls", CPU) is None
        assert tuning.choose("cls", candidates("a", "b"), "a", CPU, fake_timer(cheap(a=1, b=2), calls)) == "a"
    assert len(calls) == 3 * n  # timed anew for each
    entries = json.loads(tune.read_text())["entries"]  # every device key kept side by side
    assert {k: v["cls"]["choice"] for k, v in entries.items()} == {here: "b", others[0]: "a", others[1]: "a"}


def test_device_key_names_gpu_and_versions():
    key = tuning.device_key(CPU)
    assert key.startswith("cpu|gnn_fastpath ") and f"torch {torch.__version__}" in key


@pytest.mark.parametrize("content", ["not json", json.dumps({"format": 0, "entries": {}}), json.dumps([1, 2])])
def test_unreadable_or_old_files_are_ignored_and_replaced(tune, content):
    tune.write_text(content)
    calls = []
    assert tuning.choose("cls", candidates("a", "b"), "a", CPU, fake_timer(cheap(a=2, b=1), calls)) == "b"
    assert calls and json.loads(tune.read_text())["format"] == tuning.FORMAT


def test_bad_default():
    with pytest.raises(ValueError, match="default"):
        tuning.choose("cls", candidates("a", "b"), "c", CPU)


def test_no_measuring_while_capturing(tune, monkeypatch):
    """During CUDA-graph capture nothing is timed: the remembered choice, else the rule."""
    monkeypatch.setattr(tuning, "may_measure", lambda device: False)
    calls = []
    assert tuning.choose("cls", candidates("a", "b"), "a", CPU, fake_timer(cheap(a=2, b=1), calls)) == "a"
    assert calls == [] and tuning.report()["classes"]["cls"]["state"] == tuning.RULE
    monkeypatch.undo()
    monkeypatch.setenv("GNN_FASTPATH_TUNE", "1")
    monkeypatch.setenv("GNN_FASTPATH_TUNE_CACHE", str(tune))
    tuning.choose("cls", candidates("a", "b"), "a", CPU, fake_timer(cheap(a=2, b=1), calls))
    monkeypatch.setattr(tuning, "may_measure", lambda device: False)
    tuning.forget()
    assert tuning.choose("cls", candidates("a", "b"), "a", CPU) == "b"  # remembered, not timed


def test_unwritable_file_keeps_the_choice_in_the_process(monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("GNN_FASTPATH_TUNE", "1")
    monkeypatch.setenv("GNN_FASTPATH_TUNE_CACHE", str(blocker / "sub" / "tuning.json"))  # parent is a file
    tuning.forget()
    calls = []
    assert tuning.choose("cls", candidates("a", "b"), "a", CPU, fake_timer(cheap(a=2, b=1), calls)) == "b"
    n = len(calls)
    assert tuning.choose("cls", candidates("a", "b"), "a", CPU, fake_timer(cheap(a=2, b=1), calls)) == "b"
    assert len(calls) == n
    tuning.forget()


def test_listing(tune, monkeypatch):
    tuning.choose("c1", candidates("a", "b"), "a", CPU, fake_timer(cheap(a=2, b=1), []))
    monkeypatch.setattr(tuning, "device_key", lambda device: "Some GPU|gnn_fastpath 0.1.0|torch x")
    tuning.choose("c2", candidates("a", "b"), "a", CPU, fake_timer(cheap(a=1, b=2), []))
    rows = tuning.listing(all_devices=True)
    assert {(r["class"], r["choice"]) for r in rows} == {("c1", "b"), ("c2", "a")}
    assert all({"device", "class", "choice", "default", "times_ms", "measured", "cost_ms", "trials"} <= set(r)
               for r in rows)
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
    """A variant that runs out of GPU memory while timed: the call takes the rule, nothing is
    remembered, and the class keeps the rule for the rest of the process (not timed again)."""
    timed = []

    def timer(run, device, n):
        name = run()
        timed.append(name)
        if name == "b":
            raise torch.OutOfMemoryError("CUDA out of memory (test)")
        return 1e-3

    assert tuning.choose("cls", candidates("a", "b"), "a", CPU, timer) == "a"
    assert tuning.remembered("cls", CPU) is None and not tune.exists()
    n = len(timed)
    assert tuning.choose("cls", candidates("a", "b"), "a", CPU, timer) == "a" and len(timed) == n
    assert tuning.report()["classes"]["cls"]["state"] == tuning.OUT_OF_MEMORY


def test_remember_keeps_a_choice_measured_elsewhere(tune):
    """What the SpMM algorithm search measured is kept like a timed choice: read back by a new
    process, listed, and reported as searched (its timed runs' milliseconds, outside the
    budget)."""
    tuning.remember("spmm.algorithm|plain|F 64", CPU, "alg2", {"default": 2.0, "alg2": 1.0}, "default")
    entry = tuning.report()["classes"]["spmm.algorithm|plain|F 64"]
    assert entry["state"] == tuning.SEARCHED and entry["ms"] == 3.0 and entry["trials"] == 2
    assert tuning.report()["budget_left_ms"] == tuning.BUDGET_MS
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


# --------------------------------------------------------------------- on a graph, reported
def _graph():
    return Graph.from_edge_index(torch.tensor([[0, 1, 2, 3], [1, 2, 3, 0]]), 4)


def test_choose_on_graph_keeps_final_choices_on_the_graph(tune, monkeypatch):
    """The class is computed once per graph and key; while the class waits, every call asks
    the tuner (its calls count) and nothing is kept on the graph; once final, the graph holds
    the choice and later calls cost a lookup."""
    t = {"a": 1.0, "b": 0.5}
    timed, ran = [], []

    def timer(run, device, n):
        run()
        timed.append(ran[-1])
        return t[ran[-1]]

    monkeypatch.setattr(tuning, "_time_ms", timer)
    g = _graph()
    classes = []

    def klass():
        classes.append(1)
        return "graph-class"

    def choose():
        return tuning.choose_on_graph(g, ("op", 1), klass, CPU, ran.append, ("a", "b"), "a")

    assert choose() == "a" and timed == ["a", "a"]  # the probe
    for _ in range(5):
        assert choose() == "a"
    assert classes == [1] and tuning.report()["classes"]["graph-class"]["calls"] == 6
    monkeypatch.setattr(tuning, "FREE_MS", 1e9)  # the race fits now
    assert choose() == "b" and set(timed[2:]) == {"a", "b"}
    n = len(timed)
    for _ in range(3):
        assert choose() == "b"
    assert len(timed) == n and tuning.report()["classes"]["graph-class"]["calls"] == 7  # lookups on the graph
    assert classes == [1]


def test_stats_reports_tuning_where_and_how_much(tune):
    """gnn_fastpath.stats(tuning=True)["tuning"]: per class its op, state, calls, trials and
    ms, and the totals; reset_stats() restarts the report, not the budget; stats() without
    the flag holds layers only."""
    gnn_fastpath.reset_stats()
    calls = []
    timer = fake_timer(cheap(a=2.0, b=1.0), calls)
    tuning.choose("gatv2_attention.backward|src~16384|width 256|float32", candidates("a", "b"), "a", CPU, timer)
    report = gnn_fastpath.stats(tuning=True)["tuning"]
    entry = report["classes"]["gatv2_attention.backward|src~16384|width 256|float32"]
    assert entry["op"] == "gatv2_attention.backward" and entry["state"] == tuning.MEASURED
    assert entry["calls"] == 1 and entry["trials"] == spent(calls)[0] and entry["choice"] == "b"
    assert entry["default"] == "a" and entry["times_ms"] == pytest.approx(cheap(a=2.0, b=1.0))
    ms = sum(cheap(a=2.0, b=1.0)[name] * n for name, n in calls)
    assert entry["ms"] == pytest.approx(ms, abs=1e-3) and report["ms"] == pytest.approx(ms, abs=1e-3)
    assert report["trials"] == entry["trials"]
    assert report["budget_left_ms"] == pytest.approx(tuning.BUDGET_MS - ms, abs=1e-3)
    assert "tuning" not in gnn_fastpath.stats()
    gnn_fastpath.reset_stats()
    after = gnn_fastpath.stats(tuning=True)["tuning"]
    assert after["classes"] == {} and after["ms"] == 0 and after["trials"] == 0
    assert after["budget_left_ms"] == report["budget_left_ms"]  # the budget is not refilled
    tuning.choose("gatv2_attention.backward|src~16384|width 256|float32", candidates("a", "b"), "a", CPU, timer)
    entry = gnn_fastpath.stats(tuning=True)["tuning"]["classes"]["gatv2_attention.backward|src~16384|width 256|float32"]
    assert entry["calls"] == 1 and entry["trials"] == 0 and entry["ms"] == 0
