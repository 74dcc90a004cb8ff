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

from env import SIZES, EnvConfig, Instance, generate, plan_text, uniform_config, verify, write_jsonl
from env.library import prompt_messages
from env.task import MapfReward, MapfTask
from llm_backends.checkpoints import META_FILE, CheckpointError, load_checkpoint, save_checkpoint
from nodes.train_stage import train_stage
from trainer.config import TRAIN_PRESETS, TrainConfig
from trainer.data import build_dataset
from trainer.stage import init_from_arg, main, run_stage
from trainer.trl_setup import check_generation_backend, freeze_lower_layers, tb_callback


def _only_size(size: int) -> EnvConfig:
    return EnvConfig.model_validate(
        {"sizes": {s: {"data_ratio": float(s == size), "hole_ratio": 0.1, "wait_ratio": 0.3} for s in SIZES}}
    )


@pytest.fixture(scope="module")
def base_model() -> Path:
    from llm_backends.models import resolve_model

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

    def key(x):  # what the model sees: the map and the agents' starts and goals
        return (tuple(x.grid), str(x.starts), str(x.goals))

    a = MapfTask().warm_start_items([3, 4], 20, seed=5)
    assert len(a) == 20 and {x.size for x in a} == {3, 4} and all(x.num_agents == 2 for x in a)
    assert [x.id for x in a] == [x.id for x in MapfTask().warm_start_items([3, 4], 20, seed=5)]  # deterministic
    assert all(verify(x, plan_text(x.plan)).optimal for x in a)  # the SFT targets are optimal plans
    # A stage drawing the very same sizes and knobs with the same seed gets other instances: the warm start
    # has a seed of its own. (Drawn with the stage's seed, the two lists would be equal element by element.)
    same_knobs = EnvConfig.model_validate(
        {"sizes": {s: {"data_ratio": 0.5 * (s in (3, 4)), "hole_ratio": 0.2, "wait_ratio": 0.5} for s in SIZES}}
    )
    stage = generate(same_knobs, 20, seed=5).instances
    assert sorted(x.size for x in stage) == sorted(x.size for x in a)  # same knobs: same mix of sizes
    assert sum(key(x) == key(y) for x, y in zip(stage, a, strict=True)) < len(a) // 2


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
            prompts=[prompt_messages(inst) for inst, _ in shuffled],  # each row's own prompt, as TRL passes it
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
    # ... and when the prompts are passed too, a prompt that shows another map than its row's instance is
    # a misaligned batch: an error naming the row, never a silent score against the wrong map.
    with pytest.raises(ValueError, match=r"row 0: its prompt is not the prompt of its instance .* misaligned"):
        MapfReward(None, None)(
            prompts=[prompt_messages(inst) for inst, _ in rows],
            completions=[t for _, t in rows],
            instance=[x.to_json() for x in rotated],
        )
    with pytest.raises(ValueError, match="6 completions but 5 prompts"):
        MapfReward(None, None)(
            prompts=[prompt_messages(inst) for inst, _ in rows[:5]],
            completions=[t for _, t in rows],
            instance=[inst.to_json() for inst, _ in rows],
        )


