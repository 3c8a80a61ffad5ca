# Two commands do everything: `make leaderboard` (the main job) and `make test`. Both set themselves up.
# Where python3 already has torch, pandas, tabulate, yaml and pytest (the GPU machines), it is used as is;
# otherwise a .venv is made with the CPU build of torch (CI and fresh machines).
SHELL := /bin/bash
HAVE_DEPS := $(shell python3 -c 'import torch, pandas, tabulate, yaml, pytest' >/dev/null 2>&1 && echo yes)
PYTHON := $(if $(HAVE_DEPS),python3,.venv/bin/python)
CPU_DEPS := torch==2.13.0 numpy pandas tabulate pyyaml pytest matplotlib

.PHONY: setup test check-device leaderboard clean

setup:
ifeq ($(HAVE_DEPS),)
	@test -x .venv/bin/python || python3 -m venv .venv
	@.venv/bin/python -c 'import torch, pandas, tabulate, yaml, pytest' 2>/dev/null || \
		.venv/bin/python -m pip install --quiet --disable-pip-version-check $(CPU_DEPS)
endif

# Compile-only check of every version's device code: nvcc sm_90, and hipify + hipcc gfx940/gfx90a.
check-device: setup
	$(PYTHON) tools/check_device.py

test: setup check-device
	$(PYTHON) -m pytest -q tests

leaderboard: setup
	$(PYTHON) run_leaderboard.py $(ARGS)

clean:
	rm -rf .venv .pytest_cache
