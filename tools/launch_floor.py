#!/usr/bin/env python3
"""The launch floor: one trivial kernel on the rank's stream, launched each way a version could launch it, timed on
the device and on the host, in a warm loop and inside the harness's timed step (issue #39).

Launch paths, one row each (every path but the torch op, the pybind11 entry and the handshake launches the same
compiled Triton kernel, which does nothing):
- nothing: the two events alone (what any device-side figure has under it);
- a torch op (`neg_` of one element); Triton's launcher (`kernel[grid](...)`);
- the driver's launch (cuLaunchKernel, hipModuleLaunchKernel on ROCm) through ctypes on a prebuilt kernelParams
  array, alone and with the device bound and torch's current stream asked per call (v8's launch);
- a CUDA graph of the kernel: torch's `CUDAGraph.replay()`, and its executable graph launched through ctypes
  (cuGraphLaunch; where torch exposes the handle);
- a pybind11 entry (a2a/probes.py's extension, load_inline: `empty_kernels(1)`, a `<<<1, 32>>>` empty kernel);
- a METH_FASTCALL function of a tiny extension that includes only Python.h (the driver's launch reached through a
  function pointer from ctypes), alone and with the device bound and torch's stream asked per call (v9's launch);
- the handshake (a2a/probes.py: one block that raises a flag at every peer and waits for theirs; pybind11).
Each path is called as the harness calls custom_kernel: the METH_FASTCALL entries directly (no Python frame, as
v9's custom_kernel), the others from one Python function (a version's entry frame).

Figures per path, µs, p50 / p90, the slowest rank:
- enqueue: the host time of the call alone;
- call: CUDA events around the call on an idle stream, as every device-side figure here is taken: the GPU waits for
  the host, so this is the host path plus the GPU's work;
- held: the same events with the stream held by a spin kernel (torch.cuda._sleep) queued before the start event, so
  they see only the GPU's work (nvbench's blocking kernel). A sample whose start event had already passed when the
  call returned (the spin ended first) is counted and reported.
In the warm loop the calls come back to back (enqueue: consecutive calls; call and held: one call at a time). In the
timed step the call figure comes from a2a.bench.measure (device_clock), the enqueue and held figures from this tool's copy
of a2a.bench.timed_step (L2 cleared, synchronize, barrier, input cloned, the spin, events around the call).

    python -m tools.launch_floor [--world-size 1,2] [--cases benchmarks:0] [--iterations 200] [--steps 50]
"""
from __future__ import annotations

import argparse
import ctypes
import functools
import json
import sys
import time
from inspect import signature
from pathlib import Path


import eval as core
from a2a import bench
from a2a import cli
from a2a import plan as planning

PATHS = {  # key -> the row's name, in table order
    "nothing": "nothing (the event pair alone)",
    "torch": "torch op (`neg_` of one element)",
    "triton": "Triton's launcher (`kernel[grid](...)`)",
    "driver": "driver launch via ctypes, prebuilt params",
    "driver_bound": "driver launch via ctypes + device bound, stream asked (v8's launch)",
    "graph": "CUDA graph replay (`CUDAGraph.replay()`)",
    "graph_launch": "CUDA graph launch via ctypes (cuGraphLaunch)",
    "pybind": "pybind11 entry (a2a.probes, `<<<1, 32>>>`)",
    "fastcall": "METH_FASTCALL entry, Python.h only",
    "fastcall_bound": "METH_FASTCALL entry + device bound, stream asked (v9's launch)",
    "handshake": "handshake (a2a.probes, pybind11, one block)",
}
FIGURES = ("enqueue", "call", "held")  # per context: host µs of the call; events on an idle stream; on a held one
CONTEXTS = ("warm", "step")
HOLD_US = 300  # the spin before the start event: well above any path's host work seen in a timed step (~30 µs)
SPARE_PARAMS = 4  # the driver reads as many kernelParams entries as the kernel declares (Triton 3.6 appends two)

FASTCALL = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define A2A_JOIN_(a, b) a##b
#define A2A_JOIN(a, b) A2A_JOIN_(a, b)
#define A2A_TEXT_(a) #a
#define A2A_TEXT(a) A2A_TEXT_(a)

// cuLaunchKernel and hipModuleLaunchKernel: (function, grid xyz, block xyz, shared, stream, params, extra)
typedef int (*LaunchFn)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*, void**,
                        void**);

static LaunchFn launch_fn;
static void *function, *stream, **params;
static unsigned threads, shared;
static PyObject *device, *exchange_device, *restore_device, *raw_stream;

