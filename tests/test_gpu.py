"""GPU runs on NCCL, on any machine with a GPU. The problem's own size, 8 ranks, runs everywhere: one GPU per rank
where there are 8, else the ranks share the GPUs through MPS (a2a/sharing.py). A test whose claim needs one GPU per
rank (a timing, a device that differs from the current one) skips with its reason where there are too few.

Every rank path here leaves the current device where the runner leaves it (cuda:0): the versions must take their
device from their inputs, as on the leaderboard. Test helpers bind their own GPU work with eval.own_device."""
import concurrent.futures
import contextlib
import functools
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import eval as core
from a2a import contract, sharing
from a2a.harness import evaluate, render
from a2a.plan import keep_rows_home, list_versions, load_version, make_plan, prebuild, resolve_version
from a2a.rows import parse_popcorn
from a2a.launch import parallel_launch
from tests.conftest import (ROOT, gpu_count, hanging_human_face, hanging_submission, profile_column, reachable,
                            requires_gpu, run_bundle, run_eval, saved_in, v1_kernel_source, wait_until_gone)

# One process runs this file (pytest-xdist's loadgroup keeps the group on one worker): its setup, the MPS daemon and
# the side-by-side runs below are the module's own.
pytestmark = [pytest.mark.gpu, requires_gpu, pytest.mark.xdist_group("gpu")]
PROBLEM_WS = 8  # the problem's world size (every official case)


def _sharing_problem():
    """Why 8 ranks cannot run on this machine's GPUs, or None (one GPU per rank, or sharing works here)."""
    if not 0 < gpu_count() < PROBLEM_WS:
        return None
    missing = sharing.obtain_nccl()  # once, cached in build/ (make test sets itself up like make leaderboard)
    if missing:
        return missing
    try:
        sharing.check_available()
    except core.UserError as why:
        return str(why)
    return None


# A rank of this module's launches imports it to unpickle its job: whether 8 ranks can run here is the test
# process's question, not eight ranks' at once (each would ask NCCL's version twice and might try to fetch one).
SHARING_PROBLEM = _sharing_problem() if multiprocessing.parent_process() is None else None
at_problem_size = pytest.mark.skipif(SHARING_PROBLEM is not None, reason=f"{PROBLEM_WS} ranks cannot run here: "
                                                                         f"{SHARING_PROBLEM}")


class _DaemonHold:
    """This module's hold on one MPS daemon for its runs of 8 ranks (sharing.shared_ranks keeps a daemon for as long
    as any caller in the process holds it), let go for a test that must see a run start and stop its own."""

    def __init__(self):
        self.stack = contextlib.ExitStack()

    def take(self) -> None:
        if SHARING_PROBLEM is None:
            self.stack.enter_context(sharing.shared_ranks(sharing.placement(PROBLEM_WS, gpu_count(), "nccl")))

    def release(self) -> None:
        self.stack.close()


class _SideBySide:
    """Runs that need no peer beyond their own ranks and no quiet GPU (the staged bundles at the largest world size
    with a GPU per rank), started together when the module sets up and read by their tests later, while the runs
    of 8 go on in the foreground. Runs on the runner's fixed port take turns on one thread; runs on a private port
    take PRIVATE_PORT_RUNS threads. A test whose claim needs a quiet GPU (a timing, a process count) waits for all of
    them first (fixture `quiet_gpu`)."""

    # Each run holds a few GiB of GPU memory (3.4 GiB seen in one torch-version benchmark). Nine at once beside the
    # group of 8 filled an H100's 80 GB: the group stalled and a staged run failed out of memory.
    PRIVATE_PORT_RUNS = 3

    def __init__(self):
        self.fixed_port = concurrent.futures.ThreadPoolExecutor(max_workers=1)
        self.private_port = concurrent.futures.ThreadPoolExecutor(max_workers=self.PRIVATE_PORT_RUNS)
        self.runs: dict = {}

    def start(self, key, fn, *args, private: bool) -> None:
        """fn(*args, private=private) on a private port's thread, or in turn on the fixed port's."""
        self.runs[key] = (self.private_port if private else self.fixed_port).submit(fn, *args, private=private)

    def result(self, key):
        return self.runs[key].result(timeout=900)

    def wait(self) -> None:
        concurrent.futures.wait(list(self.runs.values()))

    def close(self) -> None:
        for pool in (self.fixed_port, self.private_port):
            pool.shutdown(wait=True, cancel_futures=True)


@pytest.fixture(scope="module", autouse=True)
def one_setup_for_every_test(request, tmp_path_factory):
    """What every test would otherwise set up again: one extension cache, the one the sandboxed ranks use, with
    every version's timed and trace builds made side by side first (a fresh machine built them one after another,
    test by test, inside the tests); one MPS daemon, with its SM probe, held for every in-process run of 8 ranks
    (each would start its own); and the selected staged-bundle runs started side by side."""
    failures = prebuild(list_versions())
    assert not failures, failures
    hold = _DaemonHold()
    hold.take()
    side = _SideBySide()
    selected = {tuple(item.callspec.params.values()) for item in request.session.items
                if item.originalname == "test_the_staged_bundle_passes_the_protocol_face_in_every_mode"}
    for version, mode in sorted(selected):
        side.start((version, mode), _run_staged, reachable(tmp_path_factory.mktemp(f"staged_{version}_{mode}")),
                   version, mode, private=version not in EVERY_MODE)
    yield hold, side
    side.close()
    hold.release()


@pytest.fixture
def side_by_side(one_setup_for_every_test):
    return one_setup_for_every_test[1]


@pytest.fixture
def quiet_gpu(one_setup_for_every_test):
    """For a test whose claim needs the GPU to itself (a timing, the processes a run leaves): every side-by-side run
    has ended."""
    one_setup_for_every_test[1].wait()


@pytest.fixture
def no_daemon_held(one_setup_for_every_test, quiet_gpu):
    """For a test of a run's own MPS daemon: none of this module's is running while it runs (a second control
    daemon on the same GPU is not a case the runs are built for)."""
    hold = one_setup_for_every_test[0]
    hold.release()
    yield
    hold.take()


def gpu_per_rank(ranks: int, why: str):
    """Skips a test whose claim needs `ranks` GPUs, one per rank, saying why sharing one cannot make it."""
    return pytest.mark.skipif(gpu_count() < ranks, reason=f"needs {ranks} GPUs, one per rank ({why}); this machine "
                                                          f"has {gpu_count()}")
