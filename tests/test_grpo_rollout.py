"""GRPO's rollout copy and bf16 autocast (issue 16): completions sampled by a bf16 copy of the policy that follows
every optimiser step, training under autocast over float32 weights; where each is on, and where it is not."""

from __future__ import annotations

import pytest
import torch

from nodes.train_config import TRAIN_PRESETS, TrainConfig
from nodes.trl_setup import rollout_dtype, use_autocast


@pytest.mark.parametrize("amx", [True, False])
def test_auto_follows_the_cpu_and_explicit_values_win(monkeypatch, amx):
    monkeypatch.setattr("llm_backends.vllm_server.cpu_has_amx", lambda *a: amx)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    fp32 = torch.nn.Linear(2, 2)
    assert rollout_dtype(TrainConfig(), fp32) == ("bfloat16" if amx else None)
    assert use_autocast(TrainConfig()) is amx
    assert rollout_dtype(TrainConfig(rollout_dtype="bfloat16"), fp32) == "bfloat16"
    assert rollout_dtype(TrainConfig(rollout_dtype="model"), fp32) is None
    assert use_autocast(TrainConfig(autocast_bf16=False)) is False
    assert use_autocast(TrainConfig(autocast_bf16=True)) is True
    # never a copy of a bf16 model, of a peft adapter, or beside vLLM; never autocast over bf16 weights
    assert rollout_dtype(TrainConfig(rollout_dtype="bfloat16"), fp32.to(torch.bfloat16)) is None
    adapter = torch.nn.Linear(2, 2)
    adapter.peft_config = {}
    assert rollout_dtype(TrainConfig(rollout_dtype="bfloat16"), adapter) is None
    assert rollout_dtype(TrainConfig(rollout_dtype="bfloat16", use_vllm=True), fp32) is None
    assert use_autocast(TrainConfig(bf16=True, autocast_bf16=True)) is False


def test_cuda_gets_neither(monkeypatch):
    monkeypatch.setattr("llm_backends.vllm_server.cpu_has_amx", lambda *a: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert rollout_dtype(TrainConfig(), torch.nn.Linear(2, 2)) is None
    assert use_autocast(TrainConfig(bf16=False)) is False


def test_smoke_pins_float32_and_bad_values_are_named():
    smoke = TrainConfig.model_validate(TRAIN_PRESETS["smoke"])
    assert smoke.rollout_dtype == "model" and smoke.autocast_bf16 is False
    with pytest.raises(ValueError, match="rollout_dtype"):
        TrainConfig(rollout_dtype="float16")


@pytest.mark.slow
def test_rollout_copy_samples_with_its_own_bf16_weights_and_follows_training(embedded_model_path, tmp_path):
    """A real TRL run of 2 steps: every completion comes from the bf16 copy (the trained model's forward is never
    called while generating), the copy is re-synced after the optimiser step, and training keeps float32 weights
    under autocast."""
    from datasets import Dataset

    from llm_backends.checkpoints import load_checkpoint
    from nodes.grpo_sampling import make_trainer_class
    from nodes.trl_setup import grpo_config

    model, tok = load_checkpoint(embedded_model_path, trainable=True)
    rows = [{"prompt": [{"role": "user", "content": f"Say a number ({i})."}]} for i in range(8)]

    def reward(completions, **kw):
        return [float(len(c[0]["content"]) % 5) for c in completions]

    reward.__name__ = "toy"
    cfg = TrainConfig.model_validate({**TRAIN_PRESETS["smoke"], "max_steps": 2, "max_completion_length": 8,
                                      "num_generations": 2, "per_device_train_batch_size": 4, "train_layers": 1,
                                      "learning_rate": 1e-3, "rollout_dtype": "bfloat16", "autocast_bf16": True})
    trainer = make_trainer_class()(
        model=model, reward_funcs=[reward], args=grpo_config(cfg, tmp_path, 0, progress=False),
        train_dataset=Dataset.from_list(rows), processing_class=tok, rollout_dtype=rollout_dtype(cfg, model),
    )
    assert trainer.args.bf16  # accelerate's autocast ...
    calls = {"trained": 0, "copy": 0, "generating": False}
    model.model.layers[0].register_forward_hook(
        lambda *a: calls.__setitem__("trained", calls["trained"] + calls["generating"]))
    orig = trainer._generate_single_turn

    def spy(*a, **kw):
        calls["generating"] = True
        try:
            return orig(*a, **kw)
        finally:
            calls["generating"] = False

    trainer._generate_single_turn = spy
    first = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer.train()

    copy = trainer.rollout.model
    assert copy is not None and copy is not model
    copy.model.layers[0].register_forward_hook(lambda *a: calls.__setitem__("copy", calls["copy"] + 1))
    trainer._generate_single_turn([tok("Say a number.").input_ids] * 2, None, {}, 2)
    assert calls["copy"] > 0 and calls["trained"] == 0  # sampling never ran the trained model
    assert trainer.rollout.syncs >= 1  # re-synced after the first optimiser step
    assert all(p.dtype == torch.bfloat16 for p in copy.parameters())
    assert copy.lm_head.weight is copy.model.embed_tokens.weight  # still tied
    buffers = dict(model.named_buffers())
    for n, b in copy.named_buffers():  # RoPE's inv_freq and the like stay float32, as in a model loaded in bf16
        assert b.dtype == buffers[n].dtype and torch.equal(b, buffers[n]), n
    assert all(p.dtype == torch.float32 for p in model.parameters())  # ... over float32 weights
    top = f"model.layers.{len(model.model.layers) - 1}.mlp.down_proj.weight"
    assert not torch.equal(first[top], model.state_dict()[top])  # the top block trained
    trainer.rollout.synced(model, step=trainer.state.global_step + 1)  # the next step's sync
    params = dict(copy.named_parameters())
    for n, p in model.named_parameters():  # trained and frozen weights alike: the policy, in bf16
        assert torch.equal(params[n], p.detach().to(torch.bfloat16)), n
