"""Tracking: `train.report_to` is a setting; one TensorBoard run per loop (run_dir/tb)
on a global step across stages with train/* per step, eval/* per stage (and by_stage/*) and final/*,
read back with TensorBoard's EventAccumulator; a W&B run in offline mode with the same scalars plus a
config table per stage (when wandb is installed). Stub nodes: a stage "trains" by writing its own
stage_k/tb and metrics.json like the real trainer does; fast."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import graph.graph as gg
from graph import loop, preflight, tracking
from graph.settings import SettingsError, build_settings
from tests.support.graph_stubs import settings_for
from trainer.files import stage_dir

STEPS = {0: 3, 1: 2, 2: 4}


@pytest.fixture
def training_stub(monkeypatch, stub_nodes):  # noqa: F811
    """train_stage writes stage_k/tb (train/reward at steps 1..n, like TRL's callback) and metrics.json."""
    from torch.utils.tensorboard import SummaryWriter

    def train_stage(state, runtime):
        k = state["stage"]
        d = stage_dir(runtime.context.run_dir, k)
        with SummaryWriter(log_dir=str(d / "tb")) as w:
            for step in range(1, STEPS[k] + 1):
                w.add_scalar("train/reward", 10 * k + step, step)
                w.add_scalar("train/loss", 0.5, step)
        (d / "metrics.json").write_text(json.dumps({"train/steps": STEPS[k], "train/reward_mean": 1.0}))
        return {"checkpoint": str(d / "checkpoint"), "train_metrics": {"train/reward_mean": 1.0}}

    def evaluate(state, runtime):
        k = state["stage"]
        start = {"start_metrics": {"eval/valid_rate": 0.05, "eval/n": 6, "start/cache_path": "/c/ws",
                                   "start/answers_reused": True}} if k == 0 else {}
        return {**start, "metrics": {"eval/valid_rate": 0.1 * (k + 1), "eval/optimal_rate": 0.05, "eval/n": 6,
                                     "eval/by_level": {"3": 1}}}

    def final_evaluate(state, runtime):
        return {"final_metrics": {"final/valid_rate": 0.42, "final/n": 9, "by_agents": {"3": {}}}}

    monkeypatch.setattr(gg, "train_stage", train_stage)
    monkeypatch.setattr(gg, "evaluate", evaluate)
    monkeypatch.setattr(gg, "final_evaluate", final_evaluate)


def scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {t: [(e.step, round(e.value, 6)) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}


def test_report_to_is_a_validated_train_setting():
    assert build_settings({}, {"PRESET": "smoke"}).train.report_to == "tensorboard"
    s = build_settings({"train.report_to": "WandB, tensorboard"}, {"PRESET": "smoke"})
    assert s.train.report_to == "tensorboard,wandb"
    assert build_settings({}, {"PRESET": "smoke", "TRAIN__REPORT_TO": "none"}).train.report_to == "none"
    with pytest.raises(SettingsError, match=r"train.report_to.*'mlflow'.*allowed: tensorboard, wandb"):
        build_settings({"train.report_to": "mlflow"}, {"PRESET": "smoke"})


def test_one_tensorboard_run_per_loop_on_a_global_step(tmp_path, training_stub):
    settings, run_dir = settings_for(tmp_path, stages=3)
    loop.run_graph(run_dir, settings, resume=False)
    tags = scalars(run_dir / "tb")
    # stage k's step s is at offset_k + s: offsets 0, 3, 5; 9 steps in all
    assert tags["train/reward"] == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 11.0), (5, 12.0), (6, 21.0), (7, 22.0),
                                    (8, 23.0), (9, 24.0)]
    assert [s for s, _ in tags["train/loss"]] == list(range(1, 10))
    assert tags["eval/valid_rate"] == [(3, 0.1), (5, 0.2), (9, 0.3)]  # each stage's last global step
    # the warm start's own evaluation (stage 0's evaluate): on stage 0's step, and as "stage -1"
    assert tags["start/eval/valid_rate"] == [(3, 0.05)] and tags["start/eval/n"] == [(3, 6.0)]
    assert tags["by_stage/eval/valid_rate"] == [(-1, 0.05), (0, 0.1), (1, 0.2), (2, 0.3)]
    assert not any(t.startswith("start/start/") for t in tags)  # its bookkeeping (a path, a flag) is no scalar
    assert tags["final/valid_rate"] == [(9, 0.42)] and tags["final/n"] == [(9, 9.0)]
    assert not any("by_level" in t or "by_agents" in t for t in tags)  # numbers only
    # one run: one events file in run_dir/tb (per process), the stages' own runs stay in stage_k/tb
    assert len(list((run_dir / "tb").glob("events.out.tfevents.*"))) == 1
    assert json.loads((run_dir / "tb" / "logged.json").read_text())["logged"] == [
        "config:0", "config:1", "config:2", "eval:0", "eval:1", "eval:2", "final", "train:0", "train:1", "train:2"]


