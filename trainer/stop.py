"""A process-wide stop flag: the first SIGINT/SIGTERM asks the run to stop at the next safe point.

`graph.run` installs the signal handlers: the first signal calls `request_stop(reason)` and returns (it
raises nothing: an exception raised from a handler can land inside a `__del__`, where Python ignores it,
and training then goes on); a second signal stops at once. Who checks the flag:

- the trainers, through `StopCallback` (in their `callbacks=`): the step under way is finished (or, between
  the micro-batches of a step, given up) and then training stops; with `StopCallback(save=True)` (GRPO, whose
  in-stage checkpoints `trainer.resume` completes) the finished step is saved as an in-stage checkpoint first,
  so the wait for it is not lost: train_stage raises `StageInterrupted`, the state stays at "train_stage
  next", and `--resume` continues the stage from that step;
- the evaluations, between batches of answers (`nodes.evaluate.answer_and_verify`): they raise
  `StageInterrupted`; the answers so far are kept in the journal, and `--resume` answers only the rest;
- the loop, between nodes (`graph.loop.run_graph`): it stops streaming after the node that just finished,
  whose update is already checkpointed.

`StopCallback` subclasses `transformers.TrainerCallback`, built on first use so that importing this module
does not import transformers (graph.run needs the flag before any training library is loaded).
"""

from __future__ import annotations

import threading
from typing import Any

_STOP = threading.Event()
_REASON: list[str] = []


class StageInterrupted(Exception):
    """A trainer stopped early because a stop was requested; the stage saved nothing and runs again on resume."""


def request_stop(reason: str) -> None:
    """Ask the run to stop at the next step boundary or node boundary (safe to call from a signal handler)."""
    if not _STOP.is_set():
        _REASON[:] = [reason]
    _STOP.set()


def stop_requested() -> bool:
    return _STOP.is_set()


def stop_reason() -> str | None:
    """What `request_stop` was first called with (e.g. "SIGTERM"), None when no stop was requested."""
    return _REASON[0] if _STOP.is_set() and _REASON else None


def reset() -> None:
    """Clear the flag (tests, and a process that runs several graphs one after another)."""
    _STOP.clear()
    _REASON.clear()


_CALLBACK_CLASS: type | None = None


def _callback_class() -> type:
    global _CALLBACK_CLASS
    if _CALLBACK_CLASS is None:
        from transformers import TrainerCallback

        class StopCallback(TrainerCallback):
            """Stops a transformers/TRL trainer at the next step boundary once `request_stop` was called;
            `save=True`: the step it finished is saved as a checkpoint first (it is not trained again)."""

            def __init__(self, save: bool = False):
                self.save = save

            def _check(self, control, step_done: bool = False):
                if _STOP.is_set():
                    control.should_training_stop = True
                    control.should_save = self.save and step_done
                return control

            def on_step_begin(self, args, state, control, **kwargs):
                return self._check(control)

            def on_substep_end(self, args, state, control, **kwargs):
                return self._check(control)

            def on_step_end(self, args, state, control, **kwargs):
                return self._check(control, step_done=state.global_step > 0)

        StopCallback.__module__ = __name__
        _CALLBACK_CLASS = StopCallback
    return _CALLBACK_CLASS


def __getattr__(name: str) -> Any:
    if name == "StopCallback":
        return _callback_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
