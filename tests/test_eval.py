"""The evaluator: leaderboard protocol, human face, bad input, watchdog, staged bundles of every version."""
import ast
import os
import sys
import time
from pathlib import Path

import pytest

from eval import needs_gpu, parse_popcorn
from tests.conftest import ROOT, run_bundle, run_eval

SMALL_LINE = "num_experts: 8; experts_per_token: 2; hidden_dim: 256; max_num_tokens: 12; seed: {seed}; world_size: 2"
OFFICIAL_TEST_KEYS = {"test-count", "check"}
OFFICIAL_BENCH_FIELDS = {"spec", "runs", "mean", "std", "err", "best", "worst"}


def write_submission(folder: Path, body: str) -> Path:
    path = folder / "submission.py"
    path.write_text("import torch\nimport torch.distributed as dist\n\n" + body)
    return path


def test_v1_passes_every_official_test_on_cpu():
    result = run_eval("test", "v1", "--world-size", "2")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.count("| pass") == 9


def test_protocol_output_has_the_official_keys(bundle):
    (bundle / "two.txt").write_text("\n".join(SMALL_LINE.format(seed=s) for s in (1, 2)) + "\n")
    code, output, stderr = run_bundle(bundle, "test", "two.txt")
    keys = parse_popcorn(output)
    assert code == 0, stderr
    assert set(keys) == OFFICIAL_TEST_KEYS | {f"test.{i}.{f}" for i in range(2) for f in ("spec", "status")}
    assert keys["test-count"] == "2" and keys["test.1.status"] == "pass" and keys["check"] == "pass"

    (bundle / "one.txt").write_text(SMALL_LINE.format(seed=3) + "\n")
    code, output, stderr = run_bundle(bundle, "benchmark", "one.txt")
    keys = parse_popcorn(output)
    assert code == 0, stderr
    assert set(keys) == {"benchmark-count", "check"} | {f"benchmark.0.{f}" for f in OFFICIAL_BENCH_FIELDS}
    assert 3 <= int(keys["benchmark.0.runs"]) <= 100
    assert float(keys["benchmark.0.best"]) <= float(keys["benchmark.0.mean"]) <= float(keys["benchmark.0.worst"])


def test_leaderboard_mode_rechecks_with_fresh_seeds(bundle):
    (bundle / "one.txt").write_text(SMALL_LINE.format(seed=5) + "\n")
    code, output, stderr = run_bundle(bundle, "leaderboard", "one.txt", {"POPCORN_SEED": "4242"})
    keys = parse_popcorn(output)
    assert code == 0 and keys["check"] == "pass", stderr
    assert float(keys["benchmark.0.mean"]) > 0


def test_wrong_result_exits_112_with_a_short_report(bundle):
    write_submission(bundle, "def custom_kernel(data):\n    cfg, rank_data, rank, ws = data\n"
                             "    return torch.zeros_like(rank_data.x)\n")
    (bundle / "one.txt").write_text(SMALL_LINE.format(seed=1) + "\n")
    code, output, _ = run_bundle(bundle, "test", "one.txt")
    keys = parse_popcorn(output)
    assert code == 112
    assert keys["test.0.status"] == "fail" and keys["check"] == "fail"
    assert "elements differ" in keys["test.0.error"] and len(keys["test.0.error"]) < 2000


def test_hanging_rank_is_killed_and_named(tmp_path):
    hang = tmp_path / "hang_rank1.py"
    hang.write_text("import time\nimport torch\n\ndef custom_kernel(data):\n    cfg, rank_data, rank, ws = data\n"
                    "    if rank == 1:\n        time.sleep(3600)\n    return rank_data.x\n")
    started = time.monotonic()
    result = run_eval("test", str(hang), "--world-size", "2", "--cases", "tests:0", "--timeout", "8", timeout=120)
    assert time.monotonic() - started < 90
    assert result.returncode == 112
    assert "rank 1 in custom_kernel" in result.stderr and "rank 0 checking the output" in result.stderr
    assert "num_experts: 8" in result.stderr
    leftovers = []
    for proc in Path("/proc").iterdir():
        try:
            if "a2a-hang_rank1-" in os.readlink(proc / "cwd"):
                leftovers.append(proc.name)
        except OSError:
            continue
    assert not leftovers, f"processes left behind: {leftovers}"


def test_crashing_rank_reports_the_exception(bundle, tmp_path):
    bad = tmp_path / "raise_rank0.py"
    bad.write_text("def custom_kernel(data):\n    if data[2] == 0:\n        raise ValueError('planted failure')\n"
                   "    return data[1].x\n")
    result = run_eval("test", str(bad), "--world-size", "2", "--cases", "tests:0", "--timeout", "60", timeout=120)
    assert result.returncode == 112
    assert "ValueError: planted failure" in result.stdout