VERSIONS = [p.stem.split("_")[0] for p in list_versions()]
# Every version with its own device code (v2 on): the P2P line.
P2P_VERSIONS = [version for version in VERSIONS if int(version[1:]) >= 2]
# Whether dispatch-recv's expert-major rows already hold the expert's output (v2 scales them in place; from v3 the
# expert is fused into combine-send and the layout keeps the dispatched input).
EXPERT_IN_LAYOUT = {version: version == "v2" for version in P2P_VERSIONS}
QUIET = {"progress": lambda *_: None}


def largest() -> int:
    return min(gpu_count(), 8)


def _load(version: str, name: str = "", trace: bool = False):
    path = resolve_version(version)
    return load_version(path, name or path.stem, trace=trace)


def _sync(rank: int) -> None:
    """The test's own wait for its rank's GPU (torch.cuda.synchronize() alone waits for cuda:0, the current one)."""
    import torch

    torch.cuda.synchronize(core.rank_device(rank))


# --------------------------------------------------------------------------------------------------------------
# Faithful to the runner: the current device, the staged bundles, a cold start
# --------------------------------------------------------------------------------------------------------------

# Allocates its output on the current device, as a submission that trusts `device="cuda"` does. Under the runner
# that is cuda:0 in every rank, so every rank but 0 fails the device check.
CANARY = v1_kernel_source() + """

def custom_kernel(data):
    return _v1_kernel(data).to("cuda")
"""

# Right answers, but it records the current device at import and at every call, and fails if it is not cuda:0.
WATCHES_THE_DEVICE = v1_kernel_source() + """
import torch

SEEN_AT_IMPORT = torch.cuda.current_device()


def custom_kernel(data):
    now = torch.cuda.current_device()
    if (SEEN_AT_IMPORT, now) != (0, 0):
        raise RuntimeError(f"the current device was cuda:{SEEN_AT_IMPORT} at import and cuda:{now} in the call")
    return _v1_kernel(data)
"""


def _staged(tmp_path: Path, version: str, body: str = "") -> Path:
    bundle = tmp_path / "bundle"
    assert run_eval("stage", version, str(bundle)).returncode == 0
    if body:
        (bundle / "submission.py").write_text(body)
    return bundle


def _official_cases(bundle: Path, section: str, world_size: int, first: int | None = None) -> str:
    """The runner's test file for `section` (its `first` cases only, if given), rewritten to `world_size` (the
    official cases have world size 8)."""
    lines = (bundle / f"{section}.txt").read_text().replace("world_size: 8", f"world_size: {world_size}")
    name = f"{section}_ws{world_size}{'' if first is None else f'_first{first}'}.txt"
    (bundle / name).write_text("".join(lines.splitlines(keepends=True)[:first]))
    return name


def _nccl(world_size: int, **extra) -> dict:
    return {"A2A_BACKEND": "nccl", "POPCORN_GPUS": str(world_size), **extra}


@gpu_per_rank(2, "on one GPU every rank's device is cuda:0, the current one, so trusting it goes unseen")
def test_a_submission_on_the_current_device_fails_as_on_the_runner(tmp_path):
    bundle = _staged(tmp_path, "v1", CANARY)
    # One case says it: a failing case retires its ranks, so every case after it starts new ones (all 9: 85 s, 4 H200s).
    code, output, stderr = run_bundle(bundle, "test", _official_cases(bundle, "tests", largest(), first=1),
                                      _nccl(largest()))
    keys = parse_popcorn(output)
    assert code == 112 and keys["check"] == "fail", output + stderr[-2000:]
    # Every rank but rank 0 (whose own device is the current one) returns on cuda:0; the owner names them.
    named = ", ".join(str(rank) for rank in range(1, largest()))
    assert f"{'rank' if largest() == 2 else 'ranks'} {named} - custom_kernel: returned an output on the wrong device" \
        in keys["test.0.error"], keys["test.0.error"]


@gpu_per_rank(2, "on one GPU every rank's device is cuda:0, the current one, so setting it changes nothing")
def test_no_harness_path_sets_the_current_device(tmp_path):
    from a2a import diffing, timeline

    path = tmp_path / "watches.py"
    path.write_text(WATCHES_THE_DEVICE)
    for mode, cases in (("test", "tests:0,5"), ("benchmark", "benchmarks:0"), ("leaderboard", "benchmarks:1")):
        result = evaluate(make_plan(str(path), cases, largest(), "nccl"), mode, **QUIET)
        assert result.exit_code == 0, [case["error"] for case in result.cases]
    assert timeline.trace_version(make_plan(str(path), "benchmarks:0", 2, "nccl"), 2, tmp_path / "traces")
    rows = diffing.time_versions(make_plan([str(path), str(path)], "benchmarks:0", 2, "nccl"), rounds=2, steps=1)
    assert all("B/A" in row for row in rows), rows


# Every change runs every version's official tests through the protocol face, and every mode of the torch version
# and the newest; the runner's timed modes of the versions between are `make test-gpu-full` (pytest -m full): each is
# about a minute and a half of an H100 per version and face (WORKLOG, "make test-gpu in parts").
EVERY_MODE = {VERSIONS[0], VERSIONS[-1]}


def _by_mode(modes: tuple) -> list:
    return [pytest.param(version, mode, marks=[] if mode == "test" or version in EVERY_MODE else [pytest.mark.full])
            for version in VERSIONS for mode in modes]


def _run_staged(folder: Path, version: str, mode: str, private: bool) -> tuple:
    """One staged bundle run at the largest world size with a GPU per rank (test_the_staged_bundle_..., started
    side by side when the module sets up): (exit code, POPCORN output, stderr)."""
    bundle = _staged(folder, version)
    test_file = _official_cases(bundle, "tests" if mode == "test" else "benchmarks", largest())
    seed = {"POPCORN_SEED": str(int(time.time()) % 100_000)} if mode == "leaderboard" else {}
    port = {"A2A_RENDEZVOUS": "private"} if private else {}
    return run_bundle(bundle, mode, test_file, _nccl(largest(), **seed, **port))


def test_the_protocol_face_refuses_more_ranks_than_gpus(tmp_path):
    """A staged bundle is the runner's: without the human face's sharing it refuses a case that needs more ranks
    than the machine has GPUs (113, one line), before any rank starts."""
    bundle = _staged(tmp_path, "v1")
    too_many = 2 * gpu_count()
    (bundle / "many.txt").write_text(f"num_experts: {8 * too_many}; experts_per_token: 2; hidden_dim: 256; "
                                     f"max_num_tokens: 8; seed: 1; world_size: {too_many}\n")
    code, output, stderr = run_bundle(bundle, "test", "many.txt", _nccl(too_many))
    assert code == 113 and output == "", (code, output, stderr)
    assert f"needs {too_many} ranks but this machine has {gpu_count()} GPU(s)" in stderr, stderr


def _ran_where() -> str:
    return "shared through MPS" if gpu_count() < PROBLEM_WS else "one each"


