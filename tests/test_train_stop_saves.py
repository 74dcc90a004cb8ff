"""A stop saves the step it waited for: a stop requested during a step ends training after that step, and
the step is saved as an in-stage checkpoint (completed with the stage's marker), so a resume continues after it
instead of training it again. A real transformers Trainer on a tiny model, fast."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from trainer import resume as sr
from trainer import stop
from trainer.trl_setup import raise_if_stopped, stop_callbacks


def _trainer(out, max_steps: int, callbacks: list):
    import torch
    from transformers import Trainer, TrainingArguments

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Linear(2, 1)

        def forward(self, x, labels=None):
            return {"loss": ((self.w(x).squeeze(-1) - labels) ** 2).mean()}

    data = [{"x": torch.ones(2), "labels": torch.tensor(1.0)} for _ in range(64)]
    args = TrainingArguments(str(out), max_steps=max_steps, per_device_train_batch_size=1, report_to=[],
                             save_strategy="no", logging_strategy="no", use_cpu=True, disable_tqdm=True)
    return Trainer(model=Tiny(), args=args, train_dataset=data, callbacks=callbacks)


def test_a_stop_saves_the_step_it_waited_for_and_a_resume_goes_on_after_it(tmp_path):
    from transformers import TrainerCallback

    class AskStop(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            if state.global_step == 3:  # the stop arrives while step 4 is under way
                stop.request_stop("SIGTERM")

    class Count(TrainerCallback):
        def __init__(self):
            self.steps = 0

        def on_step_end(self, args, state, control, **kw):
            self.steps += 1

    from env import RewardState

    reward = SimpleNamespace(state=RewardState(), history=[{"rewards": [1.0]}])
    out = tmp_path / "trl"
    trainer = _trainer(out, 10, [AskStop(), *stop_callbacks(save=True), sr.resume_callback(reward, "k")])
    stop.reset()
    try:
        trainer.train()
        assert trainer.state.global_step == 4
        with pytest.raises(stop.StageInterrupted, match=r"after step 4, saved in trl/checkpoint-4: a resume"):
            raise_if_stopped("GRPO of stage_0", trainer)
    finally:
        stop.reset()
    found = sr.find_resume(out, "k")
    assert found is not None and found[0].name == "checkpoint-4" and found[1]["global_step"] == 4
    count = Count()
    again = _trainer(out, 10, [count, *stop_callbacks(save=True), sr.resume_callback(reward, "k")])
    again.train(resume_from_checkpoint=str(found[0]))
    assert again.state.global_step == 10 and count.steps == 6  # steps 5-10 only: step 4 was not trained again


def test_without_a_stop_nothing_extra_is_saved(tmp_path):
    stop.reset()
    trainer = _trainer(tmp_path / "trl", 3, stop_callbacks(save=True))
    trainer.train()
    assert trainer.state.global_step == 3 and not list((tmp_path / "trl").glob("checkpoint-*"))
