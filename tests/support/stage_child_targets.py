"""Targets for tests/test_stage_child.py, run by `trainer.child` in a child process as
`tests.support.stage_child_targets:<name>` (run_in_child puts the repository root on the child's PYTHONPATH)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path


def like_trl_colocate(out: str) -> None:
    """What TRL's colocated vLLM set-up does to a process (trl/generation/vllm_generation.py): RANK, LOCAL_RANK,
    WORLD_SIZE and MASTER_ADDR/PORT in os.environ, never removed; plus accelerate's process state."""
    from accelerate.state import PartialState
    from trl.trainer.utils import ensure_master_addr_port

    state = PartialState()
    os.environ["RANK"] = str(state.process_index)
    os.environ["LOCAL_RANK"] = str(state.local_process_index)
    os.environ["WORLD_SIZE"] = str(state.num_processes)
    ensure_master_addr_port()
    seen = {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    seen["accelerate_state_keys"] = sorted(PartialState._shared_state)
    Path(out).write_text(json.dumps(seen))


def fail(kind: str, message: str) -> None:
    from llm_backends.checkpoints import CheckpointError

    raise {"CheckpointError": CheckpointError, "RuntimeError": RuntimeError, "KeyError": KeyError}[kind](message)


def die(sig: int) -> None:
    os.kill(os.getpid(), sig)
    time.sleep(30)


def wait_for_stop(started: str, timeout_s: float = 60.0) -> None:
    """A trainer's loop in miniature: step until the stop flag is set, then raise StageInterrupted as run_stage
    does after its StopCallback ended training (trainer.trl_setup.raise_if_stopped)."""
    from trainer.stop import stop_requested
    from trainer.trl_setup import raise_if_stopped

    Path(started).write_text(str(os.getpid()))
    t0 = time.monotonic()
    while not stop_requested() and time.monotonic() - t0 < timeout_s:
        time.sleep(0.05)
    raise_if_stopped("GRPO of stage_3")
    Path(started).with_suffix(".finished").write_text("the stop never came")


def ok(out: str) -> None:
    Path(out).write_text("done")



def write_rank(out_dir: str) -> None:
    rank = os.environ.get("RANK", "none")
    Path(out_dir, f"rank{rank}").write_text(os.environ.get("WORLD_SIZE", "?"))


def long_step(started: str, step_s: float = 120.0) -> None:
    """A step that takes `step_s` seconds whatever the stop flag says (a GRPO step under load), then stops as
    run_stage does."""
    from trainer.trl_setup import raise_if_stopped

    Path(started).write_text(str(os.getpid()))
    time.sleep(step_s)
    raise_if_stopped("GRPO of stage_3")
    Path(started).with_suffix(".finished").write_text("the step ran to its end")
