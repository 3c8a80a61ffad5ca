"""What a version and the toolkit must agree on, written once, here: the version protocol (every name the toolkit
reads from a version module), the trace phases (their names, in the order of the device enum) and the give-up record
(which bits say what a spin-wait gave up on).

From v5 on, a version keeps its phases as a Python tuple (TRACE_PHASES) and pastes `device_source(TRACE_PHASES)`
into its KERNELS, so the C++ enum and the tuple cannot drift apart; a test holds every such version to it. A
version's Python side reads a give-up word with a pasted copy of `describe_give_up`'s rule. v2-v4 are frozen with
their own hand-written copies (same layout).
"""
from __future__ import annotations

import re

# The version protocol: every name the toolkit reads from a version module, as (name, which versions have it, what
# reads it, what it is). docs/versions.md's table "The version protocol" is this one; tests/test_contract.py holds the
# toolkit's source (no name read that is not here, none here that nothing reads) and every version to it.
VERSION_PROTOCOL = (
    ("custom_kernel", "every version", "eval.py, every tool",
     "custom_kernel(data) -> the [tokens, hidden] float16 output; the runner's contract"),
    ("KERNELS", "C++ line (v2-v6)", "tools/check_device.py, diff.py",
     "device source without torch headers (portable prelude, kernels, plain-runtime helpers)"),
    ("BINDING", "C++ line", "diff.py", "the thin torch layer built with KERNELS"),
    ('name="a2a_..."', "C++ line", "tools/gpu_session.sh (cold)", "load_inline's extension name, found as text"),
    ("TRITON_KERNELS", "Triton line (v7 on)", "tools/check_device.py", "{kernel name: runtime argument types}"),
    ("constants", "Triton line", "tools/check_device.py, tests/test_contract.py, tools/interpret_ranks.py",
     "constants(**shape, world_size, trace, hip) -> the constexprs, in the kernel's parameter order"),
    ("HIP", "Triton line", "tools/triton_launch.py", "True on ROCm"),
    ("all2all_kernel", "Triton line", "tools/triton_launch.py, tools/interpret_ranks.py",
     "the @triton.jit kernel the launch-path probe drives and the interpreter runs"),
    ("heap_layout", "Triton line", "tools/interpret_ranks.py",
     "heap_layout(world, slots, hidden, topk) -> the symmetric heap's byte offsets and its 'total'"),
    ("_now_ns", "Triton line", "tools/interpret_ranks.py", "the device clock (inline assembly): stood in for there"),
    ("_backoff", "Triton line", "tools/interpret_ranks.py", "a spin's back-off (inline assembly): stood in for there"),
    ("TRACE", "v2 on", "a2a/timeline.py", "True in the trace build (A2A_TRACE=1 at import), False in the timed build "
     "the tracer runs beside it"),
    ("TRACE_PHASES", "v2 on", "a2a/timeline.py, tests", "phase names in the device enum's order"),
    ("trace_take", "v2 on", "a2a/timeline.py, tests",
     "trace_take() -> the trace build's records since the last take"),
    ("GIVE_UP_FIELDS", "v5 on", "tests/test_contract.py", "must equal GIVE_UP_FIELDS here"),
    ("LAUNCH_SHAPE", "v3 on", "tools/sweep_launch.py, tools/check_device.py, tools/triton_launch.py",
     "(blocks per multiprocessor, threads per block), or a dict of them per kernel"),
    ("configure", "v4 on", "tools/sweep_launch.py",
     "configure() re-reads LAUNCH_SHAPE (and USE_GRAPH) for later calls"),
    ("MAX_THREADS", "v5 on (optional)", "tools/sweep_launch.py", "the most threads per block a launch may ask for"),
    ("USE_GRAPH", "v4 (optional)", "tools/sweep_launch.py", "whether calls replay a captured graph"),
    ("param_count", "v8 on", "tests/test_check_device.py",
     "param_count(compiled kernel) -> the parameters its driver launch passes (runtime arguments, then Triton's)"),
    ("inspect", "v8 on", "tests (tests/test_gpu.py, through one adapter)",
     "inspect() -> what the last call dispatched to this rank: {'counts', 'meta', 'rows'} (see dispatch_view)"),
    ("_state", "v2-v7 (frozen)", "tests (the same adapter), tools/triton_launch.py", "the per-process state object"),
    ("_ext", "v2-v6 (frozen)", "tests (the same adapter)", "the built extension (scratch_regions)"),
    ("_close_state", "v2 on", "tests/test_gpu.py (its groups that run every version)",
     "_close_state() frees this process's heap and state (what the version's destroy_process_group wrapper does)"),
    ("IDEAS", "idea scratch copies", "tools/compare_ideas.py", "{idea: bit}"),
    ("REQUIRES", "idea scratch copies", "tools/compare_ideas.py", "{idea: ideas it needs on with it}"),
    ("configure_ideas", "idea scratch copies", "tools/compare_ideas.py", "configure_ideas(names): switch ideas on"),
    ("HOST_PROBES", "idea scratch copies (optional)", "tools/compare_ideas.py", "{label: mode} host-path cut points"),
    ("host_probe", "idea scratch copies (optional)", "tools/compare_ideas.py",
     "host_probe(data, mode): the host path cut short at `mode`"),
)
# Names every version of a line must define (tests/test_contract.py): by the line's marker name.
REQUIRED_BY_LINE = {"KERNELS": ("BINDING",), "TRITON_KERNELS": ("constants", "HIP", "LAUNCH_SHAPE"),
                    "TRACE_PHASES": ("trace_take",)}
