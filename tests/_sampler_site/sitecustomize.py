"""Carries the test suite's PyG adjustments into the Python processes that tests start (the
examples, ``torchrun`` and its workers, the benchmark tools): the pure-torch neighbour sampler,
and torch's own scatter in place of a CPU-only torch_scatter build.

``tests/conftest.py`` puts this folder first on ``PYTHONPATH`` only when the session made one
of them (neither pyg-lib nor torch-sparse imports; torch_scatter imports but has no CUDA);
Python then runs this file at start-up. It imports nothing heavy itself: it waits for
``torch_geometric`` to be imported, then calls ``tests/pyg_sampler_shim.py``'s ``install()``,
which does nothing if a real backend imports, and ``tests/frameworks.py``'s
``scatter_without_cpu_only_torch_scatter``, which does nothing for a CUDA build.
``GNN_FASTPATH_TEST_SAMPLER_SHIM=0`` turns the sampler off (a test of the no-sampler path).
Another ``sitecustomize`` later on the path still runs (this one imports it).
"""
import importlib.abc
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_TESTS = os.path.dirname(_HERE)


def _load(name: str):
    """tests/<name>.py as the module ``name`` (one instance per process)."""
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, os.path.join(_TESTS, f"{name}.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return module


def _install_shim():
    """Both adjustments, once ``torch_geometric`` has been imported."""
    if os.environ.get("GNN_FASTPATH_TEST_SAMPLER_SHIM", "1") != "0":
        try:
            _load("pyg_sampler_shim").install()
        except Exception as exc:  # noqa: BLE001 - never break the import of torch_geometric
            print(f"tests/_sampler_site: the PyG sampler shim was not installed: {exc!r}", file=sys.stderr)
    try:
        _load("frameworks").scatter_without_cpu_only_torch_scatter(sys.modules["torch_geometric"], quiet=True)
    except Exception as exc:  # noqa: BLE001 - as above
        print(f"tests/_sampler_site: the torch_scatter check failed: {exc!r}", file=sys.stderr)


class _AfterTorchGeometric(importlib.abc.MetaPathFinder):
    """Runs :func:`_install_shim` once ``import torch_geometric`` has finished."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch_geometric":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_install(module):
            exec_module(module)
            _install_shim()

        spec.loader.exec_module = exec_then_install
        return spec


def _chain_next_sitecustomize():
    """Run the ``sitecustomize`` this one shadows, if there is one."""
    this = sys.modules.pop("sitecustomize", None)
    saved = list(sys.path)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
    try:
        spec = importlib.util.find_spec("sitecustomize")
        if spec is not None and spec.loader is not None:
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - as site.py does: report and go on
        print(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{exc!r}", file=sys.stderr)
    finally:
        sys.path[:] = saved
        if this is not None:
            sys.modules["sitecustomize"] = this


_chain_next_sitecustomize()
if "torch_geometric" in sys.modules:
    _install_shim()
else:
    sys.meta_path.insert(0, _AfterTorchGeometric())
