"""One tiny GRPO step through the project's trainer, in seconds: the quick tier's trainer check.

A two-block random Llama with the embedded model's tokenizer stands in for the policy, so the step exercises
the project's code (the smoke preset's TrainConfig, `grpo_config`, the dynamic-sampling trainer class, TRL)
without loading or training the real model. The slow tests train the embedded model itself.
"""

from __future__ import annotations

import pytest

from trainer.config import TRAIN_PRESETS, TrainConfig


@pytest.fixture(scope="module")
def tiny_policy(embedded_model_path):
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(embedded_model_path)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=1024, tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    ))
    return model, tok


def test_one_grpo_step_on_mapf_prompts_moves_the_weights(tiny_policy, tmp_path):
    import torch
    from datasets import Dataset

    import env
    from env.library import prompt_messages
    from trainer.grpo_trainer import make_trainer_class
    from trainer.trl_setup import grpo_config

    model, tok = tiny_policy
    insts = env.generate(env.random_config(seed=0), n=4, seed=0).instances
    rows = [{"prompt": prompt_messages(inst, "compact"), "key": i % 2} for i, inst in enumerate(insts)]

    def reward(completions, **kw):  # toy signal: the random policy is never right on MAPF
        return [float(len(c[0]["content"]) % 5) for c in completions]

    reward.__name__ = "toy"
    cfg = TrainConfig.model_validate({**TRAIN_PRESETS["smoke"], "max_steps": 1, "max_completion_length": 8,
                                      "num_generations": 2, "per_device_train_batch_size": 2,
                                      "learning_rate": 1e-2})
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    args = grpo_config(cfg.model_copy(update={"resample_rounds": 1}), tmp_path, 0, progress=False)
    args.group_key = "key"  # every knob of the trainer is a field of its config (trainer.grpo_config)
    assert (args.resample_rounds, args.resample_seed, args.rollout_dtype) == (1, 0, "model")
    trainer = make_trainer_class(use_vllm=False)(
        model=model, reward_funcs=[reward], args=args, train_dataset=Dataset.from_list(rows), processing_class=tok,
    )
    trainer.train()
    assert trainer.state.global_step == 1
    assert trainer.stats["groups"] >= 1
    assert any(not torch.equal(before[n], p.detach()) for n, p in model.named_parameters())
