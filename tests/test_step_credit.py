"""Step credit from the verifier (`trainer.step_credit`, `train.step_credit`): how each cell of an answer is judged,
which tokens get its centred reward, and that a real stage trains on those per-token advantages."""

from __future__ import annotations

import pytest

from env import Instance, plan_text
from tests.support.batches import completion_batch
from trainer.step_credit import step_credit, step_credit_metrics, step_rewards

# 3x3, one hole at (2,1); agent 0 (0,0) -> (0,2), agent 1 (1,1) -> (1,2)
INST = Instance(id="t", size=3, grid=["FFF", "FFF", "FHF"], starts=[(0, 0), (1, 1)], goals=[(0, 2), (1, 2)],
                plan=[[(0, 0), (0, 1), (0, 2)], [(1, 1), (1, 2)]], optimal_cost=3, makespan=2, optimal_makespan=2,
                shortest=[2, 1], needs_wait=False, seed=0)
A0 = [(0, 0), (0, 1), (0, 2)]


def _rewards(paths) -> list[list[float]]:
    return [[r for _, _, r in agent] for agent in step_rewards(INST, plan_text(paths))]


def test_each_cell_is_judged_by_the_map():
    # every step of the solver's plan gets nearer the goal, and each path stops on its goal
    assert _rewards(INST.plan) == [[1.0, 1.0, 1.0], [1.0, 1.0]]
    assert _rewards([A0 + [(0, 2)], [(1, 1), (1, 1), (1, 2)]]) == [[1.0, 1.0, 0.0, 1.0], [0.0, 1.0, 1.0]]  # waits
    # only a cell nearer than any before is +1: waits on the goal or going back and forth earn nothing
    assert _rewards([A0 + [(0, 2)] * 5, INST.plan[1]])[0] == [1.0, 1.0] + [0.0] * 5 + [1.0]
    assert _rewards([[(0, 0), (0, 1), (0, 0), (0, 1), (0, 2)], INST.plan[1]])[0] == [1.0, 0.0, 0.0, 1.0, 1.0]
    assert _rewards([[(0, 0), (1, 0), (2, 0)], INST.plan[1]]) == [[0.0, 0.0, -1.0], [1.0, 1.0]]  # away; stops short
    # into the hole at its first step: judged -1 there, and nothing after it
    assert _rewards([A0, [(1, 1), (2, 1), (2, 2), (1, 2)]]) == [[1.0, 1.0, 1.0], [-1.0]]
    assert _rewards([[(0, 0), (0, 2)], [(1, 1), (1, 3)]]) == [[-1.0], [-1.0]]  # a jump, off the map
    assert _rewards([[(1, 0), (0, 0)], INST.plan[1]]) == [[-1.0], [1.0, 1.0]]  # a wrong start: its first cell
    # both at (0,1) at step 1: agent 1's cell, written later, is the collision
    assert _rewards([A0, [(1, 1), (0, 1), (1, 1), (1, 2)]]) == [[1.0, 1.0, 1.0], [-1.0, 0.0, 1.0, 1.0]]
    assert step_rewards(INST, "no answer") == [] and step_rewards(INST, plan_text([A0])) == []
    # with `idle` below 0, a step that makes no progress is judged at that value
    judged = step_rewards(INST, plan_text([A0 + [(0, 2)] * 2, [(1, 1), (0, 1), (1, 1), (1, 2)]]), idle=-0.5)
    assert [[r for _, _, r in a] for a in judged] == [[1.0, 1.0, -0.5, -0.5, 1.0], [-1.0, -0.5, 1.0, 1.0]]


def test_a_step_points_at_its_row_and_column():
    text = plan_text([A0, [(1, 1), (2, 1), (2, 2)]])
    cells = [text[lo:hi] for agent in step_rewards(INST, text) for lo, hi, _ in agent]
    assert cells == ["0,1)", "0,2)", "\n", "2,1)"]  # the row digit to the closing bracket (" (" left out); the stop


