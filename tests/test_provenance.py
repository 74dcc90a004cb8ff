"""Provenance: settings.json records the git commit and dirty flag, package versions,
the machine and the start time; report.md opens with a header naming run, preset, engineer, seed, policy
model, commit and wall time; a different commit or machine is never a settings change (resume, the
evals' drift check, --stage0-from); no environment variable (no secret) reaches settings.json."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from graph import run as gr
from graph.settings import ENV_VARS, Settings, SettingsError, build_settings
from graph.stage0 import compare_settings
from trainer import provenance

ROOT = Path(__file__).resolve().parents[1]


def test_collect_names_commit_packages_machine_and_start():
    p = provenance.collect(started=1_700_000_000.0)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    assert p["git"]["commit"] == head and isinstance(p["git"]["dirty"], bool)
    assert set(p["packages"]) == {"torch", "transformers", "trl", "vllm", "langgraph"}
    import torch
    import transformers

    assert p["packages"]["torch"] == torch.__version__ and p["packages"]["transformers"] == transformers.__version__
    assert p["machine"]["cores"] >= 1 and p["machine"]["cpu"] and isinstance(p["machine"]["gpus"], list)
    assert p["started_unix"] == 1_700_000_000.0 and p["started_at"].startswith("2023-11-")


def test_dirty_flag_follows_the_tree(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], cwd=repo, check=True)
    (repo / "a.txt").write_text("1")
    subprocess.run([*git, "add", "a.txt"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "x"], cwd=repo, check=True)
    monkeypatch.setattr(provenance, "REPO", repo)
    assert provenance.git_info()["dirty"] is False
    (repo / "a.txt").write_text("2")
    assert provenance.git_info()["dirty"] is True
    monkeypatch.setattr(provenance, "REPO", tmp_path / "nowhere")
    assert provenance.git_info() == {"commit": None, "dirty": None}


def test_new_run_records_provenance_without_secrets(tmp_path, monkeypatch, stub_nodes, capsys):  # noqa: F811
    secret = "sk-test-Provenance-Secret-1234567890"
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    monkeypatch.setenv("PRESET", "smoke")
    monkeypatch.setenv("ENGINEER", "fixed")
    run_dir = tmp_path / "run"
    assert gr.main(["--run-dir", str(run_dir), "--stages", "2"]) == 0, capsys.readouterr().err
    text = (run_dir / "settings.json").read_text()
    assert secret not in text and "OPENAI_API_KEY" not in text
    prov = json.loads(text)["provenance"]
    assert prov["git"]["commit"] and prov["machine"]["cores"] and prov["packages"]["langgraph"]
    Settings.load(run_dir / "settings.json")  # still a valid settings file
    from nodes.report import write_report

    report = write_report(run_dir).read_text()
    head = report.split("## ")[0]
    for needle in (f"| run | `{run_dir.name}` |", "| preset | `smoke` |", "| engineer | `fixed` |", "| seed | `0` |",
                   "| policy model | `smollm2-135m` |", f"| commit | `{prov['git']['commit'][:12]}`", "| wall time |",
                   "| started |", "| tracking | TensorBoard run `tb/`"):
        assert needle in head, needle
    assert "so far (no final benchmark yet)" in head  # the stub final_evaluate wrote no file
    (run_dir / "final").mkdir(exist_ok=True)
    (run_dir / "final" / "metrics.json").write_text("{}")
    assert "start to final benchmark" in write_report(run_dir).read_text().split("## ")[0]
    assert secret not in report


def test_wall_time_without_final_and_without_provenance(tmp_path):
    from nodes.report import collect, render

    (tmp_path / "settings.json").write_text(json.dumps({"preset": "cpu", "engineer": "self", "seed": 3}))
    text = render(collect(tmp_path), [], "r")
    assert "| commit | unknown |" in text and "| wall time | unknown (no start time in settings.json) |" in text


def test_provenance_is_bookkeeping_not_a_setting():
    assert "PROVENANCE" not in ENV_VARS and "KEEP_CHECKPOINTS" in ENV_VARS
    with pytest.raises(SettingsError, match="provenance is set by the run itself"):
        build_settings({"provenance": "{}"}, {"PRESET": "smoke"})
    a = build_settings({"engineer": "fixed"}, {"PRESET": "smoke"})
    b = a.model_copy(update={"provenance": {"git": {"commit": "other"}, "machine": {"cpu": "elsewhere"}},
                             "keep_checkpoints": "last",
                             "train": a.train.model_copy(update={"report_to": "none"})})
    assert compare_settings(a, b) is None  # --stage0-from: another commit or machine may donate stage 0
    assert compare_settings(a, b.model_copy(update={"seed": 1}))[0] == "seed"


def test_resume_does_not_call_provenance_a_settings_change(tmp_path, monkeypatch, stub_nodes, capsys):  # noqa: F811
    monkeypatch.setenv("PRESET", "smoke")
    monkeypatch.setenv("ENGINEER", "fixed")
    run_dir = tmp_path / "run"
    assert gr.main(["--run-dir", str(run_dir), "--stages", "2"]) == 0
    doc = json.loads((run_dir / "settings.json").read_text())
    doc["provenance"]["git"]["commit"] = "0" * 40  # started from another commit, on another machine
    doc["provenance"]["machine"]["cpu"] = "elsewhere"
    (run_dir / "settings.json").write_text(json.dumps(doc))
    capsys.readouterr()
    assert gr.main(["--resume", str(run_dir)]) == 0
    err = capsys.readouterr().err
    assert "ignoring" not in err and "already finished" in err
    assert json.loads((run_dir / "settings.json").read_text())["provenance"]["git"]["commit"] == "0" * 40


def test_evals_drift_ignores_provenance(tmp_path):
    from evals import pairs

    src = Path(pairs.__file__).read_text()
    assert '"provenance"' in src  # the drift check's bookkeeping list names it
    assert pairs.stage0_setting("train.report_to") is False and pairs.stage0_setting("train.learning_rate")
    assert pairs.stage0_setting("provenance") is False
