"""diff.py: the code delta is exact, a version against itself shows no difference, a planted delay shows."""
import json
import re
import subprocess
import sys

import pytest

from a2a import diffing
from tests.conftest import ROOT, V1

CASES = "\n".join(f"num_experts: 8; experts_per_token: 2; hidden_dim: {h}; max_num_tokens: {t}; seed: {s}; "
                  f"world_size: 2" for h, t, s in ((256, 12, 1), (1024, 24, 2))) + "\n"

OLD = '''KERNELS = r"""
__global__ void scale(float* x) {
  x[threadIdx.x] *= 2.0f;
}
int launch_scale(float* x) { return 0; }
"""
BINDING = "void bind() {}"


def custom_kernel(data):
    return data
'''

NEW = '''KERNELS = r"""
__global__ void scale_rows(float* x) {
  x[threadIdx.x] *= 2.0f;
}
int launch_scale(float* x) { return 1; }
"""
BINDING = "void bind() {}"


def custom_kernel(data):
    return data[1]
'''


def test_code_diff_of_two_small_files_is_exact(tmp_path):
    old, new = tmp_path / "old.py", tmp_path / "new.py"
    old.write_text(OLD)
    new.write_text(NEW)
    kernels, binding, python = diffing.code_diff(old, new)
    assert (kernels.added, kernels.removed) == (2, 2)
    assert kernels.unified == (
        "--- old:KERNELS\n+++ new:KERNELS\n@@ -1,5 +1,5 @@\n \n-__global__ void scale(float* x) {\n"
        "+__global__ void scale_rows(float* x) {\n   x[threadIdx.x] *= 2.0f;\n }\n"
        "-int launch_scale(float* x) { return 0; }\n+int launch_scale(float* x) { return 1; }\n")
    assert kernels.renamed == [("scale", "scale_rows", 1.0)]
    assert (binding.added, binding.removed, binding.unified) == (0, 0, "")
    assert (python.added, python.removed) == (1, 1)
    assert "-    return data\n+    return data[1]\n" in python.unified
    assert diffing.split_source(OLD)["python"].splitlines()[:2] == ['KERNELS = "<device source, diffed on its own>"',
                                                                    'BINDING = "<device source, diffed on its own>"']
    assert diffing.code_summary([kernels, binding, python]).splitlines() == [
        "KERNELS: +2 -2 lines; renamed scale -> scale_rows (100% alike)", "BINDING: +0 -0 lines",
        "python: +1 -1 lines"]


def _code_diff_against_old(tmp_path, text, encoding="utf-8") -> list:
    old, new = tmp_path / "old.py", tmp_path / "new.py"
    old.write_text(OLD)
    new.write_bytes(text.encode(encoding))
    return diffing.code_diff(old, new)


def _added(section) -> str:
    return "".join(line[1:] for line in section.unified.splitlines(keepends=True)
                   if line.startswith("+") and not line.startswith("+++"))


def test_every_line_that_runs_is_in_the_python_diff(tmp_path):
    """Red team 29: a statement after a device string on its closing line, and lines after a comment holding U+2028
    (str.splitlines breaks there, Python's tokenizer does not), were cut from the python part; both now show."""
    text = OLD.replace('BINDING = "void bind() {}"', 'BINDING = "void bind() {}"; import os as ran_1') + \
        "# a line separator \u2028 inside a comment\nimport sys as ran_2\n"
    *_, python = _code_diff_against_old(tmp_path, text)
    assert "; import os as ran_1" in _added(python) and "import sys as ran_2\n" in _added(python), python.unified


