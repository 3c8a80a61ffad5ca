"""The kernel's boundary around the ranks (boundary.py): what a rank can write, and what is left of it after its
pool. Run as root (the sandbox's condition); each test is skipped otherwise."""
from __future__ import annotations

import contextlib
import ctypes
import errno
import math
import os
import pickle
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
import types
from pathlib import Path

import pytest

import boundary
from tests.conftest import ROOT, libm_copy, run_bundle, run_eval, v1_kernel_source

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not sys.platform.startswith("linux"),
                                reason="the boundary needs root on Linux")

# Every place a rank might leave a file for a later command (the environment's own after the uid drop).
PLANTS = '''
import os as _os
import sys as _sys

_PLANTED = False


def _plant():
    """Files named after the token everywhere a rank could write before; each place said with what happened."""
    token = "@TOKEN@"
    places = [_os.environ.get("HOME", "/root"), _os.environ.get("TMPDIR", "/tmp"), "/tmp", "/var/tmp", "/dev/shm",
              "/run/lock", _os.environ.get("TORCH_EXTENSIONS_DIR", "/tmp"), _os.environ.get("TRITON_CACHE_DIR", "/tmp"),
              "@RANK_CACHE@", "@RANK_CACHE@/torch_extensions", "@RANK_CACHE@/builds"]
    for place in places:
        try:
            with open(_os.path.join(place, f"{token}-file"), "w") as planted:
                planted.write("planted")
            said = "written"
        except OSError as error:
            said = error.strerror
        _os.write(2, f"HOSTILE planted {place} {said}\\n".encode())
    for place in (_os.environ.get("TORCH_EXTENSIONS_DIR", "/tmp"), "@RANK_CACHE@"):
        try:
            _os.mkdir(_os.path.join(place, f"{token}-open"), 0o777)
            _os.chmod(_os.path.join(place, f"{token}-open"), 0o777)
        except OSError:
            pass


def custom_kernel(data):
    global _PLANTED
    if not _PLANTED:
        _PLANTED = True
        _plant()
    return _v1_kernel(data)
'''


def _named(token: str) -> list[str]:
    """Every path whose name holds `token` under the places a rank could write before, the judge's cache among them."""
    found = []
    for top in ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", str(boundary.RANK_CACHE)):
        for folder, dirnames, filenames in os.walk(top):
            found += [os.path.join(folder, n) for n in dirnames + filenames if token in n]
    return found


def test_nothing_a_rank_plants_outlives_the_command(tmp_path, monkeypatch, process_token):
    """A submission that writes a file named after a token into its HOME, TMPDIR, /tmp, /var/tmp, /dev/shm,
    /run/lock, both build caches and the judge's own cache, and makes a 0777 folder in its cache (issue #49): the
    run passes, the ranks' own places took the files, and after the command none is anywhere but in the builds kept
    for a later run of the same source."""
    monkeypatch.delenv("A2A_RANK_WRITABLE")  # the ranks get nothing but their run folders
    path = tmp_path / "plants.py"
    path.write_text(v1_kernel_source() + PLANTS.replace("@TOKEN@", process_token)
                    .replace("@RANK_CACHE@", str(boundary.RANK_CACHE)))
    result = run_eval("test", str(path), "--world-size", "2", "--cases", "tests:0", timeout=300)
    said = result.stdout[-3000:] + result.stderr[-3000:]
    assert result.returncode == 0, said
    written = {line.split("HOSTILE planted ")[1].split()[0] for line in result.stderr.splitlines()
               if line.split()[-1:] == ["written"] and "HOSTILE planted " in line}
    assert {"/tmp", "/var/tmp", "/dev/shm"} <= written, said  # the run's own folders, seen at those paths
    assert not written & {"/run/lock", str(boundary.RANK_CACHE)}, said
    own_builds = boundary.BUILDS / boundary.Sandbox.source_key(path)  # the same source's next run reads them
    try:
        left = [p for p in _named(process_token) if own_builds not in Path(p).parents]
        assert not left, left
    finally:
        subprocess.run(["rm", "-rf", str(own_builds)], check=True)


def _in_sandbox(sandbox: boundary.Sandbox, code: str) -> subprocess.CompletedProcess:
    """`code` run as a rank of `sandbox` (its namespace, mounts and uid), after `import os`."""
    entry = (f"import os, pickle, sys\nsys.path.insert(0, {str(ROOT)!r})\nimport boundary\n"
             f"boundary.enter_rank_sandbox(pickle.loads(bytes.fromhex(sys.argv[1])))\n") + code
    with sandbox.spawning():
        return subprocess.run([sys.executable, "-c", entry, pickle.dumps(sandbox.rank_setup()).hex()],
                              capture_output=True, text=True, timeout=60)


def _one_pool(key: str, code: str) -> subprocess.CompletedProcess:
    """`code` run as a rank of a pool of build key `key`, which then ends (keeping what its ranks built)."""
    sandbox = boundary.Sandbox(build_key=key)
    try:
        return _in_sandbox(sandbox, code)
    finally:
        sandbox.close()


def _each_pool(envs: dict, code: str) -> dict:
    """{name: (what `code` printed as a rank, the boundary line)} for one pool per {name: its variables}."""
    seen = {}
    for name, env in envs.items():
        sandbox = boundary.Sandbox(env=env)
        try:
            done = _in_sandbox(sandbox, code)
        finally:
            sandbox.close()
        assert done.returncode == 0, done.stderr
        seen[name] = (done.stdout.strip(), sandbox.guards.describe())
    return seen


def test_ranks_sharing_gpus_through_mps_see_the_mps_servers_dev_shm():
    """An MPS client and its server share files in /dev/shm (boundary.MPS_SHM_ENV). A pool sharing GPUs through the
    judge's daemon sees the daemon's /dev/shm folder as its own; one sharing through someone else's daemon, the
    machine's; any other pool, a folder of its own, empty. What the ranks of a sharing pool leave there goes at its
    end (red team 23: 1.6 GiB outlived four pools capped at 0.5 GiB), and nothing of another uid's (the server's)
    goes with it."""
    import tempfile

    mps_shm = Path(tempfile.mkdtemp(prefix="a2a-test-mps-", dir="/dev/shm"))
    os.chmod(mps_shm, 0o1777)
    (mps_shm / "server-file").write_text("the MPS server's")
    fd, host_mark = tempfile.mkstemp(prefix="a2a-test-machine-", dir="/dev/shm")
    os.close(fd)
    os.chmod(host_mark, 0o644)
    left = f"{Path(host_mark).name}-left"
    plant = (f"open('/dev/shm/{left}', 'w').write('x' * 4096)\nos.mkdir('/dev/shm/{left}-tree')\n"
             f"open('/dev/shm/{left}-tree/file', 'w').close()\nprint(sorted(os.listdir('/dev/shm')))")
    try:
        seen = _each_pool({"daemon's": {"A2A_SHARE": "mps", boundary.MPS_SHM_ENV: str(mps_shm)},
                           "machine's": {"A2A_SHARE": "mps"}, "own": {}}, plant)
        assert seen["daemon's"][0] == str(sorted([left, f"{left}-tree", "server-file"])), seen
        assert "the MPS daemon's" in seen["daemon's"][1], seen
        assert Path(host_mark).name in seen["machine's"][0] and "this machine's" in seen["machine's"][1], seen
        assert seen["own"][0] == str(sorted([left, f"{left}-tree"])) and "/dev/shm" not in seen["own"][1], seen
        assert sorted(p.name for p in mps_shm.iterdir()) == ["server-file"]  # the rank's gone, the server's kept
        assert not [p for p in Path("/dev/shm").iterdir() if p.name.startswith(left)]
    finally:
        shutil.rmtree(mps_shm, ignore_errors=True)
        os.remove(host_mark)
        for path in Path("/dev/shm").glob(f"{left}*"):
            shutil.rmtree(path) if path.is_dir() else path.unlink()


@pytest.fixture
def mps_pipe():
    """An MPS pipe folder as the command's own daemon makes it (sharing.MpsDaemon: open to every uid, sticky, in a
    folder others may only pass through), not below a folder ranks see as their own."""
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="a2a-test-mps-", dir="/run"))
    pipe = folder / "pipe"
    pipe.mkdir()
    os.chmod(folder, 0o711)
    os.chmod(pipe, 0o1777)
    yield pipe
    shutil.rmtree(folder)


def test_only_ranks_sharing_gpus_write_in_the_mps_pipe_folder_and_their_files_there_go_with_the_pool(mps_pipe):
    """Red team 24: the MPS pipe folder (open to every uid: MPS starts each server as its clients' uid) was writable
    to every pool's ranks wherever it existed, and what they left there (on disk, outside their memory cap) stayed
    for the rest of the command. Now only a pool sharing GPUs through MPS writes there, and at its end its uid's
    files and folders go; sockets and named pipes stay (the MPS server of that uid outlives its pool)."""
    pipe = mps_pipe
    (pipe / "control").write_text("the daemon's")
    plant = f"""
import socket
for name, make in (("file", lambda p: open(p, "w").write("x" * 4096)), ("tree", os.mkdir), ("fifo", os.mkfifo),
                   ("socket", lambda p: socket.socket(socket.AF_UNIX).bind(p))):
    try:
        make({str(pipe)!r} + "/left-" + name)
        print("made", name)
    except OSError as error:
        print("refused", name, error.strerror)
"""
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(pipe)}
    seen = _each_pool({"sharing": {"A2A_SHARE": "mps", **env}}, plant)
    assert seen["sharing"][0].count("made") == 4, seen
    assert sorted(p.name for p in pipe.iterdir()) == ["control", "left-fifo", "left-socket"]
    seen = _each_pool({"own GPU": env}, plant.replace("left-", "own-"))
    assert seen["own GPU"][0].count("refused") == 4, seen
    assert sorted(p.name for p in pipe.iterdir()) == ["control", "left-fifo", "left-socket"]


def test_a_pool_sharing_gpus_leaves_at_most_a_few_channels_in_the_mps_pipe_folder_its_oldest(mps_pipe):
    """Red team 25: named pipes and sockets stayed in the MPS pipe folder in any number (60 000 from two ranks, on
    disk, outside every cap). At the pool's end its uid keeps boundary.MPS_CHANNELS_KEPT of them, the oldest (its
    MPS server's own are made when its first rank reaches the GPU)."""
    pipe = mps_pipe
    plant = f"""
import time
os.mkfifo({str(pipe)!r} + "/first")
time.sleep(0.05)
for i in range(3 * {boundary.MPS_CHANNELS_KEPT}):
    os.mkfifo({str(pipe)!r} + f"/more-{{i}}")
print("made")
"""
    seen = _each_pool({"sharing": {"A2A_SHARE": "mps", "CUDA_MPS_PIPE_DIRECTORY": str(pipe)}}, plant)
    assert "made" in seen["sharing"][0], seen
    left = sorted(p.name for p in pipe.iterdir())
    assert len(left) == boundary.MPS_CHANNELS_KEPT and "first" in left, left


def test_the_mps_servers_open_channels_stay_and_the_ranks_go_however_many_they_made_first(mps_pipe):
    """Red team 26, from the code: ranks that made MPS_CHANNELS_KEPT named pipes before their first CUDA call were
    the oldest of their uid's, kept in place of the MPS server's own. Now what a live process of the uid (its MPS
    server, outside the ended pool) holds open stays, and every other channel of the uid goes."""
    pipe = mps_pipe
    plant = f"""
import socket
for i in range(2 * {boundary.MPS_CHANNELS_KEPT}):
    os.mkfifo({str(pipe)!r} + f"/early-{{i}}")
socket.socket(socket.AF_UNIX).bind({str(pipe)!r} + "/early-socket")
print("made")
"""
    server_code = f"""
import os, socket, sys, time
os.setgid({{uid}}); os.setuid({{uid}})
os.mkfifo({str(pipe)!r} + "/server-fifo")
held = os.open({str(pipe)!r} + "/server-fifo", os.O_RDWR)
os.mkfifo({str(pipe)!r} + "/server-unopened")
listening = socket.socket(socket.AF_UNIX)
listening.bind({str(pipe)!r} + "/server-socket")
listening.listen()
print("ready", flush=True)
time.sleep(60)
"""
    sandbox = boundary.Sandbox(env={"A2A_SHARE": "mps", "CUDA_MPS_PIPE_DIRECTORY": str(pipe)})
    server = None
    try:
        made = _in_sandbox(sandbox, plant)
        assert "made" in made.stdout, made.stdout + made.stderr
        # the MPS server of the pool's uid: started by the daemon (root) as that uid, outside the pool
        server = subprocess.Popen([sys.executable, "-c", server_code.format(uid=sandbox.uid)], stdout=subprocess.PIPE,
                                  text=True)
        assert server.stdout.readline().strip() == "ready"
    finally:
        sandbox.close()
        if server is not None:
            server.kill()
            server.wait()
    assert sorted(p.name for p in pipe.iterdir()) == ["server-fifo", "server-socket"]


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.isdir("/dev/shm"), reason="needs root and /dev/shm")
def test_a_library_the_ranks_start_with_preloaded_is_in_sight_of_what_they_start(tmp_path_factory):
    """Ranks sharing GPUs start with a newer NCCL preloaded, which the device sessions build below /tmp. The ranks'
    run covers /tmp, so every process a rank started (a compiler, ldconfig) printed ld.so's "cannot be preloaded"
    (2026-11-29: 200 lines in one world-size-8 test). The pool keeps each preloaded library in the ranks' view.
    (Not tmp_path: a test's tmp_path is the ranks' to write, and in their view.)"""
    folder = tmp_path_factory.mktemp("preloaded")
    library = libm_copy(folder / "libpreloaded.so")
    (folder / "beside").write_text("not the ranks'")
    for path in (folder.parent, folder):
        path.chmod(0o755)
    library.chmod(0o644)
    sandbox = boundary.Sandbox(env={"LD_PRELOAD": str(library)})
    try:
        done = _in_sandbox(sandbox, f"""
import subprocess
child = subprocess.run(["/bin/true"], env={{"LD_PRELOAD": {str(library)!r}}}, capture_output=True, text=True)
print("child", child.returncode, repr(child.stderr))
print("beside", os.listdir({str(folder)!r}))
""")
    finally:
        sandbox.close()
    assert done.returncode == 0, done.stderr
    assert "child 0 ''" in done.stdout, done.stdout  # ld.so found the library: nothing said
    assert "beside ['libpreloaded.so']" in done.stdout, done.stdout  # and nothing else of the folder it lies in


def test_a_preload_out_of_the_ranks_reach_is_left_out_with_every_guard_on(tmp_path_factory):
    """Red team 39: an LD_PRELOAD library other users cannot read (0600) turned every guard off, and the ranks ran
    as root (they read the judge's cache and planted a file that outlived the run, exit 0); names the kernel
    refuses (300 characters, another process's /proc root) ended the judge with 114, and a descriptor of the
    judge's own hung it. Each is left out of the ranks' LD_PRELOAD now, and said in the boundary line."""
    folder = tmp_path_factory.mktemp("unreadable")
    folder.chmod(0o755)
    library = libm_copy(folder / "librt39.so")
    library.chmod(0o600)
    odd = ["/" + "a" * 300 + ".so", "/proc/1/root/etc/hostname", "/proc/self/fd/1", "/dev/null",
           "../../proc/self/fd/1"]  # red team 40: relative, as ld.so reads it from the working folder
    sandbox = boundary.Sandbox(env={"LD_PRELOAD": " ".join([str(library), *odd, "libm.so.6"])})
    try:
        line = sandbox.guards.describe()
        done = _in_sandbox(sandbox, "print('uid', os.getuid(), 'preload', repr(os.environ.get('LD_PRELOAD')))")
    finally:
        sandbox.close()
    assert not line.startswith("guards off") and "LD_PRELOAD less 6 entries that other users cannot read" in line, line
    assert done.returncode == 0, done.stderr
    assert f"uid {sandbox.uid} preload 'libm.so.6'" in done.stdout, done.stdout


