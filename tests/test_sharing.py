"""More ranks than GPUs, planned on a CPU: where each rank runs, the SM shares, the refusals (no MPS, no NCCL that
allows it, A2A_SHARE without a daemon), and the MPS daemon's lifetime, with a stand-in for nvidia-cuda-mps-control
that behaves like it (a foreground daemon with a control file, a server that ignores `quit`, client commands)."""
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import boundary
import eval as core
from a2a import plan as planning
from a2a import sharing
from tests.conftest import run_bundle


def test_ranks_go_round_robin_over_the_gpus():
    on_one = sharing.Placement(8, 1, 9)
    assert on_one.shared and on_one.ranks_per_gpu == 8 and {on_one.device_index(r) for r in range(8)} == {0}
    on_three = sharing.Placement(8, 3, 24)
    assert [on_three.device_index(r) for r in range(8)] == [0, 1, 2, 0, 1, 2, 0, 1] and on_three.ranks_per_gpu == 3
    one_each = sharing.placement(2, 8, "nccl")
    assert not one_each.shared and one_each.gpus_used == 2 and one_each.sm_percent is None
    assert not sharing.placement(8, 1, "gloo").shared and sharing.placement(8, 1, "gloo").gpus == 0


def test_the_sm_share_leaves_headroom_and_shrinks_with_the_ranks(monkeypatch):
    monkeypatch.delenv("A2A_SM_PERCENT", raising=False)
    shares = {n: sharing.sm_share_percent(n) for n in range(2, 17)}
    assert all(n * p <= 100 for n, p in shares.items()), shares  # never more than the GPU
    assert all(shares[n] >= shares[n + 1] for n in range(2, 16)), shares
    assert all(p >= sharing.MIN_SM_PERCENT for n, p in shares.items() if n <= 8), shares  # NCCL's floor
    assert shares[4] * 4 <= 100 * sharing.SHARED_SM_FRACTION  # headroom where the floor does not bind
    assert (shares[2], shares[4], shares[8]) == (32, 16, 8)  # what the measured points chose (WORKLOG)
    assert sharing.placement(8, 1, "nccl").sm_percent == shares[8]
    assert sharing.placement(8, 2, "nccl").sm_percent == shares[4]  # 4 ranks on each of 2 GPUs


def test_nccl_channels_fit_the_share():
    assert [sharing.nccl_channels(n) for n in (1, 2, 10, 14, 22, 32, 66)] == [1, 1, 4, 4, 8, 16, 32]


def test_the_sm_share_can_be_set_and_is_checked(monkeypatch):
    monkeypatch.setenv("A2A_SM_PERCENT", "12")
    assert sharing.placement(8, 1, "nccl").sm_percent == 12
    monkeypatch.setenv("A2A_SM_PERCENT", "25")
    assert sharing.placement(8, 2, "nccl").sm_percent == 25  # 4 ranks per GPU: a whole GPU
    monkeypatch.setenv("A2A_SM_PERCENT", "13")  # 8 ranks at 13% ask for 104% of the GPU
    with pytest.raises(core.UserError, match="8 ranks 104% of one GPU: at most 12% each"):
        sharing.placement(8, 1, "nccl")
    for bad in ("0", "101", "ten", "-5", "²", "9" * 5000):  # red team 69: isdigit() takes '²', int() neither
        monkeypatch.setenv("A2A_SM_PERCENT", bad)
        with pytest.raises(core.UserError, match="A2A_SM_PERCENT must be a whole percent"):
            sharing.placement(8, 1, "nccl")


def test_every_output_names_where_the_ranks_ran():
    shared = sharing.Placement(8, 1, 9)
    assert shared.describe() == "8 ranks on 1 GPU, shared through MPS (9% of its SMs each)"
    assert shared.slug() == "ws8-on-1gpu"
    assert sharing.Placement(2, 8).describe() == "2 ranks on 2 GPUs, one each" and sharing.Placement(2, 8).slug() == "ws2"
    assert sharing.Placement(2, 0).describe() == "2 ranks on the CPU (gloo)"
    meta = {"date": "2026-11-23", "device": "NVIDIA H100", "world_size": 8, "ranks": shared.slug(), "mode": "test",
            "commit": "abc"}
    assert planning.run_folder(Path("results"), meta).name == "2026-11-23_nvidia-h100_ws8-on-1gpu_test_abc"


