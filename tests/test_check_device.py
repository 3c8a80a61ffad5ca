"""tools/check_device.py: the real versions compile for sm_90, gfx942 (whole code objects) and gfx90a; a planted
error on either vendor's path fails the check and names the target, AMD inline assembly included; every file's lines
are printed whatever the other threads do."""
import contextlib
import io
import re
import subprocess
import threading

import pytest

from tests.conftest import ROOT, run_device_check
from tools import check_device

# With tests/test_memory_model.py: one run of the whole check. Beside an `alone` test: its commands take their own
# turn (tests/conftest.py, run_device_check), its other tests compile little in this process.
pytestmark = [pytest.mark.xdist_group("device-code"), pytest.mark.beside_alone]
needs_tools = pytest.mark.skipif(bool(check_device.missing_tools()),
                                reason=f"needs {', '.join(check_device.missing_tools())} ({check_device.INSTALL_HINT})")
V2 = ROOT / "submissions" / "all2all" / "v2_p2p.py"
V7 = ROOT / "submissions" / "all2all" / "v7_triton.py"


def planted_v2(old: str, new: str) -> str:
    """v2 with `old` replaced by `new`, and without its trace build: the check builds one where the device code names
    A2A_TRACE, the probes' macro. Every planted error lies outside the probes (the timed build, the one these tests
    read, compiles the same either way), and the whole check holds every trace build: four compiles of eight."""
    text = V2.read_text()
    assert old in text
    return text.replace(old, new, 1).replace("A2A_TRACE", "A2A_PROBES")


def planted_v7(old: str, new: str) -> str:
    """v7 with `old`, found once, replaced by `new`."""
    text = V7.read_text()
    assert text.count(old) == 1, old
    return text.replace(old, new)


# file name -> its text: each planted error in a file of its own, every file in one run of the check (planted_check).
PLANTED = {
    # Assembly the gfx942 assembler rejects, in the HIP branch of a Triton helper: Triton's AMD backend must see it
    # and its NVIDIA backend must never compile that branch.
    "planted_v7.py": lambda: planted_v7('"s_sleep 1"', '"s_planted_nonsense 1"'),
    "drifted_v7.py": lambda: planted_v7('"rank": "i32", "timeout_ns": "i64"}', '"timeout_ns": "i64", "rank": "i32"}'),
    # A warp intrinsic outside the prelude's vendor branch: fine for nvcc, rejected by HIP.
    "planted_amd.py": lambda: planted_v2("#define A2A_THREADS 256",
                                         "__device__ void planted() { __syncwarp(); }\n#define A2A_THREADS 256"),
    # Inline assembly the gfx942 assembler rejects, inside the AMD branch: only a whole `-c` compile catches it.
    "planted_amd_assembly.py": lambda: planted_v2(
        "__device__ __forceinline__ void warp_sync() { __builtin_amdgcn_wave_barrier(); }",
        "__device__ __forceinline__ void warp_sync() { asm volatile(\"s_planted_nonsense 1\"); }"),
    # Bad inline PTX in the NVIDIA branch: only a real `-c` compile (ptxas) catches it.
    "planted_nvidia.py": lambda: planted_v2("ld.acquire.sys.global.b32", "ld.acquire.sys.global.b33"),
}


@pytest.fixture(scope="module")
def planted_check(tmp_path_factory) -> subprocess.CompletedProcess:
    """The check over every PLANTED file at once: one process, one import of torch and Triton (a run per file took
    41 CPU seconds for the five on 2 cores, one run 29); each test reads its own file's lines."""
    folder = tmp_path_factory.mktemp("planted")
    for name, text in PLANTED.items():
        (folder / name).write_text(text())
    return run_device_check(*(folder / name for name in PLANTED))


def failures_of(result: subprocess.CompletedProcess, name: str) -> str:
    """What the check's failure report (stderr) says of file `name`: each of its failed targets, with the
    compiler's lines."""
    return "\n".join(re.findall(rf"^{re.escape(name)}: .*\n(?:    .*\n?)*", result.stderr, re.M))