def test_a_sys_path_entry_others_cannot_read_is_left_out_with_every_guard_on(monkeypatch):
    """Red team 40: PYTHONPATH=/root (0700) put an unreadable folder on the judge's sys.path, which turned every
    guard off: the ranks ran as root and read /root. A sys.path entry (or working folder) other users cannot read is
    left out of the ranks' view now, and the boundary line counts it."""
    closed = Path(tempfile.mkdtemp(prefix="a2a-closed-", dir="/var/lib"))
    try:
        closed.chmod(0o700)
        (closed / "token").write_text("hf_RT40")
        monkeypatch.setattr(sys, "path", [*sys.path, str(closed)])
        sandbox = boundary.Sandbox()
        try:
            line = sandbox.guards.describe()
            done = _in_sandbox(sandbox, f"""
print("uid", os.getuid(), "token", os.path.exists({str(closed / "token")!r}))
""")
        finally:
            sandbox.close()
    finally:
        shutil.rmtree(closed)
    assert not line.startswith("guards off") and "1 path(s) of sys.path and the working folder" in line, line
    assert done.returncode == 0, done.stderr
    assert f"uid {sandbox.uid} token False" in done.stdout, done.stdout


def test_a_path_below_a_closed_folder_brings_nothing_beside_it_into_view():
    """Red team 39: a preloaded library (or a PYTHONPATH entry) below a folder others cannot search put the whole
    first entry below that folder in the ranks' view: a library under /root/.cache gave them /root/.cache, and a
    token in it. Now only the path itself is there, on folders made for the way to it."""
    closed = Path(tempfile.mkdtemp(prefix="a2a-closed-", dir="/var/lib"))
    try:
        closed.chmod(0o700)
        library = libm_copy(closed / "cache" / "nccl" / "librt39.so")
        package = closed / "cache" / "python"
        package.mkdir()
        (package / "on_path.py").write_text("")
        (closed / "cache" / "secret").mkdir()
        (closed / "cache" / "secret" / "token").write_text("hf_RT39")
        (closed / "cache" / "beside.txt").write_text("hf_RT39")
        for path in (closed / "cache", library.parent, package, closed / "cache" / "secret"):
            path.chmod(0o755)
        for path in (library, package / "on_path.py", closed / "cache" / "secret" / "token"):
            path.chmod(0o644)
        sandbox = boundary.Sandbox(env={"LD_PRELOAD": str(library)}, reach=(str(package),))
        try:
            line = sandbox.guards.describe()
            done = _in_sandbox(sandbox, f"""
root = {str(closed / "cache")!r}
print("cache", sorted(os.listdir(root)))
print("library", os.path.isfile(root + "/nccl/librt39.so"), "package", sorted(os.listdir(root + "/python")))
print("token", os.path.exists(root + "/secret/token"))
""")
        finally:
            sandbox.close()
    finally:
        shutil.rmtree(closed)
    assert not line.startswith("guards off"), line
    assert done.returncode == 0, done.stderr
    assert "cache ['nccl', 'python']" in done.stdout, done.stdout
    assert "library True package ['on_path.py']" in done.stdout and "token False" in done.stdout, done.stdout


def test_no_rank_can_hold_the_name_of_another_pools_dev_shm(tmp_path, monkeypatch):
    """Red team 25, from the code: ranks that see the machine's /dev/shm (beside an MPS daemon that was already
    running) could make /dev/shm/a2a-run-<uid> before another command's pool of that uid, whose start then failed.
    The pools' folders are below the judge's own SHM_RUNS now, where no other uid makes an entry; a SHM_RUNS a rank
    made first is replaced."""
    monkeypatch.setattr(boundary, "SHM_RUNS", Path("/dev/shm") / f"a2a-test-runs-{tmp_path.name}")
    squat = "import os, sys\nos.setgid(65534)\nos.setuid(65534)\nos.mkdir(sys.argv[1], 0o777)\nprint('made')"
    try:
        done = subprocess.run([sys.executable, "-c", squat, str(boundary.SHM_RUNS)], capture_output=True, text=True)
        assert done.stdout.strip() == "made", done.stderr  # the folder a rank made before any judge did
        uid = boundary.RANK_UID_BASE - 1  # no pool's: other tests' pools may run meanwhile
        boundary.make_run_folders(uid, own_shm=True)
        try:
            assert boundary.shm_folder(uid).parent == boundary.SHM_RUNS and boundary.shm_folder(uid).is_dir()
            found = os.lstat(boundary.SHM_RUNS)
            assert found.st_uid == 0 and stat.S_IMODE(found.st_mode) == 0o711, oct(found.st_mode)
            again = subprocess.run([sys.executable, "-c", squat, str(boundary.SHM_RUNS / str(uid + 1))],
                                   capture_output=True, text=True)
            assert again.returncode != 0 and "PermissionError" in again.stderr, again.stdout + again.stderr
        finally:
            boundary.remove_run_folders(uid)
    finally:
        boundary.remove_tree(boundary.SHM_RUNS)


def test_ranks_sharing_gpus_have_network_and_ipc_namespaces_of_their_own_too():
    """A pool sharing GPUs through MPS keeps its ranks out of the machine's IPC and network namespaces as every pool
    does (2026-11-28: MPS needed neither; its server and clients share the daemon's /dev/shm and pipe folder)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    segment = libc.shmget(0, 4096, 0o1000 | 0o600)  # IPC_PRIVATE, IPC_CREAT
    assert segment >= 0, os.strerror(ctypes.get_errno())
    probe = ("import socket\nprint([line.split()[1] for line in open('/proc/sysvipc/shm')][1:], "
             "sorted(socket.if_nameindex()))")
    try:
        said = _each_pool({"shared": {"A2A_SHARE": "mps"}, "not shared": {}}, probe)
        seen = {kind: (str(segment) in out, "'lo')]" not in out, guards) for kind, (out, guards) in said.items()}
    finally:
        libc.shmctl(segment, 0, None)  # IPC_RMID
    for kind in ("shared", "not shared"):
        assert seen[kind][:2] == (False, False) and "network and IPC namespaces" in seen[kind][2], seen
        assert "the machine's" not in seen[kind][2].replace("the machine's /dev/shm", ""), seen


def test_a_rank_makes_no_multipath_tcp_nor_vsock_socket_and_plain_ones_still():
    """Red team 65: 420 loopback multipath TCP connections held the machine's TCP buffers past tcp_mem's pressure mark
    for 12 s; they count against tcp_mem, but the kernel lists them apart from TCP's, and the guardian saw 1 MB of
    the 1.5 GB. A rank's filter answers such a socket as a kernel without it does (EPROTONOSUPPORT); TCP and UDP
    sockets, over IPv4 and IPv6, are made as before. Red team 67: a vsock socket (no network namespace holds it)
    listened in the machine's vsock port space; a family outside the rank's namespace fails with EAFNOSUPPORT, while
    unix and netlink sockets are made as before."""
    import errno

    for family, kind, protocol in ((socket.AF_INET, socket.SOCK_STREAM, 262), (40, socket.SOCK_STREAM, 0)):
        try:
            socket.socket(family, kind, protocol).close()
        except OSError as error:
            pytest.skip(f"this kernel makes no socket ({family}, {kind}, {protocol}) itself ({error})")
    families = ("import socket\nfor family, kind in ((40, socket.SOCK_STREAM), (socket.AF_UNIX, socket.SOCK_STREAM), "
                "(socket.AF_NETLINK, socket.SOCK_RAW)):\n    try:\n        socket.socket(family, kind, 0).close()\n"
                "        print(family, 'made')\n    except OSError as error:\n        print(family, error.errno)")
    said = _each_pool({"pool": {}}, families)["pool"][0].splitlines()
    assert said == [f"40 {errno.EAFNOSUPPORT}", "1 made", "16 made"], said
    probe = ("import socket\nfor family in (socket.AF_INET, socket.AF_INET6):\n"
             "    for kind, protocol in ((socket.SOCK_STREAM, 262), (socket.SOCK_STREAM, 0), (socket.SOCK_STREAM, 6), "
             "(socket.SOCK_DGRAM, 0)):\n        try:\n            socket.socket(family, kind, protocol).close()\n"
             "            print(protocol, 'made')\n        except OSError as error:\n"
             "            print(protocol, error.errno)")
    said = _each_pool({"pool": {}}, probe)["pool"][0].splitlines()
    assert said == [f"262 {errno.EPROTONOSUPPORT}", "0 made", "6 made", "0 made"] * 2, said


def test_a_rank_holds_few_terminals_and_no_asynchronous_io_context():
    """Red team 60: two ranks held 4095 of the machine's 4096 pseudo-terminals, and 15 AIO contexts its whole
    fs.aio-max-nr; root's `script` and `io_setup` failed until the pool ended. A rank's /dev/pts is an instance of
    its own, capped at RANK_PTYS, and its filter answers io_setup and io_uring_setup as absent (ENOSYS)."""
    import errno

    probe = ("import ctypes, rank_filter\nheld = []\ntry:\n    while len(held) < 4 * boundary.RANK_PTYS:\n"
             "        held.append(os.openpty())\nexcept OSError as error:\n    print('ptys', len(held), error.errno)\n"
             "libc = ctypes.CDLL(None, use_errno=True)\nlibc.syscall.restype = ctypes.c_long\n"
             "numbers = rank_filter._SYSCALLS[os.uname().machine][1]\ncontext, params = ctypes.c_ulong(0), "
             "ctypes.create_string_buffer(120)\n"
             "for name, args in (('io_setup', (128, ctypes.byref(context))), ('io_uring_setup', (8, params))):\n"
             "    print(name, libc.syscall(numbers[name], *args), ctypes.get_errno())")
    said = _each_pool({"pool": {}}, probe)["pool"][0].splitlines()
    assert said[0] == f"ptys {boundary.RANK_PTYS} {errno.ENOSPC}", said
    assert said[1:] == [f"io_setup -1 {errno.ENOSYS}", f"io_uring_setup -1 {errno.ENOSYS}"], said


# A rank that holds COUNT files in its own table, in the table of a thread that unshared its own (red team 61: the
# process's FDSize did not show it), or as mappings of files it closed (red team 62), then sleeps SLEEP_S.
FILES_HELD = """import ctypes, threading, time
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
def hold():
    if {how!r} == 'thread':
        assert libc.unshare(0x400) == 0  # CLONE_FILES
    held = []
    with open('/tmp/page', 'wb') as page:
        page.write(bytes(4096))
    for _ in range({count}):
        fd = os.open('/tmp/page' if {how!r} == 'mappings' else '/dev/null', os.O_RDWR)
        if {how!r} == 'mappings':  # libc's own: Python's mmap keeps a descriptor of its own
            held.append(libc.mmap(None, 4096, 1, 1, fd, 0))  # PROT_READ, MAP_SHARED
            os.close(fd)
        else:
            held.append(fd)
    time.sleep({sleep_s})
worker = threading.Thread(target=hold)
worker.start()
worker.join()
print('alive')
"""
# A rank that queues BYTES in a loopback TCP connection it never reads, then sleeps SLEEP_S.
TCP_HELD = """import socket, time
server = socket.create_server(('127.0.0.1', 0))
sender = socket.create_connection(server.getsockname())
receiver, _ = server.accept()
sender.setblocking(False)
queued = 0
try:
    while queued < {count}:
        queued += sender.send(bytes(min(65536, {count} - queued)))
except BlockingIOError:
    pass
time.sleep({sleep_s})
print('alive')
"""


# A rank that sends COUNT one-byte TCP segments (each a record of its own, MSG_EOR, so none merges with the next) into
# a loopback connection it never reads, then sleeps SLEEP_S: each is charged about 800 bytes (red team 63).
TCP_SEGMENTS = """import socket, time
server = socket.create_server(('127.0.0.1', 0))
sender = socket.create_connection(server.getsockname())
sender.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
receiver, _ = server.accept()
sender.setblocking(False)
try:
    for _ in range({count}):
        sender.send(b'x', socket.MSG_EOR)
except BlockingIOError:
    pass
