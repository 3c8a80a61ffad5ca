"""Bad input, on both faces and the commands: one line, the bad-input exit code (113; 2 for a malformed command
line), no traceback, nothing blamed on the submission, nothing left running. Every item of the hostile-input list
of the harness issue is here; each failed before the plan validated cases once."""
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from a2a.cli import run_cli
from a2a.rows import parse_popcorn
from eval import EXIT_BAD_INPUT, EXIT_CHECK_FAILED, EXIT_CRASH, EXIT_USAGE
from tests.conftest import ROOT, V1, every_time, libm_copy, run_bundle, run_eval, saved_in

LINE = "num_experts: 8; experts_per_token: 2; hidden_dim: {h}; max_num_tokens: 4; seed: {s}; world_size: {w}"


def _file(folder: Path, name: str, content) -> str:
    path = folder / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return str(path)


def human_face_cases(tmp: Path):
    no_kernel = _file(tmp, "no_kernel.py", "def something_else(data):\n    return None\n")
    full = tmp / "full"
    full.mkdir()
    (full / "something").write_text("")
    a_file = _file(tmp, "a_file", "")
    (tmp / "a_folder").mkdir()
    line = LINE.format(h=64, s=1, w=2)
    return [
        (("test", "missing_version.py"), "no such file"),
        (("test", str(tmp / "a_folder") + "/"), "is a folder, not a submission file"),
        (("test", "/dev/null"), "is a device, not a submission file"),
        (("test", "v99"), "unknown version 'v99'"),
        (("test", no_kernel), "defines no custom_kernel"),
        # nested past the parser's depth (red team 26: RecursionError and MemoryError, internal errors)
        (("test", _file(tmp, "deep_sum.py", "def custom_kernel(data):\n    return data\n_deep = " + "1+" * 5000
                        + "1\n")), "deep_sum.py does not parse"),
        (("test", _file(tmp, "deep_minus.py", "def custom_kernel(data):\n    return data\n_deep = " + "-" * 100_000
                        + "1\n")), "deep_minus.py does not parse"),
        (("test", "v1", "--world-size", "3"), "cannot be split evenly over 3 ranks"),
        (("test", "v1", "--world-size", "16", "--backend", "nccl"), "GPU"),
        (("test", "v1", "--world-size", "0"), "--world-size must be at least 1"),
        (("test", "v1", "--world-size", "256"), "on CPU (gloo) at most"),
        (("test", "v1", "--timeout", "-1"), "--timeout must be at least 1 s"),
        (("test", "v1", "--timeout", "0"), "--timeout must be at least 1 s"),
        (("test", "v1", "--timeout", "1e-9"), "--timeout must be at least 1 s"),
        (("test", "v1", "--timeout", "inf"), "and at most 86400 s, not inf"),  # A2A_TIMEOUT's range
        (("test", "v1", "--seed", "10000000000"), "mixed into this test's seed gives"),
        (("test", "v1", "--seed", str(2**64)), "--seed must be from 0 to"),
        (("test", "v1", "--seed", str(10**29)), "--seed must be from 0 to"),
        (("test", "v1", "--cases", _file(tmp, "bad.txt", "num_experts: 8; experts_per_token two\n")),
         "invalid test case"),
        (("test", "v1", "--cases", _file(tmp, "eight.txt", line.replace("8;", "eight;", 1))),
         "num_experts must be an integer, not 'eight'"),
        (("test", "v1", "--cases", _file(tmp, "neg.txt", line.replace("hidden_dim: 64", "hidden_dim: -64"))),
         "hidden_dim must be at least 1, not -64"),
        (("test", "v1", "--cases", _file(tmp, "huge.txt", line.replace("hidden_dim: 64", "hidden_dim: 1000000000"))),
         "hidden_dim must be at most 65536"),
        (("test", "v1", "--cases", _file(tmp, "ws.txt", line.replace("world_size: 2", "world_size: -2"))),
         "world_size must be at least 1, not -2"),
        (("test", "v1", "--cases", _file(tmp, "color.txt", line + "; color: red")), "unknown field 'color'"),
        (("test", "v1", "--cases", _file(tmp, "twice.txt", line + "; seed: 5")), "'seed' is given twice"),
        (("test", "v1", "--cases", _file(tmp, "long.txt", line + "; " + "x" * 1_000_000)),
         "a test line of 1000"),
        (("test", "v1", "--cases", _file(tmp, "bigseed.txt", line.replace("seed: 1", f"seed: {2**64}"))),
         "outside what the generator takes"),
        (("test", "v1", "--cases", _file(tmp, "latin1.txt", line.encode() + b" \xe9\xff\n")), "not UTF-8"),
        (("test", "v1", "--cases", str(tmp / "a_folder")), "not a file"),
        (("test", "v1", "--cases", str(tmp / "nothing_here.txt")), "no such file"),
        (("test", "v1", "--cases", _file(tmp, "empty.txt", "\n")), "holds no test cases"),
        (("test", "v1", "--cases", "tests:42"), "give indices from 0 to 8"),
        (("test", "v1", "--cases", "tests:-1"), "give indices from 0 to 8"),
        (("test", "v1", "--cases", "tests:"), "give indices from 0 to 8"),
        (("test", "v1", "--cases", "tests:" + "9" * 5000), "give indices from 0 to 8"),  # red team 69: int()'s limit
        (("test", "v1", "--task", _file(tmp, "task.yml", "files: [\n")), "not valid YAML"),
        (("test", "v1", "--task", _file(tmp, "incomplete.yml", "files: []\ntests: []\n")), "must be a non-empty list"),
        (("stage", "v1"), "usage"),
        (("stage", "v1", str(full)), "is not an empty folder"),
        (("stage", "v1", str(Path(a_file) / "bundle")), "cannot write the bundle"),
        (("stage", "v1", str(tmp / "staged"), "--seed", "5", "--world-size", "3"),
         "--world-size, --seed would be ignored"),
        (("trace", "v2", "--out", a_file), "is not a folder"),
    ]


def test_the_human_face_rejects_bad_input_in_one_line(tmp_path):
    for args, message in human_face_cases(tmp_path):
        result = run_eval(*args, timeout=120)
        assert result.returncode == EXIT_BAD_INPUT, (args, result.returncode, result.stderr[-500:])
        assert message in result.stderr, (args, result.stderr[-500:])
        assert "Traceback" not in result.stderr, (args, result.stderr[-2000:])
        assert len(result.stderr.strip().splitlines()) <= 2 and len(result.stderr) < 1000, (args, result.stderr[:500])
    assert [p.name for p in (tmp_path / "full").iterdir()] == ["something"], "staging into a full folder wrote"


def test_a_malformed_command_line_exits_2():
    assert run_eval("test").returncode == EXIT_USAGE
    assert run_eval("test", "v1", "--world-size", "two").returncode == EXIT_USAGE