# The runner's own path at the problem's size: the newest's official tests, and its leaderboard mode on the largest
# benchmark shape, every time; every version's official tests and all five shapes with `full`.
AT_8_BY_THE_RUNNER = [pytest.param(version, mode, cases, marks=[] if (version, cases) in
                                   ((VERSIONS[-1], "tests"), (VERSIONS[-1], "benchmarks:4")) else [pytest.mark.full])
                      for version in VERSIONS for mode, cases in (("test", "tests"), ("leaderboard", "benchmarks"))]
AT_8_BY_THE_RUNNER.append(pytest.param(VERSIONS[-1], "leaderboard", "benchmarks:4"))


@at_problem_size
@pytest.mark.parametrize("version, mode, cases", AT_8_BY_THE_RUNNER)
def test_every_version_passes_at_the_problems_size(version, mode, cases):
    """What `python eval.py test vN --world-size 8` or `... leaderboard vN --world-size 8 --seed S` runs: the
    official tests, or benchmark shapes with a fresh secret seed and every run checked, on 8 ranks (sharing the GPUs
    where there are fewer than 8), a group per case as on the runner (each version's official tests at this size
    also run every time in one group of 8, test_every_version_passes_the_official_tests_in_one_group_of_8)."""
    plan = make_plan(version, cases, PROBLEM_WS, "nccl", seed=int(time.time()) % 100_000)
    result = evaluate(plan, mode, **QUIET)
    print(render(result))  # for `pytest -rP`: what each version did at the problem's size
    assert result.exit_code == 0, (mode, [case["error"] for case in result.cases], result.void)
    assert result.placement.startswith(f"{PROBLEM_WS} ranks on {min(gpu_count(), PROBLEM_WS)} GPU"), result.placement
    assert _ran_where() in result.placement, result.placement
    assert [case["status"] for case in result.cases] == ["pass"] * len(plan.cases), result.cases


@at_problem_size
def test_a_cold_start_fits_the_first_test(tmp_path):
    """An empty extension cache: every rank of the problem's 8 imports the newest version at once in the first case,
    one builds and the others wait, inside the runner's 60 s."""
    newest = list_versions()[-1]
    result = evaluate(make_plan(str(newest), "tests:0", PROBLEM_WS, "nccl"), "test", cold=True, **QUIET)
    assert result.exit_code == 0, [case["error"] for case in result.cases]
    assert result.import_s is not None and result.import_s < 60, result.import_s
    print(f"cold start of {newest.stem}: {result.import_s:.1f} s importing (and building) in the first case")


# --------------------------------------------------------------------------------------------------------------
# Every version at the problem's size in one group of 8; regrouping; the staged bundles (side by side since setup).
# Each rank loads the version file itself, from the builds the module's setup made.
# --------------------------------------------------------------------------------------------------------------


def _dispatched_rows(module, rank, world_size, version, spec):
    """Every row each local expert received is checked against what its source routed: the (src, token, k) set
    must match exactly and each row must equal the source's x row (times 1 + rank where the layout holds the
    expert's output) bit for bit."""
    import torch

    from reference import generate_input

    data = generate_input(**spec, rank=rank, world_size=world_size)
    module.custom_kernel(data)
    _sync(rank)
    counts, meta, rows = contract.dispatch_view(module, int(version[1:]), world_size)
    n_local, cap = rows.shape[0], rows.shape[1]
    sources = {r: generate_input(**spec, rank=r, world_size=world_size)[1] for r in range(world_size)}
    expected = set()
    for src, d in sources.items():
        for token, row in enumerate(d.indices.tolist()):
            for k, expert in enumerate(row):
                if expert // n_local == rank:
                    expected.add((src, token, k, expert % n_local))
    received = set()
    scale = (1 + rank) if EXPERT_IN_LAYOUT[version] else 1
    for local in range(n_local):
        for position in range(int(counts[local])):
            src, _, token, k = meta[local * cap + position].tolist()
            assert (src, token, k, local) not in received, "a pair arrived twice"
            received.add((src, token, k, local))
            want = sources[src].x[token].to(rows.device) * scale
            assert torch.equal(rows[local, position], want), (src, token, k)
    return received == expected, len(received)


def _pressure(module, rank, world_size, spec, repeats):
    import torch

    from reference import check_implementation, generate_input

    data = generate_input(**spec, rank=rank, world_size=world_size)
    first = module.custom_kernel(data).clone()
    identical = all(torch.equal(module.custom_kernel(data), first) for _ in range(repeats - 1))
    fresh = []
    for i in range(repeats):
        other = generate_input(**dict(spec, seed=spec["seed"] + 13 * (i + 1)), rank=rank, world_size=world_size)
        fresh.append(check_implementation(other, module.custom_kernel(other)))
    return identical, [message for ok, message in fresh if not ok]


DISPATCH_SPEC = dict(num_experts=64, experts_per_token=6, hidden_dim=2048, max_num_tokens=32, seed=1234)
PRESSURE_SPEC = dict(num_experts=256, experts_per_token=8, hidden_dim=7168, max_num_tokens=256, seed=4)


class VersionFailed(RuntimeError):
    """A version's failure inside a group that runs every version: it ends the whole launch. The failing rank's
    peers may be inside a collective or a kernel that waits for it, so no rank can go on to the next version; the
    pool ends the others after its grace and the launch's error names this version and rank first."""

    def __init__(self, version: str, rank: int, failed: Exception):
        super().__init__(f"{version} on rank {rank}: {type(failed).__name__}: {failed}")


@contextlib.contextmanager
def _ends_the_group(version: str, rank: int):
    """Whatever fails inside ends the group as VersionFailed."""
    try:
        yield
    except Exception as failed:
        raise VersionFailed(version, rank, failed) from failed


def _every_version_at_8(rank, world_size, official: list) -> dict:
    """One group of 8 for every version (one NCCL setup and one MPS daemon: a group's start is most of a small
    check's time): each version's official tests, then for the P2P ones the dispatch check on a small shape and the
    pressure check on the largest, so each also resizes its buffers between calls, as in the official runs. A
    barrier brings every rank to the next version together; a version's failure ends the group (VersionFailed)."""
    import torch.distributed as dist

    from reference import check_implementation, generate_input

    found = {}
    for version in VERSIONS:
        dist.barrier()
        started = time.monotonic()
        entry = found[version] = {"official": None, "dispatch": None, "pressure": None}
        with _ends_the_group(version, rank):
            module = _load(version)
            entry["official"] = []
            for args in official:
                data = generate_input(**args, rank=rank)
                ok, message = check_implementation(data, module.custom_kernel(data))
                entry["official"].append("" if ok else f"seed {args['seed']}: {message}")
            if version in P2P_VERSIONS:
                entry["dispatch"] = _dispatched_rows(module, rank, world_size, version, DISPATCH_SPEC)
                entry["pressure"] = _pressure(module, rank, world_size, PRESSURE_SPEC, 20)
                _release(module)
        entry["seconds"] = time.monotonic() - started
    return found


