"""The memory model on the real AMD targets, checked without a GPU: each version's gfx942 (MI300X) and gfx950
(MI355X) assembly holds the
system-scope sequences its NOTES promise for publishing a flag and for waiting on one, at least one compiled
sequence per call site of the prelude's helper: store_release_sys (release store), load_acquire_sys (acquire load),
and from v6 spin_load (relaxed poll), spin_backoff (s_sleep) and spin_acquired (acquire fence after the loop). A
Triton version (v7) is held the same way to its helpers: _publish (drained barrier, then a release), _poll, _acquire
and _backoff. A planted relaxed store, relaxed load, missing fence, agent-scope poll, missing back-off or undrained
barrier makes the check fail."""
import re

import pytest

from tests.conftest import ROOT
from tools import check_device

MISSING = check_device.missing_tools()
pytestmark = [pytest.mark.skipif(bool(MISSING), reason=f"needs {', '.join(MISSING)} ({check_device.INSTALL_HINT})"),
              pytest.mark.xdist_group("device-code")]  # with tests/test_check_device.py: one run of the whole check
VERSIONS = sorted((ROOT / "submissions").glob("*/v*.py"))
DEVICE_FILES = [p for p in VERSIONS if check_device.kernels_of(p)] + [ROOT / "a2a" / "probes.py"]
TRITON_FILES = [p for p in VERSIONS if check_device.is_triton(p)]
V4 = ROOT / "submissions" / "all2all" / "v4_low_overhead.py"
V6 = ROOT / "submissions" / "all2all" / "v6_dedup.py"
V7 = ROOT / "submissions" / "all2all" / "v7_triton.py"
# prelude helper -> the sequence each of its call sites must compile to (check_device.MEMORY_MODEL_FIELDS)
HELPERS = {"store_release_sys": "release", "load_acquire_sys": "acquire", "spin_load": "poll",
           "spin_acquired": "fence", "spin_backoff": "sleep"}
TRITON_HELPERS = {"_publish": ("drain", "release"), "_acquire": ("acquire",), "_poll": ("poll",),
                  "_backoff": ("sleep",)}


def call_sites(path, helper: str) -> int:
    """Calls of a helper in the device code: after the C++ prelude (its vendor branches end at the first #endif), or
    anywhere in a Triton version but the helper's own definition."""
    if check_device.is_triton(path):
        return len(re.findall(rf"(?<!def )\b{helper}\(", path.read_text()))
    body = check_device.kernels_of(path).split("#endif", 1)[1]
    return len(re.findall(rf"\b{helper}\(", body))


@pytest.fixture(scope="module")
def checked(device_check) -> dict:
    """The counts the whole device check printed for the repository's own files, from the assembly of the code
    objects it built (tests/test_check_device.py reads the same run)."""
    assert device_check.returncode == 0, device_check.stdout + device_check.stderr
    return check_device.printed_memory_models(device_check.stdout)


def compiled(path, target: str) -> dict:
    """A file's counts from its own assembly compile (`amd_assembly`): for a planted copy, made for its test."""
    return check_device.memory_model(check_device.amd_assembly(path, target))


def sequences(path, target: str, checked: dict) -> dict:
    """A file's counts on `target`: a repository file's as the device check printed them, a planted copy's
    compiled."""
    return dict(checked[path.name, target]) if path.is_relative_to(ROOT) else compiled(path, target)


targets = pytest.mark.parametrize("target", check_device.AMD_TARGETS)


@targets
@pytest.mark.parametrize("path", DEVICE_FILES, ids=lambda p: p.stem)
def test_flags_are_published_with_release_and_waited_on_with_acquire(path, target, checked):
    found = sequences(path, target, checked)
    promised = {helper: call_sites(path, helper) for helper in HELPERS}
    assert promised["store_release_sys"] >= 1, "the device code publishes flags"
    assert promised["load_acquire_sys"] + promised["spin_acquired"] >= 1, "the device code waits on flags"
    if promised["spin_load"]:
        assert promised["spin_acquired"] >= 1, "relaxed polls need an acquire fence after the loop"
    for helper, field in HELPERS.items():
        assert found[field] >= promised[helper], f"{found[field]} {field} sequences for {promised[helper]} " \
                                                 f"call sites of {helper}"