def _command(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, script, *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_run_leaderboard_evaluates_the_file_it_is_given(tmp_path):
    """A user's wrong file named v1.py must be run and fail, never replaced by the repository's v1."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "v1.py").write_text("import torch\n\ndef custom_kernel(data):\n    return torch.zeros_like(data[1].x)\n")
    result = _command("run_leaderboard.py", "--versions", str(mine / "v1.py"), "--cases", "benchmarks:0",
                      "--world-size", "2", "--no-problem-size", "--out", str(tmp_path / "out"))
    assert result.returncode == EXIT_CHECK_FAILED, result.stdout[-2000:] + result.stderr[-2000:]
    assert "all pass" in result.stdout and "| no:" in result.stdout and "v1_torch_sort" not in result.stdout


@pytest.mark.parametrize("redirect", ["2>&- | true", ">&-"], ids=["no-stderr-gone-reader", "no-stdout"])
def test_a_closed_or_gone_output_fails_no_entry_and_loses_no_run(tmp_path, redirect):
    """Red team 42: the clock started without a stderr failed the honest v1 ("rank process died": its ranks' fault
    handler had no file), without a stdout it ended with 114 at the round's end, and with a reader that went away
    (`| head`) with 114 at its first line; nothing was saved. Now v1 passes and the run is saved."""
    out = tmp_path / "out"
    command = (f"exec {sys.executable} run_leaderboard.py --versions v1 --cases benchmarks:0 --world-size 2 "
               f"--backend gloo --min-rounds 2 --max-rounds 2 --no-anchors --no-problem-size --out {out}")
    done = subprocess.run(["bash", "-c", f"set -o pipefail; {command} {redirect}"], cwd=ROOT, timeout=600,
                          capture_output=True, text=True)
    saved = [json.loads(path.read_text()) for path in out.glob("*/results.json")]
    assert done.returncode == 0 and len(saved) == 1, (done.returncode, done.stderr[-2000:])
    assert [row["status"] for row in saved[0]["rows"]] == ["pass"], saved[0]["rows"]


@pytest.mark.parametrize("versions, message", [("", "names no version"), (",", "names no version"),
                                               ("v1,v99", "unknown version 'v99'")])
def test_run_leaderboard_rejects_bad_version_lists(tmp_path, versions, message):
    result = _command("run_leaderboard.py", "--versions", versions, "--out", str(tmp_path))
    assert result.returncode == EXIT_BAD_INPUT and message in result.stderr, result.stderr[-1000:]
    assert not saved_in(tmp_path)


@pytest.mark.parametrize("option, value, message", [
    ("--time-cap", "nan", "--time-cap must be above 0"), ("--time-cap", "inf", "--time-cap must be above 0"),
    ("--time-cap", "-1", "--time-cap must be above 0"), ("--seed", "-1", "--seed must be from 0"),
    ("--seed", str(2**64), "--seed must be from 0"), ("--timeout", "nan", "--timeout must be at least 1 s"),
    ("--timeout", "inf", "--timeout must be at least 1 s"), ("--max-rounds", "10001", "--max-rounds must be at most"),
    ("--steps", str(10**23), "--steps must be at most"), ("--target", "owner=1e-320", "the fraction from")])
def test_run_leaderboard_s_numbers_are_finite_and_in_range_before_any_work(tmp_path, option, value, message):
    """Red team 39: --time-cap nan passed (NaN <= 0 is False) and ended the run with 114 after its first round,
    nothing saved."""
    result = _command("run_leaderboard.py", "--versions", "v1", "--cases", "benchmarks:0", "--world-size", "2",
                      "--min-rounds", "2", "--max-rounds", "2", "--steps", "2", "--no-problem-size", option, value,
                      "--out", str(tmp_path / "out"))
    assert result.returncode == EXIT_BAD_INPUT and message in result.stderr, result.stdout[-1000:] + result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("preload", [b"/tmp/\xff.so", b"/proc/self/fd/1"])
def test_the_judges_own_git_runs_without_the_operators_preload(tmp_path, preload):
    """Red team 39: the commit a run is labelled with came from git run with the operator's LD_PRELOAD: a path of a
    raw byte made ld.so's warning on git's stderr undecodable (114), and /proc/self/fd/1 had git read its own
    stdout, a pipe, forever. git runs without it now, within its timeout, and its words are read as bytes."""
    env = {**os.environb, b"LD_PRELOAD": preload}
    env.pop(b"A2A_COMMIT", None)
    with open(tmp_path / "out", "wb") as out:  # a file, as a judge's log: the interpreter's own preload reads it
        done = subprocess.run([sys.executable, "-c", "from a2a import plan; print(plan.commit())"], cwd=ROOT,
                              env=env, stdout=out, stderr=subprocess.PIPE, timeout=120)
    said = (tmp_path / "out").read_bytes().strip()
    assert done.returncode == 0 and said and b"unknown" not in said, (said, done.stderr[-2000:])


def _touching_hook(folder: Path) -> tuple:
    """(a script that leaves a file when something runs it, that file's path)."""
    ran, hook = folder / "ran", folder / "hook.sh"
    hook.write_text(f"#!/bin/sh\ntouch {ran}\nexit 1\n")
    hook.chmod(0o755)
    return hook, ran


@pytest.mark.parametrize("setting", ["~/.gitconfig", "GIT_CONFIG_PARAMETERS", "a relative PATH entry"])
def test_the_judges_own_git_reads_no_setting_of_the_users_and_finds_git_by_no_relative_path(tmp_path, setting):
    """Red team 47: root's git read `include.path` in ~/.gitconfig, the operator's git parameters, and found `git`
    by a relative PATH entry from the repository, each leading to a rank's file: a fsmonitor command or a `git` of
    its own ran as root. The judge's git reads the repository's settings only and finds git by absolute entries."""
    hook, ran = _touching_hook(tmp_path)
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "HOME": str(home)}
    env.pop("A2A_COMMIT", None)
    if setting == "~/.gitconfig":
        (home / ".gitconfig").write_text(f"[core]\n\tfsmonitor = {hook}\n")
    if setting == "GIT_CONFIG_PARAMETERS":
        env["GIT_CONFIG_PARAMETERS"] = f"'core.fsmonitor'='{hook}'"
    if setting == "a relative PATH entry":
        fake = tmp_path / "fake"
        fake.mkdir()
        (fake / "git").symlink_to(hook)
        env["PATH"] = os.pathsep.join([os.path.relpath(fake, ROOT), env["PATH"]])
    done = subprocess.run([sys.executable, "-c", "from a2a import plan; print(plan.commit())"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() not in ("", "unknown"), done.stdout + done.stderr[-2000:]
    assert not ran.exists()


def test_the_judges_own_git_runs_no_command_the_repositorys_config_names(tmp_path):
    """Red team 58: root's git read the repository's own config, where a rank that could write the git folder (a
    writable folder bound onto it) could name a fsmonitor command or a hooks folder. The judge's git takes neither."""
    from a2a import plan

    hook, ran = _touching_hook(tmp_path)
    repo = tmp_path / "repo"
    repo.mkdir()
    committer = ["-c", "user.name=t", "-c", "user.email=t@t"]
    for args in (["init", "-q"], [*committer, "commit", "-q", "--allow-empty", "-m", "x"],
                 ["config", "core.fsmonitor", str(hook)]):
        subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, timeout=60)
    done = plan.judges_git("status", "--porcelain", cwd=repo)
    assert done.returncode == 0 and not ran.exists(), done.stderr[-2000:]


def test_a_memory_cap_no_cgroup_can_hold_is_bad_input(monkeypatch):
    """A2A_POOL_MEMORY_GB set where there is no memory cgroup: the pools would have run with no cap at all, the
    operator's number said nowhere but in the boundary line's "no memory cap". Refused before any work (eval.py's
    start checks call pool_memory_bytes); unset, the default stands."""
    import pool_memory

    monkeypatch.setattr(pool_memory, "_memory_controller", lambda: None)
    monkeypatch.setenv(pool_memory.POOL_MEMORY_ENV, "2")
    with pytest.raises(ValueError, match="A2A_POOL_MEMORY_GB='2': this machine has no memory cgroup"):
        pool_memory.pool_memory_bytes()
    monkeypatch.delenv(pool_memory.POOL_MEMORY_ENV)
    assert pool_memory.pool_memory_bytes() == os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2


def test_commands_and_tools_refuse_bad_input_before_any_work(tmp_path):
    """Each found before a rank starts: one line, 113, nothing saved. Red team 69: a rank cache or --out that is a
    link to nothing, a file, or a name past the file system's limits ended the command with 114 (a run's results
    unsaved), and a shared folder named as the rank cache was closed (0700) and pruned."""
    a_file = Path(_file(tmp_path, "a_file", ""))
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nothing" / "here")
    shared = tmp_path / "shared"
    (shared / "home" / "alice").mkdir(parents=True)
    (shared / "home" / "alice" / "thesis.txt").write_text("mine")
    shared.chmod(0o1777)
    for variable, value in (("A2A_POOL_MEMORY_GB", "-1"), ("A2A_POOL_MEMORY_GB", "nan"), ("A2A_RANK_BIRTH", "exec"),
                            ("A2A_PIN_CPUS", "first"), ("A2A_PIN_CPUS", "9999"), ("A2A_PIN_OWNER_CPU", "0,1"),
                            ("A2A_PIN_OWNER_CPU", "9999"), ("A2A_RANK_CACHE", str(dangling)),
                            ("A2A_RANK_CACHE", str(a_file)), ("A2A_RANK_CACHE", str(shared))):
        for command in (("eval.py", "test", "v1"), ("run_leaderboard.py", "--versions", "v1", "--out",
                                                     str(tmp_path / "o0"))):
            result = subprocess.run([sys.executable, *command], cwd=ROOT, capture_output=True, text=True,
                                    timeout=600, env={**os.environ, variable: value})
            assert result.returncode == EXIT_BAD_INPUT and f"{variable}={value!r}" in result.stderr, result.stderr
            assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    for command, message in [
        (("run_leaderboard.py", "--versions", "v1,v1", "--out", str(tmp_path / "o1")), "v1_torch_sort named more"),
        (("run_leaderboard.py", "--versions", f"v1,{ROOT / 'submissions/all2all/v1_torch_sort.py'}",
          "--out", str(tmp_path / "o2")), "named more than once"),
        (("run_leaderboard.py", "--versions", "v1", "--out", str(a_file / "results")), "is not a folder"),
        (("run_leaderboard.py", "--versions", "v1", "--out", str(dangling)), "is a link to nothing"),
        (("diff.py", "v1", "v2", "--out", str(tmp_path / ("o" * 300))), "a name longer than this file system's"),
        (("run_leaderboard.py", "--versions", "v1", "--out", str(tmp_path / "/".join(["o" * 20] * 200))),
         "too long a path for a run's folder"),
        (("run_leaderboard.py", "--versions", "v1", "--target", "held=0.02,held=0.05", "--out", str(tmp_path / "o4")),
         "held is given twice"),
        (("diff.py", "v1", "v2", "--cases", "tests:" + "9" * 5000, "--out", str(tmp_path / "o5")), "give indices"),
        (("-m", "tools.step_anatomy", "v1", "--iterations", "0", "--out", str(tmp_path / "o3")),
         "--iterations must be at least 1"),
        (("-m", "tools.check_device", str(tmp_path / "missing.py")), "no such file" if _compilers() else "not found"),
    ]:
        result = _command(*command)
        assert result.returncode == EXIT_BAD_INPUT and message in result.stderr, (command, result.stderr[-800:])
        assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("o")], "a refused command saved something"
    assert stat.S_IMODE(shared.stat().st_mode) == 0o1777 and (shared / "home" / "alice" / "thesis.txt").exists()
    for args, message in [((), "usage"), ((str(tmp_path / "s"), "bogus"), "unknown step 'bogus'"),
                          ((str(tmp_path / "s"), "env", "set:PATH=/tmp"), "sets no A2A_ variable"),
                          ((str(tmp_path / "s"), "check", "env", "stability:x"), "unknown step 'stability:x'"),
                          ((str(tmp_path / "s"), "check", "tests:run_free or free_running"),
                           "'free_running' selects no test")]:
        done = subprocess.run(["bash", "tools/gpu_session.sh", *args], cwd=ROOT, capture_output=True, text=True)
        assert done.returncode == EXIT_BAD_INPUT and message in done.stderr, done.stderr
    checked = subprocess.run(["bash", "tools/gpu_session.sh", str(tmp_path / "s"), "check", "env", "build",
                              "leaderboard:v1,v10:--world-size 4", "tests:run_free or trace_build"], cwd=ROOT,
                             capture_output=True, text=True)
    assert checked.returncode == 0 and "every step known" in checked.stdout, checked.stderr
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("variable, value", [("A2A_SPIN_US", "abc"), ("A2A_SPIN_US", "1e400"),
                                             ("A2A_RANK_SPIN_US", "nan"), ("A2A_RANK_SPIN_US", "-5"),
                                             ("A2A_TIMEOUT", "abc"), ("A2A_TIMEOUT", "nan"), ("A2A_TIMEOUT", "inf"),
                                             ("A2A_TIMEOUT", "0.001")])
def test_the_operators_numeric_knobs_are_bad_input_before_any_work(variable, value):
    """Red team 39: an odd spin or timeout ended the judge with 114 once its ranks ran, or failed the case as if the
    entry had (A2A_RANK_SPIN_US is read in the ranks). Each is one line and 113 now, before a rank starts."""
    result = subprocess.run([sys.executable, "eval.py", "test", "v1", "--cases", "tests:0"], cwd=ROOT,
                            capture_output=True, text=True, timeout=600, env={**os.environ, variable: value})
    assert result.returncode == EXIT_BAD_INPUT and f"{variable}={value!r}: expected a number" in result.stderr, \
        result.stderr[-2000:]
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.mark.parametrize("variable", ["PATH", "PYTHONPATH", "LD_PRELOAD", "/tmp", "below PYTHONPATH",
                                      "PYTHONPYCACHEPREFIX", "A2A_LOG_DIR", "HOME", "XDG_CONFIG_HOME",
                                      "MPLCONFIGDIR", "XDG_CACHE_HOME", "CFLAGS", "a space", "relative",
                                      "A2A_NCCL_LIB", "a home's link", "a tilde", "a shell variable",
                                      "fontconfig's link", "a link below ~/.config", "a bare relative name",
                                      "a link below ~/.config/git", "a shell's default",
                                      "a link three levels below ~/.config"])
def test_a_rank_writable_folder_that_holds_what_the_judge_runs_is_bad_input(tmp_path, variable):
    """Red team 39, from the code: an A2A_RANK_WRITABLE folder holding a folder of PATH or sys.path, or a preloaded
    library, let a rank replace what the judge's next process runs as root. Red team 41: /tmp writable failed the
    honest v1 (112, its staged bundle out of the ranks' sight). Red team 42: a writable matplotlib/ below a
    PYTHONPATH entry, which the next command's judge imported as root. Red team 43: a .pyc below the bytecode
    prefix, run as root by the next judge; the judge's chmod of its old build logs following a rank's links there.
    Red team 44: git's config below XDG_CONFIG_HOME (root's `git status` ran its fsmonitor command) and matplotlib's
    font cache below MPLCONFIGDIR or XDG_CACHE_HOME (root wrote it through a rank's link): every path the judge's
    environment names counts, a header folder among them. One line and 113, before any rank."""
    writable = tmp_path / "writable"
    (writable / "bin").mkdir(parents=True)
    library = libm_copy(writable / "bin" / "libnothing.so")
    held = {"PATH": {"PATH": f"{writable / 'bin'}{os.pathsep}{os.environ['PATH']}"},
            "PYTHONPATH": {"PYTHONPATH": str(writable / "bin")}, "LD_PRELOAD": {"LD_PRELOAD": str(library)},
            "/tmp": {}, "below PYTHONPATH": {"PYTHONPATH": str(tmp_path)},
            "PYTHONPYCACHEPREFIX": {"PYTHONPYCACHEPREFIX": str(tmp_path)},
            "A2A_LOG_DIR": {"A2A_LOG_DIR": str(writable / "logs")}, "HOME": {"HOME": str(writable / "home")},
            **{name: {name: str(writable / "config")} for name in ("XDG_CONFIG_HOME", "MPLCONFIGDIR", "XDG_CACHE_HOME")},
            "CFLAGS": {"CFLAGS": f"-O2 -I{writable / 'include'}"},
            # red team 45: a path with a space, one relative to the working folder, the harness's own NCCL knob, and
            # root's ~/.config a link into the folder (no variable names it)
            "a space": {"MPLCONFIGDIR": str(writable / "my scratch" / "mpl")},
            "relative": {"MPLCONFIGDIR": os.path.relpath(writable / "mpl", ROOT)},
            "A2A_NCCL_LIB": {"A2A_NCCL_LIB": str(writable / "libnccl.so.2")},
            "a home's link": {"HOME": str(tmp_path / "home")},
            # red team 46: git's `~` and a shell's `$HOME` expanded into the folder, fontconfig's and pip's files in
            # root's home, a link among ~/.config's entries, and a relative name without a '/'
            "a tilde": {"HOME": str(tmp_path / "home"), "GIT_CONFIG_PARAMETERS": "'include.path'='~/../writable/g'"},
            "a shell variable": {"HOME": str(tmp_path / "home"), "GIT_EDITOR": "$HOME/../writable/editor"},
            "fontconfig's link": {"HOME": str(tmp_path / "home")},
            "a link below ~/.config": {"HOME": str(tmp_path / "home")},
            "a bare relative name": {"MPLCONFIGDIR": "writable"},  # from tmp_path
            # red team 47: git's own config file a link, and a default the shell fills in
            "a link below ~/.config/git": {"HOME": str(tmp_path / "home")},
            "a shell's default": {"GIT_CONFIG_PARAMETERS": f"'core.fsmonitor'='${{A2A_NONE:-{writable}}}/hook'"},
            # red team 48: matplotlib's style sheet a link, a level further down
            "a link three levels below ~/.config": {"HOME": str(tmp_path / "home")}}[variable]
    (tmp_path / "home" / ".config").mkdir(parents=True)
    if variable == "a home's link":
        (tmp_path / "home" / ".config").rmdir()
        (tmp_path / "home" / ".config").symlink_to(writable)
    if variable == "fontconfig's link":  # dangling until a rank makes the folder
        (tmp_path / "home" / ".fonts.conf.d").symlink_to(writable / "fontconf")
    if variable == "a link below ~/.config":
        (tmp_path / "home" / ".config" / "pip").symlink_to(writable / "pip")
    if variable == "a link three levels below ~/.config":
        (tmp_path / "home" / ".config" / "matplotlib" / "stylelib").mkdir(parents=True)
        (tmp_path / "home" / ".config" / "matplotlib" / "stylelib" / "x.mplstyle").symlink_to(writable / "x")
    if variable == "a link below ~/.config/git":
        (tmp_path / "home" / ".config" / "git").mkdir()
        (tmp_path / "home" / ".config" / "git" / "config").symlink_to(writable / "gitconfig")
    result = subprocess.run([sys.executable, str(ROOT / "eval.py"), "test", "v1", "--cases", "tests:0"],
                            cwd=tmp_path if variable == "a bare relative name" else ROOT,
                            capture_output=True, text=True, timeout=600,
                            env={**os.environ, **held, "A2A_RANK_WRITABLE": "/tmp" if variable == "/tmp" else
                                 str(writable)})
    # a checkout below /tmp (a CI clone) is a judge started in the writable folder, refused first
    said = "the working folder lies in" if variable == "/tmp" and ROOT.is_relative_to("/tmp") else "which the judge"
    assert result.returncode == EXIT_BAD_INPUT and said in result.stderr, result.stderr[-2000:]
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_the_makefiles_commands_start_behind_the_writable_folders_check(tmp_path):
    """Red team 50: root's interpreter ran a rank's sitecustomize.py from a PYTHONPATH into an A2A_RANK_WRITABLE folder
    before the command's check refused it. Every Python the Makefile starts starts behind rank_writable.py's check, in
    an interpreter that reads no PYTHON* variable: the line and a failed make, the file never run; without such a
    folder the command runs in the gate's place, its exit code its own."""
    writable, ran = tmp_path / "writable", tmp_path / "ran"
    writable.mkdir(mode=0o1777)
    (writable / "sitecustomize.py").write_text(f"open({str(ran)!r}, 'w').close()\n")
    (writable / "env.sh").write_text(f"touch {str(ran)!r}\n")  # red team 52: sourced by make's shell
    env = {**os.environ, "PYTHONPATH": str(writable), "A2A_RANK_WRITABLE": str(writable),
           "BASH_ENV": str(writable / "env.sh")}
    result = subprocess.run(["make", "-s", "--no-print-directory", "diff", "A=v1", "B=v1"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=300)
    assert not ran.exists(), "a rank's sitecustomize.py or shell script ran before the check"
    assert result.returncode != 0 and "Error 113" in result.stderr, result.stdout + result.stderr
    assert result.stderr.startswith(f"error: A2A_RANK_WRITABLE folder '{writable}' holds"), result.stderr
    passed = subprocess.run(["python3", "-E", "-s", "-B", "rank_writable.py", "sh", "-c", "exit 7"], cwd=ROOT)
    assert passed.returncode == 7
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "A2A_RANK_WRITABLE")}
    planned = subprocess.run(["make", "-n", "--no-print-directory", "test", "test-full", "test-gpu", "check-device",
                              "leaderboard", "sol", "trace", "diff", "sweep", "stability", "nccl"], cwd=ROOT, env=clean,
                             capture_output=True, text=True, timeout=300).stdout.splitlines()
    gated = [line for line in planned if any(run in line for run in (" -m a2a.cli ", " -m pytest ", "build_nccl.sh"))]
    assert len(gated) >= 11 and all(" -E -s -B rank_writable.py " in line for line in gated), planned


