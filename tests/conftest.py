"""Test setup: the bundle's modules (task, reference, utils) import the way they do in a leaderboard bundle."""
import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

import boundary

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from a2a.plan import ROOT, use_bundle_modules  # noqa: E402
from eval import DEFAULT_MASTER_PORT, MASTER_PORT_ENV, environ_with  # noqa: E402

use_bundle_modules()
V1 = ROOT / "submissions" / "all2all" / "v1_torch_sort.py"

# pytest-xdist's workers run side by side, and a protocol face binds a fixed rendezvous port: each worker past the
# first moves the faces it starts to a port of its own (eval.MASTER_PORT_ENV, inherited by every child), 100 apart
# since a pool moves one port up after a watchdog kill. The first worker, and a run without xdist, keep the runner's.
WORKER_INDEX = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
PROTOCOL_PORT = DEFAULT_MASTER_PORT + 100 * WORKER_INDEX
if WORKER_INDEX:
    os.environ[MASTER_PORT_ENV] = str(PROTOCOL_PORT)


def pytest_configure(config):
    """The repository's own modules compiled into __pycache__ (ignored by git) once, before any test or worker
    starts: every run a test starts is three processes or more (a face, its protocol child, the ranks), which import
    eval, judge, boundary, wire and a2a, and where PYTHONDONTWRITEBYTECODE is set (CI's machines set it) each compiled
    them from source again (0.24 of a human-face run's 6.5 CPU seconds on 2 cores, six runs each way, interleaved).
    py_compile writes whatever that setting says; a file already compiled is left as it is."""
    config.a2a_started = time.monotonic()
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: the controller has done it
        return
    import compileall

    for path in sorted(ROOT.glob("*.py")):
        compileall.compile_file(path, quiet=2)
    for folder in ("a2a", "problems", "reference", "submissions", "tools"):
        compileall.compile_dir(ROOT / folder, quiet=2)


# A fixed pure-Python loop in a fresh process: the machine's speed at the hour, beside the suite's CPU and time. The
# suite is bound by its CPU (1392 CPU s, the 2 cores 189% busy, 2026-11-30), and this machine's speed moved within
# the hour: the loop took 1.25-1.62 CPU s while the suite took 732 s, and 1.64-2.23 around a CI run of 956-980 s.
HOST_LOOP = """
import time
started, total = time.process_time(), 0
for i in range(10_000_000):
    total += i * i
print(time.process_time() - started)
"""


def host_loop_s() -> float:
    """CPU seconds of HOST_LOOP in a fresh interpreter."""
    return float(subprocess.run([sys.executable, "-c", HOST_LOOP], capture_output=True, text=True, check=True,
                                timeout=300).stdout)


def suite_cpu_line(cpu_s: float, wall_s: float, cores: int, loop_s: float) -> str:
    return (f"the suite: {cpu_s:.0f} CPU s in {wall_s:.0f} s, {100 * cpu_s / max(wall_s, 1e-9):.0f}% busy of "
            f"{cores} core(s); the host: a fixed pure-Python loop took {loop_s:.2f} CPU s after it (HOST_LOOP)")


def pytest_terminal_summary(terminalreporter, config):
    """The suite's own CPU (this process and its reaped workers and commands) beside its time and the host's speed
    then: whether a slow run was the suite or the machine."""
    if hasattr(config, "workerinput"):
        return
    import resource

    used = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    cpu_s, wall_s = sum(u.ru_utime + u.ru_stime for u in used), time.monotonic() - config.a2a_started
    terminalreporter.write_line(suite_cpu_line(cpu_s, wall_s, len(os.sched_getaffinity(0)), host_loop_s()))


def pytest_xdist_auto_num_workers(config) -> int:
    """Workers for `-n auto` (make test's default): three on a machine of two cores or more without a GPU, else none
    (the tests run in the pytest process). Much of a test is waiting (deadlines, a rank's hang, a planted sleep): on
    2 cores the suite of 2026-11-29 took 605-647 s with two workers, the cores 140% busy, and 481 s with three, 186%
    busy, every test passing (WORKLOG, thirty-second session; three had failed a timing test on 2026-11-25, when
    the suite was three times as long). With GPUs the CPU tests would run on them beside the GPU suite, whose timing
    claims want them to itself."""
    import eval as core

    return 3 if len(os.sched_getaffinity(0)) >= 2 and not core.machine_gpus() else 0