def test_tokens_get_their_steps_centred_reward_on_top_of_the_outcome(embedded_policy):
    _, tok = embedded_policy
    hole = plan_text([A0, [(1, 1), (2, 1), (2, 2), (1, 2)]])
    valid = plan_text(INST.plan)
    texts = [valid, hole, "no answer here", hole, valid, valid, "no answer here", valid]
    ids, batch = completion_batch(tok, texts, [0.75, -0.25, -0.25, -0.25, 0.0, 0.0, 0.0, 0.0])
    rows = [{"instance": INST.to_json()}] * len(texts)
    counts: dict = {}
    out = step_credit(batch, rows, tok, 0.5, group_size=4, counts=counts)["advantages"]
    assert out.shape == batch["completion_ids"].shape
    # group 0: steps 1 x 5 (valid, two stops included) and 1, 1, 1, -1 twice (holes): mean 9/13
    mean = (5 + 2 * 2) / 13
    for b in range(4):
        steps = [s for agent in step_rewards(INST, texts[b]) for s in agent]
        ends = [len(tok.decode(ids[b][: k + 1])) for k in range(len(ids[b]))]
        for k in range(len(ids[b])):
            covering = [r for lo, hi, r in steps if ends[k] > lo and (ends[k - 1] if k else 0) < hi]
            assert len(covering) <= 1
            want = float(batch["advantages"][b]) + (0.5 * (covering[0] - mean) if covering else 0.0)
            assert float(out[b, k]) == pytest.approx(want), (b, k, tok.decode(ids[b][k:k + 1]))
    k = next(k for k in range(len(ids[1])) if tok.decode(ids[1][: k + 1]).endswith("(2"))
    assert float(out[1, k]) == pytest.approx(-0.25 + 0.5 * (-1 - mean))  # the hole's row digit, pushed down
    assert float(out[1, k - 1]) == pytest.approx(-0.25)  # its " (": the outcome only
    k = next(k for k in range(len(ids[0])) if tok.decode(ids[0][: k + 1]).endswith("(0,2)\n"))
    assert float(out[0, k]) == pytest.approx(0.75 + 0.5 * (1 - mean))  # agent 0 stops on its goal
    # group 1: every judged step +1, so centred to 0: the outcome advantages, unchanged
    assert bool((out[4:] == batch["advantages"][4:, None]).all())
    assert counts["answers"] == 8 and counts["steps"] == 13 + 15 and counts["bad_steps"] == 2
    m = step_credit_metrics(counts)
    assert m["train/step_credit_steps_per_answer"] == 28 / 8 and m["train/step_credit_bad_steps"] == 2 / 28
    cut = plan_text(INST.plan).split("\n</answer>")[0]  # cut off after its last cell: that stop was not written
    _, short = completion_batch(tok, [cut, cut], [0.0, 0.0])
    assert _rewards(INST.plan)[1][-1] == 1.0 and step_rewards(INST, cut)[1][-1][0] == len(cut)
    counts = {}
    step_credit(short, [{"instance": INST.to_json()}] * 2, tok, 1.0, group_size=2, counts=counts)
    assert counts["steps"] == 2 * 4  # agent 0: two cells and a stop; agent 1: one cell, its stop unwritten
    # a neutral step (here a wait on the goal) is not credited: its tokens keep the outcome advantage, and the
    # group's mean is over the credited steps only (1 x 5 and 1, 1, 1, -1: mean 7/9)
    waits = plan_text([A0 + [(0, 2)] * 3, INST.plan[1]])
    w_ids, w_batch = completion_batch(tok, [waits, hole], [0.5, -0.5])
    w_out = step_credit(w_batch, [{"instance": INST.to_json()}] * 2, tok, 1.0, group_size=2)["advantages"]
    first = next(k for k in range(len(w_ids[0])) if tok.decode(w_ids[0][: k + 1]).endswith("(0,2) (0"))
    last = next(k for k in range(len(w_ids[0])) if tok.decode(w_ids[0][: k + 1]).endswith("(0,2) (0,2) (0,2) (0,2)"))
    assert [float(x) for x in w_out[0, first:last + 1]] == pytest.approx([0.5] * (last + 1 - first))
    k = next(k for k in range(len(w_ids[0])) if tok.decode(w_ids[0][: k + 1]).endswith("(0,2)\n"))
    assert float(w_out[0, k]) == pytest.approx(0.5 + 1 - 7 / 9)  # the stop on the goal, centred on 7/9
    # with `idle` -0.5 the three waits are judged too: mean (5 - 1.5 + 3 - 1) / 12, and each wait's row digit is
    # pushed down by its centred reward
    w_out = step_credit(w_batch, [{"instance": INST.to_json()}] * 2, tok, 1.0, group_size=2, idle=-0.5)["advantages"]
    row = first + next(j for j in range(last - first) if tok.decode(w_ids[0][: first + j + 1]).endswith("(0"))
    assert float(w_out[0, row]) == pytest.approx(0.5 - 0.5 - 5.5 / 12)
    with pytest.raises(ValueError, match="7 rows for a batch of 8 completions in groups of 4"):
        step_credit(batch, rows[:7], tok, 0.5, group_size=4)


