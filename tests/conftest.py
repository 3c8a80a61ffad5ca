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


def run_bundle(bundle: Path, mode: str, test_file: str, extra_env: dict | None = None,
               timeout: float = 600) -> tuple[int, str, str]:
    """Runs a staged bundle's eval.py as the leaderboard runner does; returns (exit code, POPCORN output, stderr)."""
    read_fd, write_fd = os.pipe()
    env = {**os.environ, "POPCORN_FD": str(write_fd), "POPCORN_GPUS": "2", "A2A_BACKEND": "gloo", **(extra_env or {})}
    for key in ("A2A_EXTRA", "A2A_RANK_PREFIX"):
        if key not in (extra_env or {}):
            env.pop(key, None)
    child = subprocess.Popen([sys.executable, "eval.py", mode, test_file], cwd=bundle, env=env, pass_fds=(write_fd,),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    os.close(write_fd)
    with os.fdopen(read_fd) as results:
        output = results.read()
    _, stderr = child.communicate(timeout=timeout)
    return child.returncode, output, stderr


@pytest.fixture
def bundle(tmp_path):
    """A staged bundle of v1; tests swap in their own submission.py where they need one."""
    result = run_eval("stage", "v1", str(tmp_path / "bundle"))
    assert result.returncode == 0, result.stderr
    return tmp_path / "bundle"
