"""The judge: a submission cannot write its own verdict or time, cannot lie through its output, cannot reach the
check that decides its verdict, and cannot make the evaluator lose a verdict with the bytes it prints. CPU, gloo, 2
ranks, the human face (`python eval.py`), one official case. Each hostile submission computes v1's right answer or
zeros, and says in its own output which rank did what."""
import subprocess
import sys

import pytest

from a2a import rows as result_rows
from eval import EXIT_CHECK_FAILED
from tests.conftest import ROOT, run_eval, shared_folder, v1_kernel_source

CASE = ("--world-size", "2", "--cases", "tests:0")

# Tries to write forged result lines into the result channel: POPCORN_FD if the environment still names it, and
# every socket or pipe of its parent and grandparent (the two faces) that it can open again through /proc. It
# records, per rank, what it reached in REACHED. (As root it could open and break much more of its parents; that
# the verdict survives such sabotage is the signal test below.)
FORGER = '''
import os

REACHED = "@REACHED@"

def _forge(lines):
    reached = []
    fd = os.environ.get("POPCORN_FD")
    if fd:
        try:
            os.write(int(fd), lines.encode())
            reached.append("POPCORN_FD=" + fd)
        except OSError:
            pass
    pid = os.getppid()
    for _ in range(2):
        for n in range(3, 64):
            try:
                kind = os.readlink(f"/proc/{pid}/fd/{n}")
                if kind.startswith("socket:"):
                    with open(f"/proc/{pid}/fd/{n}", "a") as channel:
                        channel.write(lines)
                    reached.append(f"{kind} of {pid}")
            except OSError:
                pass
        pid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
    with open(REACHED, "a") as out:
        out.write(f"rank pid {os.getpid()}: " + (", ".join(reached) or "nothing") + "\\n")
'''


def _submission(tmp_path, body: str, name: str = "hostile.py"):
    path = tmp_path / name
    path.write_text(body.replace("@REACHED@", str(tmp_path / "reached.txt")))
    return str(path)


def _row_statuses(stdout: str) -> list:
    return [line.split("|")[3].strip() for line in stdout.splitlines() if line.startswith("|   0 |")]


def test_a_submission_cannot_forge_a_passing_test(tmp_path):
    """Zeros, then `test.0.status: pass` and `check: pass` written wherever the rank can reach."""
    body = FORGER + '''
import torch

def custom_kernel(data):
    cfg, rank_data, rank, world_size = data
    _forge("test.0.status: pass\\ncheck: pass\\n")
    return torch.zeros(rank_data.num_tokens, cfg.hidden_dim, dtype=torch.float16, device=rank_data.x.device)
'''
    result = run_eval("test", _submission(tmp_path, body), *CASE, timeout=300)
    assert result.returncode == EXIT_CHECK_FAILED, result.stdout[-2000:] + result.stderr[-2000:]
    assert _row_statuses(result.stdout) == ["fail"], result.stdout[-2000:]
    assert "POPCORN_FD=" not in (tmp_path / "reached.txt").read_text()


def test_a_correct_submission_cannot_forge_its_time(tmp_path):
    """Right answers, and `benchmark.0.mean: 1.0` aimed at the result channel: nothing reaches it, and the time
    shown is the evaluator's."""
    body = v1_kernel_source() + FORGER + '''

def custom_kernel(data):
    out = _v1_kernel(data)
    _forge("benchmark.0.mean: 1.0\\nbenchmark.0.best: 1.0\\n")
    return out
'''
    result = run_eval("benchmark", _submission(tmp_path, body), *CASE, timeout=300)
    reached = (tmp_path / "reached.txt").read_text()
    assert set(reached.split(": ", 1)[1] for reached in reached.splitlines()) == {"nothing\n"[:-1]}, reached
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    row = [line for line in result.stdout.splitlines() if line.startswith("|   0 |")][0]
    assert float(row.split("|")[5]) > 1.0, row  # the mean, in µs: a CPU step takes far longer than 1 ns


def test_a_signal_the_submission_sends_its_evaluator_voids_the_run(tmp_path):
    """Right answers, then SIGTERM to its parent, the evaluator: the run fails (112), saying the harness did not send
    it, instead of ending as if the user had stopped it."""
    body = v1_kernel_source() + '''
import os
import signal

def custom_kernel(data):
    if data[2] == 1:
        os.kill(os.getppid(), signal.SIGTERM)
    return _v1_kernel(data)
'''
    result = run_eval("test", _submission(tmp_path, body), *CASE, timeout=300)
    assert result.returncode == EXIT_CHECK_FAILED, result.stdout[-2000:] + result.stderr[-2000:]
    assert "ended by SIGTERM while the submission ran, and the harness did not send it" in result.stderr, \
        result.stderr[-2000:]