def _release(module) -> None:
    """Frees a version's heap once every rank is done with it, as destroying its process group would on the runner:
    a group that keeps every version's largest heap at once, 8 ranks on one GPU beside the side-by-side runs, ran
    the GPU out of memory (WORKLOG, "The group of 8 ran the GPU out of memory")."""
    import torch
    import torch.distributed as dist

    dist.barrier()
    module._close_state()
    torch.cuda.empty_cache()


_LAUNCHED: dict = {}  # (rank function, world size) -> its per-rank results, or the launch's error
# A launch's limit: the group of 8 takes about 2 minutes on one H100 with nothing beside it; past 5 it is stuck, and
# its watchdog shows every rank's stack.
LAUNCH_TIMEOUT_S = 300


def _launched_once(fn, world_size: int, *args) -> list:
    """fn's launch, run once for the tests that read its results; each of them reports its error."""
    key = (fn.__name__, world_size)
    if key not in _LAUNCHED:
        try:
            _LAUNCHED[key] = parallel_launch(world_size, fn, *args, backend="nccl", timeout_s=LAUNCH_TIMEOUT_S)
        except Exception as failed:
            _LAUNCHED[key] = failed
    if isinstance(_LAUNCHED[key], Exception):
        raise _LAUNCHED[key]
    return _LAUNCHED[key]


@functools.cache
def _official_at_8() -> list:
    return [dict(case.args) for case in make_plan("v1", "tests", PROBLEM_WS, "nccl").cases]


def _at_8(version: str) -> list:
    """Every rank's entry for `version` from the one group of 8 (the launch's error fails every test reading it)."""
    return [found[version] for found in _launched_once(_every_version_at_8, PROBLEM_WS, _official_at_8())]


@pytest.mark.parametrize("version", VERSIONS)
@at_problem_size
def test_every_version_passes_the_official_tests_in_one_group_of_8(version):
    """All 9 official tests at the problem's size for every version, in one group of 8 ranks that runs them all
    (the runner's own path, a group per case, is test_every_version_passes_at_the_problems_size)."""
    entries = _at_8(version)
    print(f"{version} in the group of 8: {max(entry['seconds'] for entry in entries):.1f} s")  # for `pytest -rP`
    failed = [message for entry in entries for message in entry["official"] if message]
    assert not failed and all(len(entry["official"]) == 9 for entry in entries), failed


@pytest.mark.parametrize("version", P2P_VERSIONS)
@at_problem_size
def test_dispatch_delivers_each_pair_once_to_the_right_expert(version):
    dispatched = [entry["dispatch"] for entry in _at_8(version)]
    assert all(ok for ok, _ in dispatched), dispatched
    assert sum(n for _, n in dispatched) > 0


@pytest.mark.parametrize("version", P2P_VERSIONS)
@at_problem_size
def test_pressure_same_seed_bit_identical_then_fresh_seeds(version):
    pressured = [entry["pressure"] for entry in _at_8(version)]
    assert all(identical for identical, _ in pressured), "same input gave different outputs"
    assert all(not failures for _, failures in pressured), pressured


@at_problem_size
@pytest.mark.parametrize("version", [pytest.param(version, marks=[] if version == P2P_VERSIONS[-1] else
                                                  [pytest.mark.full]) for version in P2P_VERSIONS])
def test_survives_regrouping_with_gpus_reassigned(version, tmp_path):
    """One pool of 8, groups of changing size in a row: each worker gets another rank (GPU) from case to case. Where
    the 8 ranks share the GPUs, the bundle gets the human face's sharing (A2A_SHARE and the MPS daemon). A private
    port: the staged runs on the fixed one may be going on side by side. The newest every time, the others with
    `full`."""
    bundle = _staged(tmp_path, version)
    sizes = [PROBLEM_WS, 2, PROBLEM_WS, 2, 2]
    lines = [f"num_experts: 64; experts_per_token: 6; hidden_dim: 2048; max_num_tokens: 32; seed: {i}; "
             f"world_size: {ws}" for i, ws in enumerate(sizes)]
    (bundle / "mixed.txt").write_text("\n".join(lines) + "\n")
    with sharing.shared_ranks(sharing.placement(PROBLEM_WS, gpu_count(), "nccl")) as share_env:
        code, output, stderr = run_bundle(bundle, "test", "mixed.txt",
                                          _nccl(PROBLEM_WS, A2A_RENDEZVOUS="private", **share_env))
    assert code == 0 and parse_popcorn(output).get("check") == "pass", output + stderr[-3000:]


@pytest.mark.parametrize("version, mode", _by_mode(("test", "benchmark", "leaderboard")))
def test_the_staged_bundle_passes_the_protocol_face_in_every_mode(side_by_side, version, mode):
    """Exactly what the runner runs, at the largest world size with a GPU per rank (one rank on one GPU: the
    protocol face refuses more ranks than GPUs, as the runner does): a spawn pool of that many workers, each rank in
    another process from case to case, no set_device; the official tests, or the benchmark shapes timed
    (leaderboard mode: a fresh secret seed, a check of every run). The torch version and the newest run on the
    runner's fixed port, one after another; the versions between on private ports, side by side (the module starts
    every selected run when it sets up)."""
    code, output, stderr = side_by_side.result((version, mode))
    keys = parse_popcorn(output)
    assert code == 0 and keys.get("check") == "pass", (mode, output[-2000:], stderr[-3000:])
    counted = int(keys["test-count" if mode == "test" else "benchmark-count"])
    assert counted == (9 if mode == "test" else 5), keys


# --------------------------------------------------------------------------------------------------------------
# The harness on GPUs
# --------------------------------------------------------------------------------------------------------------


def test_the_drivers_gpu_count_is_torchs():
    """The protocol face counts GPUs through the driver before any torch import (eval.machine_gpus): the count and
    CUDA_VISIBLE_DEVICES's hold on it are torch's."""
    for visible in (None, "", "0"):
        env = core.environ_with({"CUDA_VISIBLE_DEVICES": visible} if visible is not None else {})
        if visible is None:
            env.pop("CUDA_VISIBLE_DEVICES", None)
        done = subprocess.run([sys.executable, "-c", "import sys, eval; n = eval.machine_gpus(); t = 'torch' in "
                               "sys.modules; import torch; print(n, t, torch.cuda.device_count())"], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=120)
        count, imported, torch_count = done.stdout.split()
        assert (count, imported) == (torch_count, "False"), (visible, done.stdout, done.stderr)
        assert int(count) == {None: gpu_count(), "": 0, "0": 1}[visible], (visible, count)


