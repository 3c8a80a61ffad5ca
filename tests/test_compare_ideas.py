"""tools/compare_ideas.py without a GPU: which variants it times (an idea alone brings what it requires), its report
on synthetic measurements (geomeans, the delta against the baseline, wrong outputs named), and its command line on
a CPU machine (a skip line) and on a file that is not a scratch copy (one clear error)."""
import ast
import types

import pandas as pd
import pytest
import torch

from tests.conftest import ROOT
from tools.compare_ideas import main, report, variants_of

SCRATCH = ROOT / "submissions" / "all2all" / "ideas" / "v6_ideas.py"
META = {"scratch": "v6_ideas", "baseline": "v5_varlen", "device": "test", "world_size": 2,
        "placement": "2 ranks on 2 GPUs, one each", "date": "2026-11-22", "commit": "abc", "iterations": 5, "block": 1}


def scratch_constants() -> types.SimpleNamespace:
    """IDEAS and REQUIRES of the real scratch copy, read without importing it (importing builds it)."""
    found = {}
    for node in ast.parse(SCRATCH.read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") in ("IDEAS", "REQUIRES"):
            found[node.targets[0].id] = ast.literal_eval(node.value)
    return types.SimpleNamespace(**found)


def test_each_idea_alone_brings_what_it_requires_and_sets_follow():
    module = scratch_constants()
    variants = dict(variants_of(module, [("dedup", "index", "plain_launch")]))
    assert variants["baseline"] is None and variants["none"] == ()
    assert variants["index"] == ("dedup", "index")
    assert variants["pull"] == ("pull",)
    assert variants["dedup+index+plain_launch"] == ("dedup", "index", "plain_launch")
    assert len(variants) == 2 + len(module.IDEAS) + 1


def test_report_gives_geomeans_deltas_and_names_wrong_outputs():
    rows = []
    for shape, scale in (("E=8 k=2 H=6144 T=16", 1.0), ("E=256 k=8 H=7168 T=256", 4.0)):
        for variant, mean, correct in (("baseline", 100.0, True), ("none", 100.0, True), ("dedup", 80.0, False),
                                       ("host probe: pybind call only", 20.0, None)):
            rows.append({"shape": shape, "variant": variant, "device_mean_us": mean * scale,
                         "device_p50_us": mean * scale - 1, "device_p90_us": mean * scale + 1, "host_p50_us": 30.0,
                         "correct": correct, "error": "" if correct is not False else "Output values mismatch"})
    text = report(pd.DataFrame(rows), META)
    summary = {}  # the first table: one row per variant over all shapes
    for line in text.splitlines():
        if line.startswith("| "):
            summary.setdefault(line.split("|")[1].strip(), line)
    assert "200.0" in summary["baseline"] and "+0.0%" in summary["baseline"]
    assert "160.0" in summary["dedup"] and "-20.0%" in summary["dedup"] and "NO" in summary["dedup"]
    assert "- dedup, E=8 k=2 H=6144 T=16: Output values mismatch" in text
    assert "variants taking turns every 1 call(s)" in text


@pytest.mark.skipif(torch.cuda.is_available(), reason="with GPUs the tool runs for real (minutes of device time)")
def test_on_a_cpu_machine_it_says_it_skipped(capsys):
    assert main([str(SCRATCH)]) == 0
    assert "skipped: comparing ideas needs GPUs" in capsys.readouterr().out


def test_a_file_without_idea_switches_is_refused():
    from eval import UserError

    with pytest.raises(UserError, match="no configure_ideas"):
        main([str(ROOT / "submissions" / "all2all" / "v5_varlen.py")])
