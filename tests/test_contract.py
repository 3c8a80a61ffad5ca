"""a2a/contract.py: the version protocol (every name the toolkit reads from a version, held against the toolkit's
source and every version), and the trace-phase enum and give-up packer that versions paste."""
import ast
import re
import shutil
import subprocess

import pytest

from a2a import contract
from a2a.plan import list_versions
from tests.conftest import ROOT

PHASES = ("all2all", "all2all.send_row", "all2all.wait_counts", "all2all.reduce")
SAMPLES = [(1, 3, 0, 1), (2, 7, 1234, 99), (3, 255, (1 << 24) - 1, (1 << 28) - 1), (1, 0, 17, 5)]


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_pasted_source_round_trips_through_a_compiler(tmp_path):
    program = ["#include <stdint.h>", "#include <stdio.h>", contract.device_source(PHASES), "int main() {"]
    program += [f'  printf("%d\\n", (int){contract.enum_name(p)});' for p in PHASES]
    program += [f'  printf("%llu\\n", (unsigned long long)pack_give_up({k}, {p}, {s}, {e}));' for k, p, s, e in SAMPLES]
    program += ["  return 0;", "}"]
    (tmp_path / "contract.cpp").write_text("\n".join(program) + "\n")
    subprocess.run(["g++", "-std=c++17", "contract.cpp", "-o", "contract"], cwd=tmp_path, check=True)
    lines = subprocess.run([str(tmp_path / "contract")], capture_output=True, text=True, check=True).stdout.split()
    assert [int(v) for v in lines[:len(PHASES)]] == list(range(len(PHASES)))
    for (kind, peer, slot_plus_one, epoch), word in zip(SAMPLES, lines[len(PHASES):]):
        assert contract.unpack_give_up(int(word)) == {"kind": kind, "peer": peer, "slot": slot_plus_one - 1,
                                                      "epoch": epoch}


def test_a_give_up_word_reads_as_the_versions_print_it():
    word = (2 << 60) | (3 << 52) | (8 << 28) | 41
    assert contract.describe_give_up(word, 0, 2000, "v9") == \
        "[a2a v9] rank 0: gave up after 2000 ms waiting for a dispatched row from rank 3, slot 7 (call 41)"


def _version_strings(path):
    found = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            if node.targets[0].id in ("KERNELS", "TRACE_PHASES", "GIVE_UP_FIELDS"):
                found[node.targets[0].id] = ast.literal_eval(node.value)
    return found


@pytest.mark.parametrize("path", sorted((ROOT / "submissions" / "all2all").glob("v*.py")), ids=lambda p: p.stem)
def test_every_version_names_its_phases_once(path):
    strings = _version_strings(path)
    if "TRACE_PHASES" not in strings:
        assert "TracePhase" not in strings.get("KERNELS", ""), "device phases without a Python table"
        return
    number = int(re.match(r"v(\d+)", path.stem)[1])
    if "KERNELS" not in strings:  # Triton (v7 on): each phase's id is its position in the tuple, looked up by name
        text = path.read_text()
        assert all(f'TRACE_PHASES.index("{phase}")' in text for phase in strings["TRACE_PHASES"])
        assert strings["GIVE_UP_FIELDS"] == contract.GIVE_UP_FIELDS
    elif number >= 5:
        assert contract.device_source(strings["TRACE_PHASES"]) in strings["KERNELS"]
    else:  # frozen with a hand-written enum: at least as many names, in one enum
        enum = re.search(r"enum TracePhase \{([^}]*)\}", strings["KERNELS"])[1]
        assert len([n for n in enum.split(",") if n.strip()]) == len(strings["TRACE_PHASES"])


# --------------------------------------------------------------------------------------------------------------
# The version protocol (a2a.contract.VERSION_PROTOCOL): what the toolkit reads is what the table says
# --------------------------------------------------------------------------------------------------------------

TOOLKIT = ["eval.py", "diff.py", "run_leaderboard.py", "a2a/*.py", "tools/*.py", "tools/*.sh",
           "tests/*.py"]
# How the toolkit names a loaded version: `module.X`, `traced.X`, getattr/hasattr(module, "X").
READ = re.compile(r"(?<![\w.])(?:module|traced)\.([A-Za-z_]\w*)|\b(?:get|has)attr\((?:module|traced), \"(\w+)\"")


