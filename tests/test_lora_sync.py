"""LoRA syncs into vLLM without drift: 1,000 sync cycles of a bf16 LoRA model leave the base weights
bit-exact, while TRL's own merge/unmerge drifts; and vLLM receives the same values and names as TRL's merge."""

from __future__ import annotations

import copy
from contextlib import nullcontext
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from trainer.lora_sync import exact_merged_params, install_exact_lora_sync

CYCLES = 1000


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(64, 64)
        self.out = nn.Linear(64, 16, bias=False)
        self.norm = nn.LayerNorm(64)

    def forward(self, x):
        return self.out(self.norm(self.proj(x)))


def bf16_lora(seed: int = 0):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    base = Tiny().to(torch.bfloat16)
    # init_lora_weights=False: B is random, so every merge changes the weights (as after training)
    return get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=["proj", "out"], init_lora_weights=False))


def base_weights(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}


def train_step(model, step: int) -> None:
    """What an optimiser step does between two syncs: the adapter moves, the base does not."""
    g = torch.Generator().manual_seed(step)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_" in n:
                p.add_(torch.randn(p.shape, generator=g, dtype=torch.float32).to(p.dtype) * 1e-3)


def fake_vllm_generation(model):
    from trl.generation.vllm_generation import VLLMGeneration

    return SimpleNamespace(model=model, _dist=SimpleNamespace(is_fsdp=False, gather_params=lambda params: nullcontext()),
                           _fix_param_name_to_vllm=lambda n, extra_prefixes=None: VLLMGeneration._fix_param_name_to_vllm(
                               None, n, extra_prefixes))


def trl_merged(model) -> dict[str, torch.Tensor]:
    """What TRL 1.16's own PEFT branch sends (merge_adapter, read, unmerge_adapter), on a copy of the model."""
    from trl.generation.vllm_generation import VLLMGeneration

    twin = copy.deepcopy(model)
    original = getattr(VLLMGeneration, "_trl_iter_named_params", VLLMGeneration._iter_named_params)
    return {n: t.clone() for n, t in original(fake_vllm_generation(twin))}


def test_trl_merge_unmerge_drifts_in_bf16():
    """The problem, measured: TRL's merge/unmerge round trip changes the frozen bf16 base weights."""
    model = bf16_lora()
    start = base_weights(model)
    for i in range(CYCLES):
        train_step(model, i)
        model.merge_adapter()
        model.unmerge_adapter()
    now = base_weights(model)
    drift = {n: (now[n].float() - start[n].float()).abs().max().item() for n in start}
    changed = sum(int((now[n] != start[n]).sum()) for n in start)
    assert changed > 0 and max(drift.values()) > 0, drift  # if peft ever becomes exact, this test says so


def test_1000_exact_syncs_leave_bf16_base_weights_bit_exact_and_send_what_trl_would():
    from trl.generation.vllm_generation import VLLMGeneration

    assert install_exact_lora_sync()
    model = bf16_lora()
    assert next(p for n, p in model.named_parameters() if "proj.base_layer.weight" in n).dtype == torch.bfloat16
    start = base_weights(model)
    gen = fake_vllm_generation(model)
    for i in range(CYCLES):
        train_step(model, i)
        if i in (0, CYCLES - 1):
            want = trl_merged(model)
            sent = {n: t.clone() for n, t in VLLMGeneration._iter_named_params(gen)}
            assert list(sent) == list(want)  # the names vLLM expects, in TRL's order
            for n in want:
                assert torch.equal(sent[n], want[n]), f"{n}: not what TRL's merge sends"
            assert not torch.equal(sent["proj.weight"], start["base_model.model.proj.base_layer.weight"])
        else:
            for _ in VLLMGeneration._iter_named_params(gen):
                pass
    now = base_weights(model)
    for n in start:
        assert torch.equal(now[n], start[n]), f"{n} drifted"
    assert not any(getattr(m, "merged", False) for m in model.modules())


