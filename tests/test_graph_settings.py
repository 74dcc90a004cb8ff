"""Settings of `python -m graph.run`: precedence, and one clear line for every bad value, before any work."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from nodes.context import Settings, SettingsError, build_settings

ROOT = Path(__file__).resolve().parents[1]


def run_cli(args: list[str], env_extra: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if not k.endswith("_API_KEY") and k not in ("ENGINEER", "PRESET", "STAGES", "RUN_DIR")}
    env.update(env_extra)
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-m", "graph.run", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def test_precedence_cli_over_env_over_preset():
    s = build_settings({}, {"PRESET": "smoke"})
    assert s.preset == "smoke" and s.stages == 2  # from the smoke preset
    s = build_settings({}, {"PRESET": "smoke", "STAGES": "4"})
    assert s.stages == 4  # environment beats preset
    s = build_settings({"stages": "5"}, {"PRESET": "smoke", "STAGES": "4"})
    assert s.stages == 5  # CLI beats environment
    s = build_settings({"train.learning_rate": "0.5"}, {"PRESET": "smoke"})
    assert s.train.learning_rate == 0.5  # training hyper-parameters are overridable too


@pytest.mark.parametrize(
    "cli, env, needle",
    [
        ({}, {"STAGES": "-1"}, "STAGES"),
        ({}, {"PRESET": "huge"}, "PRESET='huge'"),
        ({"stages": "abc"}, {}, "--stages"),
        ({}, {"CONTEXT": "V9"}, "V9"),
        ({"train.no_such_knob": "1"}, {}, "no_such_knob"),
    ],
)
def test_bad_values_name_the_setting(cli, env, needle):
    with pytest.raises(SettingsError) as ei:
        build_settings(cli, env)
    msg = str(ei.value)
    assert needle in msg and "\n" not in msg


def test_settings_roundtrip(tmp_path):
    s = build_settings({"engineer": "fixed", "seed": "3"}, {"PRESET": "smoke"})
    s.save(tmp_path / "settings.json")
    assert Settings.load(tmp_path / "settings.json") == s


@pytest.mark.parametrize(
    "args, env, needle",
    [
        ([], {"ENGINEER": "nosuchengineer"}, "nosuchengineer"),
        ([], {"STAGES": "-1"}, "STAGES"),
        ([], {"ENGINEER": "openai"}, "OPENAI_API_KEY"),
        (["--run-dir", "/proc/forbidden/run"], {"ENGINEER": "fixed"}, "/proc"),
        (["--resume", "no/such/run"], {}, "no/such/run"),
    ],
)
def test_cli_errors_one_line_no_run_folder(tmp_path, args, env, needle):
    r = run_cli(["--runs-root", str(tmp_path / "runs"), *args], {"PRESET": "smoke", **env}, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), r.stderr
    assert needle in lines[0]
    assert not (tmp_path / "runs").exists()  # nothing left behind


def test_help_documents_env_vars(tmp_path):
    r = run_cli(["--help"], {}, cwd=tmp_path)
    assert r.returncode == 0
    for var in ("ENGINEER", "ENGINEER_MODEL", "ENGINEER_BASE_URL", "POLICY_MODEL", "PRESET", "CONTEXT",
                "STAGES", "SEED", "RUN_DIR"):
        assert f"[env {var}]" in " ".join(r.stdout.split())  # argparse wraps lines


def test_every_documented_setting_is_a_field_reachable_from_env():
    """Settings the nodes read exist as validated fields (CONTEXT_DETAILS=full reaches them from the environment)."""
    s = build_settings({}, {"CONTEXT_DETAILS": "full", "FEASIBILITY_N": "8", "ENGINEER_TEMPERATURE": "0.5"})
    assert (s.context_details, s.feasibility_n, s.engineer_temperature) == ("full", 8, 0.5)
    with pytest.raises(SettingsError, match="context_details"):
        build_settings({}, {"CONTEXT_DETAILS": "everything"})


def test_dry_run_builds_stage_0_data_and_trains_nothing(tmp_path):
    run_dir = tmp_path / "run"
    r = run_cli(["--dry-run", "--run-dir", str(run_dir), "--engineer", "fixed", "--seed", "4"],
                {"PRESET": "smoke"}, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "[dry-run] graph built" in r.stderr and "nothing to ping" in r.stderr
    rows = (run_dir / "stage_0" / "train.jsonl").read_text().splitlines()
    assert len(rows) == Settings.load(run_dir / "settings.json").train.instances_per_stage
    assert not (run_dir / "stage_0" / "checkpoint").exists() and not (run_dir / "graph.sqlite").exists()


def test_resume_says_which_flags_it_ignores(tmp_path):
    run_dir = tmp_path / "run"
    assert run_cli(["--dry-run", "--run-dir", str(run_dir), "--engineer", "fixed"], {"PRESET": "smoke"},
                   cwd=tmp_path).returncode == 0
    r = run_cli(["--resume", str(run_dir), "--stages", "9", "--dry-run"], {}, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "[resume] ignoring stages" in r.stderr
    assert Settings.load(run_dir / "settings.json").stages == 2


def test_lora_is_automatic_for_large_models():
    from nodes.train_stage import wants_lora

    assert build_settings({}, {}).train.lora == "auto"
    assert build_settings({}, {"PRESET": "paper"}).train.lora is True
    assert build_settings({}, {"TRAIN__LORA": "false"}).train.lora is False
    assert not wants_lora("auto", 134_515_008) and wants_lora("auto", 4_022_468_096)  # SmolLM2-135M, Qwen3-4B
    assert not wants_lora(False, 4_022_468_096) and wants_lora(True, 134_515_008)
    with pytest.raises(SettingsError, match="lora"):
        build_settings({}, {"TRAIN__LORA": "sometimes"})
