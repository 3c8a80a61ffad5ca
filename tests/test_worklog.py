"""WORKLOG discipline: from v9 on, every version has its "vN plan and prediction" entry, written before the entry
that says what it measured (README and docs/versions.md, "Adding a version": predict first)."""
import re

from a2a.plan import ROOT, list_versions

FIRST_CHECKED = 9  # v8 ran before its prediction was written (WORKLOG says so); the rule holds from v9 on


def headings() -> list:
    return [line for line in (ROOT / "WORKLOG.md").read_text().splitlines() if line.startswith("## ")]


def test_every_version_has_its_plan_and_prediction_before_its_measurement():
    found = headings()
    for path in list_versions():
        number = int(path.stem.split("_")[0][1:])
        if number < FIRST_CHECKED:
            continue
        plans = [i for i, line in enumerate(found) if re.search(rf"\bv{number} plan and prediction\b", line)]
        assert plans, f"{path.name}: WORKLOG has no '## ... v{number} plan and prediction' entry"
        measured = [i for i, line in enumerate(found) if re.search(rf"\bv{number} measured\b", line)]
        assert all(plans[0] < i for i in measured), f"v{number}'s measured entry comes before its plan"
