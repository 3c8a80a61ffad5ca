"""Test setup: the bundle's modules (task, reference, utils) import the way they do in a leaderboard bundle."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "problems" / "all2all"), str(ROOT / "reference" / "all2all"), str(ROOT / "reference"),
                str(ROOT)]


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


requires_gpus = pytest.mark.skipif(gpu_count() < 2, reason="needs at least 2 CUDA GPUs; this machine has "
                                                           f"{gpu_count()}")


def run_eval(*args: str, timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    """Runs the human face of eval.py in a child process."""
    return subprocess.run([sys.executable, str(ROOT / "eval.py"), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})


def run_bundle(bundle: Path, mode: str, test_file: str, extra_env: dict | None = None) -> tuple[int, str, str]:
    """Runs a staged bundle's eval.py as the leaderboard runner does (gloo, 2 ranks, no human-face extras unless
    extra_env asks); returns (exit code, POPCORN output, stderr)."""
    import eval as harness

    env = {**os.environ, "POPCORN_GPUS": "2", "A2A_BACKEND": "gloo", **(extra_env or {})}
    for key in ("A2A_EXTRA", "A2A_RANK_PREFIX"):
        if key not in (extra_env or {}):
            env.pop(key, None)
    return harness.run_protocol(bundle, mode, test_file, env)


@pytest.fixture
def bundle(tmp_path):
    """A staged bundle of v1; tests swap in their own submission.py where they need one."""
    result = run_eval("stage", "v1", str(tmp_path / "bundle"))
    assert result.returncode == 0, result.stderr
    return tmp_path / "bundle"