def test_the_code_diff_reads_any_file_python_reads_in_time_linear_in_its_size(tmp_path):
    """Red team 29: a latin-1 file with its coding line (114: UnicodeDecodeError), a sum of 600 terms (114:
    ast.unparse's recursion) and a device string of 1.25 MB of "a b(" lines (a regex that backtracked for hours)."""
    import signal

    kernels, _, python = _code_diff_against_old(tmp_path, "# -*- coding: latin-1 -*-\n# caf\u00e9\n" + OLD, "latin-1")
    assert "# caf\u00e9\n" in _added(python)
    _, _, python = _code_diff_against_old(tmp_path, OLD + "\n\ndef six_hundred():\n    return " + "+".join("1" * 600))
    assert "def six_hundred():" in _added(python)
    def too_long(*_):
        raise TimeoutError("the code diff ran past 30 s")  # re checks signals as it matches

    before = signal.signal(signal.SIGALRM, too_long)
    try:
        for line in ("a b(\n", "a " * 30 + "\n", "template <" * 3 + "\n"):
            signal.alarm(30)
            kernels, *_ = _code_diff_against_old(tmp_path, OLD.replace('KERNELS = r"""', 'KERNELS = r"""' + line * 40000))
            signal.alarm(0)
            assert kernels.added >= 40000
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, before)
    (tmp_path / "bad.py").write_bytes(b"x = '\xe9'\n")
    with pytest.raises(diffing.UserError, match="bad.py: not a Python file Python can read"):
        diffing.code_diff(tmp_path / "old.py", tmp_path / "bad.py")


def test_functions_are_found_in_one_pass_however_many_or_nested():
    """40 000 kernels nested in each other's braces, and 40 000 Python functions: each body was a scan and a copy to
    its end, so both grew with the square of the count. Bodies too long to compare are kept as None."""
    import signal

    def too_long(*_):
        raise TimeoutError("finding functions ran past 30 s")
    before = signal.signal(signal.SIGALRM, too_long)
    signal.alarm(30)
    try:
        nested = diffing.functions("".join(f"void f{i}() {{\n" for i in range(40000)) + "}" * 40000, device=True)
        flat = diffing.functions("".join(f"def f{i}():\n    return {i}\n" for i in range(40000)), device=False)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, before)
    assert len(nested) == 40000 and nested["f0"] is None and nested["f39999"] == "\n"
    assert len(flat) == 40000 and flat["f7"] == "    return 7"
    assert diffing.renames({"a": None, "b": "x"}, {"c": "x", "d": None}) == [("b", "c", 1.0)]


def test_a_device_name_bound_twice_keeps_every_binding_in_the_python_text(tmp_path):
    """Red team 30: a first KERNELS ran as Python (exec) and a second, a decoy, was the only one diffed. A name bound
    more than once anywhere keeps all its bindings in the python part; a name bound once still gets its placeholder."""
    text = ('KERNELS = "print(\'payload ran\')"\nexec(KERNELS)\nKERNELS = "__global__ void k() {}"\n'
            'BINDING = "void bind() {}"\n')
    parts = diffing.split_source(text)
    assert "payload ran" in parts["python"] and "__global__ void k()" in parts["python"] and parts["KERNELS"] == ""
    assert parts["BINDING"] == "void bind() {}" and "BINDING = \"<device source" in parts["python"]


def test_the_diffs_text_carries_no_character_a_terminal_acts_on(tmp_path):
    """Red team 30: an erase-line sequence in a comment hid its line from `cat code.diff`; control, separator and
    bidi characters are written escaped."""
    *_, python = _code_diff_against_old(tmp_path, OLD + "ran = 1  # \x1b[2K\x1b[G \u202e \u2028\n")
    assert "ran = 1  # \\x1b[2K\\x1b[G \\u202e \\u2028" in python.unified, python.unified
    assert not re.search("[\x1b\u202e\u2028]", python.unified)


def test_a_code_diff_past_its_time_is_left_out(tmp_path, monkeypatch):
    def slow(*_):
        import time

        time.sleep(5)
    monkeypatch.setattr(diffing, "code_diff", slow)
    assert diffing.code_diff_within(tmp_path / "a.py", tmp_path / "b.py", seconds=0.2) is None


