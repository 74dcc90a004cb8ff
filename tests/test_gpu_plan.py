"""The paper preset's GPU configuration, built on a CPU with CUDA mocked: TRL's GRPOConfig, the
LoRA config, `python -m graph.run --dry-run`'s plan, and the thinking switch reaching every place it must."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from graph.settings import build_settings
from llm_backends.policy import template_kwargs
from trainer.config import TRAIN_PRESETS, TrainConfig
from trainer.data import build_dataset
from trainer.gpu_plan import mock_cuda, plan_lines, training_plan
from trainer.trl_setup import grpo_config, lora_config, use_bf16

ROOT = Path(__file__).resolve().parents[1]
PAPER = TrainConfig.model_validate(TRAIN_PRESETS["paper"])


@pytest.fixture(scope="module")
def paper_args(tmp_path_factory):
    with mock_cuda():
        args = grpo_config(PAPER, tmp_path_factory.mktemp("paper"), seed=0)
        world, device = args.world_size, str(args.device)
    return args, world, device


def test_mock_cuda_leaves_the_process_as_it_was():
    import torch
    from accelerate.state import PartialState

    before = dict(PartialState._shared_state)
    with mock_cuda():
        assert torch.cuda.is_available()
        grpo_config(PAPER, Path("/tmp/unused"), seed=0).device  # noqa: B018 - makes accelerate's state
    assert not torch.cuda.is_available()
    assert dict(PartialState._shared_state) == before


def test_paper_grpo_config_on_a_gpu_is_bf16_lora_vllm_and_not_cpu(paper_args):
    args, world, device = paper_args
    assert device == "cuda:0" and world == 1
    assert args.bf16 is True and args.use_cpu is False and not args.fp16
    assert args.use_vllm is True and args.vllm_mode == "colocate"
    assert args.gradient_checkpointing is True
    with mock_cuda():
        assert use_bf16(PAPER) is True  # the model loads in bfloat16 (run_stage's dtype)
    lora = lora_config(PAPER)
    assert PAPER.lora is True and (lora.r, lora.lora_alpha) == (32, 64) and lora.target_modules == "all-linear"


def test_paper_generation_batch_holds_whole_groups_on_1_to_8_gpus(paper_args):
    args, _, _ = paper_args
    assert args.generation_batch_size == PAPER.per_device_train_batch_size * PAPER.gradient_accumulation_steps
    assert args.generation_batch_size % args.num_generations == 0
    for gpus in range(1, 9):  # TRL's rule for N processes: per_device * N * steps_per_generation % G == 0
        assert (PAPER.per_device_train_batch_size * gpus * args.steps_per_generation) % PAPER.num_generations == 0


def test_paper_passes_no_prompt_limit_to_trl_and_its_context_holds_prompt_plus_answer(paper_args):
    args, _, _ = paper_args
    # prompts are filtered by length in build_dataset; TRL must never cut one (it would cut the map)
    assert getattr(args, "max_prompt_length", None) is None
    assert args.max_completion_length == PAPER.max_completion_length == 4096
    assert args.vllm_max_model_length >= PAPER.max_prompt_length + PAPER.max_completion_length


@pytest.mark.parametrize("bf16_cpu", [True, False])
def test_cpu_preset_grpo_config_is_unchanged_by_the_gpu_fields(tmp_path, monkeypatch, bf16_cpu):
    monkeypatch.setattr("llm_backends.vllm_server.cpu_has_bf16", lambda *a: bf16_cpu)
    args = grpo_config(TrainConfig(), tmp_path, seed=0)
    # bf16=True on CPU is accelerate's autocast over the float32 weights the stage loads (train.autocast_bf16=auto:
    # on a bf16 CPU only); bf16 weights stay off on CPU
    assert args.use_cpu is True and args.bf16 is bf16_cpu and args.use_vllm is False
    assert use_bf16(TrainConfig()) is False
    assert args.vllm_max_model_length is None and args.chat_template_kwargs is None


class RecordingTokenizer:
    def __init__(self):
        self.calls = []

    def apply_chat_template(self, messages, **kw):
        self.calls.append(kw)
        thinking = kw.get("enable_thinking", True)
        return "".join(m["content"] for m in messages) + ("" if thinking else "<think>\n\n</think>\n\n")

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": text.split()}


def test_one_thinking_setting_reaches_grpo_config_prompt_counting_and_every_request(tmp_path, fake_openai,
                                                                                   monkeypatch):
    from env import generate, uniform_config

    cfg = PAPER
    assert cfg.enable_thinking is False  # the paper preset's deliberate choice
    with mock_cuda():
        args = grpo_config(cfg, tmp_path, seed=0)
    assert args.chat_template_kwargs == {"enable_thinking": False}
    # prompt counting: the same kwargs as TRL passes to apply_chat_template
    tok = RecordingTokenizer()
    build_dataset(generate(uniform_config(), 2, seed=0).instances, tok, 10_000, "full",
                  template_kwargs(cfg.enable_thinking), task="mapf")
    assert tok.calls and all(c.get("enable_thinking") is False for c in tok.calls)
    # every request to the policy's vLLM server
    import llm_backends.policy as lp
    import llm_backends.vllm_server as vs
    from llm_backends.openai_chat import OpenAIChat

    class FakeServer:
        def __init__(self, *a, **k):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

        def client(self, model=None, **kw):
            kw.pop("max_concurrency", None)
            return OpenAIChat(fake_openai.base_url, model or "policy", backend="vllm", **kw)

    monkeypatch.setattr(vs, "VLLMServer", FakeServer)
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text("{}")
    lp.set_enable_thinking(cfg.enable_thinking)  # what graph.loop.run_graph does with the run's settings
    try:
        with lp.open_checkpoint(model_dir, backend="vllm", log_path=tmp_path / "v.log", keep_server=False) as chat:
            chat.chat_batch([[{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]], max_tokens=4)
    finally:
        lp.set_enable_thinking(None)
    bodies = [r["body"] for r in fake_openai.chat_requests]
    assert len(bodies) == 2 and all(b["chat_template_kwargs"] == {"enable_thinking": False} for b in bodies)
    # and nothing is sent when the setting is None (the cpu preset: SmolLM2's template has no such switch)
    with lp.open_checkpoint(model_dir, backend="vllm", log_path=tmp_path / "v.log", keep_server=False) as chat:
        chat.chat([{"role": "user", "content": "c"}], max_tokens=4)
    assert "chat_template_kwargs" not in fake_openai.chat_requests[-1]["body"]


def test_in_process_engine_renders_with_the_same_switch():
    from llm_backends.local import LocalEngine

    eng = object.__new__(LocalEngine)
    eng.tokenizer = RecordingTokenizer()
    eng.tokenizer.chat_template = "{{ enable_thinking }}"
    eng.chat_template_kwargs = {"enable_thinking": False}
    eng._render([{"role": "user", "content": "x"}])
    assert eng.tokenizer.calls[-1]["enable_thinking"] is False


def run_cli(args, env_over, cwd):
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and k not in ("PRESET", "ENGINEER")}
    env.update({"PYTHONPATH": str(ROOT), **env_over})
    return subprocess.run([sys.executable, "-m", "graph.run", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


def test_greedy_evaluation_with_thinking_on_is_refused_in_one_line(tmp_path):
    r = run_cli(["--dry-run", "--engineer", "fixed", "--set", "train.enable_thinking=true",
                 "--run-dir", str(tmp_path / "r")], {"PRESET": "smoke"}, tmp_path)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: bad setting train.enable_thinking=True: evaluation")
    assert not (tmp_path / "r").exists()


def test_paper_settings_record_the_thinking_choice():
    s = build_settings({"engineer": "fixed"}, {"PRESET": "paper"})
    assert s.model_dump(mode="json")["train"]["enable_thinking"] is False


def test_paper_dry_run_plan_prints_grpo_lora_and_server_lines(tmp_path):
    s = build_settings({"engineer": "fixed"}, {"PRESET": "paper"})
    plan = training_plan(s, tmp_path)
    assert plan["gpu_mocked"] is not None and plan["steps_per_stage"] == 1000
    cmd = plan["server_command"]
    assert cmd[cmd.index("--dtype") + 1] == "auto" and "--enforce-eager" not in cmd
    assert "--enable-lora" in cmd and cmd[cmd.index("--max-lora-rank") + 1] == "32"
    assert "Qwen/Qwen3-4B" in cmd
    text = "\n".join(plan_lines(plan, s))
    for want in ("GRPOConfig:", "bf16=True", "vllm_max_model_length=6144", "LoRA: r=32", "vllm serve Qwen/Qwen3-4B",
                 "chat_template_kwargs={'enable_thinking': False}", "steps per stage: 1000"):
        assert want in text, want


def test_paper_dry_run_cli_prints_the_plan_without_a_gpu(tmp_path):
    r = run_cli(["--dry-run", "--run-dir", str(tmp_path / "r")], {"PRESET": "paper", "ENGINEER": "self"}, tmp_path)
    assert r.returncode == 0, r.stderr
    assert "[dry-run] GRPOConfig:" in r.stderr and "bf16=True" in r.stderr
    assert "[dry-run] LoRA: r=32" in r.stderr and "--dtype auto" in r.stderr
    assert "not pinged" in r.stderr  # the self engineer would need the GPU's server