def test_a_repeated_key_keeps_its_first_value_and_is_reported():
    text = "check: fail\ntest.0.status: fail\ncheck: pass\ntest.0.status: pass\n"
    assert result_rows.parse_popcorn(text) == {"check": "fail", "test.0.status": "fail"}
    assert result_rows.repeated_keys(text) == ["check", "test.0.status"]
    assert result_rows.repeated_keys("check: pass\ntest-count: 1\n") == []


LYING_TENSOR = '''
import torch

class Agreeable(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func in (torch.allclose, torch.equal):
            return True
        return super().__torch_function__(func, types, args, kwargs or {})

def custom_kernel(data):
    cfg, rank_data, rank, world_size = data
    zeros = torch.zeros(rank_data.num_tokens, cfg.hidden_dim, dtype=torch.float16, device=rank_data.x.device)
    return zeros.as_subclass(Agreeable)
'''

PATCHED_ALLCLOSE = '''
import torch

torch.allclose = lambda *args, **kwargs: True  # rank-wide: every check in this process now agrees

def custom_kernel(data):
    cfg, rank_data, rank, world_size = data
    return torch.zeros(rank_data.num_tokens, cfg.hidden_dim, dtype=torch.float16, device=rank_data.x.device)
'''

PATCHED_REFERENCE = '''
import sys
import torch
import reference

def custom_kernel(data):
    cfg, rank_data, rank, world_size = data
    out = torch.zeros(rank_data.num_tokens, cfg.hidden_dim, dtype=torch.float16, device=rank_data.x.device)
    reference.ref_kernel = lambda d: out.clone()  # the reference now expects what this returns
    reference.check_implementation = lambda d, o: (True, "")
    for name in ("__mp_main__", "__main__", "eval"):  # the evaluator's own binding of the check, in this worker
        evaluator = sys.modules.get(name)
        if getattr(evaluator, "_reference", None):
            evaluator._reference = (evaluator._reference[0], lambda d, o: (True, ""))
    return out
'''


@pytest.mark.parametrize("body, expected", [
    (LYING_TENSOR, "must be a plain torch.Tensor"),
    (PATCHED_ALLCLOSE, "outside the submission's process"),
    (PATCHED_REFERENCE, "outside the submission's process"),
], ids=["lying-tensor", "patched-allclose", "patched-reference"])
def test_zeros_fail_however_the_check_is_bent(tmp_path, body, expected):
    for mode in ("test", "benchmark"):
        result = run_eval(mode, _submission(tmp_path, body), *CASE, timeout=300)
        assert result.returncode == EXIT_CHECK_FAILED, (mode, result.stdout[-2000:], result.stderr[-2000:])
        assert expected in result.stdout, (mode, result.stdout[-3000:])


def test_non_utf8_bytes_on_stderr_lose_no_verdict(tmp_path):
    """A correct submission that writes undecodable bytes, then 400 KB more, to stderr: it passes, and its stderr
    comes through with the bytes replaced."""
    body = v1_kernel_source() + '''
import os

def custom_kernel(data):
    os.write(2, b"rank says \\xff\\xfe\\xfd here\\n" + b"x" * 400_000 + b"\\n")
    return _v1_kernel(data)
'''
    result = subprocess.run([sys.executable, str(ROOT / "eval.py"), "test", _submission(tmp_path, body), *CASE],
                            cwd=ROOT, capture_output=True, timeout=300)
    stdout, stderr = result.stdout.decode(), result.stderr.decode(errors="replace")
    assert result.returncode == 0, stdout[-2000:] + stderr[-2000:]
    assert _row_statuses(stdout) == ["pass"], stdout
    assert "rank says \ufffd\ufffd\ufffd here" in stderr, stderr[:500]