def test_the_makefile_picks_no_version_whose_name_a_shell_would_split(tmp_path):
    """Red team 52: a submission file named `v99_x;id;.py`, the newest by name, ran `id` as root under `make trace`.
    The Makefile's default versions are only names a shell reads as one word."""
    (tmp_path / "submissions" / "all2all").mkdir(parents=True)
    for name in ("v1_plain.py", "v99_x;touch ran;.py"):
        (tmp_path / "submissions" / "all2all" / name).write_text("")
    planned = subprocess.run(["make", "-n", "-f", str(ROOT / "Makefile"), "trace", "diff"], cwd=tmp_path,
                             capture_output=True, text=True, timeout=120).stdout
    assert "eval trace v1_plain " in planned and "touch" not in planned, planned


def test_an_interpreter_that_would_not_exit_with_the_verdict_is_bad_input():
    """Red team 52: under PYTHONINSPECT a SystemExit exits 1 whatever its code (a pass, a fail and bad input alike),
    or stops root in a prompt holding the judge. One line and 113 before any work, on every command's face."""
    for command in (["eval.py", "test", "v1", "--cases", "tests:0"], ["diff.py", "v1", "v1"]):
        done = subprocess.run([sys.executable, *command], cwd=ROOT, stdin=subprocess.DEVNULL, timeout=120,
                              env={**os.environ, "PYTHONINSPECT": "1"}, capture_output=True, text=True)
        assert done.returncode == EXIT_BAD_INPUT and done.stderr.startswith("error: PYTHONINSPECT"), done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_a_tool_is_imported_from_the_repository_never_the_working_folder(tmp_path):
    """Red team 51: `python -m a2a.cli` typed in an A2A_RANK_WRITABLE folder imported a rank's package from it, as
    root. The command layer starts each tool with -P: a `tools` package planted in the working folder is not run."""
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "__init__.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\n")
    done = subprocess.run([sys.executable, "-m", "a2a.cli", "cpu-speed", "--help"], cwd=tmp_path, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True)
    assert done.returncode == 0 and "usage: cpu_speed.py" in done.stdout, done.stdout + done.stderr
    assert not (tmp_path / "ran").exists(), "a tools package in the working folder ran"