time.sleep({sleep_s})
print('alive')
"""


# A rank that queues COUNT bytes in 50 kB datagrams to loopback UDP sockets it never reads (four a socket, within its
# receive buffer), then sleeps SLEEP_S.
UDP_HELD = """import socket, time
datagrams = max(1, {count} // 50000)
receivers = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(max(1, datagrams // 4))]
for receiver in receivers:
    receiver.bind(('127.0.0.1', 0))
sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for sent in range(datagrams):
    sender.sendto(bytes(50000), receivers[sent % len(receivers)].getsockname())
time.sleep({sleep_s})
print('alive')
"""


# UDP_HELD's datagrams, each receiver then unhashed: connected (so bound by the kernel) before the datagrams, then
# disconnected (connect to AF_UNSPEC), which keeps its queue but takes it out of every listing (red team 65).
UDP_UNHASHED = """import ctypes, socket, time
libc = ctypes.CDLL(None, use_errno=True)
datagrams = max(1, {count} // 50000)
sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sender.bind(('127.0.0.1', 0))
receivers = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(max(1, datagrams // 4))]
for receiver in receivers:
    receiver.connect(sender.getsockname())
for sent in range(datagrams):
    sender.sendto(bytes(50000), receivers[sent % len(receivers)].getsockname())
for receiver in receivers:
    libc.connect(receiver.fileno(), ctypes.create_string_buffer(16), 16)
time.sleep({sleep_s})
print('alive')
"""


def _ended_or_not(monkeypatch, table: str, share: float, probe: str, counts: tuple) -> dict:
    """{count: (exit code, what the rank printed, the guardian's word, the death's text)} for a rank running `probe`
    holding each of `counts`, its pool's guardian alarmed at once over `table` with a share of `share`."""
    monkeypatch.setattr(boundary, "TABLES", {table: (0.0, share)})
    seen = {}
    for count, sleep_s in zip(counts, (30, 1)):
        sandbox = boundary.Sandbox()
        try:
            done = _in_sandbox(sandbox, probe.format(count=count, sleep_s=sleep_s))
            seen[count] = (done.returncode, done.stdout.strip(), sandbox.ended_for(2),
                           boundary.death_message(-signal.SIGKILL, sandbox))
        finally:
            sandbox.close()
    return seen


@pytest.mark.parametrize("how", ["process", "thread", "mappings"])
def test_a_pool_past_its_share_of_the_machines_file_table_is_ended_and_named(monkeypatch, how):
    """Red team 60: a pool held all 2.47 M of the machine's open files (8192 a process, 340 processes), and another
    user's process could not load libc; no uid or cgroup limit bounds it. The guardian ends a pool holding more than
    its share of fs.file-max while the machine's use passes the alarm (boundary.TABLES). Here the alarm is always on
    and the share 4096 files: a rank holding 6000 is ended, and its death names the table; one holding 200 is not.
    Red team 61: the same in a thread's own table; red team 62: in mappings of closed files."""
    seen = _ended_or_not(monkeypatch, "files", 4096 / boundary.file_table()[1],
                         FILES_HELD.replace("{how!r}", repr(how)), (6000, 200))
    assert seen[6000][:2] == (-signal.SIGKILL, "") and seen[6000][2][:1] == ("files",), seen
    assert seen[6000][2][1] > 4096 and "past its share of the machine's open-file table" in seen[6000][3], seen
    assert seen[200][:3] == (0, "alive", None) and "table" not in seen[200][3], seen


def test_the_guardians_count_stops_once_past_the_share():
    """Red team 63: processes of 65 000 mappings of one file each (one file of the machine's table each, 2.6 M lines
    of maps to read) kept the guardian counting for 10 s while other processes filled the table. Every line read now
    counts, and the count stops once past the share: three processes of 20 000 mappings, against a share of 1000,
    are read one at most."""
    import threading

    holder = ("import ctypes, time\nlibc = ctypes.CDLL(None)\nlibc.mmap.restype = ctypes.c_void_p\n"
              "libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, "
              "ctypes.c_long)\nopen('/tmp/page', 'wb').write(bytes(4096))\nfd = os.open('/tmp/page', os.O_RDONLY)\n"
              "for _ in range(3):\n    if os.fork() == 0:\n        for _ in range(20000):\n"
              "            libc.mmap(None, 4096, 1, 1, fd, 0)\n        time.sleep(8)\n        os._exit(0)\n"
              "print('forked', flush=True)\ntime.sleep(8)")
    sandbox = boundary.Sandbox()
    try:
        ran = threading.Thread(target=_in_sandbox, args=(sandbox, holder))
        ran.start()
        deadline = time.monotonic() + 30
        while boundary.files_held(sandbox.init_pid, math.inf) < 60000 and time.monotonic() < deadline:
            time.sleep(0.2)
        whole, stopped = boundary.files_held(sandbox.init_pid, math.inf), boundary.files_held(sandbox.init_pid, 1000)
        ran.join()
    finally:
        sandbox.close()
    assert whole >= 60000 and 1000 < stopped <= 1000 + 20000 + 2000, (whole, stopped)


@pytest.mark.parametrize("protocol, probe, big, small", [("tcp", TCP_HELD, 8 << 20, 64 << 10),
                                                          ("udp", UDP_HELD, 8 << 20, 64 << 10),
                                                          ("tcp", TCP_SEGMENTS, 3000, 100),
                                                          ("udp", UDP_UNHASHED, 8 << 20, 64 << 10)],
                         ids=["tcp", "udp", "tcp-one-byte-segments", "udp-unhashed"])
def test_a_pool_past_its_share_of_the_machines_socket_buffers_is_ended_and_named(monkeypatch, protocol, probe, big,
                                                                                  small):
    """Red team 62: a pool's unread loopback connections held 2.26 GiB of TCP buffers, past the kernel's hard mark
    (tcp_mem), and every socket of the machine slowed 2-10x; its memory cgroup did not hold them. Red team 63: 1.58 GB
    of UDP buffers, unwatched; and one-byte TCP segments, charged about 800 bytes each, held the machine at its
    pressure mark for 8 s while the guardian counted their bytes. The guardian ends a pool whose own sockets are
    charged more than its share of the pressure mark while the machine is past it. Here the alarm is always on and
    the share 1 MiB: a rank queueing 8 MiB, or 3000 one-byte segments (3 kB, about 2.4 MB charged), is ended and
    named; one queueing 64 KiB, or 100 segments, is not. Red team 65: UDP sockets unhashed after their fill held
    2.37 GB that no listing shows; the pool's memory group's count of its sockets ends them (where it has one)."""
    if probe is UDP_UNHASHED and boundary.memory_group(0) is None:
        pytest.skip("needs a memory cgroup (v1's or v2's) for the pool's own count of its sockets")
    seen = _ended_or_not(monkeypatch, protocol, (1 << 20) / boundary.socket_table(protocol)[1], probe, (big, small))
    assert seen[big][:2] == (-signal.SIGKILL, "") and seen[big][2][:1] == (protocol,), seen
    assert seen[big][2][1] > 1 << 20 and f"in its {protocol.upper()} buffers, past its share" in seen[big][3], seen
    assert seen[small][:3] == (0, "alive", None) and "buffers" not in seen[small][3], seen


def test_no_case_starts_a_process_in_a_pool_its_guardian_ended():
    """Red team 65: the guardian ended a pool for its TCP buffers in the first of nine cases; the next case started
    fresh workers in the ended namespace, where fork fails (ENOMEM), and the human face exited 114, the judge's own
    error. A case of such a pool now starts nothing and fails every rank at once, naming why, as the ranks' failure."""
    import eval as core

    class EndedPool:
        workers, cases_run = [None, None], 1
        sandbox = types.SimpleNamespace(ended_for=lambda wait_s: ("tcp", 393527296, 1572327424))
        retired: list = []

        def await_idle(self):
            pass

        def _start(self):
            raise OSError(errno.ENOMEM, "fork into an ended namespace")

        def _retire(self, slots):
            self.retired += slots

        def sweep(self):
            return []

    pool = EndedPool()
    results = core.CaseRun(pool, "steps", core.TestCase(args={"world_size": 2}, spec="a case"), 10, {}).next_event()
    assert [r.ok for r in results] == [False, False] and pool.retired == [1, 0], results
    assert all(r.value.message.startswith("not run: its pool was ended holding 393527296 bytes in its TCP buffers")
               for r in results), results


def test_the_socket_count_reads_only_its_callers_own_network_namespace():
    """sock_diag answers for its caller's network namespace, so the count is the guardian's alone (its pool's): asked
    from another namespace for a pool's, it says nothing (None) and the guardian's fallback, the bytes the pool's
    sockets queue, counts; asked for its own, it counts this process's sockets, memory and all."""
    import socket

    sandbox = boundary.Sandbox()
    try:
        other = [boundary.socket_memory(sandbox.init_pid, math.inf, protocol) for protocol in ("tcp", "udp")]
        fallback = boundary.sockets_held(sandbox.init_pid, math.inf, "tcp")
    finally:
        sandbox.close()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as receiver, \
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
        receiver.bind(("127.0.0.1", 0))
        for _ in range(100):
            sender.sendto(b"x", receiver.getsockname())
        time.sleep(0.1)
        own = boundary.socket_memory(os.getpid(), math.inf, "udp")
    assert other == [None, None] and fallback == 0 and own is not None and own >= 100 * 256, (other, fallback, own)


def test_a_worker_born_into_a_namespace_already_ended_reads_as_killed():
    """Red team 61: the guardian ended a pool (its file-table share) just after its zygote said a worker was born;
    the worker's entry was gone when the owner looked for it, and the human face ended with 114, "the pool's zygote
    forked a worker ... that is not there". With its zygote gone too, every worker of the pool now reads as
    killed; with the zygote alive, it is still the judge's own error."""
    import collections
    import multiprocessing

    import births

    class Zygote:
        def __init__(self, alive: bool):
            self.alive, self.pid = alive, 0x3FFFFFFF  # no process has it

        def join(self, timeout=None):
            pass

        def is_alive(self):
            return self.alive

    for alive in (False, True):
        zygote = object.__new__(births.Zygote)
        zygote.conn, said = multiprocessing.Pipe()
        zygote.process, zygote.children, zygote.ended = Zygote(alive), {}, False
        zygote.unborn = collections.deque([births.Forked(zygote)])
        said.send_bytes(births._ZYGOTE_SAYS.pack(births._BORN, 4, 0))
        if alive:
            with pytest.raises(RuntimeError, match="forked a worker"):
                zygote.hear(1.0)
        else:
            zygote.hear(1.0)
            assert zygote.ended and zygote.unborn[0].exitcode == -signal.SIGKILL and not zygote.unborn[0].is_alive()


TERMINAL_PROBE = """
import fcntl as _fcntl
import os as _os
import termios as _termios


def _probe():
    said = []
    given, null = _os.fstat(0), _os.stat("/dev/null")
    said.append("stdin=" + ("null" if (given.st_rdev, given.st_mode) == (null.st_rdev, null.st_mode) else
                            "tty" if _os.isatty(0) else "other"))
    try:
        _os.close(_os.open("/dev/tty", _os.O_RDWR | _os.O_NOCTTY))
        said.append("tty=opened")
    except OSError as error:
        said.append(f"tty={error.errno}")
    # a terminal of the rank's own, made its controlling one: only the filter stands between it and TIOCSTI
    master, slave = _os.openpty()
    try:
        _fcntl.ioctl(slave, _termios.TIOCSCTTY, 0)
    except OSError as error:
        said.append(f"ctty={error.errno}")
    for request in ("TIOCSTI", "TIOCLINUX"):
        try:
            _fcntl.ioctl(slave, getattr(_termios, request), b"\\x00")
            said.append(f"{request}=done")
        except OSError as error:
            said.append(f"{request}={error.errno}")
    return " ".join(said)


_SAID = _probe()
print("tp: " + _SAID, flush=True)  # on the operator's terminal, escaped: a failed step's row may not carry the text


def custom_kernel(data):
    raise RuntimeError("tp: " + _SAID)
"""


def test_a_rank_has_no_terminal_and_pushes_no_input_into_one(tmp_path):
    """Red team 23: under an operator's terminal a rank of the clock opened /dev/tty (its session's controlling
    terminal), wrote a forged table on it and typed a command with TIOCSTI into the shell the operator got back. A
    rank now starts a session of its own (no controlling terminal), and its filter refuses TIOCSTI and TIOCLINUX
    even on a terminal it made its own. Red team 24: the terminal was still the rank's fd 0, read and set from there
    (the operator's keys, echo off, a SIGINT typed by the terminal's answer); fd 0 is /dev/null from every birth on."""
    import errno
    import pty

    probe = tmp_path / "terminal_probe.py"
    probe.write_text(TERMINAL_PROBE)
    pid, master = pty.fork()
    if pid == 0:  # the clock with the pseudo-terminal as its controlling terminal, as from an operator's shell
        os.chdir(ROOT)
        os.execv(sys.executable, [sys.executable, "run_leaderboard.py", "--versions", str(probe), "--world-size", "2",
                                  "--no-anchors", "--no-problem-size", "--min-rounds", "2", "--max-rounds", "2",
                                  "--cases", "benchmarks:0", "--out", str(tmp_path / "out")])
    seen = b""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the clock has ended
            break
        if not chunk:
            break
        seen += chunk
    _, status = os.waitpid(pid, 0)
    os.close(master)
    # the terminal's text, and the saved rows' errors whole (the table's cell is cut at 160 characters)
    text = seen.decode(errors="replace") + "".join(p.read_text() for p in (tmp_path / "out").rglob("results.csv"))
    assert os.waitstatus_to_exitcode(status) == 112 and "tp: " in text, text[-2000:]
    assert f"tty={errno.ENXIO}" in text and "tty=opened" not in text, text[-2000:]
    assert "ctty=" not in text, text[-2000:]  # the rank did make the terminal its own
    assert "stdin=null" in text and "stdin=tty" not in text, text[-2000:]
    assert f"TIOCSTI={errno.EPERM}" in text and f"TIOCLINUX={errno.EPERM}" in text, text[-2000:]


def test_two_pools_have_two_uids_and_neither_reads_the_others_run_folder():
    """Two pools alive at once (two entries of run_leaderboard.py's clock): two uids, and a rank of the second
    reaches nothing of the first's run folder (covered in its view, and closed to its uid besides)."""
    first, second = boundary.Sandbox(), boundary.Sandbox()
    try:
        assert first.guards.uid is not None and second.guards.uid is not None, first.guards.describe()
        assert first.guards.uid != second.guards.uid
        secret = boundary.run_folder(first.uid) / "cache" / "triton" / "build.bin"
        secret.write_text("the first entry's build")
        os.chown(secret, first.uid, first.uid)
        reads = _in_sandbox(second, f"""
for path in ({str(secret)!r}, {str(boundary.run_folder(first.uid))!r}):
    try:
        print(path, open(path).read() if os.path.isfile(path) else os.listdir(path))
    except OSError as error:
        print(path, "refused", error.strerror)
""")
        assert reads.returncode == 0, reads.stderr
        assert "the first entry's build" not in reads.stdout and reads.stdout.count("refused") == 2, reads.stdout
        assert os.stat(secret.parent).st_mode & 0o777 == 0o700
    finally:
        first.close()
        second.close()
    assert not boundary.run_folder(first.uid).exists() and not boundary.run_folder(second.uid).exists()


def test_builds_are_kept_for_the_same_source_only():
    """What a pool's ranks built is copied back under its build key when it ends: a later pool of the same key
    starts from it, one of another key does not, and no rank writes the judge's copy."""
    key, other = "ab" * 32, "cd" * 32
    boundary.prepare_rank_cache()
    for stale in (key, other):
        subprocess.run(["rm", "-rf", str(boundary.BUILDS / stale)], check=True)
    made = _one_pool(key, "open(os.path.join(os.environ['TORCH_EXTENSIONS_DIR'], 'ext.so'), 'w').write('built')"
                          "\ntry:\n    open(%r, 'w')\nexcept OSError as e:\n    print('refused', e.strerror)\n"
                     % str(boundary.BUILDS / key / "planted"))
    assert made.returncode == 0 and "refused" in made.stdout, made.stdout + made.stderr
    assert (boundary.BUILDS / key / "torch_extensions" / "ext.so").read_text() == "built"
    assert not (boundary.BUILDS / key / "planted").exists()
    same, another = boundary.Sandbox(build_key=key), boundary.Sandbox(build_key=other)
    try:
        cache = "boundary.Path(os.environ['TORCH_EXTENSIONS_DIR'], 'ext.so')"
        for sandbox, expected in ((same, "True"), (another, "False")):
            seen = _in_sandbox(sandbox, f"print(({cache}).exists())")
            assert seen.stdout.strip() == expected, seen.stdout + seen.stderr
    finally:
        same.close()
        another.close()
    subprocess.run(["rm", "-rf", str(boundary.BUILDS / key)], check=True)


def test_the_judges_cache_is_closed_to_the_ranks_wherever_it_lies(monkeypatch):
    """A2A_RANK_CACHE outside /tmp, /var/tmp and /dev/shm (red team 33: there the ranks saw it read-only, and one
    source read another's kept builds in the same round): a rank can list neither the cache nor its builds."""
    cache = ROOT / "build" / f".rank-cache-test-{os.getpid()}"  # below no folder a run covers
    for name, path in (("RANK_CACHE", cache), ("BUILDS", cache / "builds"), ("UID_RECORDS", cache / "owners")):
        monkeypatch.setattr(boundary, name, path)
    sandbox = None
    try:
        boundary.prepare_rank_cache()
        kept = cache / "builds" / ("ef" * 32) / "torch_extensions"
        kept.mkdir(parents=True)
        (kept / "answers").write_text("another source's")
        os.chmod(kept.parent, 0o755)  # as keep_builds leaves a key
        sandbox = boundary.Sandbox()
        code = "".join(f"try:\n    print(os.listdir({str(p)!r}))\nexcept OSError as e:\n    print('refused', e.errno)\n"
                       for p in (cache, kept))
        seen = _in_sandbox(sandbox, code)
        assert seen.returncode == 0 and seen.stdout.split("\n")[:2] == ["refused 13", "refused 13"], \
            seen.stdout + seen.stderr
    finally:
        if sandbox is not None:
            sandbox.close()
        subprocess.run(["rm", "-rf", str(cache)], check=True)

def test_every_pool_starts_from_the_judges_build_step_when_no_cache_is_named(monkeypatch):
    """The judge's build step's cache (prepare_rank_cache) seeds every pool, also in a command that names no cache
    folder of its own (`make leaderboard`): before, only a named folder was copied, and a fresh machine's clock
    built the handshake's probes again in every round (60-98 s a round, H200, 2026-11-28)."""
    for name in boundary.CACHE_FOLDERS:
        monkeypatch.delenv(name, raising=False)
    boundary.prepare_rank_cache()
    built = boundary.RANK_CACHE / "prebuilt" / "torch_extensions" / f"judge_build_{os.getpid()}" / "ext.so"
    built.parent.mkdir(parents=True, exist_ok=True)
    built.write_text("the judge's")
    sandbox = boundary.Sandbox()
    try:
        try:
            seen = _in_sandbox(sandbox, f"print(open({str(built)!r}).read())\n"
                                        f"with open({str(built)!r}, 'w') as f:\n    f.write('the rank’s')")
        finally:
            sandbox.close()
        assert seen.returncode == 0, seen.stderr
        assert seen.stdout.splitlines()[0] == "the judge's", seen.stdout
        assert built.read_text() == "the judge's"  # the rank wrote its own copy, not the judge's
    finally:
        subprocess.run(["rm", "-rf", str(built.parent)], check=True)


@pytest.mark.skipif(not shutil.which("ninja"), reason="no ninja on this machine (torch's extension builds use it)")
def test_a_rank_finds_the_judges_builds_up_to_date(tmp_path, monkeypatch):
    """A torch extension's build files name its folder, and ninja rebuilds what moved (every pool of every clock
    round rebuilt its CUDA extensions, 60-90 s a round, before): a rank sees its copy of the judge's build cache
    at the judge's own path, and ninja there has nothing to do."""
    judge = tmp_path / "extensions"
    build = judge / "ext"
    build.mkdir(parents=True)
    (build / "source.txt").write_text("source")
    (build / "build.ninja").write_text(f"rule copy\n  command = cp $in $out\nbuild {build}/built.txt: copy "
                                       f"{build}/source.txt\n")
    subprocess.run(["ninja", "-C", str(build)], check=True, capture_output=True)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(judge))
    sandbox = boundary.Sandbox()
    try:
        seen = _in_sandbox(sandbox, "import subprocess\nprint(os.environ['TORCH_EXTENSIONS_DIR'])\n"
                                    "print(subprocess.run(['ninja', '-C', os.path.join(os.environ['TORCH_EXTENSIONS_DIR'], "
                                    "'ext')], capture_output=True, text=True).stdout)")
    finally:
        sandbox.close()
    assert seen.returncode == 0, seen.stderr
    assert seen.stdout.splitlines()[0] == str(judge), seen.stdout
    assert "no work to do" in seen.stdout, seen.stdout


def test_a_pool_leaves_no_more_than_the_caps_and_nothing_through_a_link(monkeypatch):
    """What a pool leaves for the next run of its source is bounded (64 MB of junk stayed in root's cache before),
    and a cache folder a rank swapped for a link to root's files (where its parent lets it) is not copied."""
    key = "ef" * 32
    monkeypatch.setattr(boundary, "KEEP_MAX_FILES", 3)
    for code in ("for i in range(5):\n    open(os.path.join(os.environ['TORCH_EXTENSIONS_DIR'], f'f{i}'), 'w').write('x')",
                 # empty folders count too (red team 16: 60 000 of them passed the cap of one key, then the cap over
                 # every key removed every other source's builds)
                 "for i in range(5):\n    os.mkdir(os.path.join(os.environ['TORCH_EXTENSIONS_DIR'], f'd{i}'))",
                 "import shutil\ntry:\n    shutil.rmtree(os.environ['TRITON_CACHE_DIR'])\n"
                 "    os.symlink('/etc', os.environ['TRITON_CACHE_DIR'])\nexcept OSError:\n    pass  # its parent is root's"):
        subprocess.run(["rm", "-rf", str(boundary.BUILDS / key)], check=True)
        done = _one_pool(key, code)
        assert done.returncode == 0, done.stderr
        kept = [str(p) for p in (boundary.BUILDS / key).rglob("*")] if (boundary.BUILDS / key).exists() else []
        assert not kept, kept


# A child in a PID namespace nested in the pool's, whose init forks a counter: a process the pool's own namespace
# does not list (red team 13: a rank made one through a user namespace, its CPU hogs ran while other entries were
# timed, and a child of case 0 lived on in case 1). A rank can make none now (no user namespace); the sweep still
# covers one, made here by the rank's process as root, before it enters its sandbox.
NESTED_COUNTER = '''
import ctypes, time
beat = sys.argv[2]
if os.fork() == 0:
    if ctypes.CDLL(None, use_errno=True).unshare(0x20000000):
        os._exit(1)
    if os.fork() == 0:  # the nested namespace's init
        if os.fork() == 0:
            count = 0
            while True:
                count += 1
                with open(beat + ".new", "w") as out:
                    out.write(str(count))
                os.replace(beat + ".new", beat)
                time.sleep(0.01)
        os.wait()
    os._exit(0)
'''


def _count(beat: Path, deadline_s: float = 20) -> int:
    """The nested counter's last value, once it has written one."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            return int(beat.read_text())
        time.sleep(0.05)
    raise AssertionError(f"no count in {beat}")


def test_a_nested_pid_namespace_is_swept_with_its_pool():
    """A rank's grandchild counting in a nested PID namespace: the sweep between cases (every process but the
    workers) ends it."""
    sandbox = boundary.Sandbox()
    beat = boundary.run_folder(sandbox.uid) / "tmp" / "beat"
    entry = (f"import os, pickle, sys\nsys.path.insert(0, {str(ROOT)!r})\nimport boundary\n" + NESTED_COUNTER +
             "boundary.enter_rank_sandbox(pickle.loads(bytes.fromhex(sys.argv[1])))\n"
             "print('started', flush=True)\nimport time\ntime.sleep(600)\n")
    with sandbox.spawning():
        rank = subprocess.Popen([sys.executable, "-c", entry, pickle.dumps(sandbox.rank_setup()).hex(), str(beat)],
                                stdout=subprocess.PIPE, text=True)
    try:
        assert rank.stdout.readline().strip() == "started"
        first = _count(beat)
        time.sleep(0.5)
        assert _count(beat) > first  # it is alive
        sandbox.sweep({rank.pid})
        swept = _count(beat)
        time.sleep(0.5)
        assert _count(beat) == swept, "the nested counter outlived the sweep"
        assert sandbox.members() == [rank.pid]
    finally:
        rank.kill()
        rank.wait()
        rank.stdout.close()
        sandbox.close()


# One System V shared memory segment, message queue and semaphore set per rank, under keys the test names: none is
# the ranks' PID or mount namespace's, so each outlived the command before (red team 13: 2 x 64 MiB of RAM).
SYSV_PLANTS = '''
import ctypes as _ctypes
import os as _os

_MADE = []


def custom_kernel(data):
    if not _MADE:
        _MADE.append(True)
        libc, key, create = _ctypes.CDLL(None, use_errno=True), @KEY@ + data[2], 0o1000 | 0o600  # IPC_CREAT
        made = (libc.shmget(key, _ctypes.c_size_t(1 << 20), create), libc.msgget(key, create),
                libc.semget(key, 1, create))
        _os.write(2, f"HOSTILE sysv {key} {made}\\n".encode())
    return _v1_kernel(data)
'''


def _sysv_with_keys(keys: set) -> list:
    """(kind, id) of every System V object under one of `keys`."""
    found = []
    for kind in ("shm", "msg", "sem"):
        for line in Path("/proc/sysvipc", kind).read_text().splitlines()[1:]:
            key, ident = map(int, line.split()[:2])
            if key in keys:
                found.append((kind, ident))
    return found


def test_no_sysv_ipc_object_of_a_rank_outlives_the_command(tmp_path, process_token):
    """A submission whose ranks each create a shared memory segment, a message queue and a semaphore set (nothing
    of them is in the ranks' namespaces): the run passes, and after it none is left."""
    key = int(process_token[-7:], 16) << 3
    path = tmp_path / "sysv.py"
    path.write_text(v1_kernel_source() + SYSV_PLANTS.replace("@KEY@", str(key)))
    result = run_eval("test", str(path), "--world-size", "2", "--cases", "tests:0", timeout=300)
    left = _sysv_with_keys({key, key + 1})
    for kind, ident in left:  # a failing test leaves nothing either
        subprocess.run(["ipcrm", {"shm": "-m", "msg": "-q", "sem": "-s"}[kind], str(ident)], check=False)
    made = [line for line in result.stderr.splitlines() if "HOSTILE sysv" in line]
    assert result.returncode == 0 and len(made) == 2 and "-1" not in "".join(made), result.stderr[-3000:]
    assert not left, left


def test_a_uid_is_claimed_without_the_sysv_objects_an_earlier_pool_left(monkeypatch, process_token):
    """A message queue left by a pool whose clean-up was cut off: the next claim of its uid removes it first."""
    import ctypes

    offset = next(o for o in range(boundary.RANK_UID_SPAN)
                  if not (boundary.UID_RECORDS / str(boundary.RANK_UID_BASE + o)).exists())
    uid, key = boundary.RANK_UID_BASE + offset, int(process_token[-7:], 16) << 3
    child = os.fork()
    if child == 0:
        os.setgid(uid)
        os.setuid(uid)
        os._exit(0 if ctypes.CDLL(None).msgget(key, 0o1000 | 0o600) >= 0 else 1)
    assert os.waitpid(child, 0)[1] == 0 and _sysv_with_keys({key})
    monkeypatch.setattr(boundary.secrets, "randbelow", lambda _: offset)
    claimed = boundary.claim_uid()
    try:
        assert claimed == uid
        assert not _sysv_with_keys({key})
    finally:
        boundary.release_uid(claimed)
        for _, ident in _sysv_with_keys({key}):
            subprocess.run(["ipcrm", "-q", str(ident)], check=False)


@pytest.mark.parametrize("cap", ["bytes", "files"])
def test_past_the_cap_over_every_kept_build_the_least_recently_used_key_goes(tmp_path, monkeypatch, cap):
    """A source changed by one comment per run is a new build key each time (red team 13: 64 MiB kept per run, up to
    the cap of one key): with room for two keys' builds, keeping a third evicts the key least recently used (kept or
    started from), never the others."""
    monkeypatch.setattr(boundary, "BUILDS", tmp_path / "builds")
    boundary.BUILDS.mkdir(mode=0o755)
    monkeypatch.setattr(boundary, "KEEP_TOTAL_BYTES", 2500 if cap == "bytes" else 10**9)
    monkeypatch.setattr(boundary, "KEEP_TOTAL_FILES", 8 if cap == "files" else 10**9)  # a key: 2 folders, 1 file
    first, second, third = "a1" * 32, "b2" * 32, "c3" * 32
    build = "open(os.path.join(os.environ['TORCH_EXTENSIONS_DIR'], 'ext.so'), 'w').write('x' * 1000)"
    for key, code in ((first, build), (second, build), (first, "pass"), (third, build)):  # `first` used again
        done = _one_pool(key, code)
        assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in boundary.BUILDS.iterdir()) == sorted([first, third])


def test_no_key_of_the_run_under_way_is_evicted(tmp_path, monkeypatch):
    """Red team 39: three entries of one clock run kept 19 950 files each, and the cap over every key evicted a
    fourth entry's build; it built again inside the clock's charged time and failed. While a run lasts
    (protect_builds, the clock's) none of its keys goes; the next run's keeping evicts the least recently used."""
    monkeypatch.setattr(boundary, "BUILDS", tmp_path / "builds")
    boundary.BUILDS.mkdir(mode=0o755)
    monkeypatch.setattr(boundary, "KEEP_TOTAL_FILES", 8)  # two keys' builds: a key is 2 folders and 1 file
    rival, first, second, later = "d4" * 32, "e5" * 32, "f6" * 32, "a7" * 32
    build = "open(os.path.join(os.environ['TORCH_EXTENSIONS_DIR'], 'ext.so'), 'w').write('x' * 1000)"
    with boundary.protect_builds():
        for key in (rival, first, second):
            assert _one_pool(key, build).returncode == 0
        assert sorted(p.name for p in boundary.BUILDS.iterdir()) == sorted([rival, first, second])
    assert _one_pool(later, build).returncode == 0
    assert sorted(p.name for p in boundary.BUILDS.iterdir()) == sorted([second, later])


# What a rank tries beyond its pool: a TCP port and an abstract socket the test listens on, a System V segment the
# test made, a user namespace (in which it would be root), clone3 (whose flags no filter reads); and what it must
# still do: threads and a child process.
REACH = '''
import platform as _platform
import ctypes as _ctypes
import os as _os
import socket as _socket
import subprocess as _subprocess
import threading as _threading

_TRIED = []
_CLONE = {"x86_64": 56, "aarch64": 220}[_platform.machine()]


def _reach():
    libc = _ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = _ctypes.c_long
    said = []
    for name, family, address in (("tcp", _socket.AF_INET, ("127.0.0.1", @PORT@)),
                                  ("abstract", _socket.AF_UNIX, "\\0@TOKEN@")):
        try:
            with _socket.socket(family, _socket.SOCK_STREAM) as sock:
                sock.settimeout(2)
                sock.connect(address)
            said.append(f"{name}=reached")
        except OSError as error:
            said.append(f"{name}={type(error).__name__}")
    said.append(f"sysv={libc.shmget(@KEY@, 0, 0)}")
    queue = _ctypes.CDLL("librt.so.1").mq_open(f"/@TOKEN@-{_os.getpid()}".encode(), _os.O_CREAT | _os.O_RDWR, 0o600,
                                                None)
    said.append(f"queue=/@TOKEN@-{_os.getpid()}:{queue}")
    said.append(f"key={libc.syscall(248, b'user', b'@TOKEN@', b'kept', 4, _ctypes.c_int(-4))}/{_ctypes.get_errno()}")
    said.append(f"userns={libc.unshare(0x10000000)}/{_ctypes.get_errno()}")
    said.append(f"clone3={libc.syscall(435, None, 0)}/{_ctypes.get_errno()}")
    # a child of the rank's parent (CLONE_PARENT, the flags' low half: SIGCHLD), and the parent made its tracer
    parent, error = libc.syscall(_CLONE, 0x8000 | 17, None, None, None, None), _ctypes.get_errno()
    if parent == 0:  # the child, had the filter let it be born
        _os._exit(0)
    said.append(f"parent={parent}/{error}")
    said.append(f"traceme={libc.ptrace(0, 0, None, None)}/{_ctypes.get_errno()}")
    # a process of the rank's own uid seized (red team 28: two workers seized each other and hid their exits)
    sleeper = _subprocess.Popen(["sleep", "30"])
    said.append(f"seize={libc.ptrace(0x4206, sleeper.pid, None, None)}/{_ctypes.get_errno()}")
    sleeper.kill()
    sleeper.wait()
    seen = []
    thread = _threading.Thread(target=lambda: seen.append(1))
    thread.start()
    thread.join()
    said.append(f"thread={len(seen)}")
    said.append(f"child={_subprocess.run(['true']).returncode}")
    import resource as _resource
    said.append("limits=" + ",".join(str(_resource.getrlimit(getattr(_resource, name))[1])
                                     for name in ("RLIMIT_NPROC", "RLIMIT_FSIZE", "RLIMIT_NOFILE")))
    _os.write(2, ("HOSTILE reach " + " ".join(said) + "\\n").encode())


def custom_kernel(data):
    if not _TRIED:
        _TRIED.append(True)
        _reach()
    return _v1_kernel(data)
'''


def test_a_rank_reaches_no_socket_ipc_object_or_user_namespace_outside_its_pool(tmp_path, process_token):
    """The test listens on a TCP port and an abstract socket and makes a System V segment; a rank that tries to
    reach each, to leave a POSIX message queue and a key in its uid's keyring (red team 14: both outlived the
    command), to make a user namespace and to call clone3: nothing of the test's is reached and no queue is left
    (the pool's own network and IPC namespaces), the keyring and the user namespace are refused (EPERM) and clone3
    is absent (ENOSYS), ptrace of any process is refused (red team 28), while threads and child processes still start
    and the run passes; its processes and its files' size are capped (RANK_LIMITS; red team 14: a rank could make
    more processes than the kernel's pid_max)."""
    import ctypes
    import errno
    import socket

    libc, rt = ctypes.CDLL(None, use_errno=True), ctypes.CDLL("librt.so.1")
    key = int(process_token[-7:], 16) << 3 | 5
    segment = libc.shmget(key, ctypes.c_size_t(4096), 0o1000 | 0o666)
    assert segment >= 0
    try:
        with socket.create_server(("127.0.0.1", 0)) as tcp, socket.socket(socket.AF_UNIX) as abstract:
            abstract.bind("\0" + process_token)
            abstract.listen()
            path = tmp_path / "reach.py"
            path.write_text(v1_kernel_source() + REACH.replace("@PORT@", str(tcp.getsockname()[1]))
                            .replace("@TOKEN@", process_token).replace("@KEY@", str(key)))
            result = run_eval("test", str(path), "--world-size", "2", "--cases", "tests:0", timeout=300)
    finally:
        libc.shmctl(segment, 0, None)  # IPC_RMID
    said = [line.split("HOSTILE reach ")[1] for line in result.stderr.splitlines() if "HOSTILE reach" in line]
    assert result.returncode == 0 and len(said) == 2, result.stdout[-2000:] + result.stderr[-3000:]
    for line in said:
        tried = dict(item.split("=") for item in line.split())
        assert tried["tcp"] != "reached" and tried["abstract"] != "reached", line
        assert tried["sysv"] == "-1", line
        name, made = tried["queue"].split(":")
        assert made != "-1", line  # made in the pool's IPC namespace, which ended with the pool
        left = rt.mq_open(name.encode(), os.O_RDONLY)
        if left >= 0:
            rt.mq_close(left)
            rt.mq_unlink(name.encode())
        assert left == -1, f"{name} outlived the command"
        assert tried["key"] == f"-1/{errno.EPERM}", line
        assert tried["userns"] == f"-1/{errno.EPERM}" and tried["clone3"] == f"-1/{errno.ENOSYS}", line
        assert tried["parent"] == f"-1/{errno.EPERM}" and tried["traceme"] == f"-1/{errno.EPERM}", line
        assert tried["seize"] == f"-1/{errno.EPERM}", line
        assert tried["thread"] == "1" and tried["child"] == "0", line
        assert tried["limits"] == ",".join(str(boundary.RANK_LIMITS[name])
                                           for name in ("RLIMIT_NPROC", "RLIMIT_FSIZE", "RLIMIT_NOFILE"))


HOG = '''

_held = []


def custom_kernel(data):
    _held.append(bytearray(3 << 30))  # 3 GiB, every page touched: past the pool's 2 GiB
    for at in range(0, len(_held[-1]), 4096):
        _held[-1][at] = 1
    return _v1_kernel(data)
'''


@pytest.mark.skipif(boundary.memory_group(0) is None, reason="no memory cgroup on this machine (v1 or v2 with the "
                                                              "memory controller)")
def test_a_pool_past_its_memory_cap_fails_with_the_cap_named_and_leaves_no_group(tmp_path):
    """A rank that takes 3 GiB in a pool capped at 2 GiB (A2A_POOL_MEMORY_GB): the kernel kills it, the entry fails
    with 112 and the cap named (the owner outside the group goes on), and the pool's group goes with the pool; the
    run's boundary line names the cap."""
    path = tmp_path / "hog.py"
    path.write_text(v1_kernel_source() + HOG)
    result = run_eval("test", str(path), "--world-size", "2", "--cases", "tests:0", timeout=300,
                      env={boundary.POOL_MEMORY_ENV: "2"})
    assert result.returncode == 112, result.stdout[-2000:] + result.stderr[-2000:]
    assert "at the pool's memory cap, 2.0 GiB" in result.stdout + result.stderr, result.stdout[-2000:]
    uid = re.search(r"as uid (\d+) with .* at most 2\.0 GiB of memory for the pool", result.stdout + result.stderr)
    assert uid, result.stdout[-2000:]
    group = boundary.memory_group(int(uid[1]))
    assert group is None or not group.exists(), group  # other pools' groups may be there (pytest-xdist)


DEEP = '''

import os as _os


def _deep(top, levels=1500):  # past Python's recursion limit (1000): os.walk and shutil.rmtree recurse
    path = top
    for _ in range(levels):
        path = _os.path.join(path, "d")
        _os.makedirs(path, exist_ok=True)  # both ranks share the run's home
    open(_os.path.join(path, "f"), "w").close()
    return path


for _name in ("HOME", "TMPDIR", "TORCH_EXTENSIONS_DIR"):
    _deep(_os.environ[_name])
custom_kernel = _v1_kernel
'''


def test_a_tree_deeper_than_pythons_recursion_is_removed_and_not_kept(tmp_path):
    """1500 nested folders in the rank's home, TMPDIR and extension cache (red team 16: the judge's clean-up raised
    RecursionError, the human face then hung, the clock ended with 114, and every later command failed at its
    start, its orphan sweep meeting the same tree): the run passes, its run folder goes (nothing for a later
    command's sweep), and nothing is kept for its source."""
    path = tmp_path / "deep.py"
    path.write_text(v1_kernel_source() + DEEP)
    key = boundary.Sandbox.source_key(path)
    result = run_eval("test", str(path), "--world-size", "2", "--cases", "tests:0", timeout=120)
    said = result.stdout[-2000:] + result.stderr[-2000:]
    assert result.returncode == 0 and "RecursionError" not in said, said
    uid = re.search(r"as uid (\d+) with", result.stdout + result.stderr)
    assert uid and not boundary.run_folder(int(uid[1])).exists(), said
    assert not (boundary.BUILDS / key).exists()


def test_a_tree_is_removed_reading_each_folder_once_past_links_and_mounts(tmp_path, monkeypatch):
    """boundary.remove_tree on 1500 nested folders (past Python's recursion), 2000 side by side (red team 17: a
    parent read again after each child made 300 000 take minutes), a link out of the tree and a file system mounted
    inside: each folder is read once (a few more for the folders moved up from deep below), the link's target and
    the mount's files stay, and everything else goes."""
    top = tmp_path / "tree"
    top.mkdir()
    folder = os.open(top, os.O_RDONLY)
    for _ in range(1500):  # by descriptor: the path outgrows PATH_MAX
        os.mkdir("d", dir_fd=folder)
        inner = os.open("d", os.O_RDONLY, dir_fd=folder)
        os.close(folder)
        folder = inner
    os.close(os.open("f", os.O_CREAT | os.O_WRONLY, dir_fd=folder))
    os.close(folder)
    for i in range(2000):
        (top / "wide" / str(i)).mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "kept").write_text("x")
    (top / "link").symlink_to(outside)
    (top / "mounted").mkdir()
    assert subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(top / "mounted")]).returncode == 0
    try:
        (top / "mounted" / "kept").write_text("x")
        reads = []
        scandir = os.scandir
        monkeypatch.setattr(boundary.os, "scandir", lambda fd: reads.append(fd) or scandir(fd))
        boundary.remove_tree(top)
        assert len(reads) <= 1500 + 2000 + 2 + 1500 // boundary.REMOVE_DEPTH + 2, len(reads)
        assert (outside / "kept").exists() and (top / "mounted" / "kept").exists()
        assert sorted(p.name for p in top.iterdir()) == ["mounted"]
    finally:
        subprocess.run(["umount", str(top / "mounted")])


def test_a_pools_folders_are_its_own_file_systems_capped_in_entries_and_gone_at_its_end(monkeypatch):
    """The run folder and the /dev/shm folder are file systems of the pool's own: a rank that makes folders past
    RUN_INODES gets ENOSPC (red team 17 made 300 000, whose removal took 52.6 s), and the pool's end unmounts them
    and leaves neither."""
    monkeypatch.setattr(boundary, "RUN_INODES", 300)
    sandbox = boundary.Sandbox()
    try:
        folders = [boundary.run_folder(sandbox.uid), boundary.shm_folder(sandbox.uid)]
        assert all(os.path.ismount(folder) for folder in folders), folders
        done = _in_sandbox(sandbox, "import errno\nfor place in ('/tmp', '/dev/shm'):\n    made = 0\n"
                                    "    try:\n        for i in range(400):\n"
                                    "            os.mkdir(os.path.join(place, str(i)))\n            made += 1\n"
                                    "    except OSError as error:\n        print(place, made, error.errno == errno.ENOSPC)\n")
        said = dict((line.split()[0], line.split()[1:]) for line in done.stdout.splitlines())
        assert done.returncode == 0 and said["/tmp"][1] == said["/dev/shm"][1] == "True", done.stdout + done.stderr
        assert all(int(said[place][0]) < 300 for place in said), said
    finally:
        sandbox.close()
    assert not any(folder.exists() for folder in folders), folders


BORN_OF = "import os as _os, sys as _sys\nprint(f'born of pid {_os.getppid()}', file=_sys.stderr, flush=True)\n"


def test_the_judges_faces_fork_ranks_from_one_zygote_and_the_runners_face_spawns_them(bundle, tmp_path):
    """The human face's ranks are forked by their pool's zygote (the same parent, inside the ranks' namespace); the
    runner's face keeps the runner's spawn: each rank's parent is the owner, outside the namespace (pid 0 there)."""
    submission = tmp_path / "born.py"
    submission.write_text(BORN_OF + (ROOT / "submissions" / "all2all" / "v1_torch_sort.py").read_text())
    human = run_eval("test", str(submission), "--world-size", "2", "--backend", "gloo", "--cases", "tests:0")
    parents = re.findall(r"\[rank\d\] born of pid (\d+)", human.stdout + human.stderr)
    assert human.returncode == 0 and len(parents) == 2 and len(set(parents)) == 1 and parents[0] != "0", \
        human.stdout + human.stderr

    from tests.conftest import run_bundle

    (bundle / "submission.py").write_text(submission.read_text())
    (bundle / "one.txt").write_text("num_experts: 8; experts_per_token: 2; hidden_dim: 256; max_num_tokens: 12; "
                                    "seed: 5; world_size: 2\n")
    code, output, stderr = run_bundle(bundle, "test", "one.txt")
    assert code == 0 and re.findall(r"born of pid (\d+)", stderr) == ["0", "0"], stderr


def _open_files(pid) -> set:
    """What process `pid` ("self": this one) holds open, by (device, inode), but its stdin."""
    held = set()
    for name in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            if name != "0":
                st = os.stat(f"/proc/{pid}/fd/{name}")
                held.add((st.st_dev, st.st_ino))
    return held


def _descriptors(rank, world_size):
    """What this rank holds open, by (device, inode), but its stdin."""
    return sorted(_open_files("self"))


@pytest.mark.parametrize("birth", ["zygote", "spawn"])
def test_a_rank_holds_nothing_its_zygote_or_the_owners_helpers_hold(birth):
    """The zygote is root and forks every worker of its pool: a worker that kept any of its descriptors (its
    request pipe above all) could ask it for more. A spawned worker inherited the pipe to multiprocessing's resource
    tracker, a root process outside the pool (red team 19: raw text on the judge's stderr, 2.4 GB of the tracker's
    memory past the pool's cap). Each rank's open files share none with either (a pipe's two ends are one inode)."""
    import multiprocessing.resource_tracker

    import eval as core

    pool = core.RankPool(2, "gloo", birth=birth)
    try:
        results = pool.run("call", core.TestCase(args={"world_size": 2}, spec="descriptors"), 120,
                           {"fn": _descriptors, "args": ()})
        helpers = [multiprocessing.resource_tracker._resource_tracker._pid]
        if birth == "zygote":
            helpers.append(pool.zygote.process.pid)
            parents = [int(boundary.process_stat(worker[0].pid)[1]) for worker in pool.workers]
            assert parents == [helpers[-1]] * 2
        held = set().union(*map(_open_files, helpers))
    finally:
        pool.shutdown()
    assert all(result.ok for result in results), [result.value for result in results]
    assert len(held) >= (3 if birth == "zygote" else 1)  # the tracker's pipe; the zygote's request and wake pipes
    for result in results:
        assert not {tuple(pair) for pair in result.value} & held, (result.value, held)


def test_a_kept_build_is_never_setuid_nor_writable_by_others(tmp_path, monkeypatch):
    """Red team 18: a rank's program made setuid in its build cache was kept as root's with the bit on (any local
    user then ran it as root), and a 0666 file stayed writable by all. Kept files are 0755 or 0644, times kept."""
    monkeypatch.setattr(boundary, "BUILDS", tmp_path / "builds")
    boundary.BUILDS.mkdir(mode=0o755)
    key = "5e" * 32
    done = _one_pool(key, """
folder = os.environ['TORCH_EXTENSIONS_DIR']
for name, mode in (('tool', 0o6777), ('data', 0o666), ('plain', 0o700)):
    path = os.path.join(folder, name)
    open(path, 'w').write('x')
    os.chmod(path, mode)
    os.utime(path, ns=(10**18, 10**18))
""")
    assert done.returncode == 0, done.stderr
    kept = {p.name: p.stat() for p in (boundary.BUILDS / key).rglob("*") if p.is_file()}
    assert {name: stat.S_IMODE(info.st_mode) for name, info in kept.items()} == {"tool": 0o755, "data": 0o644,
                                                                      "plain": 0o755}, kept
    assert {info.st_mtime_ns for info in kept.values()} == {10**18} and {info.st_uid for info in kept.values()} == {0}


def test_a_copy_cut_off_leaves_nothing_and_a_stale_one_goes(tmp_path, monkeypatch):
    """Red team 18: a path that fits under the rank's view but not under root's copy (4 KiB at most) cut root's copy
    off, and its half (400 MiB a run, a sparse file beside it) stayed in a dot folder no cap counted. A copy cut off
    goes whole; one a killed judge left goes once it is an hour old."""
    monkeypatch.setattr(boundary, "BUILDS", tmp_path / "builds")
    boundary.BUILDS.mkdir(mode=0o755)
    key = "7a" * 32
    done = _one_pool(key, """
path = os.environ['TORCH_EXTENSIONS_DIR']
open(os.path.join(path, 'first.so'), 'w').write('x' * 1000)
length = (4078 - len(path)) // 16 - 1  # 16 folders deep at most are kept
for _ in range(16):
    path = os.path.join(path, 'x' * length)
os.makedirs(path)
open(os.path.join(path, 'deep'), 'w').write('x')
print('made', len(os.path.join(path, 'deep')))
""")
    assert done.returncode == 0 and "made 40" in done.stdout, done.stdout + done.stderr
    assert list(boundary.BUILDS.iterdir()) == []

    stale, fresh = boundary.BUILDS / f".{key}-stale", boundary.BUILDS / f".{key}-fresh"
    for folder in (stale, fresh):
        (folder / "torch_extensions").mkdir(parents=True)
    os.utime(stale, (time.time() - 2 * boundary.STALE_COPY_S,) * 2)
    boundary._evict_builds()
    assert sorted(p.name for p in boundary.BUILDS.iterdir()) == [fresh.name]


def _in_rank_sandbox(body: str) -> str:
    """A rank's program: it enters the sandbox its first argument describes (Sandbox.rank_setup, pickled, in hex),
    then runs `body`."""
    return (f"import os, pickle, signal, sys, time\nsys.path.insert(0, {str(ROOT)!r})\nimport boundary\n"
            "boundary.enter_rank_sandbox(pickle.loads(bytes.fromhex(sys.argv[1])))\n" + body)


# Loopback TCP connections whose peers never read: each sender queues until the kernel refuses more (EAGAIN), over
# up to 600 connections, and says how many bytes it queued in all (red team 17, 21).
TCP_FILL = """
import socket
server = socket.create_server(("127.0.0.1", 0), backlog=1024)
queued, idle, held = 0, 0, []
chunk = bytes(1 << 16)
while len(held) < 600 and idle < 40:
    sender = socket.create_connection(server.getsockname())
    sender.setblocking(False)
    held += [sender, server.accept()[0]]
    before = queued
    try:
        while True:
            queued += sender.send(chunk)
    except BlockingIOError:
        pass
    idle = idle + 1 if queued - before < len(chunk) else 0
print(queued, flush=True)
"""


@pytest.mark.skipif(not Path(boundary.CGROUP_ROOT, "memory", "memory.kmem.tcp.limit_in_bytes").exists(),
                    reason="no cgroup v1 memory controller with TCP buffer accounting (v2 counts buffers as memory)")
def test_a_pools_socket_buffers_stay_within_their_share_of_its_cap(monkeypatch):
    """cgroup v1 counts TCP buffers apart from a group's memory (red team 21: 0.8 GiB of memory and 1.0 GiB of
    buffers in a pool capped at 1 GiB): a pool capped at 0.5 GiB queues at most its TCP share of it on loopback."""
    monkeypatch.setenv(boundary.POOL_MEMORY_ENV, "0.5")
    sandbox = boundary.Sandbox()
    try:
        if not sandbox.guards.memory_bytes:
            pytest.skip(f"no memory group for the pool ({sandbox.guards.memory_off})")
        with sandbox.spawning():
            rank = subprocess.run([sys.executable, "-c", _in_rank_sandbox(TCP_FILL),
                                   pickle.dumps(sandbox.rank_setup()).hex()], capture_output=True, text=True,
                                  timeout=120)
        assert rank.returncode == 0, rank.stderr[-2000:]
        share = boundary.TCP_SHARE * (1 << 29)
        assert 0 < int(rank.stdout) <= share + (8 << 20), (int(rank.stdout), share)
    finally:
        sandbox.close()


# 1 GiB in a memfd, sent with both ends of a unix socket pair into the pair's own queue, every descriptor then closed:
# only the kernel's unix-socket collector frees it, in a worker of its own, after the pool's processes are gone
# (red team 22: 3 GiB drained through the next entry's visits).
IN_FLIGHT = """
import array, socket
fd = os.memfd_create("kept")
block = b"\\1" * (1 << 20)
for _ in range(1024):
    os.write(fd, block)
a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
b.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [a.fileno(), b.fileno(), fd]))])
os.close(fd)
a.close()
b.close()
print("in flight", flush=True)
time.sleep(600)
"""


def _shmem_bytes() -> int:
    return 1024 * int(next(line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                           if line.startswith("Shmem:")))


@pytest.mark.skipif(boundary.memory_group(0) is None, reason="no memory cgroup on this machine (v1 or v2 with the "
                                                              "memory controller)")
def test_memory_a_pool_kept_in_flight_is_freed_before_its_end_returns():
    """Memory a rank left to the kernel's own collector (a memfd in flight in a unix socket's queue, no descriptor
    left): the pool's end returns only once the kernel has freed it, so that it is not freed during the next
    entry's visits."""
    sandbox = boundary.Sandbox()
    rank = None
    try:
        if not sandbox.guards.memory_bytes:
            pytest.skip(f"no memory group for the pool ({sandbox.guards.memory_off})")
        before = _shmem_bytes()
        with sandbox.spawning():
            rank = subprocess.Popen([sys.executable, "-c", _in_rank_sandbox(IN_FLIGHT),
                                     pickle.dumps(sandbox.rank_setup()).hex()], stdout=subprocess.PIPE, text=True)
        assert rank.stdout.readline().strip() == "in flight"
        assert _shmem_bytes() - before > 900 << 20
        assert sandbox.close()
        assert _shmem_bytes() - before < 128 << 20, (_shmem_bytes() - before) >> 20
    finally:
        if rank is not None:
            rank.kill()
            rank.wait()
            rank.stdout.close()
        sandbox.close()


@pytest.mark.skipif(boundary.memory_group(0) is None, reason="no memory cgroup on this machine (v1 or v2 with the "
                                                              "memory controller)")
@pytest.mark.parametrize("killed", ["the owner", "the owner, its guardian and the init"])
def test_a_pool_whose_owner_is_killed_ends_with_its_group(tmp_path, killed):
    """SIGKILL to a pool's owner while a rank spins: the guardian ends the namespace and the group goes with the uid.
    With the guardian and the init killed too (red team 20: the groups stayed and the uid's record went, so no later
    command tried again), the next command's sweep removes both."""
    owner_code = (f"import pickle, subprocess, sys, time\nsys.path.insert(0, {str(ROOT)!r})\nimport boundary\n"
                  "sandbox = boundary.Sandbox()\n"
                  "entry = ('import pickle, sys\\nsys.path.insert(0, ' + repr(sys.path[0]) + ')\\nimport boundary\\n'\n"
                  "         'boundary.enter_rank_sandbox(pickle.loads(bytes.fromhex(sys.argv[1])))\\nwhile True:\\n    pass\\n')\n"
                  "with sandbox.spawning():\n"
                  "    rank = subprocess.Popen([sys.executable, '-c', entry, pickle.dumps(sandbox.rank_setup()).hex()])\n"
                  "time.sleep(0.5)\n"
                  "group = boundary.memory_group(sandbox.uid) if sandbox.guards.memory_bytes else None\n"
                  "print(rank.pid, sandbox.uid, group,\n"
                  "      sandbox.parent.pid, sandbox.init_pid, flush=True)\n"
                  "time.sleep(600)\n")
    owner = subprocess.Popen([sys.executable, "-c", owner_code], stdout=subprocess.PIPE, text=True)
    try:
        rank, uid, group, guardian, init = owner.stdout.readline().split()
        if group == "None":
            pytest.skip("the kernel made no memory group for the pool")
        assert str(rank) in Path(group, "cgroup.procs").read_text().split()
        if killed != "the owner":
            for pid in (guardian, init):
                os.kill(int(pid), signal.SIGKILL)
    finally:
        owner.kill()
        owner.wait()
        owner.stdout.close()
    if killed != "the owner":
        time.sleep(1)  # no one of this pool is left to remove them (another test's command may sweep them first)
        boundary.sweep_orphans()  # the next command's first act
        assert not (boundary.UID_RECORDS / uid).exists()
    deadline = time.monotonic() + 20
    while (not boundary.has_ended(int(rank)) or Path(group).exists()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert boundary.has_ended(int(rank)) and not Path(group).exists(), (rank, group)


def test_a_process_whose_main_thread_ended_while_others_run_has_not_ended(tmp_path):
    """Red team 19: a child whose main thread called pthread_exit reads as a zombie in /proc/<pid>/stat while its
    other threads spin on; read as ended, it was left out of the sweep between cases."""
    ready = tmp_path / "ready"
    code = ("import ctypes, sys, threading\n"
            "def spin():\n"
            "    open(sys.argv[1], 'w').write('spinning')\n"
            "    while True:\n"
            "        pass\n"
            "threading.Thread(target=spin).start()\n"
            "ctypes.CDLL(None).pthread_exit(None)\n")
    child = subprocess.Popen([sys.executable, "-c", code, str(ready)])
    try:
        deadline = time.monotonic() + 30
        while not (ready.exists() and boundary.process_stat(child.pid)[0] == "Z") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert boundary.process_stat(child.pid)[0] == "Z", "the main thread did not end"
        assert not boundary.has_ended(child.pid)
    finally:
        child.kill()
        child.wait()
    assert boundary.has_ended(child.pid)


def test_a_child_of_the_owner_left_in_the_namespace_does_not_hold_its_end():
    """A PID namespace ends only once each of its processes is reaped: a child of the pool's owner left in it
    (red team 19: a rank's CLONE_PARENT child, under the runner's spawn) held the guardian and the owner's close
    forever. The close reaps it and ends within seconds."""
    code = (f"import os, sys, time\nsys.path.insert(0, {str(ROOT)!r})\nimport boundary\n"
            "sandbox = boundary.Sandbox()\n"
            "with sandbox.spawning():\n"
            "    child = os.fork()\n"
            "    if child == 0:\n"
            "        time.sleep(600)\n"
            "        os._exit(0)\n"
            "started = time.monotonic()\n"
            "sandbox.close()\n"
            "print('closed in', round(time.monotonic() - started, 1), flush=True)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "closed in" in done.stdout, done.stdout + done.stderr
    assert float(done.stdout.split()[2]) < 10, done.stdout


def _initial_seed(rank, world_size):
    import torch
    import torch.distributed as dist

    dist.barrier()  # both ranks through the group's setup before either leaves it (a rank that left first closed
    return torch.initial_seed()  # its peer's connections mid-setup, on a loaded 2-core CI machine)


def test_forked_ranks_do_not_share_torchs_random_state():
    """Red team 19: both ranks of a pool forked from one zygote began with the zygote's torch generator (the same
    initial seed, the same draws); spawned ones each draw their own. A forked worker reseeds."""
    import eval as core

    pool = core.RankPool(2, "gloo", birth="zygote")
    try:
        results = pool.run("call", core.TestCase(args={"world_size": 2}, spec="seeds"), 120,
                           {"fn": _initial_seed, "args": ()})
    finally:
        pool.shutdown()
    assert all(result.ok for result in results) and len({result.value for result in results}) == 2, results


NAMED_IN_BYTES = r"""
import ctypes, sys, time
ctypes.CDLL(None, use_errno=True).prctl(15, ctypes.c_char_p(b"\xff\xfe) Z 1"), 0, 0, 0)  # PR_SET_NAME
print("named", flush=True)
time.sleep(60)
"""


def test_a_process_named_in_any_bytes_does_not_end_a_look_over_proc():
    """Any process may name itself with bytes that are not UTF-8, and with ') Z 1' in them (red team 26: one such
    process, anywhere on the machine, ended every judge command that looked for a pool's descendants, exit 1). Its
    stat still reads right, and it is found below its parent."""
    child = subprocess.Popen([sys.executable, "-c", NAMED_IN_BYTES], stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline() == b"named\n"
        assert Path(f"/proc/{child.pid}/comm").read_bytes().startswith(b"\xff\xfe")
        fields = boundary.process_stat(child.pid)
        assert fields[0] in "SR" and int(fields[1]) == os.getpid(), fields
        assert child.pid in boundary.descendants(os.getpid())
        assert not boundary.has_ended(child.pid)
    finally:
        child.kill()
        child.wait()


def test_an_owner_mark_that_is_no_mark_ends_no_judge_command_and_no_process(tmp_path, monkeypatch):
    """Red team 27: a rank's child whose owner mark held a 5000-digit pid made every judge command that started
    meanwhile end with a raw ValueError (int() of more than 4300 digits) in its first act, the orphan sweep; a
    temporary folder's mark of three parts did the same with a TypeError. A mark that is not one names no run's
    process: the sweep passes it by and kills nothing."""
    monkeypatch.setattr(boundary.tempfile, "gettempdir", lambda: str(tmp_path))
    (tmp_path / "a2a-planted").mkdir()
    (tmp_path / "a2a-planted" / boundary.TEMP_OWNER_MARK).write_text("1:2:3")
    marked = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                              env=dict(os.environ, **{boundary.RUN_OWNER: "9" * 5000 + ":1"}))
    try:
        time.sleep(0.2)
        assert marked.pid not in boundary.sweep_orphans()
        assert marked.poll() is None and (tmp_path / "a2a-planted").exists()
    finally:
        marked.kill()
        marked.wait()


@pytest.mark.skipif(os.geteuid() != 0, reason="a process of a pool's uid needs root to start")
def test_a_pool_uids_process_is_read_no_further_than_its_bound():
    """Red team 27: 600 children of a rank with 1.9 MiB of environment each made every judge command's start read
    1.1 GB (20 s where 2 s is usual). Of a process of a pool's uid the scan reads its first POOL_ENVIRON_BYTES."""
    uid = boundary.RANK_UID_BASE + boundary.RANK_UID_SPAN - 1
    big = subprocess.Popen([sys.executable, "-c", f"import os, time; os.setgid({uid}); os.setuid({uid}); "
                            "os.execve('/bin/sleep', ['sleep', '60'], {'PAD': 'x' * (120 << 10), 'PAD2': 'y' * (120 << 10), "
                            "'PAD3': 'z' * (120 << 10)})"])
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            found = dict(boundary.other_processes()).get(big.pid, b"")
            if b"PAD3" in found or len(found) >= boundary.POOL_ENVIRON_BYTES:
                break
            time.sleep(0.05)
        assert len(found) == boundary.POOL_ENVIRON_BYTES, len(found)
    finally:
        big.kill()
        big.wait()


def _environ_starts(pid: int, prefix: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as environ:
            return environ.read(len(prefix)) == prefix
    except OSError:
        return False


@pytest.mark.skipif(os.geteuid() != 0, reason="a process of a pool's uid needs root to start")
def test_over_one_scan_the_pool_uids_processes_are_read_no_further_than_the_total(monkeypatch):
    """Red team 28: 3000 children of 260 KiB each (each within the per-process bound) still made every other judge
    command's start 7.8x slower. Over one scan the pool uids' processes are read up to POOL_ENVIRON_TOTAL_BYTES."""
    monkeypatch.setattr(boundary, "POOL_ENVIRON_TOTAL_BYTES", 600 << 10)  # the bound, at a size a test can reach
    uid = boundary.RANK_UID_BASE + boundary.RANK_UID_SPAN - 1
    code = (f"import os; os.setgid({uid}); os.setuid({uid}); "
            "os.execve('/bin/sleep', ['sleep', '60'], {'PAD': 'x' * (300 << 10)})")
    children = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(4)]
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not all(_environ_starts(child.pid, b"PAD=") for child in children):
            time.sleep(0.05)
        read = dict(boundary.other_processes())
        sizes = [len(read.get(child.pid, b"")) for child in children]
        assert sum(sizes) <= 600 << 10 and min(sizes) < boundary.POOL_ENVIRON_BYTES, sizes
    finally:
        for child in children:
            child.kill()
            child.wait()


# Red teams 39 and 40: secrets under names the allowlist passes, each of which reached every rank.
SECRETS_39 = {
    "CUDA_A_JWT": "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9",
    "CUDA_A_GOOGLE": "AIzaSyD-abcdefghijklmnopqrstuvwxyz01234",
    "CUDA_A_HOOK": "https://hooks.slack.com/services/T00000000/B00000000/XXXXXXXXXXXXXXXXXXXXXXXX",
    "CUDA_A_COMMA": "ghp_abcdefghijklmnopqrstuvwxyz0123456789,other",
    "CUDA_A_COLON": "x:ghp_abcdefghijklmnopqrstuvwxyz0123456789",
    "CUDA_A_NPM": "npm_abcdefghijklmnopqrstuvwxyz0123456789",
    "CUDA_A_PYPI": "pypi-AgEIcHlwaS5vcmcCJGFiY2RlZmdoaWprbG1ub3BxcnN0",
    "CUDA_A_HEADER": "Authorization: Bearer abcdefghijklmnopqrstuvwxyz0123",
    "CUDA_A_AGE": "AGE-SECRET-KEY-1QQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQ",
    "CUDA_A_SEARCH": "https://search.example.net/indexes?api-version=1&api-key=S3CR3T",
    "CUDA_A_LOGIN": "https://example.net/login?user=me&pass=S3CR3T",
    "CUDA_A_DOCKER": "dckr_pat_abcdefghijklmnopqrstuvwxyz0",
    "CUDA_A_STRIPE": "rk_live_abcdefghijklmnopqrstuvwxyz",
    "CUDA_A_SENDGRID": "SG.abcdefghijklmnopqrstuv.abcdefghijklmnopqrstuvwxyz0123456789ABCDE",
    "CUDA_A_JSON": '{"token": "S3CR3T"}',
    "CUDA_A_SK": "sk-abcdefghijklmnopqrstuvwx.more",
    "CUDA_A_URL": "https://user:pa ss@host.example/x",
    "CUDA_A_BASIC": "Basic dXNlcjpodW50ZXIy",
    "CUDA_PWD": "S3CR3T", "NCCL_A_JWT_NAME": "S3CR3T", "TORCH_A_BEARER": "S3CR3T", "TRITON_A_PSK": "S3CR3T",
    "HIP_A_HMAC": "S3CR3T", "CUDA_A_SESSIONID": "S3CR3T", "CUDA_A_PRIVKEY": "S3CR3T", "CUDA_A_SSHKEYFILE": "S3CR3T",
    # red team 40
    "TORCH_A_DSN": "user:password@host:5432", "NCCL_A_HEADER": "Token abcdefghijklmnopqrst",
    "TORCH_A_OAUTH": "ya29.a0AfH6SMBabcdefghijklmnop", "OMP_A_URL": "https://host/x?AccessKeyId=abc",
    "OMP_A_DICT": "{'api_key': 'abcd'}", "OMP_A_DATABRICKS": "dapi0123456789abcdef0123456789abcdef",
    "NCCL_KEY1": "S3CR3T", "CUDA_PW": "S3CR3T", "NCCL_NET_PLUGIN_TOK": "S3CR3T",
    # a bare key: no prefix, no name (red teams 39 and 40)
    "CUDA_W": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "TORCH_A_ARGS": "--key=Zk3q9XvB2mLr8TtYw1Pa5Hc7Ns0Ue4Dg",
    # a knob named like a secret keeps its value check
    "NCCL_IB_PKEY": "https://user:S3CR3T@host",
    # red team 41: formats that say what they are, and credentials on a command line
    "CUDA_A_DOPPLER": "dop_v1_" + "0123456789abcdef" * 4, "NCCL_A_NPMRC": "//registry.npmjs.org/:_authToken=npm01234",
    "TORCH_A_VAULT": "hvs.CAESIJabcdefghijklmnopqrstuvwxyz0123456789",
    "TRITON_A_TELEGRAM": "123456789:AAHfiqksKZ8WmR2zSjiQ7_v4TMAKdiHm9T0", "CUDA_A_SHOPIFY": "shpat_" + "0a1b2c3d" * 4,
    "CUDA_A_ATLASSIAN": "ATATT3xFfGF0abcdefghijklmnopqrstuvwxyz", "CUDA_A_DOPPLER_ST": "dp.st.dev.abcdefghijklmnop1234",
    "CUDA_A_LINEAR": "lin_api_abcdefghijklmnopqrstuvwx", "CUDA_A_NOTION": "secret_abcdefghijklmnopqrstuvwxyz0123",
    "CUDA_A_REPLICATE": "r8_abcdefghijklmnopqrstuvwxyz", "CUDA_A_GROQ": "gsk_abcdefghijklmnopqrstuvwxyz",
    "CUDA_A_PPLX": "pplx-abcdefghijklmnopqrstuvwxyz", "CUDA_A_TWILIO": "SK" + "0123456789abcdef" * 2,
    "CUDA_A_DISCORD": "MTAxMjM0NTY3ODkwMTIzNDU2.GhIjKl.abcdefghijklmnopqrstuvwxyz0123",
    "CUDA_A_CURL": "curl -u admin:hunter2 https://host", "CUDA_A_NETRC": "machine github.com login me password hunter2",
    # red team 42: a url-safe key (Fernet, secrets.token_urlsafe)
    "CUDA_NOTE": "Zt3k9Qw_L2mN8xP4vR7sT1uY6aB0cD5eF-gH3jK9lM=",
    "CUDA_A_SENDGRID_EXACT": "SG.abcdefghijklmnopqrstuv.abcdefghijklmnopqrstuvwxyz0123456789ABCDEFG",
    # red team 43: a Discord webhook, docker's config, mysql's password flag
    "CUDA_A_WEBHOOK": "https://discord.com/api/webhooks/123456789012345678/abcdefghijklmnop",
    "CUDA_A_DOCKER": '{"auths": {"registry.io": {"auth": "dXNlcjpodW50ZXIy"}}}', "CUDA_A_MYSQL": "mysql -uroot -phunter2 db",
    # red team 44: other clients' password options, Postman's keys
    "TORCH_A_SSH": "sshpass -p hunter2 ssh build@host", "TORCH_A_REDIS": "redis-cli -h cache -a hunter2secret",
    "TORCH_A_SMB": "smbclient //srv/share -U admin%hunter2", "TORCH_A_OPENSSL": "openssl rsa -passin pass:hunter2",
    "TORCH_A_LDAP": "ldapsearch -x -w hunter2 -b dc=x", "TORCH_A_PMAK": "PMAK-0123456789abcdef01234567-0123456789abcdef",
    # left open by red team 45: a config file's line in a variable
    "TORCH_A_YAML": "user: me\npassword: hunter2", "TORCH_A_TOML": 'token = "hunter2"',
    "TORCH_A_INI": "[db]\napi_key=hunter2",
    # red team 46: a personal access token and a one-time password's seed, under their usual names
    "AZURE_DEVOPS_EXT_PAT": "k5n2q7wzr4", "GITHUB_PAT": "0123456789abcdef", "TOTP_SEED": "JBSWY3DPEHPK3PXP",
    # red team 47: more of a config's key words, curl's long option, a passcode
    "TORCH_HUB_PASSCODE": "hunter2", "NCCL_CFG_YAML": "passphrase: hunter2", "NCCL_OPT": "pass: hunter2",
    "TRITON_CFG_YAML": "private_key: hunter2-abcdef", "TORCH_CFG_TOML": "api_token = 'hunter2'",
    "TORCH_CURL_ARGS": "--user bob:hunter2",
}
# What a GPU, a compiler, Python and the collectives read: none of it is a secret.
PLAIN = {"PATH": "/usr/local/sbin:/opt/sk-learn-abcdefghijklmnopqrst/bin:/usr/bin", "NCCL_SOCKET_IFNAME": "eth0",
         "LD_LIBRARY_PATH": "/usr/local/cuda/lib64:/opt/x", "CUDA_VISIBLE_DEVICES": "0,1", "NCCL_DEBUG": "INFO",
         "TRITON_CACHE_DIR": "/root/.triton", "PYTHONPATH": "/a/b:/c", "TORCH_CUDA_ARCH_LIST": "9.0",
         "HIP_URL": "https://download.pytorch.org/whl/cu130", "NVIDIA_DRIVER_CAPABILITIES": "compute,utility",
         "CXXFLAGS": "-O2 -march=native", "LD_PRELOAD": "/tmp/s/build/nccl/lib/libnccl.so.2.30.7", "HSA_XNACK": "1",
         "TORCH_EXTENSIONS_DIR": "/root/.cache/torch_extensions", "MASTER_ADDR": "127.0.0.1", "LANG": "C.UTF-8",
         "TORCHINDUCTOR_DISABLED_PASSES": "a,b", "MASTER_PORT": "29500", "NCCL_SOCKET_FAMILY": "AF_INET", "PWD": "/work",
         # knobs whose names hold KEY (red team 40), and long words that are no key: GPU UUIDs, a commit, a path
         "TORCH_COMPILE_CACHE_KEY_TAG": "run7", "TRITON_REDIS_KEY_FORMAT": "{cache_dir}_{key}", "NCCL_IB_PKEY": "0x8001",
         "UCX_IB_PKEY": "0x8001", "TORCH_COMPILE_STICKY_PGO_KEY": "job42",
         "NVIDIA_VISIBLE_DEVICES": "GPU-e3e2278b-63de-22da-0c81-8cb2488b203a,GPU-51873551-a40f-3cd1-a0bc-751926cd60be",
         "A2A_COMMIT": "b58c7721b0d1e6f5a3c49e2b7d8a1f0c6e5d4b3a",
         "TRITON_HOME": "/opt/Python312/lib/Python3Packages/Triton36Cache/ModulesABC",
         # red team 42: a locale list, a host named sg.*, a relative path of mixed case
         "LANGUAGE": "sr_RS:sr@latin", "MASTER_ADDR": "sg.compute-cluster-node01.internal",
         "PYTHONPATH_EXTRA": "x", "NCCL_TOPO_FILE": "ThirdParty/PyTorchExtensions2024/Src/TopologyXml9",
         "CUDA_VISIBLE_DEVICES_MIG": "MIG-GPU-e3e2278b-63de-22da-0c81-8cb2488b203a/1/0",
         "CFLAGS": "-pthread -pipe -O2", "CXX": "g++ -pthread", "CPPFLAGS": "-O2 -I/usr/include/mysql -pthread -pie",
         # words that a config's secret line begins with, in a path list or a knob
         "LD_LIBRARY_PATH_2": "/opt/token:/usr/lib:/srv/secret:/x", "TORCH_LOGS": "+dynamo,recompiles,token",
         "NCCL_PAT_ENABLE": "1",
         # red team 47: a relative folder of mixed case, taken for a bare key
         "TORCH_TRACE": "runs/TraceOfV9_Experts8_Tokens256_H7168",
         "CUDA_MPS_LOG_DIRECTORY": "logs/MpsLogsForRun2026_November_H200x8"}


def test_secrets_under_names_the_ranks_may_have_are_told_apart_from_what_they_need():
    missed = sorted(name for name, value in SECRETS_39.items() if not boundary.is_secret(name, value))
    taken = sorted(name for name, value in PLAIN.items() if boundary.is_secret(name, value))
    assert not missed and not taken, (missed, taken)


def test_a_file_of_a_ranks_words_is_named_and_kept_where_no_rank_reads_it(tmp_path):
    """Red team 41 read a build log at 0644; red team 42 read 16 bits of an input from a log's name, a plain hash of
    the text its rank chose, in a folder every pool could list. The file is 0600, its folder 0700, and its name a
    hash keyed by this process: stable here, no plain hash of the text."""
    import hashlib

    text = b"Error building extension 'x'\nword 48204"
    path = tmp_path / "logs" / f"build-{boundary.owners_name(text)}.log"
    boundary.write_owners_only(path, text, closed_folder=True)
    assert path.read_bytes() == text and boundary.owners_name(text) == path.name[6:-4]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert boundary.owners_name(text) not in (hashlib.sha256(text).hexdigest(), hashlib.blake2b(text).hexdigest())
    assert not hashlib.sha256(text).hexdigest().startswith(boundary.owners_name(text))


def test_the_judges_logs_follow_no_link_and_go_only_into_a_folder_of_its_own(tmp_path):
    """Red team 43: in a folder a rank could write, root wrote its log through the rank's link to the folder and
    chmodded to 0600 the files its links named (a rival's staged submission: the honest v1 failed). A folder that is
    a link, one another uid owns or one others may write is refused; a link among the logs is neither followed nor
    removed, and the plain logs past the count go, the spared one kept."""
    victim = tmp_path / "victim.txt"
    victim.write_text("a file of root's")
    victim.chmod(0o644)
    mine = tmp_path / "logs"
    mine.mkdir(mode=0o700)
    (mine / "build-link.log").symlink_to(victim)
    for age, name in enumerate(["build-new.log", "build-old.log", "build-spared.log"]):
        (mine / name).write_text(name)
        (mine / name).chmod(0o644)
        os.utime(mine / name, ns=(10 ** 18 - age * 10 ** 9,) * 2)
    boundary.keep_newest(mine, "build-", 1, {"build-spared.log"})
    assert stat.S_IMODE(victim.stat().st_mode) == 0o644 and (mine / "build-link.log").is_symlink()
    assert sorted(p.name for p in mine.iterdir()) == ["build-link.log", "build-new.log", "build-spared.log"]
    assert stat.S_IMODE((mine / "build-new.log").stat().st_mode) == 0o600
    linked = tmp_path / "linked"
    linked.symlink_to(mine)
    open_to_all = tmp_path / "open"
    open_to_all.mkdir()
    open_to_all.chmod(0o1777)
    for folder in (linked, open_to_all):
        with pytest.raises(OSError):
            boundary.write_owners_only(folder / "build-x.log", b"words")
        assert not (folder / "build-x.log").exists()
    if os.geteuid() == 0:
        theirs = tmp_path / "theirs"
        theirs.mkdir(mode=0o700)
        os.chown(theirs, 65534, 65534)
        with pytest.raises(OSError):
            boundary.write_owners_only(theirs / "build-x.log", b"words")


def test_a_rank_writable_folder_is_known_by_its_inode_under_any_name(tmp_path, monkeypatch):
    """Red team 44: the same folder under a second name (a bind mount) passed the check of --out and of the bytecode
    prefix, which compared path strings. The folder is known by device and inode: the judge saves in it by neither
    name, nor reads bytecode from below the second."""
    import rank_writable

    writable = tmp_path / "scratch"
    writable.mkdir(mode=0o1777)
    monkeypatch.setenv("A2A_RANK_WRITABLE", str(writable))
    with pytest.raises(ValueError, match="a folder of its own"):
        rank_writable.check_judges_folder(writable, "--out")
    second = tmp_path / "second"
    second.mkdir()
    bound = os.geteuid() == 0 and subprocess.run(["mount", "--bind", str(writable), str(second)],
                                                 capture_output=True).returncode == 0
    if not bound:
        second.rmdir()
        second.symlink_to(writable)  # a second name all the same
    try:
        (writable / "pyc").mkdir()
        ids = rank_writable._ids(rank_writable.folders())
        assert rank_writable.reach(second / "pyc", ids)[1] == str(writable)
        monkeypatch.setenv("PYTHONPYCACHEPREFIX", str(second / "pyc"))
        with pytest.raises(ValueError, match="PYTHONPYCACHEPREFIX"):
            rank_writable.check()
        with pytest.raises(ValueError, match="a folder of its own"):
            rank_writable.check_judges_folder(second / "results", "--out")
    finally:
        if bound:
            subprocess.run(["umount", str(second)], check=True)


def test_path_lists_keep_only_entries_that_name_one_folder():
    """Red team 47: a relative PATH entry, read from whatever folder a tool runs in (root's git, from the
    repository, found a rank's `git` by `../W`), and ld.so's `$PLATFORM` in LD_LIBRARY_PATH (which the check
    read as a folder of that name) led root to a rank's files. The judge and all it starts keep neither."""
    probe = "import os, boundary; boundary.reset_environment(); print(os.environ['PATH'], os.environ['LD_LIBRARY_PATH'])"
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PATH": f"bin::../W:{os.environ['PATH']}",
                               "LD_LIBRARY_PATH": "/opt/$PLATFORM:lib:/usr/lib"})
    assert done.returncode == 0 and done.stdout.split() == [os.environ["PATH"], "/usr/lib"], done.stdout + done.stderr


SAYS_ITS_UID = """
import os as _os
from pathlib import Path as _Path
_path = _Path(_os.environ["A2A_TEST_MARKS"], f"uid-{_os.getpid()}")
_path.write_text(str(_os.getuid()))
"""


@pytest.mark.parametrize("face, where", [("the protocol face in a 0700 bundle", "outside the covered folders"),
                                         ("a tool with a 0600 submission", "outside the covered folders"),
                                         ("the protocol face in a 0700 bundle", "below /tmp")])
def test_what_the_ranks_cannot_read_is_shown_them_as_a_copy_with_every_guard_on(tmp_path, face, where):
    """Red team 47: a staged bundle in a folder of mode 0700 (as mkdtemp makes it, where runners stage) and a tool's
    submission of mode 0600 turned every guard off outside /tmp, for the ranks' uid could not read them: they ran as
    root with every mount writable (below /tmp, which is the ranks' own, they failed to import it). They now read
    the judge's readable copy, as the pool's uid."""
    marks = tmp_path / "marks"
    body = v1_kernel_source("custom_kernel") + SAYS_ITS_UID
    (ROOT / "build").mkdir(exist_ok=True)
    place = tmp_path if where == "below /tmp" else Path(tempfile.mkdtemp(dir=ROOT / "build", prefix="test-unreadable-"))
    try:
        _run_unreadable(face, place, body, marks)
    finally:
        if place != tmp_path:
            shutil.rmtree(place)
    uids = {int(mark.read_text()) for mark in marks.glob("uid-*")}
    assert uids and 0 not in uids and os.getuid() not in uids, uids


def _run_unreadable(face: str, place: Path, body: str, marks: Path) -> None:
    place.chmod(0o755)
    if face.startswith("the protocol face"):
        bundle = place / "bundle"
        assert run_eval("stage", "v1", str(bundle)).returncode == 0
        (bundle / "submission.py").write_text(body)
        (bundle / "one.txt").write_text(Path(bundle / "tests.txt").read_text().splitlines()[0].replace(
            "world_size: 8", "world_size: 2") + "\n")
        bundle.chmod(0o700)
        code, said, errors = run_bundle(bundle, "test", "one.txt", {"A2A_TEST_MARKS": str(marks)})
        assert code == 0 and "check: pass" in said, said + errors[-2000:]
    else:
        path = place / "private.py"
        path.write_text(body)
        path.chmod(0o600)
        done = subprocess.run([sys.executable, "-m", "tools.step_anatomy", str(path), "--world-size", "2",
                               "--backend", "gloo", "--cases", "benchmarks:0", "--iterations", "2", "--out",
                               str(marks.parent / "out")], cwd=ROOT, capture_output=True, text=True, timeout=300,
                              env={**os.environ, "A2A_TEST_MARKS": str(marks)})
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def test_a_mount_point_of_raw_bytes_is_no_bad_input(tmp_path):
    """Red team 47: a mount whose path is not UTF-8, anywhere on the machine, made every command exit 113 (the
    mount table was read as strict UTF-8). Made in a mount namespace of the probe's own."""
    writable = tmp_path / "writable"
    writable.mkdir()
    odd = os.fsencode(str(tmp_path)) + b"/\xff"
    os.mkdir(odd)
    probe = textwrap.dedent(f"""
        import ctypes, sys
        sys.path.insert(0, {str(ROOT)!r})
        import rank_writable
        libc = ctypes.CDLL(None, use_errno=True)
        assert libc.unshare(0x00020000) == 0 and libc.mount(None, b"/", None, 0x4000 | 0x40000, None) == 0
        assert libc.mount(b"tmpfs", {odd!r}, b"tmpfs", 0, None) == 0
        rank_writable.check({{"A2A_RANK_WRITABLE": {str(writable)!r}, "HOME": {str(tmp_path)!r}}})
        print("checked")
    """)
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "checked" in result.stdout, result.stderr


def test_a_folder_below_a_rank_writable_one_mounted_elsewhere_counts_as_in_it(tmp_path):
    """Red team 45 left open: a folder below the writable one, bind-mounted at another path, has an inode of its own,
    so a variable naming the mount passed the check, and root would have read what a rank planted there. A mount that
    shows the writable folder or a part of it elsewhere is the writable folder's. The mount is made in a mount
    namespace of the probe's own, so none outlives it."""
    writable, elsewhere = tmp_path / "writable", tmp_path / "elsewhere"
    (writable / "mpl").mkdir(parents=True)
    elsewhere.mkdir()
    probe = textwrap.dedent(f"""
        import ctypes, os, sys
        sys.path.insert(0, {str(ROOT)!r})
        import rank_writable
        libc = ctypes.CDLL(None, use_errno=True)
        assert libc.unshare(0x00020000) == 0 and libc.mount(None, b"/", None, 0x4000 | 0x40000, None) == 0
        env = {{"A2A_RANK_WRITABLE": {str(writable)!r}, "MPLCONFIGDIR": {str(elsewhere)!r}}}
        rank_writable.check(env)  # nothing mounted yet: another folder
        assert libc.mount({str(writable / "mpl").encode()!r}, {str(elsewhere).encode()!r}, None, 0x1000, None) == 0
        try:
            rank_writable.check(env)
        except ValueError as error:
            print(error)
    """)
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert f"folder {str(writable)!r} holds {str(elsewhere)!r}, which the judge may read or write as MPLCONFIGDIR" \
        in result.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="the judge's cover is a mount namespace of its own: root's")