def test_a_run_on_a_cpu_says_so_in_its_plan():
    plan = planning.make_plan("v1", "tests:0", 2, "gloo")
    assert plan.meta["placement"] == "2 ranks on the CPU (gloo)" and not plan.meta["shared_gpus"]


def test_no_mps_is_one_line_before_any_work(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(planning, "machine_gpus", lambda: 1)
    with pytest.raises(core.UserError, match="CUDA MPS is not installed"):
        planning.make_plan("v1", "tests:0", 8, "nccl")
    with pytest.raises(core.UserError, match="CUDA MPS is not installed"):
        sharing.MpsDaemon()


def test_more_ranks_than_gpus_is_refused_without_sharing():
    case = core.TestCase(args={"num_experts": 8, "experts_per_token": 2, "hidden_dim": 16, "max_num_tokens": 4,
                               "seed": 1, "world_size": 8}, spec="x")
    with pytest.raises(core.UserError, match="needs 8 ranks but this machine has 1 GPU"):
        core.validate_cases([case], 8, "nccl", 1)
    core.validate_cases([case], 8, "nccl", 1, shared=True)
    with pytest.raises(core.UserError, match="has 0 GPU"):  # sharing needs a GPU to share
        core.validate_cases([case], 8, "nccl", 0, shared=True)


@pytest.mark.parametrize("share, pipe, message", [
    ("mps", "/nonexistent/a2a-pipe", "no MPS control daemon listens in /nonexistent/a2a-pipe"),
    ("timeslice", "/tmp", "A2A_SHARE must be 'mps'"),
])
def test_the_protocol_core_refuses_sharing_it_cannot_have(bundle, share, pipe, message):
    code, output, stderr = run_bundle(bundle, "test", "tests.txt",
                                      {"A2A_SHARE": share, "CUDA_MPS_PIPE_DIRECTORY": pipe})
    assert code == core.EXIT_BAD_INPUT and output == "", (code, output, stderr)
    assert message in stderr and "Traceback" not in stderr, stderr


def test_nccl_versions_read_as_nccl_writes_them():
    assert core.nccl_version_tuple(22809) == (2, 28, 9) and core.nccl_version_tuple(23007) == (2, 30, 7)
    assert core.nccl_version_tuple(2708) == (2, 7, 8)  # before 2.9 NCCL counted in thousands
    assert core.version_text((2, 30, 7)) == "2.30.7"


def _fake_nccl(folder: Path, code: int) -> Path:
    """A shared library that answers ncclGetVersion with `code`, as libnccl.so.2 does."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build a stand-in NCCL")
    source = folder / f"nccl{code}.c"
    source.write_text(f"int ncclGetVersion(int* version) {{ *version = {code}; return 0; }}\n")
    library = folder / f"libnccl{code}.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    return library


def test_the_ranks_get_an_nccl_that_allows_sharing(tmp_path, monkeypatch):
    old, new = _fake_nccl(tmp_path, 22809), _fake_nccl(tmp_path, 23007)
    monkeypatch.setattr(sharing, "torch_nccl_library", lambda: old)
    monkeypatch.setattr(sharing, "BUILT_NCCL", tmp_path / "not-built" / "libnccl.so.2")
    monkeypatch.delenv("A2A_NCCL_LIB", raising=False)
    with pytest.raises(core.UserError, match=r"need NCCL 2\.30\.0 or later and torch loads NCCL 2\.28\.9 .*make nccl"):
        sharing.nccl_for_sharing()
    monkeypatch.setenv("A2A_NCCL_LIB", str(new))
    assert sharing.nccl_for_sharing() == sharing.Nccl((2, 30, 7), new.resolve(), preload=True)
    monkeypatch.setenv("A2A_NCCL_LIB", str(old))
    with pytest.raises(core.UserError, match=r"is NCCL 2\.28\.9; several ranks on one GPU need 2\.30\.0"):
        sharing.nccl_for_sharing()
    monkeypatch.setenv("A2A_NCCL_LIB", str(tmp_path / "missing.so"))
    with pytest.raises(core.UserError, match="no such file"):
        sharing.nccl_for_sharing()
    monkeypatch.setattr(sharing, "torch_nccl_library", lambda: new)  # torch's own is new enough: no preload
    assert sharing.nccl_for_sharing().preload is False


def test_an_nccl_that_allows_sharing_is_got_once_or_one_line_says_why_not(tmp_path, monkeypatch):
    """The two commands need no third: where only torch's old NCCL is found, the harness gets one (the wheel where
    a registry answers, else the source built), caches it under build/, and says in one line why when it cannot."""
    old, new = _fake_nccl(tmp_path, 22809), _fake_nccl(tmp_path, 23007)
    wheel = tmp_path / "wheel" / "nvidia" / "nccl" / "lib" / "libnccl.so.2"
    monkeypatch.setattr(sharing, "torch_nccl_library", lambda: old)
    monkeypatch.setattr(sharing, "BUILT_NCCL", tmp_path / "not-built" / "libnccl.so.2")
    monkeypatch.setattr(sharing, "WHEEL_NCCL", wheel)
    monkeypatch.delenv("A2A_NCCL_LIB", raising=False)
    tried, said = [], []
    monkeypatch.setattr(sharing, "_pip_wheel", lambda flavour: tried.append("pip") or "pip: no registry")
    monkeypatch.setattr(sharing, "_build_source", lambda: tried.append("build") or "build: no source")
    why = sharing.obtain_nccl(said.append)
    assert tried == ["pip", "build"] and len(said) == 1 and "getting one, once" in said[0]
    assert "\n" not in why and "pip: no registry; build: no source" in why and "NCCL_SRC=" in why

    def install():  # the registry answers: the wheel's library lands where the harness looks
        wheel.parent.mkdir(parents=True)
        shutil.copy(new, wheel)
        return "pip: done"

    tried.clear()
    monkeypatch.setattr(sharing, "_pip_wheel", lambda flavour: install())
    assert sharing.obtain_nccl(said.append) is None and tried == []
    assert sharing.nccl_for_sharing() == sharing.Nccl((2, 30, 7), wheel.resolve(), preload=True)
    said.clear()
    assert sharing.obtain_nccl(said.append) is None and said == []  # cached: nothing to get, nothing said



def test_a_library_that_does_not_answer_is_named_with_why_and_asked_again(tmp_path, monkeypatch):
    """A built library that fails its version ask is not replaced by a 5-minute fetch: one line names it and what the
    ask said; and the failure is not kept, so the next ask (the library answers now) finds it."""
    old, new = _fake_nccl(tmp_path, 22809), _fake_nccl(tmp_path, 23007)
    built = tmp_path / "built" / "libnccl.so.2"
    built.parent.mkdir()
    built.write_text("not a library")
    monkeypatch.setattr(sharing, "torch_nccl_library", lambda: old)
    monkeypatch.setattr(sharing, "BUILT_NCCL", built)
    monkeypatch.setattr(sharing, "WHEEL_NCCL", tmp_path / "no-wheel" / "libnccl.so.2")
    monkeypatch.delenv("A2A_NCCL_LIB", raising=False)
    tried = []
    monkeypatch.setattr(sharing, "_pip_wheel", lambda flavour: tried.append("pip") or "pip: no registry")
    monkeypatch.setattr(sharing, "_build_source", lambda: tried.append("build") or "build: no source")
    why = sharing.obtain_nccl()
    assert tried == [] and "\n" not in why, (tried, why)
    assert f"{built} is not an NCCL library that answers here (ncclGetVersion: exit 1: OSError:" in why, why
    shutil.copy(new, built)
    assert sharing.obtain_nccl() is None and sharing.nccl_for_sharing().version == (2, 30, 7)

# A stand-in for nvidia-cuda-mps-control: `-f` is the daemon (a control file in the pipe folder, a `server` child
# that ignores quit, as a wedged one would); otherwise a client command on stdin.
FAKE_CONTROL = '''
import os, subprocess, sys, time
pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
control = os.path.join(pipe, "control")
if sys.argv[1:] == ["-f"]:
    if os.environ.get("FAKE_MPS_MARK"):  # a server's file in /dev/shm, as MPS's own keep theirs
        open(os.path.join("/dev/shm", os.environ["FAKE_MPS_MARK"]), "w").close()
    if os.environ.get("FAKE_MPS_LOG"):  # what a server that cannot start writes in the control log
        with open(os.path.join(os.environ["CUDA_MPS_LOG_DIRECTORY"], "control.log"), "w") as log:
            log.write(os.environ["FAKE_MPS_LOG"].replace("|", "\\n"))
    open(control, "w").close()
    subprocess.Popen(["sleep", "1000"])
    while not os.path.exists(os.path.join(pipe, "quit")):
        time.sleep(0.05)
    os.remove(control)
    sys.exit(0)
command = sys.stdin.read().strip()
if not os.path.exists(control):
    print("Cannot find MPS control daemon process")
    sys.exit(1)
if command == "quit":
    open(os.path.join(pipe, "quit"), "w").close()
print("")
'''


@pytest.fixture
def fake_mps(tmp_path, monkeypatch):
    folder = tmp_path / "bin"
    folder.mkdir()
    control = folder / sharing.MPS_CONTROL
    control.write_text(f"#!{sys.executable}\n{FAKE_CONTROL}")
    control.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path / "no-daemon-here"))
    return folder


def _carrying(text: str) -> list:
    return [pid for pid, environ in boundary.other_processes() if text.encode() in environ]


def _gone(pipe: str, seconds: float = 20) -> list:
    deadline = time.monotonic() + seconds
    while (left := _carrying(f"CUDA_MPS_PIPE_DIRECTORY={pipe}")) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def test_an_own_daemon_is_stopped_with_everything_it_started(fake_mps):
    daemon = sharing.MpsDaemon()
    assert daemon.owned and Path(daemon.pipe, "control").exists()
    deadline = time.monotonic() + 10  # the fake daemon starts its server after its control file: wait for it
    while len(_carrying(f"CUDA_MPS_PIPE_DIRECTORY={daemon.pipe}")) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(_carrying(f"CUDA_MPS_PIPE_DIRECTORY={daemon.pipe}")) >= 3  # guardian, daemon, its server
    daemon.stop()
    assert not _gone(daemon.pipe, 5), "the daemon or its server outlived stop()"
    assert not daemon.folder.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="a server of another uid needs root to start it")
def test_an_own_daemons_servers_of_the_ranks_uid_can_write_their_sockets_and_logs(fake_mps):
    """MPS starts each server as its clients' uid: one of another uid than the daemon's must reach the pipe
    folder and the log folder and write in both, and must not remove the daemon's own control socket."""
    daemon = sharing.MpsDaemon()
    try:
        server = subprocess.run(["/bin/sh", "-c", f"touch {daemon.pipe}/server-socket {daemon.folder}/log/server.log"
                                 f" && ! rm -f {daemon.pipe}/control 2>/dev/null"],
                                user=65534, group=65534, capture_output=True, text=True, timeout=30)
        assert server.returncode == 0, server.stderr
        assert Path(daemon.pipe, "server-socket").exists() and Path(daemon.pipe, "control").exists()
    finally:
        daemon.stop()


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.isdir("/dev/shm"),
                    reason="a /dev/shm of the daemon's own needs root (a mount namespace) and a /dev/shm")
