"""Credit localized by the verifier (`env.verify.first_error`, `trainer.localize.localize_credit`): where an
invalid answer's first error stands, and which of its tokens GRPO's loss keeps."""

from __future__ import annotations

import pytest

from env import Instance, parse_plan, plan_text, verify
from env.prompt import parse_plan_spans
from env.verify import first_error
from tests.support.batches import completion_batch

# 3x3, one hole at (2,1); agent 0 (0,0) -> (0,2), agent 1 (1,1) -> (1,2)
INST = Instance(id="t", size=3, grid=["FFF", "FFF", "FHF"], starts=[(0, 0), (1, 1)], goals=[(0, 2), (1, 2)],
                plan=[[(0, 0), (0, 1), (0, 2)], [(1, 1), (1, 2)]], optimal_cost=3, makespan=2, optimal_makespan=2,
                shortest=[2, 1], needs_wait=False, seed=0)
A0 = [(0, 0), (0, 1), (0, 2)]


def _after_error(paths) -> tuple[str, str]:
    """(the failure the verifier names, the answer's text from its first error on)."""
    text = plan_text(paths)
    at, failure = first_error(INST, text)
    return failure, text[at:]


def test_spans_point_at_the_cells_parse_plan_reads():
    text = "Let me think.\n<answer>\n  agent 0: (0,0) -> (0, 1)\n (1,1)\nAgent 1: [2,2],[2,1]\n</answer>"
    paths, spans = parse_plan_spans(text, 2)
    assert paths == parse_plan(text, 2) == [[(0, 0), (0, 1), (1, 1)], [(2, 2), (2, 1)]]
    for path, at in zip(paths, spans, strict=True):
        assert [parse_plan(f"<answer>Agent 0: {text[a:b]}</answer>", 1)[0][0] for a, b, _, _ in at] == path
        assert [(int(text[r:r + 1]), int(text[c:c + 1])) for _, _, r, c in at] == path  # the row and column digits
    assert text[spans[0][2][0]:spans[0][2][1]] == "(1,1)"  # the wrapped line's cell
    assert text[spans[0][1][0]:spans[0][1][1]] == "(0, 1)"
    assert parse_plan_spans("no answer", 1) == parse_plan("no answer", 1)


def test_a_valid_answer_or_one_without_a_placed_error_has_none():
    assert verify(INST, plan_text(INST.plan)).valid and first_error(INST, plan_text(INST.plan)) is None
    assert first_error(INST, "no answer") is None  # parse error
    assert first_error(INST, plan_text([A0])) is None  # one agent of two


@pytest.mark.parametrize("paths, failure, starts_with", [
    ([A0, [(1, 1), (2, 1), (2, 2), (1, 2)]], "hole", "2,1) (2,2)"),  # row 2: no sound move from (1,1) has it
    ([[(1, 0), (0, 0), (0, 1), (0, 2)], INST.plan[1]], "wrong_start", "1,0) (0,0)"),
    ([[(0, 0), (-1, 0), (0, 0), (0, 1), (0, 2)], INST.plan[1]], "out_of_bounds", "-1,0) (0,0)"),
    ([[(0, 0), (0, 2)], INST.plan[1]], "illegal_move", "2)\nAgent 1"),  # row 0 is sound from (0,0): the column
    ([A0[:2], INST.plan[1]], "goal_not_reached", "\nAgent 1"),  # just after the last cell, short of the goal
    # both agents on (0,1) at step 1: agent 1's cell, written after agent 0's
    ([A0, [(1, 1), (0, 1), (1, 1), (1, 2)]], "conflict", "0,1) (1,1) (1,2)"),
    # agent 1 walks onto (0,2) at step 3, where agent 0 has stopped: agent 1's cell, the only one written
    ([A0, [(1, 1), (1, 1), (1, 2), (0, 2), (1, 2)]], "conflict", "0,2) (1,2)\n</answer>"),
    # two errors: agent 0 short of its goal comes first in the text, before agent 1's hole
    ([A0[:2], [(1, 1), (2, 1), (2, 2), (1, 2)]], "goal_not_reached", "\nAgent 1"),
])
def test_first_error_is_where_it_was_written(paths, failure, starts_with):
    got_failure, rest = _after_error(paths)
    assert got_failure == failure and rest.startswith(starts_with)
    assert not verify(INST, plan_text(paths)).valid


def test_first_error_follows_the_text_not_the_agent_numbers():
    text = "<answer>\nAgent 1: (1,1) (2,1) (2,2) (1,2)\nAgent 0: (0,0) (0,1)\n</answer>"
    assert first_error(INST, text)[1] == "hole" and text[first_error(INST, text)[0]:].startswith("2,1)")  # agent 1's hole is written first