@pytest.mark.parametrize("command", ["out", "out made by another", "out through a link", "two submissions", "diff",
                                     "the runner's face"])
def test_a_rank_writable_folder_the_judge_saves_in_or_two_entries_share_is_bad_input(tmp_path, command):
    """Red team 43: --out below an A2A_RANK_WRITABLE folder let a rank put its own folder where the judge saved the
    run (a forged results.csv); and one writable folder for two submissions of a clock run let the one timed first
    leave the round's answers for the other. The judge saves nothing in a writable folder (its own view has it
    covered), nor through a link a rank left there. One line and 113, before any rank."""
    if command == "out made by another" and os.geteuid() != 0:
        pytest.skip("giving a folder to another uid needs root")
    writable = tmp_path / "writable"
    writable.mkdir()
    writable.chmod(0o1777 if command == "out made by another" else 0o777)
    out = writable / "out" if command.startswith("out") else tmp_path / "out"
    if command == "out made by another":
        out.mkdir()
        os.chown(out, 65534, 65534)
    if command == "out through a link":  # red team 44: a link a rank left, pointing out of the folder for now
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        (writable / "out").symlink_to(elsewhere)
        out = writable / "out" / "results"
    copy = tmp_path / "v1_copy.py"  # a second submission that runs on a CPU too
    copy.write_text((ROOT / "submissions" / "all2all" / "v1_torch_sort.py").read_text())
    args = {"out": ["run_leaderboard.py", "--versions", "v1"], "out made by another": [
        "run_leaderboard.py", "--versions", "v1"], "out through a link": ["run_leaderboard.py", "--versions", "v1"],
        "two submissions": [
        "run_leaderboard.py", "--versions", f"v1,{copy}"], "diff": ["diff.py", "v1", str(copy)],
        "the runner's face": ["-m", "tools.runner_face", "--versions", f"v1,{copy}"]}[command]  # red team 46
    options = ["--backend", "gloo", "--cases", "benchmarks:0"] if command != "the runner's face" else []
    result = subprocess.run([sys.executable, *args, *options, "--world-size", "2", "--out", str(out)], cwd=ROOT,
                            capture_output=True, text=True, timeout=600,
                            env={**os.environ, "A2A_RANK_WRITABLE": str(writable)})
    said = {"two submissions": "a channel between them", "diff": "a channel between them",
            "the runner's face": "a channel between them"}.get(command, "a folder of its own")
    assert result.returncode == EXIT_BAD_INPUT and said in result.stderr, result.stderr[-2000:]
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not out.exists() or command.startswith("out") and not any(out.iterdir())