def test_an_own_daemon_and_its_clients_share_a_dev_shm_given_to_the_ranks(fake_mps, monkeypatch):
    """The MPS server's files in /dev/shm must be where its clients look (boundary.shm_cover): this run's own daemon
    runs on a /dev/shm folder of its own, which the probe (a client) sees too and the ranks are told of; it goes
    with the daemon, and nothing lands in the machine's /dev/shm."""
    mark = f"a2a-test-mps-{os.getpid()}"
    monkeypatch.setenv("FAKE_MPS_MARK", mark)
    monkeypatch.setattr(sharing, "nccl_for_sharing", lambda: sharing.Nccl((2, 30, 7), None, preload=False))
    monkeypatch.setattr(sharing.MpsDaemon, "probe", lambda self, percent: [10])
    try:
        with sharing.shared_ranks(sharing.Placement(2, 1, 8)) as env:
            shm = Path(env[boundary.MPS_SHM_ENV])
            assert shm.parent == Path("/dev/shm") and shm.stat().st_mode & 0o7777 == 0o1777
            deadline = time.monotonic() + 10
            while not (shm / mark).exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert (shm / mark).exists(), "the daemon's server did not write in the daemon's /dev/shm"
            client = subprocess.run(sharing.on_shm(shm, ["/bin/sh", "-c", f"touch /dev/shm/{mark}-client"]),
                                    capture_output=True, text=True, timeout=30)
            assert client.returncode == 0 and (shm / f"{mark}-client").exists(), client.stderr
        assert not shm.exists(), "the daemon's /dev/shm outlived the daemon"
    finally:
        landed = [name for name in (mark, f"{mark}-client") if Path("/dev/shm", name).exists()]
        for name in landed:
            Path("/dev/shm", name).unlink()
    assert not landed, f"{landed} landed in the machine's /dev/shm"


