"""Helpers the evaluator imports (the leaderboard bundle's utils.py)."""
import random

import numpy as np
import torch

L2_CLEAR_BYTES = 256 * 1024 * 1024


def set_seed(seed: int = 42) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


def clear_l2_cache() -> None:
    """Evict the GPU's L2 by writing a buffer far larger than it (MI300X: 256 MiB of last-level cache).

    On a CPU run there is no device cache to clear; the call does nothing, so CPU timings are warm-cache timings.
    """
    if not torch.cuda.is_available():
        return
    buffer = torch.empty(L2_CLEAR_BYTES // 8, dtype=torch.int64, device="cuda")
    buffer.fill_(42)
    del buffer
