#!/usr/bin/env python3
"""Compile-only check of every version's device code, for NVIDIA and for AMD's real ISA.

For each submission that holds a KERNELS string (the device code without torch headers), it writes it to a .cu
file and compiles it with plain `-c` (so inline assembly goes through the assembler), and again with -DA2A_TRACE
where the file has timeline probes (the trace build):
  - NVIDIA: nvcc -arch=sm_90 -c
  - AMD MI300X: PyTorch's hipify (what load_inline does on ROCm), then Debian's clang-19 for gfx942, a whole code
    object (-c, linked with the ROCm device library). Debian's device-library bitcode (5.2) lacks the one file that
    names gfx942's ISA version; it is generated here from its single constant (9402), so nothing else is stood in.
  - AMD MI355X (gfx950, GPU MODE's AMD runners now): LLVM 20's clang (the first with gfx950; Debian bookworm stops
    at clang-19), taken from the `ziglang` wheel on PyPI (`zig clang`, clang 20.1.2), with clang-19's HIP wrapper
    headers (zig ships none), Debian's device library plus a generated oclc_isa_version_950.bc (9500), and Debian's
    lld-19 as its linker: a whole code object, as for gfx942.
  - AMD MI250 (gfx90a) with Debian's hipcc 5.2: a second, older HIP toolchain.
Exits non-zero naming each file and target that failed, with the compiler's first error lines.

`amd_assembly(path, target)` returns the gfx942 or gfx950 assembly of a file's device code, and `memory_model(asm)`
counts the system-scope sequences that publishing and waiting on a flag compile to there: release stores
(`buffer_wbl2 sc0 sc1`, then a store or atomic with `sc0 sc1`), acquire loads (a load with `sc0 sc1`, then
`buffer_inv sc0 sc1`), relaxed polls with their back-off (`s_sleep`) and the acquire fence after a poll loop. The
check prints each file's counts, read from the assembly its timed build's code objects were made from; the
memory-model test holds each version to what its NOTES promise.

A Triton version (v7 on: `@triton.jit` kernels, listed with their argument types in TRITON_KERNELS, constexprs from
its `constants()`) is imported without a GPU and compiled by `triton.compile` for sm_90 and gfx942 (Triton's own
backends: no CUDA or ROCm toolchain involved) for sm_90, gfx942 and gfx950, once per benchmark shape at world size 8
and once more as the trace build, with the argument attributes Triton's launcher gives 16-byte-aligned tensors.
Files whose kernels are the same, line numbers aside (`triton_source_key`), share one build per target and shape.

The sequences expected are the same on gfx942 and gfx950, and the check holds both targets to them: LLVM's memory
legalizer picks its cache control by subtarget feature, and gfx950's feature set is gfx94x's plus its own
instructions (llvm-project, AMDGPU.td `FeatureISAVersion9_5_Common` = `FeatureISAVersion9_4_Common` + ...,
PR #116307), so `SICacheControl::create` takes the `hasGFX940Insts()` branch (`SIGfx940CacheControl`,
SIMemoryLegalizer.cpp) for both; AMDGPUUsage's "Memory Model GFX942" tables then give, at system scope, release
store = `buffer_wbl2 sc0 sc1` + `s_waitcnt` + store `sc0 sc1`, acquire load = load `sc0 sc1` + `s_waitcnt` +
`buffer_inv sc0 sc1`, relaxed atomic load = load `sc0 sc1`, acquire fence = `buffer_inv sc0 sc1`. The compiled code
agrees: every version's counts are equal on both targets (docs/device-check.md's target table).

    python -m tools.check_device [FILES...]    (default: submissions/*/v*.py, the scratch copies in
                                                submissions/*/ideas/ and the toolkit's a2a/probes.py)
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import functools
import hashlib
import io
import itertools
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


from a2a import cli
from a2a import plan as planning
from eval import UserError

ROOT = planning.ROOT
CLANG, CLANG_C = "clang++-19", "clang-19"
# What PyTorch's ROCm extension build defines on the command line (the prelude keys its AMD branch on it), and the
# optimisation load_inline asks for in every version.
TORCH_ROCM_FLAGS = ("-D__HIP_PLATFORM_AMD__=1", "-DUSE_ROCM=1", "-O3")
DEBIAN_DEVICE_LIBS = Path("/usr/lib/x86_64-linux-gnu/amdgcn/bitcode")
ISA_VERSIONS = {"gfx942": 9402, "gfx950": 9500}  # oclc_isa_version_<n>.bc's one constant, per AMD target
AMD_TARGETS = ("gfx942", "gfx950")  # whole code objects and memory-model counts
LLD_19 = Path("/usr/lib/llvm-19/bin")  # lld and ld.lld, the linker clang 20 finds by name on the PATH
CLANG_19_HEADERS = Path("/usr/lib/llvm-19/lib/clang/19/include")  # __clang_hip_runtime_wrapper.h and its kin
INSTALL_HINT = ("CI installs them from Debian: apt-get install hipcc libamdhip64-dev clang-19 lld-19, and from PyPI: "
                "pip install ziglang==0.15.1 (clang 20, for gfx950)")


def is_triton(path: Path) -> bool:
    return "@triton.jit" in path.read_text()


def kernels_of(path: Path, name: str = "KERNELS") -> str | None:
    """A string constant of a version file (its KERNELS by default), read without importing it (importing would
    build it)."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                return node.value.value
    return None