def test_a_failed_shared_run_can_name_what_its_own_daemon_logged(fake_mps, monkeypatch):
    """The last lines of the run's own daemon's logs, read while it still holds them, each named, escaped and cut
    (the MPS server runs as the ranks' uid); nothing from a daemon the run did not start, or once it has stopped."""
    lines = [f"line {n}" for n in range(10)] + ["server \x1b[31mfailed\x1b[0m " + "x" * 500]
    monkeypatch.setenv("FAKE_MPS_LOG", "|".join(lines))
    monkeypatch.setattr(sharing, "nccl_for_sharing", lambda: sharing.Nccl((2, 30, 7), None, preload=False))
    monkeypatch.setattr(sharing.MpsDaemon, "probe", lambda self, percent: [10])
    with sharing.shared_ranks(sharing.Placement(2, 1, 8)):
        said = sharing.daemon_log(3)
    assert said[:2] == ["log/control.log: line 8", "log/control.log: line 9"], said
    assert said[2].startswith("log/control.log: server \\x1b[31mfailed") and len(said[2]) < 300, said
    assert sharing.daemon_log() == []


def test_the_daemons_logs_are_read_only_as_plain_files(fake_mps, tmp_path):
    """Red team 24: the log folder is open to every uid, and root read its logs following links: a link put in
    place of a log gave the tail of any file root can read. A link is not followed, a named pipe not waited on."""
    secret = tmp_path / "secret"
    secret.write_text("root's secret\n")
    daemon = sharing.MpsDaemon()
    try:
        (daemon.folder / "log" / "server.log").symlink_to(secret)
        os.mkfifo(daemon.folder / "log" / "control.log")
        said = daemon.log_lines(5)
    finally:
        daemon.stop()
    assert not any("secret" in line for line in said), said