def test_a_re_run_node_is_not_logged_twice(tmp_path, training_stub):
    settings, run_dir = settings_for(tmp_path, stages=3)
    loop.run_graph(run_dir, settings, resume=False)
    tracking.close_all()
    tracking.track("evaluate", {"stage": 1}, {"metrics": {"eval/valid_rate": 0.9}}, run_dir, settings)
    tracking.track("train_stage", {"stage": 0}, {"train_metrics": {}}, run_dir, settings)
    tracking.close_all()
    tags = scalars(run_dir / "tb")
    assert tags["eval/valid_rate"] == [(3, 0.1), (5, 0.2), (9, 0.3)]
    assert len(tags["train/reward"]) == 9


def test_report_to_none_writes_no_loop_run(tmp_path, training_stub):
    settings, run_dir = settings_for(tmp_path, stages=2)
    settings = settings.model_copy(update={"train": settings.train.model_copy(update={"report_to": "none"})})
    loop.run_graph(run_dir, settings, resume=False)
    assert not (run_dir / "tb").exists()


def test_tracking_failure_is_a_warning_not_the_end_of_the_run(tmp_path, training_stub, monkeypatch, capsys):
    def boom(self, *a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(tracking.LoopTracker, "on_evaluate", boom)
    settings, run_dir = settings_for(tmp_path, stages=2)
    assert loop.run_graph(run_dir, settings, resume=False)["final_metrics"]
    assert "[warn] tracking (tensorboard) after evaluate: OSError: disk full" in capsys.readouterr().err


def test_wandb_offline_run_has_the_same_scalars_and_config_tables(tmp_path, training_stub, monkeypatch):
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    settings, run_dir = settings_for(tmp_path, stages=3, **{"train.report_to": "tensorboard,wandb"})
    logged: list[tuple[dict, int]] = []
    real_init = wandb.init

    def spy_init(*a, **k):
        run = real_init(*a, **k)
        real_log = run.log

        def log(data, step=None, **kw):
            logged.append((dict(data), step))
            return real_log(data, step=step, **kw)

        run.log = log
        return run

    monkeypatch.setattr(wandb, "init", spy_init)
    loop.run_graph(run_dir, settings, resume=False)
    tracking.close_all()
    runs = list((run_dir / "wandb").glob("offline-run-*"))
    assert runs and any(p.suffix == ".wandb" for r in runs for p in r.iterdir())  # an offline run on disk
    tb = scalars(run_dir / "tb")
    for tag in ("train/reward", "eval/valid_rate", "start/eval/valid_rate", "final/valid_rate"):
        wb = [(step, round(d[tag], 6)) for d, step in logged if tag in d]
        assert wb == tb[tag], tag  # the same scalars on the same global steps
    tables = {k: (d[k], step) for d, step in logged for k in d if k.startswith("config/stage_")}
    assert set(tables) == {"config/stage_0", "config/stage_1", "config/stage_2"}
    table, step = tables["config/stage_1"]
    assert table.columns == ["size", "data", "hole", "wait"] and len(table.data) == 8 and step == 3
    steps = [step for _, step in logged]
    assert steps == sorted(steps)  # W&B steps only grow


def test_wandb_config_table_of_a_level_share_task_has_a_row_per_level(tmp_path):
    """Another task than MAPF (the toy task's levels 1-3): W&B's `config/stage_<k>` table is the share per level of
    the family (its label beside it, a level the config leaves out at 0), not MAPF's per-size knobs (empty there)."""
    pytest.importorskip("wandb")
    settings = build_settings({"task": "tests.support.toy_task:ToyTask", "preset": "smoke", "engineer": "fixed",
                               "train.report_to": "wandb"}, env={})
    logged: list[tuple[dict, int]] = []

    class Run:
        def log(self, data, step=None):
            logged.append((data, step))

    t = tracking.LoopTracker(tmp_path, settings)
    t._wandb = Run()  # the W&B run itself is not needed to build its table
    t.on_config(1, {"levels": {"1": 0.25, "3": 0.75}, "num_instances": 8})
    (data, step), = logged
    table = data["config/stage_1"]
    assert table.columns == ["level", "what", "share"] and data["stage"] == 1 and step == 0
    assert table.data == [[1, "1-digit terms", 0.25], [2, "2-digit terms", 0.0], [3, "3-digit terms", 0.75]]
    assert tracking.config_rows({"levels": {"2": 1.0}}, settings)[1][1][2] == 1.0
    mapf = build_settings({"engineer": "fixed"}, {"PRESET": "smoke"})  # MAPF: the knobs per grid size, as before
    cols, rows = tracking.config_rows({"sizes": {"4": {"data_ratio": 1.0, "hole_ratio": 0.1, "wait_ratio": 0.5},
                                                 "3": {"data_ratio": 0.0, "hole_ratio": 0.2, "wait_ratio": 0.25}}}, mapf)
    assert cols == ["size", "data", "hole", "wait"] and rows == [[3, 0.0, 0.2, 0.25], [4, 1.0, 0.1, 0.5]]


def test_wandb_asked_for_but_not_installed_is_one_line(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    settings = build_settings({"engineer": "fixed", "train.report_to": "wandb"}, {"PRESET": "smoke"})
    with pytest.raises(SettingsError, match=r"train.report_to='wandb': the wandb package is not installed"):
        preflight.check_report_to(settings)


def test_a_fork_logs_the_shared_stage_0(tmp_path):
    """--stage0-from: the fork's loop run starts with the donor's stage 0 (its linked stage_0/tb and state)."""
    from types import SimpleNamespace

    from torch.utils.tensorboard import SummaryWriter

    settings, run_dir = settings_for(tmp_path, stages=2)
    with SummaryWriter(log_dir=str(run_dir / "stage_0" / "tb")) as w:
        for step in (1, 2):
            w.add_scalar("train/reward", step / 10, step)
    (run_dir / "stage_0" / "metrics.json").write_text(json.dumps({"train/steps": 2}))
    donor = SimpleNamespace(values={"config": {"sizes": {}}, "train_metrics": {"train/reward_mean": 0.1},
                                    "metrics": {"eval/valid_rate": 0.25}})
    loop.track_shared_stage0(run_dir, settings, donor)
    tracking.close_all()
    tags = scalars(run_dir / "tb")
    assert tags["train/reward"] == [(1, 0.1), (2, 0.2)] and tags["eval/valid_rate"] == [(2, 0.25)]


def test_a_stage_whose_metrics_cannot_be_read_stops_the_step_count_instead_of_counting_it_as_0(tmp_path):
    for k, steps in ((0, 3), (1, 2)):
        stage_dir(tmp_path, k).mkdir(parents=True)
        (stage_dir(tmp_path, k) / "metrics.json").write_text(json.dumps({"train/steps": steps}))
    assert tracking.stage_offset(tmp_path, 2) == 5 and tracking.stage_offset(tmp_path, 3) == 5  # stage 2: none yet
    (stage_dir(tmp_path, 0) / "metrics.json").write_text('{"train/steps": 3')  # cut short
    with pytest.raises(ValueError, match=r"stage_0/metrics.json cannot be read as a JSON object"):
        tracking.stage_offset(tmp_path, 2)
