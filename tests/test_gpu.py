"""GPU runs (NCCL, one process per GPU). Skip with a reason on machines without at least 2 GPUs."""
import os
import signal
import subprocess
import sys
import time

import pytest

from a2a import harness
from a2a.harness import evaluate, parse_popcorn
from launch import parallel_launch
from tests.conftest import (ROOT, gpu_count, hanging_human_face, hanging_submission, requires_gpus, run_eval,
                            wait_until_gone)

pytestmark = [pytest.mark.gpu, requires_gpus]
P2P_VERSIONS = ["v2", "v3", "v4"]
# Whether dispatch-recv's expert-major rows already hold the expert's output (v2 scales them in place; from v3 the
# expert is fused into combine-send and the layout keeps the dispatched input).
EXPERT_IN_LAYOUT = {"v2": True, "v3": False, "v4": False}


def world_sizes():
    return sorted({min(gpu_count(), 8), 2}) if gpu_count() >= 2 else [2]


def _load(version: str, name: str = ""):
    path = harness.resolve_version(version)
    return harness.load_version(path, name or path.stem)


# --------------------------------------------------------------------------------------------------------------
# The harness on GPUs
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("world_size", world_sizes())
def test_v1_passes_every_official_test_on_gpus(world_size):
    result = run_eval("test", "v1", "--world-size", str(world_size))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stdout.count("| pass") == 9


def test_benchmark_reports_device_time_and_floor():
    (case,) = evaluate("v1", "benchmark", "benchmarks:0", 2, "nccl", progress=lambda *_: None).cases
    assert case["status"] == "pass"
    assert 0 < case["device_mean_us"] < case["mean_us"] and 0 < case["floor_mean_us"] < case["mean_us"]


def test_no_rendezvous_fails_on_gpus_while_ports_churn(process_token):
    churn = subprocess.Popen([sys.executable, str(ROOT / "tests" / "port_churn.py"), "600"],
                             env={**os.environ, "A2A_TEST_TOKEN": process_token})
    try:
        time.sleep(3)
        for version in ("v1", "v2", "v1"):
            result = evaluate(version, "test", "tests:0,1", 2, "nccl", progress=lambda *_: None)
            assert result.exit_code == 0 and [c["status"] for c in result.cases] == ["pass", "pass"], result.cases
    finally:
        churn.kill()
        churn.wait()


HANGS_ON_THE_GPU = hanging_submission(touch_the_gpu=True)


def test_sigterm_ends_a_hanging_gpu_run(tmp_path, process_token):
    process = hanging_human_face(tmp_path, process_token, HANGS_ON_THE_GPU)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGTERM, stderr
    assert not wait_until_gone(process_token, 20), "processes left behind"


# --------------------------------------------------------------------------------------------------------------
# P2P versions. Each rank loads the version file itself; load_inline finds the build the first test made.
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("world_size", world_sizes())
@pytest.mark.parametrize("version", P2P_VERSIONS)
def test_p2p_version_passes_every_official_test(version, world_size):
    result = run_eval("test", version, "--world-size", str(world_size))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stdout.count("| pass") == 9


def _expert_counts(module, state, world_size):
    if hasattr(module._ext, "scratch_regions"):
        start = module._ext.scratch_regions(state.dims)["expert_count"]
    else:  # v2: send_counter[world] | blocks_done | recv_total | expert_count[...]
        start = world_size + 2
    return state.scratch[start:start + state.num_local_experts].cpu()


def _dispatched_rows(rank, world_size, version, spec):
    """Every row each local expert received is checked against what its source routed: the (src, token, k) set
    must match exactly and each row must equal the source's x row (times 1 + rank where the layout holds the
    expert's output) bit for bit."""
    import torch

    from reference import generate_input

    module = _load(version)
    data = generate_input(**spec, rank=rank, world_size=world_size)
    module.custom_kernel(data)
    torch.cuda.synchronize()
    state = module._state
    n_local, cap = state.num_local_experts, state.capacity
    counts = _expert_counts(module, state, world_size)
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
    scale = (1 + rank) if EXPERT_IN_LAYOUT[version] else 1
    for local in range(n_local):
        for position in range(int(counts[local])):
            src, _, token, k = meta[local * cap + position].tolist()
            assert (src, token, k, local) not in received, "a pair arrived twice"
            received.add((src, token, k, local))
            want = sources[src].x[token].to(rows.device) * scale
            assert torch.equal(rows[local, position], want), (src, token, k)
    return received == expected, len(received)


