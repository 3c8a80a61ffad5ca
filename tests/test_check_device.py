"""tools/check_device.py: the real versions compile for sm_90, gfx940 and gfx90a; a planted error on either
vendor's path fails the check and names the target."""
import shutil
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.skipif(not (shutil.which("nvcc") and shutil.which("hipcc")),
                                reason="needs nvcc and hipcc (CI installs Debian's hipcc)")
TOOL = ROOT / "tools" / "check_device.py"
V2 = ROOT / "submissions" / "all2all" / "v2_p2p.py"


def run_tool(*files):
    return subprocess.run([sys.executable, str(TOOL), *map(str, files)], capture_output=True, text=True, timeout=600)


def planted(tmp_path, old: str, new: str):
    text = V2.read_text()
    assert old in text
    path = tmp_path / "planted.py"
    path.write_text(text.replace(old, new, 1))
    return path


def test_every_version_compiles_for_nvidia_and_amd():
    result = run_tool()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "v2_p2p.py: hipcc gfx940: ok" in result.stdout


def test_planted_amd_error_fails(tmp_path):
    # A warp intrinsic outside the prelude's vendor branch: fine for nvcc, rejected by HIP.
    path = planted(tmp_path, "#define A2A_THREADS 256", "__device__ void planted() { __syncwarp(); }\n#define A2A_THREADS 256")
    result = run_tool(path)
    assert result.returncode == 1
    assert "planted.py: nvcc sm_90: ok" in result.stdout
    assert "planted.py: hipcc gfx940: FAILED" in result.stdout and "hipcc gfx940" in result.stderr


def test_planted_nvidia_error_fails(tmp_path):
    # Bad inline PTX in the NVIDIA branch: only a real `-c` compile (ptxas) catches it.
    path = planted(tmp_path, "ld.acquire.sys.global.b32", "ld.acquire.sys.global.b33")
    result = run_tool(path)
    assert result.returncode == 1
    assert "planted.py: nvcc sm_90: FAILED" in result.stdout
    assert "planted.py: hipcc gfx940: ok" in result.stdout
