"""The benchmark harness's `--resume`: which cells of an interrupted run it keeps.

`e2e/bench/smoke` runs the whole harness with `--resume` (a finished cell kept, a complete run
and a changed plan refused); here, without engines, the cell rule over several load points.
"""

import json
import sys

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "e2e" / "bench"))
import harness  # noqa: E402

PLAN = {"arrival": "concurrent", "points": [4, 8], "settings": {"control": {"duration": 60}}}


def point(router, workload, label):
    return {"router": router, "workload": workload, "point": label, "ttft_ms_p50": 1.0}


def write(out, runs, plan=PLAN, **extra):
    (out / "plan.json").write_text(json.dumps({**plan, "wall_s_before": 0, "command": "e2e/bench/run"}))
    (out / "results.json").write_text(json.dumps({"runs": runs, **extra}))


def test_only_cells_with_every_load_point_are_kept(tmp_path):
    done = [point("oracle", "control", "c=4"), point("oracle", "control", "c=8")]
    half = [point("switchyard", "control", "c=4")]
    write(tmp_path, done + half, wall_s=1234)
    runs, wall = harness.resume(tmp_path, PLAN)
    assert runs == done
    assert wall == 1234


def test_a_complete_run_is_not_continued(tmp_path):
    write(tmp_path, [], meta={"wall_s": 1})
    with pytest.raises(SystemExit, match="is complete"):
        harness.resume(tmp_path, PLAN)


def test_a_changed_plan_is_refused_and_named(tmp_path):
    write(tmp_path, [point("oracle", "control", "c=4")])
    changed = {**PLAN, "points": [4, 8, 16]}
    with pytest.raises(SystemExit, match="different points"):
        harness.resume(tmp_path, changed)


def test_nothing_to_resume(tmp_path):
    with pytest.raises(SystemExit, match="no run to continue"):
        harness.resume(tmp_path, PLAN)
