"""A stop never waits on a step that runs long: the step under way gets `STOP_GRACE_S` seconds to finish (and
be saved), then the stage's child process is ended inside it, and the stage comes back as interrupted."""

from __future__ import annotations

import os
import threading
import time

import pytest

from trainer import child, stop
from trainer.child import run_in_child
from trainer.stop import StageInterrupted


@pytest.fixture(autouse=True)
def _clear_stop():
    stop.reset()
    yield
    stop.reset()


def test_a_step_that_outlasts_the_grace_is_ended_inside(tmp_path, monkeypatch):
    monkeypatch.setattr(child, "STOP_GRACE_S", 2.0)
    started = tmp_path / "started"

    def press_stop():
        deadline = time.monotonic() + 60
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        stop.request_stop("SIGTERM")

    threading.Thread(target=press_stop, daemon=True).start()
    with pytest.raises(StageInterrupted, match="stopped on request before it finished") as info:
        run_in_child(tmp_path / "stage_3", {"started": str(started), "step_s": 120.0}, label="stage 3 training",
                     target="tests.support.stage_child_targets:long_step")
    waited = time.monotonic() - os.path.getmtime(started)
    assert waited < 15, f"the stop waited {waited:.1f} s on the step"
    assert not started.with_suffix(".finished").exists() and "in-stage checkpoint" in str(info.value)
    pid = int(started.read_text())
    assert not os.path.exists(f"/proc/{pid}") or "zombie" in open(f"/proc/{pid}/status").read().lower()