def test_setting_is_off_by_default_checked_and_not_with_localized_credit():
    from pydantic import ValidationError

    from trainer.config import TRAIN_PRESETS, TrainConfig
    from trainer.localize import Credit

    assert TrainConfig().step_credit == 0.0
    assert all(not p.get("step_credit", 0.0) for p in TRAIN_PRESETS.values())
    with pytest.raises(ValidationError, match="step_credit"):
        TrainConfig(step_credit=-1)
    assert TrainConfig().step_credit_idle == 0.0 and Credit.from_config(TrainConfig(step_credit=1,
                                                                                    step_credit_idle=-0.5)).idle == -0.5
    with pytest.raises(ValidationError, match="step_credit_idle=-0.5 with step_credit=0"):
        TrainConfig(step_credit_idle=-0.5)
    with pytest.raises(ValidationError, match="step_credit_idle"):
        TrainConfig(step_credit=1, step_credit_idle=0.5)
    with pytest.raises(ValidationError, match="localize_credit=true with step_credit=1.0"):
        TrainConfig(step_credit=1, localize_credit=True)
    with pytest.raises(ValueError, match="choose one"):
        Credit(localize=True, step=1.0)
    batch = {"advantages": object()}
    assert Credit()(batch, [], None) is batch and Credit().metrics() == {}  # the defaults leave a batch alone


@pytest.mark.slow
def test_stage_trains_on_per_token_advantages(tmp_path, monkeypatch):
    """A real smoke stage with `step_credit`: every batch reaching the loss carries advantages of the completions'
    shape, and where a step was placed they differ from the row's outcome advantage. The smoke model's answers
    rarely parse, so every judged answer also gets one step on its first characters (+1 or -1 by call parity): the
    wiring from the trainer to the loss is what is under test here; the judging is tested above."""
    from trl import GRPOTrainer

    from env import write_jsonl
    from llm_backends.models import resolve_model
    from tests.support.small_maps import three_by_three
    from trainer import step_credit as step_module
    from trainer.config import TRAIN_PRESETS, TrainConfig
    from trainer.stage import run_stage

    train = tmp_path / "train.jsonl"
    write_jsonl(train, three_by_three(6, seed=11))
    cfg = TrainConfig.model_validate({**TRAIN_PRESETS["smoke"], "max_steps": 2, "sft_warm_start": False,
                                      "step_credit": 1.0, "step_credit_idle": -0.5})
    real_rewards, real_loss = step_module.step_rewards, GRPOTrainer._compute_loss
    calls = [0]

    idles: set = set()

    def rewards(instance, text, idle=0.0):
        calls[0] += 1
        idles.add(idle)
        return real_rewards(instance, text, idle) + [[(0, 3, 1.0 if calls[0] % 2 else -1.0)]]

    seen: list[bool] = []

    def loss(self, model, inputs):
        adv, mask = inputs["advantages"], inputs["completion_mask"]
        spread = [bool((adv[b][mask[b] > 0].max() - adv[b][mask[b] > 0].min()) > 0) for b in range(adv.shape[0])]
        seen.append(adv.shape == inputs["completion_ids"].shape and any(spread))
        return real_loss(self, model, inputs)

    monkeypatch.setattr(step_module, "step_rewards", rewards)
    monkeypatch.setattr(GRPOTrainer, "_compute_loss", loss)
    res = run_stage(train_path=train, init_checkpoint=resolve_model("smollm2-135m"), out_dir=tmp_path / "stage",
                    cfg=cfg, seed=3, reward_state=None, progress=False)
    m = res["metrics"]
    assert m["train/steps"] == 2 and seen and all(seen) and idles == {-0.5}
    assert m["train/step_credit_steps_per_answer"] >= 1 and m["train/step_credit_tokens_per_answer"] > 0