# Files are checked side by side, one thread each (the compilers are processes). Each thread's lines are kept and
# printed in the files' order. hipify swaps the process's stdout and Triton's compiler is not known to be
# thread-safe, so each runs one at a time; the lines are printed under hipify's lock, else a file's lines printed
# while another thread hipifies went into its swapped-in stdout (seen: 80, 90 or 100 lines from one tree).
_said = threading.local()
_HIPIFY = threading.Lock()
_TRITON = threading.Lock()
_IMPORT = threading.Lock()
# A file's compiles run side by side (a planted file's eight took 16 s one after another on 2 cores); this bounds
# them, across files too, to the cores.
_COMPILES = threading.BoundedSemaphore(os.cpu_count() or 1)


def say(line: str) -> None:
    _said.lines.append(line)


def hipify(source: Path) -> Path:
    from torch.utils.hipify import hipify_python

    with _HIPIFY, contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        result = hipify_python.hipify(project_directory=str(source.parent), output_directory=str(source.parent),
                                      extra_files=[str(source)], is_pytorch_extension=True, show_detailed=False,
                                      show_progress=False, hipify_extra_files_only=True)
    entry = result.get(str(source))
    return Path(entry.hipified_path) if entry is not None and entry.hipified_path else source


_LIB_FOLDERS: list = []  # held for the life of the process (a TemporaryDirectory removes itself at exit)


@functools.lru_cache(maxsize=None)
def device_libs(target: str) -> Path:
    """A device-library folder for `target`: Debian's bitcode, plus oclc_isa_version_<n>.bc made from its constant
    (Debian's 5.2 library predates gfx942 and gfx950). Removed when this process ends."""
    _LIB_FOLDERS.append(tempfile.TemporaryDirectory(prefix=f"a2a-{target}-libs-"))
    folder = Path(_LIB_FOLDERS[-1].name)
    for bitcode in DEBIAN_DEVICE_LIBS.glob("*.bc"):
        (folder / bitcode.name).symlink_to(bitcode)
    (folder / "isa.ll").write_text(
        'target triple = "amdgcn-amd-amdhsa"\n'
        f"@__oclc_ISA_version = linkonce_odr protected local_unnamed_addr addrspace(4) constant i32 "
        f"{ISA_VERSIONS[target]}, align 4\n")
    subprocess.run([CLANG_C, "-target", "amdgcn-amd-amdhsa", "-nogpulib", "-c", "-emit-llvm", "isa.ll", "-o",
                    f"oclc_isa_version_{target[3:]}.bc"], cwd=folder, check=True, capture_output=True)
    return folder


def clang_20() -> list | None:
    """LLVM 20's clang driver from the ziglang wheel (`zig clang`), or None where the wheel is not installed."""
    try:
        import ziglang
    except ImportError:
        return None
    return [str(Path(ziglang.__file__).parent / "zig"), "clang"]


