"""The SFT term in GRPO's loss (`trainer.sft_mix`): its answers, its batching, its setting and a real stage with it."""

from __future__ import annotations

from pathlib import Path

import pytest

from env import load_split, parse_plan, write_jsonl
from tests.support.small_maps import three_by_three
from trainer.config import TRAIN_PRESETS, TrainConfig
from trainer.sft_mix import SftMix, batch_tensors, sft_examples


def _true_logps(model, ids, attn, keep):
    """Log-probs of the last `keep` tokens of each row, straight from the model's logits."""
    import torch

    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attn).logits[:, -keep - 1:-1].float()
    return torch.log_softmax(logits, -1).gather(-1, ids[:, -keep:, None])[..., 0], None


def test_solver_answers_parse_back_end_with_eos_and_skip_evaluation_layouts(embedded_policy):
    from env.library import prompt_messages

    _, tok = embedded_policy
    insts = three_by_three(5, seed=21)
    held = next(i for i in load_split("val-small") if i.num_agents == 2 and i.size == 3)
    examples = sft_examples([*insts, held], tok, "compact")
    from trainer.data import _eval_layouts, _layout

    fresh = [i for i in insts if _layout(i) not in _eval_layouts()]
    assert len(examples) == len(fresh) >= 1  # the evaluation instance is left out
    for inst, (prompt, answer) in zip(fresh, examples, strict=True):
        assert answer[-1] == tok.eos_token_id
        assert parse_plan(tok.decode(answer[:-1]), inst.num_agents) == [list(map(tuple, p)) for p in inst.plan]
        text = tok.apply_chat_template(prompt_messages(inst, "compact"), add_generation_prompt=True, tokenize=False)
        assert prompt == tok(text, add_special_tokens=False)["input_ids"]


def test_padded_batch_scores_each_answer_as_alone(embedded_policy):
    """The NLL of a padded draw equals the token-weighted mean of each example scored alone, unpadded."""
    import torch

    model, tok = embedded_policy
    examples = sft_examples(three_by_three(3, seed=5), tok, "compact")
    examples = [examples[0], (examples[1][0][:-7], examples[1][1][:3])]  # different prompt and answer lengths
    mix = SftMix(examples, weight=1.0, batch=2, seed=0, pad_id=tok.pad_token_id)
    got = float(mix.nll(_true_logps, model, "cpu"))
    total, n = 0.0, 0
    for p, a in examples:
        ids = torch.tensor([p + a])
        lp = _true_logps(model, ids, torch.ones_like(ids), len(a))[0]
        total, n = total - float(lp.sum()), n + len(a)
    assert got == pytest.approx(total / n, rel=1e-4)
    assert mix.metrics()["train/sft_mix_batches"] == 1 and mix.metrics()["train/sft_mix_nll"] == pytest.approx(got)


def test_batch_tensors_pads_prompts_left_and_answers_right():
    b = batch_tensors([([5, 6], [7]), ([1, 2, 3], [8, 9])], pad_id=0)
    assert b["input_ids"].tolist() == [[0, 5, 6, 7, 0], [1, 2, 3, 8, 9]]
    assert b["attention_mask"].tolist() == [[0, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    assert b["answer_mask"].tolist() == [[1, 0], [1, 1]] and b["logits_to_keep"] == 2


def test_setting_is_bounded_and_an_empty_pool_is_refused():
    assert TrainConfig().sft_mix == 0.0
    with pytest.raises(ValueError, match="sft_mix"):
        TrainConfig(sft_mix=-0.5)
    with pytest.raises(ValueError, match="sft_mix_batch"):
        TrainConfig(sft_mix_batch=0)
    with pytest.raises(ValueError, match="evaluation split"):
        SftMix([], weight=1.0, batch=4, seed=0, pad_id=0)
    assert SftMix([], weight=0.0, batch=4, seed=0, pad_id=0).metrics()["train/sft_mix_batches"] == 0


@pytest.mark.slow
def test_stage_with_the_sft_term_learns_the_solver_answers(tmp_path):
    """Two real smoke stages from the same start and seed, with and without the term: only the one with it moves
    the policy towards the solver's answers of its instances, and it reports one SFT batch per micro-batch."""
    import torch

    from llm_backends.checkpoints import load_checkpoint
    from llm_backends.models import resolve_model
    from trainer.stage import run_stage

    base = resolve_model("smollm2-135m")
    train = tmp_path / "train.jsonl"
    insts = three_by_three(8, seed=13)
    write_jsonl(train, insts)
    nll = {}
    for weight in (0.0, 5.0):
        cfg = TrainConfig.model_validate({**TRAIN_PRESETS["smoke"], "max_steps": 3, "sft_warm_start": False,
                                          "sft_mix": weight, "sft_mix_batch": 4})
        res = run_stage(train_path=train, init_checkpoint=base, out_dir=tmp_path / f"w{weight}", cfg=cfg, seed=1,
                        reward_state=None, progress=False)
        m = res["metrics"]
        model, tok = load_checkpoint(Path(res["checkpoint"]))
        examples = sft_examples(insts, tok, "compact")
        with torch.no_grad():
            nll[weight] = float(SftMix(examples, weight=1.0, batch=len(examples), seed=0,
                                       pad_id=tok.pad_token_id).nll(_true_logps, model.float(), "cpu"))
        if weight:
            assert m["train/sft_mix_batches"] == m["train/steps"] * cfg.gradient_accumulation_steps == 3
            assert m["train/sft_mix_examples"] == len(examples) and m["train/sft_mix_nll"] > 0
        else:
            assert "train/sft_mix_batches" not in m
    assert nll[5.0] < 0.8 * nll[0.0], nll