FIRST_WITH_INSPECT = 8  # versions from v8 on expose inspect(); frozen ones are read through dispatch_view's branches


def dispatch_view(module, version: int, world_size: int) -> tuple:
    """What the last call dispatched to this rank's experts, from any P2P version: (rows per local expert, meta
    [local experts * capacity, 4] of (src, slot, token, k), rows [local experts, capacity, hidden]). From v8 on the
    version says it (`inspect()`); v2-v7 are frozen, so their private state is read here and nowhere else."""
    if version >= FIRST_WITH_INSPECT:
        seen = module.inspect()
        return seen["counts"], seen["meta"].reshape(-1, 4).cpu(), seen["rows"]
    state = module._state
    if version >= 6:  # v6, v7: the layout lists receive-buffer rows per expert
        counts, meta, rows = state.dispatched()
        return counts, meta.reshape(-1, 4).cpu(), rows
    n_local, cap = state.num_local_experts, state.capacity
    if version == 5:  # counters alternate by call parity
        counts = state.expert_counts()
    else:
        # v3, v4 name their scratch regions; v2: send_counter[world] | blocks_done | recv_total | expert_count[...]
        start = (module._ext.scratch_regions(state.dims)["expert_count"] if version >= 3 else world_size + 2)
        counts = state.scratch[start:start + n_local].cpu()
    return counts, state.expert_meta.cpu(), state.expert_x.view(n_local, cap, -1)


# (field, lowest bit, width) of the 64-bit give-up word a kernel writes into mapped host memory.
GIVE_UP_FIELDS = (("kind", 60, 4), ("peer", 52, 8), ("slot_plus_one", 28, 24), ("epoch", 0, 28))
WAIT_KINDS = {1: "the row count", 2: "a dispatched row", 3: "a combined row"}


def enum_name(phase: str) -> str:
    """`all2all.send_row` -> `PH_ALL2ALL_SEND_ROW`."""
    return "PH_" + re.sub(r"[^A-Za-z0-9]+", "_", phase).upper()


def device_source(phases: tuple) -> str:
    """The C++ a version pastes into its KERNELS: the phase enum in `phases` order and the give-up packer."""
    names = ", ".join(enum_name(phase) for phase in phases)
    fields = " | ".join(f"((uint64_t)({name} & 0x{(1 << width) - 1:x}ull) << {low})"
                        for name, low, width in GIVE_UP_FIELDS)
    return ("// Generated by a2a/contract.py from TRACE_PHASES and GIVE_UP_FIELDS; do not edit by hand.\n"
            f"enum TracePhase {{ {names}, PH_COUNT }};\n"
            "#if defined(__CUDACC__) || defined(__HIPCC__)\n#define A2A_HOST_DEVICE __host__ __device__\n#else\n"
            "#define A2A_HOST_DEVICE\n#endif\n"
            "A2A_HOST_DEVICE inline uint64_t pack_give_up(uint64_t kind, uint64_t peer, uint64_t slot_plus_one, "
            f"uint64_t epoch) {{\n  return {fields};\n}}\n")


def unpack_give_up(word: int) -> dict:
    """The fields of a give-up word; `slot` is -1 where the wait was not for a slot."""
    fields = {name: (word >> low) & ((1 << width) - 1) for name, low, width in GIVE_UP_FIELDS}
    fields["slot"] = fields.pop("slot_plus_one") - 1
    return fields


def describe_give_up(word: int, rank: int, timeout_ms: int, version: str) -> str:
    fields = unpack_give_up(word)
    where = "" if fields["slot"] < 0 else f", slot {fields['slot']}"
    return (f"[a2a {version}] rank {rank}: gave up after {timeout_ms} ms waiting for "
            f"{WAIT_KINDS.get(fields['kind'], fields['kind'])} from rank {fields['peer']}{where} "
            f"(call {fields['epoch']})")