def test_the_judge_sees_the_rank_writable_folder_covered_while_its_ranks_write_it(tmp_path, process_token):
    """Each red team from 42 to 47 found one more name by which root read what a rank wrote in the writable folder
    (a link three levels down root's home, a path inside a config file); a list of names loses. The judge covers the
    folder first thing, in a mount namespace of its own, with an empty read-only file system, and only the ranks'
    namespaces lift the cover: their marks are on the disk while the judge's view of the same path is empty and
    cannot be written."""
    from tests.conftest import hanging_human_face, hanging_submission, wait_until_gone

    process = hanging_human_face(tmp_path, process_token, hanging_submission())
    try:
        marks = tmp_path / "marks"
        judges = Path(f"/proc/{process.pid}/root", *marks.parts[1:])
        assert sorted(path.name for path in marks.iterdir()) == ["rank0", "rank1"]
        assert list(judges.iterdir()) == []
        with pytest.raises(OSError):
            (judges / "planted").touch()
        assert boundary.JUDGE_COVER in Path(f"/proc/{process.pid}/mountinfo").read_text()
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=60)
    assert not wait_until_gone(process_token, 20), "processes left behind"


def test_the_cover_takes_every_name_of_the_folder_and_a_ranks_namespace_lifts_it(tmp_path):
    """The cover takes each mount that shows the writable folder, or a part of it, at another path: a bind mount of
    a folder below it (red team 45) or above it, and an overlay with it as a layer (red team 48: root's matplotlib
    read, and root's Python imported, a rank's files through those); and a rank's mount namespace lifts every cover,
    nested ones too, and sees the folder as it is. All in a mount namespace of the probe's own, so none outlives it."""
    writable, below, above, layered = (tmp_path / name for name in ("writable", "below", "above", "layered"))
    (writable / "mpl").mkdir(parents=True)
    (writable / "mpl" / "rank's").touch()
    for folder in (below, above, layered, tmp_path / "work", tmp_path / "upper"):
        folder.mkdir()
    (tmp_path / "link").symlink_to(writable)
    stacked, added = tmp_path / "stacked", tmp_path / "added"
    stacked.mkdir()
    added.mkdir()
    overlays = [(layered, f"lowerdir={tmp_path / 'link'}:{tmp_path / 'work'}"),  # red team 49: through a link,
                (stacked, f"lowerdir={layered}:{tmp_path / 'work'}"),  # on another overlay that shows it,
                (added, f"lowerdir+={writable},lowerdir+={tmp_path / 'work'}")]  # by the newer API's option
    probe = textwrap.dedent(f"""
        import ctypes, os, sys
        sys.path.insert(0, {str(ROOT)!r})
        import boundary, rank_writable
        libc = ctypes.CDLL(None, use_errno=True)
        assert libc.unshare(0x00020000) == 0 and libc.mount(None, b"/", None, 0x4000 | 0x40000, None) == 0
        assert libc.mount({str(writable / "mpl").encode()!r}, {str(below).encode()!r}, None, 0x1000, None) == 0
        assert libc.mount({str(tmp_path).encode()!r}, {str(above).encode()!r}, None, 0x1000, None) == 0
        names = [{str(writable)!r}, {str(below)!r}, {str(above / "writable")!r}]
        for point, options in {[(str(point), options) for point, options in overlays]!r}:
            if libc.mount(b"overlay", point.encode(), b"overlay", 0, options.encode()) == 0:
                names.append(point)
        env = {{"A2A_RANK_WRITABLE": {str(writable)!r}}}
        covered = rank_writable.cover(env)
        print(sorted(covered) == sorted(names), len(names), [os.listdir(name) for name in names])
        print(rank_writable.cover(env))  # a protocol face under the human face: covered already
        if os.fork() == 0:
            libc.unshare(0x00020000)
            boundary._lift_judges_covers(libc)
            print(os.listdir(names[0]), os.listdir(names[1]), flush=True)
            os._exit(0)
        os.wait()
    """)
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("True 6 [[], [], [], [], [], []") and lines[1:] == ["[]", "['mpl'] [\"rank's\"]"], \
        result.stdout