def test_loss_keeps_the_error_side_its_advantage_speaks_for(embedded_policy):
    from trainer.localize import localize_credit, localize_metrics

    _, tok = embedded_policy
    hole = plan_text([A0, [(1, 1), (2, 1), (2, 2), (1, 2)]])
    short = plan_text([A0[:2], INST.plan[1]])
    texts = [hole, hole, plan_text(INST.plan), "no answer here", hole, short]
    ids, batch = completion_batch(tok, texts, [-1.0, 0.5, -0.3, -1.0, 0.0, -0.5])
    rows = [{"instance": INST.to_json()}] * len(texts)
    counts: dict = {}
    out = localize_credit(batch, rows, tok, counts)
    keep, mask = out["tool_mask"], batch["completion_mask"]
    assert out["num_items_in_batch"] is batch["num_items_in_batch"]  # the other tokens keep their weight
    assert out["completion_mask"] is mask  # attention is unchanged

    at = first_error(INST, hole)[0]
    n = len(ids[0])
    k = next(i for i in range(n) if len(tok.decode(ids[0][: i + 1])) > at)  # the token holding the error
    assert tok.decode(ids[0][k:]).startswith("2,1) (2,2)")  # the row digit, not the " (" before it
    # below its group: pushed down on the error token only; above it: pushed up only before it
    assert keep[0, :n].tolist() == [0] * k + [1] + [0] * (n - k - 1)
    assert keep[1, :n].tolist() == [1] * k + [0] * (n - k)
    # a valid answer, a parse error, a zero advantage and a path short of its goal below its group keep it all
    for b in (2, 3, 4, 5):
        assert bool((keep[b] * mask[b] == mask[b]).all())
    assert counts == {"rows": 6, "localized_rows": 2, "tokens": int(mask.sum()), "masked_tokens": 2 * n - k - 1}
    m = localize_metrics(counts)
    assert m["train/localized_rows"] == 2 / 6 and m["train/localized_tokens_masked"] == (2 * n - k - 1) / int(mask.sum())

    with pytest.raises(ValueError, match="4 rows for a batch of 6"):
        localize_credit(batch, rows[:4], tok)


def test_each_sign_of_advantage_is_scaled_by_its_own_weight():
    import torch

    from trainer.localize import weigh_advantages

    batch = {"advantages": torch.tensor([1.5, -2.0, 0.0, -0.5]), "completion_ids": torch.zeros(4, 3)}
    assert weigh_advantages(batch, 1.0, 1.0) is batch
    out = weigh_advantages(batch, 1.0, 0.25)
    assert out["advantages"].tolist() == [1.5, -0.5, 0.0, -0.125] and out["completion_ids"] is batch["completion_ids"]
    assert weigh_advantages(batch, 1.0, 0.0)["advantages"].tolist() == [1.5, 0.0, 0.0, 0.0]
    assert weigh_advantages(batch, 0.5, 1.0)["advantages"].tolist() == [0.75, -2.0, 0.0, -0.5]
    assert weigh_advantages(batch, 0.0, 0.5)["advantages"].tolist() == [0.0, -1.0, 0.0, -0.25]
    assert batch["advantages"].tolist() == [1.5, -2.0, 0.0, -0.5]  # the input batch is left as it was


@pytest.mark.parametrize("field", ["positive_weight", "negative_weight"])
def test_advantage_weights_are_one_by_default_and_checked(field):
    from pydantic import ValidationError

    from trainer.config import TRAIN_PRESETS, TrainConfig

    assert getattr(TrainConfig(), field) == 1.0
    assert all(p.get(field, 1.0) == 1.0 for p in TRAIN_PRESETS.values())
    with pytest.raises(ValidationError, match=field):
        TrainConfig(**{field: 1.5})
    with pytest.raises(ValidationError, match=field):
        TrainConfig(**{field: -0.1})


def test_setting_is_off_by_default_and_in_no_preset():
    from trainer.config import TRAIN_PRESETS, TrainConfig

    assert TrainConfig().localize_credit is False
    assert all(not p.get("localize_credit", False) for p in TRAIN_PRESETS.values())