def test_a_daemon_already_running_is_used_and_left_running(fake_mps, tmp_path, monkeypatch):
    pipe = tmp_path / "theirs"
    pipe.mkdir()
    env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=str(pipe))
    theirs = subprocess.Popen([str(fake_mps / sharing.MPS_CONTROL), "-f"], env=env)
    try:
        while not (pipe / "control").exists():
            time.sleep(0.05)
        monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(pipe))
        daemon = sharing.MpsDaemon()
        assert not daemon.owned and daemon.pipe == str(pipe)
        daemon.stop()
        assert theirs.poll() is None, "a daemon this run did not start was stopped"
    finally:
        (pipe / "quit").touch()
        theirs.wait(timeout=10)
        for pid in _carrying(f"CUDA_MPS_PIPE_DIRECTORY={pipe}"):
            os.kill(pid, signal.SIGKILL)


OWNER = '''
import sys
sys.path.insert(0, sys.argv[1])
from a2a import sharing
daemon = sharing.MpsDaemon()
print(daemon.pipe, flush=True)
import time
time.sleep(1000)
'''


def test_a_killed_owner_leaves_no_daemon_behind(fake_mps):
    """SIGKILL runs no `finally`: the guardian, in its own session, sees its owner's pipe close and cleans up."""
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(core.HERE)], stdout=subprocess.PIPE, text=True,
                             start_new_session=True)
    pipe = owner.stdout.readline().strip()
    assert pipe and Path(pipe, "control").exists(), pipe
    os.killpg(owner.pid, signal.SIGKILL)
    owner.wait()
    assert not _gone(pipe), "processes left behind after the owner was killed"
    assert not Path(pipe).parent.exists()