@pytest.mark.parametrize("case", ["a rank's folder", "a rank's link", "../lib from the bundle"])
def test_a_bundle_in_a_rank_writable_folder_is_the_judges_alone(tmp_path, case):
    """Red team 46: `stage` wrote a bundle into a folder a rank had made in the writable folder (the rank then
    swapped its eval.py, which root ran), or through a rank's link into a folder of root's; and a staged bundle run
    in the writable folder with `LD_LIBRARY_PATH=../lib` loaded a rank's libm into root's judge, its relative paths
    taken as the bundle's own: no judge runs from a writable folder now. One line and 113, before anything is
    written or any rank runs."""
    writable, elsewhere = tmp_path / "writable", tmp_path / "elsewhere"
    writable.mkdir(mode=0o1777)
    writable.chmod(0o1777)
    elsewhere.mkdir()
    bundle = writable / "bundle"
    env = {**os.environ, "A2A_RANK_WRITABLE": str(writable)}
    if case == "a rank's folder":
        bundle.mkdir(mode=0o777)
        bundle.chmod(0o777)
        if os.geteuid() == 0:
            os.chown(bundle, 65534, 65534)
    if case == "a rank's link":
        bundle.symlink_to(elsewhere)
    if case == "../lib from the bundle":
        staged = subprocess.run([sys.executable, "eval.py", "stage", "v1", str(bundle)], cwd=ROOT,  # as if moved
                                capture_output=True, text=True, timeout=600, env=os.environ)
        assert staged.returncode == 0, staged.stderr
        result = subprocess.run([sys.executable, "eval.py", "test", "tests.txt"], cwd=bundle, capture_output=True,
                                text=True, timeout=600, env={**env, "LD_LIBRARY_PATH": "../lib", "POPCORN_FD": "1",
                                                             "POPCORN_GPUS": "8", "A2A_BACKEND": "gloo"})
        said = "the working folder lies in"
    else:
        result = subprocess.run([sys.executable, "eval.py", "stage", "v1", str(bundle)], cwd=ROOT,
                                capture_output=True, text=True, timeout=600, env=env)
        said = "a folder of its own"
    assert result.returncode == EXIT_BAD_INPUT and said in result.stderr, result.stderr[-2000:]
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not any(elsewhere.iterdir())
    assert case != "a rank's folder" or not any(bundle.iterdir())


def test_a_bundle_staged_under_a_closed_umask_is_readable_by_the_ranks(tmp_path):
    """Red team 47: under root's umask 077 `stage` made a bundle the ranks' uid could not read: the honest v1 failed
    (112) on the human face and the clock, and a 0700 bundle turned the guards off on the protocol face."""
    done = subprocess.run([sys.executable, "eval.py", "stage", "v1", str(tmp_path / "bundle")], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, preexec_fn=lambda: os.umask(0o077))
    assert done.returncode == 0, done.stderr
    modes = {path.name: stat.S_IMODE(path.stat().st_mode) for path in [tmp_path / "bundle", *(tmp_path / "bundle").iterdir()]}
    assert modes.pop("bundle") == 0o755 and set(modes.values()) == {0o644}, modes


