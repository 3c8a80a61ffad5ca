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


def test_each_version_s_rows_are_saved_as_it_finishes(stand_in_runner, tmp_path, monkeypatch, capsys):
    """A run cut short (the device call's limit) keeps every version that finished before the cut."""
    import pandas as pd

    monkeypatch.delenv("A2A_RANK_WRITABLE")  # two versions share no writable folder
    real_plan = planning.make_plan
    monkeypatch.setattr(runner_face.planning, "machine_gpus", lambda: 2)
    monkeypatch.setattr(runner_face.planning, "make_plan", lambda versions, selector, world_size, backend:
                        real_plan(versions, "tests:0", world_size, "gloo", gpu_only="keep"))
    finished = []

    def faces(version, mode, plan, runner, seed, tmp):
        if finished:
            raise KeyboardInterrupt  # the cut, while the second version runs
        finished.append(version.stem)
        return [{"version": version.stem, "mode": mode, "shape": "s", **{f"{face} {field}": value for face in
                 ("runner", "ours") for field, value in (("exit", 0), ("status", "pass"), ("mean µs", 7.0),
                                                         ("error", ""))}}]

    monkeypatch.setattr(runner_face, "run_faces", faces)
    with pytest.raises(KeyboardInterrupt):
        runner_face.main(["--runner", str(stand_in_runner), "--versions", "v1,v2", "--world-size", "2",
                          "--modes", "leaderboard", "--out", str(tmp_path / "out")])
    (folder,) = (tmp_path / "out").iterdir()
    saved = pd.read_csv(folder / "results.csv")
    assert list(saved.version) == ["v1_torch_sort"] and list(saved["ours mean µs"]) == [7.0]
    assert ("v1_torch_sort leaderboard: runner 1 of 1 pass (exit 0), geomean 7.0 µs; ours 1 of 1 pass (exit 0), "
            "geomean 7.0 µs") in capsys.readouterr().out
