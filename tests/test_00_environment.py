"""Collected first: the installed packages whose kernels decide rounding are the ones ``uv.lock`` pins.

When they are not, this is the one clear failure (the exact-rounding tests are skipped, see
``tests/numerics.py``), instead of dozens of tests failing by a few ulps for no visible reason."""

from __future__ import annotations

import pytest
import torch
from numerics import drift, drift_message, locked_versions, public_version, reassociation_tol


def test_installed_torch_and_transformers_are_the_locked_builds():
    msg = drift()
    if msg is not None:
        pytest.fail(msg, pytrace=False)


def test_drift_check_names_the_installed_and_the_locked_version():
    msg = drift_message("torch", "2.15.0", "2.13.0")
    assert msg.startswith("installed torch 2.15.0 differs from the locked 2.13.0: "
                          "the exact-rounding tests below assume 2.13.0")
    assert "make setup" in msg


def test_drift_check_ignores_the_local_build_tag_and_catches_a_missing_package():
    assert drift_message("torch", "2.13.0+cu130", "2.13.0") is None
    assert drift_message("torch", "2.13.0+cpu", "2.13.0") is None
    assert drift_message("torch", "2.13.1+cu130", "2.13.0") is not None
    assert "transformers is not installed" in drift_message("transformers", None, "5.24.0")


def test_lock_pins_torch_transformers_and_numpy_exactly():
    locked = locked_versions()
    assert {"torch", "transformers", "numpy"} <= set(locked)
    assert all(v.count(".") >= 1 and v[0].isdigit() for v in locked.values())
    assert public_version(torch.__version__).count(".") == 2


def test_hf_tolerance_is_strict_under_the_lock_and_a_reassociation_bound_otherwise(monkeypatch):
    import numerics

    monkeypatch.setattr(numerics, "drift", lambda: None)
    monkeypatch.setattr(numerics, "cpu_drift", lambda: None)
    assert numerics.hf_tol(30, 128) == 1e-5  # the locked build on the reference CPU: the strict tolerance
    monkeypatch.setattr(numerics, "cpu_drift", lambda: "another BLAS order")
    assert numerics.hf_tol(10, 128) == pytest.approx(reassociation_tol(10, 128, 1.0))  # another CPU: the bound
    assert numerics.hf_tol(10, 128, any_cpu=True) == 1e-5  # ... unless the comparison is exact on any CPU
    monkeypatch.setattr(numerics, "cpu_drift", lambda: None)
    monkeypatch.setattr(numerics, "drift", lambda: "drifted")
    assert numerics.hf_tol(10, 128) == pytest.approx(reassociation_tol(10, 128, 1.0))
    assert numerics.hf_tol(10, 128, any_cpu=True) == pytest.approx(reassociation_tol(10, 128, 1.0))
    assert numerics.hf_tol(30, 128, scale=4.0) == pytest.approx(30 * 128 * 2.0**-24 * 4.0)
    assert numerics.hf_tol(1, 8) == 1e-5  # never below the strict tolerance