def test_a_path_no_process_can_look_at_is_followed_no_further(tmp_path, monkeypatch):
    """Red team 46: a variable naming a path with a part over 255 bytes ended every command with 114 once a writable
    folder was set (the lookup's ENAMETOOLONG). Such a part leads nowhere, for root's tools too."""
    import rank_writable

    writable = tmp_path / "writable"
    writable.mkdir()
    rank_writable.check({"A2A_RANK_WRITABLE": str(writable), "HOME": str(tmp_path), "X": "/" + "a" * 300 + "/b"})


def test_a_gpu_session_folder_of_an_earlier_session_is_moved_aside_not_packed(tmp_path):
    """A session folder first used 5 hours ago, its logs in it (a machine lent again keeps its /tmp): the next
    session's command moves it aside whole and starts an empty one; a folder used minutes ago is kept as it is."""
    folder = tmp_path / "session"
    (folder / "logs").mkdir(parents=True)
    (folder / "logs" / "earlier.log").write_text("an earlier session's")
    (folder / ".first_used").touch()
    os.utime(folder / ".first_used", (time.time() - 5 * 3600,) * 2)
    for _ in range(2):
        done = subprocess.run(["bash", "tools/gpu_session.sh", str(folder), "set:A2A_PROBE=1"], cwd=ROOT,
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("session.earlier.")]
    assert len(aside) == 1 and (aside[0] / "logs" / "earlier.log").is_file(), list(tmp_path.iterdir())
    assert not (folder / "logs" / "earlier.log").exists() and (folder / ".first_used").is_file()


