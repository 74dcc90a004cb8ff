"""trainer.stop (the stop flag and the trainer callback) and trainer.files (atomic writes)."""

from __future__ import annotations

import json
import os

import pytest

from trainer import stop
from trainer.files import append_text_atomic, write_json_atomic, write_text_atomic


@pytest.fixture(autouse=True)
def _clear_flag():
    stop.reset()
    yield
    stop.reset()


def test_stop_flag_first_reason_kept():
    assert not stop.stop_requested() and stop.stop_reason() is None
    stop.request_stop("SIGTERM")
    stop.request_stop("SIGINT")
    assert stop.stop_requested() and stop.stop_reason() == "SIGTERM"
    stop.reset()
    assert not stop.stop_requested()


def test_stop_callback_stops_a_trainer_at_the_step_boundary():
    from transformers import TrainerCallback, TrainerControl

    cb = stop.StopCallback()
    assert isinstance(cb, TrainerCallback)
    from transformers import TrainerState

    state = TrainerState(global_step=3)
    control = TrainerControl()
    cb.on_step_end(None, state, control)
    assert not control.should_training_stop  # no stop asked: training goes on
    stop.request_stop("SIGTERM")
    control = cb.on_step_end(None, state, TrainerControl(should_save=True))
    assert control.should_training_stop and not control.should_save
    control = stop.StopCallback(save=True).on_step_end(None, state, TrainerControl())
    assert control.should_training_stop and control.should_save  # the step it waited for is saved


def test_atomic_write_never_touches_a_hard_linked_donor(tmp_path):
    donor, fork = tmp_path / "donor.json", tmp_path / "fork.json"
    donor.write_text('{"a": 1}\n')
    os.link(donor, fork)
    write_json_atomic(fork, {"a": 2})
    assert donor.read_text() == '{"a": 1}\n'
    assert json.loads(fork.read_text()) == {"a": 2}
    append_text_atomic(fork, "more\n")
    assert donor.read_text() == '{"a": 1}\n' and fork.read_text().endswith("more\n")
    write_text_atomic(tmp_path / "new" / "x.md", "hi")  # parents are created
    assert (tmp_path / "new" / "x.md").read_text() == "hi"
    assert not [p for p in tmp_path.rglob("*.tmp")]  # no temporary file left behind
