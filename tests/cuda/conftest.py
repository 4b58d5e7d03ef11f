"""Fixtures of the tests/cuda tests."""
import fcntl
import gc
import tempfile
from pathlib import Path

import pytest
import torch

from dry_launch import launches  # noqa: F401 (the dry-launch fixture)


@pytest.fixture
def gpu_memory_lock():
    """An exclusive lock shared by the pytest-xdist workers (a file lock), held for the test:
    tests that take most of the GPU's memory and tests whose subprocess needs memory of its own
    take it, so that under ``-n`` they do not run at once. The test's cached blocks are given
    back before the lock is (a worker's allocator would keep them reserved)."""
    path = Path(tempfile.gettempdir()) / "gnn_fastpath_gpu_memory.lock"
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            fcntl.flock(f, fcntl.LOCK_UN)
