"""GPU runs (NCCL, one process per GPU). Skip with a reason on machines without at least 2 GPUs."""
import pytest

from eval import parse_popcorn
from tests.conftest import gpu_count, requires_gpus, run_eval

pytestmark = [pytest.mark.gpu, requires_gpus]


def world_sizes():
    return sorted({min(gpu_count(), 8), 2}) if gpu_count() >= 2 else [2]


@pytest.mark.parametrize("world_size", world_sizes())
def test_v1_passes_every_official_test_on_gpus(world_size):
    result = run_eval("test", "v1", "--world-size", str(world_size))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stdout.count("| pass") == 9


def test_v1_benchmark_reports_device_time_and_floor():
    result = run_eval("benchmark", "v1", "--world-size", "2", "--cases", "benchmarks:0")
    assert result.returncode == 0, result.stderr[-3000:]
    row = next(line for line in result.stdout.splitlines() if line.startswith("|   0"))
    cells = [c.strip() for c in row.split("|")]
    mean_us, device_us, floor_us = float(cells[5]), float(cells[7]), float(cells[8])
    assert 0 < device_us < mean_us and 0 < floor_us < mean_us