def test_a_gpu_session_wait_gives_up_at_its_bound_and_the_pack_after_it_runs(tmp_path):
    """`wait:SECONDS pack:DEST` in one device command: a detached run still going at the bound does not keep the
    pack from running inside the call's limit (2026-11-28: a poll that ran to the limit packed nothing)."""
    folder, dest = tmp_path / "session", tmp_path / "out"
    (folder / "logs").mkdir(parents=True)
    (folder / "logs" / "session.log").write_text("== leaderboard: start\n")
    (folder / ".running").touch()  # a detached run that goes on
    started = time.monotonic()
    done = subprocess.run(["bash", "tools/gpu_session.sh", str(folder), "wait:2", f"pack:{dest}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    took = time.monotonic() - started
    assert done.returncode == 0 and "still running after 2s" in done.stdout, done.stdout + done.stderr
    assert 2 <= took < 20 and (dest / "session.tgz").is_file(), (took, list(dest.iterdir()) if dest.exists() else None)


def test_a_submission_path_with_control_characters_is_refused(tmp_path):
    """A file named `esc ESC[2J ESC[H check: pass CR X.py` (red team 33: its name was printed raw on the terminal and
    written raw into table.md, results.csv and the plots): one escaped line, 113, before any work."""
    path = tmp_path / "esc\x1b[2J\x1b[Hcheck: pass\rX.py"
    path.write_text(V1.read_text())
    for command in (("eval.py", "test", str(path), "--world-size", "2", "--cases", "tests:0"),
                    ("run_leaderboard.py", "--versions", str(path), "--out", str(tmp_path / "o"))):
        result = _command(*command)
        assert result.returncode == EXIT_BAD_INPUT and "no control" in result.stderr, result.stderr[-800:]
        assert "\x1b" not in result.stdout + result.stderr and "\r" not in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (tmp_path / "o").exists()


def test_a_submission_file_name_too_long_for_a_folder_name_is_refused(tmp_path):
    """A 240-byte file name (red team 35: diff.py timed its run and then could not make its folder, and eval.py and
    run_leaderboard.py failed making a temporary folder, 114): one line, 113, before any work."""
    path = tmp_path / ("v" * 236 + ".py")
    path.write_text(V1.read_text())
    for command in (("eval.py", "test", str(path), "--world-size", "2", "--cases", "tests:0"),
                    ("run_leaderboard.py", "--versions", str(path), "--out", str(tmp_path / "o")),
                    ("diff.py", str(path), "v1", "--out", str(tmp_path / "o"))):
        result = _command(*command)
        assert result.returncode == EXIT_BAD_INPUT and "at most 100 bytes" in result.stderr, result.stderr[-800:]
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (tmp_path / "o").exists()

def test_a_plain_name_that_leads_to_a_bad_one_is_refused(tmp_path):
    """Red team 38: plain.py, a link to a file whose name holds escapes and a bidi override, printed them raw and
    wrote them into table.md; one to a 250-byte name ended eval.py with 114 and diff.py after its whole timing. The
    file a link leads to is held to the same rules: one line, 113, before any work."""
    escapes = tmp_path / "evil\x1b[2J\x1b[31mPASS\u202e.py"
    long = tmp_path / ("M" * 250 + ".py")
    for target, message in ((escapes, "no control"), (long, "at most 100 bytes")):
        target.write_text(V1.read_text())
        link = tmp_path / "plain.py"
        link.unlink(missing_ok=True)
        link.symlink_to(target)
        for command in (("eval.py", "test", str(link), "--world-size", "2", "--cases", "tests:0"),
                        ("run_leaderboard.py", "--versions", str(link), "--out", str(tmp_path / "o")),
                        ("diff.py", str(link), "v1", "--out", str(tmp_path / "o"))):
            result = _command(*command)
            assert result.returncode == EXIT_BAD_INPUT and message in result.stderr, result.stderr[-800:]
            assert "leads to" in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
            assert "\x1b" not in result.stdout + result.stderr and "\u202e" not in result.stderr
    assert not (tmp_path / "o").exists()


def test_a_saved_speed_of_light_is_read_before_any_work(tmp_path):
    """Red team 38: --sol was read after the whole clock, unchecked: a FIFO would hang the judge there, a missing
    file or a sol.json of another shape end it with the tables unsaved. Each is one line, 113, before any work."""
    good = {"world_size": 2, "launch_us": 4.0, "one_way_latency_us": 1.5, "a2a_store_gbps": 300.0,
            "local_copy_gbps": 4000.0}
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    cases = {"missing": (tmp_path / "missing.json", "no readable sol.json"), "fifo": (fifo, "no readable sol.json"),
             "shape": (_file(tmp_path, "shape.json", json.dumps({"world_size": 2, "launch_us": "4"})),
                       "not a saved speed of light"),
             "world": (_file(tmp_path, "world.json", json.dumps({**good, "world_size": 4})), "at world size 4")}
    for name, (path, message) in cases.items():
        result = _command("run_leaderboard.py", "--versions", "v1", "--world-size", "2", "--sol", str(path),
                          "--out", str(tmp_path / "o"))
        assert result.returncode == EXIT_BAD_INPUT and message in result.stderr, (name, result.stderr[-800:])
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (tmp_path / "o").exists()
    from a2a import sol

    saved = sol.load(Path(_file(tmp_path, "good.json", json.dumps({**good, "device": "H\x1b[2J", "extra": [1]}))), 2)
    assert saved["launch_us"] == 4.0 and "extra" not in saved and "\x1b" not in saved["device"], saved


def test_a_detached_gpu_session_runs_from_its_own_copy_of_the_tree(tmp_path):
    """`start` copies the tree into DIR/tree and runs from there (2026-11-29: the device tool's re-sync of the
    repository at a polling call made a rank's import fail mid-run): a file the run reads after the repository's copy
    changed is still the one it started with."""
    folder = tmp_path / "session"
    started = subprocess.run(["bash", "tools/gpu_session.sh", str(folder), "start", "set:A2A_PROBE=1"], cwd=ROOT,
                             capture_output=True, text=True, timeout=120)
    waited = subprocess.run(["bash", "tools/gpu_session.sh", str(folder), "wait:60"], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert started.returncode == 0 and waited.returncode == 0, started.stderr + waited.stderr
    tree = folder / "tree"
    assert (tree / "tools" / "gpu_session.sh").read_bytes() == (ROOT / "tools" / "gpu_session.sh").read_bytes()
    assert (tree / "eval.py").is_file() and not (tree / ".git").exists() and not (tree / "results").exists()
    assert "== set A2A_PROBE=1" in (folder / "logs" / "session.log").read_text()

def _compilers() -> bool:
    import shutil

    return all(shutil.which(tool) for tool in ("nvcc", "hipcc", "clang++-19"))


def test_diff_takes_user_files_and_rejects_bad_cases(tmp_path):
    result = _command("diff.py", "v1", "v2", "--cases", "tests:", "--out", str(tmp_path))
    assert result.returncode == EXIT_BAD_INPUT and "give indices" in result.stderr


def test_a_correct_version_passes_with_a_large_secret_seed():
    """A secret seed whose mixed seeds still fit the generator (Cantor pairing of 10**9 with the test seeds)."""
    result = run_eval("test", "v1", "--world-size", "2", "--cases", "tests:0", "--seed", str(10**9), timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]


def test_exit_codes_are_distinct_for_bad_input_a_failed_check_and_a_crash(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("A2A_RANK_WRITABLE")  # a command's cover would be this test process's own

    def crashes(argv):
        raise KeyError("planted")

    assert run_cli(crashes, []) == EXIT_CRASH
    err = capsys.readouterr().err
    assert "internal error: KeyError: 'planted'" in err and len(err.strip().splitlines()) == 1
    assert len({EXIT_USAGE, EXIT_CHECK_FAILED, EXIT_BAD_INPUT, EXIT_CRASH}) == 4
    wrong = tmp_path / "wrong.py"
    wrong.write_text("import torch\n\ndef custom_kernel(data):\n    return torch.zeros_like(data[1].x)\n")
    assert run_eval("test", str(wrong), "--world-size", "2", "--cases", "tests:1").returncode == EXIT_CHECK_FAILED


# --------------------------------------------------------------------------------------------------------------
# The protocol face (a staged bundle, as the runner runs it)
# --------------------------------------------------------------------------------------------------------------


def test_protocol_face_rejects_bad_test_files(bundle):
    for name, content, message in [
        ("bad.txt", "num_experts: eight; world_size: 2\nthis is not a case\n", "invalid test case"),
        ("empty.txt", "", "holds no test cases"),
        ("negative.txt", LINE.format(h=64, s=1, w=-2) + "\n", "world_size must be at least 1, not -2"),
        ("color.txt", LINE.format(h=64, s=1, w=2) + "; color: red\n", "unknown field 'color'"),
        ("long.txt", LINE.format(h=64, s=1, w=2) + "; " + "y" * 1_000_000 + "\n", "a test line of 1000"),
        ("latin1.txt", LINE.format(h=64, s=1, w=2).encode() + b"\xff\n", "is not UTF-8"),
        ("seed.txt", LINE.format(h=64, s=10**29, w=2) + "\n", "outside what the generator takes"),
    ]:
        _file(bundle, name, content)
        code, output, stderr = run_bundle(bundle, "test", name)
        assert code == EXIT_BAD_INPUT and message in stderr, (name, code, stderr[-500:])
        assert output == "" and "Traceback" not in stderr and len(stderr) < 1000, (name, stderr[:500])
    (bundle / "zero.txt").symlink_to("/dev/zero")
    code, output, stderr = run_bundle(bundle, "test", "zero.txt")
    assert code == EXIT_BAD_INPUT and "not a regular file" in stderr and output == "", (code, stderr[-500:])
    code, _, stderr = run_bundle(bundle, "test", "does_not_exist.txt")
    assert code == EXIT_BAD_INPUT and "Could not open test file" in stderr and "No such file" in stderr
    (bundle / "folder.txt").mkdir()
    code, _, stderr = run_bundle(bundle, "test", "folder.txt")
    assert code == EXIT_BAD_INPUT and "Could not open test file" in stderr and "Traceback" not in stderr


def _protocol(bundle: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "POPCORN_GPUS": "2", "A2A_BACKEND": "gloo", **env}
    return subprocess.run([sys.executable, "eval.py", *args], cwd=bundle, env=full_env, capture_output=True,
                          text=True, timeout=120)


def test_a_result_file_the_ranks_could_write_is_bad_input(bundle):
    """Red team 51: POPCORN_FD on a file in an A2A_RANK_WRITABLE folder; the ranks appended `benchmark.0.mean: 1.0`
    after the evaluator's own line, and the runner's parser (the last value wins) read it. Refused with one line and
    113, in the folder or with another name (a hard link) that could be; a file of the judge's own goes on."""
    writable = Path(os.environ["A2A_RANK_WRITABLE"])
    outside = bundle.parent / "results.txt"
    outside.touch()
    (bundle.parent / "linked.txt").touch()
    os.link(bundle.parent / "linked.txt", writable / "linked.txt")
    for path, said in ((writable / "result.txt", "which the ranks could write"),
                       (bundle.parent / "linked.txt", "which the ranks could write"), (outside, "Could not open")):
        with open(path, "a") as results:
            done = subprocess.run([sys.executable, "eval.py", "benchmark", "absent.txt"], cwd=bundle, timeout=120,
                                  env={**os.environ, "POPCORN_GPUS": "2", "A2A_BACKEND": "gloo",
                                       "POPCORN_FD": str(results.fileno())},
                                  pass_fds=(results.fileno(),), capture_output=True, text=True)
        assert done.returncode == EXIT_BAD_INPUT and said in done.stderr, (path, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1 and path.read_text() == "", (path, done.stderr)


def test_protocol_face_rejects_a_bad_environment(bundle):
    _file(bundle, "one.txt", LINE.format(h=64, s=1, w=2) + "\n")
    for env, message in [({"POPCORN_FD": "97"}, "POPCORN_FD=97 is not an open file descriptor"),
                         ({"POPCORN_FD": "2"}, "POPCORN_FD=2 is stderr"),
                         ({"POPCORN_FD": "1", "POPCORN_SEED": str(10**29)}, "POPCORN_SEED must be an integer"),
                         ({"POPCORN_FD": "1", "POPCORN_SEED": "-4"}, "POPCORN_SEED must be an integer"),
                         # red team 69: past int()'s 4300 digits, a traceback and exit 1, the result file empty
                         ({"POPCORN_FD": "1", "POPCORN_SEED": "9" * 5000}, "POPCORN_SEED must be an integer"),
                         ({"POPCORN_FD": "1", "A2A_MASTER_PORT": "9" * 5000}, "A2A_MASTER_PORT must be a port"),
                         ({"POPCORN_FD": "1", "POPCORN_GPUS": "many"}, "POPCORN_GPUS must be an integer"),
                         ({"POPCORN_FD": "1", "POPCORN_GPUS": ""}, "POPCORN_GPUS must be an integer"),
                         ({"POPCORN_FD": "1", "POPCORN_SEED": "10000000000"}, "mixed into this test's seed"),
                         ({"POPCORN_FD": "1", "A2A_MASTER_PORT": "65536"}, "A2A_MASTER_PORT must be a port number"),
                         ({"POPCORN_FD": "1", "A2A_TRANSPORT": "gpu"}, "A2A_TRANSPORT must be 'host' or 'device'"),
                         ({"POPCORN_FD": "1", "A2A_OWNER_GPU": "first"}, "A2A_OWNER_GPU must be 'own', 'next' or a GPU index"),
                         ({"POPCORN_FD": "1", "A2A_POOL_MEMORY_GB": "lots"}, "A2A_POOL_MEMORY_GB='lots': must be a"),
                         ({"POPCORN_FD": "1", "A2A_POOL_MEMORY_GB": "0"}, "A2A_POOL_MEMORY_GB='0': must be a"),
                         # red team 51: a cap the kernel refused (none at all), a false 112, and 114
                         ({"POPCORN_FD": "1", "A2A_POOL_MEMORY_GB": "1e-300"}, "A2A_POOL_MEMORY_GB='1e-300': must be"),
                         ({"POPCORN_FD": "1", "A2A_POOL_MEMORY_GB": "0.0001"}, "A2A_POOL_MEMORY_GB='0.0001': must be"),
                         ({"POPCORN_FD": "1", "A2A_POOL_MEMORY_GB": "1e300"}, "A2A_POOL_MEMORY_GB='1e300': must be"),
                         ({"POPCORN_FD": "1", "A2A_RANK_BIRTH": "fork"}, "A2A_RANK_BIRTH='fork': must be one of"),
                         ({"POPCORN_FD": "1", "A2A_TIMEOUT": "nan"}, "A2A_TIMEOUT='nan': expected a number"),
                         ({"POPCORN_FD": "1", "A2A_SPIN_US": "1e400"}, "A2A_SPIN_US='1e400': expected a number")]:
        done = _protocol(bundle, env, "test", "one.txt")
        assert done.returncode == EXIT_BAD_INPUT and message in done.stderr, (env, done.returncode, done.stderr)
        assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert _protocol(bundle, {"POPCORN_FD": "1"}, "test").returncode == EXIT_USAGE
    read_end, write_end = os.pipe()
    full = os.open("/dev/full", os.O_WRONLY)  # red team 69: a descriptor no write reaches ended the run with 114
    for fd, message in [(read_end, "open for reading only"), (full, "could not be written"),
                        (write_end, "nobody reads")]:
        if fd == write_end:
            os.close(read_end)  # the write end of a pipe whose reader is gone
        done = subprocess.run([sys.executable, "eval.py", "test", "one.txt"], cwd=bundle, capture_output=True,
                              text=True, timeout=120, pass_fds=(fd,),
                              env={**os.environ, "POPCORN_FD": str(fd), "POPCORN_GPUS": "2", "A2A_BACKEND": "gloo"})
        assert done.returncode == EXIT_BAD_INPUT and message in done.stderr, (message, done.returncode, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    os.close(write_end)
    os.close(full)


def test_protocol_face_reports_its_own_crash(bundle):
    (bundle / "utils.py").write_text("def clear_l2_cache():\n    pass\n")  # a broken bundle: no set_seed
    _file(bundle, "one.txt", LINE.format(h=64, s=1, w=2) + "\n")
    done = _protocol(bundle, {"POPCORN_FD": "1"}, "test", "one.txt")
    assert done.returncode == EXIT_CRASH and "internal error: ImportError" in done.stderr, done.stderr[-1000:]


REPLACES_THE_CHECK = """
import reference
import torch

reference.check_implementation = lambda data, output: (True, "")


def custom_kernel(data):
    return torch.zeros_like(data[1].x)
"""


@pytest.mark.parametrize("mode", every_time(["test", "benchmark", "leaderboard"], "leaderboard"))
def test_a_submission_cannot_replace_the_check(bundle, mode):
    (bundle / "submission.py").write_text(REPLACES_THE_CHECK)
    _file(bundle, "two.txt", "\n".join(LINE.format(h=64, s=s, w=2) for s in (1, 2)) + "\n")
    code, output, stderr = run_bundle(bundle, mode, "two.txt")
    keys = parse_popcorn(output)
    assert code == EXIT_CHECK_FAILED and keys["check"] == "fail", output + stderr[-2000:]
    assert "mismatch" in output


@pytest.mark.parametrize("by_link", [False, True], ids=["named", "by-a-link"])
def test_a_preload_that_names_no_file_is_dropped_before_the_judge_starts_anything(tmp_path, by_link):
    """Red team 39: LD_PRELOAD=/proc/self/fd/1 had the human face's evaluator (its stdout a pipe) read its own stdout
    until the silence deadline, then end void (112). Every judge command drops from LD_PRELOAD what names no
    regular file before it starts a process, so the run passes at once. (The judge's own output goes to a file, as a
    log: a judge whose stdout were a pipe would block in its own start, before any of its code runs.) A link to it
    is followed a step at a time: resolved whole in the judge, it names the judge's log, a regular file."""
    preload = tmp_path / "stdout.so"
    preload.symlink_to("/proc/self/fd/1")
    env = {**os.environ, "LD_PRELOAD": str(preload) if by_link else "/proc/self/fd/1", "A2A_TIMEOUT": "20"}
    started = time.monotonic()
    with open(tmp_path / "out", "wb") as out:
        done = subprocess.run([sys.executable, "eval.py", "test", "v1", "--world-size", "2", "--backend", "gloo",
                               "--cases", "tests:0"], cwd=ROOT, stdout=out, stderr=subprocess.PIPE, timeout=300,
                              env=env)
    said = (tmp_path / "out").read_bytes().decode(errors="replace")
    assert done.returncode == 0, said[-2000:] + done.stderr.decode(errors="replace")[-2000:]
    assert time.monotonic() - started < 60


def test_a_version_name_two_files_answer_to_is_named_so(monkeypatch, tmp_path):
    """Red team 53: v1's name with a Hangul filler (U+3164, drawn blank) beside v1's file made `v1` an "unknown
    version"; it is ambiguous, and both files are named, escaped."""
    from a2a import plan

    look_alike = tmp_path / "v1_torch_sort\u3164.py"
    monkeypatch.setattr(plan, "list_versions", lambda: [V1, look_alike])
    said = r"version 'v1' names 2 files: v1_torch_sort\.py, v1_torch_sort\\u3164\.py"
    with pytest.raises(plan.UserError, match=said):
        plan.resolve_version("v1")


@pytest.mark.parametrize("binding", ["custom_kernel: object = _impl", "custom_kernel, _unused = _impl, None",
                                     "if True:\n    custom_kernel = _impl",
                                     "try:\n    from fast import custom_kernel\nexcept ImportError:\n"
                                     "    custom_kernel = _impl"])
def test_a_custom_kernel_bound_any_way_the_module_runs_is_found(tmp_path, binding):
    """Red team 54: an annotated assignment, a tuple's unpacking, an `if`, an import's fallback in a `try`: each ran
    on the runner's face and was refused (113) as defining no custom_kernel. Bound inside a function, it is not."""
    from a2a import plan

    for text, found in ((f"def _impl(data):\n    return data\n\n{binding}\n", True),
                        ("def _impl(data):\n    custom_kernel = data\n    return [custom_kernel for custom_kernel in data]\n",
                         False)):
        (tmp_path / "mine.py").write_text(text)
        assert (plan.submission_problem(tmp_path / "mine.py") is None) == found, text