def test_dataset_rows_pass_the_reward_prompt_check_in_any_order(base_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(base_model)
    insts = generate(uniform_config(), 12, seed=8).instances
    data, dropped = build_dataset(insts, tok, max_prompt_length=4096, task="mapf")
    assert dropped == 0 and len(data) == len(insts)
    rows = [data[i] for i in range(len(data))]
    random.Random(0).shuffle(rows)  # as TRL's sampler would
    # The prompt TRL hands the reward is the row's `prompt` column: it renders exactly the row's instance.
    out = MapfReward(tok, None)(
        prompts=[r["prompt"] for r in rows],
        completions=[plan_text(Instance.from_json(r["item"]).plan) for r in rows],
        instance=[r["item"] for r in rows],
    )
    assert all(x > 0 for x in out)  # optimal plans against their own instances
    with pytest.raises(ValueError, match="misaligned"):
        MapfReward(tok, None)(
            prompts=[r["prompt"] for r in rows[1:] + rows[:1]],
            completions=["no plan"] * len(rows),
            instance=[r["item"] for r in rows],
        )


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


def test_reward_wrapper_partial_credit_gives_a_group_of_invalid_answers_variance():
    from pydantic import ValidationError

    inst = generate(uniform_config(), 1, seed=5).instances[0]
    assert inst.starts[0] != inst.goals[0]
    good = plan_text(inst.plan)
    half = plan_text([[inst.starts[0]], *inst.plan[1:]])  # agent 0 never leaves its start; the others are sound
    cols = dict(completions=[good, half, "no plan", half, "no plan"], instance=[inst.to_json()] * 5)
    share = (inst.num_agents - 1) / inst.num_agents
    gated = MapfReward(None, {"short_share": 0.9})(**cols)
    assert gated == [pytest.approx(0.8), 0.0, 0.0, 0.0, 0.0]
    reward = MapfReward(None, {"short_share": 0.9}, partial_credit=0.2)
    out = reward(**cols)
    assert out == [pytest.approx(0.8), pytest.approx(0.8 * 0.2 * share), 0.0, pytest.approx(0.8 * 0.2 * share), 0.0]
    # the same invalid answers without the valid one: no signal under the gated reward, some under partial credit
    cols = dict(completions=[half, "no plan"], instance=[inst.to_json()] * 2)
    gated_reward = MapfReward(None, None)
    gated_reward(**cols)
    assert gated_reward.history[-1]["zero_std_groups"] == 1.0
    reward(**cols)
    assert reward.history[-1]["zero_std_groups"] == 0.0
    with pytest.raises(ValueError, match=r"partial_credit 0.3: allowed: 0 <= partial_credit < 0.3"):
        MapfReward(None, None, partial_credit=0.3)
    with pytest.raises(ValidationError, match="partial_credit"):
        TrainConfig(partial_credit=0.3)
    with pytest.raises(ValueError, match=r"partial_credit_kind 'far': allowed: goal, progress"):
        MapfReward(None, None, partial_credit=0.2, partial_credit_kind="far")
    with pytest.raises(ValidationError, match="partial_credit_kind"):
        TrainConfig(partial_credit_kind="far")
    # progress: agent 0 walks half way to its goal and stops; under "goal" it counts 0, under "progress" half
    p0 = inst.plan[0]
    assert len(p0) >= 3  # a prefix past the start, short of the goal
    halfway = plan_text([p0[: (len(p0) + 1) // 2], *inst.plan[1:]])
    cols = dict(completions=[halfway], instance=[inst.to_json()])
    goal = MapfReward(None, {"short_share": 0.9}, partial_credit=0.2)(**cols)
    prog = MapfReward(None, {"short_share": 0.9}, partial_credit=0.2, partial_credit_kind="progress")(**cols)
    assert goal == [pytest.approx(0.8 * 0.2 * share)]
    assert prog[0] > goal[0]


def test_missing_or_corrupt_previous_checkpoint_is_a_clear_error(tmp_path, base_model):
    train = tmp_path / "train.jsonl"
    write_jsonl(train, generate(uniform_config(), 2, seed=0).instances)
    cfg = TrainConfig.model_validate(TRAIN_PRESETS["smoke"])
    kw = dict(train_path=train, out_dir=tmp_path / "stage_1", cfg=cfg, seed=0, reward_state=None, task="mapf")

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
    # ... nor when the state holds no checkpoint at all after stage 0 (only stage 0 starts from the base).
    for empty in (None, ""):
        with pytest.raises(CheckpointError, match=r"stage 2: the state holds no checkpoint .* stage 1's training"):
            train_stage({"stage": 2, "train_path": str(train), "checkpoint": empty, "reward_state": {}}, runtime)

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


def test_cli_init_that_looks_like_a_missing_folder_is_a_clear_error(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    for text in ("runs/x/stage_0/checkpoint", "runs/x", "./stage_0/checkpoint", str(tmp_path / "nope"), "~/no/such"):
        with pytest.raises(CheckpointError, match=r"no such checkpoint folder"):
            init_from_arg(text)
    # An `org/name` id (no local folder `org`) and the embedded model's short name still go to resolve_model.
    asked = []
    monkeypatch.setattr("llm_backends.models.resolve_model", lambda name: asked.append(name) or tmp_path)
    assert init_from_arg("Qwen/Qwen3-4B") == tmp_path and init_from_arg("smollm2-135m") == tmp_path
    assert asked == ["Qwen/Qwen3-4B", "smollm2-135m"]
    assert init_from_arg("runs") == Path("runs")  # an existing folder is used as it is

    args = ["--task", "mapf", "--train-path", "t.jsonl", "--out", "stage_1", "--preset", "smoke"]
    with pytest.raises(SystemExit):
        main([*args, "--init", "runs/x/stage_0/checkpoint"])
    err = capsys.readouterr().err
    assert "--init runs/x/stage_0/checkpoint: no such checkpoint folder" in err and "Hugging Face" not in err
    assert not (tmp_path / "stage_1").exists()


def test_vllm_without_cuda_is_refused_before_any_work(tmp_path, monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    paper = TrainConfig.model_validate(TRAIN_PRESETS["paper"])
    check_generation_backend(paper.model_copy(update={"use_vllm": False}))  # transformers generation: fine
    why = r"use_vllm=True \(vllm_mode=colocate\) needs a CUDA GPU.*vLLM's CPU backend.*Set use_vllm=False"
    with pytest.raises(ValueError, match=why):
        check_generation_backend(paper)
    # run_stage refuses it first, before the (here missing) training set and checkpoint are even looked at
    with pytest.raises(ValueError, match=why):
        run_stage(
            train_path=tmp_path / "missing.jsonl",
            init_checkpoint=tmp_path / "missing",
            out_dir=tmp_path / "stage_0",
            cfg=paper,
            seed=0,
            reward_state=None,
            task="mapf",
        )
    assert not (tmp_path / "stage_0").exists()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit):
        main(["--task", "mapf", "--train-path", "t.jsonl", "--init", "Qwen/Qwen3-4B", "--out", "s0", "--preset", "paper"])
    assert "needs a CUDA GPU" in capsys.readouterr().err  # before any hub download of --init


def test_only_process_zero_writes_checkpoint_and_tb(tmp_path):

    class Trainer:  # the two Trainer/accelerate calls save_checkpoint makes, in one process of several
        def __init__(self, zero: bool):
            self.zero, self.waits = zero, 0
            self.accelerator = SimpleNamespace(wait_for_everyone=self._wait)

        def _wait(self):
            self.waits += 1

        def is_world_process_zero(self):
            return self.zero

        def save_model(self, folder):  # transformers writes on process zero only
            if self.zero:
                Path(folder).mkdir()
                (Path(folder) / "model.safetensors").write_text("w")

    out = tmp_path / "checkpoint"
    stale = out.with_name("checkpoint.tmp")
    stale.mkdir()
    other = Trainer(zero=False)
    assert save_checkpoint(other, out, {"is_lora": False}) == out
    assert stale.exists() and not out.exists() and other.waits == 2  # touched nothing, met the barriers
    zero = Trainer(zero=True)
    save_checkpoint(zero, out, {"is_lora": False})
    assert json.loads((out / META_FILE).read_text()) == {"is_lora": False} and not stale.exists()
    assert tb_callback(tmp_path / "tb_other", main=False).tb_writer is None
    assert not (tmp_path / "tb_other").exists()


def test_accelerate_configs_load_and_are_documented():
    from accelerate.commands.config.config_args import load_config_from_file

    import trainer.stage as ts

    root = Path(__file__).resolve().parents[1] / "configs" / "accelerate"
    kinds = {f.name: str(load_config_from_file(str(f)).distributed_type) for f in sorted(root.glob("*.yaml"))}
    assert kinds == {"deepspeed_zero2.yaml": "DistributedType.DEEPSPEED", "multi_gpu.yaml": "DistributedType.MULTI_GPU"}
    for name in kinds:
        assert f"configs/accelerate/{name}" in ts.__doc__
        assert "accelerate launch --config_file configs/accelerate/" in (root / name).read_text()


@pytest.mark.slow
def test_smoke_stage_trains_writes_and_resumes(tmp_path, base_model):
    import torch

    train = tmp_path / "train.jsonl"
    write_jsonl(train, generate(_only_size(3), 8, seed=11).instances)
    cfg = TrainConfig.model_validate(TRAIN_PRESETS["smoke"]).model_copy(update={"max_steps": 1})
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
    assert meta["rollout_dtype"] == "model" and meta["autocast_bf16"] is False  # smoke pins float32, recorded
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
    # TensorBoard holds the stable names the docstring promises (TRL's, ours, per-stage summaries, SFT's).
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    def scalar_tags(folder: Path) -> set[str]:
        acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
        acc.Reload()
        return set(acc.Tags()["scalars"])

    grpo_tags = scalar_tags(tmp_path / "stage_0" / "tb")
    for tag in (
        "train/reward",
        "train/reward_std",
        "train/loss",
        "train/frac_reward_zero_std",
        "train/zero_std_groups",
        "train/valid_rate",
        "train/optimal_rate",
        "train/w_acc",
        "train/w_len",
        "train/completion_tokens",
        "stage/train/reward_mean",
        "stage/train/zero_std_groups",
        "stage/train/outside_loop_share",
        "stage/sft/loss",
    ):
        assert tag in grpo_tags, (tag, sorted(grpo_tags))
    assert "train/loss" in scalar_tags(tmp_path / "stage_0" / "tb" / "sft")
    del model, start, after, before

    # Stage 1 continues from stage 0's checkpoint and its saved reward state (LoRA on top of it).
    lora_cfg = cfg.model_copy(update={"lora": True, "lora_r": 4, "lora_alpha": 8, "max_steps": 1})
    res = run_stage(
        train_path=train,
        init_checkpoint=ckpt,
        out_dir=tmp_path / "stage_1",
        cfg=lora_cfg,
        seed=1,
        reward_state=None,
        task="mapf",
    )
    assert res["reward_state"]["updates"] == update["reward_state"]["updates"] + 1
    lora_dir = Path(res["checkpoint"])
    lmeta = json.loads((lora_dir / META_FILE).read_text())
    assert lmeta["is_lora"] and (lora_dir / "adapter_model.safetensors").exists()
    # The adapter was trained on stage 0's fine-tuned weights, so both records name that folder ...
    assert lmeta["base_model"] == str(ckpt.resolve())
    adapter_cfg = json.loads((lora_dir / "adapter_config.json").read_text())
    assert Path(adapter_cfg["base_model_name_or_path"]).resolve() == ckpt.resolve()
    from peft import PeftModel

    lmodel, tok = load_checkpoint(lora_dir)
    assert isinstance(lmodel, PeftModel)
    # ... and the reload computes what the adapter on stage 0's weights computes, not the adapter on the
    # original base model (which would silently drop stage 0's training).
    on_stage0 = PeftModel.from_pretrained(load_checkpoint(ckpt)[0], str(lora_dir))
    on_base = PeftModel.from_pretrained(load_checkpoint(base_model)[0], str(lora_dir))
    ids = tok(["<answer>\nAgent 0: (0,0) (0,1)\nAgent 1: (1,1) (1,0)\n</answer>"], return_tensors="pt")
    with torch.no_grad():
        got, want, wrong = (m.eval()(**ids).logits for m in (lmodel, on_stage0, on_base))
    assert torch.allclose(got, want, atol=1e-5)
    assert not torch.allclose(got, wrong, atol=1e-3)


def _answer_nll(model, tok, instances, style: str) -> float:
    """Mean negative log-likelihood per answer token of the solver's plans after their chat prompts."""
    import torch


    model.eval()
    total = count = 0.0
    with torch.no_grad():
        for inst in instances:
            prompt = tok.apply_chat_template(prompt_messages(inst, style), add_generation_prompt=True, tokenize=False)
            p_ids = tok(prompt, add_special_tokens=False)["input_ids"]
            a_ids = tok(MapfTask().gold(inst), add_special_tokens=False)["input_ids"]
            ids = torch.tensor([p_ids + a_ids])
            labels = torch.tensor([[-100] * len(p_ids) + a_ids])
            total += float(model(input_ids=ids, labels=labels).loss) * len(a_ids)
            count += len(a_ids)
    model.train()
    return total / count


@pytest.mark.slow
def test_warm_start_on_3x3_gives_valid_plans_on_held_out_3x3(tmp_path):
    from llm_backends.models import resolve_model
    from trainer.greedy import greedy_valid_rate
    from trainer.sft import warm_start

    def key(x):  # what the model sees: the map and the agents' starts and goals
        return (tuple(x.grid), str(x.starts), str(x.goals))

    train = generate(_only_size(3), 32, seed=1).instances
    seen = {key(x) for x in train}
    # 3x3 maps repeat across draws: keep only held-out instances the warm start never saw
    held_out = [x for x in generate(_only_size(3), 24, seed=2).instances if key(x) not in seen][:8]
    assert len(held_out) == 8 and not {key(x) for x in held_out} & seen
    model, tok = load_checkpoint(resolve_model("smollm2-135m"))
    freeze_lower_layers(model, 8)
    cfg = TrainConfig(  # the short recipe this test pins (constant rate), not the cpu preset's; the cpu preset's
        # compact prompt (175 tokens on a 3x3 map, the full one 444): the 12 steps and the answers cost far less
        sft_steps=12, sft_lr=3e-4, sft_batch_size=4, max_prompt_length=600, max_completion_length=100,
        prompt_style="compact", sft_lr_scheduler="constant", sft_warmup_ratio=0.0,
    )
    nll_before = _answer_nll(model, tok, train[:6], cfg.prompt_style)
    out = warm_start(model, tok, train, cfg=cfg, out_dir=tmp_path / "ws", seed=0, progress=False, task="mapf")
    assert out["steps"] == 12
    # The warm start taught the training plans: their per-token negative log-likelihood at least halves.
    nll_after = _answer_nll(model, tok, train[:6], cfg.prompt_style)
    assert nll_after < 0.5 * nll_before, (nll_before, nll_after)
    result = greedy_valid_rate(model, tok, held_out, max_new_tokens=72, prompt_style=cfg.prompt_style, task="mapf")
    assert result["valid_rate"] > 0, result
    # each answer, in order, with the verifier's verdict on it
    assert [a["id"] for a in result["answers"]] == [x.id for x in held_out]
    assert [a["failure"] is None for a in result["answers"]] == result["valid"]
    assert [verify(x, a["answer"]).valid for x, a in zip(held_out, result["answers"], strict=True)] == result["valid"]
