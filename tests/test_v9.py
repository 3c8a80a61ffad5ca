"""v9's native entry on a CPU: its C source (ENTRY, read from the version file as text) built on its own and driven
with recorders where the GPU calls go (the launch through a ctypes callback, torch's device and stream calls as
Python functions), and the version itself refusing CPU inputs through custom_kernel."""
import ast
import ctypes
import sys
from inspect import signature
from types import SimpleNamespace

import pytest
import torch

from tests.conftest import ROOT

V9 = ROOT / "submissions" / "all2all" / "v9_native_entry.py"
SLOTS, HIDDEN, TOPK = 8, 16, 2
# cuLaunchKernel's and hipModuleLaunchKernel's signature: (function, grid xyz, block xyz, shared, stream, params, extra)
LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *[ctypes.c_uint] * 7, ctypes.c_void_p, ctypes.c_void_p,
                          ctypes.c_void_p)
PER_CALL = (("x", ctypes.c_uint64), ("indices", ctypes.c_uint64), ("weights", ctypes.c_uint64),
            ("tokens", ctypes.c_int32), ("epoch", ctypes.c_int32))
FUNCTION, STREAM, PREVIOUS_DEVICE = 0x1234, 0xABC0, 5


def entry_source() -> str:
    for node in ast.parse(V9.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "ENTRY" for t in node.targets):
            return node.value.value
    raise AssertionError("v9 has no ENTRY")


@pytest.fixture(scope="module")
def native(tmp_path_factory):
    from torch.utils.cpp_extension import load_inline

    only_named = {"no_implicit_headers": True} if "no_implicit_headers" in signature(load_inline).parameters else {}
    return load_inline(name="a2a_v9_entry_test", cpp_sources=[entry_source()], extra_cflags=["-O3"],
                       build_directory=str(tmp_path_factory.mktemp("entry")), verbose=False, **only_named)


