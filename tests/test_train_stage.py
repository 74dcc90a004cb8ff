"""Train stage: presets, the reward wrapper's row alignment, checkpoint errors, a real smoke stage, warm start.

The slow tests train the embedded SmolLM2-135M on CPU (a few minutes in all on 2 cores).
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from env import SIZES, EnvConfig, generate, plan_text, uniform_config, verify, write_jsonl
from nodes.train_stage import (
    META_FILE,
    TRAIN_PRESETS,
    CheckpointError,
    MapfReward,
    TrainConfig,
    load_checkpoint,
    run_stage,
    train_stage,
)


def _only_size(size: int) -> EnvConfig:
    return EnvConfig.model_validate(
        {"sizes": {s: {"data_ratio": float(s == size), "hole_ratio": 0.1, "wait_ratio": 0.3} for s in SIZES}}
    )


@pytest.fixture(scope="module")
def base_model() -> Path:
    from llm.models import resolve_model

    return resolve_model("smollm2-135m")


def test_presets_validate_and_describe_every_field():
    for raw in TRAIN_PRESETS.values():
        TrainConfig.model_validate(raw)  # every preset is a valid config
    paper = TrainConfig.model_validate(TRAIN_PRESETS["paper"])
    assert (paper.instances_per_stage, paper.epochs, paper.lora, paper.use_vllm) == (4000, 2.0, True, True)
    assert TrainConfig.model_validate(TRAIN_PRESETS["cpu"]).sft_warm_start
    assert all(f.description for f in TrainConfig.model_fields.values())
    with pytest.raises(ValueError, match="no_such_knob"):
        TrainConfig.model_validate({"no_such_knob": 1})
    with pytest.raises(ValueError, match=r"sft_sizes=\[2, 11\]: allowed: .*\[3, 4, 5, 6, 7, 8, 9, 10\]"):
        TrainConfig(sft_sizes=[2, 11])
    assert TrainConfig(sft_sizes=[4, 3, 4]).sft_sizes == [3, 4]


def test_warm_start_instances_are_fresh_solvable_and_of_the_asked_sizes():
    from nodes.sft import warm_start_instances

    a = warm_start_instances([3, 4], 20, seed=5)
    assert len(a) == 20 and {x.size for x in a} == {3, 4} and all(x.num_agents == 2 for x in a)
    assert [x.id for x in a] == [x.id for x in warm_start_instances([3, 4], 20, seed=5)]  # deterministic
    assert all(verify(x, plan_text(x.plan)).optimal for x in a)  # the SFT targets are optimal plans
    stage = generate(_only_size(3), 20, seed=5).instances  # the stage's own draw with the same seed
    assert {tuple(x.grid) + (str(x.starts),) for x in stage} != {tuple(x.grid) + (str(x.starts),) for x in a}


def test_reward_wrapper_scores_each_completion_against_its_own_instance():
    insts = generate(uniform_config(), 6, seed=3).instances
    # Row i answers instance i: even rows with the optimal plan (reward 0.5 = w_acc * 1.0 at the start
    # weights), odd rows with a plan that stops short of the goal (invalid, reward 0).
    rows = []
    for i, inst in enumerate(insts):
        text = plan_text(inst.plan if i % 2 == 0 else [p[:1] for p in inst.plan])
        rows.append((inst, text))
    expected = {inst.id: verify(inst, text).valid for inst, text in rows}
    for seed in range(3):
        shuffled = rows[:]
        random.Random(seed).shuffle(shuffled)
        reward = MapfReward(None, None)
        out = reward(
            prompts=[[{"role": "user", "content": "unused"}]] * len(shuffled),  # order must not matter
            completions=[[{"role": "assistant", "content": t}] for _, t in shuffled],
            completion_ids=[[0] * 50 for _ in shuffled],
            instance=[inst.to_json() for inst, _ in shuffled],
            instance_id=[inst.id for inst, _ in shuffled],
        )
        assert [r > 0 for r in out] == [expected[inst.id] for inst, _ in shuffled]
        assert out == [0.5 if expected[inst.id] else 0.0 for inst, _ in shuffled]
    # The same answers paired with the wrong instances are not rewarded: the column is what counts.
    rotated = [rows[(i + 2) % len(rows)][0] for i in range(len(rows))]
    out = MapfReward(None, None)(
        completions=[t for _, t in rows], completion_ids=None, instance=[x.to_json() for x in rotated]
    )
    assert sum(r > 0 for r in out) == 0


def test_reward_wrapper_groups_and_state():
    inst = generate(uniform_config(), 2, seed=5).instances
    good, bad = plan_text(inst[0].plan), "no plan"
    reward = MapfReward(None, {"short_share": 0.9, "decay": 0.9, "updates": 3})
    out = reward(
        completions=[good, good, bad, bad], instance=[inst[0].to_json()] * 2 + [inst[1].to_json()] * 2
    )
    assert out[0] == pytest.approx(0.8) and out[2] == 0.0  # weights (0.8, 0.2) at share 0.9
    assert reward.history[-1]["zero_std_groups"] == 1.0  # both groups have one reward each: no signal
    assert reward.state.updates == 4


def test_missing_or_corrupt_previous_checkpoint_is_a_clear_error(tmp_path, base_model):
    train = tmp_path / "train.jsonl"
    write_jsonl(train, generate(uniform_config(), 2, seed=0).instances)
    cfg = TrainConfig.model_validate(TRAIN_PRESETS["smoke"])
    kw = dict(train_path=train, out_dir=tmp_path / "stage_1", cfg=cfg, seed=0, reward_state=None)

    missing = tmp_path / "stage_0" / "checkpoint"
    with pytest.raises(CheckpointError, match=r"stage_0/checkpoint does not exist"):
        run_stage(init_checkpoint=missing, **kw)
    # The graph node must not fall back to the base model either.
    runtime = SimpleNamespace(
        context=SimpleNamespace(
            settings=SimpleNamespace(train=cfg, policy_model="smollm2-135m", seed=0), run_dir=tmp_path
        )
    )
    with pytest.raises(CheckpointError, match="does not exist"):
        train_stage(
            {"stage": 1, "train_path": str(train), "checkpoint": str(missing), "reward_state": {}}, runtime
        )

    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    for f in base_model.iterdir():  # everything but the weights, which are garbage
        if f.suffix != ".safetensors":
            shutil.copy(f, corrupt / f.name)
    (corrupt / "model.safetensors").write_bytes(b"\x00garbage")
    (corrupt / META_FILE).write_text(json.dumps({"is_lora": False, "base_model": str(base_model)}))
    with pytest.raises(CheckpointError, match="model.safetensors is corrupt"):
        run_stage(init_checkpoint=corrupt, **kw)
    with pytest.raises(CheckpointError, match="corrupt"):
        load_checkpoint(corrupt)

    lora = tmp_path / "lora"
    lora.mkdir()
    (lora / META_FILE).write_text(json.dumps({"is_lora": True, "base_model": str(base_model)}))
    with pytest.raises(CheckpointError, match="missing adapter_config.json, adapter_model.safetensors"):
        load_checkpoint(lora)
    (lora / META_FILE).write_text("{not json")
    with pytest.raises(CheckpointError, match="unreadable"):
        load_checkpoint(lora)
    assert not (tmp_path / "stage_1" / "checkpoint").exists()


@pytest.mark.slow
def test_smoke_stage_trains_writes_and_resumes(tmp_path, base_model):
    import torch

    train = tmp_path / "train.jsonl"
    write_jsonl(train, generate(_only_size(3), 8, seed=11).instances)
    cfg = TrainConfig.model_validate(TRAIN_PRESETS["smoke"])
    runtime = SimpleNamespace(
        context=SimpleNamespace(
            settings=SimpleNamespace(train=cfg, policy_model=str(base_model), seed=7), run_dir=tmp_path
        )
    )
    state = {"stage": 0, "train_path": str(train), "checkpoint": None, "reward_state": {}}
    update = train_stage(state, runtime)

    ckpt = Path(update["checkpoint"])
    assert ckpt == tmp_path / "stage_0" / "checkpoint"
    meta = json.loads((ckpt / META_FILE).read_text())
    assert meta["is_lora"] is False and meta["base_model"] == str(base_model)
    assert meta["reward_state"] == update["reward_state"] and update["reward_state"]["updates"] >= 1

    model, _ = load_checkpoint(ckpt)
    start, _ = load_checkpoint(base_model)
    after, before = dict(model.named_parameters()), dict(start.named_parameters())
    changed = [n for n in after if not torch.equal(after[n], before[n])]
    assert changed, "no weight changed during the stage"
    # (GRPO alone moves no weight when every group has zero reward spread, as 24-token answers mostly do;
    # the smoke preset's 2 SFT steps guarantee a change, and the metrics record the dead signal.)

    metrics = json.loads((tmp_path / "stage_0" / "metrics.json").read_text())
    assert metrics == json.loads(json.dumps(update["train_metrics"], default=str))
    for key in (
        "train/reward_mean",
        "train/reward_std",
        "train/zero_std_groups",
        "train/steps",
        "train/seconds_per_step",
        "train/outside_loop_share",
        "train/valid_rate",
    ):
        assert key in metrics, key
    assert metrics["train/steps"] == cfg.max_steps
    assert metrics["train/completions"] == cfg.max_steps * cfg.per_device_train_batch_size
    assert 0.0 <= metrics["train/zero_std_groups"] <= 1.0
    assert metrics["sft/steps"] == cfg.sft_steps
    assert metrics["sft/examples"] == cfg.sft_instances  # fresh 3x3 warm-start instances, not the stage's 8
    assert any((tmp_path / "stage_0" / "tb").rglob("events.out.tfevents.*"))

    # Stage 1 continues from stage 0's checkpoint and its saved reward state (LoRA on top of it).
    lora_cfg = cfg.model_copy(update={"lora": True, "lora_r": 4, "lora_alpha": 8, "max_steps": 1})
    res = run_stage(
        train_path=train,
        init_checkpoint=ckpt,
        out_dir=tmp_path / "stage_1",
        cfg=lora_cfg,
        seed=1,
        reward_state=None,
    )
    assert res["reward_state"]["updates"] == update["reward_state"]["updates"] + 1
    lmeta = json.loads((Path(res["checkpoint"]) / META_FILE).read_text())
    assert lmeta["is_lora"] and (Path(res["checkpoint"]) / "adapter_model.safetensors").exists()
    lmodel, _ = load_checkpoint(res["checkpoint"])
    from peft import PeftModel

    assert isinstance(lmodel, PeftModel)


@pytest.mark.slow
def test_warm_start_on_3x3_gives_valid_plans_on_held_out_3x3(tmp_path):
    from llm.models import resolve_model
    from nodes.sft import greedy_valid_rate, warm_start
    from nodes.train_stage import freeze_lower_layers

    def key(x):  # what the model sees: the map and the agents' starts and goals
        return (tuple(x.grid), str(x.starts), str(x.goals))

    train = generate(_only_size(3), 32, seed=1).instances
    seen = {key(x) for x in train}
    # 3x3 maps repeat across draws: keep only held-out instances the warm start never saw
    held_out = [x for x in generate(_only_size(3), 24, seed=2).instances if key(x) not in seen][:8]
    assert len(held_out) == 8 and not {key(x) for x in held_out} & seen
    model, tok = load_checkpoint(resolve_model("smollm2-135m"))
    freeze_lower_layers(model, 8)
    cfg = TrainConfig(
        sft_steps=12, sft_lr=3e-4, sft_batch_size=4, max_prompt_length=600, max_completion_length=100
    )
    out = warm_start(model, tok, train, cfg=cfg, out_dir=tmp_path / "ws", seed=0, progress=False)
    assert out["steps"] == 12 and out["loss_last"] < out["loss"] * 2
    result = greedy_valid_rate(model, tok, held_out, max_new_tokens=72)
    assert result["valid_rate"] > 0, result
