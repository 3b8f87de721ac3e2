"""Shared pytest setup: one torch thread (the CI box has 2 cores shared with cargo), tests/ importable."""

import os
import sys

import torch

torch.set_num_threads(1)
sys.path.insert(0, os.path.dirname(__file__))


def heavy() -> bool:
    """True when the full (slow) form of heavy tests is asked for (YOCO_HEAVY=1)."""
    return os.environ.get("YOCO_HEAVY", "") not in ("", "0")


def pytest_collection_modifyitems(config, items):
    """Tests marked ``locked_rounding`` assume the locked torch build's rounding (``tests/numerics.py``).
    When the installed torch or transformers differs from ``uv.lock``, they are skipped with a pointer to
    the one test that fails and says so (``test_00_environment.py``, collected first)."""
    from numerics import drift

    msg = drift()
    if msg is None:
        return
    import pytest

    skip = pytest.mark.skip(reason="environment drifted from uv.lock (see test_00_environment.py): " + msg.split(":")[0])
    for item in items:
        if "locked_rounding" in item.keywords:
            item.add_marker(skip)


def _tiny_mm_fixture(tmp_path_factory):
    from mm_tiny import tiny_mm_model_dir

    path = str(tmp_path_factory.mktemp("tiny_mm"))
    hf = tiny_mm_model_dir(path)
    return path, hf


def _register_tiny_mm():
    import pytest

    @pytest.fixture(scope="session")
    def tiny_mm(tmp_path_factory):
        """A tiny random multimodal Gemma 3n checkpoint (tests/mm_tiny.py) in a temporary directory, and
        the transformers model it was saved from; built once per session (~30 s), shared by the mm tests."""
        return _tiny_mm_fixture(tmp_path_factory)

    return tiny_mm


tiny_mm = _register_tiny_mm()


def pytest_sessionfinish(session, exitstatus):
    """Stop the shared servers (``serve_helpers``) while worker threads can still run their shutdown."""
    helpers = sys.modules.get("serve_helpers")
    if helpers is not None:
        helpers.stop_shared()