class Group:
    """What v9's slow path binds, with recorders for the launch and torch's device and stream calls."""

    def __init__(self, native):
        self.slots = {name: kind() for name, kind in PER_CALL}
        self.params = (ctypes.c_void_p * len(self.slots))(*[ctypes.addressof(s) for s in self.slots.values()])
        self.launcher = LAUNCH(self._launch)
        self.code = 0
        self.launches, self.slow, self.device_calls = [], [], []
        self.out = torch.zeros(SLOTS, HIDDEN, dtype=torch.float16)
        self.views = tuple(self.out.narrow(0, 0, n) for n in range(SLOTS + 1))
        self.custom_kernel, self.bind, self.unbind = native.entry(self.slow_path)

    def _launch(self, function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        record = {"function": function, "grid": (gx, gy, gz), "block": (bx, by, bz), "shared": shared,
                  "stream": stream, "params": params, "extra": extra}
        for name, slot in self.slots.items():  # a loop, not a comprehension: no frame of its own on Python 3.11
            record[name] = slot.value
        self.launches.append(record)
        return self.code

    def exchange_device(self, index):
        self.device_calls.append(("exchange", index))
        return PREVIOUS_DEVICE

    def restore_device(self, previous):
        self.device_calls.append(("restore", previous))
        return -1

    def raw_stream(self, index):
        self.device_calls.append(("stream", index))
        return STREAM

    def slow_path(self, cfg, rank, world_size, x):
        self.slow.append((cfg, rank, world_size))
        self.bind(cfg, self, self.views, x.get_device(), self.exchange_device, self.restore_device, self.raw_stream,
                  lambda code: f"error {code}", rank, world_size, cfg.max_num_tokens, cfg.num_experts,
                  cfg.experts_per_token, cfg.hidden_dim, ctypes.cast(self.launcher, ctypes.c_void_p).value, FUNCTION,
                  3, 64, 128, ctypes.addressof(self.params), *(ctypes.addressof(s) for s in self.slots.values()))


def config(**changes):
    return SimpleNamespace(**{"num_experts": 8, "experts_per_token": TOPK, "hidden_dim": HIDDEN,
                              "max_num_tokens": SLOTS, **changes})


def data(cfg=None, tokens: int = 5, rank: int = 0, world_size: int = 2):
    rank_data = SimpleNamespace(x=torch.randn(tokens, HIDDEN).half(),
                                indices=torch.zeros(tokens, TOPK, dtype=torch.int32), weights=torch.rand(tokens, TOPK))
    return cfg or config(), rank_data, rank, world_size


def python_frames_of(call, *args) -> set:
    """The Python functions call(*args) enters (sys.setprofile sees every Python frame; C functions show as
    c_call)."""
    entered = set()

    def profile(frame, event, _arg):
        if event == "call":
            entered.add(frame.f_code.co_name)

    sys.setprofile(profile)
    try:
        call(*args)
    finally:
        sys.setprofile(None)
    return entered


def test_a_bound_call_writes_the_slots_launches_and_runs_no_other_python(native):
    group = Group(native)
    first = data()
    assert group.custom_kernel(first) is group.views[5]
    assert len(group.slow) == 1 and group.slow[0][1:] == (0, 2)
    second = data(first[0], tokens=3)
    entered = python_frames_of(group.custom_kernel, second)
    assert entered == {"exchange_device", "raw_stream", "_launch", "restore_device"}, entered
    assert len(group.slow) == 1
    launch = group.launches[-1]
    _, rank_data, _, _ = second
    assert (launch["x"], launch["indices"], launch["weights"]) == (
        rank_data.x.data_ptr(), rank_data.indices.data_ptr(), rank_data.weights.data_ptr())
    assert launch["tokens"] == 3 and [call["epoch"] for call in group.launches] == [1, 2]
    assert launch["function"] == FUNCTION and launch["grid"] == (3, 1, 1) and launch["block"] == (64, 1, 1)
    assert launch["shared"] == 128 and launch["stream"] == STREAM and launch["extra"] is None
    assert launch["params"] == ctypes.addressof(group.params)
    assert group.device_calls[-3:] == [("exchange", -1), ("stream", -1), ("restore", PREVIOUS_DEVICE)]


def test_a_new_cfg_of_the_same_shape_is_rebound_without_the_slow_path(native):
    """Leaderboard mode makes a new cfg object per call: the entry compares its shape in C."""
    group = Group(native)
    group.custom_kernel(data())
    group.custom_kernel(data(config()))
    assert len(group.slow) == 1 and len(group.launches) == 2
    group.custom_kernel(data(config(hidden_dim=2 * HIDDEN)))
    assert len(group.slow) == 2


@pytest.mark.parametrize("change", [{"rank": 1}, {"world_size": 4}], ids=["rank", "world_size"])
def test_another_rank_or_world_size_takes_the_slow_path(native, change):
    group = Group(native)
    cfg = config()
    group.custom_kernel(data(cfg))
    group.custom_kernel(data(cfg, **change))
    assert len(group.slow) == 2 and group.slow[1][1:] == (change.get("rank", 0), change.get("world_size", 2))


def test_unbind_sends_the_next_call_to_the_slow_path(native):
    """The version unbinds when its group is destroyed: no call may launch on a heap that is gone."""
    group = Group(native)
    cfg = config()
    group.custom_kernel(data(cfg))
    group.unbind()
    group.custom_kernel(data(cfg))
    assert len(group.slow) == 2


def test_a_failed_launch_names_the_runtimes_error_and_restores_the_device(native):
    group = Group(native)
    group.code = 700
    with pytest.raises(RuntimeError, match="v9: launching all2all_kernel failed: error 700"):
        group.custom_kernel(data())
    assert group.device_calls[-1] == ("restore", PREVIOUS_DEVICE)


def test_a_failure_binding_the_device_launches_nothing(native):
    group = Group(native)
    group.custom_kernel(data())

    def broken(_index):
        raise RuntimeError("no such device")

    group.exchange_device = broken  # read by the next bind
    group.unbind()
    with pytest.raises(RuntimeError, match="no such device"):
        group.custom_kernel(data())
    assert len(group.launches) == 1


def test_more_tokens_than_slots_are_refused_before_any_launch(native):
    group = Group(native)
    group.custom_kernel(data())
    with pytest.raises(ValueError, match="at most max_num_tokens=8"):
        group.custom_kernel(data(tokens=SLOTS + 1))
    assert len(group.launches) == 1 and group.slots["epoch"].value == 1


def test_two_entries_never_share_a_binding(native):
    """Two loaded instances of v9 in one process (the trace build beside the timed one, diff.py's rounds)."""
    one, two = Group(native), Group(native)
    cfg = config()
    one.custom_kernel(data(cfg))
    two.custom_kernel(data(cfg))
    one.custom_kernel(data(cfg))
    assert (len(one.slow), len(two.slow)) == (1, 1)
    assert (len(one.launches), len(two.launches)) == (2, 1)


@pytest.mark.parametrize("args, error", [((), TypeError), ((1, 2), TypeError), (((1, 2, 3),), ValueError),
                                         ((data(rank="0"),), TypeError)],
                         ids=["no-argument", "two-arguments", "three-items", "rank-not-an-int"])
def test_malformed_calls_raise(native, args, error):
    with pytest.raises(error):
        Group(native).custom_kernel(*args)


def test_the_entry_names_no_vendor(tmp_path):
    """Nothing for hipify to rewrite: the same source builds on ROCm."""
    from tools import check_device

    source = tmp_path / "entry.cpp"
    source.write_text(entry_source())
    assert check_device.hipify(source).read_text() == entry_source()


def test_custom_kernel_is_the_native_entry_and_refuses_cpu_inputs():
    from a2a.plan import load_version

    module = load_version(V9, "v9_on_cpu")
    assert type(module.custom_kernel).__name__ == "builtin_function_or_method"
    with pytest.raises(ValueError, match="v9: the inputs must be on a GPU"):
        module.custom_kernel(data())
