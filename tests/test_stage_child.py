"""trainer.child: each stage's training runs in a child process; what it leaves behind dies with it."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

from llm_backends.checkpoints import CheckpointError
from trainer import stop
from trainer.child import StageProcessError, run_in_child
from trainer.config import TRAIN_PRESETS, TrainConfig
from trainer.stop import StageInterrupted

DIST_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _run(tmp_path, target, **kwargs):
    # run_in_child puts the repository root on the child's PYTHONPATH: tests.support imports there too
    run_in_child(tmp_path / "stage_9", kwargs, label="stage 9 training",
                 target=f"tests.support.stage_child_targets:{target}")


@pytest.fixture(autouse=True)
def _clear_stop():
    stop.reset()
    yield
    stop.reset()


def test_child_that_sets_trl_rank_vars_leaves_parent_env_and_accelerate_state_unchanged(tmp_path):
    from accelerate.state import AcceleratorState, PartialState

    for var in DIST_VARS:
        assert var not in os.environ, f"{var} is set before the test; the check below would mean nothing"
    env_before = dict(os.environ)
    partial_before, acc_before = dict(PartialState._shared_state), dict(AcceleratorState._shared_state)
    out = tmp_path / "seen.json"
    _run(tmp_path, "like_trl_colocate", out=str(out))
    seen = json.loads(out.read_text())
    # the child really did what TRL does ...
    assert seen["RANK"] == "0" and seen["LOCAL_RANK"] == "0" and seen["WORLD_SIZE"] == "1"
    assert seen["MASTER_ADDR"] and seen["MASTER_PORT"] and seen["accelerate_state_keys"]
    # ... and none of it reached the parent
    assert dict(os.environ) == env_before
    assert dict(PartialState._shared_state) == partial_before
    assert dict(AcceleratorState._shared_state) == acc_before
    status = json.loads((tmp_path / "stage_9" / "logs" / "stage_status.json").read_text())
    assert status == {"status": "ok"}


def test_known_errors_come_back_as_themselves(tmp_path):
    with pytest.raises(CheckpointError, match="checkpoint /x is incomplete"):
        _run(tmp_path, "fail", kind="CheckpointError", message="checkpoint /x is incomplete")


def test_a_crash_is_one_line_naming_the_stage_and_its_log(tmp_path, capfd):
    with pytest.raises(StageProcessError) as e:
        _run(tmp_path, "fail", kind="RuntimeError", message="CUDA out of memory\nsecond line")
    log = tmp_path / "stage_9" / "logs" / "train.log"
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("stage 9 training failed in its child process: RuntimeError: CUDA out of memory")
    assert str(log) in msg
    text = log.read_text()
    assert "Traceback" in text and "stage_child_targets.py" in text and "second line" in text
    assert "Traceback" not in capfd.readouterr().err  # the terminal gets the one line, not the traceback


def test_a_child_killed_without_a_word_is_an_error_not_a_hang(tmp_path):
    t0 = time.monotonic()
    with pytest.raises(StageProcessError, match=r"stage 9 training: its child process was killed by SIGKILL .*train\.log"):
        _run(tmp_path, "die", sig=int(signal.SIGKILL))
    assert time.monotonic() - t0 < 25


def test_the_parents_stop_flag_reaches_the_child_and_comes_back_as_stage_interrupted(tmp_path):
    """graph.run's first SIGTERM only sets the parent's flag; the child must stop at its next step."""
    started = tmp_path / "started"

    def press_stop():
        deadline = time.monotonic() + 30
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        stop.request_stop("SIGTERM")  # what graph.run's handler does on the first signal

    threading.Thread(target=press_stop, daemon=True).start()
    t0 = time.monotonic()
    with pytest.raises(StageInterrupted, match="GRPO of stage_3 stopped at a step boundary"):
        _run(tmp_path, "wait_for_stop", started=str(started))
    assert not started.with_suffix(".finished").exists()
    assert time.monotonic() - t0 < 30


def test_a_sigint_sent_to_the_child_itself_is_a_clean_stop(tmp_path):
    """A terminal's Ctrl-C reaches the child too: its first signal stops at the next step, like the parent's."""
    started = tmp_path / "started"

    def signal_child():
        deadline = time.monotonic() + 30
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)
        os.kill(int(started.read_text()), signal.SIGINT)

    threading.Thread(target=signal_child, daemon=True).start()
    with pytest.raises(StageInterrupted):
        _run(tmp_path, "wait_for_stop", started=str(started))
    assert not stop.stop_requested()  # the parent's own flag was never set: only the child stopped


def test_train_stage_node_trains_in_a_child(monkeypatch, tmp_path):
    """The graph node goes through trainer.child (never run_stage in its own process)."""
    import nodes.train_stage as node
    import trainer.stage as ts

    calls = []
    monkeypatch.setattr(ts, "run_stage", lambda **kw: pytest.fail("run_stage ran in the graph's process"))
    monkeypatch.setattr(node, "run_stage_in_child", lambda **kw: calls.append(kw) or {
        "checkpoint": "c", "reward_state": {}, "metrics": {"train/steps": 1, "train/seconds": 1.0,
                                                             "train/reward_mean": 0.5}})
    from types import SimpleNamespace

    cfg = TrainConfig.model_validate(TRAIN_PRESETS["smoke"])
    runtime = SimpleNamespace(context=SimpleNamespace(
        settings=SimpleNamespace(train=cfg, policy_model="smollm2-135m", seed=0), run_dir=tmp_path))
    up = node.train_stage({"stage": 1, "train_path": "t.jsonl", "checkpoint": str(tmp_path), "reward_state": {}},
                          runtime)
    assert up["checkpoint"] == "c" and calls and calls[0]["out_dir"] == tmp_path / "stage_1"
    assert calls[0]["label"] == "stage 1 training"


def test_a_launcher_runs_one_child_per_process_and_rank_0_reports(tmp_path):
    """STAGE_LAUNCHER (accelerate launch / torchrun on GPUs) runs the stage once per process."""
    import sys

    from llm_backends.vllm_server import free_port

    launcher = f"{sys.executable} -m torch.distributed.run --nproc_per_node 2 --master_port {free_port()}"
    out = tmp_path / "ranks"
    out.mkdir()
    run_in_child(tmp_path / "stage_9", {"out_dir": str(out)}, label="stage 9 training",
                 target="tests.support.stage_child_targets:write_rank", env={"STAGE_LAUNCHER": launcher})
    assert sorted(p.name for p in out.iterdir()) == ["rank0", "rank1"]
    assert (out / "rank1").read_text() == "2"
    logs = tmp_path / "stage_9" / "logs"
    assert json.loads((logs / "stage_status.json").read_text()) == {"status": "ok"}
    assert (logs / "train.rank1.log").exists()
