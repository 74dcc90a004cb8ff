"""Settings of `python -m graph.run`: precedence, and one clear line for every bad value, before any work."""

from __future__ import annotations

from pathlib import Path

import pytest

from graph.settings import Settings, SettingsError, build_settings
from tests.support.graph_stubs import run_cli


def test_precedence_cli_over_env_over_preset():
    s = build_settings({}, {"PRESET": "smoke"})
    assert s.preset == "smoke" and s.stages == 2  # from the smoke preset
    s = build_settings({}, {"PRESET": "smoke", "STAGES": "4"})
    assert s.stages == 4  # environment beats preset
    s = build_settings({"stages": "5"}, {"PRESET": "smoke", "STAGES": "4"})
    assert s.stages == 5  # CLI beats environment
    s = build_settings({"train.learning_rate": "0.5"}, {"PRESET": "smoke"})
    assert s.train.learning_rate == 0.5  # training hyper-parameters are overridable too


def test_cpu_long_is_cpus_run_around_the_measured_96_step_stage(tmp_path):
    """`--preset cpu-long`: the cpu preset's run (splits, limits, backend) with the training values its figures in
    evals/results/learning_cpu were measured with; the cpu preset itself keeps its own stage."""
    long, cpu = build_settings({"preset": "cpu-long"}, {}), build_settings({}, {})
    assert long.preset == "cpu-long" and cpu.preset == "cpu"
    run = {k: v for k, v in long.model_dump().items() if k not in ("preset", "train")}
    assert run == {k: v for k, v in cpu.model_dump().items() if k not in ("preset", "train")}
    t, c = long.train, cpu.train
    assert (t.sft_steps, t.sft_instances, t.max_steps, t.num_generations, t.per_device_train_batch_size,
            t.resample_rounds) == (300, 2400, 96, 8, 16, 0)
    assert (c.sft_steps, c.max_steps, c.num_generations) != (t.sft_steps, t.max_steps, t.num_generations)
    assert build_settings({"preset": "cpu-long", "train.max_steps": "144"}, {}).train.max_steps == 144
    flat = " ".join(run_cli(["--help"], {}, cwd=tmp_path).stdout.split())
    assert "cpu-long: 3 stages, 64 training instances and 96 GRPO steps per stage" in flat


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
        ([], {"ENGINEER": "fixed", "POLICY_MODEL": "/no/such/model"}, "policy_model='/no/such/model'"),
        ([], {"ENGINEER": "fixed", "PROMPTS_DIR": "/nonexistent"}, "prompts_dir='/nonexistent'"),
    ],
)
def test_cli_errors_one_line_no_run_folder(tmp_path, args, env, needle):
    if "--run-dir" not in args:
        args = [*args, "--run-dir", str(tmp_path / "run")]
    named = Path(args[args.index("--run-dir") + 1])
    r = run_cli(["--runs-root", str(tmp_path / "runs"), *args], {"PRESET": "smoke", **env}, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), r.stderr
    assert needle in lines[0]
    assert not named.exists()  # the run folder it would have used is not left behind
    assert not (tmp_path / "runs").exists()


def test_policy_model_and_prompts_dir_checks(tmp_path):
    from graph.preflight import check_policy_model, check_prompts_dir

    model = tmp_path / "model"
    model.mkdir()
    with pytest.raises(SettingsError, match="not a model folder"):
        check_policy_model(str(model))  # a folder without config.json
    (model / "config.json").write_text("{}")
    for ok in ("smollm2-135m", "Qwen/Qwen3-4B", str(model)):
        check_policy_model(ok)
    for bad in ("/no/such/model", "./missing", "no-such-short-name", "a/b/c"):
        with pytest.raises(SettingsError, match="policy_model"):
            check_policy_model(bad)
    prompts = tmp_path / "prompts"
    prompts.mkdir()
    with pytest.raises(SettingsError, match="override nothing"):
        check_prompts_dir(prompts)
    (prompts / "module_F.md").write_text("F")
    check_prompts_dir(prompts)  # overriding one template is allowed: the others come from prompts/
    with pytest.raises(SettingsError, match="not a folder"):
        check_prompts_dir(prompts / "module_F.md")