def test_exact_sync_keeps_trl_path_for_non_peft_models():
    from trl.generation.vllm_generation import VLLMGeneration

    install_exact_lora_sync()
    plain = Tiny()
    names = [n for n, _ in VLLMGeneration._iter_named_params(fake_vllm_generation(plain))]
    assert names == [n for n, _ in plain.named_parameters()]


@pytest.mark.parametrize("lora_bias", [True])
def test_lora_bias_is_merged_into_a_copy_too(lora_bias):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(1)
    model = get_peft_model(Tiny().to(torch.bfloat16), LoraConfig(r=4, target_modules=["proj"], lora_bias=lora_bias,
                                                                  init_lora_weights=False))
    with torch.no_grad():
        model.base_model.model.proj.lora_B["default"].bias.add_(0.5)
    start = base_weights(model)
    sent = dict(exact_merged_params(model, lambda n, extra_prefixes=None: n))
    want = trl_merged(model)
    assert torch.equal(sent["proj.bias"], want["proj.bias"]) and torch.equal(sent["proj.weight"], want["proj.weight"])
    assert all(torch.equal(p, start[n]) for n, p in base_weights(model).items())


def test_run_stage_installs_the_exact_sync_before_any_vllm_stage(tmp_path, monkeypatch):
    """The paper preset's stage (use_vllm, CUDA mocked) patches TRL's vLLM weight iterator before it builds a
    trainer: stopped right after the patch point, TRL's iterator is the exact one; a CPU stage leaves it alone."""
    from trl.generation.vllm_generation import VLLMGeneration

    from env import generate, uniform_config, write_jsonl
    from llm_backends.models import resolve_model
    from trainer import resume as stage_resume
    from trainer import stage as train_stage
    from trainer.config import TRAIN_PRESETS, TrainConfig
    from trainer.gpu_plan import mock_cuda

    for attr in ("_iter_named_params", "_exact_lora_sync", "_trl_iter_named_params"):
        if attr in VLLMGeneration.__dict__:
            monkeypatch.setattr(VLLMGeneration, attr, VLLMGeneration.__dict__[attr])
    if VLLMGeneration.__dict__.get("_exact_lora_sync"):  # an earlier test installed it: start from TRL's own
        monkeypatch.setattr(VLLMGeneration, "_iter_named_params", VLLMGeneration._trl_iter_named_params)
    monkeypatch.setattr(VLLMGeneration, "_exact_lora_sync", False, raising=False)
    trl_own = VLLMGeneration._iter_named_params

    class Reached(Exception):
        pass

    def stop(**kw):
        raise Reached

    monkeypatch.setattr(stage_resume, "stage_key", stop)  # the first step after the patch point
    train = tmp_path / "train.jsonl"
    write_jsonl(train, generate(uniform_config(), 2, seed=0).instances)
    base = resolve_model("smollm2-135m")  # the embedded model: a loadable start (nothing is loaded before the stop)
    cpu = TrainConfig.model_validate(TRAIN_PRESETS["cpu"])
    with pytest.raises(Reached):
        train_stage.run_stage(train_path=train, init_checkpoint=base, out_dir=tmp_path / "s0", cfg=cpu, seed=0,
                              reward_state=None, progress=False, task="mapf")
    assert VLLMGeneration._iter_named_params is trl_own  # no vLLM generation: nothing patched

    paper = TrainConfig.model_validate(TRAIN_PRESETS["paper"])
    with mock_cuda(), pytest.raises(Reached):
        train_stage.run_stage(train_path=train, init_checkpoint=base, out_dir=tmp_path / "s1", cfg=paper,
                              seed=0, reward_state=None, progress=False, task="mapf")
    assert VLLMGeneration._iter_named_params is not trl_own
    assert VLLMGeneration._iter_named_params.__doc__.endswith("(trainer.lora_sync).")
    assert VLLMGeneration._trl_iter_named_params is trl_own