@targets
@pytest.mark.parametrize("path", TRITON_FILES, ids=lambda p: p.stem)
def test_a_triton_version_publishes_after_a_drained_barrier_and_waits_with_acquire(path, target, checked):
    found = sequences(path, target, checked)
    for helper, fields in TRITON_HELPERS.items():
        sites = call_sites(path, helper)
        assert sites >= 1, f"{path.name} never calls {helper}"
        for field in fields:
            assert found[field] >= sites, f"{found[field]} {field} sequences for {sites} call sites of {helper}"


@pytest.mark.parametrize("old, new, field, helper", [
    ('tl.atomic_xchg(flag_ptr, value, sem="release", scope="sys")',
     'tl.atomic_xchg(flag_ptr, value, sem="relaxed", scope="sys")', "release", "_publish"),
    ('tl.inline_asm_elementwise("s_waitcnt vmcnt(0)"', 'tl.inline_asm_elementwise("s_nop 0"', "drain", "_publish"),
    ('mask=mask, sem="acquire", scope="sys"', 'mask=mask, sem="relaxed", scope="sys"', "acquire", "_acquire"),
    ('mask=mask, sem="relaxed", scope="sys"', 'mask=mask, sem="relaxed", scope="gpu"', "poll", "_poll"),
    ('tl.inline_asm_elementwise("s_sleep 1"', 'tl.inline_asm_elementwise("s_nop 0"', "sleep", "_backoff"),
], ids=["triton-relaxed-flag", "triton-undrained-barrier", "triton-relaxed-acquire", "triton-agent-poll",
        "triton-no-backoff"])
@targets
def test_a_weakened_triton_flag_operation_is_caught(tmp_path, old, new, field, helper, target, checked):
    text = V7.read_text()
    assert text.count(old) == 1, old
    planted = tmp_path / "planted_v7.py"
    planted.write_text(text.replace(old, new))
    assert sequences(V7, target, checked)[field] - sequences(planted, target, checked)[field] >= call_sites(V7, helper)


@pytest.mark.parametrize("path, old, new, helper", [
    (V4, "__hip_atomic_store(p, v, __ATOMIC_RELEASE", "__hip_atomic_store(p, v, __ATOMIC_RELAXED", "store_release_sys"),
    (V4, "__hip_atomic_load(p, __ATOMIC_ACQUIRE", "__hip_atomic_load(p, __ATOMIC_RELAXED", "load_acquire_sys"),
    (V6, "__atomic_thread_fence(__ATOMIC_ACQUIRE);", "", "spin_acquired"),
    (V6, "__ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM", "__ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT", "spin_load"),
    (V6, "__builtin_amdgcn_s_sleep(1);", "", "spin_backoff"),
], ids=["relaxed-store", "relaxed-load", "no-fence", "agent-poll", "no-backoff"])
@targets
def test_a_weakened_flag_operation_is_caught(tmp_path, path, old, new, helper, target, checked):
    """The weakened helper's sequences disappear: at least one per call site (volatile loads of the abandon word
    also read past the caches, so polls need not fall to zero)."""
    text = path.read_text()
    assert old in text
    planted = tmp_path / "planted.py"
    planted.write_text(text.replace(old, new))
    field = HELPERS[helper]
    assert sequences(path, target, checked)[field] - sequences(planted, target, checked)[field] \
        >= max(1, call_sites(path, helper))


@targets
def test_the_checks_counts_are_those_of_an_assembly_compile(target, checked):
    """The device check reads its counts from the assembly its code objects were built from (-save-temps), the
    planted copies above are read from an assembly-only compile (-S): both must count the same, or a planted copy
    would be compared with another compile's counts. v6 has every kind of sequence but the drained barrier, v7
    that too."""
    for path in (V6, V7):
        assert checked[path.name, target] == compiled(path, target), path.name


@pytest.mark.parametrize("between, drained", [
    (["v_add_u32_e32 v1, v1, v2", "s_waitcnt lgkmcnt(0)"], True),
    (["global_store_dword v[0:1], v2, off"], False),
    (["global_atomic_add v[0:1], v2, off"], False),
    ([".LBB0_3:"], False),
    (["s_cbranch_execz .LBB0_3"], False),
    ([".Ltmp7:", "ds_write_b32 v0, v1"], True),
], ids=["alu-and-lds-wait", "store", "atomic", "block-start", "branch", "debug-label-and-lds"])
def test_a_barrier_is_drained_only_past_a_store_wait_in_its_own_block(between, drained):
    """`drain`: an s_barrier whose straight run back holds `s_waitcnt vmcnt(0)` after every vector store or atomic;
    a block's start (a branch may enter past the wait) or a branch ends the run; a debug label does not."""
    lines = ["\t.type\tk,@function", "k:", "\tglobal_store_dword v[0:1], v3, off", "\ts_waitcnt vmcnt(0)",
             *[line if line.startswith(".") else "\t" + line for line in between], "\ts_barrier", ".Lfunc_end0:"]
    assert check_device.memory_model("\n".join(lines))["drain"] == int(drained)