def test_benchmark_reports_device_time_and_floor():
    (case,) = evaluate(make_plan("v1", "benchmarks:0", 2, "nccl"), "benchmark", **QUIET).cases
    assert case["status"] == "pass"
    assert 0 < case["device_mean_us"] < case["mean_us"] and 0 < case["floor_mean_us"] < case["mean_us"]


def test_profile_mode_profiles_a_call_on_the_owners_input_and_checks_it():
    """Profile mode is an owner's step (red team 29): the newest version profiled at the largest world size with a
    GPU per rank where there are GPUs enough, its output checked; the report sums what the ranks ran on devices."""
    result = evaluate(make_plan(VERSIONS[-1], "benchmarks:0", largest(), "nccl"), "profile", **QUIET)
    (case,) = result.cases
    assert result.exit_code == 0 and case["status"] == "pass" and "self_device_us" in case["report"], case
    device_us, closing = profile_column(case["report"], "self_device_us")
    assert device_us and max(device_us) > 0 and f"over {largest()} ranks" in closing, case["report"]


def _pattern(size: int, device: str):
    import torch

    return (torch.arange(size, device=device) % 251).to(torch.uint8)


def test_a_shared_gpu_buffer_is_the_same_memory_in_another_process():
    """gpu_share: what another process writes through its mapping of the exported descriptor is what this one
    reads through its own (the device transport's whole premise)."""
    import socket

    import gpu_share
    from multiprocessing.reduction import sendfds

    buffer = gpu_share.Buffer.create(0, 3 << 20)
    buffer.tensor.zero_()
    context = multiprocessing.get_context("spawn")
    here, there = socket.socketpair()
    fd = buffer.export()
    child = context.Process(target=_receive_and_write, args=(there, buffer.size))
    child.start()
    sendfds(here, [fd])
    os.close(fd)
    child.join(120)
    assert child.exitcode == 0
    assert bool((buffer.tensor == _pattern(buffer.size, "cuda:0")).all())
    buffer.close()


def _receive_and_write(sock, size: int) -> None:
    from multiprocessing.reduction import recvfds

    import gpu_share

    (fd,) = recvfds(sock, 1)
    buffer = gpu_share.Buffer.open(fd, 0, size)
    buffer.tensor.copy_(_pattern(size, "cuda:0"))
    buffer.close()


@pytest.mark.parametrize("transport", ["device", "host"])
def test_the_owners_steps_go_gpu_to_gpu_with_a_gpu_per_rank(transport, monkeypatch):
    """With a GPU per rank the owner places each input into, and copies each output out of, memory on the rank's
    GPU that it shares with the rank's process across the ranks' uid and PID namespace (channels.Channel with a GPU);
    A2A_TRANSPORT=host keeps host memory. A version passes leaderboard mode either way, and the run says which."""
    ranks = min(gpu_count(), 2)
    if transport == "host":
        monkeypatch.setenv("A2A_TRANSPORT", "host")
    result = evaluate(make_plan("v1", "benchmarks:0", ranks, "nccl"), "leaderboard", **QUIET)
    assert result.exit_code == 0 and [c["status"] for c in result.cases] == ["pass"], result.cases
    words = "GPU buffers the owner shares" if transport == "device" else "through host memory"
    assert words in result.guards, result.guards


@pytest.mark.skipif(gpu_count() < 2, reason="the owner's copies by another GPU than the rank's need two GPUs")
@pytest.mark.parametrize("copier", ["default", "last", "next", "own"])
def test_the_owners_copies_come_from_the_gpu_asked_for(monkeypatch, copier):
    """A2A_OWNER_GPU: the owner maps each rank's regions for another GPU (by default one no rank uses, else the next
    rank's) and copies over the peer link there, or from the rank's own GPU; the version passes every way, and the
    boundary line names who copied."""
    ranks = 1 if copier in ("default", "last") else min(gpu_count(), 2)
    if copier != "default":
        monkeypatch.setenv("A2A_OWNER_GPU", str(gpu_count() - 1) if copier == "last" else copier)
    result = evaluate(make_plan("v1", "benchmarks:0", ranks, "nccl"), "leaderboard", **QUIET)
    assert result.exit_code == 0 and [c["status"] for c in result.cases] == ["pass"], result.cases
    words = {"default": "copied by GPU 1 (rank by rank)", "last": f"copied by GPU {gpu_count() - 1} (rank by rank)",
             "next": "copied by GPU 1, ", "own": "copied by each rank's own GPU"}[copier]
    assert words in result.guards, result.guards


@pytest.mark.skipif(not (ROOT / "build" / "runner" / "COMMIT").is_file(),
                    reason="the runner's files are not here (python -m tools.runner_face --fetch CLONE, then carry "
                           "build/runner to the GPU machine)")