@pytest.mark.parametrize("version", P2P_VERSIONS)
def test_dispatch_delivers_each_pair_once_to_the_right_expert(version):
    spec = dict(num_experts=64, experts_per_token=6, hidden_dim=2048, max_num_tokens=32, seed=1234)
    results = parallel_launch(min(gpu_count(), 8), _dispatched_rows, version, spec, backend="nccl")
    assert all(ok for ok, _ in results), results
    assert sum(n for _, n in results) > 0


def _pressure(rank, world_size, version, spec, repeats):
    import torch

    from reference import check_implementation, generate_input

    module = _load(version)
    data = generate_input(**spec, rank=rank, world_size=world_size)
    first = module.custom_kernel(data).clone()
    identical = all(torch.equal(module.custom_kernel(data), first) for _ in range(repeats - 1))
    fresh = []
    for i in range(repeats):
        other = generate_input(**dict(spec, seed=spec["seed"] + 13 * (i + 1)), rank=rank, world_size=world_size)
        fresh.append(check_implementation(other, module.custom_kernel(other)))
    return identical, [message for ok, message in fresh if not ok]


@pytest.mark.parametrize("version", P2P_VERSIONS)
def test_pressure_same_seed_bit_identical_then_fresh_seeds(version):
    spec = dict(num_experts=256, experts_per_token=8, hidden_dim=7168, max_num_tokens=256, seed=4)
    results = parallel_launch(min(gpu_count(), 8), _pressure, version, spec, 20, backend="nccl")
    assert all(identical for identical, _ in results), "same input gave different outputs"
    assert all(not failures for _, failures in results), results


@pytest.mark.parametrize("version", P2P_VERSIONS)
def test_survives_regrouping_with_gpus_reassigned(version, tmp_path):
    """One pool, groups of changing size in a row: each worker gets another rank (GPU) from case to case."""
    from tests.conftest import run_bundle

    assert run_eval("stage", version, str(tmp_path / "b")).returncode == 0
    sizes = [min(gpu_count(), 8), 2, min(gpu_count(), 8), 2, 2]
    lines = [f"num_experts: 64; experts_per_token: 6; hidden_dim: 2048; max_num_tokens: 32; seed: {i}; "
             f"world_size: {ws}" for i, ws in enumerate(sizes)]
    (tmp_path / "b" / "mixed.txt").write_text("\n".join(lines) + "\n")
    code, output, stderr = run_bundle(tmp_path / "b", "test", "mixed.txt",
                                      {"A2A_BACKEND": "nccl", "POPCORN_GPUS": str(min(gpu_count(), 8))})
    keys = parse_popcorn(output)
    assert code == 0 and keys.get("check") == "pass", output + stderr[-3000:]


def _peer_never_comes(rank, world_size, version, spec):
    import torch
    import torch.distributed as dist

    from reference import generate_input

    module = _load(version)
    data = generate_input(**spec, rank=rank, world_size=world_size)
    module.custom_kernel(data)
    torch.cuda.synchronize()
    dist.barrier()
    if rank == 0:
        started = time.monotonic()
        module.custom_kernel(data)
        torch.cuda.synchronize()
        elapsed = time.monotonic() - started
        time.sleep(0.5)  # the report thread polls every 20 ms
        return elapsed
    time.sleep(8)
    return 0.0