V12 = ROOT / "submissions" / "all2all" / "v12_ll_rows.py"
V12_POLL = "        words = _poll(ptr, mask)\n"


def _ll_shape() -> dict:
    """The first benchmark shape that takes v12's LL path (its LL constexpr)."""
    module = check_device.triton_module(V12)
    return next(shape for shape in check_device.benchmark_shapes()
                if module.constants(**shape, world_size=check_device.TRITON_WORLD, trace=False, hip=True)["LL"])


def _ll_counts(path, target: str) -> dict:
    module = check_device.triton_module(path)
    return check_device.memory_model(check_device.triton_compile(module, "all2all_kernel", target, _ll_shape(),
                                                                 False).asm["amdgcn"])


@targets
def test_v12s_ll_path_polls_every_word_past_the_caches_and_acquires_nothing(tmp_path, target):
    """The LL path (a small shape) waits on words that carry their own epoch: no acquire anywhere, and every wait on
    LL words polls them at system scope (two loads per _wait_ll call site: before its loop and in it). A copy whose
    AMD branch reads them with tl.load(volatile=True), which gfx942 compiles to plain cached loads, loses those
    polls."""
    found = _ll_counts(V12, target)
    sites = call_sites(V12, "_wait_ll")
    assert found["acquire"] == 0 and found["poll"] >= 2 * sites, found
    text = V12.read_text()
    assert text.count(V12_POLL) == 1
    planted = tmp_path / "planted_v12.py"
    planted.write_text(text.replace(V12_POLL, "        words = tl.load(ptr, mask=mask, other=0, volatile=True)\n"))
    assert found["poll"] - _ll_counts(planted, target)["poll"] >= 2 * sites


def test_v12s_ll_words_are_relaxed_system_scope_stores_on_nvidia():
    """On NVIDIA each LL word is one `st.relaxed.sys.global.b64` (a plain weak store promises another GPU's polling
    loads nothing), at least one per _ll_store call site, and the LL path has no release fence of its own."""
    module = check_device.triton_module(V12)
    ptx = check_device.triton_compile(module, "all2all_kernel", "sm_90", _ll_shape(), False).asm["ptx"]
    assert len(re.findall(r"st\.relaxed\.sys\.global\.b64", ptx)) >= call_sites(V12, "_ll_store")
    assert not re.search(r"\bfence\.|membar\.", ptx)


V12_RECORD = "max(UNIFORM_LANES.value, triton.next_power_of_2(hidden_dim // 2 + meta_ints(k_block)))"


def test_v12_polls_only_vectors_that_span_the_program(tmp_path):
    """Every vector v12 polls with volatile loads (NVIDIA) is at least as long as its layout's tile
    (check_device.replicated_polls), on a shape whose rows are shorter than a program (hidden 256: 128 words a row).
    A copy whose records are only as long as a row and its meta polls replicated lanes there: each warp would count
    its own arrivals (v12's first GPU run). AMD polls with atomics, whose values every thread shares."""
    target = "sm_90"
    shape = {"num_experts": 8, "experts_per_token": 2, "hidden_dim": 256, "max_num_tokens": 8}
    module = check_device.triton_module(V12)
    assert module.constants(**shape, world_size=check_device.TRITON_WORLD, trace=False, hip=False)["LL"]
    ttgir = check_device.triton_compile(module, "all2all_kernel", target, shape, False).asm["ttgir"]
    assert re.search(r"tt\.load .*isVolatile = true.*: tensor<", ttgir)
    assert check_device.replicated_polls(ttgir) == []
    text = V12.read_text()
    assert text.count(V12_RECORD) == 1
    planted = tmp_path / "planted_v12.py"
    planted.write_text(text.replace(V12_RECORD, "triton.next_power_of_2(hidden_dim // 2 + meta_ints(k_block))"))
    planted_ttgir = check_device.triton_compile(check_device.triton_module(planted), "all2all_kernel", target, shape,
                                                False).asm["ttgir"]
    assert check_device.replicated_polls(planted_ttgir), "the planted copy's short records were not found"