def test_what_a_sigkill_leaves_the_next_command_ends(tmp_path, process_token):
    """SIGKILL to the human face and to its protocol child at once (nothing of the run can clean up): the ranks die
    with their parent, the submission's forked `sleep` is left to init. The next command of this harness, any one,
    ends it: it carries the run's owner, who is gone."""
    import os
    import signal
    import time

    from tests.conftest import hanging_human_face, hanging_submission, processes_with, wait_until_gone

    face = hanging_human_face(tmp_path, process_token, hanging_submission())
    tree = [face.pid] + [int(p) for p in open(f"/proc/{face.pid}/task/{face.pid}/children").read().split()]
    for pid in tree:
        os.kill(pid, signal.SIGKILL)
    face.wait(timeout=30)  # not communicate(): the orphans hold its output pipes open
    face.stdout.close()
    face.stderr.close()
    deadline = time.monotonic() + 20
    while len(processes_with(process_token)) != 2 and time.monotonic() < deadline:
        time.sleep(0.2)  # the ranks die with their parent; each rank's `sleep` stays
    left = processes_with(process_token)
    assert left and set(_names(left)) == {"sleep"}, left
    assert run_eval("stage", "v1", str(tmp_path / "next")).returncode == 0  # any command: it sweeps first
    assert not wait_until_gone(process_token, 10), "the next command left the orphans of a killed run"


def test_the_sweep_ends_only_what_a_gone_owner_left():
    import os
    import subprocess

    import eval as core

    mine = f"{os.getpid()}:{core.process_stat(os.getpid())[19]}"  # pid and start time: this live process
    alive = subprocess.Popen(["sleep", "60"], env={**os.environ, core.RUN_OWNER: mine})
    orphan = subprocess.Popen(["sleep", "60"], env={**os.environ, core.RUN_OWNER: f"{os.getpid()}:1"})  # pid reused
    try:
        killed = core.sweep_orphans()
        assert orphan.pid in killed and alive.pid not in killed, (killed, alive.pid, orphan.pid)
        assert orphan.wait(timeout=10) == -9 and alive.poll() is None
    finally:
        alive.kill()
        alive.wait()


def test_a_closed_stdout_loses_no_verdict_and_prints_no_traceback():
    """`python eval.py ... >&-`: the ranks' prefixed streams print nowhere instead of a traceback per rank."""
    import os

    result = subprocess.run([sys.executable, str(ROOT / "eval.py"), "test", "v1", *CASE], cwd=ROOT,
                            stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=300,
                            preexec_fn=lambda: os.close(1))
    assert result.returncode == 0, result.stderr.decode(errors="replace")[-2000:]
    assert b"Traceback" not in result.stderr, result.stderr.decode(errors="replace")[-2000:]