def amd_command(target: str, source: str, output: str, defines: list, assembly: bool = False,
                keep_assembly: bool = False) -> list:
    """One hipified file compiled for `target` (gfx942: Debian's clang-19; gfx950: clang 20), device code only:
    its assembly (`assembly`), or a whole code object, which with `keep_assembly` also leaves the assembly it was
    made from in the build folder (kept_assembly; the same instructions as an `-S` compile's, one compile fewer)."""
    compiler = [CLANG] if target == "gfx942" else [*clang_20(), "--rocm-path=/usr", "-isystem", str(CLANG_19_HEADERS)]
    return [*compiler, "-x", "hip", f"--offload-arch={target}", f"--rocm-device-lib-path={device_libs(target)}",
            *TORCH_ROCM_FLAGS, *defines, "--cuda-device-only", "--no-gpu-bundle-output", "-S" if assembly else "-c",
            *(["-save-temps"] if keep_assembly else []), source, "-o", output]


def kept_assembly(folder: Path, source: str, target: str) -> str:
    """The assembly a `keep_assembly` compile of `source` for `target` left in `folder` (clang's -save-temps name)."""
    return (folder / f"{Path(source).stem}-hip-amdgcn-amd-amdhsa-{target}.s").read_text()


def compile_one(command: list[str], cwd: Path) -> str | None:
    """None on success, else the first error lines."""
    # Debian's hipcc picks NVIDIA when nvcc is on the PATH; clang 20 (gfx950) links with lld-19, found by name. The
    # compilers' temporary files go in the build folder (removed with it): Debian's hipcc leaves two empty
    # kernels-XXXXXX folders in TMPDIR per compile.
    env = dict(os.environ, HIP_PLATFORM="amd", PATH=f"{LLD_19}{os.pathsep}{os.environ.get('PATH', '')}",
               TMPDIR=str(Path(cwd).resolve()))
    with _COMPILES:
        done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, env=env)
    if done.returncode == 0:
        return None
    lines = [line for line in (done.stderr + done.stdout).splitlines() if "error" in line.lower()]
    return "\n    ".join((lines or (done.stderr + done.stdout).splitlines())[:6])


def amd_assembly(path: Path, target: str = "gfx942", trace: bool = False) -> str:
    """The gfx942 or gfx950 assembly of a file's device code, as load_inline would build it on ROCm (after hipify);
    for a Triton version, its kernels' assembly from Triton's AMD backend (the largest benchmark shape)."""
    if is_triton(path):
        module = triton_module(path)
        return "\n".join(triton_compile(module, name, target, benchmark_shapes()[-1], trace).asm["amdgcn"]
                         for name in module.TRITON_KERNELS)
    source = kernels_of(path)
    if source is None:
        raise ValueError(f"{path.name} has no KERNELS")
    with tempfile.TemporaryDirectory(prefix="a2a-asm-") as tmp:
        (Path(tmp) / "kernels.cu").write_text(source)
        hipified = hipify(Path(tmp) / "kernels.cu")
        error = compile_one(amd_command(target, hipified.name, "kernels.s", ["-DA2A_TRACE"] if trace else [], True),
                            Path(tmp))
        if error:
            raise RuntimeError(f"{path.name}: {target} assembly failed:\n    {error}")
        return (Path(tmp) / "kernels.s").read_text()


_INSTRUCTION = re.compile(r"^\s+([a-z][a-z0-9_]*)\b(.*)$")
_LABEL = re.compile(r"^\.LBB\w+:")  # a basic block's (a branch's target; .Ltmp labels only mark debug lines)
_WAITS = ("s_waitcnt", "s_nop")
_VECTOR_WRITE = re.compile(r"(global|flat|buffer)_(store|atomic)")
_BLOCK_END = ("s_branch", "s_cbranch", "s_setpc", "s_endpgm")


MEMORY_MODEL_FIELDS = ("release", "acquire", "poll", "fence", "sleep", "drain")


