"""Shared pytest setup: one torch thread (the CI box has 2 cores shared with cargo), tests/ importable."""

import os
import sys

import torch

torch.set_num_threads(1)
sys.path.insert(0, os.path.dirname(__file__))


def heavy() -> bool:
    """True when the full (slow) form of heavy tests is asked for (YOCO_HEAVY=1)."""
    return os.environ.get("YOCO_HEAVY", "") not in ("", "0")