def test_a_kernels_name_is_not_its_launch_bounds():
    source = ("__global__ void __launch_bounds__(256, 1) all2all_kernel(Params p) {\n}\n"
              "__device__ void route(const Params& p, int (*first)[8]) {\n  x();\n}\n")
    assert list(diffing.functions(source, device=True)) == ["all2all_kernel", "route"]


def _diff(tmp_path, a: str, b: str):
    (tmp_path / "cases.txt").write_text(CASES)
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "diff.py", a, b, "--cases", str(tmp_path / "cases.txt"), "--world-size",
                           "2", "--rounds", "4", "--steps", "4", "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (folder,) = out.iterdir()
    return json.loads((folder / "timing.json").read_text()), folder


def test_a_version_against_itself_shows_no_difference(tmp_path, monkeypatch):
    """The verdicts hold a family-wise error rate of 5% per run (a2a/diffing.py), so one run in 20 may show a
    difference by chance (seen once in about 45 runs on this CPU, 2026-11-24); a second run decides, and two false
    verdicts in a row come once in 400 runs."""
    monkeypatch.delenv("A2A_RANK_WRITABLE")  # the two sides of a diff share no writable folder
    for attempt in range(2):
        (tmp_path / str(attempt)).mkdir()
        timing, folder = _diff(tmp_path / str(attempt), "v1", "v1")
        verdicts = [row["verdict"] for row in timing["rows"] if row["timing"].startswith("the owner's")]
        if set(verdicts) == {"no difference within noise"}:
            break
    assert len(verdicts) == 2 and set(verdicts) == {"no difference within noise"}, timing["rows"]
    assert (folder / "ratios.png").is_file() and (folder / "code.diff").read_text() == ""


PLANTED_DELAY_S = 0.2


def test_a_planted_delay_shows_as_slower_on_every_shape(tmp_path, monkeypatch):
    """With 4 rounds and a Bonferroni interval, one round in which A stalled decides: a 30 ms delay hid behind one
    stall of a loaded CI machine (A's mean call 6.3 ms against ~3 ms, "no difference", 2026-11-27). The delay must
    dwarf such stalls, so that a stalled round still reads B several times slower; a sleep costs no CPU."""
    monkeypatch.delenv("A2A_RANK_WRITABLE")  # the two sides of a diff share no writable folder
    delayed = tmp_path / "v1_delayed.py"
    delayed.write_text(V1.read_text().replace("    cfg, rank_data, rank, world_size = data\n",
                                              f"    cfg, rank_data, rank, world_size = data\n    time.sleep({PLANTED_DELAY_S})\n", 1)
                       .replace("import torch\n", "import time\n\nimport torch\n", 1))
    timing, folder = _diff(tmp_path, "v1", str(delayed))
    verdicts = {row["timing"]: row["verdict"] for row in timing["rows"]}
    owners = [row["verdict"] for row in timing["rows"] if row["timing"].startswith("the owner's")]
    assert len(owners) == 2 and all(v.startswith("B slower by") for v in owners), timing["rows"]
    # red team 52: a rank's own figure is never judged (its forged 1 µs read "B faster by 100.0%")
    assert verdicts["call time (the rank's)"] == diffing.RANKS_WORD, timing["rows"]
    assert "python: +3 -0 lines" in (folder / "diff.md").read_text()


def test_a_ratio_of_a_ranks_extreme_figures_breaks_no_verdict():
    """Red team 32: a rank's call figure of 1 ns in one round beside a second-long one in another, over two rounds:
    the family-wise interval's exp overflowed and diff.py ended with 114, the owner's verdicts lost. Each bound now
    stops at 1e300 (and its inverse); a round with no figure or a zero is left out."""
    ratio, low, high = diffing.ratio_interval([1e-3, 1e6, float("nan"), 0.0], [1e6, 1e-3, 5.0, 5.0], 0.9999)
    assert ratio == pytest.approx(1.0) and low == pytest.approx(1e-300) and high == pytest.approx(1e300)
    assert diffing.verdict(ratio, (low, high), (low, high)) == "no difference within noise"