// setup(launch, function, params, threads, shared, stream, device, exchange_device, restore_device, raw_stream)
static PyObject* setup(PyObject*, PyObject* args) {
  unsigned long long launch_address, function_address, params_address, stream_address;
  PyObject *next_device, *next_exchange, *next_restore, *next_stream;
  if (!PyArg_ParseTuple(args, "KKKIIKOOOO", &launch_address, &function_address, &params_address, &threads, &shared,
                        &stream_address, &next_device, &next_exchange, &next_restore, &next_stream))
    return NULL;
  launch_fn = (LaunchFn)(uintptr_t)launch_address;
  function = (void*)(uintptr_t)function_address;
  params = (void**)(uintptr_t)params_address;
  stream = (void*)(uintptr_t)stream_address;
  PyObject** held[4] = {&device, &exchange_device, &restore_device, &raw_stream};
  PyObject* next[4] = {next_device, next_exchange, next_restore, next_stream};
  for (int i = 0; i < 4; ++i) {
    Py_INCREF(next[i]);
    Py_XSETREF(*held[i], next[i]);
  }
  Py_RETURN_NONE;
}

static PyObject* checked(int err) {
  if (err) return PyErr_Format(PyExc_RuntimeError, "launch failed: error %d", err);
  Py_RETURN_NONE;
}

// The floor of a native entry: everything preset, the launch alone. Like custom_kernel it is called with the
// step's data, which it ignores.
static PyObject* launch(PyObject*, PyObject* const*, Py_ssize_t) {
  return checked(launch_fn(function, 1, 1, 1, threads, 1, 1, shared, stream, params, NULL));
}

// What v9's entry does around its launch: bind the device, ask torch for its current stream, launch, restore.
static PyObject* launch_bound(PyObject*, PyObject* const*, Py_ssize_t) {
  PyObject* previous = PyObject_CallOneArg(exchange_device, device);
  if (!previous) return NULL;
  int err = 0;
  PyObject* current = PyObject_CallOneArg(raw_stream, device);
  if (current) {
    void* raw = PyLong_AsVoidPtr(current);
    Py_DECREF(current);
    if (!PyErr_Occurred()) err = launch_fn(function, 1, 1, 1, threads, 1, 1, shared, raw, params, NULL);
  }
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);  // the device is restored whatever happened
  PyObject* restored = PyObject_CallOneArg(restore_device, previous);
  Py_DECREF(previous);
  if (type) {
    Py_XDECREF(restored);
    PyErr_Restore(type, value, traceback);
    return NULL;
  }
  if (!restored) return NULL;
  Py_DECREF(restored);
  return checked(err);
}

