"""Files written before metrics and verdict rows said `level` / `by_level` still load: old `eval.jsonl` rows (the
level in `size`), old `metrics.json` (`by_size`, `.../size_<k>`) in a run folder's report, a resumed state's metrics
for a classic engineer, and an old bench file."""

import json

from env import uniform_config
from families.metrics import compute_final_metrics, compute_metrics, row_level, upgrade_metrics

OLD_ROWS = [  # as rows were written: the level in `size`, `num_agents: None` for a level-share task
    {"id": "a", "size": 1, "num_agents": None, "tags": {}, "valid": True, "optimal": True, "failure": None},
    {"id": "b", "size": 1, "num_agents": None, "tags": {}, "valid": False, "optimal": False, "failure": "wrong"},
    {"id": "c", "size": 3, "num_agents": None, "tags": {}, "valid": True, "optimal": True, "failure": None},
]


def test_old_verdict_rows_give_the_same_metrics_as_new_ones():
    new_rows = [{("level" if k == "size" else k): v for k, v in r.items() if k != "num_agents"} for r in OLD_ROWS]
    old, new = compute_metrics(OLD_ROWS, labels=["wrong"]), compute_metrics(new_rows, labels=["wrong"])
    assert old == new
    assert new["by_level"]["1"]["valid_rate"] == 0.5 and new["eval/valid_rate/level_3"] == 1.0
    assert [row_level(r) for r in OLD_ROWS] == [row_level(r) for r in new_rows] == [1, 1, 3]


def test_upgrade_maps_every_old_name_one_to_one_and_leaves_new_metrics_alone():
    rows = [{"id": str(i), "level": 3 + i % 2, "num_agents": 2, "tags": {"agents": 2, "wait": 0.25}, "valid": i < 3,
             "optimal": i < 1, "failure": None if i < 3 else "conflict"} for i in range(6)]
    new = compute_final_metrics(rows)
    old = json.loads(json.dumps(new).replace('"by_level"', '"by_size"').replace("/level_", "/size_"))
    assert "by_level" not in json.dumps(old)
    assert upgrade_metrics(old) == new
    assert upgrade_metrics(new) == new
    assert upgrade_metrics(None) is None


def test_a_run_folder_of_old_files_reports_its_levels(tmp_path):
    from nodes.report import write_report

    run = tmp_path / "run"
    (run / "stage_0").mkdir(parents=True)
    (run / "final").mkdir()
    (run / "settings.json").write_text(json.dumps({"task": "mapf", "max_stages": 1}))
    (run / "stage_0" / "config.json").write_text(uniform_config().model_dump_json())
    (run / "stage_0" / "metrics.json").write_text(json.dumps({
        "eval/n": 8, "eval/valid_rate": 0.375, "eval/optimal_rate": 0.25,
        "eval/valid_rate/size_3": 0.625, "eval/optimal_rate/size_3": 0.5,
        "eval/valid_rate/size_4": 0.125, "eval/optimal_rate/size_4": 0.0,
        "by_size": {"3": {"n": 4, "valid_rate": 0.625}, "4": {"n": 4, "valid_rate": 0.125}}}))
    rows = [{"id": str(i), "size": 3, "num_agents": 3, "tags": {"agents": 3, "wait": 0.25}, "valid": i < 1,
             "optimal": i < 1, "failure": None} for i in range(4)]
    old_final = json.loads(json.dumps(compute_final_metrics(rows)).replace('"by_level"', '"by_size"')
                           .replace("/level_", "/size_"))
    (run / "final" / "metrics.json").write_text(json.dumps(old_final))
    text = write_report(run).read_text()
    table = [line for line in text.splitlines() if line.startswith("| 0 |")][0]
    assert "62.5" in table and "12.5" in table  # the per-size cells came from the old `size_<k>` keys
    assert "| 3 | 4 | 25.00 | 25.00 |" in text  # the final table from the old nested `by_size`


def test_a_classic_engineer_proposes_from_a_resumed_state_of_old_metrics(tmp_path):
    """A state checkpointed before the rename holds `by_size`: `threshold` still reads it and raises difficulty
    where the old table says the bar is passed, exactly as it does from the new name."""
    from nodes.apply import apply
    from nodes.propose_config import propose_config
    from tests.support.node_helpers import make_settings, runtime

    settings = make_settings(engineer="threshold")
    table = {"3": {"n": 10, "valid_rate": 0.95, "optimal_rate": 0.9}, "4": {"n": 10, "valid_rate": 0.1}}
    proposals = []
    for name in ("by_size", "by_level"):
        rt = runtime(settings, tmp_path / name)
        state = dict(apply({}, rt))
        state["metrics"] = {name: table}
        first = state["config"]["sizes"]
        proposals.append(propose_config(state, rt)["proposal"]["sizes"])
    assert proposals[0] == proposals[1]
    assert proposals[0]["3"]["hole_ratio"] > first["3"]["hole_ratio"]  # past the bar: harder
    assert proposals[0]["4"]["hole_ratio"] == first["4"]["hole_ratio"]  # below it: as it was