@pytest.mark.parametrize("version", P2P_VERSIONS)
def test_spin_wait_gives_up_and_says_what_it_waited_for(version, capfd, monkeypatch):
    """Rank 1 skips a call: rank 0's kernels give up after the 2 s spin timeout instead of hanging, and rank 0
    says what it waited for."""
    monkeypatch.setenv("A2A_SPIN_TIMEOUT_S", "2")
    spec = dict(num_experts=8, experts_per_token=2, hidden_dim=256, max_num_tokens=8, seed=3)
    elapsed, _ = parallel_launch(2, _peer_never_comes, version, spec, backend="nccl", timeout_s=120)
    assert 2.0 <= elapsed < 8.0
    printed = capfd.readouterr()
    text = printed.out + printed.err
    assert f"[a2a {version}] rank 0: gave up after 2000 ms waiting for the row count from rank 1" in text, text[-3000:]


def _trace_build_matches(rank, world_size, version, spec):
    import torch

    from reference import generate_input

    timed = _load(version, f"{version}_timed")
    os.environ["A2A_TRACE"] = "1"
    traced = _load(version, f"{version}_traced")
    data = generate_input(**spec, rank=rank, world_size=world_size)
    expected = timed.custom_kernel(data).clone()
    outputs = [traced.custom_kernel(data) for _ in range(3)]
    records = traced.trace_take()
    phases = {traced.TRACE_PHASES[int(p)] for p in records[:, 0].tolist()}
    return all(torch.equal(out, expected) for out in outputs), phases


@pytest.mark.parametrize("version", P2P_VERSIONS)
def test_trace_build_output_is_bit_identical_to_the_timed_build(version):
    spec = dict(num_experts=256, experts_per_token=8, hidden_dim=7168, max_num_tokens=128, seed=11)
    results = parallel_launch(2, _trace_build_matches, version, spec, backend="nccl")
    assert all(same for same, _ in results)
    module_phases = set(_load_phases(version))
    assert all(phases == module_phases for _, phases in results), results


def _load_phases(version):
    import ast

    for node in ast.parse(harness.resolve_version(version).read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "TRACE_PHASES" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("no TRACE_PHASES")


# --------------------------------------------------------------------------------------------------------------
# The instrument
# --------------------------------------------------------------------------------------------------------------


def test_trace_writes_the_json_the_picture_and_the_table(tmp_path):
    import json

    from a2a import timeline

    (folder,) = timeline.trace_version("v3", "benchmarks:0", 2, "nccl", 4, tmp_path)
    trace = json.loads((folder / "trace.json").read_text())
    assert {e["pid"] for e in trace["traceEvents"] if e["ph"] == "X"} == {0, 1}
    assert set(trace["otherData"]["clock_alignment"]) == {"rank 0", "rank 1"}
    assert (folder / "timeline.png").stat().st_size > 10_000
    assert "| dispatch_recv / wait_counts" in (folder / "phases.md").read_text()


def test_sol_measures_this_machine():
    from a2a import sol

    figures = sol.measure(2, harness.run_meta("nccl", 2, "sol"))
    assert 0 < figures["launch_us"] < 50 and 0 < figures["one_way_latency_us"] < 50
    assert 10 < figures["a2a_store_gbps"] < 2000 and 10 < figures["pair_store_gbps"] < 2000
    assert 100 < figures["local_copy_gbps"] < 20000


def test_anchors_time_a_case():
    from a2a import anchors

    args = harness.case_args("benchmarks:1", 2, "nccl")
    rows = anchors.run(args, 2, iterations=10, progress=lambda *_: None)
    by_name = {row["version"]: row for row in rows}
    assert by_name["nccl_a2a_x2"]["status"] == "pass" and by_name["nccl_a2a_x2"]["device_mean_us"] > 0
    nvshmem = by_name["nvshmem_a2a_vdev_x2"]
    assert nvshmem["status"] == "pass" or nvshmem["error"], nvshmem


def test_diff_of_a_version_against_itself_on_gpus():
    from a2a import diffing

    path = harness.resolve_version("v3")
    cases = harness.case_args("benchmarks:0,4", 2, "nccl")
    rows = diffing.time_versions(path, path, cases, 2, "nccl", rounds=6, pairs=6)
    assert {row["verdict"] for row in rows} == {"no difference within noise"}, rows
