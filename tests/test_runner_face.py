"""tools/runner_face.py: both evaluators on one bundle. On a CPU the runner's own evaluator cannot run (NCCL, a GPU
per rank), so its place is taken by a folder of this repository's own bundle files, which speak the runner's
protocol: what is tested here is the tool's staging, environment and table. tests/test_gpu.py runs the runner's
files themselves."""
import shutil

import pytest

from a2a import plan as planning
from tests.conftest import ROOT
from tools import runner_face


@pytest.fixture
def stand_in_runner(tmp_path):
    folder = tmp_path / "runner"
    planning.stage(planning.resolve_version("v1"), tmp_path / "staged", test_files=False)
    folder.mkdir()
    for path in (tmp_path / "staged").glob("*.py"):  # our eval.py needs the modules it imports beside it
        if path.name != "submission.py":
            shutil.copyfile(path, folder / path.name)
    (folder / "COMMIT").write_text("stand-in\n")
    return folder


def test_both_faces_run_the_same_submission_and_cases(stand_in_runner, tmp_path, monkeypatch):
    monkeypatch.setenv("A2A_BACKEND", "gloo")  # the tool removes every A2A_ variable: the faces' own default holds
    plan = planning.make_plan(["v1"], "tests:0,1", 2, "gloo")
    rows = runner_face.run_faces(plan.versions[0], "test", plan, stand_in_runner, seed=5, tmp=tmp_path)
    assert [row["shape"] for row in rows] == ["E=8 k=2 H=6144 T=4", "E=64 k=6 H=2048 T=4"]
    assert all(row["runner status"] == row["ours status"] == "pass" and row["runner exit"] == 0 for row in rows), rows
    runner_bundle = tmp_path / "v1_torch_sort_test_runner"
    assert (runner_bundle / "submission.py").read_text() == (ROOT / "submissions/all2all/v1_torch_sort.py").read_text()


def test_a_runner_folder_without_its_files_is_bad_input(tmp_path):
    from eval import UserError

    with pytest.raises(UserError, match="eval.py, utils.py, reference.py, task.py, COMMIT missing"):
        runner_face.checked_runner(tmp_path)
