"""The autograd-route benchmark as a command on the CPU."""


def test_routes(tool, result, tmp_path):
    js, md = tmp_path / "route.json", tmp_path / "route.md"
    tool("bench_route", "--calls", "20", "--rounds", "2", "--json-out", js, "--md", md)
    rows = result(js, "route")["rows"]
    assert [r["route"] for r in rows] == ["baseline", "autograd.Function", "custom op + register_autograd"]
    for r in rows:
        assert r["fwd_us"] > 0 and r["fwd_bwd_us"] > 0, r
    assert "custom op + register_autograd" in md.read_text()