@needs_tools
def test_every_version_compiles_for_nvidia_and_amd(device_check):
    result = device_check
    assert result.returncode == 0, result.stdout + result.stderr
    for target in ("nvcc sm_90", "clang gfx942", "clang20 gfx950", "hipcc gfx90a", "clang gfx942 trace",
                   "clang20 gfx950 trace"):
        assert f"v4_low_overhead.py: {target}: ok" in result.stdout
    for target in ("gfx942", "gfx950"):
        assert f"v4_low_overhead.py: {target} memory model:" in result.stdout
        assert f"v7_triton.py: {target} memory model:" in result.stdout
    for target in ("triton sm_90", "triton gfx942", "triton gfx950", "triton sm_90 trace", "triton gfx942 trace",
                   "triton gfx950 trace"):
        assert f"v7_triton.py: {target}: ok" in result.stdout
    # the suite's run: gfx942 on every benchmark shape, NVIDIA (the GPU suite runs all) and gfx950 on the largest
    shapes = len(check_device.benchmark_shapes())
    for target, built in (("sm_90", 1), ("gfx942", shapes), ("gfx950", 1)):
        assert f"v13_row_tiles.py: triton {target}: ok (1 kernel(s) x {built} shape(s)" in result.stdout, result.stdout
    gcc = check_device.newest_gcc()
    assert gcc and f"host C++ ({gcc.rsplit('/', 1)[-1]} " in result.stdout, result.stdout
    assert ": CPP_DECLS of v2_p2p, " in result.stdout and ": ENTRY of v9_native_entry: ok" in result.stdout