def _names_the_toolkit_reads() -> set:
    """Attributes of a loaded version, and names read from a version's source as text ("KERNELS" in an AST walk).
    This file counts only above this section, whose own strings name every entry; a2a/contract.py only by attribute."""
    table = {name for name, *_ in contract.VERSION_PROTOCOL}
    found = set()
    for pattern in TOOLKIT:
        for path in ROOT.glob(pattern):
            text = path.read_text()
            if path.name == "test_contract.py":
                text = text[:text.index("# The version protocol (a2a.contract")]
            found |= {a or b for a, b in READ.findall(text)}
            if path.name != "contract.py":  # whose table names every entry
                found |= {name for name in table if f'"{name}"' in text}
            if 'name="a2a_' in text and path.suffix == ".sh":
                found.add('name="a2a_..."')
    return found - {"__name__", "__file__"}


def test_the_protocol_table_lists_every_name_the_toolkit_reads_and_no_other():
    table = {name for name, *_ in contract.VERSION_PROTOCOL}
    read = _names_the_toolkit_reads()
    assert read - table == set(), f"read from versions but not in a2a.contract.VERSION_PROTOCOL: {read - table}"
    assert table - read == set(), f"in the protocol table but read by nothing: {table - read}"


def test_the_versions_page_shows_the_protocol_table():
    readme = (ROOT / "docs" / "versions.md").read_text()
    for name, have, readers, _ in contract.VERSION_PROTOCOL:
        assert f"| `{name}` | {have} | {readers} |" in readme, name


def _top_level_names(path) -> set:
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


@pytest.mark.parametrize("path", list_versions(), ids=lambda p: p.stem)
def test_every_version_follows_the_protocol(path):
    """Read without importing (importing builds): the entry point, then each line's names."""
    names, number = _top_level_names(path), int(path.stem.split("_")[0][1:])
    assert "custom_kernel" in names
    for marker, required in contract.REQUIRED_BY_LINE.items():
        if marker in names:
            assert set(required) <= names, f"{path.stem} has {marker} but not {set(required) - names}"
    if "KERNELS" in names:
        assert re.search(r'name="a2a_\w+"', path.read_text()), "no load_inline name the cold start can find"
    if number >= contract.FIRST_WITH_INSPECT:
        assert "inspect" in names or "inspect" in path.read_text(), "v8 on: inspect() replaces the reach-ins"


@pytest.mark.parametrize("path", [p for p in list_versions() if "TRITON_KERNELS" in p.read_text()],
                         ids=lambda p: p.stem)
def test_triton_constexprs_come_in_the_kernels_parameter_order(path):
    """A Triton version may pass its constexprs to the compiled launcher by position (v7: `tuple(constants.values())`
    after the runtime arguments), so constants() must list them in the kernel's own parameter order."""
    pytest.importorskip("triton")
    from a2a.plan import load_task, load_version

    module = load_version(path, f"protocol_{path.stem}")
    for shape in load_task()["benchmarks"]:
        shape = {k: v for k, v in shape.items() if k in ("num_experts", "experts_per_token", "hidden_dim",
                                                         "max_num_tokens")}
        for kernel_name in module.TRITON_KERNELS:
            kernel = getattr(module, kernel_name)
            constants = module.constants(**shape, world_size=8, trace=False, hip=False)
            in_kernel = [name for name in kernel.arg_names if name in constants]
            assert list(constants) == in_kernel, (kernel_name, list(constants), in_kernel)
            runtime = [name for name in kernel.arg_names if name not in constants]
            assert kernel.arg_names == runtime + in_kernel, "constexprs must come after every runtime argument"


def test_the_versions_come_oldest_first_and_the_last_is_the_makefiles_newest():
    """The GPU suite runs every mode of the newest (list_versions()[-1]); a name order put v9 after v11 there."""
    numbers = [int(path.stem.split("_")[0][1:]) for path in list_versions()]
    assert numbers == sorted(numbers) and len(numbers) >= 10, numbers
    newest = subprocess.run(["make", "-s", "--no-print-directory", "-f", "Makefile", "-f", "-", "print-newest"],
                            input="print-newest:\n\t@echo $(V)\n", cwd=ROOT, capture_output=True, text=True)
    assert newest.stdout.strip() == list_versions()[-1].stem, newest.stdout + newest.stderr
