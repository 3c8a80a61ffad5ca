"""a2a/contract.py: the trace-phase enum and the give-up packer that versions paste are what the toolkit reads back;
versions from v5 on carry the generated text verbatim; frozen versions name as many phases in C++ as in Python."""
import ast
import re
import shutil
import subprocess

import pytest

from a2a import contract
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
