"""Checkpoint selection within a stage (trainer.select_best, train.select_instances / select_every)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from pydantic import ValidationError

from env import SIZES, EnvConfig, generate
from trainer.config import TrainConfig
from trainer.select_best import SelectBest, hold_out


def mixed(n: int, seed: int = 5) -> list:
    cfg = EnvConfig.model_validate({"sizes": {s: {"data_ratio": {3: 0.5, 4: 0.25, 5: 0.25}.get(s, 0.0),
                                                  "hole_ratio": 0.2, "wait_ratio": 0.5} for s in SIZES}})
    return generate(cfg, n, seed=seed).instances


def test_hold_out_keeps_the_sizes_mix_and_is_seeded():
    xs = mixed(40)
    train, held = hold_out(xs, 8, seed=3)
    assert len(train) == 32 and len(held) == 8
    assert {x.id for x in train}.isdisjoint({x.id for x in held})
    assert {x.id for x in train} | {x.id for x in held} == {x.id for x in xs}
    assert [x.size for x in held].count(3) == 4 and [x.size for x in held].count(4) == 2
    assert [x.id for x in hold_out(xs, 8, seed=3)[1]] == [x.id for x in held]
    assert [x.id for x in hold_out(xs, 8, seed=4)[1]] != [x.id for x in held]
    assert hold_out(xs, 0, seed=3) == (xs, [])


def test_hold_out_refuses_to_leave_nothing_to_train_on():
    with pytest.raises(ValueError, match=r"select_instances=40: the stage's file holds 40 instances"):
        hold_out(mixed(40), 40, seed=0)


def test_settings_are_checked():
    with pytest.raises(ValidationError, match="select_instances"):
        TrainConfig(select_instances=-1)
    with pytest.raises(ValidationError, match="select_every"):
        TrainConfig(select_instances=8, select_every=0)
    assert TrainConfig().select_instances == 0  # off in the cpu preset


def _drive(scores: list[float], every: int, max_steps: int, keep_last: bool = True):
    """A real module trained by hand under SelectBest's hooks; the scores are what each check 'answers'."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
    model[0].weight.requires_grad_(False)  # frozen: never copied, never restored
    frozen = model[0].weight.detach().clone()
    calls = iter(scores)
    seen: dict[int, torch.Tensor] = {}
    state = SimpleNamespace(global_step=0, max_steps=max_steps)

    def score(m):
        seen[state.global_step] = m[1].weight.detach().clone()
        return next(calls)

    sel = SelectBest(score, every, keep_last=keep_last)
    sel.on_train_begin(None, state, None, model=model)
    for step in range(1, max_steps + 1):
        with torch.no_grad():
            model[1].weight.add_(1.0)  # an "optimiser step"
        state.global_step = step
        sel.on_step_end(None, state, None, model=model)
    last = model[1].weight.detach().clone()
    sel.on_train_end(None, state, None, model=model)
    assert torch.equal(model[0].weight, frozen)
    return sel, model, seen, last


def test_the_stage_ends_on_the_earliest_best_check():
    # checks at steps 0, 2, 4, 5 (the last step is always checked)
    sel, model, seen, last = _drive([0.10, 0.30, 0.30, 0.20], every=2, max_steps=5)
    assert [h["step"] for h in sel.history] == [0, 2, 4, 5]
    assert sel.best_step == 2 and sel.best_rate == 0.30
    assert torch.equal(model[1].weight, seen[2]) and not torch.equal(model[1].weight, last)
    assert torch.equal(sel.last_weights["1.weight"], last) and "0.weight" not in sel.last_weights
    m = sel.metrics()
    assert m["train/select_step"] == 2 and m["train/select_start_valid_rate"] == 0.10
    assert m["train/select_last_valid_rate"] == 0.20 and len(m["train/select_history"]) == 4


def test_a_stage_that_only_got_worse_leaves_the_start():
    sel, model, seen, _ = _drive([0.25, 0.20, 0.0], every=1, max_steps=2)
    assert sel.best_step == 0 and torch.equal(model[1].weight, seen[0])


def test_a_stop_request_neither_answers_nor_restores():
    from trainer import stop

    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    scores = iter([0.5, 0.1])
    sel = SelectBest(lambda m: next(scores), 1)
    state = SimpleNamespace(global_step=0, max_steps=4)
    sel.on_train_begin(None, state, None, model=model)
    with torch.no_grad():
        model.weight.add_(1.0)
    state.global_step = 1
    sel.on_step_end(None, state, None, model=model)
    moved = model.weight.detach().clone()
    with torch.no_grad():
        model.weight.add_(1.0)
    state.global_step = 2
    stop.request_stop("test")
    try:
        sel.on_step_end(None, state, None, model=model)  # a check step, skipped
        sel.on_train_end(None, state, None, model=model)
    finally:
        stop.reset()
    assert [h["step"] for h in sel.history] == [0, 1] and sel.best_step == 0
    assert torch.equal(model.weight, moved + 1.0)  # the stage is not saved after a stop: nothing restored


def test_the_last_step_kept_when_it_is_best():
    sel, model, _, last = _drive([0.1, 0.2, 0.3], every=1, max_steps=2)
    assert sel.best_step == 2 and torch.equal(model[1].weight, last) and sel.last_weights is None