def test_two_quick_sigints_to_the_protocol_face_print_no_traceback(bundle, tmp_path):
    """What Ctrl-C under GNU `timeout` does: SIGINT twice, 1 ms apart, to the whole process group."""
    import os
    import signal
    import time

    from tests.conftest import hanging_submission

    (bundle / "submission.py").write_text(hanging_submission())
    (bundle / "one.txt").write_text("num_experts: 8; experts_per_token: 2; hidden_dim: 64; max_num_tokens: 4; "
                                    "seed: 1; world_size: 2\n")
    marks = shared_folder(tmp_path / "marks")
    env = {**os.environ, "POPCORN_FD": "1", "POPCORN_GPUS": "2", "A2A_BACKEND": "gloo", "A2A_TEST_MARKS": str(marks)}
    face = subprocess.Popen([sys.executable, "eval.py", "test", "one.txt"], cwd=bundle, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 120
    while not all((marks / f"rank{r}").exists() for r in (0, 1)) and time.monotonic() < deadline:
        time.sleep(0.1)
    os.killpg(face.pid, signal.SIGINT)
    time.sleep(0.001)
    os.killpg(face.pid, signal.SIGINT)
    _, stderr = face.communicate(timeout=60)
    assert face.returncode == 128 + signal.SIGINT, stderr.decode(errors="replace")[-2000:]
    assert b"Traceback" not in stderr, stderr.decode(errors="replace")[-2000:]


# The tools that run ranks on a CPU (gloo), each with a hanging version: the others (sweep, ideas, triton_launch,
# trace) stop before any rank starts when there is no GPU, and run under the same run_cli sweep on one.
TOOLS_WITH_RANKS = {
    "diff": lambda path: ["diff.py", path, path, "--cases", "tests:0"],
    "anatomy": lambda path: ["tools/step_anatomy.py", path, "--cases", "tests:0"],
    "leaderboard": lambda path: ["run_leaderboard.py", "--versions", path, "--cases", "tests:0", "--no-problem-size"],
}


@pytest.mark.parametrize("tool_name", sorted(TOOLS_WITH_RANKS))
def test_what_a_sigkill_to_a_tool_leaves_the_next_command_ends(tmp_path, process_token, tool_name):
    """A tool's ranks in a hanging call, then SIGKILL to the tool alone: its ranks die with it (PR_SET_PDEATHSIG),
    the submission's forked `sleep`s are left to init, and the next command ends them."""
    import os
    import signal
    import time

    from tests.conftest import hanging_submission, processes_with, start_hanging, wait_until_gone

    path = tmp_path / "hangs.py"
    path.write_text(hanging_submission())
    marks = shared_folder(tmp_path / "marks")
    env = {**os.environ, "A2A_TEST_TOKEN": process_token, "A2A_TEST_MARKS": str(marks)}
    command = [sys.executable, *TOOLS_WITH_RANKS[tool_name](str(path)), "--world-size", "2", "--backend", "gloo",
               "--out", str(tmp_path / "out")]
    tool = start_hanging(command, ROOT, env, marks)
    os.kill(tool.pid, signal.SIGKILL)
    tool.wait(timeout=30)
    tool.stdout.close()
    tool.stderr.close()
    deadline = time.monotonic() + 20
    while set(_names(processes_with(process_token))) - {"sleep"} and time.monotonic() < deadline:
        time.sleep(0.2)  # the ranks die with their parent; each rank's `sleep` stays
    # diff and anatomy run their ranks themselves: each rank's `sleep` stays for the next command. The leaderboard's
    # ranks belong to the protocol face it started, which outlives it long enough to end them and what they forked.
    left = set(_names(processes_with(process_token)))
    assert left == ({"sleep"} if tool_name != "leaderboard" else set()), left
    assert run_eval("stage", "v1", str(tmp_path / "next")).returncode == 0
    assert not wait_until_gone(process_token, 10), "the next command left the orphans of a killed tool"


def _names(pids: list) -> list:
    """The command names of those of `pids` still alive."""
    names = []
    for pid in pids:
        try:
            names.append(open(f"/proc/{pid}/comm").read().strip())
        except OSError:
            continue
    return names


def test_a_thread_left_running_does_not_stall_the_end_of_the_run(tmp_path):
    """A correct submission that starts a thread sleeping for an hour: the run ends as fast as v1's own (the workers
    used to wait 10 s each for it, then be killed)."""
    import time

    body = v1_kernel_source() + '''
import threading
import time

def custom_kernel(data):
    threading.Thread(target=time.sleep, args=(3600,)).start()
    return _v1_kernel(data)
'''
    timings = {}
    for name, version in (("v1", "v1"), ("thread", _submission(tmp_path, body))):
        started = time.monotonic()
        result = run_eval("test", version, *CASE, timeout=300)
        timings[name] = time.monotonic() - started
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert timings["thread"] < timings["v1"] + 8, timings  # the stall was 20 s with 2 ranks


def test_a_result_joins_its_case_only_through_the_plans_own_spec_line():
    """The protocol names cases by index; a row whose spec line is not the plan's case of that index (or whose index
    the plan has no case for) voids the run instead of taking that case's arguments."""
    from a2a.harness import join_cases
    from eval import TestCase

    plan = [TestCase(args={"seed": 1}, spec="seed: 1"), TestCase(args={"seed": 2}, spec="seed: 2")]
    rows = [{"index": 0, "spec": "seed: 1"}, {"index": 1, "spec": "seed: 2"}]
    assert join_cases(rows, plan) == "" and [r["args"] for r in rows] == [{"seed": 1}, {"seed": 2}]
    assert "case 1" in join_cases([{"index": 0, "spec": "seed: 1"}, {"index": 1, "spec": "seed: 1"}], plan)
    stray = [{"index": 0, "spec": "seed: 1"}, {"index": 2, "spec": "seed: 3"}]
    assert "not the plan's case 2" in join_cases(stray, plan) and "args" not in stray[1]


def test_a_rank_that_dies_of_a_signal_has_the_cause_it_printed_named(tmp_path):
    """fd exhaustion ends a rank in SIGABRT from C++ with the reason only on stderr; the case's error names it."""
    path = tmp_path / "aborts.py"
    path.write_text(v1_kernel_source() + '''
import os
import sys


def custom_kernel(data):
    print("terminate called after throwing an instance of 'c10::Error': Too many open files", file=sys.stderr,
          flush=True)
    os.abort()
''')
    result = run_eval("test", str(path), "--cases", "tests:0")
    assert result.returncode == EXIT_CHECK_FAILED
    assert "SIGABRT" in result.stdout and "the run's stderr names: Too many open files" in result.stdout, result.stdout