def test_the_host_check_takes_the_newest_gcc_and_names_its_error(tmp_path, monkeypatch):
    """check_device.check_host: the newest g++-N on PATH compiles each version's host C++; an error planted in
    v9's ENTRY fails it with the compiler's own error line."""
    fake = tmp_path / "bin"
    fake.mkdir()
    for name in ("g++-9", "g++-14", "g++-tools"):
        (fake / name).write_text("#!/bin/sh\n")
        (fake / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:/usr/bin")
    assert check_device.newest_gcc() == str(fake / "g++-14")
    monkeypatch.undo()
    if check_device.newest_gcc() is None:
        pytest.skip("no g++ on this machine")
    v9 = ROOT / "submissions" / "all2all" / "v9_native_entry.py"
    broken = tmp_path / "v9_broken.py"
    text = v9.read_text()
    assert text.count("PyErr_SetString(") > 1
    broken.write_text(text.replace("PyErr_SetString(", "PyErr_SetStrung(", 1))
    lines, failures = check_device.check_host([v9, broken])
    assert lines[0].endswith("ENTRY of v9_native_entry: ok") and len(failures) == 1, (lines, failures)
    assert "ENTRY of v9_broken" in failures[0] and "PyErr_SetStrung" in failures[0] and "error" in failures[0]


@needs_tools
@pytest.mark.parametrize("planted, nvidia, gfx942, gfx950", [
    ("planted_v7.py", "triton sm_90", "triton gfx942", "triton gfx950"),  # a Triton error on one vendor
    ("planted_amd.py", "nvcc sm_90", "clang gfx942", "clang20 gfx950"),  # a C++ error in the AMD branch
])
def test_an_error_planted_for_amd_fails_amd_only(planted_check, planted, nvidia, gfx942, gfx950):
    assert planted_check.returncode == 112
    assert f"{planted}: {nvidia}: ok" in planted_check.stdout
    assert f"{planted}: {gfx942}: FAILED" in planted_check.stdout
    assert f"{planted}: {gfx942}:" in failures_of(planted_check, planted)
    assert f"{planted}: {gfx950}: FAILED" in planted_check.stdout


@needs_tools
def test_triton_arguments_that_drift_from_the_kernel_fail(planted_check):
    assert planted_check.returncode == 112 and "TRITON_KERNELS says" in failures_of(planted_check, "drifted_v7.py")


@needs_tools
def test_planted_amd_assembly_error_fails(planted_check):
    assert planted_check.returncode == 112
    assert "planted_amd_assembly.py: nvcc sm_90: ok" in planted_check.stdout
    assert "planted_amd_assembly.py: clang gfx942: FAILED" in planted_check.stdout
    assert "planted_amd_assembly.py: clang20 gfx950: FAILED" in planted_check.stdout


@needs_tools
def test_planted_nvidia_error_fails(planted_check):
    assert planted_check.returncode == 112
    assert "planted_nvidia.py: nvcc sm_90: FAILED" in planted_check.stdout
    assert "planted_nvidia.py: clang gfx942: ok" in planted_check.stdout
    assert "planted_nvidia.py: clang20 gfx950: ok" in planted_check.stdout


@needs_tools
@pytest.mark.parametrize("version", ["v8_driver_launch", "v9_native_entry"])
def test_driver_launch_counts_the_compiled_kernels_parameters_on_both_targets(version):
    """v8 and v9 launch through the driver on a kernelParams array sized from the compiled kernel itself (PTX's
    .param list, AMDGPU's explicit arguments): both readings must agree, and both must equal the runtime arguments
    plus what the installed Triton's own launcher appends after them."""
    import inspect as source_of

    from triton.backends.nvidia import driver as nvidia_driver

    path = ROOT / "submissions" / "all2all" / f"{version}.py"
    module = check_device.triton_module(path)
    appended = source_of.getsource(nvidia_driver.make_launcher).count('params.append("&')
    shape = check_device.benchmark_shapes()[0]
    counts = {target: module.param_count(check_device.triton_compile(module, "all2all_kernel", target, shape, False))
              for target in ("sm_90", "gfx942")}
    assert counts["sm_90"] == counts["gfx942"] == len(module.TRITON_KERNELS["all2all_kernel"]) + appended, counts


def test_a_files_lines_are_printed_while_another_thread_hipifies(tmp_path, monkeypatch, capsys):
    """hipify swaps sys.stdout for its own: a file's lines printed meanwhile must still reach the real one (they
    went into hipify's, and a run printed 80, 90 or 100 lines by chance)."""
    first, second = tmp_path / "first.py", tmp_path / "second.py"
    first.write_text("")
    second.write_text("")
    hipifying = threading.Event()

    def check(path, nvcc, hipcc, every_shape=True):
        if path == second:  # as hipify does, under its lock, for longer than the first file takes
            with check_device._HIPIFY, contextlib.redirect_stdout(io.StringIO()):
                hipifying.set()
                threading.Event().wait(1.0)
        else:
            hipifying.wait(5)
        check_device.say(f"{path.name}: checked")
        return []

    monkeypatch.setattr(check_device, "check", check)
    monkeypatch.setattr(check_device, "missing_tools", lambda: [])
    monkeypatch.setattr(check_device.os, "cpu_count", lambda: 2)
    assert check_device.main([str(first), str(second)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[:2] == ["first.py: checked", "second.py: checked"], printed


def test_files_with_the_same_kernels_share_one_triton_build_and_no_other(tmp_path):
    """v7, v8, v9 and v8's scratch copy carry the same kernels, which Triton's cache tells apart by line number
    alone: the check builds them once. A copy whose kernels sit elsewhere in the file is the same build; one whose
    helper or constant changed is not."""
    text = V7.read_text()
    moved, changed_helper, changed_constant = (tmp_path / name for name in ("moved.py", "helper.py", "constant.py"))
    moved.write_text("# two lines more above every kernel\n\n" + text)
    assert text.count('"s_sleep 1"') == 1 and text.count("WAIT_COMBINED_ROW = tl.constexpr(3)") == 1
    changed_helper.write_text(text.replace('"s_sleep 1"', '"s_sleep 2"'))
    changed_constant.write_text(text.replace("WAIT_COMBINED_ROW = tl.constexpr(3)",
                                             "WAIT_COMBINED_ROW = tl.constexpr(4)"))
    keys = {path.name: check_device.triton_source_key(check_device.triton_module(path))
            for path in (V7, ROOT / "submissions" / "all2all" / "v9_native_entry.py", moved, changed_helper,
                         changed_constant)}
    assert keys["v7_triton.py"] == keys["v9_native_entry.py"] == keys["moved.py"], keys
    assert len({keys["v7_triton.py"], keys["helper.py"], keys["constant.py"]}) == 3, keys