def test_a_writable_folder_named_in_raw_bytes_fails_no_honest_rank(tmp_path):
    """Red team 48: a writable folder whose name is not UTF-8 failed the honest v1 with 112: each rank encoded its
    path strictly on the way to its mounts."""
    writable = Path(os.fsdecode(os.fsencode(tmp_path) + b"/w\xff"))
    writable.mkdir()
    writable.chmod(0o1777)
    result = run_eval("test", "v1", "--world-size", "2", "--backend", "gloo", "--cases", "tests:0",
                      env={"A2A_RANK_WRITABLE": str(writable)})
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]


def test_a_writable_folder_the_kernel_keeps_one_in_another_or_one_with_a_mount_below_is_refused(tmp_path):
    """Red team 48: /sys/fs/cgroup as the writable folder turned the pool's memory cap off, /proc ended the judge
    with 114; a writable folder inside another, which a rank made a link, had root take the link's target for the
    folder; a mount below one was written by the ranks and read by root under its other name. Each is refused."""
    import rank_writable

    outer = tmp_path / "outer"
    (outer / "inner").mkdir(parents=True)
    (tmp_path / "disk").mkdir()
    (tmp_path / ".pyenv" / "pyenv.d").mkdir(parents=True)  # a tool's dot-folder in root's home (HOME below)
    for folders, said in (("/sys/fs/cgroup", "a file system of the kernel's"), ("/proc", "of the kernel's"),
                          (f"{outer}:{outer / 'inner'}", "lies in another"),
                          (os.path.relpath(outer), "is relative"),  # red team 49: read again from a bundle
                          (f"/proc/self/cwd/{os.path.relpath(outer)}", "named through it"),  # red team 50
                          # as CI's deeper working folder had it: normalized, the name left /proc
                          ("/proc/self/cwd/" + "../" * (len(Path.cwd().parts) + 2) + str(outer)[1:], "named through"),
                          (str(tmp_path / "none"), "is not a folder"),  # CI's container: no /sys/fs/cgroup either
                          (str(rank_writable.RANK_CACHE / "builds"), "the judge's own"),  # red team 51: 114
                          ("/var/tmp/a2a-run-60001/home", "the judge's own"),
                          # red team 59: pyenv's hooks, a compiler's headers, ld.so's conf, a tool's folder in HOME
                          ("/usr/local/etc", "a folder of the system's"), ("/usr/local/include", "of the system's"),
                          ("/etc/ld.so.conf.d", "of the system's"), (str(tmp_path / ".pyenv" / "pyenv.d"), "system's")):
        with pytest.raises(ValueError, match=said):
            rank_writable.check({"A2A_RANK_WRITABLE": folders, "HOME": str(tmp_path)})
    with pytest.raises(ValueError, match="as TZ and TZDIR name it"):  # red team 49: a zone file of a rank's
        rank_writable.check({"A2A_RANK_WRITABLE": str(outer), "TZDIR": str(tmp_path), "TZ": "outer/zone"})
    probe = textwrap.dedent(f"""
        import ctypes, os, sys
        sys.path.insert(0, {str(ROOT)!r})
        import rank_writable
        libc = ctypes.CDLL(None, use_errno=True)
        assert libc.unshare(0x00020000) == 0 and libc.mount(None, b"/", None, 0x4000 | 0x40000, None) == 0
        assert libc.mount({str(tmp_path / "disk").encode()!r}, {str(outer / "inner").encode()!r}, None, 0x1000, None) == 0
        try:
            rank_writable.check({{"A2A_RANK_WRITABLE": {str(outer)!r}, "HOME": {str(tmp_path)!r}}})
        except ValueError as error:
            print(error)
        # red team 52: the judge's cache under another name (a bind mount of its builds/), 114 before
        os.makedirs(rank_writable.RANK_CACHE / "builds", exist_ok=True)
        assert libc.mount(str(rank_writable.RANK_CACHE / "builds").encode(), {str(tmp_path / "alias").encode()!r},
                          None, 0x1000, None) == 0
        try:
            rank_writable.check({{"A2A_RANK_WRITABLE": {str(tmp_path / "alias")!r}, "HOME": {str(tmp_path)!r}}})
        except ValueError as error:
            print(error)
        # red team 57: a bind of the judge's own package, where a rank wrote a2a/__pycache__ and root ran it; 58: of
        # the interpreter's folder (a ._pth there is honoured) and of the repository's git folder (its hooks); 55:
        # the kernel's file systems at a path on a disk (/sys/fs/cgroup's turned the memory cap off, /proc's: 114)
        for name, source, said in (("package", {str(ROOT / "a2a")!r}, "judge"),
                                   ("interpreter", os.path.dirname(os.path.realpath(sys.executable)), "judge"),
                                   ("git", {str(ROOT / ".git")!r}, "judge"), ("/proc", "/proc", "kernel's"),
                                   ("/sys", "/sys", "kernel's"), ("/sys/fs/cgroup", "/sys/fs/cgroup", "kernel's")):
            if not os.path.isdir(source):  # a worktree's .git is a file; CI's container has no /sys/fs/cgroup
                continue
            alias = {str(tmp_path)!r} + "/alias" + name.replace("/", "-")
            os.makedirs(alias)
            assert libc.mount(source.encode(), alias.encode(), None, 0x1000, None) == 0
            try:
                rank_writable.check({{"A2A_RANK_WRITABLE": alias, "HOME": {str(tmp_path)!r}}})
                print("PASSED", name)
            except ValueError as error:
                print("refused", name, said in str(error))
    """)
    (tmp_path / "alias").mkdir()
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and f"{outer / 'inner'} is mounted below" in result.stdout, result.stdout + result.stderr
    assert "the judge's own" in result.stdout, result.stdout + result.stderr
    refused = re.findall(r"refused (\S+) True", result.stdout)
    assert "PASSED" not in result.stdout and {"/proc", "/sys", "package", "interpreter"} <= set(refused), result.stdout