def every_time(params, *chosen) -> list:
    """A parametrize list where only `chosen` run on every change (`make test`, CI); the other entries carry the
    `full` mark and run with `make test-full`. An attack or a claim runs every time on the face and mode named, and
    on every other in the full matrix: on 2 cores each run costs about 8 s of CPU, most of it three torch imports."""
    missing = [entry for entry in chosen if entry not in params]
    if missing:
        raise ValueError(f"every_time: {missing} not among {params}")
    return [entry if entry in chosen else pytest.param(*(entry if isinstance(entry, tuple) else (entry,)),
                                                       marks=pytest.mark.full) for entry in params]


DEVICE_CHECK_NICE = 10  # a tenth of a busy test's weight on a core (19, a seventieth, would starve it)


def run_device_check(*files) -> subprocess.CompletedProcess:
    """make check-device's tool over `files` (its default files, host C++ check included, without any; named files
    are the tests' planted device-code errors, whose host check is left out and whose Triton builds take the largest
    shape alone), at a low CPU priority: its compiles
    (the whole check keeps both cores busy for a minute and a half on 2 cores) take what the tests beside it leave
    idle instead of slowing their runs, whose limits cover their ranks' start. Its own session gets it a scheduling
    group of its own where the kernel groups by session (autogroup), as the protocol faces' sessions do; a nice value
    alone weighs only within the group. Its command sweeps for orphans as it starts (a2a.cli.run_cli) and never
    again: it holds a test's share of the machine (_turn) until it has printed its first line, so the tests marked
    `beside_alone` that run it go on beside an `alone` test. Turns do not nest: only a test that takes none of its
    own (`beside_alone`) may call it."""
    import select
    import tempfile

    with tempfile.TemporaryFile() as stderr:
        with _turn(alone=False):
            # the suite's whole check builds every shape for gfx942 alone (MI300X, the problem's machine), whose
            # Triton front end and lowering gfx950 shares: NVIDIA's shapes run in the GPU suite, and gfx950's
            # largest shape here holds its own ISA (make check-device builds every shape on every target)
            planted = ["--device-only", "--largest-shape"] if files else ["--every-shape-on", "gfx942"]
            process = subprocess.Popen([sys.executable, "-m", "tools.check_device", *planted, *map(str, files)],
                                       cwd=ROOT, stdout=subprocess.PIPE, stderr=stderr, bufsize=0,
                                       start_new_session=True)
            with contextlib.suppress(OSError):  # before its compilers start; without autogroups, the nice value
                os.setpriority(os.PRIO_PROCESS, process.pid, DEVICE_CHECK_NICE)
                Path(f"/proc/{process.pid}/autogroup").write_text(str(DEVICE_CHECK_NICE))
            first, deadline = b"", time.monotonic() + 300
            while not first.endswith(b"\n") and time.monotonic() < deadline:
                if select.select([process.stdout], [], [], 1.0)[0]:
                    byte = os.read(process.stdout.fileno(), 1)
                    if not byte:  # it ended without a line
                        break
                    first += byte
        try:
            rest, _ = process.communicate(timeout=900)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)  # its compilers with it: the session is its own
            process.communicate()
            raise
        stderr.seek(0)
        return subprocess.CompletedProcess(process.args, process.returncode, (first + rest).decode(),
                                           stderr.read().decode())


@pytest.fixture(scope="session")
def device_check(_turnstile_folder) -> subprocess.CompletedProcess:
    """The check over its default files, run once per test process: tests/test_check_device.py reads its verdict,
    tests/test_memory_model.py the memory-model counts it printed for the repository's own files (both modules are
    one xdist group, so one process runs it)."""
    return run_device_check()


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


requires_gpu = pytest.mark.skipif(gpu_count() < 1, reason="needs a CUDA GPU; this machine has none")


