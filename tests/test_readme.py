"""The README stays true to the code: every fallback reason the package can record is in the
"Check it is working" table (and every key there is one the code records), the set-up
commands are unchanged, CI runs the README's test command, the example commands name scripts
that take their arguments, every link of the table of contents leads to a heading, and links
to repository files (benchmark results) lead to files and headings that exist."""
from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SOURCES = sorted((ROOT / "gnn_fastpath").rglob("*.py")) + sorted((ROOT / "integrations").rglob("*.py"))
# Files that return blocker tuples (reason, detail): the shim machinery and the small-graph rule.
BLOCKERS = (ROOT / "integrations" / "shim.py", ROOT / "integrations" / "small_graph.py")
QUICK_COMMAND = 'pip install torch==2.13.0 && pip install -e ".[pyg]" && python examples/quickstart.py'
TEST_COMMAND = 'pip install torch==2.13.0 && pip install -e ".[test,dgl]" && pytest tests'

_KEY = r"([a-z][a-z0-9_]*)"
# Where a fallback reason is written down in the code.
_PATTERNS = (
    re.compile(r'Unsupported\(\s*"' + _KEY + '"'),          # a fused forward refusing its inputs
    re.compile(r'finite_number\(\s*"' + _KEY + '"'),        # the same, for a module's number
    re.compile(r'Decision\(REFERENCE, "' + _KEY + '"'),      # the dispatch (ops/dispatch.py)
)
_SHIM_PATTERNS = (
    re.compile(r'\("' + _KEY + r'", f?"'),                   # blocker tuples: ("cpu", "...")
    re.compile(r'return "' + _KEY + r'", '),                 # blockers returned bare: return "hooks", ...
)


def _section(title: str) -> str:
    text = README.read_text()
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f'README has no "## {title}" section'
    return match.group(1)


def code_reasons() -> dict:
    """Every fallback reason key in the package -> the files that record it."""
    found: dict = {}
    for path in SOURCES:
        text = path.read_text()
        patterns = _PATTERNS + (_SHIM_PATTERNS if path in BLOCKERS else ())
        for pattern in patterns:
            for key in pattern.findall(text):
                found.setdefault(key, set()).add(path.relative_to(ROOT).as_posix())
    return found


def readme_reasons() -> list:
    section = _section("Check it is working")
    return re.findall(r"^\| `" + _KEY + r"` \|", section, re.M)


def test_the_scan_finds_the_known_reasons():
    """A guard on the scan itself: the reasons of each source kind are found."""
    found = code_reasons()
    for key in ("dtype", "forced", "cpu", "no_kernel", "int32", "kernel_limit",  # dispatch
                "input", "autocast", "torchscript", "fx_tracing", "hooks", "explain",  # shim
                "decomposed_layers", "subclass", "lazy", "arguments", "small_graph",
                "edge_attr", "fill_value", "segment_ties",  # PyG layers
                "heterograph", "attn_drop", "empty_graph"):  # DGL layers
        assert key in found, key


def test_every_fallback_reason_is_in_the_readme_table():
    listed = readme_reasons()
    assert len(listed) == len(set(listed)), "a reason is listed twice"
    missing = {k: sorted(v) for k, v in code_reasons().items() if k not in listed}
    assert not missing, f"fallback reasons missing from the README's reason table: {missing}"


def test_every_reason_in_the_readme_table_exists():
    stale = sorted(set(readme_reasons()) - set(code_reasons()))
    assert not stale, f"the README's reason table lists keys the code never records: {stale}"


def test_set_up_commands_unchanged():
    section = _section("Set up")
    for command in (QUICK_COMMAND, TEST_COMMAND):
        assert f"```bash\n{command}\n```" in section


def test_ci_runs_the_readme_test_command():
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert TEST_COMMAND in lines, "CI must run the README's test command exactly, on a line of its own"
    assert "install-torch-sparse" not in TEST_COMMAND  # a fresh clone compiles nothing


def test_the_optional_torch_sparse_build_is_documented():
    """The README's test suite names the optional build of the real sampling kernel, and it exists."""
    section = _section("Set up")
    assert "`bash .ci/install-torch-sparse`" in section
    assert (ROOT / ".ci" / "install-torch-sparse").is_file()


def _example_commands():
    """(script, argv) of each command in the README's Examples block."""
    match = re.search(r"^### Examples\n.*?```bash\n(.*?)```", _section("Set up"), re.M | re.S)
    assert match, 'the "Set up" section has no "### Examples" command block'
    commands = []
    for line in match.group(1).splitlines():
        words = line.split("#")[0].split()
        script = next(w for w in words if w.startswith("examples/"))
        commands.append((script, words[words.index(script) + 1:]))
    return commands


def test_example_commands_take_their_arguments():
    commands = _example_commands()
    assert {script for script, _ in commands} >= {"examples/quickstart.py", "examples/pyg_neighbor_loader.py",
                                                   "examples/dgl_neighbor_sampler.py", "examples/pyg_ddp.py"}
    for script, argv in commands:
        path = ROOT / script
        assert path.is_file(), script
        spec = importlib.util.spec_from_file_location(f"_readme_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up there
        try:
            spec.loader.exec_module(module)
            if hasattr(module, "parse_args"):
                module.parse_args(argv)
            else:
                assert argv == [], (script, argv)
        finally:
            sys.modules.pop(spec.name, None)


def _anchor(title: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def test_table_of_contents_links_lead_to_headings():
    text = README.read_text()
    anchors = {_anchor(t) for t in re.findall(r"^#{1,4} (.+)$", text, re.M)}
    contents = _section("Contents")
    links = re.findall(r"\]\(#([^)]+)\)", contents)
    assert len(links) >= 10, links
    missing = [a for a in re.findall(r"\]\(#([^)]+)\)", text) if a not in anchors]
    assert not missing, f"links to no heading: {missing}"
    # every top-level section is listed
    top = [_anchor(t) for t in re.findall(r"^## (.+)$", text, re.M) if t != "Contents"]
    assert [a for a in top if a not in links] == [], "sections missing from the table of contents"


def test_links_to_repository_files_resolve():
    """Relative links lead to files of the repository, and their anchors to headings there."""
    links = re.findall(r"\]\(([^)#:]+)(?:#([^)]+))?\)", README.read_text())
    assert links, "the README links to no repository file"
    for path, anchor in links:
        target = ROOT / path
        assert target.exists(), path
        if anchor:
            headings = re.findall(r"^#{1,4} (.+)$", target.read_text(), re.M)
            assert anchor in {_anchor(h) for h in headings}, f"{path}#{anchor}"


def test_readme_sections_exist():
    for title in ("Contents", "Set up", "Installing DGL", "What runs fused today", "Check it is working",
                  "Architecture", "Switches", "Troubleshooting", "License"):
        _section(title)


def test_troubleshooting_comes_before_the_reference_material():
    titles = re.findall(r"^## (.+)$", README.read_text(), re.M)
    assert titles[:3] == ["Contents", "Set up", "Troubleshooting"], titles
