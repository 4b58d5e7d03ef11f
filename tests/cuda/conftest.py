"""Fixtures of the tests/cuda tests."""
from dry_launch import launches  # noqa: F401 (the dry-launch fixture)
