# Two commands do everything: `make leaderboard` (the main job) and `make test`. Both set themselves up.
# Every command runs through `python -m a2a.cli NAME` (a2a/cli.py, COMMANDS: the one list, tools/gpu_session.sh's too).
# Where python3 already has torch, pandas, tabulate, yaml, scipy, matplotlib, pytest and pytest-xdist (the GPU
# machines), it is used as is; otherwise a .venv is made with the CPU build of torch (CI and fresh machines).
SHELL := /bin/bash
# No shell of this file's reads BASH_ENV, which would run before the gate below (red team 52: a rank's script in an
# A2A_RANK_WRITABLE folder, named by the operator's BASH_ENV, was sourced as root): bash in POSIX mode reads none, and
# nothing this file starts gets it (a pyenv shim for python3 is a bash script too).
.SHELLFLAGS := --posix -c
unexport BASH_ENV
# Every Python this file starts, starts behind the writable folders' name check (rank_writable.py), run by an
# interpreter that reads no PYTHON* variable and no user site: started directly, root's interpreter ran a rank's
# sitecustomize.py from a PYTHONPATH into an A2A_RANK_WRITABLE folder before any check (red team 50). The check
# passes (always, without such a folder), and the command runs as given, in the gate's place. -B: the gate, which
# reads no PYTHONDONTWRITEBYTECODE, writes no bytecode of its own (red team 52).
GATE := -E -s -B rank_writable.py
HAVE_DEPS := $(shell env -u BASH_ENV python3 $(GATE) python3 -c 'import torch, triton, pandas, tabulate, yaml, scipy, matplotlib, pytest, xdist' >/dev/null 2>&1 && echo yes)
PYTHON := $(if $(HAVE_DEPS),python3,.venv/bin/python)
JUDGE := $(PYTHON) $(GATE) $(PYTHON)
# Triton's wheel carries its own compilers for NVIDIA and AMD (make check-device compiles v7 on with them, no GPU);
# 3.6.0 is what the H200 machines run. The ziglang wheel carries clang 20, the first with gfx950 (MI355X), for the
# C++ versions' gfx950 code objects (Debian bookworm stops at clang-19).
# pytest below 9.2: pytest-xdist 3.8 keeps an xdist_group together by rewriting node ids, which pytest 9.2 no longer
# reads, and splits every group (pytest-dev/pytest-xdist#1386; tests/test_suite.py fails where that happens).
CPU_DEPS := torch==2.13.0 triton==3.6.0 ziglang==0.15.1 numpy pandas tabulate pyyaml "pytest<9.2" pytest-xdist matplotlib scipy
# The newest version by default (and, for diff, the one before it).
# Only names a shell reads as one word (red team 52: a file `v99_x;id;.py` ran `id` as root under make trace).
VERSIONS := $(basename $(notdir $(shell ls submissions/all2all/v*.py | grep -E '^submissions/all2all/v[0-9]+_[A-Za-z0-9_]+\.py$$' | sort -V)))
V ?= $(lastword $(VERSIONS))
A ?= $(word $(words $(wordlist 2,$(words $(VERSIONS)),$(VERSIONS))),$(VERSIONS))
B ?= $(lastword $(VERSIONS))
CASE ?= benchmarks:0

.PHONY: setup test test-full test-gpu test-gpu-full check-device leaderboard stability sol trace diff sweep nccl clean

# The .venv's packages are looked up, not imported: importing them all took 3 s before every make test.
# pip compiles every file it installs, one at a time (81 s of install on 2 cores, 33 s without); only what the ranks
# import is compiled here, on every core (torch, numpy, triton: 11 s), since a rank cannot write its bytecode cache;
# the rest is cached by the first process that imports it. A file that does not compile on this Python (torch keeps
# one for 3.12) is left to fail where it is imported, as pip leaves it.
setup:
	@python3 $(GATE) true
ifeq ($(HAVE_DEPS),)
	@test -x .venv/bin/python || python3 -m venv .venv
	@.venv/bin/python -c 'import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in sys.argv[1:]))' \
		torch triton ziglang pandas tabulate yaml scipy matplotlib pytest xdist || \
		{ .venv/bin/python -m pip install --quiet --no-compile --disable-pip-version-check $(CPU_DEPS) && \
		  { .venv/bin/python -m compileall -q -j 0 $$(.venv/bin/python -c 'import sysconfig as s; p = s.get_paths()["purelib"]; \
		    print(*(f"{p}/{m}" for m in ("torch", "numpy", "triton")))') > /dev/null || true; }; }
