"""Assertions shared by the kernel tests: relative error against a float64 oracle."""
from __future__ import annotations

import torch

TOL = 1e-4


def rel_err(got, want) -> float:
    """||got - want|| / ||want|| in float64 (the absolute error when want is all zero)."""
    got, want = got.double(), want.double()
    denom = want.norm().item()
    err = (got - want).norm().item()
    return err if denom == 0 else err / denom


def assert_close(name, got, want, tol=TOL):
    """Same shape, finite, and relative error below ``tol``."""
    assert got.shape == want.shape, f"{name}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    assert torch.isfinite(got).all(), f"{name}: non-finite values"
    err = rel_err(got, want)
    assert err < tol, f"{name}: relative error {err:.3e} >= {tol:.0e}"