@pytest.mark.parametrize("how", ["server_errors", "unreachable"])
def test_dry_run_engineer_that_does_not_answer_is_one_line(tmp_path, how):
    """--dry-run pings an endpoint once with a short timeout: one line, non-zero exit, no run folder."""
    import socket
    import time

    from tests.support.fakeopenai import FakeOpenAI, Fault

    with FakeOpenAI() as srv:
        srv.script(*[Fault.server_error() for _ in range(20)])
        url = srv.base_url
        if how == "unreachable":
            with socket.socket() as sock:  # a port nobody listens on
                sock.bind(("127.0.0.1", 0))
                url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
        run_dir = tmp_path / "run"
        t0 = time.monotonic()
        r = run_cli(["--dry-run", "--run-dir", str(run_dir)],
                    {"PRESET": "smoke", "ENGINEER": "myendpoint", "ENGINEER_BASE_URL": url,
                     "ENGINEER_MODEL": "fake-model"}, cwd=tmp_path)
        took = time.monotonic() - t0
        calls = len(srv.chat_requests)
    assert r.returncode == 1, r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "engineer 'myendpoint' did not answer" in errors[0], r.stderr
    assert "Traceback" not in r.stderr
    assert calls == (1 if how == "server_errors" else 0)  # one attempt, no retries
    assert took < 120  # a retry loop would take minutes; a loaded 2-core machine takes up to ~40 s to start
    assert not run_dir.exists()


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


def test_dry_run_builds_stage_0_data_and_trains_nothing_and_resume_names_ignored_flags(tmp_path):
    """One --dry-run (a graph.run start-up, seconds) serves both checks: what it kept, then a --resume of it."""
    run_dir = tmp_path / "run"
    r = run_cli(["--dry-run", "--run-dir", str(run_dir), "--engineer", "fixed", "--seed", "4"],
                {"PRESET": "smoke"}, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "[dry-run] graph built" in r.stderr
    assert "[dry-run] engineer 'fixed' answered" in r.stderr and "a config, accepted" in r.stderr
    rows = (run_dir / "stage_0" / "train.jsonl").read_text().splitlines()
    assert len(rows) == Settings.load(run_dir / "settings.json").train.instances_per_stage
    assert not (run_dir / "stage_0" / "checkpoint").exists() and not (run_dir / "graph.sqlite").exists()
    assert "engineer fixed" in (run_dir / "dry_run_engineer" / "stage_0" / "engineer_reply.md").read_text()

    r = run_cli(["--resume", str(run_dir), "--stages", "9", "--dry-run"], {}, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "[resume] ignoring stages" in r.stderr
    assert Settings.load(run_dir / "settings.json").stages == 2


def test_lora_is_automatic_for_large_models():
    from trainer.config import wants_lora

    assert build_settings({}, {}).train.lora == "auto"
    assert build_settings({}, {"PRESET": "paper"}).train.lora is True
    assert build_settings({}, {"TRAIN__LORA": "false"}).train.lora is False
    assert not wants_lora("auto", 134_515_008) and wants_lora("auto", 4_022_468_096)  # SmolLM2-135M, Qwen3-4B
    assert not wants_lora(False, 4_022_468_096) and wants_lora(True, 134_515_008)
    with pytest.raises(SettingsError, match="lora"):
        build_settings({}, {"TRAIN__LORA": "sometimes"})


def test_policy_backend_auto_is_resolved_and_recorded(monkeypatch):
    """The cpu preset answers evaluations with vLLM where it is installed, in-process elsewhere; settings.json
    (what a resume and a stage-0 fork compare) records the backend actually used, never `auto`."""
    from llm_backends.vllm_server import vllm_available

    s = build_settings({}, {})
    assert s.preset == "cpu"
    assert s.policy_backend == ("vllm" if vllm_available() else "transformers")
    assert build_settings({}, {"PRESET": "smoke"}).policy_backend == "transformers"  # the smoke preset stays in-process
    assert build_settings({"policy_backend": "transformers"}, {}).policy_backend == "transformers"  # a flag beats auto
    monkeypatch.setattr("llm_backends.vllm_server.vllm_available", lambda: False)  # a machine without vLLM
    s = build_settings({"policy_backend": "auto"}, {"PRESET": "paper"})
    assert s.policy_backend == "transformers"
    assert Settings.model_validate_json(s.model_dump_json()).policy_backend == "transformers"
    with pytest.raises(SettingsError, match="policy_backend"):
        build_settings({"policy_backend": "gpu"}, {})