def test_a_worktrees_git_folders_are_read_from_its_dot_git_file(tmp_path):
    """Red team 58: a worktree's git folder lies outside it (its `.git` is a file), where a writable folder could be
    its other name and a rank plant hooks root's git runs. The judge reads both its git folder and the common one from
    the file, running no git."""
    import rank_writable

    (tmp_path / "repo" / ".git" / "worktrees" / "w").mkdir(parents=True)
    (tmp_path / "repo" / ".git" / "worktrees" / "w" / "commondir").write_text("../..\n")
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / ".git").write_text(f"gitdir: {tmp_path / 'repo' / '.git' / 'worktrees' / 'w'}\n")
    assert rank_writable._git_folders(tmp_path / "w") == [str(tmp_path / "repo" / ".git" / "worktrees" / "w"),
                                                          str(tmp_path / "repo" / ".git")]
    assert rank_writable._git_folders(tmp_path / "repo") == [str(tmp_path / "repo" / ".git")]


def test_an_overlay_layer_no_one_can_resolve_is_refused_and_a_loop_image_in_the_folder_is_its_name(monkeypatch):
    """Red team 49: an overlay whose layer was named by a relative path showed the folder where no check could see
    it, and a loop device's image kept in the folder showed a rank's rewritten files at the loop's mount point. A
    relative layer counts from each folder above the overlay that holds it (Docker's overlay2, red team 50: every
    writable folder was refused on a Docker host); one found from none is refused."""
    import rank_writable

    def mount(point, kind, source, options, device="0:99"):
        return ("9", "1", device, Path("/"), Path(point), kind, source, options)

    monkeypatch.setattr(rank_writable, "_loop_file", lambda source: Path("/srv/w/disk.img") if source == "/dev/loop7"
                        else None)
    mounts = [mount("/", "ext4", "/dev/vda", "rw", "8:1"), mount("/mnt/img", "ext4", "/dev/loop7", "rw")]
    monkeypatch.setattr(rank_writable, "_mounts", lambda: mounts)
    assert rank_writable._other_names(["/srv/w"]) == {"/mnt/img": "/srv/w"}
    mounts.append(mount("/mnt/o", "overlay", "o", "ro,lowerdir=w:u"))
    with pytest.raises(ValueError, match="by a relative path"):
        rank_writable._other_names(["/srv/w"])
    mounts[-1] = mount("/srv/o/merged", "overlay", "o", "ro,lowerdir=w:u")  # red team 50: Docker's form, from /srv
    monkeypatch.setattr(os.path, "lexists", lambda path: str(path) in ("/srv/w", "/srv/u"))
    assert rank_writable._other_names(["/srv/w"]) == {"/mnt/img": "/srv/w", "/srv/o/merged": "/srv/w"}


