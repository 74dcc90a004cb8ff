"""--dry-run asks for one real proposal and keeps nothing unless asked, and less noise:
train.* and the presets in --help, the zero-variance warning line, trainer log dicts to the
stage's log file, keep_checkpoints=last. Fast: subprocesses of graph.run on the smoke preset with a
classic or a fake HTTP engineer, stub nodes in-process."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest

import graph.graph as gg
from env import SIZES
from graph import loop, progress
from graph.prune import prune_older
from graph.settings import build_settings
from tests.support.fakeopenai import FakeOpenAI
from tests.support.graph_stubs import run_cli, settings_for
from trainer.files import stage_dir

ENGINEER_REPLY = json.dumps({
    "rationale": "more small grids while large ones fail",
    "sizes": {str(n): {"data_ratio": 0.5 if n in (3, 4) else 0.0, "hole_ratio": 0.1, "wait_ratio": 0.25}
              for n in SIZES},
})


# ----------------------------------------------------------------------------- --dry-run


def test_dry_run_keeps_no_run_folder_unless_asked(tmp_path):
    r = run_cli(["--dry-run", "--engineer", "fixed"], {"PRESET": "smoke"}, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert not (tmp_path / "runs").exists()
    temp = re.search(r"\[dry-run\] (\S+) \(preset smoke", r.stderr).group(1)
    assert "a temporary folder, removed at the end" in r.stderr and not Path(temp).exists()
    assert "nothing kept" in r.stderr
    # asked (--run-dir): what it keeps is checked on one such dry run in tests/test_graph_settings.py
    # (test_dry_run_builds_stage_0_data_and_trains_nothing_and_resume_names_ignored_flags)


def test_dry_run_asks_for_a_real_proposal_and_validates_it(tmp_path):
    with FakeOpenAI(default=ENGINEER_REPLY) as srv:
        r = run_cli(["--dry-run", "--run-dir", str(tmp_path / "run")],
                    {"PRESET": "smoke", "ENGINEER": "mylab", "ENGINEER_BASE_URL": srv.base_url,
                     "ENGINEER_MODEL": "fake-model", "ENGINEER_API_KEY": "sk-dry-run-test"}, cwd=tmp_path)
        asked = [req["body"]["messages"][-1]["content"] for req in srv.chat_requests]
    assert r.returncode == 0, r.stderr
    assert len(asked) == 1 and "Reply with the single word OK" not in asked[0]
    assert "Evidence after training stage 0" in asked[0]  # the dummy context, built like a real one
    assert "[dry-run] engineer 'mylab' answered" in r.stderr and "a config, accepted" in r.stderr
    assert "3x3 data" in r.stderr and "size  data" in r.stderr  # what came out, old -> new
    assert "rationale: more small grids" in r.stderr


def test_dry_run_reply_without_a_config_is_said_not_fatal(tmp_path):
    with FakeOpenAI(default="I'm sorry for your loss.") as srv:
        r = run_cli(["--dry-run"], {"PRESET": "smoke", "ENGINEER": "mylab", "ENGINEER_BASE_URL": srv.base_url,
                                    "ENGINEER_MODEL": "fake-model", "ENGINEER_API_KEY": "sk-x"}, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "without a usable config" in r.stderr and "a run would ask again" in r.stderr
    assert not (tmp_path / "runs").exists()


# ----------------------------------------------------------------------------- --help


def test_help_lists_train_settings_and_explains_the_smoke_caps(tmp_path):
    from trainer.config import TrainConfig

    out = run_cli(["--help"], {}, cwd=tmp_path).stdout
    flat = " ".join(out.split())
    for name in TrainConfig.model_fields:
        assert f"--set train.{name}=..." in flat and f"TRAIN__{name.upper()}" in flat, name
    smoke = flat.split("smoke:", 1)[1].split("cpu:", 1)[0]
    assert "answers capped at 24 tokens in training" in smoke and "valid plan impossible" in smoke
    assert "KEEP_CHECKPOINTS" in flat and "report_to" in flat
    # it describes the loop, and MAPF-FrozenLake is one family among others
    intro = flat.split("options:", 1)[0]
    assert "train a policy for a stage, evaluate it" in intro and "design the next stage's training environment" in intro
    assert "MAPF-FrozenLake" in intro and "reasoning-gym dataset" in intro and "docs/tasks.md" in intro


# ----------------------------------------------------------------------------- zero-variance warning


def test_zero_variance_stage_prints_a_warning_line(tmp_path, monkeypatch, stub_nodes, capsys):  # noqa: F811
    def train_stage(state, runtime):
        k = state["stage"]
        zero = 1.0 if k == 0 else 0.5
        return {"checkpoint": str(stage_dir(runtime.context.run_dir, k) / "checkpoint"),
                "train_metrics": {"train/reward_mean": 0.0, "train/zero_std_groups": zero,
                                  "train/zero_std_groups_trained": float("nan")}}

    monkeypatch.setattr(gg, "train_stage", train_stage)
    settings, run_dir = settings_for(tmp_path, stages=2)
    loop.run_graph(run_dir, settings, resume=False)
    warnings = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("[warn]")]
    assert warnings == [
        "[warn] stage 0: every GRPO group had zero reward variance (all completions of a prompt scored the same), "
        "so this stage learned nothing from GRPO; see train/zero_std_groups in its metrics.json"]
    # dynamic sampling replaced the zero groups: what was trained on counts
    assert progress.zero_variance_warning("train_stage", {"train_metrics": {"train/zero_std_groups": 1.0,
                                                                      "train/zero_std_groups_trained": 0.5}}, {}) is None


def test_report_warns_about_zero_variance_stages(tmp_path):
    from nodes.report import collect, render

    d = tmp_path / "stage_0"
    d.mkdir()
    (d / "metrics.json").write_text(json.dumps({"train/steps": 2, "train/zero_std_groups": 1.0}))
    assert "Warning: stage 0 had zero reward variance" in render(collect(tmp_path), [], "r")


# ----------------------------------------------------------------------------- trainer log dicts


def test_trainer_log_dicts_go_to_the_log_file_not_stdout(tmp_path, capsys):
    from transformers.trainer_callback import PrinterCallback, TrainerState

    from trainer.trl_setup import quiet_trainer

    class FakeTrainer:
        def __init__(self):
            self.callbacks = [PrinterCallback()]

        def remove_callback(self, cb):
            self.callbacks = [c for c in self.callbacks if not (isinstance(cb, type) and isinstance(c, cb))]

        def add_callback(self, cb):
            self.callbacks.append(cb)

    trainer = FakeTrainer()
    quiet_trainer(trainer, progress=False, label="GRPO stage_0")
    assert not any(isinstance(c, PrinterCallback) for c in trainer.callbacks)
    root = logging.getLogger()
    handler = logging.FileHandler(tmp_path / "train.log")
    handler.setLevel(logging.INFO)
    old = root.level
    own = logging.getLogger("trainer.log")
    own_level = own.level  # an in-process stage run earlier in this process may have quieted it
    own.setLevel(logging.NOTSET)
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        state = TrainerState()
        state.global_step = 3
        for cb in trainer.callbacks:
            cb.on_log(None, state, None, logs={"loss": 0.25, "reward": 0.5})
    finally:
        root.removeHandler(handler)
        root.setLevel(old)
        own.setLevel(own_level)
        handler.close()
    assert 'step 3: {"loss": 0.25, "reward": 0.5}' in (tmp_path / "train.log").read_text()
    assert "loss" not in capsys.readouterr().out


# ----------------------------------------------------------------------------- keep_checkpoints


def _checkpoint(run_dir: Path, k: int, base: str | None = None) -> Path:
    c = run_dir / f"stage_{k}" / "checkpoint"
    c.mkdir(parents=True)
    (c / "model.safetensors").write_bytes(b"x" * 1000)
    (c / "config.json").write_text("{}")
    (c / "trainer_meta.json").write_text(json.dumps({"base_model": base or "/base/model"}))
    return c


def test_keep_checkpoints_last_deletes_only_what_nothing_needs(tmp_path):
    c0, c1 = _checkpoint(tmp_path, 0), _checkpoint(tmp_path, 1)
    lora_base = _checkpoint(tmp_path, 2)
    c3 = _checkpoint(tmp_path, 3, base=str(lora_base))  # a LoRA adapter on stage 2's full fine-tune
    assert prune_older(tmp_path, 3, c3) == [0, 1]
    assert not (c0 / "model.safetensors").exists() and not (c1 / "model.safetensors").exists()
    assert (lora_base / "model.safetensors").exists() and (c3 / "model.safetensors").exists()
    assert (c0 / "config.json").exists() and (c0 / "trainer_meta.json").exists()  # only the weights go
    record = json.loads((tmp_path / "stage_0" / "pruned.json").read_text())
    assert record["deleted"] == ["model.safetensors"] and record["bytes_freed"] == 1000
    assert prune_older(tmp_path, 1, None) == []  # nothing to go on from: nothing pruned


def test_keep_checkpoints_setting_and_the_loop(tmp_path, monkeypatch, stub_nodes):  # noqa: F811
    def train_stage(state, runtime):
        k = state["stage"]
        c = stage_dir(runtime.context.run_dir, k) / "checkpoint"
        c.mkdir(exist_ok=True)
        (c / "model.safetensors").write_bytes(b"w")
        return {"checkpoint": str(c), "train_metrics": {}}

    seen = []

    def evaluate(state, runtime):  # what evaluate (and everything after it) loads is there
        seen.append(Path(state["checkpoint"], "model.safetensors").is_file())
        return {"metrics": {"eval/valid_rate": 0.5}}

    monkeypatch.setattr(gg, "train_stage", train_stage)
    monkeypatch.setattr(gg, "evaluate", evaluate)
    from graph.settings import PRESETS

    # the smoke preset keeps only the last stage's weights (about 517 MB a stage of the embedded model); every
    # other preset, and a flag over smoke's, keeps them all
    assert {p: build_settings({}, {"PRESET": p}).keep_checkpoints for p in PRESETS} == {
        p: "last" if p == "smoke" else "all" for p in PRESETS}
    assert build_settings({"keep_checkpoints": "all"}, {"PRESET": "smoke"}).keep_checkpoints == "all"
    with pytest.raises(Exception, match="keep_checkpoints"):
        build_settings({"keep_checkpoints": "first"}, {"PRESET": "smoke"})
    settings, run_dir = settings_for(tmp_path, stages=3)  # the smoke preset's own keep_checkpoints=last
    assert settings.keep_checkpoints == "last"
    loop.run_graph(run_dir, settings, resume=False)
    assert seen == [True, True, True]
    assert [(run_dir / f"stage_{k}" / "checkpoint" / "model.safetensors").exists() for k in range(3)] == [
        False, False, True]
    (tmp_path / "all").mkdir()
    settings, run_dir2 = settings_for(tmp_path / "all", stages=3, keep_checkpoints="all")
    loop.run_graph(run_dir2, settings, resume=False)
    assert all((run_dir2 / f"stage_{k}" / "checkpoint" / "model.safetensors").exists() for k in range(3))


def test_an_unreadable_stage_file_is_named_in_the_report_and_on_the_terminal(tmp_path):
    """300 random bytes in stage_0/metrics.json: report.md and the report node's terminal line name the file and its
    stage, instead of a report without stage 0's rows and no word about it."""
    import random
    from types import SimpleNamespace

    from graph import progress
    from nodes.report import report

    for k in (0, 1):
        (tmp_path / f"stage_{k}").mkdir()
        (tmp_path / f"stage_{k}" / "metrics.json").write_text(json.dumps({"train/steps": 2}))
    (tmp_path / "stage_0" / "metrics.json").write_bytes(random.Random(0).randbytes(300))
    update = report({}, SimpleNamespace(context=SimpleNamespace(run_dir=tmp_path)))
    text = (tmp_path / "report.md").read_text()
    assert "Unreadable file: `stage_0/metrics.json: not JSON`" in text and "stage_1/metrics.json" not in text
    line = progress.describe_update("report", update, {})
    assert "[report] WARNING unreadable file stage_0/metrics.json: not JSON" in line


def test_the_progress_line_of_a_filtered_stage_says_what_it_kept():
    from graph import progress

    kept0 = {"train_metrics": {"train/optimizer": "filtered", "train/steps": 0, "train/kept": 0,
                               "train/completions": 7680, "train/reward_mean": 0.0}}
    line = progress.describe_update("train_stage", {**kept0, "stage": 2}, {})
    assert line == ("[stage 2] trained: reward-filtered fine-tuning, 0 steps, kept 0 of 7680 sampled answers: no step "
                    "taken, the checkpoint is the stage's start, unchanged")
    assert "GRPO" not in line
