"""A process-wide stop flag: the first SIGINT/SIGTERM asks the run to stop at the next safe point.

`graph.run` installs the signal handlers: the first signal calls `request_stop(reason)` and returns (it
raises nothing: an exception raised from a handler can land inside a `__del__`, where Python ignores it,
and training then goes on); a second signal stops at once. Who checks the flag:

- the trainers, through `StopCallback` (in their `callbacks=`): at the next step boundary it sets
  `control.should_training_stop`, the trainer returns, and train_stage raises `StageInterrupted` instead
  of saving a checkpoint, so the state stays at "train_stage next" and `--resume` trains the stage again;
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
            """Stops a transformers/TRL trainer at the next step boundary once `request_stop` was called."""

            def _check(self, control):
                if _STOP.is_set():
                    control.should_training_stop = True
                    control.should_save = False
                return control

            def on_step_begin(self, args, state, control, **kwargs):
                return self._check(control)

            def on_substep_end(self, args, state, control, **kwargs):
                return self._check(control)

            def on_step_end(self, args, state, control, **kwargs):
                return self._check(control)

        StopCallback.__module__ = __name__
        _CALLBACK_CLASS = StopCallback
    return _CALLBACK_CLASS


def __getattr__(name: str) -> Any:
    if name == "StopCallback":
        return _callback_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