def test_what_the_sweeps_act_on_before_the_cover_is_the_judges_own(tmp_path, monkeypatch):
    """Red team 48: every command's first sweep read `.a2a-owner` in each /tmp/a2a-* folder, and one that was a
    writable folder held a rank's: root removed the folder on its word, and as a FIFO it hung every later command;
    a rank's uid record in a misplaced rank cache had root remove another uid's System V IPC. The sweeps act only on
    regular files of root's in folders of root's that no one else may write, opened without waiting."""
    if os.geteuid() != 0:
        pytest.skip("a file of another uid's needs root")
    marked = {kind: Path(tempfile.mkdtemp(prefix=f"a2a-test-{kind}-")) for kind in ("ranks", "fifo", "judges")}
    for kind, folder in marked.items():
        mark = folder / boundary.TEMP_OWNER_MARK
        os.mkfifo(mark) if kind == "fifo" else mark.write_text("1:0")  # pid 1 started at no time: gone
        if kind != "judges":
            folder.chmod(0o1777)
            os.chown(mark, 65534, 65534)
    try:
        done = subprocess.run([sys.executable, "-c", "import boundary; boundary._remove_orphan_tempdirs()"],
                              cwd=ROOT, capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        assert [folder.exists() for folder in marked.values()] == [True, True, False]
    finally:
        for folder in marked.values():
            shutil.rmtree(folder, ignore_errors=True)
    records = tmp_path / "owners"
    records.mkdir(mode=0o700)
    monkeypatch.setattr(boundary, "UID_RECORDS", records)
    for uid, owner in ((60001, 0), (60002, 65534)):
        (records / str(uid)).write_text("1:0:0")
        os.chown(records / str(uid), owner, owner)
    assert [boundary._record_owner(60001), boundary._record_owner(60002)] == ["1:0", None]




def test_a_link_of_a_ranks_behind_one_of_the_operators_is_seen(tmp_path):
    """Red team 45: the operator's link outside the writable folder led to a rank's link inside it, which pointed
    out of it for now; resolving the operator's link whole never saw the rank's, so --out through it was accepted and
    the rank re-pointed it. Links are followed one at a time."""
    import rank_writable

    writable, elsewhere = tmp_path / "writable", tmp_path / "elsewhere"
    writable.mkdir()
    elsewhere.mkdir()
    (writable / "l").symlink_to(elsewhere)  # the rank's
    (tmp_path / "operators").symlink_to(writable / "l")  # the operator's, outside the folder
    ids = rank_writable._ids([writable])
    where, lies_in, through = rank_writable.reach(tmp_path / "operators" / "results", ids)
    assert where == elsewhere / "results" and lies_in is None and through == str(writable)