endif

# Compile-only check of every version's device code (and the probes'): nvcc sm_90, and after hipify whole gfx942
# (MI300X, clang-19) and gfx950 (MI355X, clang 20) code objects and gfx90a with hipcc; Triton versions for sm_90,
# gfx942 and gfx950; prints each file's gfx942 and gfx950 memory-model sequences.
check-device: setup
	$(JUDGE) -m a2a.cli check-device

# The suite holds the whole device-code check too (tests/test_check_device.py runs make check-device's tool).
# TEST_WORKERS=N runs its tests in N processes side by side (pytest-xdist; a module marked xdist_group runs in one of
# them: the GPU tests, one process holding the GPUs, and the device-code tests, which share one run of the check; a
# test marked `alone` runs while no other does but the device-code tests, and goes first, beside their low-priority
# compiles: tests/conftest.py). The default, auto, is three workers on a machine of two cores or more
# without a GPU and none elsewhere (tests/conftest.py, pytest_xdist_auto_num_workers, which says what it was measured
# to gain). TEST_WORKERS=0 runs it in one.
# make test leaves out the tests marked `full` (tests/conftest.py, every_time): each attack on the judge and each
# claim runs on every change on one face and mode, and on every other in `make test-full`.
TEST_WORKERS ?= auto
# The suite starts a few thousand Python processes, each importing the harness's own modules: where the environment
# turns bytecode caching off (PYTHONDONTWRITEBYTECODE), every one compiled them again (~0.1 s each). An empty value
# turns it back on for the suite (the caches are git-ignored; a rank cannot write them: its mounts are read-only).
BYTECODE := PYTHONDONTWRITEBYTECODE=
test: setup
	$(BYTECODE) $(JUDGE) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup -m "not full" tests

test-full: setup
	$(BYTECODE) $(JUDGE) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup tests

# The GPU tests alone (world size 8 on whatever GPUs there are; ranks share them where there are fewer than 8, with an
# NCCL for sharing obtained once, as make leaderboard does). Without a GPU every one skips, saying why. test-gpu leaves
# out the runner's timed modes for the versions between v1 and the newest (marked `full`); test-gpu-full runs them.
test-gpu: setup
	$(JUDGE) -m pytest -q -m "not full" tests/test_gpu.py $(ARGS)

test-gpu-full: setup
	$(JUDGE) -m pytest -q tests/test_gpu.py $(ARGS)

# Every version x benchmark shape on what this machine has (GPUs: with anchors and this machine's speed of light).
leaderboard: setup
	$(JUDGE) -m a2a.cli leaderboard $(ARGS)

# This machine's speed-of-light figures (GPUs only), saved under results/.
sol: setup
	$(JUDGE) -m a2a.cli sol $(ARGS)

# Kernel timeline of version V on CASE (GPUs only): traces/<date>_<device>_ws<N>_<version>_<case>_<commit>/.
trace: setup
	$(JUDGE) -m a2a.cli eval trace $(V) --cases $(CASE) $(ARGS)

# What B changed against A: code, time, verdict per shape.
diff: setup
	$(JUDGE) -m a2a.cli diff $(A) $(B) $(ARGS)

# Launch-shape sweep of version V (GPUs only).
sweep: setup
	$(JUDGE) -m a2a.cli sweep $(V) $(ARGS)

# NCCL 2.30+ (several ranks on one GPU) built for this machine's GPU into build/nccl/, for world size 8 on fewer GPUs
# when torch's own NCCL is older: NCCL_SRC=checkout-or-archive for a machine without network (docs/sharing.md).
nccl:
	python3 $(GATE) tools/build_nccl.sh

clean:
	rm -rf .venv .pytest_cache

# How well the clock agrees with itself: RUNS back-to-back leaderboard timings plus one with the entries reversed.
RUNS ?= 3
stability: setup
	$(JUDGE) -m a2a.cli leaderboard --stability $(RUNS) $(ARGS)