@pytest.mark.slow
def test_stage_localizes_every_batch_it_trains_on(tmp_path, monkeypatch):
    """A real smoke stage with `localize_credit` on and `negative_weight` 0: every generation batch goes through
    `localize_credit` with the rows whose answers were scored, in order, and the loss of every step is computed with
    its mask and without the negative advantages the batch had."""
    import json

    from trl import GRPOTrainer

    from env import write_jsonl
    from llm_backends.models import resolve_model
    from tests.support.small_maps import three_by_three
    from trainer import localize as localize_module
    from trainer.config import TRAIN_PRESETS, TrainConfig
    from trainer.data import MapfReward
    from trainer.stage import run_stage

    train = tmp_path / "train.jsonl"
    write_jsonl(train, three_by_three(6, seed=11))
    cfg = TrainConfig.model_validate({**TRAIN_PRESETS["smoke"], "max_steps": 2, "sft_warm_start": False,
                                      "partial_credit": 0.25, "partial_credit_kind": "progress",
                                      "localize_credit": True, "negative_weight": 0.0})
    scored: list[list[str]] = []
    credit: set[tuple[float, str]] = set()
    localized: list[tuple[list[str], object]] = []
    losses: list[bool] = []
    real_reward, real_localize = MapfReward.__call__, localize_module.localize_credit
    real_weigh = localize_module.weigh_advantages
    real_loss = GRPOTrainer._compute_loss

    def reward(self, prompts=None, completions=None, completion_ids=None, instance=None, **kw):
        scored.append([json.loads(raw)["id"] for raw in instance])
        credit.add((self.partial_credit, self.partial_credit_kind))
        out = real_reward(self, prompts, completions, completion_ids, instance, **kw)
        return [r + 0.01 * (i % 2) for i, r in enumerate(out)]  # smoke answers all score alike: give groups a spread

    def localize(batch, rows, tok, counts=None):
        out = real_localize(batch, rows, tok, counts)
        localized.append(([json.loads(r["instance"])["id"] for r in rows], out["tool_mask"]))
        return out

    def loss(self, model, inputs):
        losses.append("tool_mask" in inputs and bool((inputs["advantages"] >= 0).all()))  # negative_weight 0
        return real_loss(self, model, inputs)

    weighed: list[bool] = []

    def weigh(batch, positive, negative):
        weighed.append((positive, negative) == (1.0, 0.0) and bool((batch["advantages"] < 0).any()))  # negatives
        return real_weigh(batch, positive, negative)

    monkeypatch.setattr(MapfReward, "__call__", reward)
    monkeypatch.setattr(localize_module, "localize_credit", localize)
    monkeypatch.setattr(localize_module, "weigh_advantages", weigh)
    monkeypatch.setattr(GRPOTrainer, "_compute_loss", loss)
    res = run_stage(train_path=train, init_checkpoint=resolve_model("smollm2-135m"), out_dir=tmp_path / "stage",
                    cfg=cfg, seed=3, reward_state=None, progress=False)
    m = res["metrics"]
    assert m["train/steps"] == 2 and len(localized) == 2
    assert [ids for ids, _ in localized] == scored  # the rows of each batch, as the reward scored them
    assert all(mask.shape[0] == cfg.per_device_train_batch_size for _, mask in localized)
    assert losses and all(losses) and len(weighed) == 2 and all(weighed)
    assert credit == {(0.25, "progress")}  # the stage's reward scores with the stage's partial credit
    assert 0.0 <= m["train/localized_rows"] <= 1.0 and 0.0 <= m["train/localized_tokens_masked"] <= 1.0


def test_first_error_agrees_with_the_verifier_on_random_answers():
    """On random answers (cells anywhere, on or off the map, any length, one to three agents): `first_error` never
    raises, is None exactly when the verifier finds the answer valid or its error has no place (a wrong number of
    agents), and otherwise places an error inside the answer; every kind of placed error occurs."""
    import random

    rng = random.Random(0)
    seen = set()
    for _ in range(400):
        k = rng.choice([1, 2, 2, 2, 3])
        paths = []
        for i in range(k):
            cell = INST.starts[i] if i < 2 and rng.random() < 0.8 else (rng.randint(-1, 3), rng.randint(-1, 3))
            path = [cell]
            for _ in range(rng.randint(0, 5)):
                r, c = path[-1]
                dr, dc = rng.choice([(0, 0), (1, 0), (-1, 0), (0, 1), (0, -1), (2, 0), (1, 1)])
                path.append((r + dr, c + dc))
            paths.append(path)
        text = plan_text(paths)
        verdict, error = verify(INST, text), first_error(INST, text)
        if verdict.valid or verdict.failure in ("agent_count", "parse_error"):
            assert error is None, (text, verdict.failure)
        else:
            assert error is not None, (text, verdict.failure)
            assert 0 <= error[0] <= len(text)
            seen.add(error[1])
    assert seen >= {"hole", "illegal_move", "out_of_bounds", "wrong_start", "goal_not_reached", "conflict"}
