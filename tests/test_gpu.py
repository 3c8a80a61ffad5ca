"""GPU runs (NCCL, one process per GPU). Skip with a reason on machines without at least 2 GPUs."""
import pytest

from eval import parse_popcorn
from launch import parallel_launch
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


# --------------------------------------------------------------------------------------------------------------
# v2 (P2P). Each rank loads the version file itself; load_inline finds the build the first test made.
# --------------------------------------------------------------------------------------------------------------
V2_PATH = "submissions/all2all/v2_p2p.py"


def _load_v2():
    import importlib.util

    from tests.conftest import ROOT

    spec = importlib.util.spec_from_file_location("v2_p2p", ROOT / V2_PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("world_size", world_sizes())
def test_v2_passes_every_official_test_on_gpus(world_size):
    result = run_eval("test", "v2", "--world-size", str(world_size))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stdout.count("| pass") == 9


def _v2_dispatched_rows(rank, world_size, spec):
    """Every row each local expert received is checked against what its source routed: the (src, token, k)
    set must match exactly and each row must equal fp16(x_src[token] * (1 + rank)) bit for bit."""
    import torch

    from reference import generate_input

    v2 = _load_v2()
    data = generate_input(**spec, rank=rank, world_size=world_size)
    v2.custom_kernel(data)
    torch.cuda.synchronize()
    state = v2._state
    n_local, cap = state.num_local_experts, state.capacity
    counts = state.scratch[world_size + 2: world_size + 2 + n_local].cpu()
    sources = {r: generate_input(**spec, rank=r, world_size=world_size)[1] for r in range(world_size)}
    expected = set()
    for src, d in sources.items():
        for token, row in enumerate(d.indices.tolist()):
            for k, expert in enumerate(row):
                if expert // n_local == rank:
                    expected.add((src, token, k, expert % n_local))
    received = set()
    meta = state.expert_meta.cpu()
    rows = state.expert_x.view(n_local, cap, -1)
    for local in range(n_local):
        for position in range(int(counts[local])):
            src, _, token, k = meta[local * cap + position].tolist()
            assert (src, token, k, local) not in received, "a pair arrived twice"
            received.add((src, token, k, local))
            want = sources[src].x[token].to(rows.device) * (1 + rank)
            assert torch.equal(rows[local, position], want), (src, token, k)
    return received == expected, len(received)


def test_v2_dispatch_delivers_each_pair_once_to_the_right_expert():
    spec = dict(num_experts=64, experts_per_token=6, hidden_dim=2048, max_num_tokens=32, seed=1234)
    results = parallel_launch(min(gpu_count(), 8), _v2_dispatched_rows, spec, backend="nccl")
    assert all(ok for ok, _ in results), results
    assert sum(n for _, n in results) > 0


def _v2_pressure(rank, world_size, spec, repeats):
    import torch

    from reference import check_implementation, generate_input

    v2 = _load_v2()
    data = generate_input(**spec, rank=rank, world_size=world_size)
    first = v2.custom_kernel(data).clone()
    identical = all(torch.equal(v2.custom_kernel(data), first) for _ in range(repeats - 1))
    fresh = []
    for i in range(repeats):
        other = generate_input(**dict(spec, seed=spec["seed"] + 13 * (i + 1)), rank=rank, world_size=world_size)
        fresh.append(check_implementation(other, v2.custom_kernel(other)))
    return identical, [message for ok, message in fresh if not ok]


def test_v2_pressure_same_seed_bit_identical_then_fresh_seeds():
    spec = dict(num_experts=256, experts_per_token=8, hidden_dim=7168, max_num_tokens=256, seed=4)
    results = parallel_launch(min(gpu_count(), 8), _v2_pressure, spec, 20, backend="nccl")
    assert all(identical for identical, _ in results), "same input gave different outputs"
    assert all(not failures for _, failures in results), results


def test_v2_survives_regrouping_with_gpus_reassigned(tmp_path):
    """One pool, groups of changing size in a row: each worker gets another rank (GPU) from case to case."""
    from tests.conftest import run_bundle

    assert run_eval("stage", "v2", str(tmp_path / "b")).returncode == 0
    sizes = [min(gpu_count(), 8), 2, min(gpu_count(), 8), 2, 2]
    lines = [f"num_experts: 64; experts_per_token: 6; hidden_dim: 2048; max_num_tokens: 32; seed: {i}; "
             f"world_size: {ws}" for i, ws in enumerate(sizes)]
    (tmp_path / "b" / "mixed.txt").write_text("\n".join(lines) + "\n")
    code, output, stderr = run_bundle(tmp_path / "b", "test", "mixed.txt",
                                      {"A2A_BACKEND": "nccl", "POPCORN_GPUS": str(min(gpu_count(), 8))})
    keys = parse_popcorn(output)
    assert code == 0 and keys.get("check") == "pass", output + stderr[-3000:]


def _v2_peer_never_comes(rank, world_size, spec):
    import time

    import torch
    import torch.distributed as dist

    from reference import generate_input

    v2 = _load_v2()
    data = generate_input(**spec, rank=rank, world_size=world_size)
    v2.custom_kernel(data)
    torch.cuda.synchronize()
    dist.barrier()
    if rank == 0:
        started = time.monotonic()
        v2.custom_kernel(data)
        torch.cuda.synchronize()
        elapsed = time.monotonic() - started
        time.sleep(0.5)  # the report thread polls every 20 ms
        return elapsed
    time.sleep(8)
    return 0.0


def test_v2_spin_wait_gives_up_and_says_what_it_waited_for(capfd, monkeypatch):
    """Rank 1 skips a call: rank 0's kernels give up after the 2 s spin timeout instead of hanging, and rank 0
    says what it waited for."""
    monkeypatch.setenv("A2A_SPIN_TIMEOUT_S", "2")
    spec = dict(num_experts=8, experts_per_token=2, hidden_dim=256, max_num_tokens=8, seed=3)
    elapsed, _ = parallel_launch(2, _v2_peer_never_comes, spec, backend="nccl", timeout_s=120)
    assert 2.0 <= elapsed < 8.0
    printed = capfd.readouterr()
    text = printed.out + printed.err
    assert "[a2a v2] rank 0: gave up after 2000 ms waiting for the row count from rank 1" in text, text[-3000:]