def test_the_runners_own_evaluator_and_ours_pass_the_same_bundle(tmp_path):
    """tools/runner_face.py with gpu-mode's own evaluator: v1's staged bundle passes every test case on both faces,
    and the table says so for each."""
    ranks = min(gpu_count(), 2)
    done = subprocess.run([sys.executable, "-m", "a2a.cli", "runner-face", "--versions", "v1", "--world-size",
                           str(ranks), "--modes", "test", "--out", str(tmp_path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (folder,) = saved_in(tmp_path)
    rows = (folder / "results.csv").read_text().splitlines()[1:]
    assert len(rows) == 9 and all(row.count(",pass,") == 2 for row in rows), rows


def test_no_rendezvous_fails_on_gpus_while_ports_churn(process_token, quiet_gpu):
    churn = subprocess.Popen([sys.executable, str(ROOT / "tests" / "port_churn.py"), "600"],
                             env=core.environ_with({"A2A_TEST_TOKEN": process_token}))
    try:
        time.sleep(3)
        for version in ("v1", "v2"):
            result = evaluate(make_plan(version, "tests:0,1", 2, "nccl"), "test", **QUIET)
            assert result.exit_code == 0 and [c["status"] for c in result.cases] == ["pass", "pass"], result.cases
    finally:
        churn.kill()
        churn.wait()


HANGS_ON_THE_GPU = hanging_submission(touch_the_gpu=True)


def test_sigterm_ends_a_hanging_gpu_run(tmp_path, process_token, no_daemon_held):
    """On one GPU the two ranks share it: the MPS daemon the run started must be gone too (it carries the token)."""
    process = hanging_human_face(tmp_path, process_token, HANGS_ON_THE_GPU)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGTERM, stderr
    assert not wait_until_gone(process_token, 20), "processes left behind"


@at_problem_size
@pytest.mark.skipif(gpu_count() >= PROBLEM_WS, reason="with a GPU per rank nothing is shared and no MPS daemon runs")
def test_a_killed_shared_run_leaves_no_mps_daemon(tmp_path, process_token, no_daemon_held):
    """SIGKILL to the human face of 8 ranks sharing the GPUs: no `finally` runs, yet the ranks die with their
    parents and the guardian stops the MPS daemon and its server and removes their folder."""
    process = hanging_human_face(tmp_path, process_token, HANGS_ON_THE_GPU, world_size=PROBLEM_WS)
    mps = [pid for pid in _processes_named("nvidia-cuda-mps")]
    assert mps, "no MPS daemon ran for the shared ranks"
    process.kill()
    process.communicate(timeout=60)
    assert not wait_until_gone(process_token, 30), "processes left behind"
    assert not [pid for pid in _processes_named("nvidia-cuda-mps") if pid in mps], "the MPS daemon outlived the run"


@at_problem_size
@pytest.mark.skipif(gpu_count() >= PROBLEM_WS, reason="with a GPU per rank nothing is shared and no MPS server runs")
def test_the_mps_pipe_folder_sweep_leaves_nothing_unheld_and_the_next_pool_still_shares(monkeypatch, no_daemon_held):
    """At each shared pool's end the MPS pipe folder's sweep (boundary.sweep_owned) removes the pool uid's files
    there and keeps only the channels a live process of that uid holds open. On a real MPS: two clock rounds of v1
    at the problem's size, one pool each on the same daemon, so the second shows the first's sweep left MPS
    working; each sweep's before and after is printed (`pytest -rP`: what an MPS server of the uid makes there).
    The 2026-11-28 run (b04a593, two H200s) found no channel of the uid there at a pool's end."""
    import math
    import stat as stat_module

    import boundary
    from a2a import clock

    sweeps = []
    original = boundary.sweep_owned

    def listing(folder: Path, uid: int) -> list:
        found = []
        for entry in sorted(folder.iterdir()) if folder.is_dir() else ():
            with contextlib.suppress(OSError):
                info = entry.lstat()
                if info.st_uid == uid:
                    kind = ("socket" if stat_module.S_ISSOCK(info.st_mode) else "fifo" if stat_module.S_ISFIFO(
                        info.st_mode) else "folder" if stat_module.S_ISDIR(info.st_mode) else "file")
                    found.append((entry.name, kind, (info.st_dev, info.st_ino)))
        return found

    def watched(folder, uid, channels_kept=None):
        if channels_kept is None:  # the shared /dev/shm's sweep
            return original(folder, uid, channels_kept=channels_kept)
        before = listing(Path(folder), uid)
        original(folder, uid, channels_kept=channels_kept)
        held = boundary.held_channels(uid)
        after = [(name, kind, identity in held or os.path.realpath(Path(folder) / name) in held)
                 for name, kind, identity in listing(Path(folder), uid)]
        sweeps.append({"folder": str(folder), "uid": uid, "before": [e[:2] for e in before], "after": after})

    monkeypatch.setattr(boundary, "sweep_owned", watched)
    plan = make_plan(["v1"], "benchmarks:0", PROBLEM_WS, "nccl")
    settings = clock.Settings(steps=2, warmup=1, min_rounds=2, max_rounds=2, time_cap_s=math.inf, targets=())
    run = clock.time_entries(plan, [clock.Entry("v1", "version", str(plan.versions[0]))], settings, **QUIET)
    for sweep in sweeps:
        print(f"MPS pipe folder sweep: {sweep}")  # for `pytest -rP`
    assert not run.failed, run.failed
    assert len(sweeps) >= 2, f"expected a sweep at each of two shared pools' ends: {sweeps}"
    unheld = [(sweep["uid"], name) for sweep in sweeps for name, _, held in sweep["after"] if not held]
    assert not unheld, f"left in the MPS pipe folder, held open by no live process of its uid: {unheld}"


def _processes_named(prefix: str) -> list:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if Path(f"/proc/{entry}/comm").read_text().startswith(prefix):
                    found.append(int(entry))
            except OSError:
                continue
    return found


# --------------------------------------------------------------------------------------------------------------
# P2P versions in one group of 2: the trace build and the spin-wait's give-up
# --------------------------------------------------------------------------------------------------------------


def _peer_never_comes(module, rank, world_size, spec, host_group):
    """Rank 1 skips a call: rank 0's call must give up after the spin timeout instead of hanging, and say what it
    waited for (its report thread prints to stderr, caught here). Around that call the ranks meet in `host_group`
    (gloo): an NCCL barrier's kernel of rank 1, spinning on a GPU the ranks share, held an SM that rank 0's grid
    needs resident, so rank 0 waited out the timeout on its own row count too, and named rank 0 (2026-11-29, v4,
    one H200)."""
    import io

    import torch.distributed as dist

    from reference import generate_input

    data = generate_input(**spec, rank=rank, world_size=world_size)
    module.custom_kernel(data)
    _sync(rank)
    dist.barrier(group=host_group)
    if rank == 0:
        said = io.StringIO()
        with contextlib.redirect_stderr(said):
            started = time.monotonic()
            module.custom_kernel(data)
            _sync(rank)
            elapsed = time.monotonic() - started
            time.sleep(0.5)  # the report thread polls every 20 ms
        dist.barrier(group=host_group)
        return elapsed, said.getvalue()
    dist.barrier(group=host_group)  # held here, on the host, until rank 0 has given up
    return 0.0, ""


def _phases_in_order(records, phases) -> bool:
    """Per (block, warp), phases ordered by their first start come in TRACE_PHASES order: a tuple that names the
    device enum's values in another order puts a later phase before an earlier one somewhere."""
    first: dict = {}
    for phase, where, start, _ in records.tolist():
        key = (where, phase)
        first[key] = min(first.get(key, start), start)
    by_warp: dict = {}
    for (where, phase), start in first.items():
        by_warp.setdefault(where, []).append((start, phase))
    return all([phase for _, phase in sorted(seen)] == sorted(phase for _, phase in seen) for seen in by_warp.values())


def _trace_build_matches(timed, rank, world_size, version, spec):
    import torch

    from reference import generate_input

    traced = _load(version, f"{version}_traced", trace=True)
    data = generate_input(**spec, rank=rank, world_size=world_size)
    expected = timed.custom_kernel(data).clone()
    outputs = [traced.custom_kernel(data) for _ in range(3)]
    traced.trace_take()
    traced.custom_kernel(data)
    records = traced.trace_take()
    named = sorted({traced.TRACE_PHASES[int(p)] for p in records[:, 0].tolist()})  # plain data: no set crosses
    return all(torch.equal(out, expected) for out in outputs), named, _phases_in_order(records, traced.TRACE_PHASES)


def _free_running(module, rank, world_size, spec) -> tuple:
    """Every rank keeps its tokens' rows at home (rank 0 one token, the others all they may have), so no rank sends
    another a row and their calls meet only through the range words; each rank then queues FREE_RUNNING_CALLS calls
    back to back with no barrier between them. Rank 0, with the least work, runs a call ahead of the others, and the
    range word it stores for its next call must not take the place of the one a peer has not read yet (v7-v11 keep
    one word and give up here under Triton's interpreter, tools/interpret_ranks.py; v12 keeps them by call parity).
    Returns (the last output's check, its message, seconds): a wait that gave up took SPIN_TIMEOUT_S."""
    import torch.distributed as dist

    from reference import check_implementation, generate_input

    data = keep_rows_home(generate_input(**spec, rank=rank, world_size=world_size))
    module.custom_kernel(data)
    _sync(rank)
    dist.barrier()
    started = time.monotonic()
    for _ in range(FREE_RUNNING_CALLS):
        output = module.custom_kernel(data)
    _sync(rank)
    elapsed = time.monotonic() - started
    ok, message = check_implementation(data, output.clone())
    return ok, message, elapsed


SPIN_TIMEOUT_S = 2
TRACE_SPEC = dict(num_experts=256, experts_per_token=8, hidden_dim=7168, max_num_tokens=128, seed=11)
GIVE_UP_SPEC = dict(num_experts=8, experts_per_token=2, hidden_dim=256, max_num_tokens=8, seed=3)
FREE_RUNNING_SPEC = dict(num_experts=8, experts_per_token=2, hidden_dim=2048, max_num_tokens=128, seed=5)
FREE_RUNNING_CALLS = 200


def _every_trace_then_give_up(rank, world_size) -> dict:
    """One group of 2 for every P2P version's trace build and then its give-up (the give-up last: it leaves that
    version's call unfinished); the newest also runs free (_free_running) between the two. The spin timeout is read
    at import, so it is set before the first instance loads; every timed instance loads before the first trace build
    (whose switch stays on in this process). A barrier brings both ranks to the next version together; a version's
    failure ends the group (VersionFailed)."""
    import torch.distributed as dist

    os.environ["A2A_SPIN_TIMEOUT_S"] = str(SPIN_TIMEOUT_S)
    found = {version: {"trace": None, "free_running": None, "give_up": None} for version in P2P_VERSIONS}
    timed = {}
    host_group = dist.new_group(backend="gloo")
    for version in P2P_VERSIONS:
        with _ends_the_group(version, rank):
            timed[version] = _load(version, f"{version}_timed")
    for version in P2P_VERSIONS:
        dist.barrier()
        with _ends_the_group(version, rank):
            found[version]["trace"] = _trace_build_matches(timed[version], rank, world_size, version, TRACE_SPEC)
            if version == P2P_VERSIONS[-1]:
                found[version]["free_running"] = _free_running(timed[version], rank, world_size, FREE_RUNNING_SPEC)
            found[version]["give_up"] = _peer_never_comes(timed[version], rank, world_size, GIVE_UP_SPEC, host_group)
    return found


def _at_2(version: str) -> list:
    """Both ranks' entries for `version` from the one group of 2 (the launch's error fails every test reading it)."""
    return [found[version] for found in _launched_once(_every_trace_then_give_up, 2)]


@pytest.mark.parametrize("version", P2P_VERSIONS)
def test_spin_wait_gives_up_and_says_what_it_waited_for(version):
    """Rank 0's kernels give up after the 2 s spin timeout instead of hanging, and rank 0 says what it waited for."""
    elapsed, said = _at_2(version)[0]["give_up"]
    assert SPIN_TIMEOUT_S <= elapsed < SPIN_TIMEOUT_S + 3, elapsed
    assert (f"[a2a {version}] rank 0: gave up after {SPIN_TIMEOUT_S * 1000} ms waiting for the row count from "
            "rank 1") in said, said


@pytest.mark.parametrize("version", P2P_VERSIONS)
def test_trace_build_is_bit_identical_and_names_its_phases_in_order(version):
    traced = [entry["trace"] for entry in _at_2(version)]
    module_phases = _load_phases(version)
    assert all(same for same, _, _ in traced)
    assert all(set(named) == set(module_phases) for _, named, _ in traced), traced
    assert all(ordered for _, _, ordered in traced)


def test_the_newest_survives_calls_run_free_between_ranks_that_send_each_other_nothing():
    found = [entry["free_running"] for entry in _at_2(P2P_VERSIONS[-1])]
    assert all(ok for ok, _, _ in found), [message for _, message, _ in found]
    assert all(elapsed < SPIN_TIMEOUT_S for _, _, elapsed in found), found  # no wait gave up


def _load_phases(version):
    import ast

    for node in ast.parse(resolve_version(version).read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "TRACE_PHASES" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("no TRACE_PHASES")


# --------------------------------------------------------------------------------------------------------------
# The instrument
# --------------------------------------------------------------------------------------------------------------


def test_trace_writes_the_json_the_picture_and_the_table(tmp_path):
    import gzip
    import json

    from a2a import timeline

    (folder,) = timeline.trace_version(make_plan("v3", "benchmarks:0", 2, "nccl"), 4, tmp_path)
    trace = json.loads(gzip.decompress((folder / "trace.json.gz").read_bytes()))
    assert {e["pid"] for e in trace["traceEvents"] if e["ph"] == "X"} == {0, 1}
    assert set(trace["otherData"]["clock_alignment"]) == {"rank 0", "rank 1"}
    assert (folder / "timeline.png").stat().st_size > 10_000
    text = (folder / "phases.md").read_text()
    assert "| dispatch_recv / wait_counts" in text
    # the timed build ran beside the trace build: both builds' times, one process (a2a.plan.load_version)
    line = next(line for line in text.splitlines() if line.startswith("The probes' own cost"))
    timed, traced = (float(part.split(" µs")[0].split("-")[0]) for part in
                     line.split("takes ")[1].split(" against the trace build's "))
    assert 0 < timed and 0 < traced, line


@gpu_per_rank(2, "the handshake's flag round between GPUs")
def test_with_peers_a_traced_call_starts_when_every_rank_does(tmp_path):
    """With a GPU per rank, the tracer queues each call behind a sleep and the handshake, as the held step: the
    ranks' start markers are within a few µs of each other on rank 0's clock (unaligned, they are as far apart as
    the ranks' hosts reach their calls)."""
    from a2a import timeline

    newest = VERSIONS[-1]
    (folder,) = timeline.trace_version(make_plan(newest, "benchmarks:0", 2, "nccl"), 8, tmp_path)
    text = (folder / "phases.md").read_text()
    line = next(line for line in text.splitlines() if line.startswith("Start skew"))
    assert "each call queued behind a sleep and the handshake's flag round" in line, line
    assert float(line.split("median): ")[1].split(" µs")[0]) < 10.0, line
    assert any(line.startswith("The probes' own cost") for line in text.splitlines()), text


@gpu_per_rank(2, "a timing of this machine's links")
def test_sol_measures_this_machine():
    from a2a import sol
    from a2a.plan import run_meta

    figures = sol.measure(2, run_meta("nccl", 2, "sol"))
    assert 0 < figures["launch_us"] < 50 and 0 < figures["one_way_latency_us"] < 50
    assert 10 < figures["a2a_store_gbps"] < 2000 and 10 < figures["pair_store_gbps"] < 2000
    assert 100 < figures["local_copy_gbps"] < 20000


def _clock(versions: list, cases: str, world_size: int, rounds: int, extra: tuple = (), order: tuple = ()):
    import math

    from a2a import clock

    plan = make_plan(versions, cases, world_size, "nccl", gpu_only="keep") if versions else \
        make_plan("v1", cases, world_size, "nccl")
    entries = [clock.Entry(path.stem.split("_")[0], "version", str(path)) for path in plan.versions[:len(versions)]]
    entries += list(extra)
    settings = clock.Settings(steps=6, min_rounds=rounds, max_rounds=rounds, time_cap_s=math.inf, targets=(),
                              order=order)
    return clock.time_entries(plan, entries, settings, **QUIET)


@gpu_per_rank(2, "a timing, and NVSHMEM's own GPU binding")
def test_anchors_time_a_case():
    import torch.distributed._symmetric_memory as symm_mem

    from a2a import anchors, clock

    names = [n for n in anchors.ANCHORS if not (n.startswith("nvshmem") and hasattr(symm_mem, "is_nvshmem_available")
                                                and not symm_mem.is_nvshmem_available())]
    run = _clock([], "benchmarks:1", 2, 2, extra=[clock.Entry(n, anchors.KINDS.get(n, "anchor"), call=n)
                                                   for n in names])
    for name in names:
        assert name not in run.failed and run.entry_intervals(name)["call"].center > 0, (name, run.failed)


@gpu_per_rank(2, "the ranks' calls starting together is a claim about peers on their own GPUs")
def test_with_peers_a_held_call_starts_when_every_rank_does():
    """eval.Hold.align: with peers a flag round after each rank's sleep starts every rank's held call together, so
    the handshake's held time at world size 2 is its own (a flag round), not its wait for a late peer: within 3x of
    its time at world size 1 (unaligned it was 110.8 µs at world size 4 against 6.6 at 1, H200, 2026-11-27)."""
    from a2a import anchors, clock

    held = {}
    for world_size in (1, 2):
        run = _clock([], "benchmarks:0", world_size, 2, extra=[clock.Entry("handshake", anchors.KINDS["handshake"],
                                                                           call="handshake")])
        assert not run.failed, run.failed
        held[world_size] = run.entry_intervals("handshake")["held"].center
    assert 0 < held[2] < 3 * held[1], held


@at_problem_size
def test_the_floors_time_a_case_at_one_rank_and_at_the_problems_size():
    """The empty submission and the handshake need no peer on its own GPU: they time at world size 1 and among 8
    ranks (sharing the GPUs where there are fewer), every handshake call hearing from every rank."""
    from a2a import anchors, clock

    for world_size in (1, PROBLEM_WS):
        run = _clock([], "benchmarks:1", world_size, 2, extra=[clock.Entry(n, anchors.KINDS[n], call=n)
                                                               for n in anchors.FLOORS])
        assert not run.failed, run.failed
        for name in anchors.FLOORS:
            found = run.entry_intervals(name)
            assert found["call"].center > 0 and found["held"].center > 0, (world_size, name, found)


def test_the_clock_does_not_depend_on_the_entries_order():
    """A,B against B,A (issue #37): each entry's held device time and call time in one order lies within its
    interval in the other (on the smallest shape, where a call is mostly its fixed cost and an order's warm-up
    would show most)."""
    runs = [_clock(["v7", "v8"], "benchmarks:0", 1, 4, order=order) for order in (("v7", "v8"), ("v8", "v7"))]
    for run in runs:
        assert not run.failed and not run.throttled, (run.failed, run.throttled)
    for name in ("v7", "v8"):
        for metric in ("held", "call"):
            first, second = (run.entry_intervals(name)[metric] for run in runs)
            assert first.low <= second.center <= first.high or second.low <= first.center <= second.high, \
                (name, metric, first, second)


def test_a_call_that_synchronizes_inside_is_timed_on_an_idle_stream_and_named():
    """v1 waits for its own work (.tolist()): no sleep can hold its stream, so its held figure is its call time and
    the run names it; v8 is held: its held figure is measured apart and is no more than its call's (on an H200 at
    world size 1 the two were within 0.2%, 2026-11-29, so a strict "less" was a coin toss)."""
    run = _clock(["v1", "v8"], "benchmarks:0", 1, 2)
    assert run.sync_inside == {"v1"} and not run.failed
    v1, v8 = run.entry_intervals("v1"), run.entry_intervals("v8")
    assert v1["held"].center == v1["call"].center
    assert v8["held"].center != v8["call"].center and v8["held"].center <= v8["call"].high, (v8["held"], v8["call"])


def test_step_anatomy_runs_on_gpus(tmp_path):
    """The tool's own gather goes through each rank's GPU (the current device stays cuda:0, as on the runner)."""
    result = subprocess.run([sys.executable, "-m", "tools.step_anatomy", "v1", "--cases", "benchmarks:0",
                             "--world-size", "2", "--iterations", "3", "--out", str(tmp_path)], cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "host" in result.stdout


@gpu_per_rank(2, "a claim about timing noise")
def test_diff_of_a_version_against_itself_on_gpus():
    from a2a import diffing

    rows = diffing.time_versions(make_plan(["v3", "v3"], "benchmarks:0,4", 2, "nccl"), rounds=6, steps=6)
    owners = diffing.TIMINGS[0][0]
    # The owner's step is judged on both shapes; the rank's own figures are shown unjudged (red team 52).
    assert [row["verdict"] for row in rows if row["timing"] == owners] == ["no difference within noise"] * 2, rows
    assert {row["verdict"] for row in rows if row["timing"] != owners} == {diffing.RANKS_WORD}, rows