def run_eval(*args: str, timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    """Runs the human face of eval.py in a child process."""
    return subprocess.run([sys.executable, str(ROOT / "eval.py"), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env=environ_with(env))


def run_bundle(bundle: Path, mode: str, test_file: str, extra_env: dict | None = None) -> tuple[int, str, str]:
    """Runs a staged bundle's eval.py as the leaderboard runner does (gloo, 2 ranks, the fixed rendezvous port, no
    human-face extras unless extra_env asks); returns (exit code, POPCORN output, stderr)."""
    from a2a.harness import run_protocol

    env = environ_with({"POPCORN_GPUS": "2", "A2A_BACKEND": "gloo", **(extra_env or {})})
    for key in ("A2A_EXTRA", "A2A_RANK_PREFIX", "A2A_RENDEZVOUS"):
        if key not in (extra_env or {}):
            env.pop(key, None)
    return run_protocol(bundle, mode, test_file, env)


def interpret_ranks(*args: str) -> tuple:
    """tools/interpret_ranks.py with `args` (a version first): (exit code, one dict a rank, stderr)."""
    import json

    done = subprocess.run([sys.executable, "-m", "tools.interpret_ranks", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return done.returncode, [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")], done.stderr


def v1_kernel_source(name: str = "_v1_kernel") -> str:
    """v1's code with its custom_kernel renamed, for test submissions that must compute the right answer."""
    return V1.read_text().replace("def custom_kernel(", f"def {name}(")


def profile_column(report: str, column: str) -> tuple[list[float], str]:
    """One column of profile mode's report (eval.profile_table) as numbers, and its closing line. The table's rows
    are joined by ' | ' and the closing line follows a newline; an operator's name may hold spaces, so a column is
    counted from the right."""
    table, closing = report.rsplit("\n", 1)
    header, _rule, *rows = table.split(" | ")
    from_right = header.split().index(column) - len(header.split())
    return [float(row.split()[from_right]) for row in rows], closing


def shared_folder(path: Path) -> Path:
    """A folder the ranks can write: they run as another uid when the harness is started as root (eval.Sandbox)."""
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o1777)
    return path


def saved_in(folder: Path) -> list:
    """What a command saved in `folder`, a test's tmp_path: its entries less the ranks' `marks` folder, which the
    suite makes there for every test (_reachable_tmp_path)."""
    return [path for path in folder.iterdir() if path.name != "marks"]


def reachable(folder: Path) -> Path:
    """`folder` (one of pytest's temporary folders), writable by the ranks' uid, with every folder above it
    searchable (pytest makes them private to this user)."""
    shared_folder(folder)
    base = folder.parent
    while base != base.parent and base.name != "tmp":
        if base.stat().st_uid == os.getuid():
            base.chmod(base.stat().st_mode | 0o055)
        base = base.parent
    return folder


_TURNSTILE: list = []  # this run's folder of alone.turnstile and alone.lock, under pytest-xdist (_turnstile_folder)


@pytest.fixture(scope="session", autouse=True)
def _turnstile_folder(tmp_path_factory):
    """Under pytest-xdist, the folder every worker of this run shares (its basetemp's parent) for `_turn`'s locks."""
    if "PYTEST_XDIST_WORKER" in os.environ:
        _TURNSTILE.append(tmp_path_factory.getbasetemp().parent)
    yield


@contextlib.contextmanager
def _turn(alone: bool):
    """Under pytest-xdist: `alone`, the machine to itself (no other worker holds a turn), else a share of it beside
    every other share. A waiting `alone` turn goes ahead of turns asked after it (the turnstile). Without xdist, or
    before the session's folder is known, a turn is always given."""
    if not _TURNSTILE:
        yield
        return
    import fcntl

    with open(_TURNSTILE[0] / "alone.turnstile", "a") as turnstile, open(_TURNSTILE[0] / "alone.lock", "a") as lock:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        fcntl.flock(lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        if not alone:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        yield  # both locks go with their files


@pytest.fixture(autouse=True)
def _alone_when_marked(request):
    """Under pytest-xdist, a test marked `alone` runs while no other worker runs a test. Every command starts with the
    orphan sweep (eval.sweep_orphans), which ends the processes and removes the files of any owner that is gone: run
    beside such a test, another worker's command could remove what the test must see gone without a later command,
    or what its own sweep must find. A waiting `alone` test goes ahead of tests that arrive after it (the
    turnstile). A test marked `beside_alone` (the device-code check's: its commands take their own turn,
    run_device_check, and it compiles little in its own process) takes none: it runs beside an `alone` test."""
    if request.node.get_closest_marker("beside_alone") is not None:
        yield
        return
    with _turn(alone=request.node.get_closest_marker("alone") is not None):
        yield


EARLY = ("alone", "waits", "loads")  # what goes first under pytest-xdist, in this order


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist, the tests that leave the machine idle go first, beside the device-code group's compiles
    (pytest-xdist hands the largest groups out first: the worker that does not hold the device-code group runs them
    while the other compiles, at a low priority, run_device_check): the `alone` tests (a machine to themselves but
    for the group's commands, their CPU mostly idle), then those marked `early("waits")` (they mostly wait out a
    limit, a watchdog or a hang), then `early("loads")` (the port churn, which keeps a core busy in the kernel and
    should run beside no timed claim). Each kind keeps its collected order; the rest follow as collected."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return

    def rank(item) -> int:
        early = item.get_closest_marker("early")
        kind = early.args[0] if early else "alone" if item.get_closest_marker("alone") else None
        return EARLY.index(kind) if kind else len(EARLY)

    items.sort(key=rank)


@pytest.fixture(autouse=True)
def _reachable_tmp_path(request, monkeypatch):
    """A test's tmp_path is readable by the ranks, and its `marks` folder the one place besides their run folders
    they may write (boundary.RANK_WRITABLE): every other mount is read-only to them, and the judge keeps nothing of
    its own there (its bundles, runs and logs lie beside it)."""
    if "tmp_path" in request.fixturenames:
        tmp_path = reachable(request.getfixturevalue("tmp_path"))
        monkeypatch.setenv("A2A_RANK_WRITABLE", str(shared_folder(tmp_path / "marks")))
    yield


@pytest.fixture
def bundle(tmp_path):
    """A staged bundle of v1; tests swap in their own submission.py where they need one."""
    result = run_eval("stage", "v1", str(tmp_path / "bundle"))
    assert result.returncode == 0, result.stderr
    return tmp_path / "bundle"


@pytest.fixture
def process_token():
    """A unique environment value: every process started under it carries it, so leftovers can be found."""
    return f"a2a-test-{uuid.uuid4().hex}"


def processes_with(token: str) -> list[int]:
    """Live (not zombie) processes whose environment holds `token`."""
    import eval as core

    found = []
    for pid, environ in boundary.other_processes():
        if token.encode() not in environ:
            continue
        try:
            state = boundary.process_stat(pid)[0]
        except OSError:
            continue
        if state != "Z":
            found.append(pid)
    return found


def wait_until_gone(token: str, seconds: float = 20.0) -> list[int]:
    """Waits for every process carrying `token` to end; returns those still alive after `seconds`."""
    deadline = time.monotonic() + seconds
    while (left := processes_with(token)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def start_hanging(command: list, cwd: Path, env: dict, marks: Path, timeout_s: float = 180) -> subprocess.Popen:
    """Starts `command` and returns once both ranks have touched their mark (they are inside a hanging call)."""
    process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + timeout_s
    while not all((marks / f"rank{r}").exists() for r in (0, 1)):
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "the ranks never reached custom_kernel"
        time.sleep(0.1)
    return process


def hanging_submission(touch_the_gpu: bool = False) -> str:
    """A submission that starts a child (`sleep 1000`), optionally works on its GPU, touches
    $A2A_TEST_MARKS/rank<r> and then hangs."""
    gpu = "    torch.ones(1 << 20, device=data[1].x.device).sum().item()\n" if touch_the_gpu else ""
    return ("import os\nimport subprocess\nimport time\nfrom pathlib import Path\n\nimport torch\n\n\n"
            "def custom_kernel(data):\n    subprocess.Popen(['sleep', '1000'])\n" + gpu +
            "    Path(os.environ['A2A_TEST_MARKS'], f'rank{data[2]}').touch()\n    time.sleep(3600)\n")


def hanging_human_face(folder: Path, token: str, body: str, world_size: int = 2) -> subprocess.Popen:
    """`python eval.py test` of a submission `body` that touches $A2A_TEST_MARKS/rank<r> and then hangs, on
    `world_size` ranks, under the process token; returns once ranks 0 and 1 are inside the call."""
    path = folder / "hangs.py"
    path.write_text(body)
    marks = shared_folder(folder / "marks")
    env = environ_with({"A2A_TEST_TOKEN": token, "A2A_TEST_MARKS": str(marks)})
    return start_hanging([sys.executable, str(ROOT / "eval.py"), "test", str(path), "--world-size", str(world_size),
                          "--cases", "tests:0", "--timeout", "600"], ROOT, env, marks)


def processes_marked(token: str) -> list[int]:
    """Live (not zombie) processes whose command line or environment holds `token`: what processes_with finds, and
    also a daemon that cleared its environment but carries the token in its command line."""
    import eval as core

    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            held = Path(f"/proc/{entry}/cmdline").read_bytes() + Path(f"/proc/{entry}/environ").read_bytes()
            if token.encode() in held and boundary.process_stat(int(entry))[0] != "Z":
                found.append(int(entry))
        except OSError:
            continue
    return found


def wait_until_unmarked(token: str, seconds: float = 20.0) -> list[int]:
    """Waits for every process marked with `token` (processes_marked) to end; returns those alive after `seconds`."""
    deadline = time.monotonic() + seconds
    while (left := processes_marked(token)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def libm_copy(path: Path) -> Path:
    """A real library, harmless to preload: this machine's own libm (found where it is mapped), copied to `path`."""
    ctypes.CDLL("libm.so.6")
    libm = next(line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines()
                if Path(line.split()[-1]).name.startswith(("libm.so", "libm-")))
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(libm, path)
    return path