@pytest.mark.parametrize("body, message", [
    ("def custom_kernel(data):\n    return data[1].x[:-1]\n", "shape mismatch"),
    ("def custom_kernel(data):\n    return data[1].x.float()\n", "dtype mismatch"),
    ("def custom_kernel(data):\n    return data[1].x.to('meta')\n", "device mismatch"),
    ("def custom_kernel(data):\n    return data[1].x.tolist()\n", "expected a torch.Tensor"),
])
def test_wrong_output_is_named(tmp_path, body, message):
    path = tmp_path / "wrong.py"
    path.write_text(body)
    result = run_eval("test", str(path), "--world-size", "2", "--cases", "tests:1", timeout=120)
    assert result.returncode == 112
    assert message in result.stdout


def test_bad_inputs_give_one_line_and_nonzero_exit(tmp_path):
    no_kernel = tmp_path / "no_kernel.py"
    no_kernel.write_text("def something_else(data):\n    return None\n")
    bad_line = tmp_path / "bad_cases.txt"
    bad_line.write_text("num_experts: 8; experts_per_token two\n")
    bad_task = tmp_path / "task.yml"
    bad_task.write_text("files: [\n")
    incomplete_task = tmp_path / "incomplete.yml"
    incomplete_task.write_text("files: []\ntests: []\n")
    cases = [
        (("test", "missing_version.py"), "no such file"),
        (("test", "v99"), "unknown version 'v99'"),
        (("test", str(no_kernel)), "defines no custom_kernel"),
        (("test", "v1", "--world-size", "3"), "cannot be split evenly over 3 ranks"),
        (("test", "v1", "--world-size", "16", "--backend", "nccl"), "GPU"),
        (("test", "v1", "--cases", str(bad_line)), "invalid test case"),
        (("test", "v1", "--task", str(bad_task)), "not valid YAML"),
        (("test", "v1", "--task", str(incomplete_task)), "must be a non-empty list"),
        (("test", "v1", "--cases", "tests:42"), "indices must be in 0..8"),
        (("stage", "v1"), "usage"),
    ]
    for args, message in cases:
        result = run_eval(*args, timeout=60)
        assert result.returncode != 0, args
        assert message in result.stderr, (args, result.stderr)
        assert "Traceback" not in result.stderr, (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) <= 2, (args, result.stderr)


def test_protocol_face_rejects_malformed_test_file(bundle):
    (bundle / "bad.txt").write_text("num_experts: eight; world_size: 2\nthis is not a case\n")
    code, output, stderr = run_bundle(bundle, "test", "bad.txt")
    assert code == 113 and "invalid test case" in stderr and output == ""
    code, output, stderr = run_bundle(bundle, "test", "does_not_exist.txt")
    assert code == 113 and "Could not open test file" in stderr


def test_stage_writes_the_leaderboard_file_set(tmp_path):
    result = run_eval("stage", "v1", str(tmp_path / "b"))
    assert result.returncode == 0, result.stderr
    names = {p.name for p in (tmp_path / "b").iterdir()}
    assert {"submission.py", "task.py", "reference.py", "utils.py", "eval.py"} <= names
    assert (tmp_path / "b" / "submission.py").read_text() == (ROOT / "submissions/all2all/v1_torch_sort.py").read_text()
    assert (tmp_path / "b" / "eval.py").read_text() == (ROOT / "eval.py").read_text()


# A version may import the standard library, torch, triton and the bundle's task.py: nothing from this repository.
ALLOWED_IMPORTS = set(sys.stdlib_module_names) | {"torch", "triton", "task"}


@pytest.mark.parametrize("version", sorted(p.name for p in (ROOT / "submissions" / "all2all").glob("v*.py")))
def test_every_version_is_self_contained(version, tmp_path):
    path = ROOT / "submissions" / "all2all" / version
    tree = ast.parse(path.read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported <= ALLOWED_IMPORTS, f"{version} imports {imported - ALLOWED_IMPORTS}"
    assert path.read_text().startswith("#!POPCORN leaderboard amd-all2all")
    staged = run_eval("stage", path.stem, str(tmp_path / "b"))
    assert staged.returncode == 0, staged.stderr
    if needs_gpu(path):
        pytest.skip(f"{version} builds GPU code; its staged bundle runs in tests/test_gpu.py")
    (tmp_path / "b" / "two.txt").write_text("\n".join(SMALL_LINE.format(seed=s) for s in (8, 9)) + "\n")
    code, output, stderr = run_bundle(tmp_path / "b", "test", "two.txt")
    assert code == 0 and parse_popcorn(output)["check"] == "pass", stderr