@pytest.mark.slow
def test_stage_ends_on_the_selected_weights(tmp_path, monkeypatch):
    """A real smoke stage with selection: its held-out instances are answered greedily by the trained model at
    every step, and the checkpoint it writes holds the weights of the step chosen, not the last step's. The SFT
    term keeps the weights moving when every sampled answer scores alike."""
    from env import write_jsonl
    from llm_backends.checkpoints import load_checkpoint
    from llm_backends.models import resolve_model
    from tests.support.small_maps import three_by_three
    from trainer import select_best
    from trainer.config import TRAIN_PRESETS
    from trainer.stage import run_stage

    train = tmp_path / "train.jsonl"
    write_jsonl(train, three_by_three(10, seed=11))
    cfg = TrainConfig.model_validate({**TRAIN_PRESETS["smoke"], "max_steps": 2, "sft_warm_start": False,
                                      "sft_mix": 1.0, "sft_mix_batch": 2, "select_instances": 4, "select_every": 1})
    real = select_best.greedy_scorer
    marks: list[tuple[int, float, float]] = []  # per check: instances answered, a fingerprint of the weights, score

    def scorer(instances, tok, **kw):
        score = real(instances, tok, **kw)

        def scripted(model):  # the real greedy answers, then a scripted verdict: step 1 is the best
            rate = score(model)
            top = [p for p in model.parameters() if p.requires_grad][-1]
            marks.append((len(instances), float(top.double().sum()), rate))
            return [0.2, 0.5, 0.1][len(marks) - 1]

        return scripted

    monkeypatch.setattr(select_best, "greedy_scorer", scorer)
    res = run_stage(train_path=train, init_checkpoint=resolve_model("smollm2-135m"), out_dir=tmp_path / "stage",
                    cfg=cfg, seed=3, reward_state=None, progress=False, keep_last=True)
    m = res["metrics"]
    assert [h["step"] for h in m["train/select_history"]] == [0, 1, 2] and m["train/select_instances"] == 4
    assert all(n == 4 and 0.0 <= rate <= 1.0 for n, _, rate in marks)
    assert len({f for _, f, _ in marks}) == 3  # the weights moved at every step
    assert m["train/select_step"] == 1 and "last_weights" in res
    model, _ = load_checkpoint(res["checkpoint"])
    top = [p for n, p in model.named_parameters() if n in res["last_weights"]][-1]
    assert float(top.double().sum()) == pytest.approx(marks[1][1], rel=0, abs=1e-9)  # step 1's weights written
    assert float(top.double().sum()) != pytest.approx(marks[2][1], rel=0, abs=1e-9)
    assert float(res["last_weights"][[n for n in res["last_weights"]][-1]].double().sum()) == pytest.approx(
        marks[2][1], rel=0, abs=1e-9)


def test_the_apply_line_says_how_many_are_held_out():
    from graph.progress import describe_start
    from graph.settings import Settings

    held = Settings(train=TrainConfig(instances_per_stage=64, select_instances=48))
    assert describe_start("apply", {"stage": 0}, held) == \
        "[stage 0] apply: generating 64 training instances + 48 held out ..."
    assert "held out" not in describe_start("apply", {"stage": 0}, Settings())


def test_the_loop_generates_the_held_out_instances_on_top(tmp_path):
    from env import read_jsonl
    from nodes.apply import apply
    from tests.support.node_helpers import make_settings, runtime

    out = apply({}, runtime(make_settings(seed=5, train={"select_instances": 4}), tmp_path))
    instances = read_jsonl(tmp_path / "stage_0" / "train.jsonl")
    assert len(instances) == 12 + 4
    train, held = hold_out(instances, 4, seed=0)
    assert len(train) == 12 and out["config"]["num_instances"] == 16


def test_the_report_says_which_step_a_stage_ended_on(tmp_path):
    import json

    from nodes.report import collect, render

    for k, extra in ((0, {"train/select_step": 16, "train/select_valid_rate": 0.25, "train/select_instances": 48,
                          "train/select_start_valid_rate": 0.125, "train/select_last_valid_rate": 0.1875}), (1, {})):
        d = tmp_path / f"stage_{k}"
        d.mkdir()
        (d / "metrics.json").write_text(json.dumps({"train/steps": 24, "train/seconds": 60.0, **extra}))
    text = render(collect(tmp_path), [], "r")
    assert ("Stage 0 ended on step 16's weights of 24 (held-out greedy valid: start 12.5 %, kept 25.0 %, last step "
            "18.8 %, on 48 instances held out of training).") in text
    assert "Stage 1 ended" not in text


def test_several_processes_skip_selection_with_a_warning(caplog):
    """Selection runs in one process only; a trainer of several (a stand-in: no second process here) trains on
    without it, said in the log and the metrics."""
    from trainer.stage import _selector

    trainer = SimpleNamespace(accelerator=SimpleNamespace(num_processes=2), add_callback=lambda cb: 1 / 0)
    metrics: dict = {}
    with caplog.at_level("WARNING"):
        assert _selector(trainer, mixed(8)[:4], TrainConfig(select_instances=4), None, metrics, False) is None
    assert metrics == {"train/select_skipped": True} and "select_instances=4 ignored" in caplog.text