def _system_load(op: str, operands: str) -> bool:
    return bool(re.match(r"(flat|global)_load", op)) and "sc0 sc1" in operands


def memory_model(assembly: str) -> dict:
    """{field: count} at system scope over the assembly's functions (MEMORY_MODEL_FIELDS; a sequence never spans
    two functions): release = `buffer_wbl2 sc0 sc1`, then a store or atomic with `sc0 sc1`; acquire = a load with
    `sc0 sc1`, then `buffer_inv sc0 sc1`; poll = a load with `sc0 sc1` and no invalidate after it (a relaxed atomic
    load, which reads past the caches); fence = `buffer_inv sc0 sc1` after neither such a load nor a write-back (an
    acquire fence; a full system fence writes back first); sleep = `s_sleep` (a spin loop's back-off); drain = an
    `s_barrier` that every path into it reaches past an `s_waitcnt vmcnt(0)` with no vector store or atomic after
    the wait (every wave's stores complete before a barrier that orders them before one thread's release; on
    gfx942 and gfx950 vmcnt counts stores too)."""
    functions, name, starts = {}, None, {}
    for line in assembly.splitlines():
        started = re.match(r"^\s*\.type\s+([\w.$]+),@function", line)
        if started:
            name = started[1]
            functions[name], starts[name] = [], set()
        elif line.startswith(".Lfunc_end"):
            name = None
        elif name and _LABEL.match(line):
            starts[name].add(len(functions[name]))  # a jump may enter at the next instruction
        elif name and (instruction := _INSTRUCTION.match(line)):
            functions[name].append((instruction[1], instruction[2]))
    found = dict.fromkeys(MEMORY_MODEL_FIELDS, 0)
    for name, body in functions.items():
        for i, (op, operands) in enumerate(body):
            after = next(((o, a) for o, a in body[i + 1:i + 6] if o not in _WAITS), ("", ""))
            before = next(((o, a) for o, a in reversed(body[max(0, i - 5):i]) if o not in _WAITS), ("", ""))
            if op == "buffer_wbl2" and "sc0 sc1" in operands and (
                    (re.match(r"(flat|global)_store", after[0]) and "sc0 sc1" in after[1])
                    or (re.match(r"(flat|global)_atomic", after[0]) and "sc1" in after[1])):
                found["release"] += 1  # an atomic's sc0 only asks for the old value back; sc1 is system scope
            if _system_load(op, operands):
                invalidated = after[0] == "buffer_inv" and "sc0 sc1" in after[1]
                found["acquire" if invalidated else "poll"] += 1
            if op == "buffer_inv" and "sc0 sc1" in operands and before[0] != "buffer_wbl2" \
                    and not _system_load(*before):
                found["fence"] += 1
            if op == "s_sleep":
                found["sleep"] += 1
            if op == "s_barrier" and _drained(body, starts[name], i):
                found["drain"] += 1
    return found


def _drained(body: list, starts: set, barrier: int) -> bool:
    """Whether the straight run of instructions that ends at `barrier` holds an `s_waitcnt vmcnt(0)` after its last
    vector store or atomic (a label or branch ends the run: another path may enter past the wait)."""
    at = barrier
    while at not in starts and at > 0:
        at -= 1
        op, operands = body[at]
        if op == "s_waitcnt" and operands.strip().startswith("vmcnt(0)"):
            return True
        if _VECTOR_WRITE.match(op) or op.startswith(_BLOCK_END):
            return False
    return False


def print_memory_model(path: Path, found: dict, target: str) -> None:
    say(f"{path.name}: {target} memory model: {found['release']} system-scope releases, {found['acquire']} acquire "
          f"loads, {found['poll']} relaxed polls, {found['fence']} acquire fences, {found['sleep']} back-offs, "
          f"{found['drain']} drained barriers")


_COUNTS_LINE = re.compile(r"^(\S+): (gfx\w+) memory model: (\d+) system-scope releases, (\d+) acquire loads, (\d+) "
                          r"relaxed polls, (\d+) acquire fences, (\d+) back-offs, (\d+) drained barriers$", re.M)


