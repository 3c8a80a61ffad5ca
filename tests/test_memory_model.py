"""The memory model on the real AMD target, checked without a GPU: each version's gfx942 assembly holds the
system-scope release and acquire sequences its NOTES promise for publishing a flag and for waiting on one (at least
one compiled sequence per call site of the prelude's store_release_sys / load_acquire_sys), and a planted relaxed
store or load makes the check fail."""
import re

import pytest

from tests.conftest import ROOT
from tools import check_device

pytestmark = pytest.mark.skipif(bool(check_device.missing_tools()),
                                reason=f"needs {', '.join(check_device.missing_tools())} ({check_device.INSTALL_HINT})")
DEVICE_FILES = sorted(p for p in (ROOT / "submissions").glob("*/v*.py") if check_device.kernels_of(p)) \
    + [ROOT / "a2a" / "probes.py"]
V4 = ROOT / "submissions" / "all2all" / "v4_low_overhead.py"


def call_sites(path, helper: str) -> int:
    """Calls of a prelude helper in the device code after the prelude (its vendor branches end at the first #endif)."""
    body = check_device.kernels_of(path).split("#endif", 1)[1]
    return len(re.findall(rf"\b{helper}\(", body))


def sequences(path):
    counts = check_device.memory_model(check_device.gfx942_assembly(path)).values()
    return tuple(map(sum, zip(*counts)))


@pytest.mark.parametrize("path", DEVICE_FILES, ids=lambda p: p.stem)
def test_flags_are_published_with_release_and_waited_on_with_acquire(path):
    release, acquire = sequences(path)
    promised_release, promised_acquire = call_sites(path, "store_release_sys"), call_sites(path, "load_acquire_sys")
    assert promised_release >= 1 and promised_acquire >= 1, "the device code publishes and waits on flags"
    assert release >= promised_release, f"{release} release sequences for {promised_release} call sites"
    assert acquire >= promised_acquire, f"{acquire} acquire sequences for {promised_acquire} call sites"


@pytest.mark.parametrize("old, new, index", [
    ("__hip_atomic_store(p, v, __ATOMIC_RELEASE", "__hip_atomic_store(p, v, __ATOMIC_RELAXED", 0),
    ("__hip_atomic_load(p, __ATOMIC_ACQUIRE", "__hip_atomic_load(p, __ATOMIC_RELAXED", 1),
])
def test_a_relaxed_flag_operation_is_caught(tmp_path, old, new, index):
    text = V4.read_text()
    assert old in text
    planted = tmp_path / "planted.py"
    planted.write_text(text.replace(old, new))
    assert sequences(planted)[index] == 0
    assert sequences(V4)[index] >= call_sites(V4, ("store_release_sys", "load_acquire_sys")[index])
