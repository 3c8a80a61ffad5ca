#!/usr/bin/env python3
"""Compile-only check of every version's device code, for NVIDIA and for AMD.

For each submission that holds a KERNELS string (the device code without torch headers), it writes it to a .cu
file and compiles it with plain `-c` (so inline assembly is checked too), and again with -DA2A_TRACE where the file
has timeline probes (the trace build):
  - NVIDIA: nvcc -arch=sm_90 -c
  - AMD: PyTorch's hipify (what load_inline does on ROCm), then hipcc --offload-arch=gfx940 -c and gfx90a
    (Debian's hipcc; gfx942, the MI300X, is unknown to it; gfx940 is its closest sibling).
Exits non-zero naming each file and target that failed, with the compiler's first error lines.

    python tools/check_device.py [FILES...]    (default: submissions/*/v*.py and the toolkit's a2a/probes.py)
"""
from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
AMD_ARCHS = ("gfx940", "gfx90a")
# What PyTorch's ROCm extension build defines on the command line (the prelude keys its AMD branch on it).
TORCH_ROCM_DEFINES = ("-D__HIP_PLATFORM_AMD__=1", "-DUSE_ROCM=1")


def kernels_of(path: Path) -> str | None:
    """The KERNELS string of a version file, read without importing it (importing would build it)."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "KERNELS" for t in node.targets):
            if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                return node.value.value
    return None


def hipify(source: Path) -> Path:
    import contextlib
    import io

    from torch.utils.hipify import hipify_python

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        result = hipify_python.hipify(project_directory=str(source.parent), output_directory=str(source.parent),
                                      extra_files=[str(source)], is_pytorch_extension=True, show_detailed=False,
                                      show_progress=False, hipify_extra_files_only=True)
    entry = result.get(str(source))
    return Path(entry.hipified_path) if entry is not None and entry.hipified_path else source


def compile_one(command: list[str], cwd: Path) -> str | None:
    """None on success, else the first error lines."""
    env = dict(os.environ, HIP_PLATFORM="amd")  # Debian's hipcc picks NVIDIA when nvcc is on the PATH
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, env=env)
    if done.returncode == 0:
        return None
    lines = [line for line in (done.stderr + done.stdout).splitlines() if "error" in line.lower()]
    return "\n    ".join((lines or (done.stderr + done.stdout).splitlines())[:6])


def check(path: Path, nvcc: str, hipcc: str) -> list[str]:
    """Compiles the device code for every target; a file with timeline probes also in its trace build."""
    source = kernels_of(path)
    if source is None:
        print(f"{path.name}: no KERNELS (PyTorch only), nothing to compile")
        return []
    builds = [("", [])] + ([(" trace", ["-DA2A_TRACE"])] if "A2A_TRACE" in source else [])
    failures = []
    with tempfile.TemporaryDirectory(prefix="a2a-check-") as tmp:
        cuda_dir, hip_dir = Path(tmp, "cuda"), Path(tmp, "hip")
        cuda_dir.mkdir()
        hip_dir.mkdir()
        (cuda_dir / "kernels.cu").write_text(source)
        (hip_dir / "kernels.cu").write_text(source)
        hipified = hipify(hip_dir / "kernels.cu")
        targets = []
        for build, defines in builds:
            targets.append((f"nvcc sm_90{build}", [nvcc, "-arch=sm_90", *defines, "-c", "kernels.cu", "-o",
                                                   "kernels.o"], cuda_dir))
            for arch in AMD_ARCHS:
                targets.append((f"hipcc {arch}{build}", [hipcc, "-x", "hip", f"--offload-arch={arch}",
                                                         *TORCH_ROCM_DEFINES, *defines, "-c", hipified.name, "-o",
                                                         f"kernels_{arch}.o"], hip_dir))
        for name, command, cwd in targets:
            error = compile_one(command, cwd)
            status = "ok" if error is None else "FAILED"
            print(f"{path.name}: {name}: {status}")
            if error is not None:
                failures.append(f"{path.name}: {name}:\n    {error}")
    return failures


def main(argv: list[str]) -> int:
    files = [Path(a) for a in argv] or sorted((ROOT / "submissions").glob("*/v*.py")) + [ROOT / "a2a" / "probes.py"]
    nvcc, hipcc = shutil.which("nvcc"), shutil.which("hipcc")
    missing = [name for name, tool in (("nvcc", nvcc), ("hipcc", hipcc)) if tool is None]
    if missing:
        print(f"check-device: {' and '.join(missing)} not found (CI installs hipcc from Debian: apt-get install "
              f"hipcc libamdhip64-dev)", file=sys.stderr)
        return 2
    failures = [failure for path in files for failure in check(path, nvcc, hipcc)]
    if failures:
        print("\ndevice-code check failed:\n" + "\n".join(failures), file=sys.stderr)
        return 1
    print(f"device-code check passed ({len(files)} file(s))")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
