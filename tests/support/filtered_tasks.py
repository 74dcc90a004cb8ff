"""The toy task (tests/support/toy_task.py) with verifiers that make a reward-filtered stage's outcome certain:
`AnyAnswer` keeps every non-empty sample (a random model's samples are then trained on), `NoAnswer` keeps none (the
stage's levels are out of the policy's reach). Importable by name (`tests.support.filtered_tasks:AnyAnswer`), so a
stage in a child process loads them as `trainer.task.load_task` loads any task."""

from __future__ import annotations

from tests.support.toy_task import ToyTask
from trainer.task import Verdict


class AnyAnswer(ToyTask):
    """The toy task, with every non-empty answer verified."""

    name = "toy-any"

    def verify(self, item, answer):
        ok = bool(answer.strip())
        return Verdict(valid=ok, label=None if ok else "no_answer", score=float(ok), optimal=ok)


class NoAnswer(ToyTask):
    """The toy task, with no answer ever verified."""

    name = "toy-none"

    def verify(self, item, answer):
        return Verdict(valid=False, label="wrong", score=0.0)