def printed_memory_models(output: str) -> dict:
    """{(file name, target): {field: count}} from the lines print_memory_model wrote into a check's output."""
    return {(found[1], found[2]): dict(zip(MEMORY_MODEL_FIELDS, map(int, found.groups()[2:])))
            for found in _COUNTS_LINE.finditer(output)}


# ---------------------------------------------------------------------------------------------------------------
# Triton versions
# ---------------------------------------------------------------------------------------------------------------

TRITON_TARGETS = {"sm_90": ("cuda", 90, 32), "gfx942": ("hip", "gfx942", 64), "gfx950": ("hip", "gfx950", 64)}
TRITON_WORLD = 8  # the leaderboard's


def triton_module(path: Path):
    """Imports a Triton version without a GPU (its kernels compile on demand; `task` from the bundle's folders)."""
    with _IMPORT:
        planning.use_bundle_modules()
        return planning.load_version(path, f"check_{path.stem}")


def benchmark_shapes() -> list:
    names = ("num_experts", "experts_per_token", "hidden_dim", "max_num_tokens")
    return [{name: case[name] for name in names} for case in planning.load_task()["benchmarks"]]


@functools.cache
def triton_source_key(module) -> str:
    """What a Triton build of `module` depends on, line numbers aside: the source of every @triton.jit function in it
    and the values of the globals they use. Versions that carry the same kernels (v7, v8, v9 and v8's scratch copy)
    have the same key; Triton's own cache key differs between them by the functions' line numbers alone. Once per
    module: a file's builds all ask."""
    import triton

    def described(used):  # a global a kernel uses: a constant by value, another kernel by name (its source is hashed)
        return f"jit {used.__name__}" if isinstance(used, triton.JITFunction) else repr(used)

    jitted = sorted((name, value) for name, value in vars(module).items() if isinstance(value, triton.JITFunction))
    for _, function in jitted:
        function.cache_key  # noqa: B018  (fills used_global_vals: {(name, id of its globals): (value, globals)})
    return hashlib.sha256(repr([(name, function.src, sorted((used_name, described(used)) for (used_name, _), (used, _)
                                                            in function.used_global_vals.items()))
                                for name, function in jitted]).encode()).hexdigest()


# A build's result (a compiled kernel, or the error it raised) by everything it depends on: a file whose kernels
# another file already built for a target and shape takes that build's verdict. Filled under _TRITON.
_TRITON_BUILDS: dict = {}


