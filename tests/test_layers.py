"""The harness's shape: imports only go down the layers (so there is no cycle and the protocol core knows nothing
of its human face), private names of the core stay private, and no harness file sets the current device."""
import ast
import re
import subprocess

import pytest

from tests.conftest import ROOT

# Lower number = lower layer. A module may import only modules of a lower layer. A module's `__main__` block is a
# command entry and may hand over to the human face (eval.py's one line, `python -m a2a.sol`).
LAYERS = {
    "env_secrets": -3, "rank_filter": -3, "pool_memory": -3, "gpu_share": -2, "boundary": -2, "channels": -1.5, "births": -1, "judge": -1, "wire": -1, "rank_writable": -1,
    "eval": 0,
    "a2a.sharing": 1, "a2a.rows": 1, "a2a.contract": 1, "a2a.probes": 1, "a2a.intervals": 1, "a2a.bench": 1,
    "a2a.launch": 2, "a2a.plan": 2, "a2a.anchors": 2, "a2a.plots": 2,
    "a2a.cli": 3, "a2a.timeline": 3, "a2a.clock": 3,
    "a2a.sol": 4, "a2a.harness": 4, "a2a.diffing": 4,
    "run_leaderboard": 5, "diff": 5, "tools.check_device": 5, "tools.sweep_launch": 5, "tools.step_anatomy": 5,
    "tools.compare_ideas": 5, "tools.triton_launch": 5, "tools.sm_share": 5, "tools.launch_floor": 5,
    "tools.runner_face": 5, "tools.interpret_ranks": 5, "tools.cpu_speed": 5, "tools.visit_statistics": 5,
}


def module_file(name: str):
    return ROOT / (name.replace(".", "/") + ".py")


def _outside_main(tree: ast.Module):
    """Every node except those under `if __name__ == "__main__":`."""
    for node in tree.body:
        if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
            continue
        yield from ast.walk(node)


def imports_of(name: str) -> set:
    tree = ast.parse(module_file(name).read_text())
    found = set()
    for node in _outside_main(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return {module for module in found if module in LAYERS}


def test_every_harness_module_has_a_layer():
    on_disk = {"env_secrets", "rank_filter", "pool_memory", "rank_writable", "gpu_share", "boundary", "channels", "births", "judge", "wire", "eval", "run_leaderboard", "diff"}
    on_disk |= {f"a2a.{p.stem}" for p in (ROOT / "a2a").glob("*.py") if p.stem != "__init__"}
    on_disk |= {f"tools.{p.stem}" for p in (ROOT / "tools").glob("*.py") if p.stem != "__init__"}
    assert on_disk == set(LAYERS)


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_imports_only_go_down(name):
    upward = {module for module in imports_of(name) if LAYERS[module] >= LAYERS[name]}
    assert not upward, f"{name} (layer {LAYERS[name]}) imports {upward}"


def test_only_the_core_uses_its_private_names():
    private = re.compile(r"\bcore\._[a-z]")
    users = [path.name for path in ROOT.glob("**/*.py") if ".venv" not in path.parts and "results" not in path.parts
             and private.search(path.read_text())]
    assert not users, users


def test_no_harness_file_sets_the_current_device():
    files = [ROOT / "eval.py", ROOT / "boundary.py", ROOT / "births.py", ROOT / "judge.py", ROOT / "channels.py",
             ROOT / "wire.py", ROOT / "gpu_share.py", ROOT / "env_secrets.py", ROOT / "rank_writable.py", ROOT / "rank_filter.py",
             ROOT / "pool_memory.py",
             *ROOT.glob("a2a/*.py"),
             *ROOT.glob("tools/*.py"), ROOT / "run_leaderboard.py", ROOT / "diff.py", *ROOT.glob("tests/*.py")]
    setters = [path.name for path in files if path != ROOT / "tests" / "test_layers.py"
               and re.search(r"set_device\(|set_device_index\(", path.read_text())]
    assert not setters, setters


def test_eval_all_is_exactly_what_the_library_uses():
    """eval.__all__ names every core name the human face and the tools use, and nothing they do not."""
    import eval as core

    used = set()
    for path in [*(ROOT / "a2a").glob("*.py"), *(ROOT / "tools").glob("*.py"),
                 ROOT / "run_leaderboard.py", ROOT / "diff.py"]:
        for node in ast.walk(ast.parse(path.read_text())):  # the code's names, not a string's (git's core.*)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "core":
                used.add(node.attr)
            elif isinstance(node, ast.ImportFrom) and node.module == "eval":
                used |= {alias.name for alias in node.names}
    assert used == set(core.__all__), (sorted(used - set(core.__all__)), sorted(set(core.__all__) - used))
    assert all(hasattr(core, name) for name in core.__all__)


def test_the_makefile_and_the_gpu_session_run_the_one_list_of_commands():
    """Every Python command either file runs goes through `python -m a2a.cli NAME` with a NAME of a2a.cli.COMMANDS,
    and every command there exists."""
    from a2a import cli

    for name, (target, _) in cli.COMMANDS.items():
        parts = target.split()
        assert (ROOT / parts[0]).is_file() if parts[0] != "-m" else module_file(parts[1]).is_file(), name
    for path, python in ((ROOT / "Makefile", "$(JUDGE)"), (ROOT / "tools" / "gpu_session.sh", "$py")):
        runs = [line.split(python, 1)[1].split() for line in path.read_text().splitlines() if python + " " in line]
        runs = [run for run in runs if run[:2] != ["-m", "pytest"] and run[:1] != ["-"]]  # tests, inline builds
        assert runs, path
        for run in runs:
            assert run[:2] == ["-m", "a2a.cli"] and run[2] in cli.COMMANDS, (path.name, run)


def test_the_shared_options_are_declared_once():
    """--world-size, --cases, --seed, --backend, --timeout, --out and --versions come from a2a.cli.add_options in
    every command and tool, never from a parser of its own."""
    from a2a import cli

    declared = re.compile(r'add_argument\(\s*"--(' + "|".join(map(re.escape, cli.SHARED_OPTIONS)) + r')"')
    files = [ROOT / "eval.py", ROOT / "run_leaderboard.py", ROOT / "diff.py", *ROOT.glob("a2a/*.py"),
             *ROOT.glob("tools/*.py")]
    own = [f"{path.name}: --{m}" for path in files for m in declared.findall(path.read_text())]
    assert not own, own
    users = [path.name for path in files if "cli.add_options(parser" in path.read_text()]
    assert len(users) >= 9, users


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_no_harness_module_is_over_2000_lines(name):
    """Issue #49's structure: a reviewer reads each of the judge's modules in one sitting; eval.py was 2,725 lines."""
    path = module_file(name)
    lines = len(path.read_text().splitlines())
    assert lines <= 2000, f"{path.name}: {lines} lines"



def test_the_tree_fits_a_device_call_with_room():
    """The device tool carries at most 64 MiB of tree per call (tracked files and untracked ones not ignored);
    2026-11-29 the tracked files reached 63.4 MB with every trace.json kept plain and a call was refused. Kept
    under 48 MiB so that a session's results and traces still fit before they are committed."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.split(b"\0")
    sizes = [(ROOT / name.decode()).stat().st_size for name in listed if name and (ROOT / name.decode()).is_file()]
    assert sum(sizes) < 48 * 2**20, f"{sum(sizes) / 2**20:.1f} MiB"