def test_shared_ranks_give_the_ranks_mps_nccl_and_their_share(fake_mps, tmp_path, monkeypatch):
    new = _fake_nccl(tmp_path, 23007)
    monkeypatch.setattr(sharing, "torch_nccl_library", lambda: None)
    monkeypatch.setenv("A2A_NCCL_LIB", str(new))
    monkeypatch.setattr(sharing.MpsDaemon, "probe", lambda self, percent: [132 * percent // 100])
    where = sharing.Placement(8, 1, 9)
    with sharing.shared_ranks(where) as env, sharing.shared_ranks(where) as again:
        assert env == again  # one daemon for every user in this process
        assert env["A2A_SHARE"] == "mps" and Path(env["CUDA_MPS_PIPE_DIRECTORY"], "control").exists()
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "9" and env["NCCL_MULTI_RANK_GPU_ENABLE"] == "1"
        assert env["A2A_NCCL_VERSION"] == "2.30.7" and env["LD_PRELOAD"].startswith(str(new.resolve()))
        assert env["NCCL_MAX_NCHANNELS"] == "4"  # 11 SMs per rank: 4 channels fit
        assert sharing.describe_run(where, env) == ("8 ranks on 1 GPU, shared through MPS (9% of its SMs each): "
                                                    "11 SMs per rank, NCCL 2.30.7")
        pipe = env["CUDA_MPS_PIPE_DIRECTORY"]
    assert not _gone(pipe, 5), "the daemon outlived the last user"
    with sharing.shared_ranks(sharing.Placement(2, 2)) as env:
        assert env == {}  # one GPU per rank: nothing shared, no daemon


def test_the_share_sweep_needs_a_gpu():
    done = subprocess.run([sys.executable, "-m", "tools.sm_share", "--world-size", "8"], cwd=core.HERE,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == core.EXIT_BAD_INPUT, done.stdout + done.stderr
    assert done.stderr.strip() == "error: the SM share is a GPU matter: this machine has no GPU", done.stderr


POOL_OWNER = '''
import sys
sys.path.insert(0, sys.argv[1])
import eval as core
from a2a import sharing
sharing.nccl_for_sharing = lambda: sharing.Nccl((2, 30, 7), None, preload=False)
sharing.MpsDaemon.probe = lambda self, percent: [10]
for _ in range(2):  # the second pool would find a killed tracker and warn
    with sharing.shared_ranks(sharing.Placement(2, 1, 8)) as env:
        pool = core.RankPool(2, "gloo", rank_prefix=True, env=env)
        pool.shutdown()
from multiprocessing import resource_tracker
resource_tracker.ensure_running()
print("tracker", resource_tracker._resource_tracker._pid, flush=True)
'''


def test_the_guardian_spares_the_owners_own_helpers(fake_mps):
    """Seen on a GPU (2026-11-24): 29 'resource_tracker: process died unexpectedly' warnings in one suite. The
    owner's multiprocessing tracker, started by the first rank's spawn, carried the ranks' MPS pipe folder, so the
    guardian's last sweep (every process carrying the folder) ended it with the ranks, shared run after shared run."""
    done = subprocess.run([sys.executable, "-W", "error::UserWarning", "-c", POOL_OWNER, str(core.HERE)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "died unexpectedly" not in done.stderr, done.stderr[-2000:]
    assert done.stdout.startswith("tracker ")