static PyMethodDef methods[] = {
    {"setup", setup, METH_VARARGS, "what every launch uses"},
    {"launch", (PyCFunction)(void (*)(void))launch, METH_FASTCALL, "the launch alone"},
    {"launch_bound", (PyCFunction)(void (*)(void))launch_bound, METH_FASTCALL, "device bound, stream asked"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, A2A_TEXT(TORCH_EXTENSION_NAME), NULL, -1, methods};

PyMODINIT_FUNC A2A_JOIN(PyInit_, TORCH_EXTENSION_NAME)(void) { return PyModule_Create(&module); }
"""


@functools.lru_cache(maxsize=None)
def fastcall_extension():
    """The METH_FASTCALL extension, built once per machine (load_inline's cache): C++ with Python.h only."""
    from torch.utils.cpp_extension import load_inline

    only_named = {"no_implicit_headers": True} if "no_implicit_headers" in signature(load_inline).parameters else {}
    return load_inline(name="a2a_launch_floor_fastcall", cpp_sources=[FASTCALL], extra_cflags=["-O3"],
                       verbose=False, **only_named)


@functools.lru_cache(maxsize=None)
def floor_kernel():
    """A Triton kernel that does nothing (built here so that importing this tool needs no Triton)."""
    import triton

    @triton.jit
    def floor_kernel(ptr):
        pass

    return floor_kernel


def _launch_paths(rank: int, world_size: int, device) -> tuple:
    """{key: callable(data)} for every path this machine offers, what they point into without holding it (the
    kernelParams array holds its slots' addresses), and the handshake whose heap the "handshake" path uses (a
    collective to close). Each path is called as the harness calls custom_kernel: the
    native entries directly, the others from one Python function (a version's entry frame)."""
    import torch

    from a2a import probes

    hip = torch.version.hip is not None
    buffer = torch.zeros(1, dtype=torch.float32, device=device)
    kernel = floor_kernel()
    compiled = kernel.warmup(buffer, grid=(1,))
    compiled._init_handles()
    properties = torch.cuda.get_device_properties(device)
    threads = compiled.metadata.num_warps * getattr(properties, "warp_size", 64 if hip else 32)
    shared = compiled.metadata.shared
    driver = ctypes.CDLL("libamdhip64.so" if hip else "libcuda.so.1")  # torch has loaded it
    launch = driver.hipModuleLaunchKernel if hip else driver.cuLaunchKernel
    launch.restype = ctypes.c_int
    slots = [ctypes.c_uint64(buffer.data_ptr())] + [ctypes.c_uint64(0) for _ in range(SPARE_PARAMS)]
    params = (ctypes.c_void_p * len(slots))(*[ctypes.addressof(slot) for slot in slots])
    head = (ctypes.c_void_p(compiled.function), ctypes.c_uint(1), ctypes.c_uint(1), ctypes.c_uint(1),
            ctypes.c_uint(threads), ctypes.c_uint(1), ctypes.c_uint(1), ctypes.c_uint(shared))
    stream = torch.cuda.current_stream(device).cuda_stream
    c_stream = ctypes.c_void_p(stream)
    exchange, restore = torch.cuda._exchange_device, torch.cuda._maybe_exchange_device
    raw_stream, index = torch._C._cuda_getCurrentRawStream, device.index

    def checked(err: int) -> None:
        if err:
            raise RuntimeError(f"launch failed: error {err}")

    def driver_launch(_data):
        checked(launch(*head, c_stream, params, None))

    bound_stream = [None, None]  # v8's cache: the raw stream and its ctypes value

    def driver_bound(_data):
        previous = exchange(index)
        try:
            current = raw_stream(index)
            if current != bound_stream[0]:
                bound_stream[:] = current, ctypes.c_void_p(current)
            err = launch(*head, bound_stream[1], params, None)
        finally:
            restore(previous)
        checked(err)

    graph = torch.cuda.CUDAGraph()
    kernel[(1,)](buffer)  # the launcher's own first call, outside the capture
    torch.cuda.synchronize(device)
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        kernel[(1,)](buffer)
    paths = {"nothing": lambda _data: None, "torch": lambda _data: buffer.neg_(),
             "triton": lambda _data: kernel[(1,)](buffer), "driver": driver_launch, "driver_bound": driver_bound,
             "graph": lambda _data: graph.replay()}
    if hasattr(graph, "raw_cuda_graph_exec"):
        graph_launch = driver.hipGraphLaunch if hip else driver.cuGraphLaunch
        graph_launch.restype = ctypes.c_int
        executable = ctypes.c_void_p(int(graph.raw_cuda_graph_exec()))
        paths["graph_launch"] = lambda _data: checked(graph_launch(executable, c_stream))
    empty_kernels = probes.extension().empty_kernels
    paths["pybind"] = lambda _data: empty_kernels(1)
    fastcall = fastcall_extension()
    fastcall.setup(ctypes.cast(launch, ctypes.c_void_p).value, compiled.function, ctypes.addressof(params), threads,
                   shared, stream, index, exchange, restore, raw_stream)
    paths["fastcall"], paths["fastcall_bound"] = fastcall.launch, fastcall.launch_bound  # no Python frame
    handshake = probes.Handshake(rank, world_size)
    paths["handshake"] = handshake.returning(torch.empty(1, 8, dtype=torch.float16, device=device))
    return paths, slots, handshake


def _cycles_per_us() -> float:
    """The spin kernel's clock on the current device, read from two timed spins (the first pays its own
    start-up)."""
    import torch

    cycles, rate = 1_000_000, 0.0
    for _ in range(2):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        rate = cycles / (start.elapsed_time(end) * 1e3)
    return rate


def _warm(call, data, device, iterations: int, hold_cycles: int, events) -> dict:
    """One path's warm figures: per-call µs samples of each figure, and how many held samples were not held."""
    import torch

    stream = torch.cuda.current_stream(device)
    samples = {figure: [] for figure in FIGURES}
    torch.cuda.synchronize(device)
    for _ in range(iterations):
        start = time.perf_counter_ns()
        call(data)
        samples["enqueue"].append((time.perf_counter_ns() - start) / 1e3)
    torch.cuda.synchronize(device)
    for _ in range(iterations):
        events[0].record(stream)
        call(data)
        events[1].record(stream)
        events[1].synchronize()
        samples["call"].append(events[0].elapsed_time(events[1]) * 1e3)
    unheld = 0
    for _ in range(iterations):
        torch.cuda._sleep(hold_cycles)
        events[0].record(stream)
        call(data)
        events[1].record(stream)
        unheld += events[0].query()  # the spin ended before the call had queued its work
        events[1].synchronize()
        samples["held"].append(events[0].elapsed_time(events[1]) * 1e3)
    return {"samples": samples, "unheld": unheld}


def _held_steps(paths: dict, data, rank: int, schedule: list, device, hold_cycles: int, events) -> dict:
    """a2a.bench.timed_step's order with the spin before the start event: per path, enqueue and held µs per step (this
    rank's), and how many steps were not held."""
    import torch
    import torch.distributed as dist
    from utils import clear_l2_cache

    stream = torch.cuda.current_stream(device)
    taken = {key: {"enqueue": [], "held": [], "unheld": 0} for key in paths}
    for key in schedule:
        clear_l2_cache()
        torch.cuda.synchronize(device)
        dist.barrier()
        cloned = core.clone_data(data, rank)
        torch.cuda._sleep(hold_cycles)
        events[0].record(stream)
        start = time.perf_counter_ns()
        output = paths[key](cloned)
        taken[key]["enqueue"].append((time.perf_counter_ns() - start) / 1e3)
        events[1].record(stream)
        taken[key]["unheld"] += events[0].query()
        torch.cuda.synchronize(device)
        dist.barrier()
        taken[key]["held"].append(events[0].elapsed_time(events[1]) * 1e3)
        del output
    return taken


def _floor_rank(rank: int, world_size: int, case: dict, iterations: int, steps: int):
    import torch
    import torch.distributed as dist

    from reference import generate_input

    data = generate_input(**case, rank=rank)
    device = core.rank_device(rank)
    with core.own_device(rank):  # this tool's own launches: on the rank's device, none of them a submission's
        paths, _slots, handshake = _launch_paths(rank, world_size, device)  # the slots live while the paths run
        events = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        hold_cycles = int(HOLD_US * _cycles_per_us())
        warm = {}
        for key, call in paths.items():
            dist.barrier()  # the handshake's calls pair up across ranks
            warm[key] = _warm(call, data, device, iterations, hold_cycles, events)
        schedule = [key for _ in range(steps) for key in paths]
        measured = bench.measure(paths, data, rank, schedule, device_clock=True)
        held = _held_steps(paths, data, rank, schedule, device, hold_cycles, events)
        handshake.close()  # its heap; raises if a call gave up waiting for a peer
    mine = {"warm": warm, "held": held}
    gathered = [None] * world_size
    with core.own_device(rank):
        dist.all_gather_object(gathered, mine)
    if rank:
        return None
    return {key: {"warm": _warm_figures([g["warm"][key] for g in gathered]),
                  "step": _step_figures(measured[key].device_ns, [g["held"][key] for g in gathered])}
            for key in paths}


def _quantiles(samples: list) -> tuple:
    stats = core.calculate_extra_stats(samples)
    return stats.p50, stats.p90


def _warm_figures(per_rank: list) -> dict:
    """Each figure's p50 and p90, the slowest rank's (warm samples of different ranks are not paired)."""
    figures = {figure: tuple(max(q) for q in zip(*(_quantiles(r["samples"][figure]) for r in per_rank)))
               for figure in FIGURES}
    return {**figures, "unheld": max(r["unheld"] for r in per_rank)}


def _step_figures(call_us_slowest: list, per_rank: list) -> dict:
    """Timed-step figures: per step the slowest rank (the step is a collective), then p50 and p90. The call figure
    comes from a2a.bench.measure in ns, already the slowest rank's."""
    slowest = {figure: [max(values) for values in zip(*(r[figure] for r in per_rank))] for figure in ("enqueue",
                                                                                                        "held")}
    return {"enqueue": _quantiles(slowest["enqueue"]), "call": _quantiles([ns / 1e3 for ns in call_us_slowest]),
            "held": _quantiles(slowest["held"]), "unheld": max(r["unheld"] for r in per_rank)}


def table(rows: list) -> str:
    """Markdown: one row per (world size, launch path), each figure as `p50 / p90` µs; paths this machine lacks
    are left out."""
    header = ["world size", "launch path"] + [f"{figure} µs, {'warm loop' if context == 'warm' else 'timed step'}"
                                              for context in CONTEXTS for figure in FIGURES]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [str(row["world_size"]), PATHS[row["path"]]]
        cells += [f"{row[context][figure][0]:.1f} / {row[context][figure][1]:.1f}" for context in CONTEXTS
                  for figure in FIGURES]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def handshake_beyond_its_path(rows: list) -> list:
    """One line per world size: what the handshake's figures add to its launch path's (the pybind11 entry's)."""
    lines = []
    for world_size in sorted({row["world_size"] for row in rows}):
        of = {row["path"]: row for row in rows if row["world_size"] == world_size}
        if {"handshake", "pybind"} <= set(of):
            parts = [f"{figure} {of['handshake'][context][figure][0] - of['pybind'][context][figure][0]:+.1f}"
                     for context in CONTEXTS for figure in ("call", "held")]
            lines.append(f"world size {world_size}: the handshake minus the pybind11 entry's empty kernel (p50 µs): "
                         f"warm loop {parts[0]} / {parts[1]}, timed step {parts[2]} / {parts[3]}")
    return lines


def unheld_lines(rows: list) -> list:
    return [f"world size {row['world_size']}, {PATHS[row['path']]}: {row[context]['unheld']} {context} sample(s) "
            f"whose {HOLD_US} µs spin ended before the call had queued its work (their held figure includes host "
            "time)"
            for row in rows for context in CONTEXTS if row[context]["unheld"]]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cli.add_options(parser, "world-size", "cases", "out",
                    world_size={"type": str, "default": "1,2", "help": "comma-separated world sizes"},
                    cases={"default": "benchmarks:0", "help": "the case whose input each timed step clones"})
    parser.add_argument("--iterations", type=int, default=200, help="calls per figure and path in the warm loop")
    parser.add_argument("--steps", type=int, default=50, help="timed steps per path, paths taking turns")
    args = parser.parse_args(argv)
    cli.writable(args.out)
    try:
        sizes = [int(size) for size in args.world_size.split(",")]
    except ValueError:
        raise core.UserError(f"--world-size {args.world_size}: expected comma-separated integers") from None
    if min(sizes) < 1 or args.iterations < 2 or args.steps < 2:
        raise core.UserError("--world-size must be at least 1, --iterations and --steps at least 2")
    if not planning.machine_gpus():
        print("skipped: the launch floor needs a GPU (this machine has none)")
        return 0
    from a2a.launch import parallel_launch

    # The extensions are built by the ranks (load_inline lets one build while the others wait), not here: ranks may
    # run under another uid (eval's sandbox), and a build folder this process made would refuse them its lock file.
    rows, metas = [], []
    for world_size in sizes:
        try:
            plan = planning.make_plan([], args.cases, world_size, "nccl", machine_only=True)
        except core.UserError as why:  # more ranks than GPUs where they cannot share one
            print(f"skipped world size {world_size}: {why}")
            continue
        found = parallel_launch(world_size, _floor_rank, plan.case_args[0], args.iterations, args.steps,
                                backend="nccl", timeout_s=900)[0]
        rows += [{"world_size": world_size, "path": key, **figures} for key, figures in found.items()]
        metas.append({**plan.meta_for("launch-floor"), "case": plan.cases[0].spec})
    if not rows:
        return 0
    meta = {**metas[0], "ranks": "+".join(m["ranks"] for m in metas), "world_sizes": [m["world_size"] for m in metas],
            "placements": [m["placement"] for m in metas], "cases": [m["case"] for m in metas],
            "iterations": args.iterations, "steps": args.steps, "hold_us": HOLD_US}
    text = "\n".join([
        "# The launch floor", "",
        f"{meta['device']}, {'; '.join(meta['placements'])}, {meta['date']}, commit {meta['commit']}; a trivial "
        f"kernel on the rank's stream; µs, p50 / p90, the slowest rank. enqueue: host time of the call; call: CUDA "
        f"events around the call on an idle stream; held: the same with the stream held by a {HOLD_US} µs spin, so "
        f"the events see only GPU work. Warm loop: {args.iterations} calls per figure; timed step: {args.steps} "
        f"steps per path in a2a.bench.timed_step's order, paths taking turns, each cloning the input of "
        f"{' and '.join(meta['cases'])}.",
        "", table(rows), "", *handshake_beyond_its_path(rows), *unheld_lines(rows)])
    print(text)

    def write(folder: Path) -> None:
        (folder / "launch_floor.md").write_text(text + "\n")
        (folder / "launch_floor.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")

    cli.save_run(args.out, meta, write)
    return 0


if __name__ == "__main__":
    sys.exit(cli.run_cli(main))