def triton_compile(module, kernel_name: str, target_name: str, shape: dict, trace: bool,
                   world_size: int = TRITON_WORLD):
    """One kernel of a Triton version compiled for one target, shape and world size, or the same build another file
    made; raises with the compiler's message."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend

    target = GPUTarget(*TRITON_TARGETS[target_name])
    hip = target.backend == "hip"
    kernel, arg_types = getattr(module, kernel_name), module.TRITON_KERNELS[kernel_name]
    constants = module.constants(**shape, world_size=world_size, trace=trace, hip=hip)
    runtime_args = [name for name in kernel.arg_names if name not in constants]
    if runtime_args != list(arg_types):
        raise ValueError(f"{kernel_name}'s runtime arguments are {runtime_args}, TRITON_KERNELS says {list(arg_types)}")
    backend = make_backend(target)
    # What the launcher derives from a 16-byte-aligned tensor under 2 GiB (on AMD that enables buffer loads).
    pointer_attrs = backend.parse_attr("DS" if hip else "D")
    attrs = {(kernel.arg_names.index(name),): pointer_attrs for name, kind in arg_types.items() if kind[0] == "*"}
    constexprs = {(kernel.arg_names.index(name),): value for name, value in constants.items()}
    signature = {name: arg_types.get(name, "constexpr") for name in kernel.arg_names}
    options = {"num_warps": max(1, module.LAUNCH_SHAPE[1] // target.warp_size)}
    key = (triton_source_key(module), kernel_name, target_name, repr(sorted(constexprs.items())),
           repr(sorted(signature.items())), repr(sorted(attrs.items())), repr(sorted(options.items())))
    if key not in _TRITON_BUILDS:
        try:
            _TRITON_BUILDS[key] = triton.compile(ASTSource(kernel, signature, constexprs, attrs), target=target,
                                                 options=options)
        except Exception as error:  # the same verdict for every file with these kernels
            _TRITON_BUILDS[key] = error
    if isinstance(_TRITON_BUILDS[key], Exception):
        raise _TRITON_BUILDS[key]
    return _TRITON_BUILDS[key]


_BLOCKED_1D = re.compile(r"^(#\w+) = #ttg\.blocked<\{sizePerThread = \[(\d+)\], threadsPerWarp = \[(\d+)\], "
                         r"warpsPerCTA = \[(\d+)\]", re.M)
_VOLATILE_LOAD = re.compile(r"tt\.load .*isVolatile = true")
_POLLED_VECTOR = re.compile(r"tensor<(\d+)x!tt\.ptr<\w+>, (#\w+)>")


def replicated_polls(ttgir: str) -> list[str]:
    """The volatile loads of a compiled Triton kernel (its polls on NVIDIA) over a vector smaller than its layout's
    tile, or on a layout this check cannot size: lanes that several threads hold, each thread loading them for
    itself. Each warp then counts what it alone saw (a sum over such lanes crosses no warp), and a loop on that count
    lets warps part and meet at each other's barriers (v12's first GPU run gave up so). An atomic's value is loaded by
    one thread a lane and handed to the others through shared memory (v7-v10 poll vectors so), a scalar's by one
    thread for all: both alike in every thread."""
    tiles = {name: int(per_thread) * int(threads) * int(warps)
             for name, per_thread, threads, warps in _BLOCKED_1D.findall(ttgir)}
    found = []
    for line in ttgir.splitlines():
        vector = _POLLED_VECTOR.search(line) if _VOLATILE_LOAD.search(line) else None
        if vector and int(vector[1]) < tiles.get(vector[2], int(vector[1]) + 1):
            found.append(f"a poll of {vector[1]} lanes on {vector[2]} (tile {tiles.get(vector[2], 'unknown')}): "
                         f"{line.strip().split(' loc(')[0][:160]}")
    return found


def check_triton(path: Path, every_shape_on=tuple(TRITON_TARGETS)) -> list[str]:
    """Every kernel of a Triton version for every target: every benchmark shape on the targets `every_shape_on`
    names, the largest alone on the others; the trace build on the largest."""
    failures = []
    try:
        module = triton_module(path)
    except Exception as error:  # an import that fails is the finding
        return [f"{path.name}: import failed: {type(error).__name__}: {error}"]
    for target_name in TRITON_TARGETS:
        shapes = benchmark_shapes() if target_name in every_shape_on else benchmark_shapes()[-1:]
        for build, trace, cases in (("", False, shapes), (" trace", True, shapes[-1:])):
            errors = []
            # A build stops at its first failure, the one reported (on 2 cores a vendor's failing build compiled
            # every other shape for seconds more).
            for kernel_name, shape in itertools.product(module.TRITON_KERNELS, cases):
                try:
                    built = triton_compile(module, kernel_name, target_name, shape, trace)
                except Exception as error:  # the compiler's message is the finding
                    lines = [line for line in str(error).splitlines() if line.strip()]
                    errors.append(f"{kernel_name} {shape}: " + "\n    ".join(lines[-6:]))
                    break
                errors += [f"{kernel_name} {shape}: {poll}" for poll in replicated_polls(built.asm["ttgir"])]
            name = f"triton {target_name}{build}"
            say(f"{path.name}: {name}: {'ok' if not errors else 'FAILED'} "
                  f"({len(module.TRITON_KERNELS)} kernel(s) x {len(cases)} shape(s), world size {TRITON_WORLD})")
            failures += [f"{path.name}: {name}:\n    {error}" for error in errors]
    if not failures:
        for target in AMD_TARGETS:
            print_memory_model(path, memory_model(amd_assembly(path, target)), target)
    return failures


def check(path: Path, nvcc: str, hipcc: str, every_shape_on=tuple(TRITON_TARGETS)) -> list[str]:
    """Compiles the device code for every target; a file with timeline probes also in its trace build."""
    if is_triton(path):
        with _TRITON:
            return check_triton(path, every_shape_on)
    source = kernels_of(path)
    if source is None:
        say(f"{path.name}: no KERNELS (PyTorch only), nothing to compile")
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
            # The timed build's code objects keep their assembly, which the memory model reads.
            targets.append((f"clang gfx942{build}", amd_command("gfx942", hipified.name, "kernels_gfx942.o",
                                                                 defines, keep_assembly=not build), hip_dir))
            targets.append((f"clang20 gfx950{build}", amd_command("gfx950", hipified.name, "kernels_gfx950.o",
                                                                   defines, keep_assembly=not build), hip_dir))
            targets.append((f"hipcc gfx90a{build}", [hipcc, "-x", "hip", "--offload-arch=gfx90a", *TORCH_ROCM_FLAGS,
                                                     *defines, "-c", hipified.name, "-o", "kernels_gfx90a.o"],
                            hip_dir))
        with ThreadPoolExecutor(max_workers=len(targets)) as pool:
            errors = list(pool.map(lambda target: compile_one(target[1], target[2]), targets))
        for (name, _, _), error in zip(targets, errors):
            say(f"{path.name}: {name}: {'ok' if error is None else 'FAILED'}")
            if error is not None:
                failures.append(f"{path.name}: {name}:\n    {error}")
        if not failures:
            for target in AMD_TARGETS:
                print_memory_model(path, memory_model(kept_assembly(hip_dir, hipified.name, target)), target)
    return failures


# ---------------------------------------------------------------------------------------------------------------
# Host C++ with the newest GCC on the machine (issue #50: "builds that survive any GPU image")
# ---------------------------------------------------------------------------------------------------------------


def newest_gcc() -> str | None:
    """The newest `g++-N` on PATH (Debian installs each GCC so), else `g++`."""
    found = []
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        for candidate in Path(folder or ".").glob("g++-[0-9]*"):
            number = re.fullmatch(r"g\+\+-(\d+)", candidate.name)
            if number and os.access(candidate, os.X_OK):
                found.append((int(number[1]), str(candidate)))
    return max(found)[1] if found else shutil.which("g++")


def check_host(files: list) -> tuple[list[str], list[str]]:
    """The host C++ the versions hand the host compiler, compiled (syntax and types) with the newest GCC here:
    every CPP_DECLS in one translation unit after torch/extension.h, as load_inline's main.cpp holds it (each in a
    namespace of its file's), and each ENTRY (v9 on: Python.h only) alone. NOTES: the BINDING half of a CUDA
    version is host code too, but its ATen/cuda headers need the CUDA libraries' headers (cusparse.h, cublas_v2.h),
    which this check's machines do not have: that half is compiled on the GPU machines only."""
    import sysconfig

    from torch.utils.cpp_extension import include_paths

    gcc = newest_gcc()
    if gcc is None:
        return [], ["host C++: no g++ found"]
    version = subprocess.run([gcc, "-dumpfullversion"], capture_output=True, text=True).stdout.strip()
    python = ["-I", sysconfig.get_paths()["include"]]
    units = []
    decls = [(path, kernels_of(path, "CPP_DECLS")) for path in files]
    decls = [(path, text) for path, text in decls if text]
    if decls:
        units.append(("CPP_DECLS of " + ", ".join(path.stem for path, _ in decls), "#include <torch/extension.h>\n"
                      + "".join(f"namespace host_{path.stem} {{\n{text}\n}}\n" for path, text in decls),
                      [arg for folder in include_paths() for arg in ("-I", folder)] + python))
    units += [(f"ENTRY of {path.stem}", text, python) for path in files
              if (text := kernels_of(path, "ENTRY"))]
    lines, failures = [], []
    with tempfile.TemporaryDirectory(prefix="a2a-host-") as tmp:
        for index, (name, text, flags) in enumerate(units):
            source = Path(tmp, f"unit{index}.cpp")
            source.write_text(text)
            error = compile_one([gcc, "-std=c++17", "-fsyntax-only", *flags, source.name], Path(tmp))
            lines.append(f"host C++ ({Path(gcc).name} {version}): {name}: {'ok' if error is None else 'FAILED'}")
            if error is not None:
                failures.append(f"host C++ ({Path(gcc).name} {version}): {name}:\n    {error}")
    return lines, failures


