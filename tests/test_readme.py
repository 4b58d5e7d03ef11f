"""The README stays true to the code: every fallback reason the package can record is in the
"Check it is working" table (and every key there is one the code records), and the set-up
commands are unchanged."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SOURCES = sorted((ROOT / "gnn_fastpath").rglob("*.py")) + sorted((ROOT / "integrations").rglob("*.py"))
SHIM = ROOT / "integrations" / "shim.py"

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
        patterns = _PATTERNS + (_SHIM_PATTERNS if path == SHIM else ())
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
                "decomposed_layers", "subclass", "lazy", "arguments",
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
    for command in ('pip install torch==2.13.0 && pip install -e ".[pyg]" && python examples/quickstart.py',
                    'pip install torch==2.13.0 && pip install -e ".[test,dgl]" && FORCE_ONLY_CPU=1 pip install --no-build-isolation torch-scatter==2.1.2 torch-sparse==0.6.18 && pytest tests'):
        assert f"```bash\n{command}\n```" in section


def test_readme_sections_exist():
    for title in ("Set up", "Installing DGL", "What runs fused today", "Check it is working",
                  "Architecture", "Switches", "Troubleshooting"):
        _section(title)
