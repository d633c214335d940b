"""Seed everything a lesson draws random numbers from, so its stored outputs reproduce.

    from ampteach import seed_everything
    seed_everything(0)      # first cell of every notebook
"""

from __future__ import annotations

import random

import numpy as np
import torch


def seed_everything(seed: int = 0) -> None:
    """Seed Python's `random`, NumPy and torch (CPU and every CUDA device) with one number."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds all CUDA devices