def missing_tools() -> list[str]:
    missing = [name for name in ("nvcc", "hipcc", CLANG) if shutil.which(name) is None]
    if not DEBIAN_DEVICE_LIBS.is_dir():
        missing.append(f"the ROCm device library ({DEBIAN_DEVICE_LIBS})")
    if not (LLD_19 / "lld").exists() or not CLANG_19_HEADERS.is_dir():
        missing.append(f"lld-19 and clang-19's headers ({LLD_19}, {CLANG_19_HEADERS})")
    if clang_20() is None:
        missing.append("clang 20 (the ziglang wheel)")
    return missing


def _checked(path: Path, nvcc: str, hipcc: str, every_shape_on) -> tuple[list[str], list[str]]:
    """One file's check in a pool thread: what it says, and its failures."""
    _said.lines = []
    failures = check(path, nvcc, hipcc, every_shape_on)
    return _said.lines, failures


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="Every version's device code compiled for sm_90, gfx942, gfx950 and "
                                                 "gfx90a, and the memory-model sequences of each.")
    parser.add_argument("files", nargs="*", type=Path, help="default: every version, scratch copy and the probes")
    parser.add_argument("--device-only", action="store_true",
                        help="leave out the host C++ check (a torch-headers compile, ~15 s a file on 2 cores)")
    parser.add_argument("--largest-shape", action="store_true",
                        help="a Triton file's timed build on the largest benchmark shape alone (the tests' planted "
                             "errors, which no shape changes)")
    parser.add_argument("--every-shape-on", default=",".join(TRITON_TARGETS),
                        help="the Triton targets built on every benchmark shape, the others on the largest alone "
                             "(default: all; the suite: the AMD ones, whose only check this is: the GPU suite runs "
                             "every shape on NVIDIA)")
    options = parser.parse_args(argv)
    files = options.files or (sorted((ROOT / "submissions").glob("*/v*.py"))
                                        + sorted((ROOT / "submissions").glob("*/ideas/*.py")) + [ROOT / "a2a" / "probes.py"])
    every_shape_on = () if options.largest_shape else tuple(filter(None, options.every_shape_on.split(",")))
    if unknown := sorted(set(every_shape_on) - set(TRITON_TARGETS)):
        raise UserError(f"check-device: --every-shape-on {', '.join(unknown)}: the targets are "
                        f"{', '.join(TRITON_TARGETS)}")
    missing = missing_tools()
    if missing:
        raise UserError(f"check-device: {', '.join(missing)} not found ({INSTALL_HINT})")
    absent = [str(path) for path in files if not path.is_file()]
    if absent:
        raise UserError(f"check-device: no such file: {', '.join(absent)}")
    # NOTES: torch, its hipify and Triton imported here, before the pool's threads: two threads importing torch for
    # the first time at once (a version's import beside hipify's) left `torch.utils` half initialised ("cannot
    # import name 'set_module'") and the process then crashed (13 files, 2 cores).
    import torch.utils.hipify.hipify_python  # noqa: F401
    import triton  # noqa: F401

    failures = []
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        checks = [pool.submit(_checked, path, shutil.which("nvcc"), shutil.which("hipcc"), every_shape_on)
                  for path in files]
        if not options.device_only:
            checks.append(pool.submit(check_host, [path for path in files if path.suffix == ".py"]))
        for done in checks:
            lines, found = done.result()
            with _HIPIFY:
                print("\n".join(lines), flush=True)
            failures += found
    if failures:
        print("\ndevice-code check failed:\n" + "\n".join(failures), file=sys.stderr)
        return cli.verdict(False)
    print(f"device-code check passed ({len(files)} file(s))")
    return 0


if __name__ == "__main__":
    sys.exit(cli.run_cli(main, sys.argv[1:]))
